"""Stage `lower`: fused graph -> kernel plans, as data (eqfuse.backend.plan).

A plan holds every tile the C will use, chosen here from this machine's caches and checked
against them, its micro-op schedule and its bytes moved and FLOPs; the GEMM kinds are planned
in eqfuse.backend.lower_gemm. `emit` turns plans into C and chooses nothing; nothing here writes C.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from eqfuse.backend.kernels import SUPPORTED, Unsupported, classify
from eqfuse.backend.lower_gemm import (  # noqa: F401  (extract asks)
    PARALLEL_MIN_FMAS,
    plan_contraction,
    row_epilogue_fits,
)
from eqfuse.backend.machine import Machine
from eqfuse.backend.views import place_views
from eqfuse.backend.plan import (
    F32,
    KernelPlan,
    Split,
    UOp,
    not_ancestors,
    ops_text,
    pointwise_flops,
    size,
)
from eqfuse.errors import EqfuseError
from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.ops import OPS, reduce_axes

# ------------------------------------------------------------------ the machine


@dataclass(frozen=True)
class Caches:
    l1: int
    l2: int
    l3: int
    simd: int  # float lanes per vector
    cores: int


def machine_caches() -> Caches:
    """This machine's caches, read from the system by eqfuse.backend.machine (EQFUSE_L1/L2/L3 override)."""
    from eqfuse.backend import machine

    m = machine.machine()
    return Caches(m.l1, m.l2, m.l3, m.simd_floats, m.cores)


# ------------------------------------------------------------------ graph -> kernels only


def _single_op_kernel(out: Graph, ids: dict[int, int], n: Node) -> int:
    """Add op n (its args given as ids of nodes already in `out`) as a one-op kernel of `out`."""
    body = Graph("kernel")
    args: list[int] = []
    body_args = []
    seen: dict[int, int] = {}
    for a in (ids[x] for x in n.args):
        an = out.nodes[a]
        if an.op == "const":
            body_args.append(body.add(Node("const", attrs=an.attrs, type=an.type)))
        elif a not in seen:
            seen[a] = body.add(Node("input", type=an.type, name=an.name or f"t{a}"))
            body.inputs.append(seen[a])
            args.append(a)
            body_args.append(seen[a])
        else:
            body_args.append(seen[a])
    body.outputs = [body.add(Node(n.op, tuple(body_args), n.attrs, n.type, pos=n.pos))]
    return out.add(Node("kernel", tuple(args), (), n.type, name=n.name, pos=n.pos, body=body))


def kernelize(g: Graph, fuse: bool = True, split: frozenset[int] = frozenset()) -> Graph:
    """The graph with only input/const/kernel nodes at top level.

    Kernel blocks stay (unless fuse=False or their id is in `split`: then their bodies are
    inlined); every other op becomes a kernel of its own.
    """
    out = Graph(g.name, pos=g.pos)
    mapping: dict[int, int] = {}
    for i, n in enumerate(g.nodes):
        if n.op in ("input", "const"):
            mapping[i] = out.add(n)
        elif n.op == "kernel" and fuse and i not in split:
            mapping[i] = out.add(replace(n, args=tuple(mapping[a] for a in n.args)))
        elif n.op == "kernel":
            inner = {bi: mapping[a] for bi, a in zip(n.body.inputs, n.args)}
            for bi, bn in enumerate(n.body.nodes):
                if bn.op == "const":
                    inner[bi] = out.add(bn)
                elif bn.op != "input":
                    inner[bi] = _single_op_kernel(out, inner, bn)
            mapping[i] = inner[n.body.outputs[0]]
        else:
            mapping[i] = _single_op_kernel(out, mapping, n)
    out.inputs = [mapping[i] for i in g.inputs]
    out.outputs = [mapping[o] for o in g.outputs]
    return out


# ------------------------------------------------------------------ planning


def _reads(plan_body: Graph) -> int:
    return sum(size(plan_body.nodes[i].type.shape) for i in plan_body.inputs)


def _vec(n: int, simd: int) -> int:
    return max(1, -(-n // simd))


def plan_kernel(g: Graph, node_id: int, name: str, caches: Caches) -> KernelPlan:
    n = g.nodes[node_id]
    body = n.body
    for _, _, bn in body.walk():
        if not bn.type.concrete:
            raise EqfuseError(f"kernel {name} has unbound dimensions ({bn.type}); bind them with dims=", n.pos)
    try:
        ks = classify(body)
    except Unsupported as why:
        raise EqfuseError(f"this kernel block cannot be lowered: {why}", n.pos,
                          f"supported kernel shapes: {SUPPORTED}") from None
    out_shape = tuple(body.nodes[body.outputs[0]].type.shape)
    plan = KernelPlan(name, ks.kind, node_id, tuple(n.args), body, ks, out_shape)
    plan.bytes = F32 * (_reads(body) + size(out_shape))
    {"pointwise": _plan_pointwise, "contraction": _plan_gemm, "contraction_row": _plan_gemm,
     "row": _plan_row,
     "reduce": _plan_reduce, "attention": _plan_attention, "layout": _plan_layout,
     "index": _plan_index}[ks.kind](plan, caches)
    return plan


def _ins(plan: KernelPlan) -> list[str]:
    return [plan.body.nodes[i].name or f"in{k}" for k, i in enumerate(plan.body.inputs)]


# Elements per tile of a streaming pointwise kernel: a multiple of 16 (tiles start on 64-byte
# lines of the output); nothing of it is kept in cache, it only amortizes the per-tile set-up.
STREAM_TILE = 4096
STREAM_MIN_INNER = 64  # streaming needs whole output lines: inner loops shorter than this store normally


def _inner_extent(plan: KernelPlan) -> int:
    """Elements of the pointwise kernel's inner loop: the innermost dims every operand walks
    with one stride (as emit_pointwise groups them)."""
    from eqfuse.backend.indexing import contiguous, joint_groups, leaf_strides

    shape = plan.out_shape
    sets = leaf_strides(plan.body, plan.body.outputs[0], shape, plan.base_strides()) + [contiguous(shape)]
    groups = joint_groups(shape, sets)
    return size([shape[d] for d in groups[-1]]) if groups else 1


def _plan_pointwise(plan: KernelPlan, c: Caches) -> None:
    total = size(plan.out_shape)
    streams = len(plan.body.inputs) + 1
    # Outputs beyond this core count's share of the last-level cache bypass it (non-temporal
    # stores). The L3 the system reports may be the whole socket's (480 MiB on some shared
    # hosts), so the share is capped at 8 L2s per core.
    stream_bytes = min(c.l3 // 2, 8 * c.l2 * c.cores)
    inner = _inner_extent(plan)
    f32_out = plan.body.nodes[plan.body.outputs[0]].type.dtype == "f32"  # streamed lines are 16 floats
    stream = f32_out and total * F32 >= stream_bytes and inner >= STREAM_MIN_INNER
    if stream:
        # Each whole output line is computed in registers and streamed out (4 input/output
        # streams overlapped; the earlier 1024-element L1 buffer copied out afterwards ran
        # ~15-20% slower on 16M elements here).
        tile = min(STREAM_TILE, -(-inner // 16) * 16)
        plan.cache_check = (f"output {total * F32} B >= {stream_bytes} B (min(L3/2, 8 L2 x cores)): "
                            f"non-temporal stores, one 64 B line at a time")
    else:
        # Each tile of the inner dim streams through L1: `streams` arrays of `tile` floats, half of L1.
        tile = 1 << max(8, min(14, int(math.log2(max(1, c.l1 // 2 // (F32 * streams))))))
        ws = tile * F32 * streams
        plan.cache_check = f"tile working set {ws} B <= L1 {c.l1} B: {'ok' if ws <= c.l1 else 'NO'}"
        if ws > c.l1:
            raise EqfuseError(f"pointwise tile of {tile} does not fit L1")
    if not stream:
        tile = min(tile, inner)  # a tile never spans two rows of the inner loop
    plan.tiles = {"tile": tile, "stream": int(stream)}
    plan.detail = {"stream_bytes": stream_bytes, "inner": inner}
    plan.flops = pointwise_flops(plan.body)
    # the C walks outer rows x tiles of each row; streaming tiles start on the output's 64-byte
    # lines, so a row has up to 15 more elements to cover
    ntiles = total // max(inner, 1) * -(-(inner + 15 * int(stream)) // tile)
    ops = ops_text(plan.body)
    plan.uops = [UOp(0, "Loop", f"t over {ntiles} tiles of {tile} elements (parallel)", ntiles)]
    for nm, i in zip(_ins(plan), plan.body.inputs):
        plan.uops.append(UOp(1, "Load", f"{nm} tile [{tile}] (broadcast {list(plan.body.nodes[i].type.shape)})", ntiles))
    plan.uops.append(UOp(1, "Exec", f"{ops} on {_vec(tile, c.simd)} vectors", ntiles))
    plan.uops.append(UOp(1, "Store", f"out tile [{tile}]" + (" (non-temporal)" if stream else ""), ntiles))


def _plan_gemm(plan: KernelPlan, c: Caches) -> None:
    plan_contraction(plan, Machine(c.l1, c.l2, c.l3, c.simd, c.cores))


def _row_split(xshape: tuple[int, ...], axis0: int) -> tuple[int, int]:
    return size(xshape[:axis0]), size(xshape[axis0:])


def _plan_row(plan: KernelPlan, c: Caches) -> None:
    body, a = plan.body, plan.shape.anchor
    an = body.nodes[a]
    xshape = tuple(body.nodes[an.args[0]].type.shape)
    if tuple(an.type.shape) != plan.out_shape:
        raise Split("the epilogue broadcasts the row op's result to a larger shape")
    if an.op == "softmax":
        axis0 = an.attr["axis"] % len(xshape)  # rows run along this axis (strided when not the last)
    elif an.op == "layernorm":
        axis0 = an.attr["axis"] % len(xshape)
    elif an.op == "rmsnorm":
        axis0 = len(xshape) - 1
    else:  # sum / mean / max over trailing axes
        axes = reduce_axes(an.attr, len(xshape))
        axis0 = min(axes) if axes else len(xshape)
    rows, L = _row_split(xshape, axis0)
    if an.op == "softmax":
        rows, L = size(xshape) // xshape[axis0], xshape[axis0]
    plan.detail = {"rows": rows, "L": L, "axis0": axis0, "op": an.op}
    plan.flops = OPS[an.op].flops * size(xshape) + pointwise_flops(body, skip={a})
    row_bytes = L * F32 * (len(body.inputs) + 1)
    plan.cache_check = f"row working set {row_bytes} B <= L2 {c.l2} B: {'ok' if row_bytes <= c.l2 else 'no (streams from L3)'}"
    passes = {"softmax": 3, "layernorm": 3, "rmsnorm": 2}.get(an.op, 1)
    pro = ops_text(body, skip=not_ancestors(body, an.args[0]))
    u = plan.uops
    u.append(UOp(0, "Loop", f"r over {rows} rows (parallel)", rows))
    for nm, i in zip(_ins(plan), body.inputs):
        u.append(UOp(1, "Load", f"{nm} row [{L}]" if size(body.nodes[i].type.shape) > 1 else f"{nm} scalar", rows))
    u.append(UOp(1, "Exec", f"prologue ({pro or 'none'}) + {an.op} in {passes} passes over the row in cache "
                            f"({_vec(L, c.simd)} vectors each)", rows))
    u.append(UOp(1, "Store", f"out row [{L if an.op in ('softmax', 'layernorm', 'rmsnorm') else 1}] after the epilogue", rows))


def _plan_reduce(plan: KernelPlan, c: Caches) -> None:
    body, a = plan.body, plan.shape.anchor
    an = body.nodes[a]
    if tuple(an.type.shape) != plan.out_shape:
        raise Split("the epilogue broadcasts the reduction's result to a larger shape")
    # The epilogue runs over the output's index space: it cannot read a value computed in the
    # prologue (x / sum(x) is a row kernel's shape, or two kernels)
    prologue = {j for j in body.ancestors(an.args[0]) if body.nodes[j].op not in ("input", "const")}
    epilogue = body.ancestors(body.outputs[0]) - body.ancestors(a)
    if any(arg in prologue for j in epilogue for arg in body.nodes[j].args):
        raise Split("the epilogue reads a value of the prologue's index space")
    xshape = tuple(body.nodes[an.args[0]].type.shape)
    axes = reduce_axes(an.attr, len(xshape))
    plan.detail = {"axes": axes, "op": an.op}
    plan.flops = size(xshape) + pointwise_flops(body, skip={a})
    out_bytes = size(plan.out_shape) * F32
    plan.cache_check = f"accumulators {out_bytes} B (the output) vs L2 {c.l2} B: {'ok' if out_bytes <= c.l2 else 'streams'}"
    u = plan.uops
    u.append(UOp(0, "Exec", f"init {size(plan.out_shape)} accumulators", 1))
    u.append(UOp(0, "Loop", f"walk {list(xshape)} in memory order, kept axes split over threads", 1))
    u.append(UOp(1, "Load", f"input element vectors [{xshape[-1] if xshape else 1}]", size(xshape[:-1])))
    u.append(UOp(1, "Exec", f"prologue + {an.op} into accumulators over axes {list(axes)}", size(xshape[:-1])))
    u.append(UOp(0, "Store", f"out [{size(plan.out_shape)}] after the epilogue", 1))


def _plan_attention(plan: KernelPlan, c: Caches) -> None:
    body = plan.body
    q, kt, v, qk, sm, mask, result = plan.shape.parts
    qs, kts, vs = (body.nodes[i].type.shape for i in (q, kt, v))
    pv = body.nodes[plan.shape.anchor]
    if tuple(pv.type.shape) != tuple(body.nodes[result].type.shape):
        raise Split("the epilogue broadcasts the attention result to a larger shape")
    Sq, D = qs[-2], qs[-1]
    Sk = kts[-1]
    Dv = vs[-1]
    batch = size(pv.type.shape[:-2])
    # A key tile of 64 is four 16-lane vectors (the micro-kernels' width). The query block is
    # the largest whose q block, score tile and accumulators share L1 with the key tile, when
    # the key tile takes at most half of L1; a larger one (head size 128: 32 KiB) streams from
    # L2 row by row, each row used by 4 query rows x 64 keys of FMAs, and is left out of the
    # count (counted, it forced blocks of 4 queries: every key tile read again per 4 rows).
    bk = 64 if D * 64 * F32 <= c.l2 // 4 else 16
    kt_l1 = D * bk * F32 if D * bk * F32 <= c.l1 // 2 else 0
    bq = 32
    while bq > 4 and (bq * D + bq * bk + bq * Dv) * F32 + kt_l1 > c.l1:
        bq //= 2
    ws = (bq * D + bq * bk + bq * Dv) * F32 + kt_l1
    plan.tiles = {"bq": bq, "bk": bk}
    plan.detail = {"batch": batch, "Sq": Sq, "Sk": Sk, "D": D, "Dv": Dv}
    plan.flops = batch * (2 * Sq * Sk * D + 2 * Sq * Sk * Dv + 6 * Sq * Sk)
    # its two products as one GEMM's multiply-adds: a parallel region only above the GEMMs' bar
    fmas, nqb_ = batch * Sq * Sk * (D + Dv), -(-Sq // bq)
    plan.detail["parallel"] = batch * Sq > 1 and fmas >= PARALLEL_MIN_FMAS
    plan.detail["threads"] = (f"the {batch} x {nqb_} (batch, {bq}-query block) tasks split evenly among the threads"
                              if plan.detail["parallel"] else
                              f"one thread, no parallel region ({fmas} multiply-adds < {PARALLEL_MIN_FMAS}, "
                              "lower_gemm.PARALLEL_MIN_FMAS)")
    held = "q block, k tile, score tile, accumulators" if kt_l1 else \
        f"q block, score tile, accumulators; the {D * bk * F32} B k tile streams from L2"
    plan.cache_check = (f"tile working set ({held}) {ws} B <= L1 {c.l1} B: "
                        f"{'ok' if ws <= c.l1 else 'NO'}; largest buffer {bq} x {bk} scores, never {Sq} x {Sk}")
    nqb, nkt = -(-Sq // bq), -(-Sk // bk)

    def via(i):  # q, k^T and v may be read in place through transposes / reshapes
        return "" if body.nodes[i].op == "input" else " (strided, through its layout view)"

    out_via = "" if result == body.outputs[0] else " (strided, through the output transpose)"
    u = plan.uops
    u += [UOp(0, "Loop", f"batch {batch} x query blocks of {bq} (parallel)", batch * nqb),
          UOp(1, "Load", f"q block [{bq} x {D}]{via(q)}", batch * nqb),
          UOp(1, "Loop", f"key tiles of {bk} over {Sk}", batch * nqb * nkt),
          UOp(2, "Load", f"k^T tile [{D} x {bk}] of the per-head padded copy of k^T{via(kt)}", batch * nqb * nkt),
          UOp(2, "Exec", f"scores {bq} x {bk} = q k^T ({bq * bk * D} FMA) + score ops"
                         f"{' + mask' if mask is not None else ''}", batch * nqb * nkt),
          UOp(2, "Exec", "online softmax in base 2: row max, lazy rescale (only when the max rises "
                         "by more than 2^8), exp2", batch * nqb * nkt),
          UOp(2, "Load", f"v tile [{bk} x {Dv}]{via(v)}", batch * nqb * nkt),
          UOp(2, "Exec", f"acc [{bq} x {Dv}] += p v ({bq * bk * Dv} FMA)", batch * nqb * nkt),
          UOp(1, "Store", f"out block [{bq} x {Dv}] / row sums, epilogue{out_via}", batch * nqb)]


def _plan_index(plan: KernelPlan, c: Caches) -> None:
    from eqfuse.backend.emit_index import plan_index

    plan_index(plan, c)


def _plan_layout(plan: KernelPlan, c: Caches) -> None:
    body, a = plan.body, plan.shape.anchor
    an = body.nodes[a]
    plan.detail = {"op": an.op}
    if an.op in ("reshape", "squeeze", "unsqueeze", "flatten"):
        plan.kind = "view"
        plan.bytes = 0
        plan.uops = [UOp(0, "Exec", f"reshape {list(body.nodes[an.args[0]].type.shape)} -> {list(plan.out_shape)}: "
                                    "zero-copy view of a contiguous buffer", 1)]
        plan.cache_check = "no data moved"
        return
    total = size(plan.out_shape)
    inner = plan.out_shape[-1] if plan.out_shape else 1
    plan.cache_check = "streaming copy"
    u = plan.uops
    u.append(UOp(0, "Loop", f"{total // max(inner, 1)} output rows of {inner} (parallel)", total // max(inner, 1)))
    u.append(UOp(1, "Load", f"{an.op} source row [{inner}] (strided gather)", total // max(inner, 1)))
    u.append(UOp(1, "Store", f"out row [{inner}]", total // max(inner, 1)))


# ------------------------------------------------------------------ the whole graph


def lower_graph(g: Graph, fuse: bool = True, params: frozenset[str] = frozenset()) -> tuple[Graph, list[KernelPlan]]:
    """(the kernelized graph, one plan per kernel) for a graph with concrete shapes. `params`
    names the inputs bound by params=: a GEMM whose B is one of them is marked b_bound (emit
    then prepacks it, when B is one matrix shared by every batch)."""
    caches = machine_caches()
    split: set[int] = set()
    while True:
        kg = kernelize(g, fuse=fuse, split=frozenset(split))
        plans: list[KernelPlan] = []
        retry = False
        count = 0
        for i, n in enumerate(kg.nodes):
            if n.op != "kernel":
                continue
            try:
                plan = plan_kernel(kg, i, "", caches)
            except Split:
                orig = _origin(g, kg, i)
                if orig is None or orig in split:
                    raise
                split.add(orig)
                retry = True
                break
            plan.name = f"eqf_{g.name}_k{count}_{plan.kind}"
            count += 1
            _mark_bound_b(plan, kg, params)
            plans.append(plan)
        if not retry:
            place_views(kg, plans)
            for p in plans:  # a kernel reading views walks other strides: its loops again
                if p.kind in ("pointwise", "contraction", "contraction_row") and p.in_strides:
                    p.tiles, p.detail, p.uops = {}, {}, []
                    (_plan_pointwise if p.kind == "pointwise" else _plan_gemm)(p, caches)
                    if p.kind != "pointwise":
                        _mark_bound_b(p, kg, params)
            return kg, plans


def _mark_bound_b(plan: KernelPlan, kg: Graph, params: frozenset[str]) -> None:
    """detail["b_bound"] for a matmul GEMM whose B (or the matrix its transpose reads) is a kernel
    input bound by params=, read by nothing else in the kernel, and one matrix for every batch."""
    if plan.kind not in ("contraction", "contraction_row") or not params or plan.detail["gemm"]["mode"] != "fold":
        return  # (otherwise B differs between batches)
    body = plan.body
    mm = body.nodes[plan.shape.anchor]
    b = mm.args[1]
    src = body.nodes[b].args[0] if body.nodes[b].op == "transpose" else b
    if body.nodes[src].op != "input":
        return
    readers = [n for n in body.nodes if src in n.args]
    arg = plan.args[body.inputs.index(src)]
    if len(readers) == 1 and kg.nodes[arg].op == "input" and kg.nodes[arg].name in params:
        plan.detail["b_bound"] = True
        plan.detail["gemm"]["direct_b"] = False
        plan.uops = [replace(u, what="B panels packed once when bound (params=), read in place")
                     if u.op == "Load" and ("pack B panel" in u.what or u.what.startswith("B read in place")) else u
                     for u in plan.uops]  # the tile schedule says so


def _origin(g: Graph, kg: Graph, i: int) -> int | None:
    """The kernel node of g that became node i of kg (kernels keep their order and body)."""
    body = kg.nodes[i].body
    for j, n in enumerate(g.nodes):
        if n.op == "kernel" and n.body is body:
            return j
    return None


def format_uops(plans: list[KernelPlan], uops: bool = True) -> str:
    """Each kernel's plan: kind, shape, bytes, FLOPs, tiles, cache constraints and the rule of
    its thread split; with `uops`, then its tile-level schedule. Last, the total uop count."""
    lines = []
    for p in plans:
        lines.append(f"{p.name}: {p.kind} -> {list(p.out_shape)}  bytes {p.bytes}  flops {p.flops}")
        if p.tiles:
            lines.append("  tiles: " + ", ".join(f"{k}={v}" for k, v in p.tiles.items()))
        if p.cache_check:
            lines.append(f"  cache: {p.cache_check}")
        if "threads" in p.detail:
            lines.append(f"  threads (decided at run time): {p.detail['threads']}")
        if uops:
            lines += [f"  {'  ' * u.depth}{u.op:<5} {u.what}  x{u.count}" for u in p.uops]
        else:
            lines.append(f"  uops: {sum(u.count for u in p.uops)} ({len(p.uops)} kinds; --uops lists them)")
    lines.append(f"total: {sum(u.count for p in plans for u in p.uops)} uops "
                 f"({'the x counts above' if uops else 'the counts above'}, summed)")
    return "\n".join(lines)
