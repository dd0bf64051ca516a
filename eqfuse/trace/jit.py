"""`@eqfuse.jit`: a Python function over `eqfuse.numpy`, traced, optimized, compiled and cached.

    trace (per signature of shapes and dtypes) -> graph IR -> .g text -> eqfuse.compile -> cache

The first call with a given signature (each array argument's shape and dtype, and the value of
every other argument) runs the function on traced arrays (eqfuse.trace.tracer), which records
the graph; the graph is printed as .g text (`f.graph`) and compiled by `eqfuse.compile`, numpy
arrays the function read being bound as params=. Later calls with that signature run the
compiled graph; the function's Python code does not run again.

Arguments may be numpy arrays, numbers and strings (static: part of the signature, so a new
value traces again), and lists, tuples and dicts of those (a dict of weights).
"""

from __future__ import annotations

import functools
import keyword
import re
import threading
from typing import Any, Callable

import numpy as np

from eqfuse.errors import EqfuseError
from eqfuse.ir.graph import Graph
from eqfuse.ir.printer import module_text
from eqfuse.ir.shapes import TType
from eqfuse.trace.tracer import Trace, Traced, array_dtype, tracing

_RESERVED = {"graph", "return", "kernel", "true", "false", "inf", "nan"}


def _param_name(path: str, taken: set[str]) -> str:
    name = re.sub(r"\W", "_", path).strip("_") or "x"
    if name[0].isdigit() or name in _RESERVED or keyword.iskeyword(name) or re.fullmatch(r"c\d+", name):
        name = "a_" + name
    base, k = name, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def _flatten(value, path: str, leaves: list, static: list) -> Any:
    """The structure of an argument with each array replaced by its leaf index; arrays appended
    to `leaves` as (path, array), everything else recorded in `static` (the cache key)."""
    if isinstance(value, np.ndarray) and value.ndim > 0:
        leaves.append((path, value))
        static.append(("array", value.shape, str(value.dtype)))
        return _Leaf(len(leaves) - 1)
    if isinstance(value, (list, tuple)):
        static.append((type(value).__name__, len(value)))
        out = [_flatten(v, f"{path}_{i}", leaves, static) for i, v in enumerate(value)]
        return tuple(out) if isinstance(value, tuple) else out
    if isinstance(value, dict):
        static.append(("dict", tuple(value)))
        return {k: _flatten(v, f"{path}_{k}", leaves, static) for k, v in value.items()}
    if isinstance(value, np.ndarray):  # 0-d: a number
        value = value.item()
    if isinstance(value, (bool, int, float, str, type(None), np.generic)):
        static.append(("value", type(value).__name__, value))
        return value
    raise EqfuseError(f"jit: argument {path} is a {type(value).__name__}; a jit function takes numpy arrays, "
                      "numbers, strings, and lists, tuples and dicts of them")


class _Leaf:
    __slots__ = ("k",)

    def __init__(self, k: int):
        self.k = k


def _fill(struct, values):
    if isinstance(struct, _Leaf):
        return values[struct.k]
    if isinstance(struct, (list, tuple)):
        out = [_fill(v, values) for v in struct]
        return tuple(out) if isinstance(struct, tuple) else out
    if isinstance(struct, dict):
        return {k: _fill(v, values) for k, v in struct.items()}
    return struct


class _Entry:
    """One traced and compiled signature."""

    def __init__(self, graph: Graph, text: str, module, out_struct, n_args: int):
        self.graph, self.text, self.module, self.out_struct, self.n_args = graph, text, module, out_struct, n_args


class JitFunction:
    """What `@eqfuse.jit` returns: call it with numpy arrays; `f.graph` is the latest traced graph
    as .g text, `f.explain()` its fusion report, `f.traces` how many signatures were traced."""

    def __init__(self, fn: Callable, options: dict):
        self.fn, self.options = fn, options
        self.cache: dict[tuple, _Entry] = {}
        self.traces = 0
        self.last: _Entry | None = None
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        leaves: list[tuple[str, np.ndarray]] = []
        static: list = []
        names = self._arg_names(args, kwargs)
        structs = [_flatten(v, n, leaves, static) for n, v in zip(names, list(args) + list(kwargs.values()))]
        key = (tuple(kwargs), tuple(map(_hashable, static)))
        with self._lock:
            entry = self.cache.get(key)
            if entry is None:
                entry = self.cache[key] = self._trace(args, kwargs, structs, leaves)
            self.last = entry
        arrays = [a for _, a in leaves]
        outs = entry.module(*arrays) if arrays else entry.module()
        outs = list(outs) if isinstance(outs, tuple) else [outs]
        return _fill(entry.out_struct, outs)

    def _arg_names(self, args, kwargs) -> list[str]:
        import inspect

        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as e:
            raise EqfuseError(f"{self.fn.__name__}(): {e}") from None
        names = []
        for pname, value in bound.arguments.items():
            kind = inspect.signature(self.fn).parameters[pname].kind
            if kind == inspect.Parameter.VAR_POSITIONAL:
                names += [f"{pname}_{i}" for i in range(len(value))]
            elif kind == inspect.Parameter.VAR_KEYWORD:
                names += list(value)
            else:
                names.append(pname)
        return names

    def _trace(self, args, kwargs, structs, leaves) -> _Entry:
        name = _param_name(self.fn.__name__, set())
        trace = Trace(name)
        taken: set[str] = set()
        inputs = [trace.input(_param_name(p, taken), TType(tuple(a.shape), array_dtype(a, f"argument {p}")))
                  for p, a in leaves]
        pos = structs[:len(args)]
        kw = dict(zip(kwargs, structs[len(args):]))
        with tracing(trace):
            result = self.fn(*_fill(pos, inputs), **_fill(kw, inputs))
        outs: list[Traced] = []
        out_struct = self._outputs(result, trace, outs)
        g = trace.graph
        g.outputs = [o.node for o in outs]
        # the function's arrays first, then those it read from elsewhere (bound as params=)
        n_args = len(leaves)
        g = _pruned(g)
        text = module_text([g])
        from eqfuse.pipeline import compile as eq_compile

        captured = {n: a for n, a in trace.captured}
        module = eq_compile(text, params=captured or None, **self.options)
        self.traces += 1
        return _Entry(g, text, module, out_struct, n_args)

    def _outputs(self, result, trace: Trace, outs: list) -> Any:
        if isinstance(result, Traced):
            if result.trace is not trace:
                raise EqfuseError(f"{self.fn.__name__} returned an array of another trace")
            outs.append(result)
            return _Leaf(len(outs) - 1)
        if isinstance(result, (list, tuple)):
            out = [self._outputs(r, trace, outs) for r in result]
            return tuple(out) if isinstance(result, tuple) else out
        if isinstance(result, dict):
            return {k: self._outputs(v, trace, outs) for k, v in result.items()}
        raise EqfuseError(f"{self.fn.__name__} must return traced arrays (computed from its array arguments "
                          f"with eqfuse.numpy), or lists, tuples or dicts of them; it returned a "
                          f"{type(result).__name__}")

    @property
    def graph(self) -> str:
        """The latest traced graph as .g text (None before the first call)."""
        return self.last.text if self.last else None

    def explain(self) -> str:
        """The fusion report of the latest traced graph, with why each tensor between two kernels is
        stored (the text of `eqfuse opt --explain`)."""
        if self.last is None:
            raise EqfuseError(f"{self.fn.__name__} has not been called yet: it is traced at its first call")
        from eqfuse.optimizer.explain import explain_text
        from eqfuse.optimizer.optimize import report_text

        r = self.last.module.report
        if not isinstance(r, dict) or "boundaries" not in r:
            return str(r)
        return report_text(r) + "\n" + explain_text(r)

    def __repr__(self) -> str:
        return f"<eqfuse.jit {self.fn.__name__}: {len(self.cache)} signature{'s' * (len(self.cache) != 1)} compiled>"


def _hashable(v):
    try:
        hash(v)
        return v
    except TypeError:
        return repr(v)


def _pruned(g: Graph) -> Graph:
    """Only the nodes the outputs read; every input kept (it is a parameter of the function)."""
    keep = set(g.inputs)
    for o in g.outputs:
        keep |= g.ancestors(o)
    order = sorted(keep)
    new = {old: k for k, old in enumerate(order)}
    from dataclasses import replace

    nodes = [replace(g.nodes[i], args=tuple(new[a] for a in g.nodes[i].args)) for i in order]
    return Graph(g.name, nodes, [new[i] for i in g.inputs], [new[o] for o in g.outputs])


def jit(fn: Callable | None = None, **options):
    """`@eqfuse.jit` or `@eqfuse.jit(threads=1, cost="time", verify=True)`: trace the function at
    its first call for each signature of shapes and dtypes, then compile it with eqfuse.compile
    (the options are compile's keywords) and run the compiled graph at every later call."""
    if fn is None:
        return lambda f: JitFunction(f, options)
    if not callable(fn):
        raise EqfuseError(f"eqfuse.jit expects a function, got {type(fn).__name__}")
    return JitFunction(fn, options)


__all__ = ["jit", "JitFunction"]
