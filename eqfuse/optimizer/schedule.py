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

Limits (`Limits`): every phase steps one iteration at a time and checks the limits between
steps. The node limit is a hard total, inside an iteration too: a step (`bounded_step`) adds at
most the remaining node budget, because each rule's matches are applied only when the e-nodes
they can add (matches x the constructors of its right side) fit in what is left; a rule whose
matches do not fit is not applied and the others go on. So the e-graph never has more e-nodes
than the limit (one exception: the graph as loaded, before any rule runs). The time limit covers the
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


@dataclass
class Step:
    changed: bool
    fired: dict[str, int]  # rule name -> matches applied
    starved: dict[str, int]  # rule key -> e-nodes its matches need, more than the budget left


def bounded_step(eg, ruleset: str, budget: int) -> Step:
    """One iteration of `ruleset` that adds at most `budget` e-nodes to the e-graph.

    A match of rule r adds at most g(r) e-nodes (the constructors of its right side, eg.growth).
    Every rule first runs together under a match limit L = budget // sum(g): a rule with more
    matches than L is not applied (egglog's back-off), so together they add at most L * sum(g).
    Each rule held back is then run alone, fewest e-nodes needed first, under the limit
    (budget left) // g(r) that its matches must fit; one whose matches do not fit is not applied
    (`starved`). So the e-graph never passes its node limit, not even inside an iteration: egglog
    applies all of a rule's matches in an iteration or none, and none is applied past the budget."""
    keys = eg.rulesets[ruleset]
    total = sum(eg.growth[k] for k in keys)
    size0 = eg.size()
    run = eg.run_rules(ruleset, budget // total if total else None)
    applied = dict(run.applied)
    changed = run.changed
    held = {k: n for k, n in run.found.items() if n and k not in applied}
    starved: dict[str, int] = {}
    size = eg.size() if held else size0
    for k in sorted(held, key=lambda k: held[k] * eg.growth[k]):
        g = eg.growth[k]
        cap = (budget - (size - size0)) // g if g else None
        if cap is not None and held[k] > cap:
            starved[k] = held[k] * g
            continue
        solo = eg.run_rules(eg.solo[k], cap)
        changed = changed or solo.changed
        if k in solo.applied:
            applied[k] = solo.applied[k]
            size = eg.size()
        elif solo.found.get(k, 0):  # more matches than before (the rules before it made them)
            starved[k] = solo.found[k] * g
    fired: dict[str, int] = {}
    for k, v in applied.items():
        name = eg.rule_names[k]
        fired[name] = fired.get(name, 0) + v
    return Step(changed, fired, starved)


def run_phase(eg, ruleset: str, st, lim: Limits, *, node_limit: int | None = None, max_steps: int | None = None,
              reserve: float = 0.0, progress=None) -> bool:
    """Step `ruleset` until nothing changes (True) or a limit or max_steps stops it (False; a
    limit sets st.stop_reason and st.limit_note). A rule whose matches would pass the node limit
    is not applied (bounded_step); the others go on to saturation, and the node limit is the
    stop reason."""
    if ruleset not in eg.rulesets:
        return True
    nodes = lim.nodes if node_limit is None else node_limit
    size = eg.size()
    st.egraph_nodes = size
    last = 0.0
    steps = 0
    starved: dict[str, int] = {}
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
            _stop(st, reason, lim, nodes, starved)
            return False
        t = time.perf_counter()
        step = bounded_step(eg, ruleset, nodes - size)
        last = time.perf_counter() - t
        steps += 1
        st.iterations += 1
        new = eg.size()
        starved = {eg.rule_names[k]: v for k, v in step.starved.items()}
        # A step's scheduler is new, so it finds every match again (not only those on new
        # e-nodes): a rule's matches are its largest count in one step, its new matches the rise.
        fired = step.fired
        rise = {k: v - st.rules_fired.get(k, 0) for k, v in fired.items() if v > st.rules_fired.get(k, 0)}
        total = sum(rise.values())
        for name, v in rise.items():
            st.rules_fired[name] = fired[name]
            if new > size and total:
                st.grown_by[name] = st.grown_by.get(name, 0.0) + (new - size) * v / total
        size = st.egraph_nodes = new
        if progress:
            progress(st)
        if not step.changed:
            if starved:
                _stop(st, "node_limit", lim, nodes, starved)
                return False
            return True


def _stop(st, reason: str, lim: Limits, nodes: int, starved: dict[str, int] | None = None) -> None:
    st.stop_reason = reason
    what = {"iter_limit": f"iteration limit: {lim.iters} iterations",
            "node_limit": f"node limit: {nodes} e-nodes",
            "time_limit": "time limit (the rest is left for extraction)"}[reason]
    total = sum(st.grown_by.values())
    top = sorted(st.grown_by.items(), key=lambda kv: -kv[1])[:3]
    if total > 0 and top:
        what += ", " + ", ".join(f"{100 * v / total:.0f}% from rule {k}" for k, v in top)
    if reason == "node_limit" and starved:
        held = sorted(starved.items(), key=lambda kv: -kv[1])[:3]
        what += "; not applied (their matches would pass the limit): " + ", ".join(
            f"rule {k} (up to {v} e-nodes)" for k, v in held)
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
