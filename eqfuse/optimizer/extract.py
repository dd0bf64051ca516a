"""Extraction: the cheapest fused graph out of the saturated e-graph.

Stage `extract`: the cheapest fused graph in the serialized e-graph, in Python.

Never egglog's own extractor: its tree cost counts a shared tensor once per reader (so it always
recomputes) and it ran out of memory at 8 transformer layers. Here:

1. Every tensor e-node is a candidate kernel: an op e-node is a one-op kernel over its operands,
   a `K` e-node a fused kernel whose body is its S tree (a `L t` leaf reads class t). Its body is
   built as a Graph and must pass the kinds registry's `classify` on the planner's machine (the
   backend's one lowerability decision) -- illegal candidates are dropped.
   Its cost is `cost.kernel_cost` of that body: exact per kernel.
2. Greedy: bottom-up, each class takes its node of least tree cost (fast, any size).
3. ILP (scipy.optimize.milp / HiGHS): a binary per candidate, at most one per class (exactly one
   for the roots), a chosen candidate's operand classes chosen too, minimizing the sum of kernel
   costs -- exactly the DAG cost (a shared tensor is written once, read by each reader).
   Candidates another one of the class dominates (no dearer, reads a subset) are left out.
   Cycles are cut lazily (a chosen cycle gets a constraint and the ILP runs again).
   - e-graphs of at most ILP_MAX_NODES e-nodes: one ILP over the whole live e-graph;
   - larger ones, or when that ILP runs out of time: by regions (`region_ilp`): the live classes are cut into topological slabs of
     about REGION_SIZE candidates (`regions`); each slab, with the operands only it reads or
     could newly materialize, is solved exactly with every class outside it held at the best
     selection so far, in two passes (the second shifted by half a slab, so no cut stays a
     cut), and a slab's result is kept only if the exact whole-graph cost does not get worse.
   A time limit bounds either; any failure leaves the greedy result.
4. Each candidate selection becomes a Graph and is rescored by `cost.graph_value`; the cheapest
   wins, greedy on ties (`extract` runs steps 2-4).

The exact extraction of `extract` (step 3 of its docstring): one ILP (scipy.optimize.milp /
HiGHS) over the live e-graph with lazy cycle cuts, or the same ILP region by region.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from eqfuse.errors import ShapeError
from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.kernels import Unsupported, classify
from eqfuse.ir.ops import OPS
from eqfuse.ir.shapes import TType
from eqfuse.machine import Machine
from eqfuse.optimizer import cost as C
from eqfuse.optimizer.edata import EData, ENode
from eqfuse.optimizer.egraph_text import text_attr, text_num


def _now() -> float:
    """The clock the deadlines here are read on (time.perf_counter; a test replaces it)."""
    return time.perf_counter()


ILP_MAX_NODES = 20000  # whole ILP up to here (BERT-base x12: 3.5k e-nodes, x48: 14k; benchmarks/bench_opt.py --layers 48)
ILP_TIME_LIMIT = 1.0
REGION_SIZE = 150  # ILP variables (candidates) per region
# Fused-kernel candidates built per e-class (`fused_enodes`). A binary op over two kernels' results
# makes a kernel of each pair of theirs, so a wide pointwise DAG gives a class thousands of K
# e-nodes, each of which build_problem would build and score (tests/test_extract.py's WIDE graph,
# 17 ops: over 6,000 in one class). The tiny BERT, GPT-2 and Llama of tests/test_zoo.py have at
# most 128 in a class, so the bound leaves such models' extraction as it was.
FUSED_PER_CLASS = 256
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
                t = _node_type(d.nodes[nid], types)
                if t is not None:
                    break
            if t is None:
                rest.append(c)
            else:
                types[c] = t
                changed = True
        pending = rest
    return types


def _node_type(n: ENode, types) -> TType | None:
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
    cut: str = ""  # what a deadline left out of the candidates (build_problem), for the report
    bounded: int = 0  # K e-nodes left out by FUSED_PER_CLASS (fused_enodes)
    _options: dict[int, list[Cand]] = field(default_factory=dict)  # cache of `options`
    # S class -> its body node's (attrs, type), or None where the op's shapes fail: an S class's
    # type depends on the types of the T classes it loads alone, so every candidate body that
    # holds it shares one inference (kernel_body)
    _typed: dict[int, tuple | None] = field(default_factory=dict)

    def options(self, c: int) -> list[Cand]:
        """Class c's candidates without those another one dominates (no dearer, reads a subset of
        the classes): swapping in the dominating one never costs more nor closes a cycle, so the
        ILP never needs them. (Many K e-nodes are the same kernel written differently.)"""
        if c not in self._options:
            # cheapest first, so a candidate kept before cd costs no more than cd: cd is dominated
            # when one of them reads a subset of cd's classes. Of candidates reading the same set,
            # only the first can be kept; each read set is built once (a class deep in a chain of
            # residual adds has thousands of candidates, nearly all kept: the tests are n^2 / 2)
            first: dict[frozenset[int], Cand] = {}
            for cd in sorted(self.cands.get(c, []), key=lambda x: (x.cost, len(set(x.reads)), x.node)):
                first.setdefault(frozenset(cd.reads), cd)
            # and a kept set is filed under its least class: one inside cd's reads holds that class
            kept: list[Cand] = []
            by_least: dict[int | None, list[frozenset[int]]] = {}
            for reads, cd in first.items():
                if not any(k <= reads for r in (None, *reads) for k in by_least.get(r, ())):
                    kept.append(cd)
                    by_least.setdefault(min(reads, default=None), []).append(reads)
            self._options[c] = kept
        return self._options[c]


def build_problem(d: EData, graph: Graph, model: str, dims=None, perf=None, machine: Machine | None = None,
                  deadline: float | None = None) -> Problem:
    """The candidates of every class: the e-nodes whose kernel body classify accepts on `machine`
    (the planner's, passed down by the driver; None: without its L1 check), with their costs.

    `deadline` (a time.perf_counter() value: the optimizer's time limit): the e-nodes that are
    not fused kernels (inputs, constants, one op over tensors) are built first, which makes a
    complete problem (the graph as loaded is in it); then the `K` e-nodes, the fused kernels,
    until the deadline: those left are left out, and `Problem.cut` says how many. A deadline
    passed before the first part is done raises OutOfTime (the caller falls back to one kernel
    per op)."""
    types = class_types(d, graph)
    roots = [d.outputs[k] for k in sorted(d.outputs)]
    pb = Problem(d, types, roots)
    for c, nids in d.classes.items():
        for nid in nids:
            n = d.nodes[nid]
            if n.kind == "Cn":
                pb.const_of.setdefault(c, n.op)
    p = perf if model == "time" else None

    def candidate(c: int, nid: int) -> Cand | None:
        n = d.nodes[nid]
        if n.kind in ("In", "Cn"):
            return Cand(nid, c, (), C.ZERO, 0.0, None)
        try:
            body, reads = kernel_body(pb, n)
            classify(body, machine)
        except (Unsupported, _Skip):
            return None
        kc = C.kernel_cost(body, dims)
        # ties go to fewer kernels (memory) or fewer bytes (launches), then to fewer bytes with u8
        # and i8 at one byte (C.stored_bytes: an f32 graph's order is unchanged)
        tie = 1e-3 * (kc.launches - kc.views) if model == "memory" else 1e-12 * kc.bytes
        tie += 1e-9 * C.stored_bytes(body, dims)
        return Cand(nid, c, reads, kc, C.value(kc, model, p) + tie, body)

    tensors = [c for c in d.classes if d.sort[c] == "T"]
    built: dict[int, dict[int, Cand | None]] = {c: {} for c in tensors}
    for c in tensors:  # what is not a fused kernel: a complete problem
        for nid in d.classes[c]:
            if d.nodes[nid].kind != "K":
                built[c][nid] = candidate(c, nid)
        if deadline is not None and _now() > deadline:
            raise OutOfTime("no time to build the one-op kernels' candidates")
    fused = fused_enodes(pb, tensors)
    for k, (c, nid) in enumerate(fused):  # the fused kernels, while there is time
        if deadline is not None and _now() > deadline:
            pb.cut = (f"fused-kernel candidates built for {k} of {len(fused)} e-nodes, "
                      f"the rest left out")
            break
        built[c][nid] = candidate(c, nid)
    for c in tensors:  # (in the e-class's order, which greedy's ties follow)
        pb.cands[c] = [cd for nid in d.classes[c] if (cd := built[c].get(nid)) is not None]
    return pb


def fused_enodes(pb: Problem, tensors: list[int]) -> list[tuple[int, int]]:
    """The (class, K e-node) pairs whose candidates build_problem builds, in the classes' order.

    A class with at most FUSED_PER_CLASS K e-nodes keeps them all. A larger one keeps, of the
    e-nodes that read the same set of classes, the one of the smallest body, and of those the
    FUSED_PER_CLASS that read the fewest classes. Fewer reads is what fusion is for: such a kernel
    keeps more of the graph in registers, and `Problem.options` would drop most of the others as
    dominated (they read a superset). Those left out are counted in `Problem.bounded`. The
    classes read and the body's size are read off the S trees, without building a body."""
    d = pb.d
    reads: dict[int, frozenset[int] | None] = {}  # S class -> T classes its tree loads
    size: dict[int, int] = {}  # S class -> ops in its tree (shared subtrees counted per use)

    def walk(sc: int, depth: int = 0) -> frozenset[int] | None:
        if sc not in reads:
            m = d.nodes[d.classes[sc][0]]  # S classes hold congruent nodes (kernel_body)
            if depth > 200:  # as kernel_body: a tree this deep is no candidate
                return None
            if m.kind == "L":
                t = m.children[0]
                reads[sc], size[sc] = (frozenset() if t in pb.const_of else frozenset((t,))), 0
            elif m.kind == "Cs":
                reads[sc], size[sc] = frozenset(), 0
            else:
                kids = [walk(x, depth + 1) for x in m.children]
                reads[sc] = None if None in kids else frozenset().union(*kids)
                size[sc] = 1 + sum(size.get(x, 0) for x in m.children)
        return reads[sc]

    out: list[tuple[int, int]] = []
    for c in tensors:
        ks = [nid for nid in d.classes[c] if d.nodes[nid].kind == "K"]
        if len(ks) > FUSED_PER_CLASS:
            first: dict[frozenset[int], tuple] = {}
            for nid in ks:
                sc = d.nodes[nid].children[0]
                r = walk(sc)
                if r is not None:
                    key = (len(r), size[sc], nid)
                    if r not in first or key < first[r]:
                        first[r] = key
            kept = {nid for *_, nid in sorted(first.values())[:FUSED_PER_CLASS]}
            pb.bounded += len(ks) - len(kept)
            ks = [nid for nid in ks if nid in kept]
        out += [(c, nid) for nid in ks]
    return out


class OutOfTime(Exception):
    """A deadline passed before a complete problem or selection existed."""


class _Skip(Exception):
    """A candidate with no body to check (a class of unknown type, an op whose shapes fail)."""


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

    def op_node(m: ENode, args: list[int], sc: int | None = None) -> int:
        typed = pb._typed.get(sc, False) if sc is not None else False
        if typed is False:
            op = OPS[m.op]
            attrs = node_attrs(m)
            try:
                typed = (tuple((s.name, attrs[s.name]) for s in op.attrs),
                         op.infer([body.nodes[a].type for a in args], attrs))
            except (ShapeError, ValueError, TypeError, IndexError, KeyError):
                typed = None
            if sc is not None:
                pb._typed[sc] = typed
        if typed is None:
            raise _Skip()
        return body.add(Node(m.op, tuple(args), *typed))

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
            r = op_node(m, [s_value(x, depth + 1) for x in m.children], sc)
        memo[sc] = r
        return r

    if n.kind == "K":
        out = s_value(n.children[0])
    else:
        out = op_node(n, [load(x) for x in n.children])
    body.outputs = [out]
    return body, tuple(reads)


# ---------------------------------------------------------------- greedy


def greedy(pb: Problem, deadline: float | None = None, cut: list[str] | None = None) -> dict[int, Cand]:
    """Each class's candidate of least tree cost (bottom-up to a fixed point). Past `deadline`
    the fixed point stops at the end of a sweep once every root has a candidate (each pick is
    still the least tree cost of its class as far as the sweeps went), and so does the DAG-aware
    refinement after it; `cut` gets a note of what stopped."""
    best: dict[int, float] = {}
    pick: dict[int, Cand] = {}
    changed = True
    while changed:
        if deadline is not None and best and _now() > deadline:
            _complete(pb, pick, best)
            if all(r in pick for r in pb.roots):
                if cut is not None:
                    cut.append("greedy stopped before its fixed point")
                return _refine(pb, pick, best, rounds=0)
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
    return _refine(pb, pick, best, deadline=deadline, cut=cut)


def _complete(pb: Problem, pick: dict[int, Cand], best: dict[int, float]) -> None:
    """Picks for the classes the roots need that have none yet, in one pass, operands first (a
    deep graph takes as many of greedy's sweeps as it has levels): where the deadline stopped
    greedy, the selection is completed at the cost of one sweep. A class on a cycle of the
    e-graph may be left without a pick; greedy's sweeps then go on."""
    state: dict[int, bool] = {}  # False: operands pending, True: done
    for root in pb.roots:
        stack = [root]
        while stack:
            c = stack[-1]
            if c in best or state.get(c):
                stack.pop()
                continue
            if c not in state:
                state[c] = False
                stack.extend(r for cd in pb.cands.get(c, ()) for r in cd.reads if r not in best and r not in state)
                continue
            stack.pop()
            state[c] = True
            for cd in pb.cands.get(c, ()):
                if all(r in best for r in cd.reads):
                    v = cd.cost + sum(best[r] for r in cd.reads)
                    if v < best.get(c, INF) - 1e-9:
                        best[c] = v
                        pick[c] = cd


def _refine(pb: Problem, pick: dict[int, Cand], best: dict[int, float], rounds: int = 3,
            deadline: float | None = None, cut: list[str] | None = None) -> dict[int, Cand]:
    """DAG-aware passes over the greedy choice: a class switches to a candidate whose own cost plus
    the tree cost of the operands not yet materialized is lower (a tensor some kernel already
    writes is free to read again, at the cost of its read). Past `deadline` the passes stop
    (the selection so far stands)."""
    sel = _reachable(pb, pick)
    readers = _reader_counts(sel)
    for k in range(rounds):
        improved = False
        for i, c in enumerate(list(sel)):
            if deadline is not None and _now() > deadline:
                if cut is not None:
                    cut.append(f"greedy's refinement stopped in pass {k + 1} of {rounds}, "
                               f"at class {i} of {len(sel)}")
                return sel
            if c not in sel:
                continue
            cur = sel[c]
            own = set(cur.reads)
            only = {r for r in own if readers[r] == 1}  # tensors no other kernel reads
            freed = sum(best[r] for r in only)
            choice, gain = None, -1e-9
            for cd in pb.cands.get(c, []):
                if cd is cur or any(r not in best for r in cd.reads):
                    continue
                delta = cd.cost - cur.cost + sum(best[r] for r in set(cd.reads) if r not in sel or r == c)
                delta -= freed - sum(best[r] for r in only if r in cd.reads)
                if delta < gain and not _reaches(pick, cd, c):
                    choice, gain = cd, delta
            if choice is not None:
                pick[c] = choice
                try:
                    sel = _reachable(pb, pick)
                    improved = True
                except ExtractError:
                    pick[c] = cur
                    sel = _reachable(pb, pick)
                readers = _reader_counts(sel)
        if not improved:
            break
    return sel


def _reader_counts(sel: dict[int, Cand]) -> dict[int, int]:
    """How many selected kernels read each class."""
    n: dict[int, int] = {}
    for cd in sel.values():
        for r in set(cd.reads):
            n[r] = n.get(r, 0) + 1
    return n


def _reaches(pick: dict[int, Cand], cd: Cand, target: int) -> bool:
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


# ---------------------------------------------------------------- selection -> Graph


def to_graph(pb: Problem, sel: dict[int, Cand], original: Graph, classes: dict[int, int] | None = None) -> Graph:
    """The fused Graph: inputs (all parameters, in order), constants, and one kernel per class
    (`classes`, when given, gets each kernel's e-class: node id -> class)."""
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
            if classes is not None:
                classes[ids[c]] = c
    g.outputs = [ids[r] for r in pb.roots]
    return g


def _renamed(body: Graph, reads, g: Graph, ids) -> Graph:
    from dataclasses import replace

    nodes = list(body.nodes)
    for inp, r in zip(body.inputs, reads):
        outer = g.nodes[ids[r]]
        nodes[inp] = replace(nodes[inp], name=outer.name)
    return Graph("kernel", nodes, list(body.inputs), list(body.outputs))


# ---------------------------------------------------------------- the stage


@dataclass
class Extraction:
    graph: Graph
    how: str  # the method whose selection won: "greedy", "ilp" or "ilp by regions"
    ilp: str  # what the ILP did, for the report
    value: float  # cost.graph_value of graph
    greedy: Graph  # the greedy extraction, for comparison
    classes: dict[int, int] = field(default_factory=dict)  # graph's kernel node -> its e-class
    enodes: dict[int, int] = field(default_factory=dict)  # graph's kernel node -> the e-node chosen for it
    cut: list[str] = field(default_factory=list)  # what the deadline stopped, for the report


def extract(pb: Problem, original: Graph, model: str, dims=None, perf=None, *, max_nodes: int | None = None,
            region_size: int | None = None, time_limit: float | None = None, spare: float = 0.0,
            deadline: float | None = None) -> Extraction:
    """Greedy, then the exact ILP: over the whole e-graph when it has at most `max_nodes` e-nodes,
    else (or when that ILP runs out of time) region by region (`region_ilp`). Every selection is rescored exactly (`cost.graph_value`
    of its Graph) and the cheapest wins, greedy on ties; any ILP failure leaves the greedy result.
    Unset limits are the module's ILP_MAX_NODES, REGION_SIZE and ILP_TIME_LIMIT. Loading the
    solver (importing scipy.optimize, once per process) is not the ILP's time: up to `spare`
    seconds of it (what the caller's own limit leaves beyond time_limit) extend time_limit.
    `deadline` (a time.perf_counter() value, the optimizer's time limit) stops greedy's fixed
    point and refinement (`greedy`); the ILP does not start past it (`ilp` is then "skipped
    (time limit)"), and `Extraction.cut` says what was stopped."""
    max_nodes = ILP_MAX_NODES if max_nodes is None else max_nodes
    region_size = REGION_SIZE if region_size is None else region_size
    time_limit = ILP_TIME_LIMIT if time_limit is None else time_limit
    graphs: dict[tuple, tuple[Graph, float]] = {}
    classes: dict[int, dict[int, int]] = {}  # id(graph) -> its kernels' e-classes
    chosen: dict[int, dict[int, int]] = {}  # id(graph) -> its kernels' e-nodes

    def rescore(sel: dict[int, Cand]) -> tuple[Graph, float]:
        key = tuple(sorted((c, cd.node) for c, cd in sel.items()))
        if key not in graphs:
            cmap: dict[int, int] = {}
            g = to_graph(pb, sel, original, cmap)
            graphs[key] = (g, C.graph_value(g, model, dims, perf))
            classes[id(g)] = cmap
            chosen[id(g)] = {k: sel[c].node for k, c in cmap.items()}
        return graphs[key]

    cut: list[str] = []
    sel0 = greedy(pb, deadline, cut)
    g, v = rescore(sel0)
    best = Extraction(g, "greedy", "", v, g, cut=cut)
    if deadline is not None and _now() > deadline:
        best.ilp = "skipped (time limit)"
        cut.append("the ILP not started")
        best.classes, best.enodes = classes[id(g)], chosen[id(g)]
        return best
    if all(len(pb.options(c)) <= 1 for c in _live_classes(pb)):  # nothing to choose: no solver
        best.ilp = "optimal (one candidate per class)"
        best.classes, best.enodes = classes[id(g)], chosen[id(g)]
        return best
    try:
        sel = None
        if pb.d.num_nodes <= max_nodes:
            sel, best.ilp = ilp(pb, time_limit, sel0, spare)
            how = "ilp"
        if sel is None:  # too large, or the whole ILP ran out of time: region by region
            whole = f"whole ILP {best.ilp}; " if best.ilp else ""
            sel, best.ilp = region_ilp(pb, sel0, lambda s: rescore(s)[1], region_size,
                                       time_limit + (min(spare, _load_solver()) if spare > 0 else 0.0))
            best.ilp = whole + best.ilp
            how = "ilp by regions"
    except (RuntimeError, ValueError, MemoryError) as e:  # the solver's failures: greedy stands, the report says why
        sel, best.ilp = None, f"failed ({type(e).__name__}: {e})"
    if sel is not None and sel is not sel0:
        g, v = rescore(sel)
        if v < best.value - 1e-9 * max(1.0, abs(best.value)):
            best = Extraction(g, how, best.ilp, v, best.greedy, cut=cut)
    best.classes, best.enodes = classes[id(best.graph)], chosen[id(best.graph)]
    return best


# the ILP and the ILP by regions (extract.py), which `extract` runs

MIP_GAP = 1e-6  # HiGHS's default 1e-4 is 140 kB on BERT-base: not exact enough to compare with greedy

# ---------------------------------------------------------------- ILP


def ilp(pb: Problem, time_limit: float = ILP_TIME_LIMIT, start: dict[int, Cand] | None = None,
        spare: float = 0.0) -> tuple[dict[int, Cand] | None, str]:
    """Exact DAG extraction of the whole e-graph with lazy cycle cuts; (selection or None, status).
    A small problem is solved by `search` instead, without the solver (importing scipy.optimize
    is most of the time `eqfuse opt examples/mlp.g` spends extracting); `start`, a selection
    known to be legal (greedy's), bounds its search from the first step."""
    deadline = time.perf_counter() + time_limit
    live = _live_classes(pb)
    found = search(pb, live, start=start) if sum(len(pb.options(c)) for c in live) <= SEARCH_CANDIDATES else None
    if found is not None:
        return found
    if time_limit <= 0 and spare <= 0:  # (no time for the solver: not even for its import)
        return None, "time_limit"
    return _solve(pb, live, {}, deadline + (min(spare, _load_solver()) if spare > 0 else 0.0))


def _load_solver() -> float:
    """Import scipy.optimize (HiGHS); the seconds it took (0 once imported)."""
    import sys

    if "scipy.optimize" in sys.modules:
        return 0.0
    t = time.perf_counter()
    import scipy.optimize  # noqa: F401

    return time.perf_counter() - t


SEARCH_CANDIDATES = 300  # candidates (ILP variables) up to which `ilp` tries `search` first
SEARCH_STEPS = 10000  # branch-and-bound steps `search` takes before it leaves a problem to the ILP solver


class _TooLarge(Exception):
    pass


def search(pb: Problem, live: list[int], steps: int | None = None, start: dict[int, Cand] | None = None
           ) -> tuple[dict[int, Cand] | None, str] | None:
    """The whole-graph ILP's optimum by depth-first branch and bound, for small problems: the
    same objective as `_solve` (the sum of the chosen kernels' costs, each made positive the same
    way), at most one candidate per class, the roots and every chosen candidate's operands
    chosen, no cycle. (selection or None, status) like `ilp`, or None when it would take more
    than `steps` (default SEARCH_STEPS) steps: then the solver runs. (The step bound keeps it
    far inside any time limit: no clock is read.) `start`, a legal selection, is the incumbent
    to beat from the first step.

    The e-graph's parts that share no class (graphs optimized side by side: the pieces of
    eqfuse.optimizer.repeats) are searched one by one: the objective is their sum and no
    constraint joins them, so each part's optimum is the whole one's there, and the search does
    not try every combination of their choices."""
    budget = [SEARCH_STEPS if steps is None else steps]
    inside = set(live)
    opts = {c: [cd for cd in pb.options(c) if all(r in inside for r in cd.reads)] for c in live}
    if start is not None:
        start = _reachable(pb, start)
        if not all(c in inside and all(r in inside for r in cd.reads) for c, cd in start.items()) \
                or _find_cycle(pb, start) is not None:
            start = None
    found: dict[int, Cand] = {}
    try:
        for roots in _parts(pb.roots, opts):
            part = _search_part(pb, roots, opts, budget, start)
            if part is None:
                return None, "infeasible"
            found.update(part)
    except _TooLarge:
        return None
    return _reachable(pb, found), "optimal"


def _parts(roots: list[int], opts: dict[int, list[Cand]]) -> list[list[int]]:
    """The roots grouped by the part of the e-graph they reach (parts that share no class)."""
    parent: dict[int, int] = {}

    def find(c: int) -> int:
        while parent.setdefault(c, c) != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    for c, o in opts.items():
        for cd in o:
            for r in cd.reads:
                parent[find(r)] = find(c)
    groups: dict[int, list[int]] = {}
    for r in dict.fromkeys(roots):
        groups.setdefault(find(r), []).append(r)
    return list(groups.values())


def _search_part(pb: Problem, roots: list[int], opts: dict[int, list[Cand]], budget: list[int],
                 start: dict[int, Cand] | None) -> dict[int, Cand] | None:
    """search's branch and bound from `roots`: the optimum, or None when there is no legal one."""
    best: list = [np.inf, None]

    def weight(cd: Cand) -> float:
        return max(cd.cost, 0.0) + 1e-6  # as _solve's costs (before its scaling, which keeps the order)

    # a class still to choose costs at least its cheapest candidate: a lower bound on the rest
    least = {c: min((weight(cd) for cd in o), default=np.inf) for c, o in opts.items()}
    if start is not None:  # the incumbent to beat: the start's selection from these roots
        seen: dict[int, Cand] = {}
        stack = list(roots)
        while stack:
            c = stack.pop()
            if c not in seen:
                seen[c] = start[c]
                stack.extend(start[c].reads)
        best[:] = [sum(weight(cd) for cd in seen.values()), seen]

    def dfs(chosen: dict[int, Cand], pending: list[int], total: float) -> None:
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooLarge
        pending = list(dict.fromkeys(c for c in pending if c not in chosen))
        if not pending:
            if _find_cycle(pb, chosen) is None:
                best[0], best[1] = total, dict(chosen)
            return
        c, rest = pending[0], pending[1:]
        bound = sum(least.get(r, np.inf) for r in rest)
        for cd in opts.get(c, ()):  # cheapest first (Problem.options): the first complete one bounds the rest
            t = total + weight(cd)
            if t >= best[0]:
                break
            if t + bound + sum(least.get(r, np.inf) for r in cd.reads if r not in chosen and r != c
                               and r not in rest) >= best[0]:
                continue
            chosen[c] = cd
            dfs(chosen, rest + [r for r in cd.reads if r not in chosen], t)
            del chosen[c]

    dfs({}, list(roots), 0.0)
    return best[1]


def _solve(pb: Problem, region: list[int], fixed: dict[int, Cand], deadline: float
           ) -> tuple[dict[int, Cand] | None, str]:
    """The ILP over the classes of `region`, every other class held at its `fixed` kernel.

    A binary per candidate of a region class whose reads are all in the region or in `fixed`
    (a fixed tensor is materialized anyway: reading it costs only the read, already in the
    candidate's cost). At most one candidate per region class, exactly one for the roots and for
    the region classes a fixed kernel reads; a chosen candidate's region operands are chosen too.
    Minimizes the sum of the region's kernel costs, which with `fixed` constant is the DAG cost.
    A cycle through the chosen and fixed kernels cuts its region candidates (not all of them
    together) and the ILP runs again. Returns the combined selection reachable from the roots.
    With `fixed` empty and the region all live classes, this is the whole-graph ILP.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    inside = set(region)
    cands = [cd for c in region for cd in pb.options(c) if all(r in inside or r in fixed for r in cd.reads)]
    if not cands:
        return None, "empty"
    required = {c for c in pb.roots if c in inside}
    required |= {r for cd in fixed.values() for r in cd.reads if r in inside}
    idx = {id(cd): i for i, cd in enumerate(cands)}
    by_class: dict[int, list[int]] = {}
    for i, cd in enumerate(cands):
        by_class.setdefault(cd.cls, []).append(i)
    if any(c not in by_class for c in required):
        return None, "infeasible"
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
        row([(j, 1.0) for j in js], 1.0 if c in required else 0.0, 1.0)
    readers: dict[tuple[int, int], list[int]] = {}  # (class, operand class) -> its candidates reading it
    for i, cd in enumerate(cands):
        for rc in set(cd.reads) & inside:
            readers.setdefault((cd.cls, rc), []).append(i)
    for (_, rc), js in readers.items():  # one row per pair: tighter than one per candidate
        row([(i, 1.0) for i in js] + [(j, -1.0) for j in by_class.get(rc, [])], -np.inf, 0.0)
    costs = np.array([max(cd.cost, 0.0) for cd in cands]) + 1e-6  # a positive cost: no free cycles
    scale = max(costs.max(), 1.0)
    costs = costs / scale
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
                   bounds=Bounds(0, 1), options={"time_limit": left, "disp": False, "mip_rel_gap": MIP_GAP})
        if res.x is None:
            return None, f"no solution ({res.message})"
        chosen = {cands[i].cls: cands[i] for i in np.flatnonzero(res.x > 0.5)}
        combined = {**fixed, **chosen}
        cyc = _find_cycle(pb, combined)
        if cyc is None:
            status = "optimal" if res.status == 0 else "feasible"
            try:
                return _reachable(pb, combined), status
            except ExtractError:
                return None, "incomplete"
        cut = [(idx[id(cd)], 1.0) for cd in cyc if cd.cls in inside]
        if not cut:  # the fixed part alone is acyclic: cannot happen
            return None, "cycle outside the region"
        cuts.append((cut, len(cut) - 1.0))
    return None, "too many cycles"


# ---------------------------------------------------------------- ILP by regions


def regions(pb: Problem, size: int, offset: int = 0) -> list[list[int]]:
    """The live classes cut into topological slabs of about `size` ILP variables (`Problem.options`).

    Picture the live e-graph as a graph of classes, an edge from a class to every class that one
    of its candidates reads. Classes on a cycle of that graph (x = transpose(transpose(x)), ...)
    stay together: the strongly connected components are the units. Each unit gets a level, the
    longest path from it down to the graph inputs, and the units, sorted by level (inputs first,
    outputs last), are cut into consecutive slabs: a slab is a band of the network's depth, e.g.
    part of a transformer layer. Classes holding only inputs or constants are in no slab (they
    are always available). `offset` makes the first slab that many variables smaller, so that a
    second pass with offset size // 2 puts every cut of the first pass inside a slab.
    """
    live = [c for c in _live_classes(pb) if not _leaf_only(pb, c)]
    keep = set(live)
    succ = {c: sorted({r for cd in pb.cands.get(c, []) for r in cd.reads if r in keep}) for c in live}
    comps = _sccs(live, succ)  # every component after the components it reaches
    comp_of = {c: i for i, comp in enumerate(comps) for c in comp}
    level: list[int] = []
    for i, comp in enumerate(comps):
        below = [level[comp_of[r]] for c in comp for r in succ[c] if comp_of[r] != i]
        level.append(1 + max(below, default=-1))
    out: list[list[int]] = []
    part: list[int] = []
    budget = size - offset
    for i in sorted(range(len(comps)), key=lambda i: (level[i], i)):
        part.extend(comps[i])
        budget -= sum(len(pb.options(c)) for c in comps[i])
        if budget <= 0:
            out.append(part)
            part, budget = [], size
    if part:
        out.append(part)
    return out


def _leaf_only(pb: Problem, c: int) -> bool:
    return all(cd.body is None for cd in pb.cands.get(c, ()))


def _sccs(nodes: list[int], succ: dict[int, list[int]]) -> list[list[int]]:
    """Strongly connected components (Tarjan, iterative), each listed after every one it reaches."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    out: list[list[int]] = []

    def visit(v: int) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)

    for root in nodes:
        if root in index:
            continue
        visit(root)
        work = [(root, iter(succ[root]))]
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    visit(w)
                    work.append((w, iter(succ[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:  # v's successors are done
                work.pop()
                if work:
                    u = work[-1][0]
                    low[u] = min(low[u], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    out.append(comp)
    return out


def region_ilp(pb: Problem, sel: dict[int, Cand], value, size: int = REGION_SIZE,
               time_limit: float = ILP_TIME_LIMIT) -> tuple[dict[int, Cand], str]:
    """Improve `sel` region by region; (best selection, status text for the report).

    Two passes over `regions` (the second shifted by half a slab, so a fusion across a cut of
    the first pass is inside a slab of the second). Each slab, `_widened` by the operands whose
    choice only matters to it, is solved exactly by `_solve` with every class outside it held at
    the current best selection, and its result replaces the
    best only if the exact whole-graph cost `value(selection)` does not get worse. Regions left
    when `time_limit` runs out are skipped (and reported).
    """
    deadline = time.perf_counter() + time_limit
    best, best_v = sel, value(sel)
    leaves = {c: cds[0] for c, cds in pb.cands.items() if cds and _leaf_only(pb, c)}
    solved = optimal = improved = skipped = 0
    passes = [regions(pb, size)]
    if len(passes[0]) > 1:  # (one region is the whole graph: nothing to shift)
        passes.append(regions(pb, size, size // 2))
    for parts in passes:
        for part in parts:
            if time.perf_counter() >= deadline:
                skipped += 1
                continue
            part = _widened(pb, best, part)
            inside = set(part)
            fixed = {**leaves, **{c: cd for c, cd in best.items() if c not in inside}}
            new, status = _solve(pb, part, fixed, deadline)
            solved += 1
            optimal += status == "optimal"
            if new is None or selection_cost(new) >= selection_cost(best) - 1e-9 * selection_cost(best):
                continue  # no better in the ILP's own terms: keep the current selection as it is
            v = value(new)
            if v <= best_v + 1e-9 * max(1.0, abs(best_v)):
                improved += v < best_v - 1e-9 * max(1.0, abs(best_v))
                best, best_v = new, v
    text = (f"by {solved} region{'s' * (solved != 1)} in {len(passes)} pass{'es' * (len(passes) != 1)}: "
            f"optimal in {optimal}/{solved}, {improved} improved")
    if skipped:
        text += f", {skipped} skipped (time limit)"
    return best, text


def _widened(pb: Problem, sel: dict[int, Cand], part: list[int]) -> list[int]:
    """A slab plus the classes just below it whose choice only matters to the slab:
    - tensors that only the slab's kernels read (not outputs): held fixed, such a kernel would
      be paid for even when the slab stops reading it, so fusing it into its readers would never
      look profitable;
    - tensors a candidate of the slab reads that `sel` does not materialize: held fixed, they
      would be unavailable, so the slab could never start sharing a new intermediate.
    """
    inside = set(part)
    readers: dict[int, set[int]] = {}
    for c, cd in sel.items():
        for r in cd.reads:
            readers.setdefault(r, set()).add(c)
    extra = {f for f, rs in readers.items() if f not in inside and rs <= inside and f not in pb.roots}
    extra |= {r for c in part for cd in pb.cands.get(c, []) for r in cd.reads if r not in inside and r not in sel}
    return part + sorted(f for f in extra if not _leaf_only(pb, f))


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
