"""`eqfuse opt MODEL`: print the fused graph (kernel blocks) and the optimization report."""

from __future__ import annotations

import json
import sys

from eqfuse.cli.args import UsageError
from eqfuse.cli.common import optimizer_opts, selected_graphs
from eqfuse.errors import EqfuseError


def cmd_opt(args) -> int:
    from eqfuse import progress
    from eqfuse.ir.printer import module_text
    from eqfuse.optimizer.optimize import optimize_graph, optimize_graphs, report_text

    for flag, v in (("--iter-limit", args.iter_limit), ("--node-limit", args.node_limit),
                    ("--time-limit", args.time_limit)):
        if v is not None and v <= 0:
            raise UsageError(f"{flag} expects a positive number, got {v}")
    from eqfuse.frontend.load import model_weights
    from eqfuse.machine import machine
    from eqfuse.optimizer.fold import fold_params

    graphs, dims = selected_graphs(args)
    opts = optimizer_opts(args)  # user rules checked first
    precision = opts.pop("precision")  # (decides the kernels, not the fusion: recorded in the report)
    weights = model_weights(args.model, dims)  # an .onnx model's initializers are bound, as compile binds them
    source = graphs
    folded = [fold_params(g, {k: v for k, v in weights.items() if k in dict(g.params)}) for g in graphs]
    graphs = [f.graph for f in folded]
    opts.update(iter_limit=args.iter_limit, node_limit=args.node_limit, time_limit=args.time_limit,
                machine=machine())  # (the planner's: read once here, passed down to extraction)
    if len(graphs) == 1:  # one graph: the progress line follows its saturation
        with progress.step(f"optimizing {graphs[0].name}") as line:
            results = [optimize_graph(graphs[0], dims={k: v for k, v in dims.items() if k in graphs[0].dims()},
                                      progress=saturation_line(line), **opts)]
    else:  # several: each alone, so that each report describes its graph alone (eqfuse/optimizer/optimize.py)
        with progress.step(f"optimizing {len(graphs)} graphs") as line:
            results = optimize_graphs(graphs, dims=dims, before_each=lambda i: line.update(
                f"graph {i + 1} of {len(graphs)}: {graphs[i].name}"), **opts)
    from eqfuse.optimizer.optimize import batch_dims_report
    from eqfuse.pipeline import count_kernels

    for r, f, g in zip(results, folded, source):
        r.report["folded"] = f.notes
        # the kernels that run, views apart, as compile lowers them (every dim bound), else the
        # optimizer's count (docs/optimizing.md, "Kernel counts")
        count_kernels(r.report, g, r.graph, {k: v for k, v in dims.items() if k in g.dims()},
                      frozenset(f.params), precision)
        if precision != "f32":  # (the report's key when eqfuse.compile gives it: its kernels' precision)
            r.report["precision_requested"] = precision
        batch_dims_report(r.report, g, weights)
    text = module_text([r.graph for r in results])
    if args.output:
        try:
            with open(args.output, "w") as f:
                f.write(text)
        except OSError as e:
            raise EqfuseError(f"{args.output}: cannot write ({e.strerror})") from None
    if args.dot:
        _write_dot(args.dot, results)
    if args.onnx_out:
        _write_onnx(args.onnx_out, results, folded, dims, weights, precision)
    if args.report == "json":
        # one graph: its report (README: "Optimizing: `eqfuse opt`"); several: {graph name: report}, the shape of mod.report
        reports = {r.report["graph_name"]: r.report for r in results}
        json.dump(results[0].report if len(results) == 1 else reports, sys.stdout, indent=2)
        print()
        return 0
    if not args.output:
        sys.stdout.write(text)
    print()
    if args.explain:
        from eqfuse.optimizer.explain import explain_text

        print("\n\n".join(report_text(r.report) + "\n" + explain_text(r.report) for r in results))
    else:
        print("\n\n".join(report_text(r.report) for r in results))
    return 0


def saturation_line(line):
    """The progress line while the e-graph saturates: rounds, e-nodes, elapsed seconds."""
    return lambda st: line.update(f"saturating, iteration {st.iterations}, {st.egraph_nodes} e-nodes")


def _write_onnx(path: str, results, folded, dims, weights, precision) -> None:
    """The one optimized graph as ONNX, each kernel a local function (eqfuse/cli/onnx_out.py)."""
    from eqfuse.cli.onnx_out import onnx_model, write

    if len(results) != 1:
        raise UsageError(f"--onnx-out writes one graph; the model has {len(results)}: choose one with --graph NAME")
    g, f = results[0].graph, folded[0]
    write(path, onnx_model(g, {k: v for k, v in dims.items() if k in g.dims()}, frozenset(f.params),
                           {k: weights[k] for k in f.params if k in weights}, precision))


def _write_dot(path: str, results) -> None:
    """The fused graph as Graphviz: one box per kernel (its body as the label), edges = tensors."""
    lines = ["digraph eqfuse {", "  rankdir=TB; node [fontname=monospace, fontsize=10];"]
    from eqfuse.ir.printer import kernel_text

    for r in results:
        g = r.graph
        names = {i: g.nodes[i].name or f"t{i}" for i in range(len(g.nodes))}
        lines.append(f'  subgraph "cluster_{g.name}" {{ label="{g.name}";')
        for i, n in enumerate(g.nodes):
            nid = f'"{g.name}_{i}"'
            if n.op == "input":
                lines.append(f'    {nid} [shape=ellipse, label="{n.name}: {n.type}"];')
            elif n.op == "const":
                lines.append(f'    {nid} [shape=plaintext, label="{n.value}"];')
            else:
                body = kernel_text(n, names, set(names.values()), indent="").replace('"', '\\"')
                lines.append(f'    {nid} [shape=box, label="{names[i]} = {body}\\l"];'.replace("\n", "\\l"))
            for a in n.args:
                lines.append(f'    "{g.name}_{a}" -> {nid};')
        lines.append("  }")
    lines.append("}")
    try:
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
    except OSError as e:
        raise EqfuseError(f"{path}: cannot write ({e.strerror})") from None
