"""KV cache kernels with a run-time length (compile's live=; the graph rewrite is eqfuse.ir.live).

After the rewrite, a cache input is a buffer [.., C + S, ..] read through slice(buffer, 0:C) by
one concat with the S new rows, whose result (present) is a graph output; attentions read that
result as their keys and values. `mark_live` lowers, with L the live length at run time:

- the concat to an *append*: the new rows are written at rows L .. L + S - 1 of the buffer itself
  (the concat's result is the buffer's storage, eqfuse.runtime.program.plan_memory; the graph
  returns the buffer as present), and the past rows are not copied: the append moves S rows,
  whatever L;
- each attention over its result to L + S keys: its key loop bound is run-time, its tiles and
  strides (the buffer's) compile-time constants;
- grouped-query attention's repeat of the cache for the query heads (a pointwise expand of it) to
  a copy of its L + S live rows (`emit_repeat`);
- a pointwise kernel whose last axis is those attentions' keys and whose only readers are they
  (or kernels bound so), as the attention mask's cast from the driver's [B, C + S] integers, to
  elements 0 .. L + S - 1 of each row (`_mark_rows`; the pointwise template with a run-time
  inner bound), so no kernel of a step loops over the capacity.

Any other kernel that reads the cache would read rows past L + S: lowering refuses it.
"""

from __future__ import annotations

from dataclasses import replace

from eqfuse.backend.cexpr import kernel_params
from eqfuse.backend.indexing import bstrides, contiguous, offset, view_strides
from eqfuse.backend.plan import KernelPlan, LiveBound, UOp, size
from eqfuse.errors import ChunkRefused, EqfuseError
from eqfuse.ir.graph import Graph
from eqfuse.ir.kernels import F32, K
from eqfuse.ir.ops import OPS, OpKind


def _root(plans_by_node: dict[int, KernelPlan], n: int) -> int:
    """The node whose storage n is a view of (n itself when it is no view)."""
    p = plans_by_node.get(n)
    while p is not None and p.kind == K.VIEW and p.view is not None:
        n = p.view[0]
        p = plans_by_node.get(n)
    return n


def _body_source(body: Graph, i: int) -> int | None:
    """The body input that body node i reads through layout ops only (transposes, views)."""
    while body.nodes[i].op != "input":
        n = body.nodes[i]
        if len(n.args) != 1:
            return None
        i = n.args[0]
    return i


def mark_live(kg: Graph, plans: list[KernelPlan], length: str) -> bool:
    """Set `live` on the appends and attentions of the caches (module docstring); raise when
    another kernel reads a cache, or when an attention of several new rows reads a mask not
    computed from the live length (`_causal`). Whether the graph has a cache (no append: the
    length is a named dim's, eqfuse.backend.runtime_dim)."""
    names = [kg.nodes[i].name for i in kg.inputs]
    if length not in names:
        return False
    by_node = {p.node: p for p in plans}
    inputs = set(kg.inputs)
    appends: dict[int, LiveBound] = {}
    for p in plans:
        if p.kind != K.LAYOUT or len(p.args) < 2:
            continue
        an = p.body.nodes[p.shape.anchor]
        v = by_node.get(p.args[0])
        if an.op != "concat" or v is None or v.kind != K.VIEW or v.view is None:
            continue
        buf, off, _ = v.view
        ax = an.attr["axis"] % len(p.out_shape)
        sl = v.body.nodes[v.shape.anchor]
        if buf not in inputs or off != 0 or sl.op != "slice" or sl.attr["axis"] % len(p.out_shape) != ax \
                or tuple(kg.nodes[buf].type.shape) != tuple(p.out_shape):
            continue
        rows = p.out_shape[ax]
        p.live = appends[p.node] = LiveBound("append", rows, rows - kg.nodes[p.args[0]].type.shape[ax], buf, ax)
        p.unread = frozenset({0})  # the past rows are the buffer's own
        new = size(p.out_shape) * p.live.new // rows
        # The past's copy block is not emitted, so its flag must not say parallel: the run function
        # reads it (runtime.program.hold_pool) and would let go of the claim-based pool before the
        # append, so the pool's worker slept and was woken again at the next few-rows GEMM.
        p.detail = replace(p.detail, parallel=tuple(par and k not in p.unread
                                                    for k, par in enumerate(p.detail.parallel)))
        if not any(p.detail.parallel):
            p.threads = f"one thread, no parallel region (the new rows only: {new} elements; the past rows stay in place)"
        p.bytes = 2 * F32 * new  # the new rows read and written
        p.cache_check = "streaming copy of the new rows only"
        lead = size(p.out_shape[:ax])
        p.uops = [UOp(0, "Loop", f"{lead} x {p.live.new} new rows (the past rows stay in place)", lead * p.live.new),
                  UOp(1, "Load", f"new row [{new // max(lead * p.live.new, 1)}]", lead * p.live.new),
                  UOp(1, "Store", "into the cache buffer at row live + k", lead * p.live.new)]
    if not appends:
        return False
    caches = {a.buffer for a in appends.values()}
    # grouped-query attention's repeat of the keys and values for the query heads, and a
    # constant scale on them (an export's sqrt(scale) on the keys, when not folded into the attention)
    for p in plans:
        body = p.body
        if p.kind != K.POINTWISE or len(p.args) != 1 or not _row_wise(body) \
                or _root(by_node, p.args[0]) not in appends:
            continue
        a = appends[_root(by_node, p.args[0])]
        ins = p.in_strides.get(0) or contiguous(body.nodes[0].type.shape)
        row = contiguous(kg.nodes[_root(by_node, p.args[0])].type.shape)
        axis = next((i for i, (n, st) in enumerate(zip(body.nodes[0].type.shape, ins))
                     if n == a.rows and st == row[a.axis]), None)  # the cache's rows, read in their order
        if axis is None:
            continue
        p.live = LiveBound("repeat", a.rows, a.new, axis=axis)
        lead = size(p.out_shape[:axis])
        inner = size(p.out_shape[axis + 1:])
        p.uops = [UOp(0, "Loop", f"{lead} (batch, head) blocks", lead),
                  UOp(1, "Loop", f"live + {a.new} rows of {inner} (at most {a.rows})", lead * a.rows),
                  UOp(2, "Load", f"cache row [{inner}] (strided, heads broadcast)", lead * a.rows),
                  UOp(2, "Store", f"out row [{inner}]", lead * a.rows)]
        p.cache_check = "streaming copy of the live rows"
        p.threads = f"one thread (a copy of at most {size(p.out_shape)} elements per step)"
        appends[p.node] = p.live  # (attentions read it as they read an append)
    for p in plans:
        if p.kind != K.ATTENTION:
            continue
        parts = p.shape.parts
        srcs = [_body_source(p.body, parts.kt), _body_source(p.body, parts.v)]
        roots = [_root(by_node, p.args[p.body.inputs.index(s)]) if s is not None else None for s in srcs]
        if all(r in appends for r in roots) and len({appends[r].rows for r in roots}) == 1:
            a = appends[roots[0]]
            if p.detail.Sk == a.rows:
                p.live = LiveBound("keys", a.rows, a.new)
                _read_through_repeats(kg, p, plans, by_node, appends)
                _causal(kg, p, length)
    cache_bf16(plans, by_node, appends)
    _mark_rows(kg, plans, by_node)
    for p in plans:  # nothing else may read the caches: its rows past the live ones hold anything
        if p.kind == K.VIEW or p.live is not None:
            continue
        for k, arg in enumerate(p.args):
            r = _root(by_node, arg)
            if r in appends or r in caches:
                ops = ", ".join(dict.fromkeys(n.op for n in p.body.nodes if n.op != "input")) if p.body else "?"
                raise EqfuseError(f"live=: kernel {p.name} ({p.kind}: {ops}) reads the KV cache "
                                  f"{kg.nodes[r].name or f't{r}'}; only the append and attention over it take "
                                  "the run-time length, so it would read rows past the live ones")
    for o in kg.outputs:
        r = _root(by_node, o)
        if r in caches and o not in appends:
            raise EqfuseError("live=: the graph returns a KV cache other than as the present of its append")
    at = kg.inputs[names.index(length)]
    for p in plans:  # where the run function reads L (eqfuse.runtime.program.emit_run)
        if p.live is not None:
            p.live = replace(p.live, length=at)
    return True


def _causal(kg: Graph, p: KernelPlan, length: str) -> None:
    """An attention over a cache with several new rows (a chunk of a prompt, `new` > 1) reads its
    keys 0 .. L + new - 1, the new ones at rows L .. L + new - 1; query row i may see keys
    0 .. L + i. An export computes that causal mask from the past's length, a compile-time one
    here (the capacity, rows - new); eqfuse.ir.live.causal_from_length has computed each bound
    one from L instead. So a mask input over [.., new, rows] must be computed from the `length`
    input, whether it is the causal mask or that mask combined with the padding mask (the dynamo
    exporter's); any other (a bound mask that is not causal, one computed without L) would hold
    the mask at the capacity, not at L: refused."""
    new, rows = p.live.new, p.live.rows
    if new <= 1:
        return
    operands = _matmul_operands(p.body)
    for k, i in enumerate(p.body.inputs):
        shape = tuple(p.body.nodes[i].type.shape)
        if len(shape) < 2 or shape[-2:] != (new, rows) or i in operands:
            continue  # (not a mask: the keys as [head size, rows] when the head size is `new`)
        if not _reads_input(kg, p.args[k], length):
            name = kg.nodes[p.args[k]].name or f"t{p.args[k]}"
            raise ChunkRefused(f"live=: attention {p.name} over {new} new rows reads {name} {list(shape)}, which is not "
                               "computed from the live length: a mask over the new rows and the keys other than the "
                               "causal one (one value where key j <= past + query i, another elsewhere) would hold "
                               "the mask at the capacity, not at the live length")


def _matmul_operands(body: Graph) -> set[int]:
    """The body nodes a matmul reads as an operand, through layout ops (the keys' transpose)."""
    found = set()
    for n in body.nodes:
        if n.op == "matmul":
            for a in n.args:
                while body.nodes[a].op in OPS and OPS[body.nodes[a].op].kind == OpKind.LAYOUT:
                    a = body.nodes[a].args[0]
                found.add(a)
    return found


def _reads_input(kg: Graph, node: int, name: str) -> bool:
    """Whether kernel graph node `node` is computed from the input named `name`."""
    todo, seen = [node], set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if kg.nodes[n].op == "input" and kg.nodes[n].name == name:
            return True
        todo.extend(kg.nodes[n].args)
    return False


def _read_through_repeats(kg: Graph, p: KernelPlan, plans: list[KernelPlan], by_node: dict[int, KernelPlan],
                          appends: dict[int, LiveBound]) -> None:
    """A decode attention whose keys and values are both grouped-query repeats of KV caches (each
    a pure expand, read by this attention only; the keys' possibly through a kernel that scales
    them by a constant, the export's sqrt(scale), folded into q as the plan's `k_scale`) reads the
    caches themselves: query head h reads key/value head h / g (the plan's `kv_group` g). Its k
    and v args become the caches and their batch offsets the caches' (`kv_read`: the attention's
    batch dims refined into the repeats' output axes, each with the cache's stride, 0 along the
    repeat), so the repeat kernels and their copy of the live rows leave the step."""
    d, parts = p.detail, p.shape.parts
    if not d.decode:
        return
    body = p.body
    reads, group, gone, k_scale = [], set(), [], 1.0
    for node, tail in ((parts.kt, (d.D, d.Sk)), (parts.v, (d.Sk, d.Dv))):
        s = _body_source(body, node)
        if s is None:
            return
        k = body.inputs.index(s)
        res = tuple(body.nodes[parts.result].type.shape)
        batch = res[:-2]
        _, st = view_strides(body, node, p.base_strides())
        if st is None:
            return
        strides = bstrides(body.nodes[node].type.shape, batch + tail, st)
        groups = [[(n, x)] for n, x in zip(batch + tail, strides)]
        x, reader, factor, expanded = p.args[k], p, 1.0, []
        while True:  # the kernels back from the attention: a scale, then the repeat
            r = by_node.get(_root(by_node, x))
            if r is None or r.live is None or r.live.what != "repeat" or r.out_strides is not None:
                return
            chain = [x]  # r's result and the views of it read through
            while chain[-1] != r.node:
                v = by_node[chain[-1]]
                if v.view[1] != 0:
                    return
                chain.append(v.view[0])
            seen = set(chain)  # and every view of them (a view no kernel reads goes with them)
            for q in plans:
                if q.kind == K.VIEW and q.view is not None and (q.view[0] in seen or set(q.args) & seen):
                    seen.add(q.node)
            others = [q for q in plans if q is not reader and q.node not in seen and set(q.args) & seen]
            if others or any(o in seen for o in kg.outputs):
                return
            chain = [c for c in seen if c in by_node]
            groups = _through(r, groups)
            if groups is None:
                return
            gone += [by_node[c] for c in chain]
            src, out = r.body.nodes[0].type.shape, r.out_shape
            expanded += [o for n, o in zip(src, out) if n == 1 and o != 1]
            pure = all(n.op in ("input", "expand") for n in r.body.nodes)
            if pure:
                break
            if node != parts.kt or reader is not p or expanded:
                return  # (a scale on the keys only, in front of the repeat's copy)
            factor = _row_factor(r.body)
            x, reader = r.args[0], r
        if len(expanded) != 1 or any(len(gr) > 1 for gr in groups[len(batch):]):
            return
        sizes = tuple(n for gr in groups[:len(batch)] for n, _ in gr)
        cache = tuple(x for gr in groups[:len(batch)] for _, x in gr)
        reads.append((k, r.args[0], ((sizes, cache), tuple(gr[0][1] if gr else 0 for gr in groups[len(batch):]))))
        group.add(expanded[0])
        k_scale *= factor
    if len(group) != 1 or min(group) < 2:
        return
    args = list(p.args)
    for k, arg, _ in reads:
        args[k] = arg
        p.in_strides.pop(k, None)  # (the offsets are kv_read's)
    p.args = tuple(args)
    g = group.pop()
    # the g query heads of a key/value head are consecutive rows b when the repeat's axis is the
    # innermost of the batch dims (stride 0 there, for k and v): one task then reads the rows once
    # for all g (the plan's kv_rows)
    rows = g if all(m[0][0][-1:] == (g,) and m[0][1][-1] == 0 for _, _, m in reads) else 1
    tasks = d.batch // rows
    par = d.parallel and tasks > 1
    p.detail = replace(d, kv_group=g, kv_read=tuple(m for _, _, m in reads), k_scale=k_scale, kv_rows=rows,
                       parallel=par, pool=d.pool and par)
    if rows > 1:
        p.threads = (f"the {tasks} (batch, key/value head) tasks of {rows} query rows "
                     + ("claimed one at a time by the threads of the claim-based pool (common_pool.h), as the "
                        "decode step's few-rows GEMMs" if p.detail.pool else "split evenly among the threads")
                     if par else p.threads)
        p.uops = [replace(u, what=u.what.replace("(batch, head) query rows", f"(batch, key/value head) tasks of {rows} "
                                                  "query rows, each k and v row read once for them"), count=u.count // rows)
                  if u.depth == 0 else
                  replace(u, count=u.count // rows) if u.op == "Load" and u.what.split(" ")[1] in ("k", "v") else u
                  for u in p.uops]
    p.uops = [UOp(u.depth, u.op, u.what.replace(" in place", f" in place from the KV cache, head h / {g}", 1), u.count)
              if u.op == "Load" and u.what.split(" ")[1] in ("k", "v") else u for u in p.uops]
    for q in gone:
        appends.pop(q.node, None)
        if q in plans:
            plans.remove(q)
            by_node.pop(q.node, None)


def _row_factor(body: Graph) -> float:
    """c of a _row_wise body that computes c x (its ops mul and div by constants, and expands)."""
    vals: dict[int, float] = {}
    for i, n in enumerate(body.nodes):
        if n.op == "input":
            vals[i] = 1.0
        elif n.op == "const":
            vals[i] = float(n.value)
        elif n.op == "expand":
            vals[i] = vals[n.args[0]]
        else:
            a, b = (vals[x] for x in n.args)
            vals[i] = a * b if n.op == "mul" else a / b
    return vals[body.outputs[0] if body.outputs else len(body.nodes) - 1]


def _through(r: KernelPlan, groups):
    """The dims `groups` (each a list of (size, stride) in r's contiguous result) as read from r's
    input: each (size, stride) refined into the run of r's axes it walks, each with r's input
    stride (0 along an axis r expands); None when one is no run of r's axes."""
    out = tuple(r.out_shape)
    src = r.body.nodes[0].type.shape
    if len(src) != len(out):
        return None
    ins = r.in_strides.get(0) or contiguous(src)
    sst = [0 if n == 1 and o != 1 else st for n, o, st in zip(src, out, ins)]
    cst = contiguous(out)

    def run(n: int, stride: int):  # r's axes that one index of n, stride `stride` walks, outermost first
        if n == 1 or stride == 0:
            return [(n, 0)] if stride == 0 else []
        t = next((t for t in range(len(out)) if out[t] > 1 and cst[t] == stride), None)
        if t is None:
            return None
        axes, m = [t], out[t]
        while m < n:
            t -= 1
            while t >= 0 and out[t] == 1:
                t -= 1
            if t < 0:
                return None
            axes.insert(0, t)
            m *= out[t]
        return [(out[a], sst[a]) for a in axes] if m == n else None

    new = []
    for gr in groups:
        ws = [run(n, x) for n, x in gr]
        if any(w is None for w in ws):
            return None
        new.append([y for w in ws for y in w])
    return new


def cache_bf16(plans: list[KernelPlan], by_node: dict[int, KernelPlan], appends: dict[int, LiveBound]) -> None:
    """Under precision="bf16", hold each KV cache as bf16 (uint16: its bytes halved, which set the
    decode attention's time) when every kernel that reads it can: a repeat (it widens the rows
    it copies) or a decode attention reading it as its keys or values in place (widened by a
    16-bit shift; q, the scores and the softmax stay f32). The append rounds its new rows to
    nearest even (eqf_bf16). Any other reader keeps the cache f32. The runtime takes the buffer
    as uint16 and rounds an f32 array given for it (eqfuse.runtime.program.Runner)."""
    for node, a in list(appends.items()):
        ap = by_node[node]
        if a.what != "append" or ap.wanted_precision != "bf16":
            continue
        readers = [p for p in plans if p.kind != K.VIEW and p is not ap
                   and any(_root(by_node, x) == node for x in p.args)]
        reads = {}  # attention -> (reads k from it, reads v from it)
        ok = bool(readers)
        for r in readers:
            if r.live is not None and r.live.what == "repeat":
                continue
            if r.kind != K.ATTENTION or r.live is None or not r.detail.decode:
                ok = False
                break
            srcs = [_body_source(r.body, r.shape.parts.kt), _body_source(r.body, r.shape.parts.v)]
            mine = [s is not None and _root(by_node, r.args[r.body.inputs.index(s)]) == node for s in srcs]
            other = [k for k, x in enumerate(r.args) if _root(by_node, x) == node
                     and r.body.inputs[k] not in [s for s, m in zip(srcs, mine) if m]]
            if other:
                ok = False
                break
            reads[id(r)] = (r, mine)
        if not ok:
            continue
        ap.live = appends[node] = replace(a, bf16=True)
        ap.bytes = ap.bytes * 3 // 4  # f32 read, bf16 written
        ap.precision, ap.precision_path = "bf16", "round"
        ap.precision_note = "the new rows rounded to nearest even into the bf16 KV cache"
        for r in readers:
            r.live = replace(r.live, bf16=True)
            if r.kind == K.ATTENTION:
                _, (k16, v16) = reads[id(r)]
                d = r.detail
                r.detail = replace(d, k_bf16=d.k_bf16 or k16, v_bf16=d.v_bf16 or v16)
                r.uops = [UOp(u.depth, u.op, u.what.replace(" rows [", " rows (bf16, widened) [", 1), u.count)
                          if u.op == "Load" and ((k16 and u.what.split(" ")[1] == "k") or (v16 and u.what.split(" ")[1] == "v"))
                          else u for u in r.uops]
                r.precision, r.precision_path = "bf16", "widen"
                r.precision_note = ("k and v read from the bf16 KV cache, widened to f32 by a 16-bit shift; "
                                    "q, the scores and the softmax in f32")
            else:
                r.precision, r.precision_path = "bf16", "widen"
                r.precision_note = "the rows of the bf16 KV cache widened to f32 by a 16-bit shift"


def _reshapes_to(by_node: dict[int, KernelPlan], arg: int, rows: int) -> int | None:
    """The kernel node that `arg` is, or is a view of through reshapes that keep the last axis
    `rows` long (so element j of that axis stays element j); None for any other view."""
    p = by_node.get(arg)
    while p is not None and p.kind == K.VIEW and p.view is not None:
        if p.out_shape[-1] != rows or any(n.op not in ("input", "reshape") for n in p.body.nodes):
            return None
        arg = p.view[0]
        p = by_node.get(arg)
    return arg


def _mark_rows(kg: Graph, plans: list[KernelPlan], by_node: dict[int, KernelPlan]) -> None:
    """Bound to the live keys the pointwise kernels whose last axis is the live attentions' keys
    and whose every reader reads only those: the attention mask's arithmetic over [B, C + new]
    (its cast, its logical_and). Such a kernel computes elements 0 .. L + new - 1 of each row
    ("rows" at run time); the others are never read. Walked from the graph's end, so that a
    kernel read only by kernels bound so is bound too."""
    keys = {p.live.rows: p.live.new for p in plans if p.kind == K.ATTENTION and p.live is not None}
    if not keys:
        return
    readers: dict[int, list[tuple[KernelPlan, int]]] = {}  # kernel node -> (reader, body input)
    for p in plans:
        if p.kind == K.VIEW:
            continue
        for k, arg in enumerate(p.args):
            rows = p.body.nodes[p.body.inputs[k]].type.shape[-1:] or (0,)
            src = _reshapes_to(by_node, arg, rows[0])
            readers.setdefault(arg if src is None else src, []).append((p, p.body.inputs[k] if src is not None else -1))
    returned = {_root(by_node, o) for o in kg.outputs}

    def reads_live(r: KernelPlan, i: int, rows: int) -> bool:
        """Whether reader r reads its body input i at elements 0 .. L + new - 1 of the last axis only."""
        if i < 0 or r.live is None or r.live.rows != rows or r.body.nodes[i].type.shape[-1] != rows \
                or r.in_strides.get(r.body.inputs.index(i)):
            return False
        # read by pointwise ops only, which broadcast it right-aligned: its last axis is the reader's,
        # an attention's keys (against its scores [.., 1 query row, keys]) or a rows kernel's rows
        pointwise = all(OPS[n.op].kind == OpKind.POINTWISE for n in r.body.nodes if i in n.args)
        if r.kind == K.ATTENTION:
            return pointwise and r.live.what == "keys" and r.detail.Sq != rows
        return pointwise and r.live.what == "rows"

    for p in reversed(plans):
        rows = p.out_shape[-1] if p.out_shape else 0
        if p.kind != K.POINTWISE or p.live is not None or rows not in keys or p.out_strides \
                or p.node in returned or not readers.get(p.node):
            continue
        if all(reads_live(r, i, rows) for r, i in readers[p.node]):
            p.live = LiveBound("rows", rows, keys[rows], axis=len(p.out_shape) - 1)


ROW_WISE = {"expand": "{0}", "mul": "({0} * {1})", "div": "({0} / {1})"}  # ops a live copy may apply


def _row_wise(body: Graph) -> bool:
    """A body of one input, scalar constants and ROW_WISE ops with a constant operand: each
    output row is its input row's, so the rows past the live ones need not be computed."""
    ins = [n for n in body.nodes if n.op == "input"]
    if len(ins) != 1 or body.nodes[0].op != "input" or body.nodes[-1].op not in ROW_WISE:
        return False
    for n in body.nodes:
        if n.op in ("input",) or (n.op == "const" and not n.type.shape):
            continue
        if n.op not in ROW_WISE or sum(body.nodes[a].op != "const" for a in n.args) != 1 \
                or body.nodes[n.args[0]].op == "const":
            return False
    return True


def _row_expr(body: Graph, load: str) -> str:
    """The C of a _row_wise body's output at one element, its input read by `load`."""
    from eqfuse.ir.ops import flit

    vals: dict[int, str] = {}
    for i, n in enumerate(body.nodes):
        if n.op == "input":
            vals[i] = load
        elif n.op == "const":
            vals[i] = flit(n.value)
        else:
            vals[i] = ROW_WISE[n.op].format(*(vals[a] for a in n.args))
    return vals[body.outputs[0] if body.outputs else len(body.nodes) - 1]


def emit_repeat(plan: KernelPlan) -> str:
    """The C of a repeat of a KV cache for the query heads (expand): rows 0 .. live + new - 1 of
    each (batch, head) block, the cache read through its view's strides (0 along the repeat)."""
    body, b = plan.body, plan.live
    src, out = body.nodes[0].type.shape, plan.out_shape
    ins = plan.in_strides.get(0) or contiguous(src)
    sst = [0 if n == 1 and o != 1 else st for n, o, st in zip(src, out, ins)]
    dst = plan.out_strides or contiguous(out)
    ax = b.axis
    params, _ = kernel_params(plan)
    lead, inner = out[:ax], out[ax + 1:]
    at = f"so + r * {sst[ax]} + {offset('j', inner, sst[ax + 1:])}"
    # (a bf16 KV cache's rows widened by a shift: cache_bf16)
    load = f"eqf_bf16_f32(((const uint16_t*)in0)[{at}])" if b.bf16 else f"in0[{at}]"
    return "\n".join([
        f"/* {plan.name}: the live rows of a KV cache repeated for the query heads, {list(out)} (at most {b.rows} rows) */",
        f"void {plan.name}({params}{b.params})",
        "{",
        f"    const long rows = {b.end};",
        f"    for (long o = 0; o < {size(lead)}; o++) {{",
        f"        const long so = {offset('o', lead, sst[:ax])}, d0 = {offset('o', lead, dst[:ax])};",
        "        for (long r = 0; r < rows; r++)",
        "            #pragma omp simd",
        f"            for (long j = 0; j < {size(inner)}; j++)",
        f"                out[d0 + r * {dst[ax]} + {offset('j', inner, dst[ax + 1:])}] = "
        f"{_row_expr(body, load)};",
        "    }",
        "}"])
