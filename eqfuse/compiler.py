"""`eqfuse.compile`: the whole pipeline, top to bottom.

    load -> bind params and dims -> fold constants -> optimize -> (per dims binding) lower -> emit
         -> build C -> Module
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np

from eqfuse import progress
from eqfuse.backend.lower import format_uops, lower_graph
from eqfuse.errors import ArgumentError, EqfuseError
from eqfuse.frontend.load import load
from eqfuse.ir.graph import Graph, bind_dims, oversized
from eqfuse.ir.printer import kernel_text, module_text
from eqfuse.ir.reference import bind_arrays
from eqfuse.optimizer.fold import Folded, fold_params
from eqfuse.runtime.module import Compiled, GraphFunction, Kernel, Module


def compile(src: str | os.PathLike, cost: str = "memory", rules: Sequence = (), disable: Sequence[str] = (),
            dims: Mapping[str, int] | None = None, params: Mapping[str, np.ndarray] | None = None,
            threads: int | None = None, verify: bool = False, fuse: bool | str = True,
            check_rules: bool = True, grad: Sequence[str] | None = None) -> Module:
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
    """
    if fuse not in FUSE_MODES:
        raise ArgumentError(f"fuse= expects True, False or \"manual\", got {fuse!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ArgumentError(f"threads= expects a positive integer, got {threads!r}")
    if fuse is True:
        from eqfuse.optimizer.rulecheck import check_rule_files

        check_rule_files(rules, enabled=check_rules)
    graphs = load(src)
    params = {**_onnx_weights(src), **(params or {})}
    _check_param_names(graphs, params)
    _check_dims(graphs, dims)
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
        folded = fold_params(g, gp) if fuse is True else Folded(g, gp, [])
        opt, report = optimize(folded.graph, cost=cost, rules=rules, disable=disable, dims=gdims, fuse=fuse)
        report["folded"] = folded.notes
        reports[g.name] = report
        optimized.append((opt, gdims))
        f = GraphFunction(g, opt, folded.params, gdims, _builder(fuse, frozenset(folded.params)), verify, threads)
        if all(d in gdims for d in g.dims()):
            f.compiled(gdims)  # everything is known: compile now, so errors show here
        functions.append(f)

    def text() -> str:
        return module_text([bind_dims(o, d) if d else o for o, d in optimized])

    report = reports[graphs[0].name] if len(graphs) == 1 else reports
    return Module(functions, report, text)


def _lazy_grad(g: Graph, grad, params, dims, **opts):
    from eqfuse.grad.api import LazyGradFunction

    return LazyGradFunction(g, grad, params, dims, lambda text, **kw: compile(text, **opts, **kw))


def _is_onnx(src) -> bool:
    return isinstance(src, (str, os.PathLike)) and str(src).endswith(".onnx") and "\n" not in str(src)


def _onnx_weights(src) -> dict[str, np.ndarray]:
    """An .onnx model's initializers, bound as params by default (the user's params= win)."""
    if _is_onnx(src):
        from eqfuse.frontend.onnx_import import onnx_params

        return onnx_params(src)
    return {}


model_weights = _onnx_weights  # what the command line binds too (run, bench, opt)


def input_aliases(src) -> dict[str, str]:
    """{parameter name: the model's own input name} where they differ (ONNX names such as
    "input.1" are sanitized into parameter names); empty for .g models."""
    if not _is_onnx(src):
        return {}
    from eqfuse.frontend.onnx_import import import_model

    imp = import_model(src)
    return {imp.graph.nodes[i].name: onnx for i, onnx in zip(imp.graph.inputs, imp.inputs)}


def _check_param_names(graphs: list[Graph], params: Mapping[str, Any]) -> None:
    names = {n for g in graphs for n, _ in g.params}
    for k in params:
        if k not in names:
            raise ArgumentError(f"params= names '{k}', which is not a parameter (parameters: {', '.join(sorted(names))})")


def _check_dims(graphs: list[Graph], dims: Mapping[str, int] | None) -> None:
    """dims= as strict as --dim: a known dimension name, a positive integer."""
    names = list(dict.fromkeys(d for g in graphs for d in g.dims()))
    for k, v in (dims or {}).items():
        if k not in names:
            raise ArgumentError(f"dims= names '{k}', which is not a dimension of the model "
                                f"(its named dimensions: {', '.join(names) or 'none'})")
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise ArgumentError(f"dims=: '{k}' expects a positive integer, got {v!r}")
    for g in graphs:
        why = oversized(g, {k: int(v) for k, v in (dims or {}).items()})
        if why:
            raise ArgumentError(f"dims=: {why}")


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
    from eqfuse.optimizer.optimize import optimize_graph  # (it imports this module's siblings)
    with progress.step(f"optimizing {g.name}"):
        res = optimize_graph(g, cost=cost, rules=rules, disable=disable, dims=dims or None)
    return res.graph, res.report


def lower(g: Graph, dims: Mapping[str, int], fuse: bool | str = True, params: frozenset[str] = frozenset()):
    """(kernelized graph, plans) for one dims binding; `params` names the inputs bound by params=
    (a GEMM prepacks such a B operand once)."""
    bound = bind_dims(g, dims) if g.dims() else g
    return bound, *lower_graph(bound, fuse=fuse is not False, params=params)


def _builder(fuse: bool, params: frozenset[str] = frozenset()):
    def build(g: Graph, dims: dict) -> Compiled:
        from eqfuse.backend.cbuild import build as build_c
        from eqfuse.backend.emit import emit_graph
        from eqfuse.runtime.program import emit_run, plan_memory

        bound, kg, plans = lower(g, dims, fuse, params)
        emitted = emit_graph(plans)
        memory = plan_memory(kg, plans)
        lib = ffi = None
        if emitted.kernel_sources:
            # one entry point for the whole graph: every kernel is called from C (eqfuse.runtime.program)
            run_c, run_cdef = emit_run(kg, plans, memory)
            with progress.step(f"compiling {len(emitted.kernel_sources)} kernels of {g.name}"):
                built = build_c(emitted.source + "\n" + run_c, emitted.cdef + "\n" + run_cdef, f"eqf_{g.name}")
            lib, ffi = built.lib, built.ffi
        return Compiled(bound, kg, plans, lib, ffi, kernel_infos(kg, plans, emitted.kernel_sources), memory)
    return build


def kernel_infos(kg: Graph, plans, sources: Mapping[str, str]) -> list[Kernel]:
    names = {i: (n.name or f"t{i}") for i, n in enumerate(kg.nodes)}
    taken = set(names.values())
    out = []
    for p in plans:
        body = kernel_text(kg.nodes[p.node], names, set(taken), indent="")
        out.append(Kernel(p.name, p.kind, body, sources.get(p.name, ""), p.bytes, p.flops, dict(p.tiles), kg.name))
    return out


def uops_text(src, dims: Mapping[str, int] | None = None, graph: str | None = None, uops: bool = True,
              **opts) -> str:
    """Every kernel's plan and, with `uops`, its tile-level schedule (`eqfuse lower [--uops]`)."""
    out = []
    for g in load(src):
        if graph is not None and g.name != graph:
            continue
        gd = {k: v for k, v in (dims or {}).items() if k in g.dims()}
        missing = [d for d in g.dims() if d not in gd]
        if missing:
            raise EqfuseError(f"graph {g.name} has unbound dimension{'s' * (len(missing) > 1)} "
                              f"{', '.join(missing)}; bind with --dim NAME=INT")
        opt, _ = optimize(g, dims=gd, **opts)
        _, kg, plans = lower(opt, gd)
        out.append(f"# graph {g.name}: {len([p for p in plans if p.kind != 'view'])} kernels\n" + format_uops(plans, uops))
    return "\n\n".join(out)


__all__ = ["compile", "optimize", "lower", "uops_text"]
