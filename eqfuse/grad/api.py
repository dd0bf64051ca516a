"""`eqfuse.compile(src, grad=[...])`: the joint graph of a model's first graph, compiled.

The backward graph needs concrete shapes (a gradient's reshapes, pads and broadcasts are
written with sizes), so a graph with unbound named dimensions is differentiated and compiled
at the first call of each binding, as a plain graph: `eqfuse.compile` of its joint text.
"""

from __future__ import annotations

import threading
from typing import Callable, Mapping, Sequence

import numpy as np

from eqfuse.grad.vjp import check_loss, check_wrt, grad_graph
from eqfuse.ir.graph import Graph, bind_dims
from eqfuse.ir.printer import module_text
from eqfuse.ir.reference import bind_arrays, call_arrays


def differentiate(g: Graph, wrt: Sequence[str], dims: Mapping[str, int], flag: str = "grad=") -> Graph | None:
    """The joint graph of g at `dims`, or None when they leave a named dimension unbound (the
    names in wrt and the loss are checked either way)."""
    check_wrt(g, wrt, flag)
    check_loss(g)
    if any(d not in dims for d in g.dims()):
        return None
    return grad_graph(bind_dims(g, dims) if g.dims() else g, wrt, flag)


class LazyGradFunction:
    """`mod.<graph>` for grad= with unbound dims: one compiled joint graph per binding."""

    def __init__(self, source: Graph, wrt: Sequence[str], params: Mapping[str, np.ndarray],
                 dims: Mapping[str, int], compile_text: Callable):
        self.name, self.source, self.wrt = source.name, source, list(wrt)
        self.params, self.dims = dict(params), dict(dims)
        self.free = [n for n, _ in source.params if n not in self.params]
        self._compile = compile_text
        self.cache: dict[tuple, object] = {}
        self.last = None
        self._lock = threading.Lock()

    def __call__(self, *arrays, **keywords):
        given = call_arrays(self.name, self.free, arrays, keywords, bound=self.params)
        named = {**self.params, **given}
        dims = bind_arrays(self.source, [named[n] for n, _ in self.source.params], self.dims)
        key = tuple(sorted(dims.items()))
        with self._lock:
            mod = self.cache.get(key)
            if mod is None:
                joint = grad_graph(bind_dims(self.source, dims), self.wrt)
                mod = self.cache[key] = self._compile(module_text([joint]), params=self.params or None)
            self.last = mod.default.last
        return mod(**given)

    def __repr__(self) -> str:
        return f"<eqfuse function {self.name}({', '.join(self.free)}) with gradients of {', '.join(self.wrt)}>"
