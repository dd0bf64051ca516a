"""The exact extraction of `extract` (step 3 of its docstring): one ILP (scipy.optimize.milp /
HiGHS) over the live e-graph with lazy cycle cuts, or the same ILP region by region.
"""

from __future__ import annotations

import time

import numpy as np

from eqfuse.optimizer.extract import (
    ILP_TIME_LIMIT,
    REGION_SIZE,
    Cand,
    ExtractError,
    Problem,
    _reachable,
    selection_cost,
)

MIP_GAP = 1e-6  # HiGHS's default 1e-4 is 140 kB on BERT-base: not exact enough to compare with greedy

# ---------------------------------------------------------------- ILP


def ilp(pb: Problem, time_limit: float = ILP_TIME_LIMIT) -> tuple[dict[int, Cand] | None, str]:
    """Exact DAG extraction of the whole e-graph with lazy cycle cuts; (selection or None, status)."""
    return _solve(pb, _live_classes(pb), {}, time.perf_counter() + time_limit)


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
