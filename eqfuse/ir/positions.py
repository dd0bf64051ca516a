"""The sample's own position along a batch dim, as exported attention masks use it.

transformers builds its attention masks by indexing the padding mask with the sample's position:
`mask[arange(batch)[:, None], arange(seq)]`. Exported to ONNX and imported with a named batch dim
(eqfuse.frontend.onnx_symbolic), that is `arange(batch)` (an exclusive cumsum of ones over the
batch), a flat index `b * seq + j`, its quotient and remainder, then `gather(mask, quotient,
axis=0)` and `gather_elements(..., remainder, axis=k)`. Each sample still reads only its own mask
row, but the structural check of eqfuse.ir.separable sees a cumsum across the batch and an axis-0
gather, and would compile such a model once per batch size.

This module finds those position values and checks their one allowed use:

- a *position source* is an exclusive cumsum over axis 0 of a rank-1 tensor holding the dim whose
  values are all ones (a constant 1, or `where(c, 1, 1)`, cast or not): its value is the sample's
  position d;
- a *position value* is a position source, or an op over position values and values that hold no
  batch and read no data (constants and parameters without the dim);
- a position value may be read only as the index of a gather or gather_elements whose data holds
  the dim as its leading axis; any other reader (arithmetic with data, an output, ...) makes the
  dim not a batch dim;
- each such index is computed in numpy for batch sizes 1-9, 16, 33 and 100 (from the bound
  parameters it reads): an axis-0 gather's index must be the sample's own position (row d reads
  row d), any other gather's index must not depend on the position or the batch size. A chunk of
  the batch then computes exactly what the whole batch computes for those samples.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from eqfuse.ir.graph import Graph
from eqfuse.ir.ops import OPS
from eqfuse.ir.shapes import NUMPY_DTYPE

CHECK_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33, 100)
_GATHERS = ("gather", "gather_elements")


def _ones(g: Graph, i: int) -> bool:
    n = g.nodes[i]
    if n.op == "const":
        return n.value == 1
    if n.op == "cast":
        return _ones(g, n.args[0])
    if n.op == "where":
        return _ones(g, n.args[1]) and _ones(g, n.args[2])
    return False


def _reads(g: Graph, i: int) -> tuple[int, ...]:
    """What node i's value depends on: `where(c, a, a)` (exports write such, with c read from
    the data) is a, whatever c is."""
    n = g.nodes[i]
    if n.op == "where":
        a, b = (g.nodes[k] for k in n.args[1:])
        if n.args[1] == n.args[2] or (a.op == b.op == "const" and a.value == b.value and a.type == b.type):
            return (n.args[1],)
    return n.args


def sources(g: Graph, d: str) -> set[int]:
    """The position sources of dim d (see the module's docstring)."""
    out = set()
    for i, n in enumerate(g.nodes):
        a = n.attr
        if (n.op == "cumsum" and a.get("exclusive") and not a.get("reverse") and int(a.get("axis", 0)) in (0, -1)
                and g.nodes[n.args[0]].type.shape == (d,) and _ones(g, n.args[0])):
            out.add(i)
    return out


def _static(g: Graph, d: str) -> set[int]:
    """Nodes whose value depends neither on the data nor on the position: constants, inputs
    without d and ops on them (`_reads`: where(c, a, a) reads only a, so it may hold d by
    broadcasting a along it)."""
    out = set()
    for i, n in enumerate(g.nodes):
        if n.body is not None:
            continue
        if n.op == "const" or (n.op == "input" and d not in n.type.shape) or (
                n.args and all(a in out for a in _reads(g, i))):
            out.add(i)
    return out


def values(g: Graph, d: str) -> tuple[set[int], set[int]]:
    """(position values, position sources) of dim d in g's top level."""
    src = sources(g, d)
    if not src:
        return set(), src
    static = _static(g, d)
    pos = set(src)
    for i, n in enumerate(g.nodes):
        if i in pos or n.op in ("input", "const") or n.body is not None:
            continue
        reads = _reads(g, i)
        if any(a in pos for a in reads) and all(a in pos or a in static for a in reads):
            pos.add(i)
    return pos, src


def _upstream(g: Graph, i: int, stop: set[int]) -> set[int]:
    """Node i and what it reads, not looking behind the nodes in `stop`."""
    seen, todo = set(), [i]
    while todo:
        j = todo.pop()
        if j not in seen:
            seen.add(j)
            if j not in stop:
                todo.extend(_reads(g, j))
    return seen


def uses(g: Graph, d: str, pos: set[int]) -> tuple[list[tuple[int, bool]], str | None]:
    """([(gather node, whether it gathers along axis 0)], None), or ([], why the position is
    read otherwise)."""
    found = []
    for i, n in enumerate(g.nodes):
        if i in pos:
            continue
        for k, a in enumerate(n.args):
            if a not in pos:
                continue
            data = g.nodes[n.args[0]].type
            if n.op not in _GATHERS or k != 1 or n.args[0] in pos or not data.shape or data.shape[0] != d:
                return [], f"{n.op} reads the sample's position (an arange over it) other than as a gather's index"
            found.append((i, int(n.attr.get("axis", 0)) % data.rank == 0))
    if any(o in pos for o in g.outputs):
        return [], "an output is the sample's position (an arange over it)"
    return found, None


def check(g: Graph, d: str, params: Mapping[str, np.ndarray] | None) -> tuple[set[int], str | None]:
    """(the position values and the gathers they index, None) when every position value is read
    as checked above, else (empty, why not)."""
    pos, src = values(g, d)
    if not src:
        return set(), None
    found, why = uses(g, d, pos)
    if why:
        return set(), why
    names = {i: g.nodes[i].name for i in g.inputs}
    need = {a for gi, _ in found for a in _upstream(g, g.nodes[gi].args[1], src) if a in names}
    missing = [names[a] for a in need if names[a] not in (params or {})]
    if missing:
        return set(), (f"reads the sample's position (an arange over it) through {', '.join(sorted(missing))}, "
                       f"which params= does not bind")
    prev: dict[int, np.ndarray] = {}
    for n in CHECK_SIZES:
        vals = _evaluate(g, d, [g.nodes[gi].args[1] for gi, _ in found], src, {i: params[names[i]] for i in need}, n)
        for gi, axis0 in found:
            idx = vals[g.nodes[gi].args[1]]
            lead = np.arange(n).reshape((n,) + (1,) * (idx.ndim - 1))
            if idx.ndim == 0 or idx.shape[0] not in (1, n):
                return set(), f"{g.nodes[gi].op}'s position index has no row per sample"
            if axis0 and not np.array_equal(np.broadcast_to(idx, (n,) + idx.shape[1:]),
                                            np.broadcast_to(lead, (n,) + idx.shape[1:])):
                return set(), f"{g.nodes[gi].op} along it reads other samples' rows (batch {n})"
            if not axis0:
                row = idx[:1]
                if not (idx == row).all() or (gi in prev and not np.array_equal(prev[gi], row)):
                    return set(), f"{g.nodes[gi].op}'s index depends on the sample's position (batch {n})"
                prev[gi] = row
    return pos | {gi for gi, _ in found}, None


def _evaluate(g: Graph, d: str, idx: list[int], src: set[int], inputs: Mapping[int, np.ndarray], n: int) -> dict:
    """The gathers' position indices at batch n, in numpy (the static nodes they read included)."""
    need: set[int] = set()
    for i in idx:
        need |= _upstream(g, i, src)
    vals: dict[int, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for i in sorted(need):
            node = g.nodes[i]
            dt = NUMPY_DTYPE[node.type.dtype]
            if i in src:
                vals[i] = np.arange(n, dtype=dt)
            elif node.op == "input":
                vals[i] = np.asarray(inputs[i]) if i in inputs else None
            elif node.op == "const":
                vals[i] = np.asarray(node.value, dtype=dt)
            elif _reads(g, i) != node.args:  # where(c, a, a): a, broadcast to where's shape
                shape = tuple(n if x == d else x for x in node.type.shape)
                vals[i] = np.broadcast_to(np.asarray(vals[_reads(g, i)[0]], dtype=dt), shape)
            else:
                vals[i] = np.asarray(OPS[node.op].numpy([vals[a] for a in node.args], node.attr), dtype=dt)
    return vals


__all__ = ["check", "sources", "uses", "values"]
