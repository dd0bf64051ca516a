"""Index arithmetic: numpy broadcasting and layout views as element strides, and the C offset
expressions that walk them. Both `lower` (to see the loops a kernel will have) and `emit` (to
write them) use it.
"""

from __future__ import annotations

import math

from eqfuse.ir.graph import Graph
from eqfuse.ir.ops import OPS, OpKind


def contiguous(shape) -> tuple[int, ...]:
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= d
    return tuple(reversed(st))


def bstrides(view, space, strides=None) -> tuple[int, ...]:
    """Element strides of a tensor of shape `view` (contiguous unless `strides` are given) read
    at each index of `space` (right-aligned, numpy broadcasting: stride 0 along broadcast dims)."""
    strides = contiguous(view) if strides is None else tuple(strides)
    pad = len(space) - len(view)
    return (0,) * pad + tuple(0 if v == 1 else s for v, s in zip(view, strides))


def view_strides(body: Graph, i: int, base: dict | None = None) -> tuple[int, tuple[int, ...] | None]:
    """(the input, the element strides of node i's shape in that input's buffer) for a node that
    reads an input in place through reshapes and transposes (kinds.base.view_source). An input is
    read with the strides `base` gives it (contiguous if none); the strides are None when a
    reshape cannot be a view of them (eqfuse.backend.views decides before emit asks)."""
    n = body.nodes[i]
    if n.op == "input":
        return i, tuple((base or {}).get(i) or contiguous(n.type.shape))
    src, st = view_strides(body, n.args[0], base)
    if st is None:
        return src, None
    if n.op == "transpose":
        perm = n.attr["perm"] or tuple(reversed(range(n.type.rank)))
        return src, tuple(st[p] for p in perm)
    return src, reshape_strides(body.nodes[n.args[0]].type.shape, st, n.type.shape)


def reshape_strides(shape, strides, new) -> tuple[int, ...] | None:
    """The strides of a reshape of a strided view to `new` without a copy, or None when the
    reshape merges dims that are not adjacent in memory (numpy's no-copy reshape rule)."""
    old = [(n, s) for n, s in zip(shape, strides) if n != 1]
    dims = [d for d in new if d != 1]
    out: list[int] = [0] * len(dims)
    oi = ni = 0
    while ni < len(dims) and oi < len(old):
        oj, nj = oi + 1, ni + 1
        op, np_ = old[oi][0], dims[ni]
        while op != np_:
            if np_ < op:
                np_ *= dims[nj]
                nj += 1
            else:
                op *= old[oj][0]
                oj += 1
        for k in range(oi, oj - 1):
            if old[k][1] != old[k + 1][0] * old[k + 1][1]:
                return None
        out[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            out[k - 1] = out[k] * dims[k]
        oi, ni = oj, nj
    it = iter(out)
    return tuple(next(it) if d != 1 else 0 for d in new)


def result_strides(body: Graph, result: int) -> tuple[int, ...]:
    """The element strides in the (contiguous) output buffer at which node `result` is written
    when the body's output is `result` under reshapes, then transposes (the head merge)."""
    i = body.outputs[0]
    st = contiguous(body.nodes[i].type.shape)
    while i != result:
        n = body.nodes[i]
        a = n.args[0]
        if n.op == "transpose":  # out dim k is dim perm[k] of the operand
            perm = n.attr["perm"] or tuple(reversed(range(n.type.rank)))
            inv = [0] * len(perm)
            for k, p in enumerate(perm):
                inv[p] = st[k]
            st = tuple(inv)
        else:  # a reshape above every transpose: the operand is still contiguous
            st = contiguous(body.nodes[a].type.shape)
        i = a
    return st


def coalesce(sizes, strides) -> tuple[list[int], list[int]]:
    """Merge adjacent dims that one linear index walks with one stride; drop size-1 dims."""
    out_n: list[int] = []
    out_s: list[int] = []
    for n, s in zip(sizes, strides):
        if n == 1:
            continue
        if out_n and out_s[-1] == s * n:
            out_n[-1] *= n
            out_s[-1] = s
        else:
            out_n.append(n)
            out_s.append(s)
    return out_n, out_s


def offset(var: str, sizes, strides) -> str:
    """C expression: the element offset of linear index `var` over dims `sizes` with `strides`."""
    n, s = coalesce(sizes, strides)
    terms = []
    for d in range(len(n)):
        if s[d] == 0:
            continue
        after = math.prod(n[d + 1:])
        idx = var if after == 1 else f"{var} / {after}"
        if d > 0:
            idx = f"({idx}) % {n[d]}" if after != 1 else f"{var} % {n[d]}"
        terms.append(idx if s[d] == 1 else f"({idx}) * {s[d]}")
    return " + ".join(terms) or "0"


def joint_groups(shape, stride_sets) -> list[list[int]]:
    """Groups of adjacent non-1 dims that every stride vector walks as one linear index."""
    groups: list[list[int]] = []
    for d, n in enumerate(shape):
        if n == 1:
            continue
        if groups and all(s[groups[-1][-1]] == s[d] * n for s in stride_sets):
            groups[-1].append(d)
        else:
            groups.append([d])
    return groups


def leaf_views(body: Graph, root: int, stop: set[int] = frozenset()) -> list[tuple]:
    """Shapes (as read in the output space) of every input leaf below root."""
    return [v for _, v in leaf_reads(body, root, stop)]


def leaf_strides(body: Graph, root: int, space, base: dict | None = None) -> list[tuple[int, ...]]:
    """The element strides over `space` of every input leaf read below root: contiguous, or the
    strides `base` gives an input read through a view (eqfuse.backend.views)."""
    base = base or {}
    return [bstrides(v, space, base.get(i) if v == tuple(body.nodes[i].type.shape) else None)
            for i, v in leaf_reads(body, root)]


def leaf_reads(body: Graph, root: int, stop: set[int] = frozenset()) -> list[tuple[int, tuple]]:
    """(input, shape as read in the output space) of every input leaf below root."""
    seen, out = set(), []

    def walk(i, chan):
        if (i, chan) in seen or i in stop:
            return
        seen.add((i, chan))
        n = body.nodes[i]
        if n.op == "input":
            v = tuple(n.type.shape)
            out.append((i, v + (1,) * (chan - 2) if chan is not None and len(v) == 1 else v))
            return
        if n.op in OPS and OPS[n.op].kind == OpKind.CHANNEL:
            walk(n.args[0], chan)
            for a in n.args[1:]:
                walk(a, body.nodes[n.args[0]].type.rank)
            return
        for a in n.args:
            walk(a, chan)

    walk(root, None)
    return out
