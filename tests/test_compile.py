"""eqfuse.compile and the Module it returns (SPEC 4)."""

from dataclasses import replace

import numpy as np
import pytest

import eqfuse
from eqfuse import ArgumentError, CheckFailed
from eqfuse.ir import ops as ops_mod

RNG = np.random.default_rng(7)

MLP = """
graph mlp(x: f32[B, 33], w1: f32[33, 65], b1: f32[65], w2: f32[65, 7], b2: f32[7]) -> f32[B, 7] {
    h = kernel { relu(x @ w1 + b1) }
    return kernel { h @ w2 + b2 }
}

graph other(a: f32[5, 3], b: f32[3]) -> (f32[5, 3], f32[5, 3]) {
    t = kernel { a * b }
    return t, kernel { softmax(t) }
}
"""


def arr(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module")
def weights():
    return {"w1": arr(33, 65), "b1": arr(65), "w2": arr(65, 7), "b2": arr(7)}


@pytest.fixture(scope="module")
def mod():
    return eqfuse.compile(MLP, dims={"B": 9})


def test_callable_default_graph_and_by_name(mod, weights):
    x = arr(9, 33)
    ref = eqfuse.reference(MLP)
    got = mod(x, *weights.values())
    np.testing.assert_allclose(got, ref(x, *weights.values()), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mod.mlp(x, *weights.values()), got)
    a, b = arr(5, 3), arr(3)
    t, s = mod.other(a, b)
    np.testing.assert_allclose(t, a * b, rtol=1e-6)
    np.testing.assert_allclose(s.sum(axis=-1), np.ones(5), rtol=1e-5)
    with pytest.raises(AttributeError, match="no graph named 'nope'"):
        mod.nope


def test_graph_kernels_report(mod):
    assert "graph mlp(x: f32[9, 33]" in mod.graph
    assert "kernel {" in mod.graph
    ks = mod.kernels
    assert len(ks) == 4
    k = ks[0]
    assert k.name == "eqf_mlp_k0_contraction" and k.kind == "contraction"
    assert k.body.startswith("kernel {") and "relu" in k.body
    assert f"void {k.name}(" in k.c_source
    assert k.bytes == 4 * (9 * 33 + 33 * 65 + 65 + 9 * 65)
    assert k.flops >= 2 * 9 * 65 * 33
    assert mod.report is not None


@pytest.mark.heavy
def test_dims_bound_at_first_call_and_cached(weights):
    m = eqfuse.compile(MLP)
    assert m.mlp.last is None and all(k.graph == "other" for k in m.kernels)  # B unknown until a call
    for b in (1, 4, 4):
        x = arr(b, 33)
        want = eqfuse.reference(MLP)(x, *weights.values())
        np.testing.assert_allclose(m(x, *weights.values()), want, rtol=1e-4, atol=1e-5)
    # B is a batch dim (eqfuse.runtime.buckets): compiled once, at the first call's size
    assert not m.mlp.cache and [b.sizes for b in m.mlp.buckets.values()] == [[1]]
    m = eqfuse.compile(MLP, buckets={})  # without buckets: compiled per binding
    for b in (1, 4, 4):
        x = arr(b, 33)
        want = eqfuse.reference(MLP)(x, *weights.values())
        np.testing.assert_allclose(m(x, *weights.values()), want, rtol=1e-4, atol=1e-5)
    assert len(m.mlp.cache) == 2


@pytest.mark.heavy
def test_params_bind_inputs(weights):
    m = eqfuse.compile(MLP, params=weights)
    x = arr(3, 33)
    want = eqfuse.reference(MLP)(x, *weights.values())
    np.testing.assert_allclose(m(x), want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ArgumentError, match=r"takes 1 array \(x\), got 5"):
        m(x, *weights.values())
    with pytest.raises(ArgumentError, match="'zz'"):
        eqfuse.compile(MLP, params={"zz": arr(1)})
    with pytest.raises(ArgumentError, match="parameter 'w1'"):
        eqfuse.compile(MLP, params={"w1": arr(3, 3)})


def test_argument_errors_name_parameter_expected_actual(mod, weights):
    w = list(weights.values())
    with pytest.raises(ArgumentError, match=r"takes 5 arrays \(x, w1, b1, w2, b2\), got 4"):
        mod(arr(9, 33), *w[:3])
    with pytest.raises(ArgumentError, match=r"parameter 'x' expects f32\[B, 33\].*axis 1 is 34, expected 33"):
        mod(arr(9, 34), *w)
    with pytest.raises(ArgumentError, match="parameter 'w1' expects dtype float32.*float64"):
        mod(arr(9, 33), w[0].astype(np.float64), *w[1:])
    with pytest.raises(ArgumentError, match="parameter 'x' expects a numpy array"):
        mod([[1.0]], *w)
    with pytest.raises(ArgumentError, match="parameter 'x'.*rank 2"):
        mod(arr(9), *w)


def test_non_contiguous_inputs(mod, weights):
    big = arr(66, 40)
    x = big[::2, 3:36]  # strided rows, offset columns
    w1 = np.asfortranarray(weights["w1"])
    assert not x.flags.c_contiguous and not w1.flags.c_contiguous
    want = eqfuse.reference(MLP)(np.ascontiguousarray(x[:9]), *weights.values())
    got = mod(x[:9], w1, weights["b1"], weights["w2"].T.copy().T, weights["b2"])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_threads_option_and_env(weights, monkeypatch):
    x = arr(9, 33)
    want = eqfuse.reference(MLP)(x, *weights.values())
    m1 = eqfuse.compile(MLP, dims={"B": 9}, threads=1)
    np.testing.assert_allclose(m1(x, *weights.values()), want, rtol=1e-4, atol=1e-5)
    monkeypatch.setenv("EQFUSE_NUM_THREADS", "2")
    np.testing.assert_allclose(eqfuse.compile(MLP, dims={"B": 9})(x, *weights.values()), want,
                               rtol=1e-4, atol=1e-5)
    with pytest.raises(ArgumentError, match="threads="):
        eqfuse.compile(MLP, threads=0)


def test_outputs_never_alias_inputs():
    src = "graph f(x: f32[4, 6]) -> (f32[4, 6], f32[6, 4], f32[24]) { return x, transpose(x), reshape(x, shape=[24]) }"
    m = eqfuse.compile(src)
    x = arr(4, 6)
    a, t, r = m(x)
    assert not np.shares_memory(a, x) and not np.shares_memory(r, x)
    np.testing.assert_array_equal(t, x.T)
    np.testing.assert_array_equal(r, x.reshape(24))


def test_verify_catches_a_wrong_c_expression(monkeypatch):
    src = "graph f(x: f32[8, 5]) -> f32[8, 5] { return kernel { relu(x) * 2 } }"
    x = arr(8, 5)
    np.testing.assert_allclose(eqfuse.compile(src, verify=True)(x), np.maximum(x, 0) * 2)
    bad = replace(ops_mod.OPS["relu"], c="fabsf({0})")  # a wrong lowering of relu
    monkeypatch.setitem(ops_mod.OPS, "relu", bad)
    m = eqfuse.compile(src, verify=True)
    with pytest.raises(CheckFailed, match="differ"):
        m(x)
    assert isinstance(eqfuse.compile(src)(x), np.ndarray)  # without verify the wrong result goes through


def test_unsupported_kernel_block_is_refused_at_its_line():
    src = "graph f(x: f32[4, 4]) -> f32[4, 4] {\n    return kernel { softmax(x) @ softmax(x) @ x }\n}"
    with pytest.raises(eqfuse.EqfuseError, match=r"<string>:2:\d+.*cannot be lowered"):
        eqfuse.compile(src)


@pytest.mark.heavy
def test_fuse_false_makes_one_kernel_per_op(weights):
    m = eqfuse.compile(MLP, dims={"B": 2}, fuse=False)
    x = arr(2, 33)
    np.testing.assert_allclose(m(x, *weights.values()), eqfuse.reference(MLP)(x, *weights.values()),
                               rtol=1e-4, atol=1e-5)
    assert [k.kind for k in m.kernels[:3]] == ["contraction", "pointwise", "pointwise"]


def test_fuse_manual_keeps_kernel_blocks_as_written():
    src = ("graph f(q: f32[3, 9, 8], k: f32[3, 11, 8], v: f32[3, 11, 4]) -> f32[3, 9, 4] {\n"
           "    return kernel { relu(softmax(q @ transpose(k, perm=[0, 2, 1]) * 0.3) @ v) + 1 }\n}")
    m = eqfuse.compile(src, fuse="manual")
    q, k, v = arr(3, 9, 8), arr(3, 11, 8), arr(3, 11, 4)
    np.testing.assert_allclose(m(q, k, v), eqfuse.reference(src)(q, k, v), rtol=1e-4, atol=1e-5)
    assert [k.kind for k in m.kernels] == ["attention"]
    with pytest.raises(ArgumentError, match="fuse="):
        eqfuse.compile(src, fuse="yes")


MHA = """
graph mha(x: f32[B, 37, 72], wq: f32[72, 72], wk: f32[72, 72], wv: f32[72, 72]) -> f32[B, 37, 72] {
    q = transpose(reshape(x @ wq, shape=[-1, 37, 3, 24]), perm=[0, 2, 1, 3])
    k = transpose(reshape(x @ wk, shape=[-1, 37, 3, 24]), perm=[0, 2, 1, 3])
    v = transpose(reshape(x @ wv, shape=[-1, 37, 3, 24]), perm=[0, 2, 1, 3])
    a = softmax(q @ transpose(k, perm=[0, 1, 3, 2]) * 0.2) @ v
    return reshape(transpose(a, perm=[0, 2, 1, 3]), shape=[-1, 37, 72])
}
"""


@pytest.mark.heavy
def test_multi_head_attention_reads_and_writes_heads_in_place():
    """Head split and merge transposes are absorbed by the attention kernel (odd sizes: 37
    tokens, 3 heads of 24), and the result matches the reference."""
    mod = eqfuse.compile(MHA, dims={"B": 2})
    kinds = [k.kind for k in mod.kernels if k.kind != "view"]
    assert sorted(kinds) == ["attention", "contraction", "contraction", "contraction"], kinds
    args = [arr(2, 37, 72)] + [arr(72, 72) * np.float32(0.2) for _ in range(3)]
    np.testing.assert_allclose(mod(*args), eqfuse.reference(MHA)(*args), rtol=1e-4, atol=1e-5)
