"""The numpy reference interpreter: the oracle every compiled result is checked against."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from eqfuse.errors import ArgumentError
from eqfuse.ir.graph import Graph
from eqfuse.ir.ops import OPS
from eqfuse.ir.shapes import NUMPY_DTYPE


def bind_arrays(graph: Graph, arrays: Sequence, fixed: Mapping[str, int] | None = None,
                bf16: frozenset[str] = frozenset()) -> dict[str, int]:
    """Check a call's arrays against the graph's parameters; return the named dims they bind.
    The parameters named in `bf16` (a decode step's bf16 KV caches) take uint16 (bf16 bits) too.

    Errors name the parameter, what was expected and what was given.
    """
    params = graph.params
    if len(arrays) != len(params):
        names = ", ".join(n for n, _ in params)
        raise ArgumentError(f"{graph.name}() takes {len(params)} arrays ({names}), got {len(arrays)}")
    dims: dict[str, int] = dict(fixed or {})
    for (name, t), a in zip(params, arrays):
        if not isinstance(a, np.ndarray):
            raise ArgumentError(f"{graph.name}(): parameter '{name}' expects a numpy array of {t}, "
                                f"got {type(a).__name__}")
        want_dt = NUMPY_DTYPE[t.dtype]
        if a.dtype != want_dt and not (name in bf16 and a.dtype == np.uint16):
            raise ArgumentError(f"{graph.name}(): parameter '{name}' expects dtype {want_dt} ({t}), got {a.dtype}")
        if a.ndim != t.rank:
            raise ArgumentError(f"{graph.name}(): parameter '{name}' expects {t} (rank {t.rank}), "
                                f"got shape {list(a.shape)}")
        for axis, (want, got) in enumerate(zip(t.shape, a.shape)):
            if isinstance(want, str):
                want = dims.setdefault(want, got)
            if want != got:
                raise ArgumentError(f"{graph.name}(): parameter '{name}' expects {t}, got shape {list(a.shape)} "
                                    f"(axis {axis} is {got}, expected {want})")
        if a.size == 0:  # as in the .g language, where a dimension must be positive
            raise ArgumentError(f"{graph.name}(): parameter '{name}' is empty (shape {list(a.shape)}); "
                                f"every dimension must be positive")
    return dims


def call_arrays(name: str, free: list[str], arrays, keywords, bound=()) -> dict:
    """{parameter: array} of a call: positional arrays in parameter order, then keywords; errors
    name what is unknown, given twice, bound by params= or missing."""
    if not keywords and len(arrays) != len(free):
        bound_note = f"; {', '.join(bound)} bound by params=" if bound else ""
        raise ArgumentError(f"{name}() takes {len(free)} array{'s' * (len(free) != 1)} "
                            f"({', '.join(free)}), got {len(arrays)}{bound_note}")
    if len(arrays) > len(free):
        raise ArgumentError(f"{name}() takes {len(free)} positional array{'s' * (len(free) != 1)} "
                            f"({', '.join(free)}), got {len(arrays)}")
    given = dict(zip(free, arrays))
    for k in keywords:
        if k in bound:
            raise ArgumentError(f"{name}(): parameter '{k}' is bound by params= and cannot be passed")
        if k not in free:
            from eqfuse.errors import did_you_mean

            hint = did_you_mean(k, free)
            raise ArgumentError(f"{name}() has no parameter '{k}' (parameters: {', '.join(free)})"
                                + (f"; {hint}" if hint else ""))
        if k in given:
            raise ArgumentError(f"{name}(): parameter '{k}' given twice, by position and by keyword")
    given.update(keywords)
    missing = [n for n in free if n not in given]
    if missing:
        raise ArgumentError(f"{name}() is missing the array{'s' * (len(missing) > 1)} for {', '.join(missing)}")
    return given


def evaluate(graph: Graph, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run the graph in numpy, op by op, each value in its node's dtype (float32 for floats)."""
    vals: list[np.ndarray | None] = [None] * len(graph.nodes)
    for i, a in zip(graph.inputs, arrays):
        vals[i] = a
    with np.errstate(all="ignore"):  # inf/nan follow numpy's semantics silently, as in C
        for i, n in enumerate(graph.nodes):
            if n.op == "input":
                continue
            if n.op == "const":
                vals[i] = np.float32(n.value)
            elif n.op == "kernel":
                vals[i] = evaluate(n.body, [vals[a] for a in n.args])[0]
            else:
                out = OPS[n.op].numpy([vals[a] for a in n.args], n.attr)
                vals[i] = np.asarray(out, dtype=NUMPY_DTYPE[n.type.dtype])
    return [np.asarray(vals[o], dtype=NUMPY_DTYPE[graph.nodes[o].type.dtype]) for o in graph.outputs]


class Reference:
    """eqfuse.reference(src): callables that run each graph in numpy (the unoptimized semantics)."""

    def __init__(self, graphs: list[Graph]):
        self.graphs = {g.name: g for g in graphs}
        self.default = graphs[0]

    def run(self, graph: Graph, *arrays, **keywords):
        if keywords:  # keyword calls, as on a compiled module: ref(x=x, w1=w1, ...)
            names = [n for n, _ in graph.params]
            given = call_arrays(graph.name, names, arrays, keywords)
            arrays = tuple(given[n] for n in names)
        arrays = tuple(np.asarray(a) if isinstance(a, np.generic) else a for a in arrays)  # np.float32(2.0)
        bind_arrays(graph, arrays)
        outs = evaluate(graph, arrays)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def __call__(self, *arrays, **keywords):
        return self.run(self.default, *arrays, **keywords)

    def __repr__(self) -> str:
        return f"<eqfuse reference: {'; '.join(g.signature() for g in self.graphs.values())}>"

    def __getattr__(self, name: str):
        graphs = self.__dict__.get("graphs", {})
        if name in graphs:
            return lambda *arrays, **keywords: self.run(graphs[name], *arrays, **keywords)
        raise AttributeError(name)
