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

An attention over merged batch and heads (BLOOM's eager attention: batched matmuls over
[B * H, S, T], split into [B, H, S, T] for the mask and the softmax) has the same reshape between
its scores and its softmax, which keeps the attention from being one kernel. A reshape that only
splits a leading dim P = B * H, [P, S, T] -> [B, H, S, T], moves the same way onto a batched
matmul's operands (`a @ b` -> `reshape(a, [B, H, ...]) @ reshape(b, [B, H, ...])`, a transpose of
b's last two axes kept outermost) and onto a pointwise op's operands of rank 3 whose leading dim
is P or 1 (ALiBi's bias [B * H, 1, T]; an operand of rank 2 or less broadcasts the same way in
both shapes); the merge before the product with v then meets its split and both go.

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
        while out.nodes[a].op == "reshape":  # reshape(reshape(x)) is one reshape
            a = out.nodes[a].args[0]
            if tuple(out.nodes[a].type.shape) == tuple(shape):
                return a
        return add("reshape", [a], [("shape", tuple(shape))], pos)

    def sink(a: int, t, pos) -> int | None:
        """A node of `out` equal to reshape(a, t) with no reshape right after a GEMM, or None."""
        n = out.nodes[a]
        shape = n.type.shape
        if a not in single:  # another reader needs it as it is
            return None
        split = _splits_batch(shape, t)
        if n.op == "matmul":
            f, w = (out.nodes[x] for x in n.args)
            if (f.op == "reshape" and f.type.rank == 2 and w.type.rank == 2 and len(t) >= 2
                    and t[-1] == w.type.shape[1] and math.prod(t[:-1]) == f.type.shape[0]):
                x = reshape(f.args[0], tuple(t[:-1]) + (f.type.shape[1],), pos)
                return add("matmul", [x, n.args[1]], n.attrs, n.pos)
            if split and f.type.rank == 3 and w.type.rank == 3 and f.type.shape[0] == w.type.shape[0]:
                return add("matmul", [heads(n.args[0], t[:2], pos), heads(n.args[1], t[:2], pos)], n.attrs, n.pos)
            return None
        if n.op not in OPS or OPS[n.op].kind != "pointwise" or not shape or t[-1] != shape[-1]:
            return None

        def as_is(x: int) -> bool:  # an operand that broadcasts the same way in both shapes
            return out.nodes[x].type.rank <= (2 if split else 1)

        for main in dict.fromkeys(x for x in n.args if tuple(out.nodes[x].type.shape) == tuple(shape)):
            if not all(as_is(x) or (split and _splits(out.nodes[x].type.shape, shape)) for x in n.args if x != main):
                continue
            inner = sink(main, t, pos)
            if inner is not None:
                return add(n.op, [inner if x == main else x if as_is(x) else heads(x, t[:2], pos) for x in n.args],
                           n.attrs, n.pos)
        return None

    def heads(a: int, bh, pos) -> int:
        """reshape(a, [B, H, ...]): a's leading dim (B * H, or 1) split as `bh`, a transpose of
        its last two axes kept outermost (so that the reshapes of a merge meet and cancel)."""
        n = out.nodes[a]
        lead = tuple(bh) if n.type.shape[0] != 1 else (1, 1)
        if n.op == "softmax" and n.attr.get("axis", -1) in (-1, 2) and a in single and n.type.rank == 3:
            attrs = [(k, -1 if k == "axis" else v) for k, v in n.attrs]
            return add("softmax", [heads(n.args[0], bh, pos)], attrs, n.pos)
        if n.op == "transpose" and tuple(n.attr["perm"]) == (0, 2, 1):
            inner = reshape(n.args[0], lead + tuple(out.nodes[n.args[0]].type.shape[1:]), pos)
            return add("transpose", [inner], [("perm", (0, 1, 3, 2))], pos)
        return reshape(a, lead + tuple(n.type.shape[1:]), pos)

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


def _splits_batch(shape, t) -> bool:
    """Whether reshaping `shape` [P, S, T] to `t` splits its leading dim only: [B, H, S, T], B * H = P."""
    return len(shape) == 3 and len(t) == 4 and tuple(t[2:]) == tuple(shape[1:]) and t[0] * t[1] == shape[0]


def _splits(operand, shape) -> bool:
    """Whether a pointwise op's operand of rank 3 broadcasts against `shape` [P, S, T] with a
    leading dim of P or 1 (so it splits as the result does)."""
    return len(operand) == 3 and operand[0] in (shape[0], 1) and all(
        d in (1, e) for d, e in zip(operand[1:], shape[1:]))


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
