"""`eqfuse.compile`: the whole pipeline, top to bottom.

    load -> bind params and dims -> fold constants -> optimize -> (per dims binding) lower -> emit
         -> build C -> Module
"""

from __future__ import annotations

import contextlib
import os
from contextvars import ContextVar
from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np

from eqfuse import progress
from eqfuse.backend.lower import format_uops, lower_graph
from eqfuse.errors import ArgumentError, DimsNeeded, EqfuseError
from eqfuse.frontend.load import load, load_with_weights
from eqfuse.ir.graph import Graph, bind_dims, oversized
from eqfuse.ir.printer import kernel_text, module_text
from eqfuse.ir.reference import bind_arrays
from eqfuse.optimizer.fold import Folded, fold_params
from eqfuse.runtime.module import Compiled, GraphFunction, Kernel, Module
from eqfuse.runtime.program import SharedArrays, give_back_memory

# The arrays and panels that the compiles of one padded model's buckets share (_padded_module)
_SHARED: ContextVar[SharedArrays | None] = ContextVar("eqfuse_shared_arrays", default=None)


def compile(src: str | os.PathLike, cost: str = "memory", rules: Sequence = (), disable: Sequence[str] = (),
            dims: Mapping[str, int] | None = None, params: Mapping[str, np.ndarray] | None = None,
            threads: int | None = None, verify: bool = False, fuse: bool | str = True,
            check_rules: bool = True, grad: Sequence[str] | None = None,
            buckets: Mapping[str, Sequence[int]] | None = None) -> Module:
    """Compile every graph of a model to C kernels (README: "Compiling to C").

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
    """
    if fuse not in FUSE_MODES:
        raise ArgumentError(f"fuse= expects True, False or \"manual\", got {fuse!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ArgumentError(f"threads= expects a positive integer, got {threads!r}")
    if fuse is True:
        from eqfuse.optimizer.rulecheck import check_rule_files

        check_rule_files(rules, enabled=check_rules)
    shared = _SHARED.get()  # set when this compile is one bucket of a padded model
    if is_onnx(src):
        # an ONNX model's dims are bound at import (its shape arithmetic folds with them): checked
        # against the named dims of its inputs first
        from eqfuse.frontend.onnx_import import input_dims

        if dims and shared is None:  # (a padded model's bucket: checked by its first compile)
            _check_dim_values(input_dims(src), dims)
        try:
            graphs, weights = load_with_weights(src, dims)
        except DimsNeeded:  # some named dims only bound: compiled per bucket of them, at the first call
            if grad is not None:
                raise
            return _padded_module(src, dict(dims or {}), buckets, _opts(locals()))
        _check_dims(graphs, {k: v for k, v in (dims or {}).items() if k in {d for g in graphs for d in g.dims()}})
    else:
        graphs, weights = load(src), {}
        _check_dims(graphs, dims)
    params = {**weights, **(params or {})}
    if shared is not None:  # a bucket of a padded model: the weights an earlier bucket holds
        params = shared.arrays(params)
    _check_param_names(graphs, params)
    if grad is None and not is_onnx(src) and _padded_dims(graphs, buckets, dims, params):
        g = graphs[0]
        fixed = _bind_params(g, {k: v for k, v in params.items() if k in dict(g.params)}, dict(dims or {}))
        return _padded_module(src, fixed, buckets, _opts(locals()), graph=g)
    _check_buckets(graphs, buckets, dims, params)
    functions, reports, optimized = [], {}, []
    for g in graphs:
        gp = {k: v for k, v in params.items() if k in dict(g.params)}
        gdims = {k: v for k, v in (dims or {}).items() if k in g.dims()}
        gdims = _bind_params(g, gp, gdims)
        if grad is not None and g is graphs[0]:
            from eqfuse.grad.api import differentiate

            g = differentiate(g, grad, gdims)
            if g is None:  # dimensions still unbound: built per binding at the first call
                functions.append(_lazy_grad(graphs[0], grad, gp, gdims, cost=cost, rules=rules, disable=disable,
                                            threads=threads, verify=verify, fuse=fuse, check_rules=False))
                reports[graphs[0].name] = {"optimized": False, "reason": "grad=: differentiated and compiled at the first call"}
                continue
        folded = _fold(g, gp, fuse)
        if shared is not None:
            folded = replace(folded, params=shared.arrays(folded.params))
        with shared.optimizing if shared is not None else contextlib.nullcontext():
            opt, report = optimize(folded.graph, cost=cost, rules=rules, disable=disable, dims=gdims, fuse=fuse)
        report["folded"] = folded.notes
        if fuse is True:
            from eqfuse.optimizer.optimize import batch_dims_report

            batch_dims_report(report, g, gp)
        reports[g.name] = report
        optimized.append((opt, gdims))
        for k in buckets or {}:
            if k in gdims and k not in (dims or {}):
                raise ArgumentError(f"buckets=: '{k}' is fixed by the arrays params= binds ({k}={gdims[k]}); "
                                    f"a dimension is either fixed or a batch dim")
        batch = batch_dim(g, gdims, buckets, gp)
        f = GraphFunction(g, opt, folded.params, gdims, _builder(fuse, frozenset(folded.params)), verify, threads,
                          batch, shared.panels if shared is not None else None)
        if all(d in gdims for d in g.dims()):
            f.compiled(gdims)  # everything is known: compile now, so errors show here
        elif batch and batch[1] and all(d in gdims or d == batch[0] for d in g.dims()):
            f.bucketed(gdims)  # the buckets are given and the other dims known: compile now
        functions.append(f)

    def text() -> str:
        return module_text([bind_dims(o, d) if d else o for o, d in optimized])

    report = reports[graphs[0].name] if len(graphs) == 1 else reports
    if is_onnx(src) and shared is None:
        give_back_memory()  # the import's freed memory (a padded model's first call trims once)
    return Module(functions, report, text)


def _fold(g: Graph, params: dict, fuse) -> Folded:
    """The bound params folded into the graph (only when the optimizer fuses: fuse=True)."""
    return fold_params(g, params) if fuse is True else Folded(g, params, [])


def _opts(args: Mapping[str, Any]) -> dict[str, Any]:
    """compile()'s options that a per-bucket compile repeats (its dims= and buckets= are its own)."""
    return {k: args[k] for k in ("cost", "rules", "disable", "params", "threads", "verify", "fuse")} | {"check_rules": False}


def _padded_module(src, dims: dict[str, int], buckets, opts, graph: Graph | None = None) -> Module:
    """The model compiled per bucket of its named dims at run time (eqfuse.runtime.padded): an
    ONNX model that imports only with some bound (the leading one stays a batch dim, the others are
    padded), or `graph`, a .g graph whose buckets= name dims that are not batch dims."""
    from eqfuse.runtime.padded import PaddedFunction

    shared = SharedArrays()  # the buckets' equal weights and their panels, held once

    def build(bucket: dict[str, int]) -> Module:
        batch = {k: v for k, v in (buckets or {}).items() if k not in bucket}  # the batch dim's sizes
        token = _SHARED.set(shared)
        try:
            return compile(src, dims={**dims, **bucket}, buckets={} if buckets == {} else batch or None, **opts)
        finally:
            _SHARED.reset(token)

    if graph is None:
        from eqfuse.frontend.onnx_import import import_with_params
        from eqfuse.frontend.onnx_inputs import (
            graph_name,
            input_dims,
            input_shapes,
            load_model,
        )

        proto = load_model(src)  # read once here (not kept: BERT-base's is 440 MB)
        _check_bucket_values(input_dims(proto), buckets)
        inputs = [(name, shape) for _, name, shape in input_shapes(proto)]
        batch = next((s[0] for _, s in inputs if s and isinstance(s[0], str) and s[0] not in dims), None)
        f = PaddedFunction(graph_name(proto), inputs, dims, batch, buckets or {}, build,
                           lambda d: import_with_params(src, dims={**dims, **d}))
        del proto
    else:
        from eqfuse.ir.separable import batch_dims

        params = opts["params"] or {}
        inputs = [(n, t.shape) for n, t in graph.params if n not in params]
        batch = next((d for d in batch_dims(graph, params)[0] if d not in dims and d not in buckets), None)
        f = PaddedFunction(graph.name, inputs, dims, batch, buckets, build, lambda d: (graph, params))
        f.padding = {d: "buckets= does not name it" for d in f.padded if d not in buckets}
    if buckets == {}:  # buckets={}: every binding compiled on its own, no padding
        f.sizes, f.padding = {}, {d: "buckets={}" for d in f.padded}
    return Module([f], {"optimized": False, "reason": f"{', '.join(f.padded)} bound per call: compiled per "
                        "bucket at the first call"}, lambda: f.last_module.graph if f.last_module else "")


def _padded_dims(graphs: list[Graph], buckets, dims, params) -> list[str]:
    """The dims that buckets= names and that are not batch dims, of a one-graph .g model (padded at
    run time: eqfuse.runtime.padded); a multi-graph model's are refused by _check_buckets."""
    if not buckets or len(graphs) != 1:
        return []
    from eqfuse.ir.separable import batch_dims

    _check_bucket_values(graphs[0].dims(), buckets)
    why = batch_dims(graphs[0], params)[1]
    return [k for k in buckets if why.get(k) and k not in (dims or {})]


def _lazy_grad(g: Graph, grad, params, dims, **opts):
    from eqfuse.grad.api import LazyGradFunction

    return LazyGradFunction(g, grad, params, dims, lambda text, **kw: compile(text, **opts, **kw))


def is_onnx(src) -> bool:
    return isinstance(src, (str, os.PathLike)) and str(src).endswith(".onnx") and "\n" not in str(src)


def _onnx_weights(src, dims=None) -> dict[str, np.ndarray]:
    """An .onnx model's initializers, bound as params by default (the user's params= win); `dims`
    as the model was imported with."""
    if is_onnx(src):
        from eqfuse.frontend.onnx_import import onnx_params

        return onnx_params(src, dims=dims or None)
    return {}


model_weights = _onnx_weights  # what the command line binds too (run, bench, opt)


def input_aliases(src, dims=None) -> dict[str, str]:
    """{parameter name: the model's own input name} where they differ (ONNX names such as
    "input.1" are sanitized into parameter names); empty for .g models. `dims` as the model is
    imported with."""
    if not is_onnx(src):
        return {}
    from eqfuse.frontend.onnx_import import import_model

    imp = import_model(src, dims=dims or None)
    return {imp.graph.nodes[i].name: onnx for i, onnx in zip(imp.graph.inputs, imp.inputs)}


def _check_param_names(graphs: list[Graph], params: Mapping[str, Any]) -> None:
    names = {n for g in graphs for n, _ in g.params}
    for k in params:
        if k not in names:
            raise ArgumentError(f"params= names '{k}', which is not a parameter (parameters: {', '.join(sorted(names))})")


def _check_dims(graphs: list[Graph], dims: Mapping[str, int] | None) -> None:
    """dims= as strict as --dim: a known dimension name, a positive integer."""
    _check_dim_values(list(dict.fromkeys(d for g in graphs for d in g.dims())), dims)
    for g in graphs:
        why = oversized(g, {k: int(v) for k, v in (dims or {}).items()})
        if why:
            raise ArgumentError(f"dims=: {why}")


def _check_dim_values(names: list[str], dims: Mapping[str, int] | None) -> None:
    """Each dims= entry names one of `names` and is a positive integer."""
    for k, v in (dims or {}).items():
        if k not in names:
            raise ArgumentError(f"dims= names '{k}', which is not a dimension of the model "
                                f"(its named dimensions: {', '.join(names) or 'none'})")
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise ArgumentError(f"dims=: '{k}' expects a positive integer, got {v!r}")


def batch_dim(g: Graph, dims: Mapping[str, int], buckets, params=None) -> tuple[str, list[int] | None] | None:
    """(the graph's run-time batch dim, its bucket sizes or None for the default), or None."""
    from eqfuse.ir.separable import batch_dims

    free = [d for d in batch_dims(g, params)[0] if d not in dims]
    if buckets is None:
        return (free[0], None) if free else None
    chosen = [d for d in free if d in buckets]
    return (chosen[0], sorted({int(v) for v in buckets[chosen[0]]})) if chosen else None


def _check_buckets(graphs: list[Graph], buckets, dims, params) -> None:
    """buckets= names batch dims of the model, each with a list of positive sizes."""
    if buckets is None:
        return
    from eqfuse.ir.separable import batch_dims

    _check_bucket_values(list(dict.fromkeys(d for g in graphs for d in g.dims())), buckets)
    for k in buckets:
        if k in (dims or {}):
            raise ArgumentError(f"buckets=: '{k}' is bound by dims=; a dimension is either fixed or a batch dim")
        for g in graphs:
            why = batch_dims(g, params)[1].get(k)
            if why:
                raise ArgumentError(f"buckets=: '{k}' is not a batch dimension of graph {g.name}: {why}")
    if len([k for k in buckets]) > 1:
        raise ArgumentError(f"buckets=: one batch dimension at a time, got {', '.join(buckets)}")


def _check_bucket_values(names: list[str], buckets) -> None:
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


def _bind_params(g: Graph, params: Mapping[str, np.ndarray], dims: dict[str, int]) -> dict[str, int]:
    """Check bound arrays against their parameters; the dims they fix join `dims`."""
    if not params:
        return dims
    names = [n for n, _ in g.params]
    sub = Graph(g.name, list(g.nodes), [i for i, n in zip(g.inputs, names) if n in params], [])
    arrays = [params[n] for n in names if n in params]
    for n, a in zip([n for n in names if n in params], arrays):
        if not isinstance(a, np.ndarray):
            raise ArgumentError(f"params=: '{n}' expects a numpy array, got {type(a).__name__}")
    return bind_arrays(sub, arrays, dims)


FUSE_MODES = (True, False, "manual")


def optimize(g: Graph, cost="memory", rules=(), disable=(), dims=None, fuse: bool | str = True) -> tuple[Graph, Any]:
    """The optimizer's fused graph; the graph as written for fuse=False or fuse="manual"."""
    if fuse is False:
        return g, {"optimized": False, "reason": "fuse=False: every op is its own kernel"}
    if fuse == "manual":
        return g, {"optimized": False, "reason": "fuse=\"manual\": kernel blocks as written"}
    from eqfuse.optimizer.optimize import (
        optimize_graph,  # (it imports this module's siblings)
    )
    with progress.step(f"optimizing {g.name}"):
        res = optimize_graph(g, cost=cost, rules=rules, disable=disable, dims=dims or None)
    return res.graph, res.report


def lower(g: Graph, dims: Mapping[str, int], fuse: bool | str = True, params: frozenset[str] = frozenset()):
    """(kernelized graph, plans) for one dims binding; `params` names the inputs bound by params=
    (a GEMM prepacks such a B operand once)."""
    bound = bind_dims(g, dims) if g.dims() else g
    return bound, *lower_graph(bound, fuse=fuse is not False, params=params)


def _builder(fuse: bool, params: frozenset[str] = frozenset()):
    def build(g: Graph, bindings: list[dict], names: list[str] | None = None, panels=None) -> list[Compiled]:
        """One Compiled per dims binding, all in one C module (one compiler run); `names`
        renames the graph per binding, so that their kernels and run functions differ."""
        from eqfuse.backend.cbuild import build as build_c
        from eqfuse.backend.emit import emit_graph
        from eqfuse.runtime.program import emit_run, plan_memory

        lowered = []
        for k, dims in enumerate(bindings):
            gk = replace(g, name=names[k]) if names else g
            bound, kg, plans = lower(gk, dims, fuse, params)
            lowered.append((bound, kg, plans, plan_memory(kg, plans)))
        emitted = emit_graph([p for _, _, plans, _ in lowered for p in plans], share=True)
        lib = ffi = None
        if emitted.kernel_sources:
            # one entry point per graph: every kernel is called from C (eqfuse.runtime.program)
            runs = [emit_run(kg, plans, memory, emitted.symbol) for _, kg, plans, memory in lowered
                    if any(p.kind != "view" for p in plans)]
            unique = len(emitted.kernel_sources) - len(emitted.alias)
            with progress.step(f"compiling {unique} kernels of {g.name}"):
                built = build_c("\n".join([emitted.source] + [c for c, _ in runs]),
                                "\n".join([emitted.cdef] + [d for _, d in runs]), f"eqf_{g.name}")
            lib, ffi = built.lib, built.ffi
        return [Compiled(bound, kg, plans, lib, ffi, kernel_infos(kg, plans, emitted.kernel_sources, g.name), memory,
                         panels, emitted.alias)
                for bound, kg, plans, memory in lowered]
    return build


def kernel_infos(kg: Graph, plans, sources: Mapping[str, str], graph: str | None = None) -> list[Kernel]:
    """What mod.kernels shows of each plan; `graph` names the user's graph (kg's name may carry a
    batch bucket's suffix)."""
    names = {i: (n.name or f"t{i}") for i, n in enumerate(kg.nodes)}
    taken = set(names.values())
    out = []
    for p in plans:
        body = kernel_text(kg.nodes[p.node], names, set(taken), indent="")
        out.append(Kernel(p.name, p.kind, body, sources.get(p.name, ""), p.bytes, p.flops, dict(p.tiles),
                          graph or kg.name))
    return out


def uops_text(src, dims: Mapping[str, int] | None = None, graph: str | None = None, uops: bool = True,
              **opts) -> str:
    """Every kernel's plan and, with `uops`, its tile-level schedule (`eqfuse lower [--uops]`)."""
    out = []
    # as compile does: an ONNX model imported at the dims (its shape arithmetic needs them) and
    # its initializers folded, so the plans are the ones a compiled model runs
    graphs, weights = load_with_weights(src, dims)
    for g in graphs:
        if graph is not None and g.name != graph:
            continue
        gd = {k: v for k, v in (dims or {}).items() if k in g.dims()}
        missing = [d for d in g.dims() if d not in gd]
        if missing:
            raise EqfuseError(f"graph {g.name} has unbound dimension{'s' * (len(missing) > 1)} "
                              f"{', '.join(missing)}; bind with --dim NAME=INT")
        folded = _fold(g, {k: v for k, v in weights.items() if k in dict(g.params)}, opts.get("fuse", True))
        opt, _ = optimize(folded.graph, dims=gd, **opts)
        _, kg, plans = lower(opt, gd, params=frozenset(folded.params))
        out.append(f"# graph {g.name}: {len([p for p in plans if p.kind != 'view'])} kernels\n" + format_uops(plans, uops))
    return "\n\n".join(out)


__all__ = ["compile", "optimize", "lower", "uops_text"]
