"""Which named dimensions are batch dimensions: every sample along them is computed on its own.

A named dim D of a graph is *separable* when the graph's function works sample by sample along
it: every tensor holding D holds it as its leading axis (axis 0), and for every op, sample d of
its result reads only sample d of the operands that hold D (operands without D, such as weights,
are read whole by every sample). Then running the graph on any split of the batch into chunks
and stacking the results gives the graph's result, which is what lets a compiled graph take any
value of D without compiling again (eqfuse.runtime.buckets).

The check is structural and conservative, over the source graph (kernel bodies included):
- D appears in a tensor's shape at most once, and only at axis 0;
- an op that reads a tensor holding D returns one holding D (so nothing reduces over D);
- an op that acts along an axis of its first operand (softmax, a reduction, gather, cumsum,
  concat, slice, ...) does not act along axis 0 when that operand holds D;
- tril/triu act on the last two axes, attention's gradients mix their rows: D must be outside
  them.

One exception, the sample's own position used to index a mask (transformers' exported attention
masks), is checked by eqfuse.ir.positions. A reason is kept for every dim that is not separable
(`batch_dims(g)[1]`), for the report.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from eqfuse.ir import positions
from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.ops import OPS
from eqfuse.ir.shapes import TType

# ops whose `axis` attribute names axes of the first operand that the op reads across
_AXIS_KINDS = ("reduce", "row", "layout", "index")
# ops that mix the last `n` axes of their operand, whatever their attributes
_LAST_AXES = {"tril": 2, "triu": 2, "attention_dq": 2, "attention_dk": 2, "attention_dv": 2, "rmsnorm": 1,
              "max_pool2d": 2, "avg_pool2d": 2, "pool2d_grad": 2}


def batch_dims(g: Graph, params: Mapping[str, np.ndarray] | None = None) -> tuple[list[str], dict[str, str]]:
    """(the separable named dims of g in order, {other named dim: why it is not separable}).
    `params` (bound arrays by name) lets eqfuse.ir.positions check a mask indexed by the
    sample's own position."""
    ok, why = [], {}
    for d in g.dims():
        allowed, reason = positions.check(g, d, params)
        reason = reason or _why_not(g, d, allowed)
        if reason is None:
            ok.append(d)
        else:
            why[d] = reason
    return ok, why


def _holds(t: TType, d: str) -> bool:
    return d in t.shape


def _why_not(g: Graph, d: str, allowed: set[int] = frozenset()) -> str | None:
    """Why d is not separable; the top-level nodes in `allowed` are position values and the
    gathers they index, checked by eqfuse.ir.positions."""
    for graph, i, n in g.walk():
        if graph is g and i in allowed:
            continue
        what = f"'{n.name}'" if n.name else f"the result of {n.op}"
        if _holds(n.type, d) and (n.type.shape.index(d) != 0 or n.type.shape.count(d) > 1):
            return f"{what} ({n.type}) holds it other than as its leading axis"
        if n.op in ("input", "const"):
            continue
        args = [graph.nodes[a].type for a in n.args]
        if any(_holds(t, d) for t in args) and not _holds(n.type, d):
            return f"{n.op} reads it and returns {n.type} without it"
        bad = _mixes(n, args, d)
        if bad:
            return f"{n.op} {bad}"
    return None


def _mixes(n: Node, args: list[TType], d: str) -> str | None:
    """Why op n reads across samples of D (None when it does not)."""
    if not args or not _holds(args[0], d):
        return None
    rank = args[0].rank
    last = _LAST_AXES.get(n.op)
    if last is not None and rank <= last:
        return f"acts on the last {last} axes of {args[0]}, which include it"
    op = OPS.get(n.op)
    if op is None or op.kind not in _AXIS_KINDS:
        return None
    axis = n.attr.get("axis", -1 if op.kind == "row" else None)
    if op.kind == "reduce" and axis is None:
        return "reduces over every axis"
    if axis is None:
        return None
    axes = axis if isinstance(axis, (list, tuple)) else [axis]
    if any(int(a) % max(rank, 1) == 0 for a in axes):
        return f"acts along axis 0 of {args[0]}"
    return None


__all__ = ["batch_dims"]
