"""The compiled Module: callables that take and return numpy arrays (SPEC 4).

A graph with named dimensions is compiled once per binding of them (at compile time when
`dims=`/`params=` fix them all, else at the first call that binds them), and cached.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from .errors import ArgumentError, CheckFailed
from .graph import Graph
from .lower import KernelPlan
from .reference import bind_arrays, evaluate
from .shapes import C_TYPE, NUMPY_DTYPE
from .verify import compare


_POOL_ONLY = 3  # references to a pooled buffer held by the pool itself, a local and getrefcount


@dataclass(frozen=True)
class Kernel:
    """One compiled kernel as a user sees it."""

    name: str
    kind: str
    body: str  # the kernel block's text, `kernel { ... }`
    c_source: str  # its C (empty for zero-copy views)
    bytes: int  # bytes read and written by one call
    flops: int
    tiles: Mapping[str, int] = field(default_factory=dict)
    graph: str = ""

    def __repr__(self) -> str:
        return f"<Kernel {self.name} {self.kind}: {self.bytes} bytes, {self.flops} flops>"


def env_threads() -> int | None:
    v = os.environ.get("EQFUSE_NUM_THREADS", "").strip()
    return int(v) if v.isdigit() and int(v) > 0 else None


class Compiled:
    """One graph at one binding of its dimensions: plans, the C library and the call sequence."""

    def __init__(self, graph: Graph, kgraph: Graph, plans: list[KernelPlan], lib, ffi, kernels: list[Kernel]):
        self.graph, self.kgraph, self.plans, self.lib, self.ffi = graph, kgraph, plans, lib, ffi
        self.kernels = kernels
        self.steps: list[Callable[[list, dict], None]] = [self._step(p) for p in plans]
        self._local = threading.local()  # per-thread buffer pool: concurrent calls never share one

    def _step(self, p: KernelPlan):
        args, node, shape = p.args, p.node, p.out_shape
        if p.kind == "view":
            def view(bufs, pool):
                bufs[node] = bufs[args[0]].reshape(shape)
            return view
        fn = getattr(self.lib, p.name)
        cast = self.ffi.cast
        getrefcount = sys.getrefcount
        pre = p.detail.get("prepack")
        packed: list = []  # (the bound B array, its panels), made on the first call

        def panels(b: np.ndarray) -> np.ndarray:
            # A B bound by params= is the same array at every call: pack it once (kept with the
            # array it came from, and redone should a different array ever arrive).
            if not packed or packed[0][0] is not b:
                P = np.empty(getattr(self.lib, pre["floats"])(), dtype=np.float32)
                getattr(self.lib, pre["fn"])(cast("float *", b.ctypes.data), cast("float *", P.ctypes.data))
                packed[:] = [(b, P)]
            return packed[0][1]

        # each argument's C pointer type, from the kernel's dtypes (float*, int64_t*, _Bool*)
        in_ctypes = [C_TYPE[p.body.nodes[i].type.dtype] + " *" for i in p.body.inputs]
        out_dtype = p.body.nodes[p.body.outputs[0]].type.dtype
        out_ctype, out_np = C_TYPE[out_dtype] + " *", NUMPY_DTYPE[out_dtype]
        checked = p.detail.get("op") if p.kind == "index" else None

        def run(bufs, pool):
            # Reuse last call's buffer when nobody else holds it (a fresh one costs page faults).
            out = pool.get(node)
            if out is None or getrefcount(out) > _POOL_ONLY:
                out = pool[node] = np.empty(shape, dtype=out_np)
            ins = [bufs[a] for a in args]
            if pre:
                ins[pre["arg"]] = panels(ins[pre["arg"]])
            bad = fn(*[cast(ct, a.ctypes.data) for ct, a in zip(in_ctypes, ins)], cast(out_ctype, out.ctypes.data))
            if bad:  # an index kernel met indices outside the axis it reads
                raise ArgumentError(f"{bad} index value(s) out of range in {checked} (kernel {p.name})")
            bufs[node] = out
        return run

    def run(self, arrays: list[np.ndarray], threads: int | None) -> list[np.ndarray]:
        kg = self.kgraph
        bufs: list[Any] = [None] * len(kg.nodes)
        for i, a in zip(kg.inputs, arrays):
            bufs[i] = np.ascontiguousarray(a, dtype=NUMPY_DTYPE[kg.nodes[i].type.dtype])
        for i, n in enumerate(kg.nodes):
            if n.op == "const":
                bufs[i] = np.array(n.value, dtype=np.float32)
        if threads is not None and self.lib is not None:
            self.lib.eqf_set_threads(threads)
        pool = self._local.__dict__.setdefault("pool", {})
        for step in self.steps:
            step(bufs, pool)
        # Never hand back memory of a caller's array (an output may be a view of an input, and
        # a.base names only the owner of the memory, not the array it was viewed from) nor one
        # buffer twice.
        outs: list[np.ndarray] = []
        theirs = [bufs[i] for i in kg.inputs]
        for o in kg.outputs:
            a = bufs[o]
            if kg.nodes[o].op == "const" or any(np.shares_memory(a, b) for b in theirs + outs):
                a = a.copy()
            outs.append(a)
        return outs


class GraphFunction:
    """`mod.<graph>`: checks arguments, binds dims, runs the compiled kernels, verifies."""

    def __init__(self, source: Graph, optimized: Graph, params: Mapping[str, np.ndarray],
                 dims: Mapping[str, int], build: Callable[[Graph, dict], Compiled], verify: bool,
                 threads: int | None):
        self.name = source.name
        self.source, self.optimized = source, optimized
        # bound arrays, by name: the source's and those folding made; contiguous once here, so
        # each call passes the same arrays (a prepacked weight is packed at the first call only)
        self.params = {k: np.ascontiguousarray(v) for k, v in params.items()}
        self.dims = dict(dims)
        self._build = build
        self.verify = verify
        self.threads = threads
        self.free = [n for n, _ in source.params if n not in self.params]
        self.cache: dict[tuple, Compiled] = {}
        self.last: Compiled | None = None
        self._lock = threading.Lock()

    def compiled(self, dims: Mapping[str, int]) -> Compiled:
        key = tuple(sorted((k, v) for k, v in dims.items() if k in self.source.dims()))
        with self._lock:
            c = self.cache.get(key)
            if c is None:
                c = self.cache[key] = self._build(self.optimized, dict(key))
            self.last = c
        return c

    def named_arrays(self, arrays, keywords: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """The call's arrays (positional in parameter order, then by keyword) and the bound params, by name."""
        keywords = keywords or {}
        if not keywords and len(arrays) != len(self.free):
            bound = f"; {', '.join(n for n, _ in self.source.params if n in self.params)} bound by params=" \
                if len(self.free) < len(self.source.params) else ""
            raise ArgumentError(f"{self.name}() takes {len(self.free)} array{'s' * (len(self.free) != 1)} "
                                f"({', '.join(self.free)}), got {len(arrays)}{bound}")
        if len(arrays) > len(self.free):
            raise ArgumentError(f"{self.name}() takes {len(self.free)} positional array{'s' * (len(self.free) != 1)} "
                                f"({', '.join(self.free)}), got {len(arrays)}")
        given = dict(zip(self.free, arrays))
        for k in keywords:
            if k in self.params:
                raise ArgumentError(f"{self.name}(): parameter '{k}' is bound by params= and cannot be passed")
            if k not in self.free:
                from .builder import did_you_mean

                hint = did_you_mean(k, self.free)
                raise ArgumentError(f"{self.name}() has no parameter '{k}' (parameters: {', '.join(self.free)})"
                                    + (f"; {hint}" if hint else ""))
            if k in given:
                raise ArgumentError(f"{self.name}(): parameter '{k}' given twice, by position and by keyword")
        given.update(keywords)
        missing = [n for n in self.free if n not in given]
        if missing:
            raise ArgumentError(f"{self.name}() is missing the array{'s' * (len(missing) > 1)} for "
                                f"{', '.join(missing)}")
        return {**self.params, **given}

    def __call__(self, *arrays, **keywords):
        """Arrays by position (parameter order), by keyword (`mod(x=x, w1=w1)`), or both."""
        named = self.named_arrays(arrays, keywords)
        full = [named[n] for n, _ in self.source.params]
        dims = bind_arrays(self.source, full, self.dims)
        c = self.compiled(dims)
        # The optimized graph's params may differ from the source's: folding replaces bound ones.
        outs = c.run([named[n] for n, _ in self.optimized.params],
                     self.threads if self.threads is not None else env_threads())
        if self.verify:
            bad = compare(outs, evaluate(self.source, full))
            if bad:
                raise CheckFailed(f"{self.name}: compiled result differs from the numpy reference: " + "; ".join(bad))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def __repr__(self) -> str:
        sig = f"{self.name}({', '.join(self.free)})"
        if self.last is not None:
            n = len([k for k in self.last.kernels if k.kind != "view"])
            return f"<eqfuse function {sig}: {n} kernel{'s' * (n != 1)}>"
        unbound = [d for d in self.source.dims() if d not in self.dims]
        return f"<eqfuse function {sig}: compiled at the first call ({', '.join(unbound)} unbound)>"


class Module:
    """What eqfuse.compile returns: call it (the first graph) or use `mod.<graph name>`, with arrays
    by position or keyword. `mod.report` is one graph's report, or {graph name: report} for several
    graphs (the shape of `eqfuse opt --report json`); `mod.kernels` is empty for a graph with
    unbound dims until its first call."""

    def __init__(self, functions: list[GraphFunction], report: Any, graph_text: Callable[[], str]):
        self.functions = {f.name: f for f in functions}
        self.default = functions[0]
        self.report = report
        self._graph_text = graph_text

    def __call__(self, *arrays, **keywords):
        return self.default(*arrays, **keywords)

    def __getattr__(self, name: str):
        fns = self.__dict__.get("functions", {})
        if name in fns:
            return fns[name]
        raise AttributeError(f"the module has no graph named '{name}' (it has: {', '.join(fns)})")

    def __dir__(self):
        return list(super().__dir__()) + list(self.functions)

    @property
    def graph(self) -> str:
        """The optimized graphs as text (kernel blocks), dims bound where known."""
        return self._graph_text()

    @property
    def kernels(self) -> list[Kernel]:
        """Every kernel of the latest compiled binding of each graph.

        A graph is compiled when `eqfuse.compile` returns if dims= and params= bind all its named
        dimensions; otherwise at its first call, which binds them from the arrays. Until then it has
        no kernels here (its repr says "compiled at the first call").
        """
        out: list[Kernel] = []
        for f in self.functions.values():
            if f.last is not None:
                out += f.last.kernels
        return out

    def __repr__(self) -> str:
        return f"<eqfuse Module: {', '.join(repr(f) for f in self.functions.values())}>"
