"""Reshapes around a matmul, as exporters write them, taken out of the GEMM's way.

A linear layer over a [B, S, K] activation is exported as
`reshape(reshape(x, [B*S, K]) @ w + b, [B, S, N])`: flatten, GEMM, bias, unflatten. The
reshape between the GEMM and the ops after it (bias, activation, residual) keeps them out of the
GEMM's epilogue, and each reshape is a kernel boundary of its own. Here, before the fusion
e-graph, such a pair becomes the batched matmul it spells, `reshape(x, [B, S, K]) @ w + b`:

- `reshape(pw(a, c...), t)` -> `pw(reshape(a, t), c...)` when the reshape keeps the last axis
  and every other operand c of the pointwise op is a scalar or a vector along that axis (so it
  broadcasts the same way in both shapes);
- `reshape(reshape(x, [P, K]) @ w, t)` -> `reshape(x, t[:-1] + [K]) @ w` when w is a matrix
  [K, N], t = [..., N] and the product of t[:-1] is P (the GEMM's rows stay the same rows).

Both hold for every value of x (row-major order is what a reshape keeps); tests/test_layout.py
checks them against the numpy reference. Shapes must be numbers (an export's are).
"""

from __future__ import annotations

import math
from dataclasses import replace

from eqfuse.ir.graph import Graph, Node, infer_type
from eqfuse.ir.ops import OPS


def _concrete(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def sink_reshapes(g: Graph) -> Graph:
    """g with the reshapes around its flattened matmuls removed (see the module docstring)."""
    out = Graph(g.name, pos=g.pos)
    m: dict[int, int] = {}
    users = g.users()
    single: set[int] = set()  # nodes of `out` that are copies of a node of g read once

    def add(op: str, args, attrs, pos=None, name=None) -> int:
        n = Node(op, tuple(args), tuple(attrs), pos=pos, name=name)
        return out.add(replace(n, type=infer_type(n, [out.nodes[a].type for a in args])))

    def reshape(a: int, shape, pos) -> int:
        if tuple(out.nodes[a].type.shape) == tuple(shape):
            return a
        src = out.nodes[a]
        if src.op == "reshape":  # reshape(reshape(x)) is one reshape
            a = src.args[0]
            if tuple(out.nodes[a].type.shape) == tuple(shape):
                return a
        return add("reshape", [a], [("shape", tuple(shape))], pos)

    def sink(a: int, t, pos) -> int | None:
        """A node of `out` equal to reshape(a, t) with no reshape right after a GEMM, or None."""
        n = out.nodes[a]
        shape = n.type.shape
        if a not in single:  # another reader needs it as it is
            return None
        if n.op == "matmul":
            f, w = (out.nodes[x] for x in n.args)
            if (f.op == "reshape" and f.type.rank == 2 and w.type.rank == 2 and len(t) >= 2
                    and t[-1] == w.type.shape[1] and math.prod(t[:-1]) == f.type.shape[0]):
                x = reshape(f.args[0], tuple(t[:-1]) + (f.type.shape[1],), pos)
                return add("matmul", [x, n.args[1]], n.attrs, n.pos)
            return None
        if n.op not in OPS or OPS[n.op].kind != "pointwise" or not shape or t[-1] != shape[-1]:
            return None
        main = [x for x in n.args if tuple(out.nodes[x].type.shape) == tuple(shape)]
        rest = [x for x in n.args if x not in main]
        if len(main) != 1 or any(out.nodes[x].type.rank > 1 for x in rest):
            return None
        inner = sink(main[0], t, pos)
        if inner is None:
            return None
        return add(n.op, [inner if x == main[0] else x for x in n.args], n.attrs, n.pos)

    for i, n in enumerate(g.nodes):
        args = [m[a] for a in n.args]
        if n.op == "reshape" and _concrete(n.type.shape) and _concrete(out.nodes[args[0]].type.shape):
            new = sink(args[0], tuple(n.type.shape), n.pos)
            if new is not None:
                m[i] = new
                continue
        m[i] = out.add(replace(n, args=tuple(args)))
        if users[i] == 1:
            single.add(m[i])
    out.inputs = [m[i] for i in g.inputs]
    out.outputs = [m[o] for o in g.outputs]
    return _prune(out)


def _prune(g: Graph) -> Graph:
    """g without the nodes no output needs (inputs stay: they are the signature)."""
    live = set(g.inputs)
    for o in g.outputs:
        live |= g.ancestors(o) | {o}
    keep = sorted(live)
    if len(keep) == len(g.nodes):
        return g
    new = {old: k for k, old in enumerate(keep)}
    out = Graph(g.name, pos=g.pos)
    for old in keep:
        n = g.nodes[old]
        out.add(replace(n, args=tuple(new[a] for a in n.args)))
    out.inputs = [new[i] for i in g.inputs]
    out.outputs = [new[o] for o in g.outputs]
    return out
