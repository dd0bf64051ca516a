"""Literals lifted out of kernels that differ only in them, so that they share their C.

The layers of a quantized model are the same kernels but for their scales: a quantize_dynamic
BERT's x_scale * w_scale, a QDQ model's activation scales, each a literal of its layer. Written
into the C, they make every layer's kernel different, and the C compiler's time, most of a cold
compile, grows with the layers (emit.emit_graph shares only kernels whose C is the same but for
the name). Here, before planning, kernels whose bodies are the same but for the values of some
f32 scalar literals read as floats have those literals made inputs, read from a constant of the kernelized graph
(the runtime's constant slots, runtime.program.plan_memory): their C is then one. A literal every
such kernel has alike stays a literal (gelu's 0.5, relu6's 6), and so does every literal of a
kernel with no twin.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from eqfuse.ir.graph import Graph, Node

# the ops whose argument at this position is a float scale whatever their other arguments' types
SCALE_ARG = {"quantize_linear": 1, "dequantize_linear": 1}


def _liftable(body: Graph) -> set[int]:
    """The body's literals that may become inputs: f32 scalar consts (the runtime's constants are
    f32) that every op reading them reads as a float: an f32 op of f32 arguments, or a quantizer's
    scale. (A literal beside an integer tensor is an integer in the C, cexpr: not lifted.)"""
    users: dict[int, list[Node]] = defaultdict(list)
    for n in body.nodes:
        for a in n.args:
            users[a].append(n)

    def as_float(c: int, u: Node) -> bool:
        if SCALE_ARG.get(u.op) is not None and u.args[SCALE_ARG[u.op]] == c:
            return c not in u.args[:SCALE_ARG[u.op]] + u.args[SCALE_ARG[u.op] + 1:]
        return u.type.dtype == "f32" and all(body.nodes[a].type.dtype == "f32" for a in u.args)

    return {i for i, n in enumerate(body.nodes) if n.op == "const" and n.type.dtype == "f32" and tuple(n.type.shape) == ()
            and users[i] and all(as_float(i, u) for u in users[i])}


def _shape_key(body: Graph) -> tuple:
    """The body's structure with its liftable literals' values left out (and names, which no C reads)."""
    lift = _liftable(body)
    return (tuple((n.op, n.args, "lit" if i in lift else n.attrs, n.type) for i, n in enumerate(body.nodes)),
            tuple(body.inputs), tuple(body.outputs))


def lift_literals(kg: Graph) -> tuple[Graph, dict[int, int]]:
    """(kg with the literals that set twin kernels apart made inputs of theirs, read from consts
    added just before each kernel; kg's node ids -> the new graph's). kg (a kernelized graph:
    inputs, consts and kernels at top level) and its bodies are not changed."""
    twins: dict[tuple, list[int]] = defaultdict(list)
    for i, n in enumerate(kg.nodes):
        if n.op == "kernel":
            twins[_shape_key(n.body)].append(i)
    lift: dict[int, list[int]] = {}  # kernel -> the body's literals to lift
    for group in twins.values():
        body0 = kg.nodes[group[0]].body
        differ = [b for b in sorted(_liftable(body0))
                  if any(kg.nodes[i].body.nodes[b].value != body0.nodes[b].value for i in group[1:])]
        lift.update((i, differ) for i in group if differ)
    if not lift:
        return kg, {i: i for i in range(len(kg.nodes))}
    out = Graph(kg.name, pos=kg.pos)
    ids: dict[int, int] = {}
    for i, n in enumerate(kg.nodes):
        args = [ids[a] for a in n.args]
        if i in lift:
            body = Graph(n.body.name, list(n.body.nodes), list(n.body.inputs), list(n.body.outputs), n.body.pos)
            for b in lift[i]:
                lit = body.nodes[b]
                args.append(out.add(Node("const", attrs=lit.attrs, type=lit.type)))
                body.nodes[b] = Node("input", type=lit.type, name=f"lit{b}")
                body.inputs.append(b)
            n = replace(n, body=body)
        ids[i] = out.add(replace(n, args=tuple(args)))
    out.inputs = [ids[i] for i in kg.inputs]
    out.outputs = [ids[o] for o in kg.outputs]
    return out, ids
