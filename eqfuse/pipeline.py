"""`eqfuse.compile` as named stages, top to bottom.

    options -> load -> bind -> fold -> optimize -> lower -> build -> Module

Each stage is a function with a typed input and output:

- `Options.of(...)`: every option checked, in this one place (`dims`, `params`, `threads`, `fuse`,
  `buckets`, `precision`, ...); the command line, `export`, `jit` and the torch backend build
  their options here too;
- `load(src, options)`: the model's graphs and an ONNX model's weights (`Loaded`);
- `bind(graph, params, dims)`: the dims the bound arrays fix, checked against their parameters;
- `fold(graph, params, fuse)`: the bound params folded into the graph (`Folded`);
- `optimize(graph, options, dims)`: the fused graph and the optimizer's report (`optimize_model`,
  which is `eqfuse.optimize`, optimizes every graph of a model and counts kernels as `eqfuse opt`);
- `lower(graph, dims, fuse, params)`: the kernelized graph and every kernel's plan;
- `build(graph, bindings, ...)`: the plans' C, compiled into one library (`Compiled` per binding);
- `compile(src, ...)`: the stages composed into a `Module`.

A model whose named dims are only known per call is compiled per bucket of them at the first
call (eqfuse.runtime.padded): its buckets run the same stages through `compile_model`, sharing
their equal weights (`SharedArrays`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from eqfuse import progress
from eqfuse.backend import cbuild
from eqfuse.backend.emit import emit_graph
from eqfuse.backend.lower import format_uops, lower_graph, plan_decisions
from eqfuse.backend.plan import precision_entries
from eqfuse.errors import ArgumentError, DimsNeeded, EqfuseError, RuntimeDimRefused
from eqfuse.frontend.load import is_onnx, load_with_weights
from eqfuse.frontend.load import load as load_graphs
from eqfuse.grad.api import LazyGradFunction, differentiate
from eqfuse.ir.graph import Graph, Node, bind_dims, oversized
from eqfuse.ir.kernels import K
from eqfuse.ir.live import appended, cache_graph, causal_from_length, length_graph, pick_row
from eqfuse.ir.printer import graph_text, kernel_text, module_text
from eqfuse.ir.reference import Reference, bind_arrays
from eqfuse.ir.separable import batch_dims
from eqfuse.machine import machine
from eqfuse.optimizer import graph_cache
from eqfuse.optimizer.cost import MODELS as COST_MODELS
from eqfuse.optimizer.fold import Folded, fold_params
from eqfuse.optimizer.optimize import (
    Optimized,
    batch_dims_report,
    optimize_graph,
    optimize_graphs,
)
from eqfuse.optimizer.rulecheck import check_rule_files
from eqfuse.runtime.module import Compiled, GraphFunction, Kernel, Module
from eqfuse.runtime.padded import PaddedFunction, pad_sizes
from eqfuse.runtime.program import SharedArrays, emit_run, give_back_memory, plan_memory

FUSE_MODES = (True, False, "manual")
# precision=: what the GEMMs multiply in (docs/precision.md). "bf16": operands rounded to bf16,
# products accumulated in f32; everything else (epilogues, norms, softmax, reductions) in f32.
PRECISIONS = ("f32", "bf16")


# ---------------------------------------------------------------- options


@dataclass(frozen=True)
class Options:
    """What `compile` was asked, checked (`Options.of`)."""

    cost: str = "memory"
    rules: tuple = ()
    disable: tuple[str, ...] = ()
    dims: dict[str, int] = field(default_factory=dict)
    params: dict[str, np.ndarray] = field(default_factory=dict)
    threads: int | None = None
    verify: bool = False
    fuse: bool | str = True
    check_rules: bool = True
    grad: tuple[str, ...] | None = None
    buckets: dict[str, list[int]] | None = None
    precision: str = "f32"
    live: str | None = None  # the dim that is a KV cache's run-time length (eqfuse.ir.live)
    # with live=: the input that picks the one row of the first result computed (eqfuse.ir.live.
    # pick_row: eqfuse.generate's prompt chunks need one row of logits); not an option of compile()
    pick: str | None = None
    # with live=: a dim of the new rows taken at run time too (eqfuse.backend.runtime_dim, its
    # capacity bound by dims=): eqfuse.generate's prompt chunk of any length up to its rows; not an
    # option of compile()
    live_new: str | None = None

    @staticmethod
    def of(cost: str = "memory", rules: Sequence = (), disable: Sequence[str] = (),
           dims: Mapping[str, int] | None = None, params: Mapping[str, np.ndarray] | None = None,
           threads: int | None = None, verify: bool = False, fuse: bool | str = True, check_rules: bool = True,
           grad: Sequence[str] | None = None, buckets: Mapping[str, Sequence[int]] | None = None,
           precision: str = "f32", live: str | None = None) -> Options:
        """The options checked for themselves (the checks that need the model are `check_model`'s)."""
        if isinstance(rules, (str, os.PathLike)):
            rules = (rules,)
        if fuse not in FUSE_MODES:
            raise ArgumentError(f"fuse= expects True, False or \"manual\", got {fuse!r}")
        if cost not in COST_MODELS:
            raise ArgumentError(f"unknown cost model '{cost}' (known: {', '.join(COST_MODELS)})")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ArgumentError(f"threads= expects a positive integer, got {threads!r}")
        check_precision(precision)
        if verify and precision != "f32":
            # (verify= compares with the numpy reference at f32 tolerances, which a bf16 GEMM
            # does not meet: docs/precision.md gives its bound)
            raise ArgumentError(f"verify=True checks at f32 tolerances and cannot be combined with "
                                f"precision={precision!r} (docs/precision.md: the bf16 error bound)")
        if dims is not None and not isinstance(dims, Mapping):
            raise ArgumentError(f"dims= expects a dict {{dim name: size}}, got {type(dims).__name__}")
        if params is not None and not isinstance(params, Mapping):
            raise ArgumentError(f"params= expects a dict {{parameter name: array}}, got {type(params).__name__}")
        for k, a in (params or {}).items():
            if not isinstance(a, np.ndarray):
                raise ArgumentError(f"params=: '{k}' expects a numpy array, got {type(a).__name__}")
        if grad is not None and (isinstance(grad, (str, bytes)) or not list(grad)):
            raise ArgumentError(f"grad= expects a non-empty list of parameter names, got {grad!r}")
        if buckets is not None and not isinstance(buckets, Mapping):
            raise ArgumentError(f"buckets= expects a dict {{dim name: [sizes]}}, got {type(buckets).__name__}")
        if live is not None and (not isinstance(live, str) or live not in (dims or {})):
            raise ArgumentError(f"live= expects the name of a dimension that dims= binds (its capacity), got {live!r}")
        if live is not None and grad is not None:
            raise ArgumentError("live= and grad= cannot be combined")
        return Options(cost, tuple(rules), tuple(disable), dict(dims or {}), dict(params or {}), threads, verify,
                       fuse, check_rules, None if grad is None else tuple(grad),
                       None if buckets is None else dict(buckets), precision, live)


def check_precision(precision, option: str = "precision=") -> str:
    """precision= (or the command line's --precision, the torch backend's "precision" option): one
    of PRECISIONS."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ArgumentError(f"{option} expects one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def check_dims(graphs: list[Graph], dims: Mapping[str, int] | None) -> None:
    """dims= as strict as --dim: a known dimension name, a positive integer."""
    check_dim_values(list(dict.fromkeys(d for g in graphs for d in g.dims())), dims)
    for g in graphs:
        why = oversized(g, {k: int(v) for k, v in (dims or {}).items()})
        if why:
            raise ArgumentError(f"dims=: {why}")


def check_dim_values(names: list[str], dims: Mapping[str, int] | None) -> None:
    """Each dims= entry names one of `names` and is a positive integer."""
    for k, v in (dims or {}).items():
        if k not in names:
            raise ArgumentError(f"dims= names '{k}', which is not a dimension of the model "
                                f"(its named dimensions: {', '.join(names) or 'none'})")
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise ArgumentError(f"dims=: '{k}' expects a positive integer, got {v!r}")


def check_param_names(graphs: list[Graph], params: Mapping[str, Any]) -> None:
    names = {n for g in graphs for n, _ in g.params}
    for k in params:
        if k not in names:
            raise ArgumentError(f"params= names '{k}', which is not a parameter (parameters: {', '.join(sorted(names))})")


def check_bucket_values(names: list[str], buckets) -> None:
    """buckets= is a dict of the model's dim names to non-empty lists of positive integers."""
    if buckets is None:
        return
    if not isinstance(buckets, Mapping):
        raise ArgumentError(f"buckets= expects a dict {{dim name: [sizes]}}, got {type(buckets).__name__}")
    for k, v in buckets.items():
        if k not in names:
            raise ArgumentError(f"buckets= names '{k}', which is not a dimension of the model "
                                f"(its named dimensions: {', '.join(names) or 'none'})")
        if (isinstance(v, (str, bytes)) or not hasattr(v, "__iter__") or not list(v)
                or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s <= 0 for s in v)):
            raise ArgumentError(f"buckets=: '{k}' expects a non-empty list of positive integers, got {v!r}")


def check_buckets(graphs: list[Graph], buckets, dims, params) -> None:
    """buckets= names batch dims of the model, each with a list of positive sizes."""
    if buckets is None:
        return
    check_bucket_values(list(dict.fromkeys(d for g in graphs for d in g.dims())), buckets)
    for k in buckets:
        if k in (dims or {}):
            raise ArgumentError(f"buckets=: '{k}' is bound by dims=; a dimension is either fixed or a batch dim")
        for g in graphs:
            why = batch_dims(g, params)[1].get(k)
            if why:
                raise ArgumentError(f"buckets=: '{k}' is not a batch dimension of graph {g.name}: {why}")
    if len(buckets) > 1:
        raise ArgumentError(f"buckets=: one batch dimension at a time, got {', '.join(buckets)}")


# ---------------------------------------------------------------- load


@dataclass(frozen=True)
class Loaded:
    """A model's graphs and the arrays bound to their parameters (an ONNX model's initializers
    and the user's params=, which win)."""

    graphs: list[Graph]
    params: dict[str, np.ndarray]


def load(src, opts: Options, shared: SharedArrays | None = None) -> Loaded:
    """The model's graphs, checked against dims= and params=. An ONNX model's dims are bound at
    import (its shape arithmetic folds with them); DimsNeeded when some are only bound per call."""
    if is_onnx(src):
        from eqfuse.frontend.onnx_cache import input_dims

        if opts.dims and shared is None:  # (a padded model's bucket: checked by its first compile)
            check_dim_values(input_dims(src), opts.dims)
        # a step over a cache in place (live=) keeps a sliding-window layer's cache whole
        graphs, weights = load_with_weights(src, opts.dims, whole_windows=opts.live is not None)
        named = {d for g in graphs for d in g.dims()}
        check_dims(graphs, {k: v for k, v in opts.dims.items() if k in named})
    else:
        graphs, weights = load_with_weights(src, opts.dims)
        check_dims(graphs, opts.dims)
    params = {**weights, **opts.params}
    if shared is not None:  # a bucket of a padded model: the weights an earlier bucket holds
        params = shared.arrays(params)
    check_param_names(graphs, params)
    return Loaded(graphs, params)


# ---------------------------------------------------------------- bind


def bind(g: Graph, params: Mapping[str, np.ndarray], dims: Mapping[str, int]) -> dict[str, int]:
    """The dims of g known before a call: `dims` and those the bound arrays fix (checked against
    their parameters)."""
    dims = {k: v for k, v in dims.items() if k in g.dims()}
    if not params:
        return dims
    names = [n for n, _ in g.params]
    sub = Graph(g.name, list(g.nodes), [i for i, n in zip(g.inputs, names) if n in params], [])
    return bind_arrays(sub, [params[n] for n in names if n in params], dims)


def params_of(g: Graph, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays bound to g's own parameters."""
    own = dict(g.params)
    return {k: v for k, v in params.items() if k in own}


def batch_dim(g: Graph, dims: Mapping[str, int], buckets, params=None) -> tuple[str, list[int] | None] | None:
    """(the graph's run-time batch dim, its bucket sizes or None for the default), or None."""
    free = [d for d in batch_dims(g, params)[0] if d not in dims]
    if buckets is None:
        return (free[0], None) if free else None
    chosen = [d for d in free if d in buckets]
    return (chosen[0], sorted({int(v) for v in buckets[chosen[0]]})) if chosen else None


def padded_dims(graphs: list[Graph], buckets, dims, params) -> list[str]:
    """The dims that buckets= names and that are not batch dims, of a one-graph .g model (padded at
    run time: eqfuse.runtime.padded); a multi-graph model's are refused by check_buckets."""
    if not buckets or len(graphs) != 1:
        return []
    check_bucket_values(graphs[0].dims(), buckets)
    why = batch_dims(graphs[0], params)[1]
    return [k for k in buckets if why.get(k) and k not in (dims or {})]


# ---------------------------------------------------------------- fold, optimize


def fold(g: Graph, params: dict, fuse: bool | str, live: str | None = None) -> Folded:
    """The bound params folded into the graph (only when the optimizer fuses: fuse=True); with
    compile's live=, the folded causal masks of a step of several new rows then computed from the
    live length (eqfuse.ir.live.causal_from_length)."""
    folded = fold_params(g, params) if fuse is True else Folded(g, params, [])
    if live is not None:
        folded = replace(folded, graph=causal_from_length(folded.graph, folded.params, length_input(live)))
    return folded


def optimize(g: Graph, cost="memory", rules=(), disable=(), dims=None, fuse: bool | str = True) -> tuple[Graph, Any]:
    """The optimizer's fused graph; the graph as written for fuse=False or fuse="manual"."""
    if fuse is False:
        return g, {"optimized": False, "reason": "fuse=False: every op is its own kernel"}
    if fuse == "manual":
        return g, {"optimized": False, "reason": "fuse=\"manual\": kernel blocks as written"}
    with progress.step(f"optimizing {g.name}"):
        res = optimize_graph(g, cost=cost, rules=rules, disable=disable, dims=dims or None, machine=machine())
    return res.graph, res.report


def optimize_model(src, *, cost: str = "memory", rules: Sequence = (), disable: Sequence[str] = (),
                   dims: Mapping[str, int] | None = None, iter_limit: int | None = None,
                   node_limit: int | None = None, time_limit: float | None = None,
                   check_rules: bool = True) -> Optimized:
    """eqfuse.optimize: every graph of a model (a .g path or source text) optimized, no C built.
    User rule files are checked for soundness first (RuleError; check_rules=False skips it). Each
    report counts kernels as `eqfuse opt` does: where every dim of the graph is bound (its own
    shapes or dims=), the kernels that run, views apart, the graph lowered as compile lowers it
    (kernels_counted "lowered"); else the optimizer's count (docs/optimizing.md, "Kernel counts")."""
    check_rule_files(rules, enabled=check_rules)
    graphs = load_graphs(src)
    dims = dict(dims or {})
    check_dims(graphs, dims)
    results = optimize_graphs(graphs, cost=cost, rules=rules, disable=disable, dims=dims, iter_limit=iter_limit,
                              node_limit=node_limit, time_limit=time_limit,
                              machine=machine())  # the planner's: read once here, passed down
    for g, r in zip(graphs, results):
        count_kernels(r.report, g, r.graph, {k: v for k, v in dims.items() if k in g.dims()})
    return Optimized([r.graph for r in results], {g.name: r.report for g, r in zip(graphs, results)})


# ---------------------------------------------------------------- lower, build


def lower(g: Graph, dims: Mapping[str, int], fuse: bool | str = True, params: frozenset[str] = frozenset(),
          precision: str = "f32", live: str | None = None, arrays: Mapping | None = None,
          capacity: int | None = None, beside: tuple[str, int] | None = None):
    """(kernelized graph, plans) for one dims binding; `params` names the inputs bound by params=
    (a GEMM prepacks such a B operand once); `precision` is compile's precision= (each plan says
    what its kernel computes in: KernelPlan.precision); `live` is compile's live= (the cache
    appends and attentions then take the live length at run time: eqfuse.backend.live), which
    may read the bound inputs' values `arrays` (a causal mask over a prompt's chunk), as an integer
    GEMM does (its bound weights' range chooses its instruction path); `capacity` the live dim's
    value when `dims` does not bind it (an ONNX model's, whose import bound it); `beside` (a dim,
    its capacity) the new rows' dim at run time beside the cache (Options.live_new)."""
    bound = bind_dims(g, dims) if g.dims() else g
    # a dim the loops take at run time, if no KV cache appends to it (eqfuse.backend.runtime_dim): its
    # capacity, bound here, or given (an ONNX model's dims are numbers after its import)
    if live is not None and live in g.dims():
        capacity = int(dims[live])
        check_capacity(g, live, capacity)  # (an ONNX model's: check_onnx_dim at its import)
    if beside is not None and beside[0] in g.dims():
        check_capacity(g, *beside)
    return bound, *lower_graph(bound, machine(), fuse=fuse is not False, params=params, precision=precision,
                               live=None if live is None else length_input(live), arrays=arrays,
                               capacity=capacity,
                               beside=None if beside is None else (length_input(beside[0]), beside[1]))


def fixed_extents(g: Graph) -> frozenset[int]:
    """Every number that is an extent of a node of g (kernel bodies included)."""
    return frozenset(d for _, _, n in g.walk() for d in n.type.shape if not isinstance(d, str))


def check_capacity(g: Graph, dim: str, capacity: int) -> None:
    """A run-time dim's kernels are found by their extent: `capacity` must be no fixed extent of g."""
    if capacity in fixed_extents(g):
        raise RuntimeDimRefused(f"live='{dim}': its capacity {capacity} is also a fixed extent of {g.name}; "
                                f"bind {dim} to another capacity (dims=), e.g. {capacity + 1}")


def running(plans) -> tuple[int, int]:
    """(kernels that run, views) among plans: the one kernel count of eqfuse (docs/optimizing.md,
    "Kernel counts"). A view (K.VIEW: a reshape, a slice, a transpose read in place) runs no code."""
    views = sum(p.kind == K.VIEW for p in plans)
    return len(plans) - views, views


def count_kernels(report: dict, source: Graph, opt: Graph, dims: Mapping[str, int],
                  params: frozenset[str] = frozenset(), precision: str = "f32", after=None) -> dict:
    """The optimizer's report with its kernel counts replaced by the lowered ones when every dim
    is bound: kernels_before / views_before from `source` lowered unfused (every op its own kernel,
    as `eqfuse bench`'s unfused row), kernels_after / views_after from `opt` lowered (or `after`,
    the plans already lowered). The optimizer's own counts (its cost model's, which knows fewer
    views) stay when a dim is unbound: report["kernels_counted"] says which. Lowered here,
    report["graph"] prints the views as views (eqfuse.ir.printer.graph_text)."""
    if any(d not in dims for d in (*source.dims(), *opt.dims())):
        report["kernels_counted"] = "optimizer"
        return report
    if after is None:
        _, kg, after = lower(opt, dims, True, params, precision)
        views = view_kernels(opt, kg, after)
        if views:
            report["graph"] = graph_text(opt, views)
    (kb, vb), (ka, va) = unfused_count(source, dims, params, precision), running(after)
    report.update(kernels_before=kb, views_before=vb, kernels_after=ka, views_after=va, kernels_counted="lowered")
    return report


def unfused_count(source: Graph, dims: Mapping[str, int], params: frozenset[str] = frozenset(),
                  precision: str = "f32") -> tuple[int, int]:
    """running() of `source` lowered unfused (every op its own kernel): kept in the optimized-graph
    cache (graph_cache.memo, keyed by the graph's text, dims, bound params, precision and the
    machine model), so that a warm compile does not lower the unfused graph only to count it."""
    parts = {"graph": graph_text(source), "dims": sorted(dims.items()), "params": sorted(params),
             "precision": precision, "machine": repr(machine())}
    kb, vb = graph_cache.memo("unfused kernel count", parts,
                              lambda: list(running(lower(source, dims, False, params, precision)[2])))
    return int(kb), int(vb)


def view_kernels(opt: Graph, kg: Graph, plans) -> frozenset[int]:
    """The kernel nodes of `opt` that lowering it (to `kg`, `plans`) made views: lowering keeps
    a fused graph's kernels in their order (none when a block was split, so the order is lost)."""
    ours = [i for i, n in enumerate(opt.nodes) if n.op == "kernel"]
    theirs = [i for i, n in enumerate(kg.nodes) if n.op == "kernel"]
    if len(ours) != len(theirs):
        return frozenset()
    at = dict(zip(theirs, ours))
    return frozenset(at[p.node] for p in plans if p.kind == K.VIEW)


def kernel_infos(kg: Graph, plans, sources: Mapping[str, str], graph: str | None = None) -> list[Kernel]:
    """What mod.kernels shows of each plan; `graph` names the user's graph (kg's name may carry a
    batch bucket's suffix)."""
    names = {i: (n.name or f"t{i}") for i, n in enumerate(kg.nodes)}
    taken = set(names.values())
    out = []
    for p in plans:
        body = kernel_text(kg.nodes[p.node], names, set(taken), indent="")
        out.append(Kernel(p.name, p.kind, body, sources.get(p.name, ""), p.bytes, p.flops, dict(p.tiles),
                          graph or kg.name, {**plan_decisions(p), **({"live": str(p.live)} if p.live else {})}))
    return out


def build(g: Graph, bindings: list[dict], fuse: bool | str = True, params: frozenset[str] = frozenset(),
          names: list[str] | None = None, panels=None, precision: str = "f32",
          record: dict | None = None, live: str | None = None, arrays: Mapping | None = None,
          capacity: int | None = None, beside: tuple[str, int] | None = None) -> list[Compiled]:
    """One Compiled per dims binding, all in one C module (one compiler run); `names` renames the
    graph per binding, so that their kernels and run functions differ. `record` (the report's
    "precision") gets each kernel's precision and instruction path."""
    lowered = []
    for k, dims in enumerate(bindings):
        gk = replace(g, name=names[k]) if names else g
        bound, kg, plans = lower(gk, dims, fuse, params, precision, live, arrays, capacity, beside)
        lowered.append((bound, kg, plans, plan_memory(kg, plans)))
        if record is not None:
            record.update(precision_entries(plans))
    emitted = emit_graph([p for _, _, plans, _ in lowered for p in plans], share=True)
    lib = ffi = path = None
    if emitted.kernel_sources:
        # one entry point per graph: every kernel is called from C (eqfuse.runtime.program)
        runs = [emit_run(kg, plans, memory, emitted.symbol) for _, kg, plans, memory in lowered
                if any(p.kind != K.VIEW for p in plans)]
        unique = len(emitted.kernel_sources) - len(emitted.alias)
        with progress.step(f"compiling {unique} kernels of {g.name}"):
            # (through the module, not a name bound at import: a test that replaces cbuild.build
            # sees every build, whenever this module was imported)
            built = cbuild.build("\n".join([emitted.source] + [c for c, _ in runs]),
                            "\n".join([emitted.cdef] + [d for _, d in runs]), f"eqf_{g.name}")
        lib, ffi, path = built.lib, built.ffi, built.path
    return [Compiled(bound, kg, plans, lib, ffi, kernel_infos(kg, plans, emitted.kernel_sources, g.name), memory,
                     panels, emitted.alias, path)
            for bound, kg, plans, memory in lowered]


def builder(fuse: bool | str, params: frozenset[str] = frozenset(), precision: str = "f32",
            record: dict | None = None, live: str | None = None, arrays: Mapping | None = None,
            capacity: int | None = None, beside: tuple[str, int] | None = None):
    """`build` for a GraphFunction, which calls it with each new dims binding (`arrays`: the
    bound inputs' values, for live= and the integer GEMMs' paths)."""
    def build_bindings(g: Graph, bindings: list[dict], names: list[str] | None = None, panels=None):
        return build(g, bindings, fuse, params, names, panels, precision, record, live, arrays, capacity, beside)
    return build_bindings


# ---------------------------------------------------------------- compile


def compile(src: str | os.PathLike, cost: str = "memory", rules: Sequence = (), disable: Sequence[str] = (),
            dims: Mapping[str, int] | None = None, params: Mapping[str, np.ndarray] | None = None,
            threads: int | None = None, verify: bool = False, fuse: bool | str = True,
            check_rules: bool = True, grad: Sequence[str] | None = None,
            buckets: Mapping[str, Sequence[int]] | None = None, precision: str = "f32",
            live: str | None = None) -> Module:
    """Compile every graph of a model to C kernels (docs/backend.md).

    User rule files (rules=) are first checked for soundness on random inputs, once per file
    content (eqfuse.optimizer.rulecheck): an unsound rule raises RuleError; check_rules=False skips it.

    fuse=True runs the optimizer; fuse="manual" keeps the graph as written (hand-written kernel
    blocks are kernels, every other op its own kernel); fuse=False compiles every op as its own
    kernel, kernel blocks inlined (the "unfused" baseline of `eqfuse bench`).

    grad=["w1", "b1", ...] differentiates the first graph, whose first result must be a scalar
    loss: its call returns (loss, *other results, *gradients in the order of grad=). The joint
    forward + backward graph (eqfuse.grad) is built at concrete dimensions: now when dims= and
    params= bind them all, else at the first call of each new binding.

    A batch dimension (a named dim every sample along which is computed on its own, leading
    every tensor that holds it: eqfuse.ir.separable) left unbound by dims= and params= takes any
    value without compiling again: the graph is compiled once for a few sizes of it and a call
    runs on chunks of those (eqfuse.runtime.buckets). buckets={"B": [1, 8, 32]} chooses the
    sizes (and compiles them now when the other dims are known); the default is the first call's
    batch rounded up to a power of two and the powers of four below it. buckets={} compiles each
    new binding instead.

    live="past" (with dims= binding past to a capacity C): the model is a decoder step whose past
    inputs concatenate along `past` (docs/generation.md). Each past input becomes a cache buffer
    of its present's shape, appended to in place and returned as the present, and the model takes
    one more input, `past_length` (i64[1]), the live rows at run time (0 .. C): the attentions over
    the cache read only the live rows and the new ones (eqfuse.ir.live, eqfuse.backend.live).
    """
    opts = Options.of(cost, rules, disable, dims, params, threads, verify, fuse, check_rules, grad, buckets, precision,
                      live)
    if opts.fuse is True:
        check_rule_files(opts.rules, enabled=opts.check_rules)
    return compile_model(src, opts)


@contextlib.contextmanager
def objects_before_frozen():
    """Python's collector ignores the objects that existed before the compile, while it runs
    (gc.freeze, then gc.unfreeze): a compile makes many small objects, each hundred thousand of
    which triggered a full collection that walked every object of the process. With torch and
    transformers imported, those full collections were two thirds of BERT-base's warm compile
    (`gc.callbacks` timing, benchmarks/bench_models.py --model bert-base --compile-only). Nothing
    is lost: the compile's own garbage is still collected, the older objects' after it. Left
    alone when the process has frozen objects of its own (a server that froze them before a fork)
    and inside a compile already doing this (a padded model's buckets)."""
    import gc

    with _FREEZE_LOCK:
        if _FROZEN[0] == 0:
            _FROZEN[1] = gc.isenabled() and gc.get_freeze_count() == 0
            if _FROZEN[1]:
                gc.freeze()
        _FROZEN[0] += 1
    try:
        yield
    finally:
        with _FREEZE_LOCK:
            _FROZEN[0] -= 1
            if _FROZEN[0] == 0 and _FROZEN[1]:
                gc.unfreeze()
                _FROZEN[1] = False


# compiles in progress (of any thread: the first freezes, the last unfreezes), and whether the
# first froze
_FROZEN: list = [0, False]
_FREEZE_LOCK = threading.Lock()


def compile_model(src, opts: Options, shared: SharedArrays | None = None) -> Module:
    """The stages for checked options; `shared` is set when this compile is one bucket of a
    padded model (its weights and their panels are the other buckets')."""
    with objects_before_frozen():
        return stages(src, opts, shared)


def stages(src, opts: Options, shared: SharedArrays | None = None) -> Module:
    """compile_model's body."""
    try:
        with shared.importing if shared is not None else contextlib.nullcontext():
            loaded = load(src, opts, shared)
    except DimsNeeded as e:  # an ONNX model with named dims only bound per call: compiled per bucket of them
        if opts.grad is not None or opts.live is not None:  # (live=: every dim is bound by dims=)
            raise
        return padded_module(src, opts, sums=e.sums, needs=e)
    graphs, params = loaded.graphs, loaded.params
    if opts.live is not None:
        graphs = [live_graph(graphs[0], src, opts.live, opts.dims, opts.pick, params, opts.live_new)] + graphs[1:]
    if not is_onnx(src):
        graphs = [bind_sums(g, opts.dims) for g in graphs]
    # an ONNX model whose import keeps a dim that is not a batch dim by its name (a decoder's
    # sequence with its batch bound) takes it per call as buckets= would have it: at run time or padded
    buckets = opts.buckets
    if is_onnx(src) and buckets is None and opts.live is None and opts.grad is None and len(graphs) == 1:
        why = batch_dims(graphs[0], params_of(graphs[0], params))[1]
        lead = {t.shape[0] for _, t in graphs[0].params if t.shape}  # (a batch: compiled per value, as before)
        buckets = {d: pad_sizes(16) for d in graphs[0].dims() if d not in opts.dims and d not in lead and why.get(d)} \
            or None
    if opts.grad is None and padded_dims(graphs, buckets, opts.dims, params) and opts.live is None:
        g = graphs[0]
        known = bind(g, params_of(g, params), opts.dims)
        if is_onnx(src):  # (the dims its import bound, the batch: each bucket's import binds them again)
            known = {**opts.dims, **known}
        return padded_module(src, replace(opts, dims=known, buckets=buckets), graph=g,
                             weights=params_of(g, params) if is_onnx(src) else None)
    check_buckets(graphs, opts.buckets, opts.dims, params)
    functions, reports, optimized = [], {}, []
    for g in graphs:
        gp = params_of(g, params)
        gdims = bind(g, gp, opts.dims)
        if opts.grad is not None and g is graphs[0]:
            joint = differentiate(g, opts.grad, gdims)
            if joint is None:  # dimensions still unbound: built per binding at the first call
                functions.append(lazy_grad(g, gp, gdims, opts))
                reports[g.name] = {"optimized": False, "reason": "grad=: differentiated and compiled at the first call"}
                continue
            g = joint
        function, report, opt = compile_graph(g, gp, gdims, opts, shared)
        reports[g.name] = report
        optimized.append((opt, gdims))
        functions.append(function)

    def text() -> str:
        return module_text([bind_dims(o, d) if d else o for o, d in optimized])

    report = reports[graphs[0].name] if len(graphs) == 1 else reports
    if is_onnx(src) and shared is None:
        give_back_memory()  # the import's freed memory (a padded model's first call trims once)
    return Module(functions, report, text, opts.precision)


def bind_sums(g: Graph, dims: Mapping[str, int]) -> Graph:
    """g with the dims dims= binds made numbers when a concat of g sums named dims (a .g decode
    step's past + new rows: frontend.builder gave that concat its bound length): the optimizer
    needs every type to agree with its operands'."""
    def sums(n: Node) -> bool:
        ax = n.attr["axis"] % n.type.rank
        return any(isinstance(g.nodes[a].type.shape[ax], str) for a in n.args)

    if not any(n.op == "concat" and sums(n) for n in g.nodes):
        return g
    return bind_dims(g, {k: int(v) for k, v in dims.items() if k in g.dims()})


def length_input(live: str) -> str:
    """The name of the input that holds the run-time length of dim `live` (compile's live=)."""
    return f"{live}_length"


def live_graph(g: Graph, src, live: str, dims: Mapping[str, int], pick: str | None = None,
               params: Mapping[str, np.ndarray] | None = None, new: str | None = None) -> Graph:
    """The first graph with its inputs along dim `live` made cache buffers (eqfuse.ir.live); with
    `pick`, its first result cut to the one row along its second axis that input `pick` gives at
    run time (eqfuse.ir.live.pick_row: a decoder's logits, one per sequence). When no input along
    `live` is appended to, the dim is taken at run time by the loops instead (length_graph): an
    ONNX model's, whose dims are numbers after its import, once `check_onnx_dim` has found that the
    capacity's extent marks the dim alone (eqfuse.frontend.onnx_dims; `params`: its bound arrays).
    `new` (Options.live_new) is the dim of the rows a step appends, taken at run time too (one more
    input, its length): found in an ONNX model by the same check, the cache's total rows (the mask's
    dim) following it."""
    if is_onnx(src):
        from eqfuse.frontend.onnx_cache import header

        shapes = {p: s for _, p, s in header(src).inputs}
    else:
        shapes = {n: t.shape for n, t in g.params}
    axes = {n: list(s).index(live) for n, s in shapes.items() if live in s}
    if not axes:
        raise ArgumentError(f"live='{live}': no input of {g.name} has a dimension named {live}")
    if pick is None and not appended(g, axes):
        # no KV cache: a named dim the loops take at run time (eqfuse.backend.runtime_dim)
        if is_onnx(src):
            from eqfuse.frontend.onnx_dims import check_onnx_dim

            check_onnx_dim(src, g, params or {}, live, dims)
        return length_graph(g, length_input(live))
    if new is not None and is_onnx(src):
        from eqfuse.frontend.onnx_dims import check_onnx_dim

        total = [d for d, v in dims.items() if d not in (live, new) and v == dims[live] + dims[new]]
        try:
            times = [v for d, v in dims.items() if d not in (live, new, *total) and v > 1]  # (the batch)
            check_onnx_dim(src, g, params or {}, new, dims, following=total, times=times, whole_windows=True)
        except EqfuseError as e:  # (the model at one more new row does not import: not at run time)
            if isinstance(e, RuntimeDimRefused):
                raise
            raise RuntimeDimRefused(f"live_new='{new}': the model at {new}={dims[new] + 1} does not import "
                                    f"({e.message.splitlines()[0]})") from None
    g = cache_graph(g, axes, length_input(live), dict(dims))
    g = pick_row(g, pick) if pick is not None else g
    return length_graph(g, length_input(new)) if new is not None else g


def compile_graph(g: Graph, params: dict, dims: dict[str, int], opts: Options, shared: SharedArrays | None):
    """(GraphFunction, report, optimized graph) of one graph: fold -> optimize; lower and build
    now when every dim is known, else at the first call of each binding."""
    folded = fold(g, params, opts.fuse, opts.live)
    if shared is not None:
        folded = replace(folded, params=shared.arrays(folded.params))
    with shared.optimizing if shared is not None else contextlib.nullcontext():
        opt, report = optimize(folded.graph, cost=opts.cost, rules=opts.rules, disable=opts.disable, dims=dims,
                               fuse=opts.fuse)
    report["folded"] = folded.notes
    # each kernel's precision and instruction path, filled as its bindings are built (now when
    # every dim is known, else at the first call of each)
    report["precision"] = shared.precision if shared is not None else {}
    if opts.fuse is True:
        batch_dims_report(report, g, params)
    for k in opts.buckets or {}:
        if k in dims and k not in opts.dims:
            raise ArgumentError(f"buckets=: '{k}' is fixed by the arrays params= binds ({k}={dims[k]}); "
                                f"a dimension is either fixed or a batch dim")
    batch = batch_dim(g, dims, opts.buckets, params)
    capacity = int(opts.dims[opts.live]) if opts.live is not None else None  # (the live dim's: lower)
    beside = (opts.live_new, int(opts.dims[opts.live_new])) if opts.live_new is not None else None
    f = GraphFunction(g, opt, folded.params, dims, builder(opts.fuse, frozenset(folded.params), opts.precision,
                                                           report["precision"], opts.live, folded.params,
                                                           capacity, beside),
                      opts.verify, opts.threads, batch, shared.panels if shared is not None else None)
    if all(d in dims for d in g.dims()):
        c = f.compiled(dims)  # everything is known: compile now, so errors show here
        if opts.fuse is True:  # the report counts the kernels the module runs, views apart
            count_kernels(report, g, opt, dims, frozenset(folded.params), opts.precision, after=c.plans)
        return f, report, opt
    if batch and batch[1] and all(d in dims or d == batch[0] for d in g.dims()):
        f.bucketed(dims)  # the buckets are given and the other dims known: compile now
    if opts.fuse is True:
        report["kernels_counted"] = "optimizer"
    return f, report, opt


def lazy_grad(g: Graph, params: dict, dims: dict[str, int], opts: Options) -> LazyGradFunction:
    """grad= with dims unbound: the joint graph compiled per binding at the first call."""
    def compile_text(text: str, params=None) -> Module:
        return compile_model(text, replace(opts, grad=None, dims={}, params=dict(params or {}), buckets=None))

    return LazyGradFunction(g, opts.grad, params, dims, compile_text)


def padded_module(src, opts: Options, graph: Graph | None = None, sums: tuple[str, ...] = (),
                  needs: DimsNeeded | None = None, weights: Mapping[str, np.ndarray] | None = None) -> Module:
    """The model compiled per bucket of its named dims at run time (eqfuse.runtime.padded): an
    ONNX model that imports only with some bound (the leading one stays a batch dim, the others are
    padded), or `graph`, a .g graph whose buckets= name dims that are not batch dims. opts.dims
    holds the dims known now.

    `sums` are named dims a concat adds (a decoder's past + sequence, errors.NamedSum): the
    model's other dims then follow from them (its attention mask's total length), and zeros at
    the end of any of them are not absent positions (they sit between the past and the new
    keys), so every non-batch dim is compiled per value. eqfuse.generate calls such a model at a
    few cache capacities only.

    `needs` is the import's error: raised when the model needs its batch dim bound too (every other
    named dim is), which no bucket would bind (each would import as this one does). `weights`: the
    bound arrays of `graph` when it is an ONNX model's import that kept such a dim by its name."""
    dims, buckets = opts.dims, opts.buckets
    shared = SharedArrays()  # the buckets' equal weights and their panels, held once

    def build_bucket(bucket: dict[str, int], live: str | None = None, pick: str | None = None,
                     live_new: str | None = None) -> Module:
        batch = {k: v for k, v in (buckets or {}).items() if k not in bucket}  # the batch dim's sizes
        return compile_model(src, replace(opts, dims={**dims, **bucket}, live=live, pick=pick, live_new=live_new,
                                          buckets={} if buckets == {} else batch or None), shared)

    if graph is None:
        from eqfuse.frontend.onnx_cache import header
        from eqfuse.frontend.onnx_import import import_with_params

        head = header(src)  # (one parse of the file per process, not kept: BERT-base's is 440 MB)
        check_bucket_values(list(head.dims), buckets)
        inputs = [(name, shape) for _, name, shape in head.inputs]
        batch = next((s[0] for _, s in inputs if s and isinstance(s[0], str) and s[0] not in dims), None)
        f = PaddedFunction(head.name, inputs, dims, batch, buckets or {}, build_bucket,
                           lambda d: import_with_params(src, dims={**dims, **d}))
        if not f.padded and needs is not None:
            if batch is None:
                raise needs
            # every other named dim is bound and the batch must be too (ConvBERT's and WavLM's
            # exports fold it into other dims): the batch is compiled per value
            f = PaddedFunction(head.name, inputs, dims, None, {}, build_bucket,
                               lambda d: import_with_params(src, dims={**dims, **d}))
            f.sizes, f.padding = {}, {batch: f"the model needs it bound ({needs.message.splitlines()[0]})"}
        f.onnx_path = os.fspath(src)  # (eqfuse.generate reads a decoder's position table from it)
    else:
        params = opts.params if weights is None else {**weights, **opts.params}
        inputs = [(n, t.shape) for n, t in graph.params if n not in params]
        batch = next((d for d in batch_dims(graph, params)[0] if d not in dims and d not in buckets), None)
        f = PaddedFunction(graph.name, inputs, dims, batch, buckets, build_bucket, lambda d: (graph, params))
        f.padding = {d: "buckets= does not name it" for d in f.padded if d not in buckets}
        # a padded dim may instead be taken at run time by the loops (eqfuse.backend.runtime_dim):
        # the results' named shapes give its axes, and a capacity must be no fixed extent
        f.results = [tuple(t.shape) for t in graph.result_types]
        f.extents = fixed_extents(graph)
    if buckets == {}:  # buckets={}: every binding compiled on its own, no padding
        f.sizes, f.padding = {}, {d: "buckets={}" for d in f.padded}
    elif sums:
        why = f"the model concatenates along {', '.join(sums)}"
        f.padding = {d: why for d in f.padded if d not in f.padding}
    return Module([f], {"optimized": False, "reason": f"{', '.join(f.padded)} bound per call: compiled per "
                        "bucket at the first call", "precision": shared.precision}, lambda: f.last_module.graph if f.last_module else "")


# ---------------------------------------------------------------- the stages for other drivers


def reference(src) -> Reference:
    """The pure-numpy oracle of the unoptimized model (eqfuse.reference)."""
    return Reference(load_graphs(src))


def uops_text(src, dims: Mapping[str, int] | None = None, graph: str | None = None, uops: bool = True,
              precision: str = "f32", live: str | None = None, **opts) -> str:
    """Every kernel's plan and, with `uops`, its tile-level schedule (`eqfuse lower [--uops]`);
    `live` as compile's live= (`eqfuse lower --live past`)."""
    check_precision(precision)
    out = []
    # as compile does: an ONNX model imported at the dims (its shape arithmetic needs them) and
    # its initializers folded, so the plans are the ones a compiled model runs
    graphs, weights = load_with_weights(src, dims)
    if live is not None:
        graphs = [live_graph(graphs[0], src, live, dims or {}, params=params_of(graphs[0], weights))] + graphs[1:]
    if not is_onnx(src):
        graphs = [bind_sums(g, dims or {}) for g in graphs]
    for g in graphs:
        if graph is not None and g.name != graph:
            continue
        gd = {k: v for k, v in (dims or {}).items() if k in g.dims()}
        missing = [d for d in g.dims() if d not in gd]
        if missing:
            raise EqfuseError(f"graph {g.name} has unbound dimension{'s' * (len(missing) > 1)} "
                              f"{', '.join(missing)}; bind with --dim NAME=INT")
        folded = fold(g, params_of(g, weights), opts.get("fuse", True), live)
        opt, _ = optimize(folded.graph, dims=gd, **opts)
        _, kg, plans = lower(opt, gd, params=frozenset(folded.params), precision=precision, live=live,
                             arrays=folded.params, capacity=None if live is None else (dims or {}).get(live))
        out.append(f"# graph {g.name}: {running(plans)[0]} kernels\n" + format_uops(plans, uops))
    return "\n\n".join(out)
