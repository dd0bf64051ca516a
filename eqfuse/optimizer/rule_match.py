"""A small matcher: a rule pattern (eqfuse.optimizer.rules) matched at one node of a Graph.

The reference the tests hold the e-graph's matching against; the optimizer never calls it.
"""

from __future__ import annotations

import math

import numpy as np

from eqfuse.optimizer.rules import AttrVar, PKernel, PNum, POp, PVar, Test


def match(pattern, graph, node: int, conds: tuple = ()) -> dict | None:
    """Match a pattern at one node of a Graph; the bindings, or None.

    A reference matcher for tests (the optimizer matches in the e-graph). Bindings map a tensor
    variable to a node id and an attribute variable to its value. A variable used twice must
    meet structurally equal nodes. A literal matches a "const" node equal to it in float32. A
    PKernel matches a kernel node whose body matches its result; variables bound to the body's
    inputs are reported as the kernel's outer arguments. `conds` (a Rule's conds) are checked on
    the node types: a comparison involving a named dimension holds only if it is ==/!= of names.
    """
    b: dict = {}
    if not _match(pattern, graph, node, b):
        return None
    for c in conds:
        if not _holds(c, graph, b):
            return None
    return {k: v[1] if _is_node(v) else v for k, v in b.items()}


def _is_node(v) -> bool:
    return isinstance(v, tuple) and len(v) == 3 and v[0] == "node"


def _same(graph, a: int, b: int) -> bool:
    if a == b:
        return True
    x, y = graph.nodes[a], graph.nodes[b]
    if x.op != y.op or x.op in ("input", "kernel") or x.attrs != y.attrs or len(x.args) != len(y.args):
        return False
    return all(_same(graph, i, j) for i, j in zip(x.args, y.args))


def _match(p, graph, node: int, b: dict, outer=None) -> bool:
    n = graph.nodes[node]
    if isinstance(p, PVar):
        target = node
        if outer is not None and n.op == "input":  # a kernel body input: the kernel's outer argument
            og, kernel_node = outer
            graph, target = og, og.nodes[kernel_node].args[graph.inputs.index(node)]
        prev = b.get(p.name)
        if prev is None:
            b[p.name] = ("node", target, graph)
            return True
        return prev[2] is graph and _same(graph, prev[1], target)
    if isinstance(p, PNum):
        return n.op == "const" and np.float32(n.value) == np.float32(p.value)
    if isinstance(p, PKernel):
        if n.op != "kernel" or n.body is None:
            return False
        body = n.body
        return _match(p.result, body, body.outputs[0], b, (graph, node))
    if isinstance(p, POp):
        if n.op != p.op or len(n.args) != len(p.args):
            return False
        attrs = n.attr
        for k, v in p.attrs:
            if isinstance(v, AttrVar):
                if v.name in b and b[v.name] != attrs.get(k):
                    return False
                b[v.name] = attrs.get(k)
            elif attrs.get(k) != v:
                return False
        return all(_match(q, graph, a, b, outer) for q, a in zip(p.args, n.args))
    return False


def _term(t, graph, b):
    if not isinstance(t, tuple) or not t or not isinstance(t[0], str):
        return t
    v = b.get(t[1])
    if t[0] == "attr":
        if _is_node(v):
            n = v[2].nodes[v[1]]
            if n.op != "const":
                raise TypeError("not a constant")
            return n.value
        return v
    if v is None:
        raise TypeError("unbound")
    shape = v[2].nodes[v[1]].type.shape
    if t[0] == "rank":
        return len(shape)
    if t[0] == "shape":
        return tuple(shape)
    if t[0] == "size":
        return math.prod(shape) if all(isinstance(d, int) for d in shape) else ("size", tuple(shape))
    i = t[2]
    if not -len(shape) <= i < len(shape):
        raise TypeError("axis out of range")
    return shape[i]


def _holds(c, graph, b) -> bool:
    if isinstance(c, Test):
        v = b.get(c.var)
        return bool(v) and v[2].nodes[v[1]].op == "const"
    ops = {"==": lambda x, y: x == y, "!=": lambda x, y: x != y, "<": lambda x, y: x < y,
           "<=": lambda x, y: x <= y, ">": lambda x, y: x > y, ">=": lambda x, y: x >= y}
    try:
        lhs, rhs = _term(c.lhs, graph, b), _term(c.rhs, graph, b)
        if isinstance(lhs, list):
            lhs = tuple(lhs)
        return bool(ops[c.op](lhs, rhs))
    except TypeError:
        return False
