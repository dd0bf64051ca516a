"""Whether an ONNX model's named dim can be taken at run time by the loops (compile's live= on a dim
no KV cache holds, eqfuse.backend.runtime_dim), where the model's import bound it to a number.

An ONNX model's dims are numbers after its import (its shape arithmetic needs them), so the
backend finds the dim's axes by their extent, the capacity C. That is sound when no other extent
of the model is C and nothing in it follows the dim otherwise than as an axis of it, which the
model imported at C + 1 shows: `check_onnx_dim`.

One number may follow the dim and still be sound: C as the stride of a flat index over a batch
and the dim (b * C + position, split back by floordiv and mod by C: the import's gather along a
merged batch x sequence axis, eqfuse.frontend.onnx_symbolic_ops.gather). Every buffer keeps C
positions per sample, so C is the stride there at any length (`_strides`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from eqfuse.errors import EqfuseError, RuntimeDimRefused
from eqfuse.frontend.onnx_import import import_model
from eqfuse.ir.graph import Graph


def check_onnx_dim(src, g: Graph, params: Mapping[str, np.ndarray], dim: str, dims: Mapping[str, int],
                   following: Sequence[str] = (), times: Sequence[int] = (), whole_windows: bool = False) -> None:
    """An ONNX model imported at `dim` = C (g, params) can take the dim at run time when the model
    imported at C + 1 is the same graph with every extent C there C + 1, every other number the
    same (a reshape's target, a slice's end: C there too), and each bound array over the dim the
    same values on its first C positions (a range of positions, a causal mask): then an extent C
    is the dim and nothing else (eqfuse.backend.runtime_dim finds it so), and the model at a length
    n reads the first n positions of each. Else RuntimeDimRefused says what differs.

    `following` are dims that are the dim plus a fixed number (a decoder chunk step's total rows,
    past + new, its mask's length): imported one more with it, an extent of theirs changes so too;
    and an extent of either times one of `times` (the batch, bound: GPT-2 flattens batch x sequence)
    changes as that many of them. The kernels over such an extent do not see the dim (its extent
    is not the capacity): they compute every position, as at a fixed length. The following dims
    keep their compiled extents at run time, so a bound array over them alone is not compared.
    `whole_windows`: imported as a step over a cache in place is (onnx_import.import_model's)."""
    cap = int(dims[dim])

    def imported(at: dict):
        m = import_model(src, dims=at, whole_windows=whole_windows)
        return m.graph, m.params

    try:
        other = cap + 1
        g2, params2 = imported({**dims, dim: other, **{f: dims[f] + 1 for f in following}})
    except EqfuseError:  # (a model of at most C positions: compared with C - 1 instead)
        if cap < 2:
            raise
        other = cap - 1
        g2, params2 = imported({**dims, dim: other, **{f: dims[f] - 1 for f in following}})
    pairs = {(cap, other)} | {(int(dims[f]), int(dims[f]) + other - cap) for f in following}
    pairs |= {(k * x, k * y) for x, y in pairs for k in times}
    own = {(cap, other)} | {(k * cap, k * other) for k in times}  # (the dim's own extents)

    def refuse(why: str):
        raise RuntimeDimRefused(f"live='{dim}': {why}, so {dim} is not taken at run time")

    def same(a, b) -> bool:  # attributes equal, but for C here and C + 1 there
        if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)) and not isinstance(a, bool) \
                and (int(a), int(b)) in pairs:
            return True
        if isinstance(a, (float, np.floating)) and isinstance(b, (float, np.floating)) and (a, b) in pairs - own:
            return True  # (a following dim's length as a number: its compiled value at run time too)
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape and \
                np.array_equal(a, b, equal_nan=True)
        return a == b

    if len(g.nodes) != len(g2.nodes) or any(a.op != b.op for a, b in zip(g.nodes, g2.nodes)):
        refuse(f"{g.name}'s graph at {dim}={cap} and at {other} differ")
    strides = _strides(g, g2, cap, other)
    for i, (a, b) in enumerate(zip(g.nodes, g2.nodes)):
        s1, s2 = tuple(a.type.shape), tuple(b.type.shape)
        if len(s1) != len(s2) or any(x != y and (x, y) not in pairs for x, y in zip(s1, s2)):
            refuse(f"{a.op} has shape {list(s1)} at {dim}={cap} and {list(s2)} at {other}: an extent that "
                   f"follows {dim} otherwise than as {dim}")
        if any(x == y == cap for x, y in zip(s1, s2)):
            refuse(f"its capacity {cap} is also a fixed extent of {g.name} ({a.op} {list(s1)}); bind {dim} to "
                   f"another capacity (dims=), e.g. {cap + 1}")
        if not same(a.attrs, b.attrs) and i not in strides:
            refuse(f"{a.op}'s attributes at {dim}={cap} and at {other} differ otherwise than by {dim}")
    for name, v in params.items():
        w = params2.get(name)
        if w is None or v.ndim != w.ndim:
            refuse(f"bound array '{name}' is not in the model at {dim}={other}")
        axes = [k for k, (x, y) in enumerate(zip(v.shape, w.shape)) if x != y]
        if any((v.shape[k], w.shape[k]) not in pairs for k in axes):
            refuse(f"bound array '{name}' has shape {list(v.shape)} at {dim}={cap} and {list(w.shape)} at {other}")
        first = tuple(slice(0, min(v.shape[k], w.shape[k])) if k in axes else slice(None) for k in range(w.ndim))
        # (an array over the following dims alone is theirs at the compiled extents: they keep them
        # at run time, where only the dim's first positions vary)
        over = any((v.shape[k], w.shape[k]) in own for k in axes)
        if over and not np.array_equal(v[first], w[first], equal_nan=True):
            refuse(f"bound array '{name}' over {dim} is not the same on its first {min(cap, other)} positions at "
                   f"{other}")


def _strides(g: Graph, g2: Graph, cap: int, other: int) -> set[int]:
    """The scalar constants that are C at C and `other` at `other` used only as the stride of a flat
    index over the dim (module docstring): the divisor of a floordiv or mod, or a factor of a mul
    whose result reaches, through adds, only the dividend of such floordivs and mods."""
    def value(n):
        v = dict(n.attrs).get("value") if n.op == "const" else None
        return None if v is None or np.ndim(v) else float(v)

    cands = {i for i, (a, b) in enumerate(zip(g.nodes, g2.nodes)) if (value(a), value(b)) == (cap, other)}
    users: dict[int, list[int]] = {}
    for j, n in enumerate(g.nodes):
        for a in n.args:
            users.setdefault(a, []).append(j)

    def divided(j: int) -> bool:  # j reaches, through adds, only floordiv / mod by such a constant
        us = users.get(j, [])
        return bool(us) and all(
            (g.nodes[u].op in ("floordiv", "mod") and g.nodes[u].args[0] == j and g.nodes[u].args[1] in cands)
            or (g.nodes[u].op == "add" and divided(u)) for u in us)

    def sound(i: int) -> bool:
        return all((g.nodes[u].op in ("floordiv", "mod") and g.nodes[u].args[1] == i and g.nodes[u].args[0] != i)
                   or (g.nodes[u].op == "mul" and divided(u)) for u in users.get(i, []))

    return {i for i in cands if sound(i)}
