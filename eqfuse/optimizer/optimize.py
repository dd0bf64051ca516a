"""The optimizer: a Graph through the e-graph to its cheapest fused form, one graph at a time or many small graphs together.

The optimizer, top to bottom:

    unfuse, fold constants
      -> recognition e-graph: algebra and pattern rules (no kernels) saturate, growing rules in
         bounded rounds -> the smallest term, constants folded (eqfuse.optimizer.egraph, eqfuse.optimizer.simplify)
      -> fusion e-graph: fusion rules to saturation or a limit -> serialize
      -> extract (greedy, then an exact ILP: whole, or region by region on large e-graphs)
      -> rescore every candidate exactly -> fused Graph (kernel blocks) + report

Fusion decisions live in eqfuse/optimizer/rules/fusion.rw; this module only runs the stages. The limits
(iterations, e-nodes, seconds) hold for the whole run: see eqfuse.optimizer.egraph.

Many small graphs, optimized together.

Each optimize_graph call pays a fixed cost (two e-graphs pushed and popped, a few egglog steps,
an ILP call), so a file of thousands of small graphs paid it thousands of times. `optimize_graphs` puts
small graphs side by side into one graph (names prefixed, so nothing is shared but constants),
optimizes that once, and splits the result back. Graphs are independent, so no kernel can join
two of them; each keeps its own parameters, names and outputs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from eqfuse.errors import EqfuseError
from eqfuse.ir.conv_forms import expand_convs
from eqfuse.ir.graph import Graph, retype
from eqfuse.ir.kernels import Split, classify
from eqfuse.ir.printer import graph_text, module_text
from eqfuse.machine import Machine
from eqfuse.optimizer import cost as C
from eqfuse.optimizer import extract as X
from eqfuse.optimizer.egraph import (
    EXTRACT_SECONDS_PER_NODE,
    FUSE,
    EGraph,
    Limits,
    SaturationStats,
    fusion_seconds,
    load_seconds,
    recognize,
    rule_phase,
    run_phase,
)
from eqfuse.optimizer.explain import Joins
from eqfuse.optimizer.layout import sink_reshapes
from eqfuse.optimizer.rules import load_rules
from eqfuse.optimizer.simplify import fold_constants, smallest
from eqfuse.optimizer.wide import cut_wide, stitch


@dataclass
class OptResult:
    graph: Graph
    report: dict
    joins: object = None  # explain.Joins: the fusion e-graph and the e-class of each kernel of graph


def optimize_graph(graph: Graph, *, cost: str = "memory", rules: Sequence = (), disable: Sequence[str] = (),
                   dims: Mapping[str, int] | None = None, iter_limit: int | None = None,
                   node_limit: int | None = None, time_limit: float | None = None,
                   progress=None, machine: Machine | None = None) -> OptResult:
    """Fuse one graph: the fused graph and its report (its keys: README, "Optimizing: `eqfuse opt`").
    A graph optimized before with the same rules, cost model, dims, limits, machine and eqfuse
    comes from the optimized-graph cache (eqfuse.optimizer.graph_cache; report["graph_cache"]
    says "hit", "miss" or "off"; EQFUSE_NO_CACHE=1 turns it off). `machine` is the planner's machine
    model, which the driver reads and passes down: extraction keeps only bodies that classify
    lowers as one kernel on it (a GEMM's row epilogue must fit its L1); None: without that check."""
    from eqfuse.optimizer import graph_cache

    if cost not in C.MODELS:
        raise EqfuseError(f"unknown cost model '{cost}' (known: {', '.join(C.MODELS)})")
    if not graph_cache.enabled():
        r = _optimize_graph(graph, cost=cost, rules=rules, disable=disable, dims=dims, iter_limit=iter_limit,
                            node_limit=node_limit, time_limit=time_limit, progress=progress, machine=machine)
        r.report["graph_cache"] = "off"
        return r
    t0 = time.perf_counter()
    bound = {k: v for k, v in (dims or {}).items() if k in graph.dims()}
    rule_list = cached_rules(tuple(str(r) for r in rules), tuple(disable))
    key = graph_cache.key(graph_text(graph), rule_list, disable, cost, bound, (iter_limit, node_limit, time_limit),
                          C.perf() if cost == "time" else None, machine)
    hit = graph_cache.get(key)
    if hit is not None:
        from eqfuse.frontend.load import load

        text, report = hit
        try:
            (out,) = load(text)
        except (EqfuseError, ValueError):  # an entry this build cannot read back: optimize again
            out = None
        if out is not None:
            seconds = time.perf_counter() - t0
            report = dict(report, graph_name=graph.name, graph_cache="hit", optimize_seconds=seconds,
                          stage_seconds={"graph cache": seconds})
            return OptResult(out, report, None)
    r = _optimize_graph(graph, cost=cost, rules=rules, disable=disable, dims=dims, iter_limit=iter_limit,
                        node_limit=node_limit, time_limit=time_limit, progress=progress, machine=machine)
    r.report["graph_cache"] = "miss"
    if r.report["stop_reason"] != "time_limit" and "time_limit" not in str(r.report.get("ilp")):
        # a result the clock cut short depends on the machine's load: not kept
        graph_cache.put(key, r.report["graph"], r.report)
    return r


def _optimize_graph(graph: Graph, *, cost: str = "memory", rules: Sequence = (), disable: Sequence[str] = (),
                    dims: Mapping[str, int] | None = None, iter_limit: int | None = None,
                    node_limit: int | None = None, time_limit: float | None = None,
                    progress=None, machine: Machine | None = None) -> OptResult:
    """optimize_graph without the cache: the e-graphs and extraction."""
    t0 = time.perf_counter()
    lim = Limits.make(iter_limit, node_limit, time_limit, t0)
    dims = {k: v for k, v in (dims or {}).items() if k in graph.dims()}
    rule_list = cached_rules(tuple(str(r) for r in rules), tuple(disable))
    src0 = src = fold_constants(expand_convs(C.unfused(graph)))  # (conv1d, conv_transpose2d: as conv2d)
    cut = cut_wide(src)  # wide concats stay out of the e-graphs (eqfuse.optimizer.wide)
    if cut:
        src = cut.graph
    perf = C.perf() if cost == "time" else None

    st = SaturationStats()
    stages: dict[str, float] = {}
    mark = [time.perf_counter()]

    def stage(name: str) -> None:  # seconds since the last mark, for the report
        now = time.perf_counter()
        stages[name] = stages.get(name, 0.0) + now - mark[0]
        mark[0] = now

    stage("load")
    pre = [r for r in rule_list if rule_phase(r) != FUSE]
    recognition = {"egraph_nodes": 0, "iterations": 0}
    if pre and lim.left() < load_seconds(src):
        st.stop_reason, st.limit_note = "time_limit", "time limit: no time for the recognition e-graph"
    elif pre:  # the recognition e-graph
        # every rule goes into the e-graph, each phase in its own ruleset, so that the recognition
        # and the fusion e-graph are one egglog program, declared once per process (EGraph)
        eg = EGraph(src, rule_list, phase_of=rule_phase)
        st.skipped_rules.update(eg.skipped)
        stage("recognition e-graph load")
        recognize(eg, st, lim, progress=progress)  # if fusion has no time left after it, its result stands
        stage("recognition")
        recognition = {"egraph_nodes": st.egraph_nodes, "iterations": st.iterations}
        st.iterations = 0  # the iteration limit holds for each e-graph
        if st.rules_fired:
            src = smallest(eg.serialize(), src)
        eg.close()
        stage("smallest term")
    src = sink_reshapes(src)  # exporters' flatten / GEMM / unflatten is one batched GEMM (eqfuse.optimizer.layout)
    if lim.left() < fusion_seconds(src):  # the best so far: every op its own kernel
        st.stop_reason, st.limit_note = "time_limit", "time limit: no time for the fusion e-graph"
        one = stitch(cut, singletons(src), src0) if cut else singletons(src)
        return _report(graph, src0, one, one, "none (time limit)", "", None, st, recognition, stages, cost, dims, t0,
                       disable, lim.deadline)
    eg = EGraph(src, rule_list, phase_of=rule_phase)
    st.skipped_rules.update(eg.skipped)
    stage("fusion e-graph load")
    run_phase(eg, FUSE, st, lim, progress=progress)
    stage("fusion")
    data = eg.serialize()
    eg.close()
    stage("serialize")
    pb = X.build_problem(data, src, cost, dims, perf, machine)
    stage("candidates")

    left = lim.left() - EXTRACT_SECONDS_PER_NODE * data.num_nodes
    ex = X.extract(pb, src, cost, dims, perf, time_limit=max(0.0, min(X.ILP_TIME_LIMIT, left)))
    out, greedy_g = ex.graph, ex.greedy
    joins = Joins(data, ex.classes, ex.enodes)
    if cut:
        ids: dict[int, int] = {}
        out, greedy_g = stitch(cut, out, src0, ids), stitch(cut, greedy_g, src0)
        joins = joins.renumbered(ids)
    stage("extraction")
    return _report(graph, src0, out, greedy_g, ex.how, ex.ilp, data, st, recognition, stages, cost, dims, t0,
                   disable, lim.deadline, joins, machine)


def singletons(g: Graph) -> Graph:
    """Every op its own kernel (what optimizing gives when a limit leaves no time for fusion)."""
    from dataclasses import replace

    from eqfuse.ir.graph import Node

    nodes = list(g.nodes)
    for i, n in enumerate(nodes):
        if n.op in ("input", "const", "kernel"):
            continue
        body = Graph("kernel")
        local = {}
        args = [a for a in dict.fromkeys(n.args) if g.nodes[a].op != "const"]
        for a in dict.fromkeys(n.args):  # a constant is written inside the kernel, as fusion does
            c = g.nodes[a].op == "const"
            local[a] = body.add(replace(g.nodes[a], name=None) if c else
                                Node("input", type=g.nodes[a].type, name=g.nodes[a].name))
            if not c:
                body.inputs.append(local[a])
        body.outputs = [body.add(replace(n, args=tuple(local[a] for a in n.args), name=None))]
        nodes[i] = Node("kernel", tuple(args), (), n.type, name=n.name, pos=n.pos, body=body)
    return Graph(g.name, nodes, list(g.inputs), list(g.outputs), g.pos)


def _report(graph, src0, out, greedy_g, how, ilp, data, st, recognition, stages, cost, dims, t0,
            disable=(), deadline=None, joins=None, machine: Machine | None = None) -> OptResult:
    from eqfuse.optimizer.explain import explain

    check(out)
    before, after = C.graph_kernels(src0, dims), C.graph_kernels(out, dims)
    greedy = C.graph_kernels(greedy_g, dims)
    p = C.perf()
    unbound = [d for d in graph.dims() if d not in dims]
    text = graph_text(out)
    report = {
        "graph_name": graph.name,
        "cost": cost,
        "kernels_before": before.launches - before.views,
        "kernels_after": after.launches - after.views,
        "bytes_before": before.bytes,
        "bytes_after": after.bytes,
        "est_time_before_s": C.graph_value(src0, "time", dims, p),
        "est_time_after_s": C.graph_value(out, "time", dims, p),
        "rules_fired": dict(sorted(st.rules_fired.items())),
        "egraph_nodes": data.num_nodes if data else 0,
        "egraph_classes": data.num_classes if data else 0,
        "iterations": st.iterations,
        "stop_reason": st.stop_reason,
        "extraction": how,
        "ilp": ilp,
        "kernels_greedy": greedy.launches - greedy.views,  # what greedy extraction alone gives
        "bytes_greedy": greedy.bytes,
        "saved_before": C.saved_for_backward(src0, dims),  # bytes kept for the backward pass
        "saved_after": C.saved_for_backward(out, dims),
        "unbound_dims": {d: C.DEFAULT_DIM for d in unbound},
        "batch_dims": _batch_dims(graph, unbound),  # which of them a compiled graph takes at any size
        "skipped_rules": st.skipped_rules,
        "limit": st.limit_note or None,  # e.g. "node limit: 50000 e-nodes, 81% from rule my_assoc"
        "recognition": recognition,  # the recognition e-graph's size and iterations
        "optimize_seconds": time.perf_counter() - t0,
        "stage_seconds": stages,  # where the time went
        "graph": text,
    }
    # why each tensor between two kernels is stored, and what each fused kernel saves (eqfuse.optimizer.explain)
    report.update(explain(out, cost, dims, stop_reason=st.stop_reason, limit=st.limit_note or None,
                          disabled=tuple(disable), p=p, deadline=deadline, ilp=ilp, joins=joins, machine=machine))
    return OptResult(out, report, joins)


def cached_rules(files: tuple[str, ...], disable: tuple[str, ...]) -> list:
    """load_rules, kept while the rule files are unchanged (a file of 5000 graphs reads them once)."""
    from pathlib import Path

    key = (files, disable, tuple(Path(f).read_bytes() if Path(f).is_file() else b"" for f in files))
    if key not in _RULES:
        _RULES.clear()
        _RULES[key] = load_rules(extra_files=list(files), disable=disable)
    return _RULES[key]


_RULES: dict[tuple, list] = {}


def check(g: Graph) -> None:
    """The optimizer's own contract: kernels only at the top level, each one lowerable, types consistent."""
    for n in g.nodes:
        if n.op not in ("input", "const", "kernel"):
            raise AssertionError(f"unfused op {n.op} at the top level")
        if n.op == "kernel":
            try:
                classify(n.body)
            except Split:
                pass  # a hand-written block the backend computes as separate kernels
    retype(g, [t for _, t in g.params])


@dataclass
class Optimized:
    graphs: list[Graph]
    reports: dict[str, dict]

    @property
    def text(self) -> str:
        return module_text(self.graphs)

    @property
    def report(self) -> dict:
        return next(iter(self.reports.values())) if len(self.reports) == 1 else self.reports


def optimize(src, *, cost: str = "memory", rules: Sequence = (), disable: Sequence[str] = (),
             dims: Mapping[str, int] | None = None, iter_limit: int | None = None,
             node_limit: int | None = None, time_limit: float | None = None, check_rules: bool = True,
             machine: Machine | None = None) -> Optimized:
    """Optimize every graph of a model (a .g path or source text), no C, for the planner's `machine`
    (optimize_graph; `eqfuse.optimize` is eqfuse.pipeline.optimize_model, which passes this host's).
    User rule files are checked for soundness first (RuleError; check_rules=False skips it)."""
    from eqfuse.frontend.load import load
    from eqfuse.optimizer.rulecheck import check_rule_files

    check_rule_files(rules, enabled=check_rules)

    graphs = load(src)
    outs, reports = [], {}
    for g, r in zip(graphs, optimize_graphs(graphs, cost=cost, rules=rules, disable=disable, dims=dims,
                                            iter_limit=iter_limit, node_limit=node_limit, time_limit=time_limit,
                                            machine=machine)):
        outs.append(r.graph)
        reports[g.name] = r.report
    return Optimized(outs, reports)


def _batch_dims(graph, unbound: list[str], params=None) -> dict[str, str | None]:
    """{unbound dim: None when it is a batch dim (eqfuse.ir.separable), else why not}; `params`,
    the bound arrays, let a mask read at the sample's position pass (eqfuse.ir.positions)."""
    from eqfuse.ir.separable import batch_dims

    ok, why = batch_dims(graph, params)
    return {d: None if d in ok else why.get(d, "") for d in unbound}


def batch_dims_report(report: dict, graph, params) -> None:
    """report["batch_dims"] again, knowing the bound arrays (eqfuse.compile and `eqfuse opt` bind
    an ONNX model's initializers; optimize_graph sees the graph alone)."""
    if report.get("batch_dims"):
        report["batch_dims"] = _batch_dims(graph, list(report["batch_dims"]), params)


def _views_text(r: dict) -> str:
    """After the kernel counts: the views apart (counted by lowering, which a driver adds as
    views_after), or that the counts are the optimizer's (a dim unbound: nothing was lowered)."""
    if "views_after" in r:
        return f" (+{r['views_after']} view{'s' * (r['views_after'] != 1)})"
    if r.get("kernels_counted") == "optimizer":
        return " (the optimizer's count, views not counted: bind every dim with --dim to count the kernels that run)"
    return ""


def report_text(r: dict) -> str:
    """The report as printed after the graph by `eqfuse opt`."""
    def mb(b):
        return f"{b / 1e6:.3f} MB"

    from eqfuse.progress import seconds as us

    fired = ", ".join(f"{k} x{v}" for k, v in sorted(r["rules_fired"].items(), key=lambda kv: (-kv[1], kv[0])))
    whose = " (of the batch it was optimized in)" if r.get("batch") else ""
    lines = [
        f"# report for graph {r['graph_name']} (cost: {r['cost']})",
        f"#   kernels:    {r['kernels_before']} -> {r['kernels_after']}" + _views_text(r),
        f"#   bytes:      {mb(r['bytes_before'])} -> {mb(r['bytes_after'])}",
        f"#   est. time:  {us(r['est_time_before_s'])} -> {us(r['est_time_after_s'])}",
        f"#   rules fired{whose}: {fired or 'none'}",
        f"#   e-graph:    {r['egraph_nodes']} nodes, {r['egraph_classes']} classes, {r['iterations']} iterations, "
        f"stopped: {r['stop_reason']}" + (f" ({r['limit']})" if r.get("limit") else ""),
        f"#   extraction: {r['extraction']} (ILP: {r['ilp']})",
        f"#   optimize time: {us(r['optimize_seconds'])} in all"
        + (f" ({', '.join(f'{k} {us(v)}' for k, v in r['stage_seconds'].items())})" if r.get("stage_seconds") else ""),
    ]
    if r.get("saved_before"):  # a training graph: what the gradients read of the forward pass
        lines.append(f"#   saved for backward: {mb(r['saved_before'])} -> {mb(r['saved_after'])} (activations the "
                     f"gradients read; the rest is recomputed in their kernels)")
    if r["extraction"] != "greedy":  # what the ILP improved on
        lines.append(f"#   greedy alone: {r['kernels_greedy']} kernels, {mb(r['bytes_greedy'])}")
    if r["unbound_dims"]:
        lines.append("#   unbound dims costed as " + ", ".join(f"{k}={v}" for k, v in r["unbound_dims"].items())
                     + " (bind with --dim)")
    for d, why in r.get("batch_dims", {}).items():
        lines.append(f"#   {d}: a batch dim, any size at run time from one compile" if why is None else
                     f"#   {d}: not a batch dim ({why}): compiled once per value")
    for note in r.get("folded", ()):  # set by eqfuse.compile, which folds bound params first
        lines.append(f"#   folded: {note}")
    if r["skipped_rules"]:
        lines.append("#   rules the e-graph cannot express (skipped): " + ", ".join(sorted(r["skipped_rules"])))
    return "\n".join(lines)


SMALL = 64  # nodes: graphs up to this size are batched
BATCH_NODES = 1500  # nodes per batch


def _prefix(k: int) -> str:
    return f"__b{k}__"


def optimize_graphs(graphs: Sequence[Graph], alone: bool = False, **kw) -> list:
    """optimize_graph on each graph, small ones in batches (`alone`: none), results in input
    order. A batched graph's report has its own kernels, bytes, times and batch dims, but the
    rules fired and e-graph figures of its batch (egglog counts a rule's matches over the whole
    e-graph): `eqfuse opt`, which prints the reports, optimizes a file of a few graphs alone."""
    dims = kw.pop("dims", None) or {}
    out: list = [None] * len(graphs)
    batch: list[int] = []

    def flush():
        if len(batch) == 1:
            i = batch[0]
            out[i] = optimize_graph(graphs[i], dims={k: v for k, v in dims.items() if k in graphs[i].dims()}, **kw)
        elif batch:
            for i, r in zip(batch, _together([graphs[i] for i in batch], dims, kw)):
                out[i] = r
        batch.clear()

    size = 0
    for i, g in enumerate(graphs):
        if len(g.nodes) > SMALL or alone:
            out[i] = optimize_graph(g, dims={k: v for k, v in dims.items() if k in g.dims()}, **kw)
            continue
        if size + len(g.nodes) > BATCH_NODES:
            flush()
            size = 0
        batch.append(i)
        size += len(g.nodes)
    flush()
    return out


def _together(gs: list[Graph], dims, kw) -> list:
    from eqfuse.optimizer.explain import explain
    u = Graph("batch")
    owner: list[int] = []  # output index -> graph
    for k, g in enumerate(gs):
        base = len(u.nodes)
        p = _prefix(k)
        for n in g.nodes:
            u.nodes.append(replace(n, args=tuple(a + base for a in n.args),
                                   name=None if n.name is None else p + n.name, body=None if n.body is None else n.body))
        u.inputs += [i + base for i in g.inputs]
        u.outputs += [o + base for o in g.outputs]
        owner += [k] * len(g.outputs)
    all_dims = {d for g in gs for d in g.dims()}
    r = optimize_graph(u, dims={k: v for k, v in dims.items() if k in all_dims}, **kw)
    results = []
    for k, g in enumerate(gs):
        ids: dict[int, int] = {}
        part = _split(r.graph, k, [o for o, w in zip(r.graph.outputs, owner) if w == k], g, ids)
        gd = {d: v for d, v in dims.items() if d in g.dims()}
        before, after = C.graph_kernels(g, gd), C.graph_kernels(part, gd)
        rep = dict(r.report)
        rep.update(graph_name=g.name, kernels_before=before.launches - before.views,
                   kernels_after=after.launches - after.views, bytes_before=before.bytes, bytes_after=after.bytes,
                   est_time_before_s=C.graph_value(g, "time", gd, C.perf()),
                   est_time_after_s=C.graph_value(part, "time", gd, C.perf()),
                   kernels_greedy=after.launches - after.views, bytes_greedy=after.bytes,
                   saved_before=C.saved_for_backward(g, gd), saved_after=C.saved_for_backward(part, gd),
                   unbound_dims={d: C.DEFAULT_DIM for d in g.dims() if d not in gd},
                   batch_dims=_batch_dims(g, [d for d in g.dims() if d not in gd]),  # this graph's dims alone
                   batch=f"optimized together with {len(gs) - 1} other small graphs (rules fired, e-graph and "
                         "time figures are the batch's)",
                   graph=graph_text(part))
        joins = r.joins.renumbered(ids) if r.joins is not None else None
        rep.update(explain(part, rep["cost"], gd, stop_reason=rep["stop_reason"], limit=rep["limit"],
                           disabled=tuple(kw.get("disable", ())), ilp=rep["ilp"], joins=joins,
                           machine=kw.get("machine")))
        results.append(OptResult(part, rep, joins))
    return results


def _split(g: Graph, k: int, outputs: list[int], orig: Graph, ids: dict[int, int] | None = None) -> Graph:
    """Graph k's part of the batch's result (`ids`, when given, gets g's node id -> the part's)."""
    p = _prefix(k)

    def name(s):
        return s[len(p):] if s is not None and s.startswith(p) else s

    live, stack = set(), list(outputs)
    while stack:
        j = stack.pop()
        if j not in live:
            live.add(j)
            stack.extend(g.nodes[j].args)
    by_name = {g.nodes[i].name: i for i in g.inputs}
    keep = [by_name[p + orig.nodes[i].name] for i in orig.inputs]
    keep += [i for i in range(len(g.nodes)) if i in live and i not in set(keep)]
    keep.sort(key=lambda i: (g.nodes[i].op != "input", i))
    new = {old: j for j, old in enumerate(keep)}
    if ids is not None:
        ids.update(new)
    nodes = []
    for i in keep:
        n = g.nodes[i]
        body = n.body
        if body is not None:
            body = Graph(body.name, [replace(b, name=name(b.name)) for b in body.nodes], list(body.inputs),
                         list(body.outputs), body.pos)
        nodes.append(replace(n, args=tuple(new[a] for a in n.args), name=name(n.name), body=body))
    inputs = [new[by_name[p + orig.nodes[i].name]] for i in orig.inputs]
    return Graph(orig.name, nodes, inputs, [new[o] for o in outputs], orig.pos)
