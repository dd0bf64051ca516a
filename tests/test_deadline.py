"""The time limit holds in every phase of the optimizer (eqfuse/optimizer/optimize.py, extract.py):
candidate building and extraction read the deadline too, and when it passes the optimizer
finishes with the best graph found so far (the input graph, one kernel per op, at worst) and its
report says which phases the limit cut short (`time_limit_cut`). No assertion here is on the
clock: the deadline is made to pass at a chosen point by replacing extraction's clock."""

from __future__ import annotations

import sys

import pytest
from helpers import ROOT, assert_same_values, one_graph, rand_inputs, run

from eqfuse.optimizer import extract as X
from eqfuse.optimizer.optimize import optimize_graph, report_text

sys.path.insert(0, str(ROOT / "benchmarks"))
from make_bert import bert_text  # noqa: E402

DIMS = {"B": 2}


@pytest.fixture(scope="module")
def bert():
    """Two BERT layers in primitive form, optimized whole (no repeated pieces): a fusion e-graph of
    a few hundred classes and a few thousand kernel candidates."""
    return one_graph(bert_text(layers=2, hidden=32, heads=2, seq=8, ffn=64, primitive=True))


def assert_correct(g, out):
    xs = rand_inputs(g, DIMS, seed=3)
    assert_same_values(run(out, xs), run(g, xs))


class Clock:
    """Extraction's clock (extract._now): the real one until `left` more reads, then past any deadline."""

    def __init__(self):
        self.left = None

    def __call__(self) -> float:
        import time

        if self.left is not None:
            if self.left <= 0:
                return float("inf")
            self.left -= 1
        return time.perf_counter()


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(X, "_now", c)
    monkeypatch.setenv("EQFUSE_REPEATS", "0")
    return c


def expire_in_build_problem(monkeypatch, clock, fused: int) -> None:
    """The deadline passes once build_problem has built the one-op candidates (it reads the clock
    once per tensor class) and `fused` fused-kernel candidates (once before each)."""
    real = X.build_problem

    def build(d, *a, **kw):
        clock.left = sum(d.sort[c] == "T" for c in d.classes) + fused
        return real(d, *a, **kw)

    monkeypatch.setattr(X, "build_problem", build)


def test_the_deadline_passing_while_fused_kernels_are_built_keeps_those_built(bert, clock, monkeypatch):
    expire_in_build_problem(monkeypatch, clock, fused=5)
    r = optimize_graph(bert, dims=DIMS)
    cut = r.report["time_limit_cut"]
    assert cut["candidates"].startswith("fused-kernel candidates built for 5 of ")
    # greedy stops at the end of its first complete sweep, its refinement and the ILP do not start
    assert "greedy stopped before its fixed point" in cut["extraction"]
    assert "the ILP not started" in cut["extraction"] and r.report["ilp"] == "skipped (time limit)"
    assert r.report["kernels_after"] <= r.report["kernels_before"]
    assert "time limit reached: candidates: fused-kernel candidates built for 5 of" in report_text(r.report)
    assert_correct(bert, r.graph)


def test_the_deadline_passing_before_the_one_op_candidates_gives_one_kernel_per_op(bert, clock, monkeypatch):
    real = X.build_problem

    def build(*a, **kw):
        clock.left = 0
        return real(*a, **kw)

    monkeypatch.setattr(X, "build_problem", build)
    r = optimize_graph(bert, dims=DIMS)
    assert r.report["time_limit_cut"]["candidates"] == ("no time to build the one-op kernels' candidates: "
                                                        "every op its own kernel")
    assert r.report["extraction"] == "none (time limit)"
    assert_correct(bert, r.graph)


def test_the_deadline_passing_in_greedys_refinement_keeps_its_selection(bert, clock, monkeypatch):
    """Every candidate built and greedy's fixed point reached (it reads the clock once per sweep):
    the deadline passes in the refinement's first pass."""
    real = X._refine

    def refine(*a, **kw):
        clock.left = 3  # three classes refined, then the deadline
        return real(*a, **kw)

    monkeypatch.setattr(X, "_refine", refine)
    r = optimize_graph(bert, dims=DIMS)
    cut = r.report["time_limit_cut"]
    assert "candidates" not in cut
    assert cut["extraction"].startswith("greedy's refinement stopped in pass 1 of 3, at class 3 of ")
    assert r.report["kernels_after"] <= r.report["kernels_before"]
    assert_correct(bert, r.graph)


def test_a_real_time_limit_says_where_it_stopped_and_the_result_is_correct(bert, monkeypatch):
    """The real clock: a limit far below what the graph needs cuts some phase short; which one
    depends on the machine, so the test asserts that one is named, and the result."""
    monkeypatch.setenv("EQFUSE_REPEATS", "0")
    r = optimize_graph(bert, dims=DIMS, time_limit=0.02)
    assert r.report["time_limit_cut"], r.report["stage_seconds"]
    assert set(r.report["time_limit_cut"]) <= {"recognition", "fusion", "candidates", "extraction", "explain"}
    assert_correct(bert, r.graph)


def test_saturation_grows_the_egraph_no_further_than_the_time_left_can_extract(bert, monkeypatch):
    """Each step's node budget is capped by what the time left can extract at
    EXTRACT_SECONDS_PER_NODE each (made large here, so that the cap, not the node limit, binds):
    the e-graph stops below limit / EXTRACT_SECONDS_PER_NODE e-nodes, at the time limit."""
    from eqfuse.optimizer import egraph

    monkeypatch.setenv("EQFUSE_REPEATS", "0")
    monkeypatch.setattr(egraph, "EXTRACT_SECONDS_PER_NODE", 10.0 / 600)
    r = optimize_graph(bert, dims=DIMS, time_limit=10.0)
    assert r.report["egraph_nodes"] <= 600 and r.report["stop_reason"] == "time_limit"
    assert r.report["time_limit_cut"]["fusion"] == "stopped before saturation"
    assert_correct(bert, r.graph)
