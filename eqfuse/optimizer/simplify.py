"""Between the recognition e-graph and the fusion e-graph: the smallest term, constants folded.

`smallest(d, graph)` picks in every e-class of the (kernel-free) recognition e-graph the e-node
of least tree size: one per op, none for parameters and constants, and nearly none for an op
whose operands are all constants (it folds). A recognized op (layernorm, gelu, softmax) is one
node where its spelling was several, so it wins. Ties keep the op the input graph had there.
The chosen term becomes a Graph again, with the input graph's names where a class holds one of
its nodes.

`fold_constants(graph)`: every op whose operands are all scalar constants becomes one constant,
computed in float32 by the op table's numpy semantics (sqrt(64.0) -> 8, 1.0 / 8.0 -> 0.125), so
no kernel computes only constants.
"""

from __future__ import annotations

import heapq
from dataclasses import replace

import numpy as np

from eqfuse.ir.graph import Graph, Node, retype
from eqfuse.ir.ops import OPS
from eqfuse.ir.shapes import TType
from eqfuse.optimizer.edata import EData, ENode
from eqfuse.optimizer.egraph_text import text_attr, text_num

CONST_OP_WEIGHT = 1e-3  # an op over constants only: it folds, so it costs (almost) nothing
CAP = 1e300


def _attrs(n: ENode) -> tuple:
    return tuple((s.name, text_attr(s.kind, v)) for s, v in zip(OPS[n.op].attrs, n.attrs))


def smallest(d: EData, graph: Graph) -> Graph:
    """The least-size term of every output class, as a Graph with graph's parameters."""
    parents: dict[int, list[int]] = {}
    const_cls = {n.cls for n in d.nodes if n.kind == "Cn"}
    for n in d.nodes:
        for c in n.children:
            parents.setdefault(c, []).append(n.id)
    orig_op = {c: graph.nodes[o].op for c, o in d.orig.items()}
    best: dict[int, tuple[float, int, int]] = {}  # class -> (cost, tie, node)
    heap: list[tuple[float, int, int]] = []

    def offer(n: ENode) -> None:
        if n.sort != "T" or n.kind not in ("In", "Cn", "op"):
            return
        if any(c not in best for c in n.children):
            return
        if n.kind == "op":
            w = CONST_OP_WEIGHT if all(c in const_cls for c in n.children) else 1.0
            cost = min(CAP, w + sum(best[c][0] for c in n.children))
        else:
            cost = 0.0
        tie = 0 if orig_op.get(n.cls) in (n.op, None) or n.kind != "op" else 1
        if (cost, tie) < best.get(n.cls, (CAP * 2, 2, 0))[:2]:
            best[n.cls] = (cost, tie, n.id)
            heapq.heappush(heap, (cost, n.id, n.cls))

    for n in d.nodes:
        if not n.children:
            offer(n)
    while heap:
        cost, nid, c = heapq.heappop(heap)
        if best[c][2] != nid:
            continue
        for p in parents.get(c, ()):
            offer(d.nodes[p])
    return _rebuild(d, {c: b[2] for c, b in best.items()}, graph)


def _rebuild(d: EData, pick: dict[int, int], graph: Graph) -> Graph:
    g = Graph(graph.name, pos=graph.pos)
    by_name: dict[str, int] = {}
    for i in graph.inputs:
        n = graph.nodes[i]
        by_name[n.name] = g.add(replace(n, args=()))
        g.inputs.append(by_name[n.name])
    used = set(by_name)
    ids: dict[int, int] = {}
    roots = [d.outputs[k] for k in sorted(d.outputs)]
    for root in roots:  # post-order, iteratively (deep graphs)
        stack = [(root, False)]
        while stack:
            c, done = stack.pop()
            if c in ids:
                continue
            n = d.nodes[pick[c]]
            if not done:
                stack.append((c, True))
                stack.extend((ch, False) for ch in reversed(n.children) if ch not in ids)
                continue
            if n.kind == "In":
                ids[c] = by_name[n.op]
            elif n.kind == "Cn":
                ids[c] = g.add(Node("const", attrs=(("value", text_num(n.op)),), type=TType(())))
            else:
                o = d.orig.get(c)
                name = graph.nodes[o].name if o is not None else None
                if name in used or (o is not None and graph.nodes[o].op in ("input", "const")):
                    name = None
                if name is not None:
                    used.add(name)
                pos = graph.nodes[o].pos if o is not None else None
                ids[c] = g.add(Node(n.op, tuple(ids[ch] for ch in n.children), _attrs(n), name=name, pos=pos))
    g.outputs = [ids[r] for r in roots]
    return fold_constants(retype(g, [t for _, t in graph.params]))


def fold_constants(graph: Graph) -> Graph:
    """Ops over scalar constants only become constants (float32, the op table's numpy)."""
    if not any(n.op not in ("input", "const", "kernel") and n.args
               and all(graph.nodes[a].op == "const" for a in n.args) for n in graph.nodes):
        return graph
    nodes = list(graph.nodes)
    for i, n in enumerate(nodes):
        if n.op in ("input", "const", "kernel") or not n.args or n.type.shape != ():
            continue
        if n.type.dtype != "f32":  # a literal is a weak f32: an integer or bool result stays an op
            continue
        if not all(nodes[a].op == "const" for a in n.args):
            continue
        args = [np.float32(nodes[a].value) for a in n.args]
        with np.errstate(all="ignore"):
            v = np.asarray(OPS[n.op].numpy([np.asarray(a, dtype=np.float32) for a in args], n.attr),
                           dtype=np.float32)
        if v.shape != ():
            continue
        nodes[i] = Node("const", attrs=(("value", float(v)),), type=TType(()), name=n.name, pos=n.pos)
    return _dead_removed(Graph(graph.name, nodes, list(graph.inputs), list(graph.outputs), graph.pos))


def _dead_removed(g: Graph) -> Graph:
    live, stack = set(g.inputs), list(g.outputs)
    while stack:
        j = stack.pop()
        if j not in live:
            live.add(j)
            stack.extend(g.nodes[j].args)
    keep = [i for i in range(len(g.nodes)) if i in live]
    new = {old: k for k, old in enumerate(keep)}
    nodes = [replace(g.nodes[i], args=tuple(new[a] for a in g.nodes[i].args)) for i in keep]
    return Graph(g.name, nodes, [new[i] for i in g.inputs], [new[o] for o in g.outputs], g.pos)
