"""The optimizer: a Graph through the e-graph to its cheapest fused form, one graph at a time.

The optimizer, top to bottom:

    unfuse, fold constants
      -> repeated blocks (a model's layers): each distinct piece once, side by side
         (eqfuse.optimizer.repeats; the result copied per piece after extraction)
      -> recognition e-graph: algebra and pattern rules (no kernels) saturate, growing rules in
         bounded rounds -> the smallest term, constants folded (eqfuse.optimizer.egraph, eqfuse.optimizer.simplify)
      -> fusion e-graph: fusion rules to saturation or a limit -> serialize
      -> extract (greedy, then an exact ILP: whole, or region by region on large e-graphs)
      -> rescore every candidate exactly -> fused Graph (kernel blocks) + report

Fusion decisions live in eqfuse/optimizer/rules/fusion.rw; this module only runs the stages. The limits
(iterations, e-nodes, seconds) hold for the whole run: see eqfuse.optimizer.egraph.

A file of many graphs (optimize_graphs): each graph is optimized alone, so that its report
describes it alone; a graph the same as an earlier one but for its name is optimized once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from eqfuse.errors import EqfuseError
from eqfuse.ir.conv_forms import expand_convs
from eqfuse.ir.graph import Graph, retype
from eqfuse.ir.kernels import Split, classify
from eqfuse.ir.printer import graph_text
from eqfuse.machine import Machine
from eqfuse.optimizer import cost as C
from eqfuse.optimizer import extract as X
from eqfuse.optimizer import repeats
from eqfuse.optimizer.egraph import (
    EXTRACT_SECONDS_PER_NODE,
    FUSE,
    EGraph,
    Limits,
    SaturationStats,
    fusion_seconds,
    load_seconds,
    own_thread,
    recognize,
    rule_phase,
    run_phase,
)
from eqfuse.optimizer.explain import Joins
from eqfuse.optimizer.layout import sink_reshapes
from eqfuse.optimizer.rules import load_rules, rule_files
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
    if cost not in C.MODELS:
        raise EqfuseError(f"unknown cost model '{cost}' (known: {', '.join(C.MODELS)})")
    with own_thread():  # (a thread but the main one drops its e-graphs before this returns)
        return _cached(graph, cost=cost, rules=rules, disable=disable, dims=dims, iter_limit=iter_limit,
                       node_limit=node_limit, time_limit=time_limit, progress=progress, machine=machine)


def _cached(graph: Graph, *, cost, rules, disable, dims, iter_limit, node_limit, time_limit, progress,
            machine) -> OptResult:
    """optimize_graph's body: from the optimized-graph cache, else optimized and kept there."""
    from eqfuse.optimizer import graph_cache

    if not graph_cache.enabled():
        r = _optimize_graph(graph, cost=cost, rules=rules, disable=disable, dims=dims, iter_limit=iter_limit,
                            node_limit=node_limit, time_limit=time_limit, progress=progress, machine=machine)
        r.report["graph_cache"] = "off"
        return r
    t0 = time.perf_counter()
    bound = {k: v for k, v in (dims or {}).items() if k in graph.dims()}
    key = graph_cache.key(graph_text(graph), rule_sources(tuple(str(r) for r in rules), tuple(disable)), disable,
                          cost, bound, (iter_limit, node_limit, time_limit, repeats.enabled()),
                          C.perf() if cost == "time" else None,
                          machine)
    hit = graph_cache.get(key)
    if hit is not None:
        from eqfuse.frontend.load import load

        text, report = hit
        out = graph_cache.get_graph(key)  # the pickled graph, else the text parsed
        if out is None:
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
    if r.report["stop_reason"] != "time_limit" and "time_limit" not in str(r.report.get("ilp")) \
            and not r.report["time_limit_cut"]:
        # a result the clock cut short depends on the machine's load: not kept
        if graph_cache.put(key, r.report["graph"], r.report):
            graph_cache.put_graph(key, r.graph)
    return r


def _optimize_graph(graph: Graph, *, cost: str = "memory", rules: Sequence = (), disable: Sequence[str] = (),
                    dims: Mapping[str, int] | None = None, iter_limit: int | None = None,
                    node_limit: int | None = None, time_limit: float | None = None,
                    progress=None, machine: Machine | None = None) -> OptResult:
    """optimize_graph without the cache: the e-graphs and extraction, once per class of repeated
    pieces (eqfuse.optimizer.repeats) when the graph repeats a block."""
    t0 = time.perf_counter()
    lim = Limits.make(iter_limit, node_limit, time_limit, t0)
    dims = {k: v for k, v in (dims or {}).items() if k in graph.dims()}
    rule_list = cached_rules(tuple(str(r) for r in rules), tuple(disable))
    src0 = fold_constants(expand_convs(C.unfused(graph)))  # (conv1d, conv_transpose2d: as conv2d)
    t = time.perf_counter()
    pieces = repeats.find(src0) if repeats.enabled() else None
    found = time.perf_counter() - t
    kw = dict(cost=cost, rule_list=rule_list, dims=dims, lim=lim, progress=progress, machine=machine)
    if pieces is None:
        f = _fuse(src0, **kw)
        out, greedy_g, joins = f.graph, f.greedy, f.joins
    else:
        f = _fuse(*pieces.distinct(), **kw)
        t = time.perf_counter()
        ids: dict[int, list[int]] = {}
        out, greedy_g = pieces.expand(f.graph, f.parts, ids), pieces.expand(f.greedy, f.parts)
        joins = f.joins.spread(ids) if f.joins is not None else None
        f.stages["repeats"] = found + time.perf_counter() - t
    r = _report(graph, src0, out, greedy_g, f.how, f.ilp, f.data, f.st, f.recognition, f.stages, cost, dims, t0,
                disable, lim.deadline, joins, machine, f.cut)
    r.report["repeats"] = pieces.note() if pieces is not None else None
    r.report["candidates_bounded"] = f.bounded
    return r


@dataclass
class _Fused:
    graph: Graph
    greedy: Graph
    how: str
    ilp: str
    data: object  # edata.EData, None when no fusion e-graph was built
    st: SaturationStats
    recognition: dict
    stages: dict[str, float]
    joins: Joins | None
    parts: list[Graph] | None = None
    cut: dict[str, str] | None = None  # phase -> what the time limit cut short in it
    bounded: int = 0  # fused-kernel e-nodes extract.FUSED_PER_CLASS left out


def _fuse(src: Graph, parts: list[Graph] | None = None, *, cost: str, rule_list: list, dims: Mapping[str, int],
          lim: Limits, progress=None, machine: Machine | None = None) -> _Fused:
    """The recognition e-graph, the fusion e-graph and extraction, on one unfused graph."""
    src0 = src
    wide = cut_wide(src)  # wide concats stay out of the e-graphs (eqfuse.optimizer.wide)
    if wide:
        src = wide.graph
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
    cut: dict[str, str] = {}  # phase -> what the time limit cut short (report["time_limit_cut"])
    if pre and lim.left() < load_seconds(src):
        st.stop_reason, st.limit_note = "time_limit", "time limit: no time for the recognition e-graph"
        cut["recognition"] = "not started (no time to load its e-graph)"
    elif pre:  # the recognition e-graph
        # every rule goes into the e-graph, each phase in its own ruleset, so that the recognition
        # and the fusion e-graph are one egglog program, declared once per process (EGraph)
        eg = EGraph(src, rule_list, phase_of=rule_phase)
        try:  # (closed in this thread whatever happens: eqfuse.optimizer.egraph.own_thread)
            st.skipped_rules.update(eg.skipped)
            stage("recognition e-graph load")
            recognize(eg, st, lim, progress=progress)  # if fusion has no time left after it, its result stands
            if st.stop_reason == "time_limit":
                cut["recognition"] = "stopped before saturation"
            stage("recognition")
            recognition = {"egraph_nodes": st.egraph_nodes, "iterations": st.iterations}
            st.iterations = 0  # the iteration limit holds for each e-graph
            data = eg.serialize() if st.rules_fired else None
        finally:
            eg.close()
        if data is not None:
            src = smallest(data, src)
        stage("smallest term")
    src = sink_reshapes(src)  # exporters' flatten / GEMM / unflatten is one batched GEMM (eqfuse.optimizer.layout)
    if lim.left() < fusion_seconds(src):  # the best so far: every op its own kernel
        st.stop_reason, st.limit_note = "time_limit", "time limit: no time for the fusion e-graph"
        cut["fusion"] = "not started (no time to load and extract its e-graph): every op its own kernel"
        return _one_per_op(wide, src, src0, st, recognition, stages, parts, cut)
    eg = EGraph(src, rule_list, phase_of=rule_phase)
    try:
        st.skipped_rules.update(eg.skipped)
        stage("fusion e-graph load")
        if not run_phase(eg, FUSE, st, lim, progress=progress) and st.stop_reason == "time_limit":
            cut["fusion"] = "stopped before saturation"
        stage("fusion")
        data = eg.serialize()
    finally:
        eg.close()
    stage("serialize")
    try:  # past the deadline, the fused kernels not built yet are left out (build_problem)
        pb = X.build_problem(data, src, cost, dims, perf, machine, deadline=lim.deadline)
    except X.OutOfTime as e:
        stage("candidates")
        cut["candidates"] = f"{e}: every op its own kernel"
        return _one_per_op(wide, src, src0, st, recognition, stages, parts, cut)
    if pb.cut:
        cut["candidates"] = pb.cut
    stage("candidates")

    left = lim.left() - EXTRACT_SECONDS_PER_NODE * data.num_nodes
    ex = X.extract(pb, src, cost, dims, perf, time_limit=max(0.0, min(X.ILP_TIME_LIMIT, left)),
                   spare=max(0.0, left - X.ILP_TIME_LIMIT),  # (the solver's import, within the limit)
                   deadline=lim.deadline)
    if ex.cut:
        cut["extraction"] = "; ".join(ex.cut)
    out, greedy_g = ex.graph, ex.greedy
    joins = Joins(data, ex.classes, ex.enodes)
    if wide:
        ids: dict[int, int] = {}
        out, greedy_g = stitch(wide, out, src0, ids), stitch(wide, greedy_g, src0)
        joins = joins.renumbered(ids)
    stage("extraction")
    return _Fused(out, greedy_g, ex.how, ex.ilp, data, st, recognition, stages, joins, parts, cut, pb.bounded)


def _one_per_op(wide, src: Graph, src0: Graph, st, recognition, stages, parts, cut) -> _Fused:
    """What _fuse gives when the time limit leaves no time to fuse: every op its own kernel."""
    one = stitch(wide, singletons(src), src0) if wide else singletons(src)
    return _Fused(one, one, "none (time limit)", "", None, st, recognition, stages, None, parts, cut)


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
            disable=(), deadline=None, joins=None, machine: Machine | None = None, cut=None) -> OptResult:
    from eqfuse.optimizer.explain import explain

    t_report = time.perf_counter()
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
        "time_limit_cut": dict(cut or {}),  # phase -> what the time limit cut short in it (none: nothing)
        "graph": text,
    }
    # why each tensor between two kernels is stored, and what each fused kernel saves (eqfuse.optimizer.explain)
    report.update(explain(out, cost, dims, stop_reason=st.stop_reason, limit=st.limit_note or None,
                          disabled=tuple(disable), p=p, deadline=deadline, ilp=ilp, joins=joins, machine=machine))
    late = sum(b.get("reason") == "limit" and b.get("detail", "").startswith("not examined")
               for b in report["boundaries"])
    if late:
        report["time_limit_cut"]["explain"] = f"{late} of {len(report['boundaries'])} boundaries not examined"
    stages["report"] = time.perf_counter() - t_report  # (the counts, costs and explanation above)
    report["optimize_seconds"] = time.perf_counter() - t0
    return OptResult(out, report, joins)


def rule_sources(files: tuple[str, ...], disable: tuple[str, ...]) -> list[tuple[str, bytes]]:
    """(name, bytes) of every rule file in force, built-in then the user's: what the rules are
    made of, for the optimized-graph cache's key. A hit then needs no rule parsed (unpickling the
    parsed built-in rules was a third of a warm compile's own time). Files that do not load (a
    missing file, a duplicate rule name, an unknown --disable) are refused here as load_rules
    refuses them: such a set never optimized a graph, so it has no entry to find."""
    out = [(p.name, p.read_bytes()) for p in rule_files()]
    try:
        out += [(f, Path(f).read_bytes()) for f in files]
    except OSError:
        cached_rules(files, disable)  # its message
        raise
    return out


def cached_rules(files: tuple[str, ...], disable: tuple[str, ...]) -> list:
    """load_rules, kept while the rule files are unchanged (a file of 5000 graphs reads them once)."""

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
    """What eqfuse.optimize gives (eqfuse.pipeline.optimize_model): the fused graphs of a model
    and each graph's report."""
    graphs: list[Graph]
    reports: dict[str, dict]

    @property
    def text(self) -> str:
        """The graphs' text as `eqfuse opt` prints it (each report's graph: views as views where lowered)."""
        return "\n".join(r["graph"] for r in self.reports.values())

    @property
    def report(self) -> dict:
        return next(iter(self.reports.values())) if len(self.reports) == 1 else self.reports


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
    lines = [
        f"# report for graph {r['graph_name']} (cost: {r['cost']})",
        f"#   kernels:    {r['kernels_before']} -> {r['kernels_after']}" + _views_text(r),
        f"#   bytes:      {mb(r['bytes_before'])} -> {mb(r['bytes_after'])}",
        f"#   est. time:  {us(r['est_time_before_s'])} -> {us(r['est_time_after_s'])}",
        f"#   rules fired: {fired or 'none'}",
        f"#   e-graph:    {r['egraph_nodes']} nodes, {r['egraph_classes']} classes, {r['iterations']} iterations, "
        f"stopped: {r['stop_reason']}" + (f" ({r['limit']})" if r.get("limit") else ""),
        f"#   extraction: {r['extraction']} (ILP: {r['ilp']})" + (
            f"; {r['candidates_bounded']} fused-kernel candidates left out (at most {X.FUSED_PER_CLASS} a tensor)"
            if r.get("candidates_bounded") else ""),
        f"#   optimize time: {us(r['optimize_seconds'])} in all"
        + (f" ({', '.join(f'{k} {us(v)}' for k, v in r['stage_seconds'].items())})" if r.get("stage_seconds") else ""),
    ]
    if r.get("time_limit_cut"):  # the phases the time limit cut short: the result is the best found by then
        lines.append("#   time limit reached: " + "; ".join(f"{k}: {v}" for k, v in r["time_limit_cut"].items())
                     + " (the result is the best found by then)")
    if r.get("same_as"):  # optimize_graphs: the same graph but its name, optimized once
        lines.append(f"#   the same graph as {r['same_as']} but its name: its result, renamed (rules fired, "
                     f"e-graph and extraction are that optimization's)")
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


def optimize_graphs(graphs: Sequence[Graph], before_each=None, **kw) -> list:
    """optimize_graph on each graph of a file, results in input order. Each graph is optimized
    alone, so that its report describes it alone (its rules fired are its own: egglog counts a
    rule's matches over the whole e-graph, so graphs optimized side by side in one e-graph could
    only share one count). A graph the same as an earlier one but for its name (a file of
    generated variants) is optimized once: its result is the earlier one's, renamed, and its
    report says so (`same_as`). `before_each(i)`, when given, is called before graph i (a progress line)."""
    with own_thread():  # (the e-graphs are kept from one graph to the next, dropped at the end)
        return _each(graphs, before_each, **kw)


def _each(graphs: Sequence[Graph], before_each=None, **kw) -> list:
    """optimize_graphs' body."""
    dims = kw.pop("dims", None) or {}
    out: list = []
    seen: dict[tuple, int] = {}  # (the graph's text but its name, its dims bound) -> its first index
    for i, g in enumerate(graphs):
        if before_each:
            before_each(i)
        gd = {k: v for k, v in dims.items() if k in g.dims()}
        key = (graph_text(Graph("_", g.nodes, g.inputs, g.outputs)), tuple(sorted(gd.items())))
        if key in seen:
            out.append(_renamed(out[seen[key]], graphs[seen[key]].name, g))
            continue
        seen[key] = i
        out.append(optimize_graph(g, dims=gd, **kw))
    return out


def _renamed(r: OptResult, first: str, g: Graph) -> OptResult:
    """An earlier graph's result as graph g's: g is that graph but for its name."""
    t0 = time.perf_counter()
    out = Graph(g.name, list(r.graph.nodes), list(r.graph.inputs), list(r.graph.outputs), g.pos)
    text = graph_text(out)
    seconds = time.perf_counter() - t0
    report = dict(r.report, graph_name=g.name, graph=text, same_as=first, optimize_seconds=seconds,
                  stage_seconds={f"the result of graph {first}": seconds})
    return OptResult(out, report, r.joins)
