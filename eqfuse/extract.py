"""Stage `extract`: the cheapest fused graph in the serialized e-graph, in Python.

Never egglog's own extractor: its tree cost counts a shared tensor once per reader (so it always
recomputes) and it ran out of memory at 8 transformer layers. Here:

1. Every tensor e-node is a candidate kernel: an op e-node is a one-op kernel over its operands,
   a `K` e-node a fused kernel whose body is its S tree (a `L t` leaf reads class t). Its body is
   built as a Graph and must pass `kernels.classify` (plus: an epilogue never broadcasts a
   contraction, row or attention result to a larger shape) -- illegal candidates are dropped.
   Its cost is `cost.kernel_cost` of that body: exact per kernel.
2. Greedy: bottom-up, each class takes its node of least tree cost (fast, any size).
3. ILP (scipy.optimize.milp / HiGHS) when the e-graph is small enough: a binary per node, one
   node per reachable class, every chosen node's operand classes chosen, minimizing the sum of
   kernel costs -- exactly the DAG cost (a shared tensor is written once, read by each reader).
   Cycles are cut lazily (a chosen cycle gets a constraint and the ILP runs again); a time
   limit bounds it and the greedy result is the fallback.
4. Each candidate selection becomes a Graph and is rescored by `cost.graph_value`; the best wins.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from . import cost as C
from .egraph import EData, ENode, text_attr, text_num
from .errors import ShapeError
from .graph import Graph, Node
from .kernels import Unsupported, classify
from .ops import OPS
from .shapes import TType

ILP_MAX_NODES = 2000
ILP_TIME_LIMIT = 1.0
INF = float("inf")


# ---------------------------------------------------------------- class types


def class_types(d: EData, graph: Graph) -> dict[int, TType]:
    """The type of every class: from the original node it holds, else inferred from a node."""
    types: dict[int, TType] = {c: graph.nodes[o].type for c, o in d.orig.items()}
    pending = [c for c in d.classes if c not in types]
    changed = True
    while pending and changed:
        changed = False
        rest = []
        for c in pending:
            t = None
            for nid in d.classes[c]:
                t = _node_type(d, d.nodes[nid], types)
                if t is not None:
                    break
            if t is None:
                rest.append(c)
            else:
                types[c] = t
                changed = True
        pending = rest
    return types


def _node_type(d: EData, n: ENode, types) -> TType | None:
    if n.kind in ("Cn", "Cs"):
        return TType(())
    if n.kind in ("K", "L"):
        return types.get(n.children[0])
    if n.kind == "In":
        return None
    ts = [types.get(c) for c in n.children]
    if any(t is None for t in ts):
        return None
    op = OPS[n.op]
    try:
        return op.infer(ts, node_attrs(n))
    except (ShapeError, ValueError, TypeError, IndexError, KeyError):
        return None


def node_attrs(n: ENode) -> dict:
    op = OPS[n.op]
    return {s.name: text_attr(s.kind, v) for s, v in zip(op.attrs, n.attrs)}


# ---------------------------------------------------------------- candidate kernels


@dataclass
class Cand:
    node: int
    cls: int
    reads: tuple[int, ...]  # T classes read (materialized operands), distinct, in body-input order
    kc: C.KCost
    cost: float
    body: Graph | None  # None for inputs and constants


@dataclass
class Problem:
    d: EData
    types: dict[int, TType]
    roots: list[int]
    cands: dict[int, list[Cand]] = field(default_factory=dict)  # class -> legal candidates
    const_of: dict[int, str] = field(default_factory=dict)  # T class -> constant text, if it holds one


def build_problem(d: EData, graph: Graph, model: str, dims=None, perf=None) -> Problem:
    types = class_types(d, graph)
    roots = [d.outputs[k] for k in sorted(d.outputs)]
    pb = Problem(d, types, roots)
    for c, nids in d.classes.items():
        for nid in nids:
            n = d.nodes[nid]
            if n.kind == "Cn":
                pb.const_of.setdefault(c, n.op)
    p = perf if model == "time" else None
    for c, nids in d.classes.items():
        if d.sort[c] != "T":
            continue
        out = []
        for nid in nids:
            n = d.nodes[nid]
            if n.kind in ("In", "Cn"):
                out.append(Cand(nid, c, (), C.ZERO, 0.0, None))
                continue
            try:
                body, reads = kernel_body(pb, n)
                ks = classify(body)
                _check_shape(body, ks)
            except (Unsupported, _Skip):
                continue
            kc = C.kernel_cost(body, dims)
            # ties go to fewer kernels (memory) or fewer bytes (launches)
            tie = 1e-3 * (kc.launches - kc.views) if model == "memory" else 1e-12 * kc.bytes
            out.append(Cand(nid, c, reads, kc, C.value(kc, model, p) + tie, body))
        pb.cands[c] = out
    return pb


class _Skip(Exception):
    pass


def _check_shape(body: Graph, ks) -> None:
    """An epilogue must not broadcast a contraction, row or attention result to a larger shape
    (the backend would split the kernel again)."""
    if ks.kind in ("contraction", "row", "attention", "reduce") and ks.anchor is not None:
        a = body.nodes[ks.anchor].type.shape
        result = ks.parts[-1] if ks.kind == "attention" else body.outputs[0]  # before output transposes
        o = body.nodes[result].type.shape
        if tuple(a) != tuple(o):
            raise _Skip()


def kernel_body(pb: Problem, n: ENode) -> tuple[Graph, tuple[int, ...]]:
    """The body Graph of candidate n and the T classes it reads (its inputs, in order)."""
    d, types = pb.d, pb.types
    body = Graph("kernel")
    reads: dict[int, int] = {}  # T class -> body input id
    memo: dict[int, int] = {}  # S class -> body node id

    def load(tc: int) -> int:
        if tc in pb.const_of:
            return body.add(Node("const", attrs=(("value", text_num(pb.const_of[tc])),), type=TType(())))
        if tc not in reads:
            t = types.get(tc)
            if t is None:
                raise _Skip()
            reads[tc] = body.add(Node("input", type=t, name=f"c{tc}"))
            body.inputs.append(reads[tc])
        return reads[tc]

    def op_node(m: ENode, args: list[int]) -> int:
        op = OPS[m.op]
        attrs = node_attrs(m)
        try:
            t = op.infer([body.nodes[a].type for a in args], attrs)
        except (ShapeError, ValueError, TypeError, IndexError, KeyError):
            raise _Skip() from None
        return body.add(Node(m.op, tuple(args), tuple((s.name, attrs[s.name]) for s in op.attrs), t))

    def s_value(sc: int, depth: int = 0) -> int:
        if sc in memo:
            return memo[sc]
        if depth > 200:
            raise _Skip()
        m = d.nodes[d.classes[sc][0]]  # S classes hold congruent nodes: any one is the body
        if m.kind == "L":
            r = load(m.children[0])
        elif m.kind == "Cs":
            r = body.add(Node("const", attrs=(("value", text_num(m.op)),), type=TType(())))
        else:
            r = op_node(m, [s_value(x, depth + 1) for x in m.children])
        memo[sc] = r
        return r

    if n.kind == "K":
        out = s_value(n.children[0])
    else:
        out = op_node(n, [load(x) for x in n.children])
    body.outputs = [out]
    return body, tuple(reads)


# ---------------------------------------------------------------- greedy


def greedy(pb: Problem) -> dict[int, Cand]:
    """Each class's candidate of least tree cost (bottom-up to a fixed point)."""
    best: dict[int, float] = {}
    pick: dict[int, Cand] = {}
    changed = True
    while changed:
        changed = False
        for c, cands in pb.cands.items():
            for cd in cands:
                if any(r not in best for r in cd.reads):
                    continue
                v = cd.cost + sum(best[r] for r in cd.reads)
                if v < best.get(c, INF) - 1e-9:
                    best[c] = v
                    pick[c] = cd
                    changed = True
    return _refine(pb, pick, best)


def _refine(pb: Problem, pick: dict[int, Cand], best: dict[int, float], rounds: int = 3) -> dict[int, Cand]:
    """DAG-aware passes over the greedy choice: a class switches to a candidate whose own cost plus
    the tree cost of the operands not yet materialized is lower (a tensor some kernel already
    writes is free to read again, at the cost of its read)."""
    sel = _reachable(pb, pick)
    for _ in range(rounds):
        improved = False
        for c in list(sel):
            if c not in sel:
                continue
            cur = sel[c]
            others = set(sel) - {c}
            freed = sum(best[r] for r in set(cur.reads) if _only_reader(sel, r, c))
            choice, gain = None, -1e-9
            for cd in pb.cands.get(c, []):
                if cd is cur or any(r not in best for r in cd.reads):
                    continue
                delta = cd.cost - cur.cost + sum(best[r] for r in set(cd.reads) if r not in others)
                delta -= freed - sum(best[r] for r in set(cur.reads) if r in cd.reads and _only_reader(sel, r, c))
                if delta < gain and not _reaches(pb, pick, cd, c):
                    choice, gain = cd, delta
            if choice is not None:
                pick[c] = choice
                try:
                    sel = _reachable(pb, pick)
                    improved = True
                except ExtractError:
                    pick[c] = cur
                    sel = _reachable(pb, pick)
        if not improved:
            break
    return sel


def _only_reader(sel: dict[int, Cand], r: int, c: int) -> bool:
    return all(r not in cd.reads for k, cd in sel.items() if k != c)


def _reaches(pb: Problem, pick: dict[int, Cand], cd: Cand, target: int) -> bool:
    """Would choosing cd for `target` make a cycle through the current picks?"""
    seen, stack = set(), list(cd.reads)
    while stack:
        x = stack.pop()
        if x == target:
            return True
        if x in seen or x not in pick:
            continue
        seen.add(x)
        stack.extend(pick[x].reads)
    return False


def _reachable(pb: Problem, pick: dict[int, Cand]) -> dict[int, Cand]:
    out: dict[int, Cand] = {}
    stack = list(pb.roots)
    while stack:
        c = stack.pop()
        if c in out:
            continue
        if c not in pick:
            raise ExtractError(f"no legal kernel computes e-class {c}")
        out[c] = pick[c]
        stack.extend(pick[c].reads)
    return out


class ExtractError(Exception):
    pass


def selection_cost(sel: dict[int, Cand]) -> float:
    return sum(cd.cost for cd in sel.values())


# ---------------------------------------------------------------- ILP


def ilp(pb: Problem, time_limit: float = ILP_TIME_LIMIT, warm: dict[int, Cand] | None = None
        ) -> tuple[dict[int, Cand] | None, str]:
    """Exact DAG extraction with lazy cycle cuts; (selection or None, status text)."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    live = _live_classes(pb)
    cands = [cd for c in live for cd in pb.cands.get(c, [])]
    if not cands:
        return None, "empty"
    idx = {id(cd): i for i, cd in enumerate(cands)}
    by_class: dict[int, list[int]] = {}
    for i, cd in enumerate(cands):
        by_class.setdefault(cd.cls, []).append(i)
    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0

    def row(entries, lb, ub):
        nonlocal r
        for j, v in entries:
            rows.append(r)
            cols.append(j)
            vals.append(v)
        lo.append(lb)
        hi.append(ub)
        r += 1

    for c, js in by_class.items():
        row([(j, 1.0) for j in js], 1.0 if c in pb.roots else 0.0, 1.0)
    for i, cd in enumerate(cands):
        for rc in cd.reads:
            row([(i, 1.0)] + [(j, -1.0) for j in by_class.get(rc, [])], -np.inf, 0.0)
    costs = np.array([max(cd.cost, 0.0) for cd in cands]) + 1e-6  # a positive cost: no free cycles
    scale = max(costs.max(), 1.0)
    costs = costs / scale
    deadline = time.perf_counter() + time_limit
    cuts: list[tuple[list[tuple[int, float]], float]] = []
    for _ in range(50):
        all_rows = list(zip(rows, cols, vals))
        nr = r
        lo2, hi2 = list(lo), list(hi)
        for entries, ub in cuts:
            for j, v in entries:
                all_rows.append((nr, j, v))
            lo2.append(-np.inf)
            hi2.append(ub)
            nr += 1
        rr, cc, vv = zip(*all_rows)
        A = coo_matrix((vv, (rr, cc)), shape=(nr, len(cands))).tocsr()
        left = deadline - time.perf_counter()
        if left <= 0:
            return None, "time_limit"
        res = milp(costs, constraints=LinearConstraint(A, lo2, hi2), integrality=np.ones(len(cands)),
                   bounds=Bounds(0, 1), options={"time_limit": left, "disp": False})
        if res.x is None:
            return None, f"no solution ({res.message})"
        chosen = {cands[i].cls: cands[i] for i in np.flatnonzero(res.x > 0.5)}
        cyc = _find_cycle(pb, chosen)
        if cyc is None:
            status = "optimal" if res.status == 0 else "feasible"
            try:
                return _reachable(pb, chosen), status
            except ExtractError:
                return None, "incomplete"
        cuts.append(([(idx[id(cd)], 1.0) for cd in cyc], len(cyc) - 1.0))
    return None, "too many cycles"


def _live_classes(pb: Problem) -> list[int]:
    """Classes reachable from the roots through any candidate."""
    seen, stack = set(), list(pb.roots)
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        for cd in pb.cands.get(c, []):
            stack.extend(cd.reads)
    return sorted(seen)


def _find_cycle(pb: Problem, chosen: dict[int, Cand]) -> list[Cand] | None:
    state: dict[int, int] = {}
    path: list[int] = []

    def dfs(c: int):
        state[c] = 1
        path.append(c)
        cd = chosen.get(c)
        for rc in (cd.reads if cd else ()):
            if state.get(rc) == 1:
                return [chosen[x] for x in path[path.index(rc):]]
            if rc not in state:
                found = dfs(rc)
                if found:
                    return found
        path.pop()
        state[c] = 2
        return None

    import sys

    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
    for root in pb.roots:
        if root not in state:
            found = dfs(root)
            if found:
                return found
    return None


# ---------------------------------------------------------------- selection -> Graph


def to_graph(pb: Problem, sel: dict[int, Cand], original: Graph) -> Graph:
    """The fused Graph: inputs (all parameters, in order), constants, and one kernel per class."""
    d = pb.d
    g = Graph(original.name, pos=original.pos)
    by_name: dict[str, int] = {}
    for i in original.inputs:
        n = original.nodes[i]
        by_name[n.name] = g.add(Node("input", type=n.type, name=n.name, pos=n.pos))
        g.inputs.append(by_name[n.name])
    ids: dict[int, int] = {}
    used_names = set(by_name)

    def name_of(c: int) -> str | None:
        o = d.orig.get(c)
        if o is None:
            return None
        nm = original.nodes[o].name
        if nm is None or nm in used_names or original.nodes[o].op in ("input", "const"):
            return None
        used_names.add(nm)
        return nm

    order: list[int] = []
    state: dict[int, int] = {}
    for root in pb.roots:  # post-order, iteratively (deep graphs)
        stack = [(root, False)]
        while stack:
            c, done = stack.pop()
            if done:
                if state.get(c) != 2:
                    state[c] = 2
                    order.append(c)
                continue
            if c in state:
                continue
            state[c] = 1
            stack.append((c, True))
            stack.extend((r, False) for r in reversed(sel[c].reads))
    for c in order:
        cd = sel[c]
        n = d.nodes[cd.node]
        if n.kind == "In":
            ids[c] = by_name[n.op]
        elif n.kind == "Cn":
            ids[c] = g.add(Node("const", attrs=(("value", text_num(n.op)),), type=TType(())))
        else:
            body = _renamed(cd.body, cd.reads, g, ids)
            t = body.nodes[body.outputs[0]].type
            ids[c] = g.add(Node("kernel", tuple(ids[r] for r in cd.reads), (), t, name=name_of(c), body=body))
    g.outputs = [ids[r] for r in pb.roots]
    return g


def _renamed(body: Graph, reads, g: Graph, ids) -> Graph:
    from dataclasses import replace

    nodes = list(body.nodes)
    for inp, r in zip(body.inputs, reads):
        outer = g.nodes[ids[r]]
        nodes[inp] = replace(nodes[inp], name=outer.name)
    return Graph("kernel", nodes, list(body.inputs), list(body.outputs))
