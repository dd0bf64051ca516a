"""The compiled Module: callables that take and return numpy arrays (README: "Compiling to C").

A graph with named dimensions is compiled once per binding of them (at compile time when
`dims=`/`params=` fix them all, else at the first call that binds them), and cached. A batch
dimension (eqfuse.ir.separable) is the exception: it is compiled once for a few bucket sizes and
every value of it runs on them (eqfuse.runtime.buckets), without compiling again.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eqfuse.backend.plan import KernelPlan
from eqfuse.errors import CheckFailed
from eqfuse.ir.graph import Graph
from eqfuse.ir.kernels import K
from eqfuse.ir.reference import bind_arrays, call_arrays, evaluate
from eqfuse.runtime.buckets import Bucketed, default_sizes
from eqfuse.runtime.program import MemoryPlan, PanelPool, Runner, plan_memory
from eqfuse.runtime.verify import compare, scale_for


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
    decisions: Mapping[str, object] = field(default_factory=dict)  # the plan's other choices (`eqfuse lower`)

    def __repr__(self) -> str:
        return f"<Kernel {self.name} {self.kind}: {self.bytes} bytes, {self.flops} flops>"


def _same_kind(a, kind: tuple) -> bool:
    """`a` is a numpy array of this (shape, dtype)."""
    return type(a) is np.ndarray and a.shape == kind[0] and a.dtype == kind[1]


def env_threads() -> int | None:
    v = os.environ.get("EQFUSE_NUM_THREADS", "").strip()
    return int(v) if v.isdigit() and int(v) > 0 else None


class Compiled:
    """One graph at one binding of its dimensions: plans, the C library and its run function
    (eqfuse.runtime.program: every kernel called from C, intermediates in one statically planned arena)."""

    def __init__(self, graph: Graph, kgraph: Graph, plans: list[KernelPlan], lib, ffi, kernels: list[Kernel],
                 memory: MemoryPlan | None = None, panels: PanelPool | None = None,
                 alias: Mapping[str, str] | None = None, library=None):
        self.graph, self.kgraph, self.plans, self.lib, self.ffi = graph, kgraph, plans, lib, ffi
        self.library = library  # the shared library's file (a Path; None without kernels), for Module.save
        self.alias = dict(alias or {})
        self.kernels = kernels
        self.memory = memory if memory is not None else plan_memory(kgraph, plans)
        self.runner = Runner(kgraph, plans, self.memory, lib, ffi, panels, dict(alias or {}))

    def run(self, arrays: list[np.ndarray], threads: int | None, into=None) -> list[np.ndarray]:
        """The graph's outputs for its inputs (in the kernelized graph's input order): one C call.
        No output shares memory with an input or another output (eqfuse.runtime.program).
        `into`: arrays the outputs are written in (Runner.__call__)."""
        return self.runner(arrays, threads, into)


class GraphFunction:
    """`mod.<graph>`: checks arguments, binds dims, runs the compiled kernels, verifies."""

    def __init__(self, source: Graph, optimized: Graph, params: Mapping[str, np.ndarray],
                 dims: Mapping[str, int], build: Callable[..., list[Compiled]], verify: bool,
                 threads: int | None, batch: tuple[str, list[int] | None] | None = None,
                 panels: PanelPool | None = None):
        self.name = source.name
        self.panels = panels  # the packed weights' pool of every bucket (else one per dims binding)
        self.source, self.optimized = source, optimized
        self.source_dims = frozenset(source.dims())  # (a walk over every node: once, not per call)
        # bound arrays, by name: the source's and those folding made; contiguous once here, so
        # each call passes the same arrays (a prepacked weight is packed at the first call only)
        self.params = {k: np.ascontiguousarray(v) for k, v in params.items()}
        self.dims = dict(dims)
        self._build = build
        self.verify = verify
        self.threads = threads
        self.free = [n for n, _ in source.params if n not in self.params]
        # The bound arrays were checked by compile (compiler._bind_params), and the dims they fix
        # are in `dims`: a call checks only the arrays it passes (checking a ResNet-18's 42
        # bound weights again cost a sixth of the model's run: benchmarks/bench_models.py --model resnet18)
        names = [n for n, _ in source.params]
        self._passed = Graph(source.name, list(source.nodes),
                             [i for i, n in zip(source.inputs, names) if n not in self.params], [])
        self._optimized_names = [n for n, _ in optimized.params]
        # The repeat call (eqfuse.runtime.module.GraphFunction.__call__): the run's arrays with the
        # bound ones in place, and where each passed array goes among them.
        self._template = [self.params.get(n) for n in self._optimized_names]
        self._slots = [(k, self.free.index(n)) for k, n in enumerate(self._optimized_names) if n not in self.params]
        self._repeat: tuple | None = None  # (the last call's (shape, dtype) per array, its run function)
        self.cache: dict[tuple, Compiled] = {}
        self.last: Compiled | None = None
        # the inputs that are bf16 KV caches (a live= decode step under precision="bf16"): they take
        # uint16 arrays too (Runner.bf16_slots)
        self.bf16_caches: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        # the batch dim taken at run time and its bucket sizes (None: from the first binding)
        self.batch_dim, self.bucket_sizes = batch if batch else (None, None)
        self.buckets: dict[tuple, Bucketed] = {}
        self.last_batch: int | None = None  # the batch dim's value at the last call

    def compiled(self, dims: Mapping[str, int]) -> Compiled:
        key = tuple(sorted((k, v) for k, v in dims.items() if k in self.source_dims))
        with self._lock:
            c = self.cache.get(key)
            if c is None:
                c = self.cache[key] = self._build(self.optimized, [dict(key)], panels=self.panels)[0]
                self.note_bf16_caches(c)
            self.last = c
        return c

    def pack_bound(self) -> None:
        """Pack the panels of the bound weights of every binding compiled so far now, in the
        calling thread, rather than at each one's first call (eqfuse.generate's chunk and decode
        steps: each packs in the thread that compiled it, while the other compiles)."""
        for c in list(self.cache.values()):
            c.runner.pack(self._template)

    def note_bf16_caches(self, c: Compiled) -> None:
        """The inputs of c that are bf16 KV caches take uint16 arrays (bf16_caches)."""
        kg = c.kgraph
        self.bf16_caches |= {kg.nodes[kg.inputs[k]].name for k in c.runner.bf16_slots}

    def bucketed(self, dims: Mapping[str, int]) -> Bucketed:
        """The graph compiled at every bucket size of its batch dim, with `dims`' other values
        (the batch dim's own value only picks the default sizes, at the first binding)."""
        d = self.batch_dim
        key = tuple(sorted((k, v) for k, v in dims.items() if k in self.source_dims and k != d))
        with self._lock:
            b = self.buckets.get(key)
            if b is None:
                sizes = self.bucket_sizes or default_sizes(dims[d])
                binds = [{**dict(key), d: s} for s in sizes]
                names = [f"{self.optimized.name}_{d}{s}" for s in sizes]
                built = self._build(self.optimized, binds, names=names, panels=self.panels or PanelPool())
                b = self.buckets[key] = Bucketed(d, self.optimized, dict(zip(sizes, built)))
                for c in built:
                    self.note_bf16_caches(c)
            self.last = b.compiled.get(dims.get(d), b.largest)  # the bucket this call runs whole, if any
        return b

    def rebuilt(self) -> tuple[dict[tuple, Compiled], dict[tuple, dict[int, Compiled]]]:
        """Every binding and bucket set compiled so far, built again for the machine model in
        force (Module.save builds each artifact target this way), this function left as it is."""
        cache = {key: self._build(self.optimized, [dict(key)], panels=PanelPool())[0] for key in self.cache}
        buckets = {}
        d = self.batch_dim
        for key, b in self.buckets.items():
            binds = [{**dict(key), d: s} for s in b.sizes]
            names = [f"{self.optimized.name}_{d}{s}" for s in b.sizes]
            buckets[key] = dict(zip(b.sizes, self._build(self.optimized, binds, names=names, panels=PanelPool())))
        return cache, buckets

    def named_arrays(self, arrays, keywords: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """The call's arrays (positional in parameter order, then by keyword) and the bound params, by name."""
        given = call_arrays(self.name, self.free, arrays, keywords or {}, bound=self.params)
        # (a numpy scalar, np.uint8(3), is its rank-0 array, as the reference takes it)
        given = {k: np.asarray(v) if isinstance(v, np.generic) else v for k, v in given.items()}
        return {**self.params, **given}

    def __call__(self, *arrays, **keywords):
        """Arrays by position (parameter order), by keyword (`mod(x=x, w1=w1)`), or both."""
        # A call by position with the arrays' shapes and dtypes of the last call binds the same
        # dims and passes the same checks: it goes straight to the last call's run function.
        # (After a long call the caches hold none of the Python objects a call touches: the
        # ResNet stages spent many times longer outside their C than calls run back to back,
        # as benchmarks/bench_runtime.py runs them.)
        repeat = self._repeat
        if repeat is not None and keywords and not arrays and len(keywords) == len(self.free):
            # Every parameter by keyword (a dict of feeds, as onnxruntime takes them) is the same
            # call by position: it takes the repeat call's way too. (The way of named_arrays and
            # bind_arrays cost a BERT export's call a sixth more: benchmarks/bench_models.py.)
            try:
                arrays, keywords = tuple(map(keywords.__getitem__, self.free)), {}
            except KeyError:  # (a name that is not a parameter: named_arrays says which)
                pass
        if repeat is not None and not keywords and len(arrays) == len(repeat[0]) and all(
                map(_same_kind, arrays, repeat[0])):
            run = list(self._template)
            for k, i in self._slots:
                run[k] = arrays[i]
            outs = repeat[1](run, self.threads if self.threads is not None else env_threads())
            return outs[0] if len(outs) == 1 else tuple(outs)
        named = self.named_arrays(arrays, keywords)
        dims = bind_arrays(self._passed, [named[n] for n in self.free], self.dims, self.bf16_caches)
        # The optimized graph's params may differ from the source's: folding replaces bound ones.
        arrays = [named[n] for n in self._optimized_names]
        threads = self.threads if self.threads is not None else env_threads()
        if self.batch_dim is not None:
            self.last_batch = dims[self.batch_dim]
            bucketed, batch = self.bucketed(dims), self.last_batch
            run = lambda a, t: bucketed.run(a, batch, t)  # noqa: E731
        else:
            run = self.compiled(dims).run
        outs = run(arrays, threads)
        if not self.verify:
            self._repeat = (tuple((named[n].shape, named[n].dtype) for n in self.free), run)
        if self.verify:
            bad = compare(*self._checked(outs, named), scale=scale_for(self.last.plans if self.last is not None else ()))
            if bad:
                raise CheckFailed(f"{self.name}: compiled result differs from the numpy reference: " + "; ".join(bad))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _checked(self, outs, named) -> tuple[list, list]:
        """(results, the reference's) for verify=. With a dim taken at run time (eqfuse.backend.
        runtime_dim), the first n positions of each result along the capacity's extent, against the
        graph at the dim = n on the inputs' first n positions where the graph holds the dim by name
        (a .g graph's); else (an ONNX model's, its dims numbers) against the graph at the capacity
        on the inputs as given, so their positions past n must be ones the model ignores (a mask's
        zeros)."""
        inputs = [named[n] for n, _ in self.source.params]
        dims = [p.live for p in (self.last.plans if self.last is not None else ()) if p.live is not None]
        if not dims or dims[0].what != "dim":
            return outs, evaluate(self.source, inputs)
        cap, kg = dims[0].rows, self.last.kgraph
        n = int(named[kg.nodes[dims[0].length].name][0])

        def cut(a: np.ndarray) -> np.ndarray:
            return a[tuple(slice(0, n) if x == cap else slice(None) for x in a.shape)]

        if self.source.dims():
            inputs = [cut(a) for a in inputs]
            return [cut(o) for o in outs], evaluate(self.source, inputs)
        return [cut(o) for o in outs], [cut(o) for o in evaluate(self.source, inputs)]

    def prepare(self, *arrays) -> Callable[[], Any] | None:
        """A call by position over these very arrays, made again and again: `run()` gives what
        `self(*arrays)` would, reading the arrays' contents at each call; the caller writes new
        values into them between calls, never a new shape (eqfuse.runtime.program.Runner.prepared:
        no check of the arrays per call). None where that cannot hold: a function that verifies
        its results, runs on batch buckets, or would pass an array to C as a copy. Compiles for
        the arrays' dims if needed; runs nothing. (eqfuse.generation's decode step.)"""
        if self.verify or self.batch_dim is not None:
            return None
        named = self.named_arrays(arrays)
        dims = bind_arrays(self._passed, [named[n] for n in self.free], self.dims, self.bf16_caches)
        threads = self.threads if self.threads is not None else env_threads()
        run = self.compiled(dims).runner.prepared([named[n] for n in self._optimized_names], threads)
        if run is None:
            return None
        if len(self.source.outputs) == 1:
            return lambda: run()[0]
        return lambda: tuple(run())

    def __repr__(self) -> str:
        sig = f"{self.name}({', '.join(self.free)})"
        if self.last is not None:
            n = len([k for k in self.last.kernels if k.kind != K.VIEW])
            return f"<eqfuse function {sig}: {n} kernel{'s' * (n != 1)}{self._batch_text()}>"
        unbound = [d for d in self.source.dims() if d not in self.dims]
        return f"<eqfuse function {sig}: compiled at the first call ({', '.join(unbound)} unbound){self._batch_text()}>"

    def bucket_sizes_of_last(self) -> list[int] | None:
        """The bucket sizes the last call ran on (None without a batch dim)."""
        for b in self.buckets.values():
            if self.last in b.compiled.values():
                return b.sizes
        return None

    def _batch_text(self) -> str:
        if self.batch_dim is None:
            return ""
        sizes = self.bucket_sizes or next((b.sizes for b in self.buckets.values()), None)
        return f"; batch dim {self.batch_dim} at any size, " + (
            f"compiled at {', '.join(map(str, sizes))}" if sizes else "buckets chosen at the first call")


class Module:
    """What eqfuse.compile returns: call it (the first graph) or use `mod.<graph name>`, with arrays
    by position or keyword. `mod.report` is one graph's report, or {graph name: report} for several
    graphs (the shape of `eqfuse opt --report json`); `mod.kernels` is empty for a graph with
    unbound dims until its first call."""

    # The artifact writer and reader (eqfuse.runtime.artifact, which imports this module and
    # registers itself here when imported: the import points one way)
    artifacts: Any = None

    def __init__(self, functions: list[GraphFunction], report: Any, graph_text: Callable[[], str],
                 precision: str = "f32"):
        self.functions = {f.name: f for f in functions}
        self.default = functions[0]
        self.report = report
        self.precision = precision
        self._graph_text = graph_text
        self.artifact: Any = None  # the artifact this Module was loaded from (a path or its bytes), if any

    def save(self, path, targets: list[str] | None = None):
        """Write this Module as one file that `eqfuse.load` reads without the compiler
        (eqfuse.runtime.artifact): its libraries built for each of `targets` (x86-64 levels;
        default this machine's), its weights as packed, its graphs, dims and buckets. Returns the path."""
        return Module.artifacts.save(self, path, targets)

    def __reduce__(self):
        # A Module pickles as its artifact (bytes), and unpickles through eqfuse.load's code
        return Module.artifacts.loads, (Module.artifacts.dumps(self),)

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
