"""A KV cache with a run-time length: the graph rewrite that `compile(live=...)` runs on a
decoder step (docs/generation.md, "The decode step").

A decoder export appends one step's keys and values to its past: present = concat(past, new,
axis). Compiled with the past dim bound to a capacity C, `cache_graph` re-types each past input
to its concat's result, [.., C + S, ..] (S the new rows): the caller's cache buffer, whose first
rows are the live past. The graph reads the past through slice(buffer, 0:C), so its meaning at the
capacity is unchanged (the numpy reference runs it as is). It also gets one more input, the live
length L (i64[1]); the backend then lowers each such concat to an append in place (the new rows
written at rows L .. L+S-1 of the buffer, which is also the present output) and each attention
over its result to L + S keys (eqfuse.backend.live). Rows past L + S are never read.

A step of several new rows (a chunk of a prompt, S > 1) has a causal mask: query i sees keys
0 .. C + i, which an export computes from the past's length, at compile time here: a bound
constant [.., S, C + S] with one value where key j <= C + i and another elsewhere. Given the
bound inputs' values, `cache_graph` computes each such constant from the live length instead,
where(j <= L + i, inside, outside) (`_live_causal`), so the mask is right at any L whatever
reads it: the attention itself, or a kernel that combines it with the run-time padding mask
(the dynamo exporter's decoders) whose result the attention reads. A sliding-window layer's mask
is banded too (key j > C + i - W as well): it is computed from the live length the same way,
and is taken for a step of one row as well, whose band is its only mask once C >= W.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from eqfuse.errors import EqfuseError
from eqfuse.ir.graph import Graph, Node, infer_type
from eqfuse.ir.ops import OPS, OpKind
from eqfuse.ir.shapes import TType

LENGTH_DTYPE = "i64"


def cache_graph(g: Graph, axes: dict[str, int], length: str, dims: dict[str, int] | None = None) -> Graph:
    """g with each live input (param name -> axis of its past rows) re-typed to the result of the
    one concat that appends to it, read through a slice of its first rows, and one more input
    named `length`, i64[1] (module docstring). Refused with a message when a live input is read
    by anything but the first operand of a concat along that axis. `dims` binds a live input's
    named past dim (a .g graph's; an ONNX import's dims are numbers)."""
    if length in {n for n, _ in g.params}:
        raise EqfuseError(f"live=: the graph already has an input named '{length}'")
    users: dict[int, list[int]] = {}
    for i, n in enumerate(g.nodes):
        for a in n.args:
            users.setdefault(a, []).append(i)
    cache: dict[int, TType] = {}  # live input node -> its buffer's type
    for i in g.inputs:
        name = g.nodes[i].name
        if name not in axes:
            continue
        t, ax = g.nodes[i].type, axes[name]
        readers = users.get(i, [])
        while len(readers) == 1 and g.nodes[readers[0]].op == "concat" and len(g.nodes[readers[0]].args) == 1 \
                and readers[0] not in g.outputs:  # a concat of one operand is the operand (an export's)
            one = readers[0]
            readers = users.get(one, [])
            if not all(g.nodes[r].op == "concat" and g.nodes[r].args[0] == one for r in readers):
                break
        first = {r: (g.nodes[r].args[0] if g.nodes[r].op == "concat" else None) for r in readers}
        why = None
        if i in g.outputs:
            why = "it is also returned"
        elif not readers:
            why = "nothing reads it"
        for r in readers:
            rn = g.nodes[r]
            if rn.op != "concat" or i in rn.args[1:] or first[r] in rn.args[1:] or rn.attr["axis"] % t.rank != ax:
                why = f"it is read by {rn.op}, not only as the first operand of a concat along axis {ax}"
        shapes = {tuple(g.nodes[r].type.shape) for r in readers}
        if why is None and len(shapes) != 1:
            why = "the concats that read it have different shapes"
        if why:
            raise EqfuseError(f"live=: input '{name}' cannot hold a KV cache with a run-time length: {why}", g.pos)
        cache[i] = TType(shapes.pop(), t.dtype)
    out = Graph(g.name, pos=g.pos)
    ids: dict[int, int] = {}
    # Each slice is written just before its reader, not beside the inputs: a layer's slice then
    # lies in its layer, where the repeated layers are cut into pieces (eqfuse.optimizer.repeats).
    later: dict[int, Node] = {}

    def ref(a: int) -> int:
        if a in later:
            ids[a] = out.add(later.pop(a))
        return ids[a]

    for i, n in enumerate(g.nodes):
        if i in cache:
            buf = out.add(replace(n, type=cache[i]))
            ax = axes[n.name]
            stop = n.type.shape[ax]
            later[i] = Node("slice", (buf,), (("axis", ax), ("start", 0), ("stop", (dims or {}).get(stop, stop)),
                                              ("step", 1)), n.type, pos=n.pos)
            cache[i] = buf  # (now the buffer's input node)
        elif n.op == "concat" and len(n.args) == 1 and i not in g.outputs:
            ids[i] = ref(n.args[0])  # the identity (as above): no copy of the past
        else:
            ids[i] = out.add(replace(n, args=tuple(ref(a) for a in n.args)))
    out.inputs = [cache.get(i, ids[i]) for i in g.inputs]
    out.inputs.append(out.add(Node("input", type=TType((1,), LENGTH_DTYPE), name=length)))
    out.outputs = [ids[o] for o in g.outputs]
    return out


def length_graph(g: Graph, length: str) -> Graph:
    """g with one more input named `length`, i64[1]: the run-time value of a named dim that no KV
    cache holds (compile's live= on such a dim: eqfuse.backend.runtime_dim). Every input and
    result keeps its shape at the dim's capacity; only the kernels' loops over it follow `length`."""
    if length in {n for n, _ in g.params}:
        raise EqfuseError(f"live=: the graph already has an input named '{length}'")
    out = Graph(g.name, list(g.nodes), list(g.inputs), list(g.outputs), pos=g.pos)
    out.inputs.append(out.add(Node("input", type=TType((1,), LENGTH_DTYPE), name=length)))
    return out


def appended(g: Graph, axes: dict[str, int]) -> bool:
    """Whether any input of `axes` (param name -> axis) is read by a concat along that axis: a KV
    cache (cache_graph), rather than a dim taken at run time by the loops alone (length_graph)."""
    by_name = {g.nodes[i].name: i for i in g.inputs}
    for n in g.nodes:
        if n.op != "concat":
            continue
        for a in n.args:
            name = g.nodes[a].name if g.nodes[a].op == "input" else None
            if name in axes and n.attr["axis"] % g.nodes[by_name[name]].type.rank == axes[name]:
                return True
    return False


def causal_from_length(g: Graph, arrays: Mapping[str, np.ndarray], length: str) -> Graph:
    """g (a cache_graph, its bound values folded: `arrays`) with each bound causal mask of a step
    of several new rows computed from the live length input `length` (module docstring); g
    itself when it has none. The new rows S and the buffers' rows C + S of each step are read off
    the slices of the cache buffers that cache_graph made (slice(buffer, 0:C), read by a concat)."""
    at = {n.name: i for i, n in enumerate(g.nodes) if n.op == "input"}
    steps = set()
    for n in g.nodes:
        if n.op == "concat" and g.nodes[n.args[0]].op == "slice":
            sl = g.nodes[n.args[0]]
            buf = g.nodes[sl.args[0]]
            if buf.op == "input" and buf.name not in arrays and sl.attr.get("start") == 0:
                rows = buf.type.shape[sl.attr["axis"]]
                if isinstance(rows, int) and isinstance(sl.attr["stop"], int):
                    steps.add((rows - sl.attr["stop"], rows))
    if length not in at or not steps:
        return g
    out = Graph(g.name, pos=g.pos)
    ids: dict[int, int] = {}
    for i, n in enumerate(g.nodes):  # the inputs first, so that a mask may follow the length input
        if n.op == "input":
            ids[i] = out.add(n)
    swapped: dict[int, int] = {}  # a causal mask's input -> the node computing it from the length
    for i, n in enumerate(g.nodes):
        if n.op == "input" and n.name in arrays:
            for new, rows in sorted(steps):  # (a graph may append steps of several lengths: QAttentions)
                mask = _live_causal(out, ids[at[length]], ids[i], np.asarray(arrays[n.name]), new, rows)
                if mask is not None:
                    swapped[i] = mask
                    break
    if not swapped:
        return g
    for i, n in enumerate(g.nodes):
        if n.op != "input":
            ids[i] = out.add(replace(n, args=tuple(swapped[a] if a in swapped else ids[a] for a in n.args)))
    out.inputs = [ids[i] for i in g.inputs]  # (a swapped input stays a parameter, read by nothing)
    out.outputs = [swapped[o] if o in swapped else ids[o] for o in g.outputs]
    return out


def _live_causal(out: Graph, length: int, node: int, value: np.ndarray, new: int, rows: int) -> int | None:
    """The node of where(L + i - W < j <= L + i, inside, outside) in `out`, shaped as the bound
    input `node`, when its value is a causal mask over [.., new, rows] at the capacity rows - new
    (one value where key j <= rows - new + i, another elsewhere; leading dims of one), perhaps
    banded by a sliding window W (key j also > rows - new + i - W: a sliding-window layer's mask
    over its cache kept whole, onnx_inputs.window_slices); else None. A step of one row has no
    causal mask: its mask is taken only when it shows a band."""
    t = out.nodes[node].type
    shape = tuple(t.shape)
    if len(shape) < 2 or shape[-2:] != (new, rows) or any(d != 1 for d in shape[:-2]) or value.shape != shape:
        return None
    past = rows - new
    v = value.reshape(new, rows)
    key, query = np.arange(rows)[None, :], past + np.arange(new)[:, None]
    inside = v[0, past]  # (query 0 sees its own key)
    seen = v == inside
    outside = v[~seen]
    if outside.size == 0 or not np.all(outside == outside[0]):
        return None
    causal = key <= query
    excluded = np.where(causal & ~seen, key, -1).max(axis=1)  # each query's newest key left out
    window = int((query[:, 0] - excluded)[excluded >= 0][0]) if excluded.max() >= 0 else None
    if not np.array_equal(seen, causal & (key > query - (window or rows + 1))):
        return None
    if window is None and new == 1:
        return None

    def op(name: str, *args: int, **attrs) -> int:
        n = Node(name, tuple(args), tuple(attrs.items()))
        return out.add(replace(n, type=infer_type(n, [out.nodes[a].type for a in args])))

    def const(x) -> int:
        return out.add(Node("const", attrs=(("value", float(x)),), type=TType(())))

    def ints(lo: int, n: int) -> int:
        return op("range", start=lo, stop=lo + n, step=1, dtype=LENGTH_DTYPE)

    keys = ints(0, rows)
    queries = op("add", length, op("reshape", ints(0, new), shape=(new, 1)))
    seen_live = op("le", keys, queries)  # bool [new, rows]: key j <= L + query i
    if window is not None:  # and key j > L + query i - W
        seen_live = op("logical_and", seen_live, op("gt", keys, op("sub", queries, ints(window, 1))))
    if t.dtype == "bool":
        mask = seen_live if bool(inside) else op("logical_not", seen_live)
    else:
        mask = op("where", seen_live, const(inside), const(outside[0]))
        if out.nodes[mask].type.dtype != t.dtype:
            mask = op("cast", mask, to=t.dtype)
    return op("reshape", mask, shape=shape)


def pick_row(g: Graph, index: str, output: int = 0, axis: int = 1) -> Graph:
    """g with result `output` cut to one row along `axis`: the row given at run time by one more
    input named `index` (i64[1], 0 .. rows - 1), so the result is [.., 1, ..]. A decoder's prompt
    chunk needs its logits at one row only (the chunk's last real token: eqfuse.generate), and the
    LM head's GEMM over every row of the chunk was a tenth of a Llama-style chunk's time
    (benchmarks/bench_generate.py, prefill). So the gather is put before the result's last matmul
    when the rows go through it and the ops after it on their own: the matmul's left operand holds
    `axis` and not as its contracted dim, its right operand is a matrix, and each later op is
    pointwise over the chain with its other operands not spanning `axis`. Otherwise the result
    itself is gathered (right, with nothing saved). The ops no result reads any more are dropped."""
    if index in {n for n, _ in g.params}:
        raise EqfuseError(f"the graph already has an input named '{index}'")
    out_node = g.outputs[output]
    rank = g.nodes[out_node].type.rank
    ax = axis % rank

    def spans(a: int) -> bool:  # an operand broadcast along the rows axis does not span it
        shape = g.nodes[a].type.shape
        k = ax - (rank - len(shape))
        return k >= 0 and shape[k] != 1

    chain, i = [], out_node  # the pointwise ops from the matmul down to the result, last first
    while i is not None:
        n = g.nodes[i]
        if n.op == "matmul" and ax < rank - 1 and g.nodes[n.args[0]].type.rank == rank \
                and g.nodes[n.args[1]].type.rank == 2:
            break
        if n.op in OPS and OPS[n.op].kind == OpKind.POINTWISE and n.args and n.type.rank == rank \
                and g.nodes[n.args[0]].type.rank == rank and not any(spans(a) for a in n.args[1:]):
            chain.append(i)
            i = n.args[0]
        else:
            chain, i = [], None
    nodes = list(g.nodes)
    row = len(nodes)
    nodes.append(Node("input", type=TType((1,), LENGTH_DTYPE), name=index))

    def add(n: Node, name: str | None = None) -> int:
        nodes.append(replace(n, type=infer_type(n, [nodes[a].type for a in n.args]), name=name))
        return len(nodes) - 1

    name = g.nodes[out_node].name
    if i is None:
        last = add(Node("gather", (out_node, row), (("axis", ax),)), name)
    else:
        last = add(Node("gather", (g.nodes[i].args[0], row), (("axis", ax),)))
        for c in [i, *reversed(chain)]:
            last = add(replace(g.nodes[c], args=(last, *g.nodes[c].args[1:])), name if c == out_node else None)
    outputs = [last if k == output else o for k, o in enumerate(g.outputs)]
    inputs = [*g.inputs, row]
    keep = sorted(set(inputs).union(*(Graph(g.name, nodes).ancestors(o) for o in outputs)))
    at = {old: new for new, old in enumerate(keep)}
    return Graph(g.name, [replace(nodes[k], args=tuple(at[a] for a in nodes[k].args)) for k in keep],
                 [at[k] for k in inputs], [at[o] for o in outputs], pos=g.pos)
