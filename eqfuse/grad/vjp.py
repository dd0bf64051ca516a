"""Reverse-mode differentiation on the graph IR: the joint forward + backward graph.

    grad_graph(g, ["w1", "b1"]) -> a graph returning (*g's outputs, dloss/dw1, dloss/db1)

The loss is g's first output (a scalar). Walking the nodes in reverse, each float node's
gradient (the sum of what its readers contributed) is sent to its float arguments through the
first rule of eqfuse/grad/derivatives.rw that matches the node. The result is a plain graph
for the same optimizer and backend; nothing here knows about kernels or C.
"""

from __future__ import annotations

import math
import operator
from dataclasses import replace
from typing import Sequence

from eqfuse.errors import Pos
from eqfuse.grad.emitter import Emitter, GradError
from eqfuse.grad.helpers import HELPERS, Ctx, unbroadcast
from eqfuse.grad.rules import Derivative, PHelper, derivatives, match
from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.ops import OPS
from eqfuse.optimizer.rules import AttrVar, Cond, PNum, POp, PVar, Test

_CMP = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
        ">=": operator.ge}


def check_wrt(g: Graph, wrt: Sequence[str], flag: str = "grad=") -> list[int]:
    """The input node ids of the parameters named by `wrt`; bad names and non-float parameters
    are errors naming the flag they came from."""
    from eqfuse.errors import did_you_mean

    if isinstance(wrt, str) or not wrt:
        raise GradError(f"{flag} expects a non-empty list of parameter names")
    params = dict(zip([n for n, _ in g.params], g.inputs))
    ids = []
    for name in wrt:
        if name not in params:
            raise GradError(f"{flag}: '{name}' is not a parameter of graph {g.name} (parameters: "
                            f"{', '.join(params)})", hint=did_you_mean(str(name), params))
        t = g.nodes[params[name]].type
        if t.dtype != "f32":
            raise GradError(f"{flag}: '{name}' is {t}; only f32 parameters have gradients")
        if name in [g.nodes[i].name for i in ids]:
            raise GradError(f"{flag}: '{name}' is named twice")
        ids.append(params[name])
    return ids


def check_loss(g: Graph) -> int:
    if not g.outputs:
        raise GradError(f"graph {g.name} returns nothing to differentiate", g.pos)
    loss = g.outputs[0]
    t = g.nodes[loss].type
    if t.dtype != "f32" or any(d != 1 for d in t.shape):
        raise GradError(f"the first result of graph {g.name} is the loss and must be an f32 scalar, got {t}",
                        g.nodes[loss].pos or g.pos, "reduce it, e.g. return mean(...), other results")
    return loss


def grad_graph(g: Graph, wrt: Sequence[str], flag: str = "grad=", used: list | None = None) -> Graph:
    """g with the gradients of its first output (a scalar loss) with respect to the parameters
    `wrt` appended to its outputs, in that order. `used` collects (rule name, node id, argument) of each rule applied."""
    from eqfuse.optimizer.cost import unfused

    if any(n.op == "kernel" for n in g.nodes):
        g = unfused(g)  # kernel blocks are computations like any other: inline them
    targets = check_wrt(g, wrt, flag)
    loss = check_loss(g)
    em = Emitter(g)
    reach = _on_paths(g, targets, loss)
    grads: dict[int, list[int]] = {loss: [em.op("expand", [em.const(1.0)], shape=g.nodes[loss].type.shape)
                                          if g.nodes[loss].type.shape else em.const(1.0)]}
    for i in range(len(g.nodes) - 1, -1, -1):
        n = g.nodes[i]
        if i not in grads or n.op == "input":
            continue
        dy = _total(em, grads[i])
        grads[i] = [dy]
        em.pos = n.pos
        for k, a in enumerate(n.args):
            if a in reach:
                d = _vjp(em, i, n, k, dy, used)
                grads.setdefault(a, []).append(d)
    out = em.g
    names = {n.name for n in out.nodes if n.name}
    for name, t in zip(wrt, targets):
        d = _total(em, grads[t]) if t in grads else em.op("expand", [em.const(0.0)], shape=em.shape(t))
        if out.nodes[d].name is None and out.nodes[d].op not in ("input", "const"):
            gname = _fresh(f"d_{name}", names)
            out.nodes[d] = replace(out.nodes[d], name=gname)
        out.outputs.append(d)
    return _prune(out)


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def _on_paths(g: Graph, targets: list[int], loss: int) -> set[int]:
    """The f32 nodes that depend on a target and that the loss depends on."""
    down = set(targets)
    for i, n in enumerate(g.nodes):
        if any(a in down for a in n.args) and n.type.dtype == "f32":
            down.add(i)
    return down & g.ancestors(loss)


def _total(em: Emitter, parts: list[int]) -> int:
    t = parts[0]
    for p in parts[1:]:
        t = em.op("add", [t, p])
    return t


def _vjp(em: Emitter, i: int, n: Node, k: int, dy: int, used: list | None) -> int:
    d, env = _rule(em, n, k)
    if used is not None:
        used.append((d.name, i, k))
    ctx = Ctx(n, k)
    names = [a.name for a in d.lhs.args]
    variadic = OPS[n.op].arity[1] < 0
    vals = {**{nm: n.args[k] if variadic else a for nm, a in zip(names, n.args)}, "dy": dy, "y": i}
    out = _build(em, d.rhs, vals, env, ctx)
    return unbroadcast(em, out, em.g.nodes[n.args[k]].type.shape)


def _rule(em: Emitter, n: Node, k: int) -> tuple[Derivative, dict]:
    variadic = OPS[n.op].arity[1] < 0
    for d in derivatives():
        if d.op != n.op or (not variadic and (d.wrt != k or len(d.lhs.args) != len(n.args))):
            continue
        env = match(d, n.attr)
        if env is not None and all(_holds(em, c, d, n, env) for c in d.conds):
            return d, env
    what = f"{n.op}" + (f" (attributes {', '.join(f'{a}={v}' for a, v in n.attrs)})" if n.attrs else "")
    raise GradError(f"no derivative of {what} with respect to its argument {k + 1} "
                    f"(eqfuse/grad/derivatives.rw has none)", n.pos)


def _holds(em: Emitter, c, d: Derivative, n: Node, env: dict) -> bool:
    if isinstance(c, Test):
        return em.g.nodes[_arg(d, n, c.var)].op == "const"

    def term(t):
        if isinstance(t, tuple) and t and isinstance(t[0], str):
            if t[0] == "attr":
                return env[t[1]]
            shape = em.g.nodes[_arg(d, n, t[1])].type.shape
            return {"rank": lambda: len(shape), "shape": lambda: tuple(shape),
                    "size": lambda: math.prod(shape), "dim": lambda: shape[t[2]]}[t[0]]()
        return t
    assert isinstance(c, Cond)
    return bool(_CMP[c.op](term(c.lhs), term(c.rhs)))


def _arg(d: Derivative, n: Node, var: str) -> int:
    return n.args[[a.name for a in d.lhs.args].index(var)]


def _build(em: Emitter, p, vals: dict, env: dict, ctx: Ctx) -> int:
    if isinstance(p, PVar):
        if p.name in vals:
            return vals[p.name]
        return em.const(float(env[p.name]))  # an attribute used as an operand: its value
    if isinstance(p, PNum):
        return em.const(p.value)
    attrs = {k: (env[v.name] if isinstance(v, AttrVar) else v) for k, v in p.attrs}
    args = [_build(em, a, vals, env, ctx) for a in p.args]
    if isinstance(p, PHelper):
        return HELPERS[p.name][0](em, ctx, args, attrs)
    assert isinstance(p, POp)
    return em.op(p.op, args, **attrs)


def _prune(g: Graph) -> Graph:
    """Drop the nodes no output reads (a rule's unused intermediates), keeping the parameters."""
    live = set(g.inputs)
    for o in g.outputs:
        live |= g.ancestors(o)
    ids = {}
    out = Graph(g.name, pos=g.pos)
    for i, n in enumerate(g.nodes):
        if i in live:
            ids[i] = out.add(replace(n, args=tuple(ids[a] for a in n.args)))
    out.inputs = [ids[i] for i in g.inputs]
    out.outputs = [ids[o] for o in g.outputs]
    return out


__all__ = ["grad_graph", "check_wrt", "check_loss", "GradError", "Pos"]
