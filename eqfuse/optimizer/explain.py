"""Why the optimizer's result has the kernel boundaries it has (`eqfuse opt --explain`, the
report's `boundaries` and `fused_kernels`).

For every tensor one kernel of the result writes and another reads (a boundary), the two kernels
are joined here in Python -- the producer's body inlined into the consumer's where the consumer
reads it -- and the join is judged, in this order:

1. `unlowerable`: the kinds registry (`eqfuse.ir.kernels.classify`, on the planner's machine,
   as extraction asks it) refuses the joined body: the backend has no kernel kind for it. The
   detail is classify's message, which names the condition that fails, and `kind` the kind
   the join would have been (the kind of its one non-pointwise op, or "mixed").
2. `cost`: the join is lowerable but not cheaper under the cost model than storing the tensor:
   `stored` and `joined` give both choices' bytes, launches and estimated time (the two kernels
   against the joined kernel, plus the producer when other kernels or the graph's outputs still
   need its tensor -- a join then recomputes it).
3. `limit`: the join is lowerable and cheaper, not in the e-graph, and a limit (iterations,
   e-nodes, time) stopped the search before it was found.
4. `no_rule`: the join is lowerable and cheaper, and the e-graph saturated without it: no e-node
   of the consumer's e-class joins the two (disabled rules are named).

"In the e-graph" is a lookup (`Joins.holds_join`): the consumer's e-class holds a kernel e-node
`K(body)` whose body tree (S e-nodes, not entering the tensors it reads, `L t`) reaches the body of
a kernel e-node of the producer's e-class (or of a view between them): the producer computed
inside the consumer. Each boundary says what the lookup found (`joined_in_egraph`). When the
e-graph holds a cheaper lowerable join that extraction did not take, the extraction is to blame:
`limit` when the ILP did not prove it optimal, else `cost` (the whole graph is cheaper without it,
the kernel the e-graph holds being another than the one estimated here). Without the e-graph (a
caller of `explain` that has none), 3 and 4 are deduced from "cheaper and not taken" instead.

For every fused kernel (a body of more than one op), `fused_kernels` gives the bytes it moves and
the bytes it saves against running its ops one kernel each.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.kernels import K, Unsupported, classify
from eqfuse.ir.ops import OPS
from eqfuse.machine import Machine
from eqfuse.optimizer import cost as C

REASONS = ("no_rule", "unlowerable", "cost", "limit")
EPS = 1e-9


@dataclass
class Joins:
    """The fusion e-graph extraction read, and the e-class of each kernel of the result graph."""

    data: object  # edata.EData
    classes: dict[int, int]  # top-level kernel node -> its e-class
    enodes: dict[int, int] | None = None  # top-level kernel node -> the e-node extraction chose for it

    def renumbered(self, ids: Mapping[int, int]) -> "Joins":
        """The same for a graph whose nodes are those of this one renumbered by `ids`."""
        return Joins(self.data, {ids[i]: c for i, c in self.classes.items() if i in ids},
                     None if self.enodes is None else {ids[i]: e for i, e in self.enodes.items() if i in ids})

    def holds_join(self, p: int, c: int, through: Sequence[int] = ()) -> bool | None:
        """Whether an e-node of kernel c's e-class computes kernel p (or a view of it in
        `through`) inside its body -- p as extraction chose it, when the choice is known: another
        kernel of p's e-class inlined into c (a row op over a stored tensor, where p is the GEMM
        with that row op as its epilogue) is another join, which the estimate here is not of.
        None when a kernel has no e-class here."""
        d = self.data
        if c not in self.classes or any(x not in self.classes for x in (p, *through)):
            return None

        def kernels_of(x: int) -> list[int]:
            e = (self.enodes or {}).get(x)
            if e is not None and d.nodes[e].kind == "K":
                return [e]
            return [i for i in d.classes[self.classes[x]] if d.nodes[i].kind == "K"]

        targets = {d.nodes[i].children[0] for x in (p, *through) for i in kernels_of(x)}
        seen: set[int] = set()
        stack = [d.nodes[i].children[0] for i in d.classes[self.classes[c]] if d.nodes[i].kind == "K"]
        while stack:
            sc = stack.pop()
            if sc in targets:
                return True
            if sc in seen:
                continue
            seen.add(sc)
            for i in d.classes.get(sc, ()):
                n = d.nodes[i]
                if n.kind == "op":  # an S op computed in the kernel; `L t` reads a tensor, `Cs` a constant
                    stack.extend(n.children)
        return False


def printed_names(g: Graph) -> dict[int, str]:
    """The name each top-level node has in `graph_text(g)` (the returned kernels: "return")."""
    from eqfuse.ir.printer import Printer

    taken = {n.name for _, _, n in g.walk() if n.name}
    p = Printer(g, {i: g.nodes[i].name for i in g.inputs}, taken)
    p.body("    ")
    names = dict(p.names)
    outs = [o for o in g.outputs if o not in names]
    for k, o in enumerate(outs):
        names[o] = "return" if len(g.outputs) == 1 else f"return[{g.outputs.index(o)}]"
    return names


def joined_body(g: Graph, p: int, c: int, through: Sequence[int] = ()) -> Graph:
    """The body of kernel c with kernel p's body inlined where c reads p's tensor, directly or
    through the view kernels `through` (reshapes: c reads p's buffer under another shape)."""
    inline = {p, *through}
    body = Graph("kernel")
    outer: dict[int, int] = {}
    done: dict[int, int] = {}

    def read(a: int) -> int:
        if a in inline:
            if a not in done:
                done[a] = emit(a)
            return done[a]
        if a not in outer:
            an = g.nodes[a]
            outer[a] = body.add(Node("input", type=an.type, name=an.name))
            body.inputs.append(outer[a])
        return outer[a]

    def emit(k: int) -> int:  # kernel k's body, its inputs read through `read`
        kb, n = C.node_body(g, k), g.nodes[k]
        args = n.args if n.op == "kernel" else tuple(dict.fromkeys(a for a in n.args if g.nodes[a].op != "const"))
        m = {i: read(a) for i, a in zip(kb.inputs, args)}
        for j, bn in enumerate(kb.nodes):
            if bn.op != "input":
                m[j] = body.add(replace(bn, args=tuple(m[x] for x in bn.args), name=None))
        return m[kb.outputs[0]]

    body.outputs = [emit(c)]
    return body


def _source(g: Graph, a: int, is_view) -> tuple[int, list[int]]:
    """The kernel whose buffer top-level node a is, through view kernels, and those views."""
    views = []
    while is_view(a) and g.nodes[a].args and g.nodes[g.nodes[a].args[0]].op not in ("input", "const"):
        views.append(a)
        a = g.nodes[a].args[0]
    return a, views


# the kernel kind a body with one non-pointwise op of this op kind would be
_KIND_OF_OP = {"contraction": K.CONTRACTION, "row": K.ROW, "reduce": K.REDUCE, "layout": K.LAYOUT,
               "index": K.INDEX, "attention_grad": K.ATTENTION_GRAD}


def _kind_of(body: Graph) -> tuple[str, list[str]]:
    """The kernel kind the body would be (its non-pointwise op's kind, or "mixed"), and those ops."""
    heavy = [n.op for n in body.nodes if n.op not in ("input", "const") and OPS[n.op].kind not in ("pointwise", "channel")]
    if not heavy:
        return K.POINTWISE, heavy
    if len(heavy) == 1:
        return _KIND_OF_OP[OPS[heavy[0]].kind], heavy
    return "mixed", heavy


def lowerable(body: Graph, machine: Machine | None = None) -> str | None:
    """None if the backend lowers `body` as one kernel on `machine` (the planner's, as extraction
    requires: the same kinds registry decides); else why not."""
    try:
        classify(body, machine)
    except Unsupported as e:
        return str(e)
    return None


def _choice(kc: C.KCost, p: dict) -> dict:
    return {"bytes": kc.bytes, "kernels": kc.launches - kc.views, "est_time_s": C.value(kc, "time", p)}


def _better(joined: C.KCost, stored: C.KCost, model: str, p: dict) -> bool:
    """Would the cost model (with extraction's tie-breaking) prefer the joined kernel?"""
    vj, vs = C.value(joined, model, p), C.value(stored, model, p)
    if vj < vs - EPS * max(1.0, abs(vs)):
        return True
    if vj > vs + EPS * max(1.0, abs(vs)):
        return False
    if model == "memory":
        return joined.launches - joined.views < stored.launches - stored.views
    if model == "launches":
        return joined.bytes < stored.bytes
    return False


def explain(g: Graph, cost: str = "memory", dims: Mapping[str, int] | None = None, *,
            stop_reason: str = "saturated", limit: str | None = None, disabled: Sequence[str] = (),
            p: dict | None = None, deadline: float | None = None, ilp: str = "optimal",
            joins: Joins | None = None, machine: Machine | None = None) -> dict:
    """{"boundaries": [...], "fused_kernels": [...]} for the optimized graph g (kernels at the top).
    Past `deadline` (a time.perf_counter() value: the optimizer's time limit) the boundaries left
    are listed without being examined, reason `limit` (20,000 of them take about 1.5 s). `ilp` is
    the report's ILP status: unless it proved the extraction optimal ("optimal..."), a cheaper join
    not taken may have been in the e-graph, and the extraction's limits are named instead of rules.
    `joins` (the e-graph and g's e-classes) makes `no_rule` a lookup in the e-graph. `machine` is
    the planner's (lowerable)."""
    import time

    p = p or C.perf()
    names = printed_names(g)
    users: dict[int, list[int]] = {}
    for i, n in enumerate(g.nodes):
        for a in dict.fromkeys(n.args):
            users.setdefault(a, []).append(i)
    kcost = {}

    def kc(i: int) -> C.KCost:
        if i not in kcost:
            kcost[i] = C.kernel_cost(C.node_body(g, i), dims)
        return kcost[i]

    boundaries = []
    is_kernel = [n.op not in ("input", "const") for n in g.nodes]

    def is_view(i: int) -> bool:
        return is_kernel[i] and kc(i).views > 0

    for c, n in enumerate(g.nodes):
        if not is_kernel[c] or is_view(c):  # a view stores nothing: its reader's boundary is explained
            continue
        for a0 in dict.fromkeys(n.args):
            if not is_kernel[a0]:
                continue
            a, views = _source(g, a0, is_view)
            if is_view(a):  # a view of a graph input: no kernel writes it
                continue
            entry = {"tensor": names.get(a, f"t{a}"), "type": str(g.nodes[a].type), "from": names.get(a, f"t{a}"),
                     "to": names.get(c, f"t{c}")}
            if views:
                entry["through_views"] = [names.get(v, f"t{v}") for v in views]
            if deadline is not None and time.perf_counter() > deadline:
                entry.update(reason="limit", detail="not examined: the time limit ran out before this boundary")
                boundaries.append(entry)
                continue
            held = joins.holds_join(a, c, views) if joins is not None else None
            if held is not None:
                entry["joined_in_egraph"] = held
            body = joined_body(g, a, c, views)
            why = lowerable(body, machine)
            if why is not None:
                kind, heavy = _kind_of(body)
                entry.update(reason="unlowerable", kind=kind, ops=heavy, detail=why)
                boundaries.append(entry)
                continue
            # the tensor is still needed when other kernels or the outputs read it (or its views)
            kept = any(len(users.get(x, [])) > 1 or x in g.outputs for x in [a, *views])
            producer = sum((kc(v) for v in views), kc(a))
            stored = producer + kc(c)
            joined = C.kernel_cost(body, dims) + (producer if kept else C.ZERO)
            entry["stored"], entry["joined"] = _choice(stored, p), _choice(joined, p)
            if not _better(joined, stored, cost, p):
                entry.update(reason="cost", detail=f"storing it is no dearer under the {cost} cost model"
                             + (" (the join would recompute it: other kernels read it too)" if kept else ""))
            elif held and not ilp.startswith("optimal"):
                entry.update(reason="limit", detail=f"the e-graph holds a join, and the extraction is not proven "
                             f"optimal (ILP: {ilp or 'not run'})")
            elif held:
                entry.update(reason="cost", detail="the e-graph holds a join, and the exact extraction found the "
                             "graph cheaper without it")
            elif stop_reason != "saturated":
                entry.update(reason="limit", detail=f"the search stopped before finding the join: {limit or stop_reason}")
            elif held is None and not ilp.startswith("optimal"):
                entry.update(reason="limit", detail=f"the extraction is not proven optimal (ILP: {ilp or 'not run'}): "
                             "the e-graph may hold this join")
            else:
                entry.update(reason="no_rule", detail="no rule joins the two; the join is lowerable and cheaper"
                             + (" (no e-node of the consumer's e-class joins them)" if held is False else "")
                             + (f" (rules disabled: {', '.join(disabled)})" if disabled else ""))
            boundaries.append(entry)
    fused = []
    for i, n in enumerate(g.nodes):
        if n.op != "kernel":
            continue
        ops = [b for b in n.body.nodes if b.op not in ("input", "const")]
        if len(ops) < 2:
            continue
        alone = C.graph_kernels(n.body, dims)
        fused.append({"kernel": names.get(i, f"t{i}"), "ops": len(ops), "bytes": kc(i).bytes,
                      "bytes_unfused": alone.bytes, "bytes_saved": alone.bytes - kc(i).bytes})
    return {"boundaries": boundaries, "fused_kernels": fused}


def explain_text(r: dict) -> str:
    """The `--explain` lines printed after the report."""
    from eqfuse.progress import seconds
    def mb(b):
        return f"{b / 1e6:.3f} MB"

    def choice(c):
        return f"{mb(c['bytes'])}, {c['kernels']} kernel{'s' * (c['kernels'] != 1)}, {seconds(c['est_time_s'])}"

    lines = [f"# boundaries of graph {r['graph_name']} (tensors passed between two kernels):"]
    for b in r.get("boundaries", ()):
        via = f" via {', '.join(b['through_views'])}" if b.get("through_views") else ""
        head = f"#   {b['tensor']} -> {b['to']}{via} ({b['type']}): "
        if b["reason"] == "unlowerable":
            what = f" as a {b['kind']} kernel" if b["kind"] != "mixed" else ""  # mixed: the detail names the ops
            lines.append(head + f"the backend cannot lower the joined body{what}: {b['detail']}")
        elif b["reason"] == "cost":
            lines.append(head + f"the cost model chose to store it: stored {choice(b['stored'])}; "
                         f"joined {choice(b['joined'])}; {b['detail']}")
        elif b["reason"] == "limit":
            lines.append(head + f"a limit stopped the search: {b['detail']}")
        else:
            lines.append(head + b["detail"])
    if len(lines) == 1:
        lines.append("#   none")
    lines.append("# fused kernels (bytes moved against one kernel per op):")
    for f in r.get("fused_kernels", ()):
        lines.append(f"#   {f['kernel']}: {f['ops']} ops, {mb(f['bytes'])} instead of {mb(f['bytes_unfused'])}, "
                     f"saves {mb(f['bytes_saved'])}")
    if not r.get("fused_kernels"):
        lines.append("#   none")
    return "\n".join(lines)
