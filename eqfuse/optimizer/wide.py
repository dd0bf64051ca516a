"""Wide concats stay out of the e-graph.

egglog declares one constructor per arity, and declaring one of n arguments takes time and
memory quadratic in n (measured with egglog 13.2: a 5000-operand concat ran out of 20 GB).
No rule joins a concat to anything (a layout op is its
own kernel), so a concat of more than WIDE operands is cut out before the e-graphs: its result
becomes a parameter of the graph the optimizer sees, and its operands extra outputs of it. After
extraction `stitch` puts each one back as its own layout kernel reading those outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from eqfuse.ir.graph import Graph, Node

WIDE = 16


@dataclass
class Cut:
    graph: Graph  # what the optimizer sees
    n_outputs: int  # the original graph's outputs come first
    wide: dict[str, Node]  # pseudo parameter name -> the concat node (args: indices into graph.outputs)


def cut_wide(g: Graph) -> Cut | None:
    if not any(n.op == "concat" and len(n.args) > WIDE for n in g.nodes):
        return None
    nodes, inputs, extra, wide = list(g.nodes), list(g.inputs), [], {}
    out_index: dict[int, int] = {}
    for i, n in enumerate(g.nodes):
        if n.op == "concat" and len(n.args) > WIDE:
            name = f"__wide{i}"
            idx = []
            for a in n.args:
                if a not in out_index:
                    out_index[a] = len(g.outputs) + len(extra)
                    extra.append(a)
                idx.append(out_index[a])
            wide[name] = replace(n, args=tuple(idx))
            nodes[i] = Node("input", type=n.type, name=name, pos=n.pos)
            inputs.append(i)
    return Cut(Graph(g.name, nodes, inputs, list(g.outputs) + extra, g.pos), len(g.outputs), wide)


def stitch(cut: Cut, out: Graph, original: Graph, ids: dict[int, int] | None = None) -> Graph:
    """The optimized graph with every wide concat back, as its own kernel, and the original
    parameters and outputs only (`ids`, when given, gets out's node id -> the result's)."""
    g = Graph(out.name, pos=out.pos)
    ids = {} if ids is None else ids
    for i in out.inputs:
        if out.nodes[i].name not in cut.wide:
            ids[i] = g.add(out.nodes[i])
            g.inputs.append(ids[i])

    def deps(i: int) -> tuple[int, ...]:
        n = out.nodes[i]
        if n.op == "input" and n.name in cut.wide:
            return tuple(out.outputs[k] for k in cut.wide[n.name].args)
        return n.args

    for root in out.outputs[:cut.n_outputs]:  # post-order, iteratively
        stack = [(root, False)]
        while stack:
            i, done = stack.pop()
            if i in ids:
                continue
            if not done:
                stack.append((i, True))
                stack.extend((a, False) for a in reversed(deps(i)) if a not in ids)
                continue
            n = out.nodes[i]
            if n.op == "input" and n.name in cut.wide:
                ids[i] = g.add(_concat_kernel(cut.wide[n.name], [ids[out.outputs[k]] for k in cut.wide[n.name].args], g))
            else:
                ids[i] = g.add(replace(n, args=tuple(ids[a] for a in n.args)))
    g.outputs = [ids[o] for o in out.outputs[:cut.n_outputs]]
    return g


def _concat_kernel(cat: Node, args: list[int], g: Graph) -> Node:
    body = Graph("kernel")
    local: dict[int, int] = {}
    for a in args:
        if a not in local:
            local[a] = body.add(Node("input", type=g.nodes[a].type, name=g.nodes[a].name))
            body.inputs.append(local[a])
    body.outputs = [body.add(replace(cat, args=tuple(local[a] for a in args), name=None))]
    return Node("kernel", tuple(dict.fromkeys(args)), (), cat.type, name=cat.name, pos=cat.pos, body=body)
