"""The saturation schedule: which rules run when, and the limits that hold while they run.

Rules fall into three phases by their shape (`rule_phase`), never by their name:

- `simplify`: rules with no kernel on either side that do not only grow the e-graph (algebra,
  pattern recognition: a layernorm, GELU or softmax spelled in primitive ops becomes the op);
- `grow`: rules whose right side has every op of the left side and maybe more (commutativity,
  associativity, distribution, `x / c => x * (1 / c)`): they never shrink a term, and together
  they grow an e-graph without end;
- `fuse`: rules with a kernel block on either side (fusion.rw).

The optimizer (eqfuse.optimizer.optimize) runs them on two e-graphs:

1. a recognition e-graph: `simplify` to saturation, then up to GROW_ROUNDS single iterations of
   `grow` (each followed by `simplify` to saturation again), under GROW_NODE_SHARE of the node
   limit. It stays small (no kernel candidates). The smallest term is then extracted from it
   (eqfuse.optimizer.simplify: recognized ops are one node where their spelling was many, constants fold);
2. a fusion e-graph loaded with that term, where `fuse` runs to saturation.

So fusion never sees the primitive spelling of an op it has recognized: the kernel candidates of
a spelled-out layernorm's eight ops (and their combinations with everything around them) are
never built. The cost is that fusion cannot undo a recognition; every recognition rule here
turns several ops into one the backend has a fused kernel for, which no cost model prefers less.

Limits (`Limits`): every phase steps one iteration per egglog call and checks the limits
between steps. The node limit also holds inside an iteration: each step runs under egglog's
back-off scheduler with a match limit of a fraction of the remaining node budget, so a rule
whose matches would overrun the budget is not applied in that step. The time limit covers the
whole optimize: a step is not started when it (estimated from the last one) plus extracting an
e-graph of the current size (EXTRACT_SECONDS_PER_NODE) would pass the deadline.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from eqfuse.optimizer.rules import PKernel, POp, PVar, Rule

SIMPLIFY, GROW, FUSE = "simplify", "grow", "fuse"
GROW_ROUNDS = 2
GROW_NODE_SHARE = 0.25  # of the node limit, for the recognition e-graph
BUDGET_SHARE = 8  # a step's match limit: the remaining node budget / this
MIN_MATCH_LIMIT = 16
EXTRACT_SECONDS_PER_NODE = 150e-6  # serialize + candidates + greedy, per e-node (BERT-48 saturated: 170 us)
LOAD_SECONDS_PER_FACT = 25e-6  # loading a graph into an e-graph: per node, 6 facts + 4 per axis (~22 us each)
EXTRACT_SECONDS_PER_GRAPH_NODE = 700e-6  # extracting an e-graph that fusion did not get to grow (BERT-48: 470 us)


def load_seconds(g) -> float:
    """Estimated seconds to load graph g into an e-graph."""
    return LOAD_SECONDS_PER_FACT * sum(6 + 4 * len(n.type.shape) for n in g.nodes)


def fusion_seconds(g) -> float:
    """Seconds to keep, at least, for fusing g: loading the fusion e-graph and extracting from it."""
    return load_seconds(g) + EXTRACT_SECONDS_PER_GRAPH_NODE * len(g.nodes)


def _ops(p, out: Counter, kernel: list) -> None:
    if isinstance(p, PKernel):
        kernel.append(True)
        _ops(p.result, out, kernel)
    elif isinstance(p, POp):
        out[p.op] += 1
        for a in p.args:
            _ops(a, out, kernel)


def rule_phase(rule: Rule) -> str:
    lhs, rhs, k = Counter(), Counter(), []
    _ops(rule.lhs, lhs, k)
    _ops(rule.rhs, rhs, k)
    if k:
        return FUSE
    if isinstance(rule.rhs, PVar) or lhs - rhs:  # a variable, or some op of the left side goes
        return SIMPLIFY
    return GROW


@dataclass
class Limits:
    iters: int
    nodes: int
    deadline: float  # time.perf_counter() value

    @staticmethod
    def make(iter_limit=None, node_limit=None, time_limit=None, t0: float | None = None) -> "Limits":
        from eqfuse.optimizer.egraph import (
            DEFAULT_ITER_LIMIT,
            DEFAULT_NODE_LIMIT,
            DEFAULT_TIME_LIMIT,
        )

        t0 = time.perf_counter() if t0 is None else t0
        return Limits(DEFAULT_ITER_LIMIT if iter_limit is None else iter_limit,
                      DEFAULT_NODE_LIMIT if node_limit is None else node_limit,
                      t0 + (DEFAULT_TIME_LIMIT if time_limit is None else time_limit))

    def left(self) -> float:
        return self.deadline - time.perf_counter()


def run_phase(eg, ruleset: str, st, lim: Limits, *, node_limit: int | None = None, max_steps: int | None = None,
              reserve: float = 0.0, progress=None) -> bool:
    """Step `ruleset` until nothing changes (True) or a limit or max_steps stops it (False; a
    limit sets st.stop_reason and st.limit_note)."""
    if ruleset not in eg.rulesets:
        return True
    nodes = lim.nodes if node_limit is None else node_limit
    size = eg.size()
    st.egraph_nodes = size
    last = 0.0
    steps = 0
    while True:
        if max_steps is not None and steps >= max_steps:
            return False
        reason = None
        if st.iterations >= lim.iters:
            reason = "iter_limit"
        elif size >= nodes:
            reason = "node_limit"
        elif time.perf_counter() + 2 * last + EXTRACT_SECONDS_PER_NODE * size + reserve > lim.deadline:
            reason = "time_limit"
        if reason:
            _stop(st, reason, lim, nodes)
            return False
        t = time.perf_counter()
        updated, fired = eg.step(ruleset, max(MIN_MATCH_LIMIT, (nodes - size) // BUDGET_SHARE))
        last = time.perf_counter() - t
        steps += 1
        st.iterations += 1
        new = eg.size()
        # A step's scheduler is new, so it finds every match again (not only those on new
        # e-nodes): a rule's matches are its largest count in one step, its new matches the rise.
        rise = {k: v - st.rules_fired.get(k, 0) for k, v in fired.items() if v > st.rules_fired.get(k, 0)}
        total = sum(rise.values())
        for name, v in rise.items():
            st.rules_fired[name] = fired[name]
            if new > size and total:
                st.grown_by[name] = st.grown_by.get(name, 0.0) + (new - size) * v / total
        size = st.egraph_nodes = new
        if progress:
            progress(st)
        if not updated:
            return True


def _stop(st, reason: str, lim: Limits, nodes: int) -> None:
    st.stop_reason = reason
    what = {"iter_limit": f"iteration limit: {lim.iters} iterations",
            "node_limit": f"node limit: {nodes} e-nodes",
            "time_limit": "time limit (the rest is left for extraction)"}[reason]
    total = sum(st.grown_by.values())
    top = sorted(st.grown_by.items(), key=lambda kv: -kv[1])[:3]
    if total > 0 and top:
        what += ", " + ", ".join(f"{100 * v / total:.0f}% from rule {k}" for k, v in top)
    st.limit_note = what


def recognize(eg, st, lim: Limits, reserve: float = 0.0, progress=None) -> None:
    """The recognition e-graph's schedule: simplify to saturation, then bounded rounds of grow."""
    grow_nodes = max(1, int(lim.nodes * GROW_NODE_SHARE))
    kw = dict(reserve=reserve, progress=progress)
    if not run_phase(eg, SIMPLIFY, st, lim, **kw) and st.stop_reason != "saturated":
        return
    for _ in range(GROW_ROUNDS if GROW in eg.rulesets else 0):
        if eg.size() >= grow_nodes:
            break
        n = eg.size()
        run_phase(eg, GROW, st, lim, node_limit=grow_nodes, max_steps=1, **kw)
        if st.stop_reason != "saturated":
            return
        if eg.size() == n:
            break
        if not run_phase(eg, SIMPLIFY, st, lim, **kw) and st.stop_reason != "saturated":
            return
