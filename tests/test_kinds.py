"""The kernel kinds registry (eqfuse.backend.kinds): one class per kind, `match` the one
lowerability decision, every decision of the C in the plan."""

import re

import numpy as np
import pytest

import eqfuse
from eqfuse.backend.kinds import KIND, KINDS
from eqfuse.frontend.load import load
from eqfuse.ir.kernels import SUPPORTED, K, Split, Unsupported, classify
from eqfuse.ir.reference import evaluate
from eqfuse.machine import machine
from eqfuse.runtime.verify import compare

RNG = np.random.default_rng(11)

KINDS_SRC = """graph k(x: f32[64, 1024], y: f32[4, 8, 16], ids: i64[32], t: f32[100, 16],
                       q: f32[2, 64, 32], kk: f32[2, 64, 32], v: f32[2, 64, 32], w: f32[1024, 48]) {
    a = relu(x) * 2
    b = softmax(x + 1, axis=-1)
    c = sum(y, axis=[0, 2])
    d = transpose(y, perm=[2, 1, 0])
    e = gather(t, ids)
    f = kernel { softmax(q @ transpose(kk, perm=[0, 2, 1]) * 0.2) @ v }
    g = kernel { relu(x @ w) }
    return a, b, c, d, e, f, g
}"""


def test_every_plan_kind_has_one_kind_class():
    assert set(KIND) == set(K) and len({type(k) for k in KINDS}) == len(KINDS)
    for kind in KINDS:
        assert kind.supported in SUPPORTED


@pytest.mark.heavy  # (the fast tier's time)
def test_plans_carry_kinds_and_the_rule_the_c_applies():
    """Every kernel of each kind: its kind is a K, and its thread rule is the `if` of the C."""
    mod = eqfuse.compile(KINDS_SRC, fuse="manual")
    plans = {p.name: p for p in mod.k.last.plans}
    kinds = set()
    for k in mod.kernels:
        p = plans[k.name]
        assert isinstance(p.kind, K) and k.name.endswith(p.kind.value)
        kinds.add(p.kind)
        assert p.threads, k.name
        # (the `if` of an OpenMP region, or the `parallel` argument of an eqf_region loop, a digit or
        # the template's NAME_PARALLEL macro)
        ifs = set(re.findall(r"\bif \((\d)\)", k.c_source)) | set(re.findall(r"\beqf_region\([^;]*, (\d)\);", k.c_source))
        for macro in re.findall(r"\beqf_region\([^;]*, (\w+_PARALLEL)\);", k.c_source):
            ifs |= set(re.findall(rf"#define {macro} (\d)", k.c_source))
        if p.kind in (K.POINTWISE, K.REDUCE, K.ROW, K.ATTENTION):
            assert ifs == {str(int(p.detail.parallel))}, k.name
            assert p.threads.startswith("one thread") == (not p.detail.parallel), k.name
        if p.kind == K.LAYOUT:
            assert ifs == {str(int(x)) for x in p.detail.parallel}
        if p.kind == K.ATTENTION:  # the vectorized micro-kernels: the plan's decision, after views
            assert p.detail.vec and f"#define {k.name}_VEC {int(p.detail.vec)}" in k.c_source
    assert kinds == {K.POINTWISE, K.ROW, K.REDUCE, K.LAYOUT, K.INDEX, K.ATTENTION, K.CONTRACTION}


def test_lower_prints_each_kernels_thread_rule():
    from eqfuse.pipeline import uops_text

    src = "graph r(x: f32[64, 1024], y: f32[8, 16]) { return softmax(x, axis=-1), sum(y, axis=0) }"
    text = uops_text(src, uops=False)
    assert "threads (decided at run time): the 64 rows split evenly among the threads (64 rows x 1024 >= 8192)" in text
    assert "threads (decided at run time): one thread, no parallel region (128 input elements < 32768)" in text


def _body(src: str):
    (g,) = load(src)
    return next(n.body for n in g.nodes if n.op == "kernel")


def test_split_is_decided_by_match_on_the_planners_machine():
    """A row too long for the GEMM's row epilogue: the frontend (no machine) accepts the block,
    extraction and lower (the planner's machine) are told to split it, and the compiled module
    computes it as separate kernels with the same result."""
    N = machine().l1 // (4 * 3) + 100
    src = (f"graph wide(x: f32[5, 8], w: f32[8, {N}], g: f32[{N}], be: f32[{N}]) -> f32[5, {N}] "
           "{ return kernel { layernorm(x @ w, g, be) * 2 } }")
    body = _body(src)
    assert classify(body).kind == K.CONTRACTION_ROW
    with pytest.raises(Split, match="does not fit the L1 cache"):
        classify(body, machine())


def test_a_split_hand_written_block_is_computed_as_separate_kernels():
    """The attention epilogue reads the softmax (a value of the scores' index space): match says
    Split (before, emit raised it as an internal error), lower splits the block."""
    src = """graph g(q: f32[2, 8, 8], k: f32[2, 8, 8], v: f32[2, 8, 8]) -> f32[2, 8, 8] {
        return kernel { p = softmax(q @ transpose(k, perm=[0, 2, 1]))
        (p @ v) * p }
    }"""
    with pytest.raises(Split, match="prologue's index space"):
        classify(_body(src), machine())
    arrays = [RNG.standard_normal((2, 8, 8)).astype(np.float32) for _ in range(3)]
    mod = eqfuse.compile(src, fuse="manual")
    assert K.ATTENTION not in [k.kind for k in mod.kernels]
    assert compare([mod(*arrays)], evaluate(load(src)[0], arrays)) == []


def test_a_body_no_kind_takes_says_why():
    src = "graph m(x: f32[8, 8], w: f32[8, 8], v: f32[8, 8]) -> f32[8, 8] { return (x @ w) @ v }"
    (g,) = load(src)  # a graph's nodes are a body: inputs, ops, one output
    with pytest.raises(Unsupported, match="mixes matmul, matmul") as e:
        classify(g, machine())
    assert not isinstance(e.value, Split)  # refused, not split: a hand-written block of it is an error
    with pytest.raises(eqfuse.EqfuseError, match="mixes matmul, matmul"):
        load(src.replace("return (x @ w) @ v", "return kernel { (x @ w) @ v }"))
