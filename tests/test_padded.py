"""A dynamic sequence length from one compile (eqfuse.runtime.padded): real BERT and GPT-2 exports
with dynamic batch and sequence axes, compiled without dims=, called at many (batch, sequence)
pairs against torch; the compiler runs at the first call only while the length stays within the
buckets. A model whose outputs read every position (a mean over the sequence) is compiled per
value instead, and says why."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_random_compile import random_model

import eqfuse
from eqfuse.errors import ArgumentError, DimsNeeded, EqfuseError
from eqfuse.runtime.padded import pad_sizes

RTOL, ATOL = 1e-4, 1e-5


def test_pad_sizes_are_the_powers_of_two_from_16_up_to_the_first_value_and_at_least_128():
    assert pad_sizes(100) == [16, 32, 64, 128]
    assert pad_sizes(128) == [16, 32, 64, 128]
    assert pad_sizes(16) == [16, 32, 64, 128]
    assert pad_sizes(300) == [16, 32, 64, 128, 256, 512]
    assert pad_sizes(5) == [8, 16, 32, 64, 128]
    assert pad_sizes(1) == [1, 16, 32, 64, 128]


def _export(name: str, pool: bool = False):
    """(torch model, ONNX export with dynamic batch and sequence axes: made once, then cached);
    pool: the output is the mean over the sequence (no position of it is independent of the others)."""
    import model_exports as me
    import torch

    model, names = me.torch_model(name)
    if pool:
        inner = model

        class Pooled(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = inner

            def forward(self, ids, mask):
                return self.inner(ids, mask).mean(dim=1)
        model = Pooled().eval()

    def write(path):
        ids = torch.randint(0, me.VOCAB, (2, me.S), generator=torch.Generator().manual_seed(0))
        axes = {n: {0: "batch", 1: "sequence"} for n in names}
        axes["y"] = {0: "batch"} if pool else {0: "batch", 1: "sequence"}
        torch.onnx.export(model, (ids, torch.ones_like(ids)), str(path), input_names=list(names),
                          output_names=["y"], opset_version=17, dynamo=False, dynamic_axes=axes)
    return model, me.cached(f"{name}{'-pool' * pool}-torchscript-dynamic-batch-sequence-ones", write)


def _feeds(b: int, s: int, seed: int = 0):
    """input_ids and an attention mask whose last sequence ends in padding."""
    import model_exports as me

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, me.VOCAB, (b, s)).astype(np.int64)
    mask = np.ones((b, s), np.int64)
    mask[-1, s - s // 3:] = 0
    return ids, mask


def _torch(model, ids, mask):
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()


# (padded to the buckets in the extended tier, the suite's time: test_a_g_graph_pads_a_dim_buckets_name_beside_its_batch_dim
# and test_a_model_that_reads_every_position_is_compiled_per_length_and_says_why pad in the default run)
@pytest.mark.heavy
@pytest.mark.parametrize("name, padded", [("bert", False)] + [
    pytest.param(n, p, marks=pytest.mark.extended) for n, p in (("bert", True), ("gpt2", False))])
def test_any_sequence_length_within_the_buckets_runs_without_compiling_again(name, padded, monkeypatch):
    """BERT (its attention mask hides the padding) and GPT-2 (causal: no position reads a later
    one) load without dims=; after the first call, every (batch, sequence) within the buckets
    runs on the modules that call compiled, matching torch. The sequence is taken at run time by
    the loops (one module at the largest bucket, each batch bucket's GEMMs one per batch over
    each one's first rows); `padded`: as where a kernel refuses that (PaddedFunction._runtime
    refused here), padded to the buckets."""
    pytest.importorskip("torch")
    from eqfuse.runtime.padded import PaddedFunction

    if padded:
        monkeypatch.setattr(PaddedFunction, "_runtime", lambda self, named, values: False)
    model, path = _export(name)
    mod = eqfuse.compile(str(path), buckets={"sequence": [8, 16]})
    assert "sequence padded to buckets chosen at the first call" in repr(mod) or "padded to 8, 16" in repr(mod)
    assert mod.report["optimized"] is False and not mod.kernels
    first = _feeds(2, 12)  # (batch buckets 1 and 2: the sequence behind a batch of two in one)
    np.testing.assert_allclose(mod(*first), _torch(model, *first), rtol=RTOL, atol=ATOL)
    f = mod.default
    if padded:
        assert f.padding == {"sequence": "exact"} and sorted(f.modules) == [(8,), (16,)]
        assert "batch dim batch at any size; sequence padded to 8, 16" in repr(f)
    else:
        # (a capacity of 17: 16 is the heads' width, an extent the dim's axes must differ from)
        assert f.padding == {"sequence": "run-time"} and sorted(f.modules) == [(17,)], f.runtime_refused
        assert "batch dim batch at any size; sequence at run time up to 17" in repr(f)
        assert [b.sizes for b in f.modules[(17,)].default.buckets.values()] == [[1, 2]]
    assert mod.kernels and "kernel" in mod.graph
    built = {k: id(m) for k, m in f.modules.items()}
    for b, s in ((3, 9), (1, 16), (2, 5), (5, 8), (1, 1), (4, 13)):
        ids, mask = _feeds(b, s, seed=s)
        got = mod(input_ids=ids, attention_mask=mask)
        assert got.shape == (b, s, 64) and got.flags.c_contiguous
        np.testing.assert_allclose(got, _torch(model, ids, mask), rtol=RTOL, atol=ATOL)
    assert {k: id(m) for k, m in f.modules.items()} == built  # nothing compiled since the first call
    for m in f.modules.values():  # and no batch size compiled again inside a bucket
        assert not m.default.cache
    # above the largest bucket: one more bucket (a capacity), the length's power of two
    ids, mask = _feeds(2, 20)
    np.testing.assert_allclose(mod(ids, mask), _torch(model, ids, mask), rtol=RTOL, atol=ATOL)
    assert sorted(f.modules) == ([(8,), (16,), (32,)] if padded else [(17,), (32,)])
    assert f.sizes["sequence"] == ([8, 16, 32] if padded else [17, 32])
    # the buckets hold one copy of each weight and one pool of packed panels (BERT-base: 3.0 -> 1.8 GB)
    a, b = (f.modules[k].default for k in ((8,), (16,)) if k in f.modules) if padded else \
        (f.modules[k].default for k in ((17,), (32,)))
    same = [k for k in a.params if k in b.params and a.params[k].shape == b.params[k].shape]
    assert same and all(a.params[k] is b.params[k] for k in same)
    assert a.panels is not None and a.panels is b.panels
    runners = [c.runner for m in (a, b) for bk in m.buckets.values() for c in bk.compiled.values()]
    packed = {id(P) for r in runners for _, P in r._packed.values()}
    assert runners and all(r.shared_panels is a.panels for r in runners)
    assert len(packed) < sum(len(r._packed) for r in runners)  # some panels serve several buckets


@pytest.mark.heavy
def test_a_model_that_reads_every_position_is_compiled_per_length_and_says_why():
    """The mean over the sequence counts padded positions: the first call's check on the
    reference finds it, and each new length is compiled on its own (still right)."""
    pytest.importorskip("torch")
    model, path = _export("bert", pool=True)
    mod = eqfuse.compile(str(path))
    for b, s in ((2, 12), (1, 7), (2, 12)):
        ids, mask = _feeds(b, s)
        got = mod(ids, mask)
        assert got.shape == (b, 64)
        np.testing.assert_allclose(got, _torch(model, ids, mask), rtol=RTOL, atol=ATOL)
    why = mod.default.padding["sequence"]
    assert why.startswith("padding sequence from 9 to 12 with zeros changes output 0 at its first 9 positions"), why
    assert sorted(mod.default.modules) == [(7,), (12,)]
    assert "sequence compiled per value (padding sequence from 9 to 12" in repr(mod.default)


@pytest.mark.heavy
def test_bad_calls_and_arguments_of_a_padded_model_are_clear_errors():
    pytest.importorskip("torch")
    _, path = _export("bert")
    with pytest.raises(ArgumentError, match="buckets= names 'seq', which is not a dimension of the model"):
        eqfuse.compile(str(path), buckets={"seq": [8]})
    with pytest.raises(ArgumentError, match="'sequence' expects a non-empty list of positive integers"):
        eqfuse.compile(str(path), buckets={"sequence": [0]})
    with pytest.raises(DimsNeeded, match="depends on named dims"):
        eqfuse.compile(str(path), grad=["x"])
    mod = eqfuse.compile(str(path), buckets={"sequence": [8]})
    ids, mask = _feeds(2, 8)
    with pytest.raises(ArgumentError, match="dimension sequence is 8 in one input and 7 in 'attention_mask'"):
        mod(ids, mask[:, :7])
    with pytest.raises(ArgumentError, match=r"'input_ids' expects rank 2 \['batch', 'sequence'\], got shape \[8\]"):
        mod(ids[0], mask)
    with pytest.raises(ArgumentError, match="takes 2 arrays"):
        mod(ids)
    with pytest.raises(ArgumentError, match="has no parameter 'ids'"):
        mod(ids=ids, attention_mask=mask)
    assert not mod.default.modules  # nothing compiled for a bad call


@pytest.mark.extended  # (the suite's budget: test_buckets.py checks buckets={} in the default run)
def test_buckets_off_compiles_each_length():
    """buckets={} turns padding off: each new length (and batch size) compiles on its own."""
    pytest.importorskip("torch")
    model, path = _export("gpt2")
    mod = eqfuse.compile(str(path), buckets={})
    for b, s in ((1, 6), (1, 9)):
        ids, mask = _feeds(b, s)
        np.testing.assert_allclose(mod(ids, mask), _torch(model, ids, mask), rtol=RTOL, atol=ATOL)
    assert sorted(mod.default.modules) == [(6,), (9,)] and mod.default.padding == {"sequence": "buckets={}"}


@pytest.mark.heavy
def test_the_command_line_says_how_to_bind_a_dim_the_import_needs():
    """`eqfuse opt` on such a model without --dim: one error, exit 2, and how to bind the dims."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    _, path = _export("bert")
    r = subprocess.run([sys.executable, "-m", "eqfuse", "opt", str(path)], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "depends on named dims" in r.stderr and "--dim NAME=N on the command line" in r.stderr, r.stderr
    # with the dims bound, `eqfuse lower` plans what compile runs: imported at those dims, the
    # weights bound (the few-rows GEMM over a bound B), as `opt` and `check` do
    r = subprocess.run([sys.executable, "-m", "eqfuse", "lower", str(path), "--dim", "sequence=8", "--dim", "batch=2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "# graph main_graph:" in r.stdout and "B panel K x nr" in r.stdout  # (the skinny GEMM's plan)


@pytest.mark.heavy
def test_a_g_graph_pads_a_dim_buckets_name_beside_its_batch_dim():
    """A .g graph with a batch dim B and a sequence S that cumsum reads across (causally): buckets=
    for S pads it; B stays a batch dim; an output without S is returned whole."""
    src = """
    graph f(x: f32[B, S, 8], w: f32[8, 8]) {
        h = relu(x @ w)
        return cumsum(h, axis=1), h * 2, sum(h, axis=1)
    }
    """
    w = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    mod = eqfuse.compile(src, params={"w": w}, buckets={"S": [4, 16]})
    for b, s in ((2, 10), (3, 3), (1, 16), (2, 7)):
        x = np.random.default_rng(s).standard_normal((b, s, 8)).astype(np.float32)
        h = np.maximum(x @ w, 0)
        got = mod(x)
        for g, want in zip(got, (np.cumsum(h, axis=1), 2 * h, h.sum(axis=1))):
            assert g.shape == want.shape
            np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)
    f = mod.default
    assert f.batch_dim == "B" and f.padding == {"S": "exact"} and sorted(f.modules) == [(4,), (16,)]
    assert f.out_axes["S"] == [(1,), (1,), ()]


def test_outputs_at_masked_positions_that_follow_the_length_keep_the_dim_unpadded():
    """An output at a position the caller's own mask pads that depends on the length (DeBERTa's
    relative positions do so): the first call's inputs mask nothing, yet the check pads the last
    positions before its cut in both of its runs, so it finds the dependence and the model is
    compiled per length, right at every position of a later masked call."""
    src = """
    graph f(x: f32[B, S], m: f32[B, S]) {
        return x * m + (1 - m) * sum(1 - m, axis=1, keepdims=true)
    }
    """
    mod = eqfuse.compile(src, buckets={"S": [16]})
    rng = np.random.default_rng(0)
    x, m = rng.standard_normal((2, 12)).astype(np.float32), np.ones((2, 12), np.float32)
    np.testing.assert_allclose(mod(x, m), x, rtol=1e-6)
    m[1, 8:] = 0
    want = x * m + (1 - m) * (1 - m).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(mod(x, m), want, rtol=1e-6)
    assert mod.default.padding["S"].startswith("padding S from 9 to 12 with zeros changes output 0"), mod.default.padding


@pytest.mark.heavy  # (an export and three compiles)
def test_a_batch_folded_into_other_dims_is_compiled_per_value(tmp_path):
    """ConvBERT's and WavLM's exports fold the batch into another dim ([batch * 2, sequence, 4]),
    which the IR cannot hold unbound: with the sequence padded, the batch is compiled per value."""
    torch = pytest.importorskip("torch")

    class Folded(torch.nn.Module):
        def forward(self, x):
            b, s, c = x.shape
            return torch.softmax(x.reshape(b * 2, s, c // 2), dim=-1).reshape(b, s, c) * 2 + x.sum(-1, keepdim=True)

    path = tmp_path / "folded.onnx"
    torch.onnx.export(Folded(), (torch.randn(2, 5, 8),), str(path), input_names=["x"], output_names=["y"],
                      opset_version=17, dynamo=False, dynamic_axes={"x": {0: "batch", 1: "sequence"}})
    mod = eqfuse.compile(str(path))
    for b, s in ((2, 5), (3, 9), (2, 7)):
        x = np.random.default_rng(b * s).standard_normal((b, s, 8)).astype(np.float32)
        with torch.no_grad():
            want = Folded()(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(mod(x), want, rtol=RTOL, atol=ATOL)
    assert mod.default.padding["sequence"] == "exact"


@pytest.mark.extended  # (the suite's budget: the TorchScript exports above take the same path)
def test_a_dynamo_export_with_dynamic_batch_and_sequence():
    """torch.onnx.export(dynamo=True) with dynamic_shapes for batch and sequence: the same path."""
    torch = pytest.importorskip("torch")
    import model_exports as me

    model, names = me.torch_model("gpt2")

    def write(path):
        ids = torch.randint(0, me.VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
        dims = {0: torch.export.Dim("batch", min=1, max=64), 1: torch.export.Dim("sequence", min=2, max=64)}
        torch.onnx.export(model, (ids, torch.ones_like(ids)), str(path), input_names=list(names), output_names=["y"],
                          dynamo=True, dynamic_shapes={n: dims for n in names})
    path = me.cached("gpt2-dynamo-dynamic-batch-sequence", write)
    mod = eqfuse.compile(str(path))
    for b, s in ((2, 12), (3, 7), (1, 16)):
        ids, mask = _feeds(b, s)
        np.testing.assert_allclose(mod(ids, mask), _torch(model, ids, mask), rtol=RTOL, atol=ATOL)
    f = mod.default  # the default buckets up to 128; GPT-2's 64 positions refuse 128 (a gather out of range)
    assert f.padding == {"sequence": "exact"} and sorted(f.modules) == [(16,), (32,), (64,)]
    assert f.limits["sequence"].startswith("sequence=128: ") and "out of range" in f.limits["sequence"], f.limits
    assert "sequence padded to 16, 32, 64 (not sequence=128: the model refuses it)" in repr(f)
    ids, mask = _feeds(2, 50)  # no compiler: padded to 64
    np.testing.assert_allclose(mod(ids, mask), _torch(model, ids, mask), rtol=RTOL, atol=ATOL)
    assert sorted(f.modules) == [(16,), (32,), (64,)]


# (the suite's budget: the fixed graphs above pad in the default run, test_random_compile.py's random
# graphs run there)
@pytest.mark.extended
@settings(max_examples=10, deadline=None)
@given(random_model(), st.lists(st.integers(1, 20), min_size=2, max_size=4))
def test_random_graphs_padded_or_per_value_match_the_reference(src, sizes):
    """tests/test_random_compile.py's random graphs with their rows a named dim S that buckets=
    names: S is taken at run time by the loops, or padded when the reference finds zeros at the
    end change no real output (rows on their own: a batch dim instead; a sum over rows whose
    padded terms are 0), else compiled per value. Whatever was decided, every length (above the buckets too) matches the reference."""
    from helpers import rand_inputs

    from eqfuse.frontend.load import load
    from eqfuse.ir.graph import bind_dims
    from eqfuse.ir.reference import evaluate

    n = int(re.search(r"a: f32\[(\d+),", src).group(1))
    src = src.replace(f"f32[{n}, ", "f32[S, ")
    g = load(src)[0]
    mod = eqfuse.compile(src, buckets={"S": [4, 8]})
    for s in sizes:
        xs = rand_inputs(bind_dims(g, {"S": s}), seed=s)
        got = mod(*xs)
        got = got if isinstance(got, tuple) else (got,)
        for x, y in zip(got, evaluate(g, xs)):
            np.testing.assert_allclose(x, y, rtol=2e-4, atol=2e-4)
    f = mod.default
    if getattr(f, "padding", None) == {"S": "exact"}:
        assert set(f.modules) <= {(4,), (8,), (16,), (32,)}
    elif getattr(f, "padding", None) == {"S": "run-time"}:  # (a capacity: 8, or one more than an extent)
        assert all(8 <= k < 33 for k, in f.modules) and len(f.modules) <= 3
    elif hasattr(f, "padding"):
        assert f.padding["S"].startswith("padding S from") and set(f.modules) == {(s,) for s in sizes}
    else:  # rows on their own: a batch dim, chunked
        assert f.batch_dim == "S" and not f.cache


@pytest.mark.heavy
def test_bad_arrays_at_the_first_call_are_clear_errors_before_anything_compiles():
    """The first call's padding check runs the reference: a wrong dtype or a token id past the
    vocabulary is an ArgumentError there, not a numpy exception."""
    pytest.importorskip("torch")
    _, path = _export("bert")
    mod = eqfuse.compile(str(path), buckets={"sequence": [16]})
    ids, mask = _feeds(2, 12)
    with pytest.raises(ArgumentError, match="'input_ids' expects dtype int64 .*, got float32"):
        mod(ids.astype(np.float32), mask)
    with pytest.raises(ArgumentError, match="'attention_mask' expects dtype int64 .*, got bool"):
        mod(ids, mask.astype(bool))
    with pytest.raises(ArgumentError, match=r"reference fails on this call.s inputs .IndexError: index 10\d\d is out of bounds"):
        mod(ids + 1000, mask)
    assert not mod.default.modules
    np.testing.assert_equal(mod(ids, mask).shape, (2, 12, 64))


def test_two_live_steps_compile_at_once_and_one_step_once():
    """PaddedFunction.live_module (eqfuse.generate's chunk and decode steps): two threads compile
    two steps at once (each build waits at a barrier for the other: built one after the other, the
    barrier breaks); two threads asking for one step get one build, and when it fails (once the
    other thread waits for it) both raise its error; the next call builds it again."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from eqfuse.runtime.padded import PaddedFunction

    both = threading.Barrier(2, timeout=60)
    builds = []

    def build(dims, live=None, pick=None):
        p = dims["p"]
        builds.append(p)
        if p == 3 and builds.count(3) == 1:
            pending = f._building[((("p", 3),), "p", None)]
            deadline = time.monotonic() + 60
            while not pending._condition._waiters:  # until the other thread waits for this build
                assert time.monotonic() < deadline, "the second thread never waited for the build"
                time.sleep(0.001)
            raise EqfuseError("this step failed")
        if p != 3:
            both.wait()  # (the steps of p 1 and p 2 are built together)
        return f"step {p}"

    f = PaddedFunction("g", [("x", ("p",))], {}, None, {}, build, build)
    with ThreadPoolExecutor(max_workers=2) as pool:
        assert [r.result() for r in [pool.submit(f.live_module, {"p": p}, "p") for p in (1, 2)]] == ["step 1", "step 2"]
    assert sorted(builds) == [1, 2]
    with ThreadPoolExecutor(max_workers=2) as pool:
        for r in [pool.submit(f.live_module, {"p": 3}, "p") for _ in range(2)]:
            with pytest.raises(EqfuseError, match="this step failed"):
                r.result()
    assert builds.count(3) == 1
    assert f.live_module({"p": 3}, "p") == "step 3" and builds.count(3) == 2
    assert f.live_module({"p": 1}, "p") == "step 1" and len(builds) == 4


@pytest.mark.heavy
def test_a_dynamic_export_with_its_batch_bound_takes_its_sequence_per_call():
    """GPT-2 exported with dynamic batch and sequence, the batch bound by dims=: its causal mask
    multiplies arange(batch), now a constant [1, 1, 1, 1], by the sequence's length, which the
    import computes at run time (it refused it before); the sequence, kept by its name, is then
    taken per call as buckets= would: at run time, one module for every length."""
    pytest.importorskip("torch")
    model, path = _export("gpt2")
    mod = eqfuse.compile(str(path), dims={"batch": 1})
    for s in (9, 3, 14):
        ids, mask = _feeds(1, s, seed=s)
        mask[:] = 1
        np.testing.assert_allclose(mod(input_ids=ids, attention_mask=mask), _torch(model, ids, mask),
                                   rtol=RTOL, atol=ATOL)
    f = mod.default
    assert f.padding == {"sequence": "run-time"} and len(f.modules) == 1, (f.padding, f.runtime_refused)


@pytest.mark.heavy
def test_a_default_capacity_past_the_models_positions_steps_down_and_its_last_length_compiles_alone(tmp_path):
    """The tests' BERT has 64 positions: the default capacity 128 is past them and 64 is also its
    position table's extent, so the sequence runs at run time up to 63; a call at 64 compiles a
    module at 64 itself (the model refuses 65), and a saved artifact keeps that module's calls
    without a length."""
    pytest.importorskip("torch")
    model, path = _export("bert")
    mod = eqfuse.compile(str(path))
    for b, s in ((1, 12), (2, 63), (1, 64), (3, 30)):
        ids, mask = _feeds(b, s, seed=s)
        np.testing.assert_allclose(mod(ids, mask), _torch(model, ids, mask), rtol=RTOL, atol=ATOL)
    f = mod.default
    assert f.padding == {"sequence": "run-time"} and sorted(f.modules) == [(63,), (64,)], f.padding
    assert f.per_value == {(64,)} and f.sizes["sequence"] == [63, 64]
    assert "sequence at run time up to 64 (not sequence=128: the model refuses it)" in repr(f)
    mod.save(tmp_path / "bert.eqf")
    back = eqfuse.load(tmp_path / "bert.eqf")
    for b, s in ((1, 64), (2, 9)):
        ids, mask = _feeds(b, s, seed=s)
        np.testing.assert_allclose(back(ids, mask), _torch(model, ids, mask), rtol=RTOL, atol=ATOL)
