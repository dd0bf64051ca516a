"""Extraction: greedy and ILP against brute force on small e-graphs; the cost models."""

from __future__ import annotations

import itertools

import pytest

from eqfuse import cost as C
from eqfuse import extract as X
from eqfuse.egraph import EGraph
from eqfuse.rules import load_rules

from helpers import one_graph

SMALL = {
    "recompute": """graph g(a: f32[256], b: f32[256]) -> (f32[256], f32[256]) {
        t = a * b
        return relu(t), sigmoid(t)
    }""",
    "shared": """graph g(a: f32[64, 64], b: f32[64, 64], w: f32[64, 64]) -> (f32[64, 64], f32[64, 64]) {
        t = exp(a * b)
        return t @ w, relu(t) + 1
    }""",
    "mlp": """graph g(x: f32[8, 32], w: f32[32, 16], b: f32[16]) -> f32[8, 16] {
        return relu(x @ w + b)
    }""",
    "residual": """graph g(x: f32[16, 32], w: f32[32, 32], g1: f32[32], b1: f32[32]) -> f32[16, 32] {
        return layernorm(x + x @ w, g1, b1)
    }""",
}


def problem(src, model="memory"):
    g = one_graph(src)
    eg = EGraph(g, load_rules())
    eg.saturate()
    return X.build_problem(eg.serialize(), g, model)


def brute_force(pb) -> float:
    live = [c for c in X._live_classes(pb) if pb.cands.get(c)]
    best = float("inf")
    space = [pb.cands[c] for c in live]
    assert 0 < len(list(itertools.islice(itertools.product(*space), 200_001))) <= 200_000
    for combo in itertools.product(*space):
        pick = dict(zip(live, combo))
        try:
            sel = X._reachable(pb, pick)
        except X.ExtractError:
            continue
        if X._find_cycle(pb, sel) is None:
            best = min(best, X.selection_cost(sel))
    return best


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("model", ["memory", "launches"])
def test_ilp_is_optimal_and_greedy_is_close(name, model):
    pb = problem(SMALL[name], model)
    exact = brute_force(pb)
    sel, status = X.ilp(pb, time_limit=10)
    assert status == "optimal"
    assert X.selection_cost(sel) == pytest.approx(exact, rel=1e-7)  # ties may differ below that
    assert X.selection_cost(X.greedy(pb)) == pytest.approx(exact, rel=1e-7)


def test_selection_cost_equals_exact_rescoring():
    pb = problem(SMALL["shared"])
    g = one_graph(SMALL["shared"])
    sel, _ = X.ilp(pb)
    out = X.to_graph(pb, sel, g)
    assert C.graph_value(out, "memory") == pytest.approx(X.selection_cost(sel), abs=1)


def test_illegal_candidates_are_dropped():
    pb = problem("""graph g(x: f32[8, 8], w: f32[8, 8], v: f32[8, 8]) -> f32[8, 8] {
        return (x @ w) @ v
    }""")
    from eqfuse.kernels import classify

    for cands in pb.cands.values():
        for cd in cands:
            if cd.body is not None:
                classify(cd.body)  # never raises: only legal kernels are candidates


# ---- cost models


def body(src):
    from eqfuse.optimize import optimize_graph

    return optimize_graph(one_graph(src)).graph


def test_memory_cost_counts_each_read_per_kernel():
    g = one_graph("""graph g(a: f32[100], b: f32[100]) -> (f32[100], f32[100]) {
        t = a * b
        return relu(t), exp(t)
    }""")
    k = C.graph_kernels(g)  # three one-op kernels: t = a*b (200 read, 100 written), then 2 x (100 + 100)
    assert (k.launches, k.bytes) == (3, 4 * (300 + 200 + 200))


def test_reshape_is_a_free_view_and_unbound_dims_default():
    g = one_graph("""graph g(x: f32[B, 6]) -> f32[B, 2, 3] { return reshape(x, shape=[-1, 2, 3]) }""")
    k = C.graph_kernels(g)
    assert k.bytes == 0 and k.launches - k.views == 0
    g2 = one_graph("""graph g(x: f32[B, 6]) -> f32[B, 6] { return relu(x) }""")
    assert C.graph_kernels(g2).bytes == 4 * 2 * C.DEFAULT_DIM * 6
    assert C.graph_kernels(g2, {"B": 1}).bytes == 4 * 12


def test_time_cost_is_a_roofline():
    p = {"flops": 1e9, "bandwidth": 1e9, "overhead": 1e-6}
    mm = C.KCost(1, 1000, 1e6)  # compute bound: 1 ms
    pw = C.KCost(1, 1e6, 10.0)  # memory bound: 1 ms
    assert C.value(mm, "time", p) == pytest.approx(1e-3 + 1e-6)
    assert C.value(pw, "time", p) == pytest.approx(1e-3 + 1e-6)
    assert C.value(C.KCost(2, 0, 0.0), "launches") == 2
