"""Many small graphs, optimized together.

Each optimize_graph call pays a fixed cost (two e-graphs pushed and popped, a few egglog steps,
an ILP call): ~0.1 s, so a file of 5000 small graphs took over 300 s. `optimize_graphs` puts
small graphs side by side into one graph (names prefixed, so nothing is shared but constants),
optimizes that once, and splits the result back. Graphs are independent, so no kernel can join
two of them; each keeps its own parameters, names and outputs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from eqfuse.ir.graph import Graph
from eqfuse.ir.printer import graph_text
from eqfuse.optimizer import cost as C

SMALL = 64  # nodes: graphs up to this size are batched
BATCH_NODES = 1500  # nodes per batch


def _prefix(k: int) -> str:
    return f"__b{k}__"


def optimize_graphs(graphs: Sequence[Graph], **kw) -> list:
    """optimize_graph on each graph, small ones in batches; results in input order."""
    from eqfuse.optimizer.optimize import optimize_graph

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
        if len(g.nodes) > SMALL:
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
    from eqfuse.optimizer.optimize import OptResult, optimize_graph

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
                   batch=f"optimized together with {len(gs) - 1} other small graphs (e-graph and time figures are the batch's)",
                   graph=graph_text(part))
        joins = r.joins.renumbered(ids) if r.joins is not None else None
        rep.update(explain(part, rep["cost"], gd, stop_reason=rep["stop_reason"], limit=rep["limit"],
                           disabled=tuple(kw.get("disable", ())), ilp=rep["ilp"], joins=joins))
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
