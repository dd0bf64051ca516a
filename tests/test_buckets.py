"""A batch dimension taken at run time (eqfuse.ir.separable, eqfuse.runtime.buckets): one
compile, then any batch size runs without the C compiler, and agrees with numpy."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import rand_inputs
from hypothesis import given, settings
from hypothesis import strategies as st
from test_random_compile import random_model

import eqfuse
from eqfuse.backend import cbuild
from eqfuse.errors import ArgumentError
from eqfuse.frontend.load import load
from eqfuse.ir.graph import bind_dims
from eqfuse.ir.reference import evaluate
from eqfuse.ir.separable import batch_dims

MLP = """
graph mlp(x: f32[B, 64], w1: f32[64, 128], b1: f32[128], w2: f32[128, 10], b2: f32[10]) -> f32[B, 10] {
    h = relu(x @ w1 + b1)
    return h @ w2 + b2
}
"""


def weights(g, rng, skip=1):
    return {n: (rng.standard_normal(t.shape) * 0.2).astype(np.float32) for n, t in g.params[skip:]}


@pytest.fixture
def no_compiler(monkeypatch):
    """After this is switched on, running the C compiler fails the test."""
    state = {"on": False}
    real = cbuild.build

    def build(*a, **k):
        assert not state["on"], "the C compiler ran again for a new batch size"
        return real(*a, **k)
    monkeypatch.setattr(cbuild, "build", build)
    return state


@pytest.mark.parametrize("src,ok,why", [
    (MLP, ["B"], {}),
    ("graph f(x: f32[B, 4]) -> f32[B, 4] { return softmax(x, axis=0) }", [], {"B": "acts along axis 0"}),
    ("graph f(x: f32[B, 4]) -> f32[4] { return sum(x, axis=0) }", [], {"B": "returns f32[4] without it"}),
    ("graph f(x: f32[B, 4]) -> f32[4, B] { return transpose(x, perm=[1, 0]) }", [], {"B": "leading axis"}),
    ("graph f(x: f32[4, B]) -> f32[4, B] { return relu(x) }", [], {"B": "leading axis"}),
    ("graph f(t: f32[50, 8], ids: i64[B, S]) -> f32[B, S, 8] { return gather(t, ids, axis=0) }",
     ["B"], {"S": "leading axis"}),
    ("graph f(t: f32[B, 8], ids: i64[3]) -> f32[3, 8] { return gather(t, ids, axis=0) }", [], {"B": "without it"}),
    ("graph f(x: f32[B, 8]) -> f32[B, 8] { return tril(x) }", [], {"B": "last 2 axes"}),
    ("graph f(x: f32[B, 3, 8, 8]) -> f32[B, 3, 8, 8] { return tril(x) }", ["B"], {}),
    ("graph f(x: f32[B, 8]) -> f32[B, 8] { return cumsum(x, axis=-2) }", [], {"B": "acts along axis 0"}),
    ("graph f(x: f32[B, 8], g: f32[8], b: f32[8]) -> f32[B, 8] { return layernorm(x, g, b, axis=-1) }", ["B"], {}),
])
def test_which_dims_are_batch_dims(src, ok, why):
    got_ok, got_why = batch_dims(load(src)[0])
    assert got_ok == ok
    assert set(got_why) == set(why)
    for d, part in why.items():
        assert part in got_why[d]


@pytest.mark.heavy  # (the fast tier's time)
def test_any_batch_size_after_one_compile(no_compiler):
    g = load(MLP)[0]
    rng = np.random.default_rng(0)
    w = weights(g, rng)
    mod = eqfuse.compile(MLP, params=w)
    for k, n in enumerate([6, 1, 2, 3, 5, 7, 8, 9, 17, 100]):
        x = rng.standard_normal((n, 64)).astype(np.float32)
        y = mod(x)
        no_compiler["on"] = True  # the first call compiled the buckets, and nothing after it
        want = evaluate(g, [x, *w.values()])[0]
        assert y.shape == (n, 10) and y.flags.c_contiguous
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    (b,) = mod.default.buckets.values()
    assert b.sizes == [1, 2, 8]
    assert not mod.default.cache  # never compiled per binding
    assert "compiled at 1, 2, 8" in repr(mod.default)


@pytest.mark.parametrize("first,sizes", [(1, [1]), (2, [1, 2]), (3, [1, 4]), (8, [1, 2, 8]), (100, [1, 2, 8, 32, 128]),
                                         (256, [1, 4, 16, 64, 256])])
def test_default_sizes(first, sizes):
    from eqfuse.runtime.buckets import default_sizes

    assert default_sizes(first) == sizes


@pytest.mark.heavy
def test_schedule_covers_the_batch_with_compiled_sizes():
    g = load(MLP)[0]
    mod = eqfuse.compile(MLP, params=weights(g, np.random.default_rng(1)), buckets={"B": [1, 4, 16]})
    (b,) = mod.default.buckets.values()  # given sizes and no other dim: compiled at compile time
    for n in range(1, 70):
        chunks = b.schedule(n)
        assert [c.start for c in chunks] == list(np.cumsum([0] + [c.count for c in chunks[:-1]]))
        assert sum(c.count for c in chunks) == n
        assert all(c.bucket in (1, 4, 16) and 0 < c.count <= c.bucket for c in chunks)
        assert [c.bucket for c in chunks[:n // 16]] == [16] * (n // 16)


@pytest.mark.heavy  # (the fast tier's time)
def test_few_rows_of_a_memory_bound_model_pad_to_one_chunk():
    # 4 MB of weights read once per chunk, 7 rows: one padded chunk of 8, not 4 + 2 + 1 (at the
    # speeds tests/conftest.py pins: they decide the schedule)
    src = "graph f(x: f32[B, 1024], w: f32[1024, 1024]) -> f32[B, 1024] { return relu(x @ w) }"
    rng = np.random.default_rng(2)
    w = rng.standard_normal((1024, 1024)).astype(np.float32)
    mod = eqfuse.compile(src, params={"w": w}, buckets={"B": [1, 2, 4, 8]})
    (b,) = mod.default.buckets.values()
    assert [(c.count, c.bucket) for c in b.schedule(7)] == [(7, 8)]
    x = rng.standard_normal((7, 1024)).astype(np.float32)
    np.testing.assert_allclose(mod(x), np.maximum(x @ w, 0), rtol=1e-4, atol=1e-3)


def test_outputs_without_the_batch_and_inputs_returned_as_they_are(no_compiler):
    src = """graph f(x: f32[B, 4], w: f32[4, 3]) -> (f32[B, 3], f32[4, 3], f32[B, 4]) {
        return x @ w, w * 2.0, x
    }"""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    mod = eqfuse.compile(src, params={"w": w}, buckets={"B": [1, 2]})
    no_compiler["on"] = True
    for n in (1, 2, 5):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        y, w2, xx = mod(x)
        np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(w2, w * 2)
        np.testing.assert_array_equal(xx, x)
        assert not np.shares_memory(xx, x)


@pytest.mark.heavy  # (the fast tier's time)
def test_attention_over_chunks_of_the_batch(no_compiler):
    src = """graph enc(x: f32[B, 16, 32], wq: f32[32, 32], wk: f32[32, 32], wv: f32[32, 32],
                       g: f32[32], be: f32[32]) -> f32[B, 16, 32] {
        q = transpose(reshape(x @ wq, shape=[-1, 16, 2, 16]), perm=[0, 2, 1, 3])
        k = transpose(reshape(x @ wk, shape=[-1, 16, 2, 16]), perm=[0, 2, 1, 3])
        v = transpose(reshape(x @ wv, shape=[-1, 16, 2, 16]), perm=[0, 2, 1, 3])
        a = softmax(q @ transpose(k, perm=[0, 1, 3, 2]) * 0.25, axis=-1) @ v
        return layernorm(x + reshape(transpose(a, perm=[0, 2, 1, 3]), shape=[-1, 16, 32]), g, be)
    }"""
    g = load(src)[0]
    rng = np.random.default_rng(4)
    w = weights(g, rng)
    mod = eqfuse.compile(src, params=w, verify=True)  # verify: each call against numpy as well
    for n in (2, 1, 3, 5):
        x = rng.standard_normal((n, 16, 32)).astype(np.float32)
        np.testing.assert_allclose(mod(x), evaluate(g, [x, *w.values()])[0], rtol=1e-4, atol=1e-4)
        no_compiler["on"] = True


@pytest.mark.heavy  # (the fast tier's time)
def test_conv_batch_and_a_non_contiguous_input():
    src = Path("examples/conv_bn_relu.g").read_text()
    g = load(src)[0]
    rng = np.random.default_rng(5)
    w = {n: (rng.random(t.shape) + 0.5).astype(np.float32) for n, t in g.params[1:]}
    mod = eqfuse.compile(src, params=w, buckets={"N": [1, 2]})
    shape = [d for d in g.params[0][1].shape[1:]]
    for n in (1, 3):
        x = np.asfortranarray(rng.standard_normal([n] + shape).astype(np.float32))
        np.testing.assert_allclose(mod(x), evaluate(g, [x, *w.values()])[0], rtol=1e-4, atol=1e-4)


@pytest.mark.heavy  # (the fast tier's time)
def test_buckets_share_equal_packed_weights():
    g = load(MLP)[0]
    mod = eqfuse.compile(MLP, params=weights(g, np.random.default_rng(6)), buckets={"B": [1, 2, 4]})
    (b,) = mod.default.buckets.values()
    for n in (1, 2, 4):
        mod(np.ones((n, 64), np.float32))
    packs = [P for c in b.compiled.values() for _, P in c.runner._packed.values()]
    assert packs and len({id(P) for P in packs}) < len(packs)


@pytest.mark.heavy  # (the fast tier's time)
def test_concurrent_calls_at_different_batch_sizes():
    g = load(MLP)[0]
    rng = np.random.default_rng(7)
    w = weights(g, rng)
    mod = eqfuse.compile(MLP, params=w, buckets={"B": [1, 4]})
    xs = {n: rng.standard_normal((n, 64)).astype(np.float32) for n in (3, 6, 9)}
    bad = []

    def work(n):
        for _ in range(30):
            if not np.allclose(mod(xs[n]), evaluate(g, [xs[n], *w.values()])[0], rtol=1e-4, atol=1e-4):
                bad.append(n)
    ts = [threading.Thread(target=work, args=(n,)) for n in xs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not bad


@pytest.mark.heavy
def test_buckets_off_compiles_each_binding():
    g = load(MLP)[0]
    mod = eqfuse.compile(MLP, params=weights(g, np.random.default_rng(8)), buckets={})
    for n in (1, 3):
        mod(np.ones((n, 64), np.float32))
    assert mod.default.batch_dim is None and len(mod.default.cache) == 2


@pytest.mark.parametrize("buckets,dims,message", [
    ({"C": [1]}, None, "not a dimension of the model"),
    ({"B": []}, None, "non-empty list of positive integers"),
    ({"B": [0, 2]}, None, "non-empty list of positive integers"),
    ({"B": "8"}, None, "non-empty list of positive integers"),
    ({"B": [2]}, {"B": 4}, "bound by dims="),
    ([1, 2], None, "expects a dict"),
])
def test_bad_buckets_are_argument_errors(buckets, dims, message):
    with pytest.raises(ArgumentError, match=message):
        eqfuse.compile(MLP, buckets=buckets, dims=dims)


def test_buckets_for_a_dim_that_params_fix_are_refused():
    src = "graph f(x: f32[B, 4], w: f32[B, 4]) -> f32[B, 4] { return x * w }"
    with pytest.raises(ArgumentError, match=r"'B' is fixed by the arrays params= binds \(B=3\)"):
        eqfuse.compile(src, buckets={"B": [1, 2]}, params={"w": np.ones((3, 4), np.float32)})


@pytest.mark.heavy
def test_buckets_for_a_dim_that_is_not_a_batch_dim_pad_it_when_exact_else_compile_per_value():
    """buckets= naming a dim ops read across: padded (eqfuse.runtime.padded) when the reference
    says zeros at the end change no real output, else compiled per value, saying why; a model of
    several graphs refuses it with the reason."""
    src = "graph f(x: f32[B, 4]) -> f32[B, 4] { return softmax(x, axis=0) }"
    mod = eqfuse.compile(src, buckets={"B": [1, 2]})
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    e = np.exp(x - x.max(0))
    np.testing.assert_allclose(mod(x), e / e.sum(0), rtol=1e-6)
    assert mod.default.padding["B"].startswith("padding B from 2 to 3 with zeros changes output 0"), mod.default.padding
    assert sorted(mod.default.modules) == [(3,)]
    # (a sum over B: exact with zeros padded, and no kernel over B at run time)
    causal = "graph f(x: f32[B, 4]) -> f32[B, 4] { return x * 2 + sum(x, axis=0, keepdims=true) }"
    mod = eqfuse.compile(causal, buckets={"B": [4, 8]})
    for n in (3, 8, 5, 1):
        x = np.arange(4 * n, dtype=np.float32).reshape(n, 4)
        np.testing.assert_allclose(mod(x), x * 2 + x.sum(0, keepdims=True), rtol=1e-6)
    assert mod.default.padding == {"B": "exact"} and sorted(mod.default.modules) == [(4,), (8,)]
    two = src + "\ngraph g(y: f32[B, 4]) -> f32[B, 4] { return y * 2 }"
    with pytest.raises(ArgumentError, match="not a batch dimension of graph f: softmax acts along axis 0"):
        eqfuse.compile(two, buckets={"B": [1, 2]})
    mod = eqfuse.compile(src)  # by default such a dim is compiled per binding
    assert mod.default.batch_dim is None


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["mlp", pytest.param("resnet18", marks=pytest.mark.extended)])  # (suite time)
def test_exported_model_with_a_dynamic_batch_axis(name, tmp_path, no_compiler):
    """A torch export whose batch axis is dynamic (a named dim of the ONNX graph): one compile,
    then batches of 1, 3 and 6 against torch, the C compiler run once."""
    torch = pytest.importorskip("torch")
    import model_exports as me

    model, names = me.torch_model(name)
    x0 = next(iter(me.inputs(name).values()))
    path = tmp_path / f"{name}.onnx"
    torch.onnx.export(model, (torch.from_numpy(x0[:2]),), str(path), input_names=list(names), output_names=["y"],
                      opset_version=17, dynamo=False, dynamic_axes={names[0]: {0: "batch"}, "y": {0: "batch"}})
    mod = eqfuse.compile(str(path))
    assert mod.default.batch_dim == "batch"
    rng = np.random.default_rng(9)
    for n in (2, 1, 3, 6):
        x = rng.standard_normal((n,) + x0.shape[1:]).astype(np.float32)
        with torch.no_grad():
            want = model(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(mod(x), want, rtol=1e-3, atol=1e-4)
        no_compiler["on"] = True


def test_profile_at_a_bucket_size_and_refused_between_them():
    from eqfuse.runtime.profile import profile

    g = load(MLP)[0]
    mod = eqfuse.compile(MLP, params=weights(g, np.random.default_rng(10)), buckets={"B": [1, 4]})
    rows = profile(mod, np.ones((4, 64), np.float32), repeat=3)
    assert [k[0] for k in rows["kernels"]] == [k.name for k in mod.kernels if k.kind != "view"]
    assert all("_B4_" in k[0] for k in rows["kernels"])
    with pytest.raises(ArgumentError, match="runs in chunks of the compiled sizes 1, 4"):
        profile(mod, np.ones((3, 64), np.float32), repeat=3)


# (the suite's budget: the fixed graphs above run at several batch sizes in the default run,
# test_random_compile.py's random graphs run there)
@pytest.mark.extended
@settings(max_examples=10, deadline=None)
@given(random_model(), st.lists(st.integers(1, 9), min_size=2, max_size=4))
def test_random_graphs_at_any_batch_size(src, sizes):
    """tests/test_random_compile.py's random graphs with their rows as a named dim B: B is a batch
    dim exactly when no op reduces over the rows (sum over axis 0); compiled once, every batch
    size matches the reference, and a batch dim never compiles again."""
    n = int(re.search(r"a: f32\[(\d+),", src).group(1))
    src = src.replace(f"f32[{n}, ", "f32[B, ")
    g = load(src)[0]
    ok, why = batch_dims(g)
    assert (ok == ["B"]) == ("axis=0" not in src), why
    mod = eqfuse.compile(src, buckets={"B": [1, 2]} if ok else None)
    for b in sizes:
        xs = rand_inputs(bind_dims(g, {"B": b}), seed=b)
        want = evaluate(g, xs)
        got = mod(*xs)
        got = got if isinstance(got, tuple) else (got,)
        for x, y in zip(got, want):
            np.testing.assert_allclose(x, y, rtol=2e-4, atol=2e-4)
    assert len(mod.default.cache) == (0 if ok else len(set(sizes)))


def test_the_report_says_which_unbound_dims_are_batch_dims():
    from eqfuse.optimizer.optimize import report_text

    r = eqfuse.optimize("examples/mlp.g").report
    assert r["batch_dims"] == {"B": None}
    assert "#   B: a batch dim, any size at run time from one compile" in report_text(r)
    r = eqfuse.optimize("examples/mlp_train.g").report
    assert r["batch_dims"]["B"] == "mean reads it and returns f32 without it"
    assert "B: not a batch dim (mean reads it" in report_text(r)


@pytest.mark.parametrize("long_run", [0.05, 0.0], ids=["twice", "once"])
def test_bucket_times_measured_at_the_first_call(monkeypatch, long_run):
    """Unpinned, the first call times every bucket (twice, or once when a run is long) and the
    schedule follows those times."""
    from eqfuse.runtime import buckets

    monkeypatch.setattr(buckets, "PINNED_SPEEDS", None)
    monkeypatch.setattr(buckets, "LONG_RUN_S", long_run)
    g = load(MLP)[0]
    rng = np.random.default_rng(11)
    w = weights(g, rng)
    mod = eqfuse.compile(MLP, params=w, buckets={"B": [1, 2, 8]})
    (b,) = mod.default.buckets.values()
    modelled = dict(b.cost)
    for n in (5, 3, 13):
        x = rng.standard_normal((n, 64)).astype(np.float32)
        np.testing.assert_allclose(mod(x), evaluate(g, [x, *w.values()])[0], rtol=1e-4, atol=1e-4)
    assert b.cost != modelled and all(0 < t < 1 for t in b.cost.values())
    for n in range(1, 30):
        assert sum(c.count for c in b.schedule(n)) == n


def test_a_batch_below_every_bucket_pads_to_the_smallest():
    """Found by hypothesis (tests/test_padded.py): buckets 4 and 8 and a batch of 1 or 3 (no bucket
    at or below it) pad to 4; it raised ValueError."""
    src = "graph f(x: f32[B, 5]) -> f32[B, 5] { return relu(x) * 2 }"
    mod = eqfuse.compile(src, buckets={"B": [4, 8]})
    for n in (1, 3, 13):
        x = np.random.default_rng(n).standard_normal((n, 5)).astype(np.float32)
        np.testing.assert_allclose(mod(x), np.maximum(x, 0) * 2)
    assert not mod.default.cache
