"""Cost models and the exact kernel-level cost evaluator.

memory   = bytes read and written by all kernels: a kernel reads each of its (distinct) input
           tensors once and writes its result once, so a tensor read by two kernels counts twice.
launches = the number of kernels.
time     = per kernel max(flops / FLOP/s, bytes / bandwidth) + a per-kernel overhead, from this
           machine's measured numbers (eqfuse.machine).

A kernel that is only a reshape is a free view: no bytes, no flops, no overhead (still a node).
Named dimensions the caller does not bind are costed as DEFAULT_DIM; the graph stays symbolic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.ops import OPS

DEFAULT_DIM = 64
BYTES = 4  # f32
MODELS = ("memory", "launches", "time")
# attention_dq/dk/dv run well below a GEMM's rate (the row passes between the products -- softmax,
# masks, the transposed copies): the time model counts their FLOPs 2.5 times, the ratio measured by
# `python benchmarks/bench_train.py`'s encoder (figures in benchmarks/RESULTS.md)
ATTENTION_GRAD_SLOWDOWN = 2.5


@dataclass(frozen=True)
class KCost:
    launches: int = 0
    bytes: int = 0
    flops: float = 0.0
    views: int = 0  # kernels that are free views (reshape)

    def __add__(self, o: "KCost") -> "KCost":
        return KCost(self.launches + o.launches, self.bytes + o.bytes, self.flops + o.flops, self.views + o.views)


ZERO = KCost()


def perf() -> dict:
    """{"flops": FLOP/s, "bandwidth": bytes/s, "overhead": s per kernel}, measured once and cached."""
    from eqfuse.machine import perf as measured

    return measured()


def _dim(d, dims: Mapping[str, int] | None) -> int:
    if isinstance(d, int):
        return d
    return (dims or {}).get(d, DEFAULT_DIM)


def numel(t, dims: Mapping[str, int] | None) -> int:
    return math.prod(_dim(d, dims) for d in t.shape)


def op_flops(body: Graph, i: int, dims) -> float:
    n = body.nodes[i]
    if n.op in ("input", "const", "kernel"):
        return 0.0
    out = numel(n.type, dims)
    if n.op in ("matmul", "matmul_integer"):
        return 2.0 * out * _dim(body.nodes[n.args[0]].type.shape[-1], dims)
    if n.op in ("conv2d", "conv_integer"):
        w = body.nodes[n.args[1]].type.shape
        return 2.0 * out * math.prod(_dim(d, dims) for d in w[1:])
    op = OPS[n.op]
    if op.kind == "layout":
        return 0.0
    if op.kind == "attention_grad":  # counted ATTENTION_GRAD_SLOWDOWN times (see there)
        from eqfuse.ir.ops_attention import attention_grad_flops

        q, k, dy = (body.nodes[n.args[j]].type.shape for j in (0, 1, 2 if n.op == "attention_dv" else 3))
        rows = math.prod(_dim(d, dims) for d in q[:-1])
        return ATTENTION_GRAD_SLOWDOWN * attention_grad_flops(n.op, rows, _dim(k[-2], dims), _dim(q[-1], dims),
                                                              _dim(dy[-1], dims))
    if op.kind in ("row", "reduce"):
        return float(op.flops * numel(body.nodes[n.args[0]].type, dims))
    return float(op.flops * out)


def _is_view(body: Graph) -> bool:
    ops = [n for n in body.nodes if n.op not in ("input", "const")]
    return len(ops) == 1 and ops[0].op == "reshape"


def kernel_cost(body: Graph, dims: Mapping[str, int] | None = None) -> KCost:
    """Exact cost of one kernel: reads every body input once, writes its result once. A scalar
    input (a quantized op's zero point) is read once into a register and counts nothing: counted
    as 4 bytes it made a conv that requantizes its output (reading the zero point) dearer than
    one storing f32 for the next conv to quantize, when both move as many elements."""
    if _is_view(body):
        return KCost(1, 0, 0.0, 1)
    reads = sum(numel(body.nodes[i].type, dims) for i in body.inputs if body.nodes[i].type.shape)
    out = numel(body.nodes[body.outputs[0]].type, dims)
    flops = sum(op_flops(body, j, dims) for j in range(len(body.nodes)))
    return KCost(1, BYTES * (reads + out), flops)


def stored_bytes(body: Graph, dims: Mapping[str, int] | None = None) -> int:
    """The bytes a kernel reads and writes with u8 and i8 tensors at one byte each (kernel_cost
    counts every element as BYTES): the extraction's tie-break between selections of one cost, so
    that of two equal ones it keeps the one passing quantized tensors between kernels (a conv's
    requantized u8 output, not its f32 output quantized by the conv reading it)."""
    if _is_view(body):
        return 0
    ts = [t for i in (*body.inputs, body.outputs[0]) if (t := body.nodes[i].type).shape or i in body.outputs]
    return sum(numel(t, dims) * (1 if t.dtype in ("u8", "i8") else BYTES) for t in ts)


def value(kc: KCost, model: str, p: dict | None = None) -> float:
    """One number for a kernel (or a sum of kernels) under a cost model."""
    if model == "memory":
        return float(kc.bytes)
    if model == "launches":
        return float(kc.launches - kc.views)
    p = p or perf()
    if kc.launches - kc.views <= 0:
        return 0.0
    return max(kc.flops / p["flops"], kc.bytes / p["bandwidth"]) + p["overhead"] * (kc.launches - kc.views)


def node_body(g: Graph, i: int) -> Graph:
    """The body of top-level node i as a kernel: its own body, or a one-op kernel over its args."""
    n = g.nodes[i]
    if n.op == "kernel":
        return n.body
    body = Graph("kernel")
    m: dict[int, int] = {}
    for a in dict.fromkeys(n.args):
        an = g.nodes[a]
        if an.op == "const":
            m[a] = body.add(Node("const", attrs=an.attrs, type=an.type))
        else:
            m[a] = body.add(Node("input", type=an.type, name=an.name))
            body.inputs.append(m[a])
    body.outputs = [body.add(Node(n.op, tuple(m[a] for a in n.args), n.attrs, n.type))]
    return body


def _kernels(g: Graph):
    for i, n in enumerate(g.nodes):
        if n.op not in ("input", "const"):
            yield i


def graph_kernels(g: Graph, dims: Mapping[str, int] | None = None) -> KCost:
    """Sum of exact kernel costs; an op at the top level counts as a kernel of its own."""
    total = ZERO
    for i in _kernels(g):
        total = total + kernel_cost(node_body(g, i), dims)
    return total


def graph_value(g: Graph, model: str, dims: Mapping[str, int] | None = None, p: dict | None = None) -> float:
    """The cost-model value of a whole graph, summed kernel by kernel (time: roofline per kernel)."""
    if model != "time":
        return value(graph_kernels(g, dims), model)
    p = p or perf()
    return sum(value(kernel_cost(node_body(g, i), dims), "time", p) for i in _kernels(g))


def saved_for_backward(g: Graph, dims: Mapping[str, int] | None = None) -> int | None:
    """Bytes of the activations a training graph keeps for its backward pass: the tensors
    computed for the loss (its first output, an f32 scalar) that the rest of the graph (the
    gradients) reads. A tensor read through a free view (a reshape) counts as its source. None
    for a graph whose first output is not a scalar loss.

    Fusion decides this: a gradient kernel that recomputes an activation (the attention
    probabilities in attention_dq/dk/dv, a pointwise prologue) does not need it stored, so
    comparing the unfused joint graph with the optimized one gives the bytes the cost model
    chose to recompute instead of storing."""
    if not g.outputs or g.nodes[g.outputs[0]].type.dtype != "f32" or any(d != 1 for d in g.nodes[g.outputs[0]].type.shape):
        return None
    forward = {i for i in g.ancestors(g.outputs[0]) if g.nodes[i].op not in ("input", "const")}

    def source(i: int) -> int:
        while i in forward and g.nodes[i].op == "kernel" and _is_view(g.nodes[i].body) and g.nodes[i].args:
            i = g.nodes[i].args[0]
        return i
    stored = {source(a) for i, n in enumerate(g.nodes) if i not in forward and n.op not in ("input", "const")
              for a in n.args}
    return BYTES * sum(numel(g.nodes[i].type, dims) for i in stored & forward)


def unfused(graph: Graph) -> Graph:
    """The same computation with every kernel block inlined: one op per node."""
    g = Graph(graph.name, pos=graph.pos)
    ids: dict[int, int] = {}

    def copy(src: Graph, i: int, mapping: dict[int, int], outer_name) -> int:
        n = src.nodes[i]
        if n.op == "kernel":
            inner: dict[int, int] = {inp: mapping[a] for inp, a in zip(n.body.inputs, n.args)}
            for j, bn in enumerate(n.body.nodes):
                if bn.op != "input":
                    inner[j] = copy(n.body, j, inner, None)
            out = inner[n.body.outputs[0]]
            if n.name is not None and g.nodes[out].name is None and g.nodes[out].op not in ("input", "const"):
                from dataclasses import replace

                g.nodes[out] = replace(g.nodes[out], name=n.name)
            return out
        from dataclasses import replace

        return g.add(replace(n, args=tuple(mapping[a] for a in n.args), body=None,
                             name=outer_name if outer_name is not None else (n.name if src is graph else None)))

    for i, n in enumerate(graph.nodes):
        if n.op == "input":
            ids[i] = g.add(n)
            g.inputs.append(ids[i])
        else:
            ids[i] = copy(graph, i, ids, n.name)
    g.outputs = [ids[o] for o in graph.outputs]
    return g
