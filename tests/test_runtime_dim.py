"""A named dim taken at run time by the loops (eqfuse.backend.runtime_dim): an encoder layer over
a sequence S compiled once at a capacity runs at any length up to it, each result at the length
against the numpy reference of the graph at that length, with the positions past the length NaN
in every input (so no result at a real position reads one); through compile's live= (the
capacity's buffers and S_length) and through buckets= (arrays at their own length); the kernels
that cannot take the length refused, and the dim then padded."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers import covering
from model_exports import encoder_g
from test_random_compile import draw_lines

import eqfuse
from eqfuse.errors import RuntimeDimRefused
from eqfuse.runtime.verify import compare

# 4 heads of 24 (the attention's scalar micro-kernels), and 2 heads of 64 (its vector ones, whole
# 64-key tiles); no extent is the capacity of the tests (64, 80, 128)
ENCODER, ENCODER64 = encoder_g(96, 4), encoder_g(128, 2)
# three sequences of the dim ([3, S, 96]): each GEMM's rows the dim behind a batch (a GEMM per
# batch, each of its first rows), each row kernel's rows those of each batch's first positions
ENCODER_B3 = encoder_g(96, 4, batch=3)

# the queries through a copy of their own ([4, S, 24], the dim behind the heads), a pointwise
# kernel, a softmax over rows of the dim's positions and a cumsum along them
COPIES = """graph heads(x: f32[S, 40], w: f32[40, 40], g: f32[40]) -> (f32[4, S, 10], f32[S, 40], f32[S, 30]) {
    q = transpose(reshape(x @ w, shape=[-1, 4, 10]), perm=[1, 0, 2])
    y = softmax(x * g, axis=-1) + cumsum(x, axis=0)
    return exp(q) + 1.0, y, concat(slice(x, axis=1, start=0, stop=20), slice(y, axis=1, start=30, stop=40), axis=1)
}
"""


def _weights(src: str, rng) -> dict[str, np.ndarray]:
    return {n: (rng.standard_normal(t.shape) * 0.3).astype(np.float32)
            for n, t in eqfuse.reference(src).default.params if "S" not in t.shape}


def _at_capacity(a: np.ndarray, n: int, cap: int, axis: int) -> np.ndarray:
    """`a` (its `axis` of n) in a buffer of `cap` along it, the positions past n NaN."""
    shape = list(a.shape)
    shape[axis] = cap
    out = np.full(shape, np.nan, dtype=a.dtype)
    out[(slice(None),) * axis + (slice(0, n),)] = a
    return out


ONE_COMPILE = {"encoder": (ENCODER, 64), "encoder64": (ENCODER64, 80), "copies": (COPIES, 64),
               "encoder-batch3": (ENCODER_B3, 64)}  # (graph, capacity)


@pytest.mark.parametrize("case, threads", covering(list(ONE_COMPILE), [1, 2], ids=lambda c: f"{c[0]}-{c[1]}"))
def test_one_compile_runs_every_length_up_to_its_capacity(case, threads):
    src, cap = ONE_COMPILE[case]
    mod = eqfuse.compile(src, dims={"S": cap}, live="S", threads=threads)
    plans = [k for k in mod.kernels if k.kind != "view"]
    assert plans and all("loops at run time" in k.decisions.get("live", "") for k in plans), \
        [(k.name, k.decisions.get("live")) for k in plans]
    ref = eqfuse.reference(src)
    axes = [t.shape.index("S") for t in ref.default.result_types]  # the dim's axis in each result
    rng = np.random.default_rng(0)
    weights = _weights(src, rng)
    xs = dict(ref.default.params)["x"].shape
    for n in (1, 5, 6, 7, 13, 40, 63, 64, cap):
        x = rng.standard_normal([n if d == "S" else d for d in xs]).astype(np.float32)
        want = ref(x=x, **weights)
        got = mod(x=_at_capacity(x, n, cap, xs.index("S")), S_length=np.array([n]), **weights)
        want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
        cut = [g[(slice(None),) * axis + (slice(0, n),)] for g, axis in zip(got, axes)]
        assert not compare(cut, list(want)), (n, compare(cut, list(want)))


@pytest.mark.heavy
@pytest.mark.parametrize("threads", [1, 2])
def test_bound_weights_take_few_rows_by_the_few_rows_kernel_on_one_thread(threads):
    """The weights bound (params=, prepacked): each GEMM over the dim plans the few-rows kernel for
    calls of at most few_rows rows on one thread, over the blocked kernel's panels; every length,
    on one thread and on two (the blocked kernel), against the reference, NaN past the length."""
    cap = 64
    rng = np.random.default_rng(9)
    weights = _weights(ENCODER, rng)
    mod = eqfuse.compile(ENCODER, dims={"S": cap}, live="S", params=weights, threads=threads)
    gemms = [k for k in mod.kernels if k.kind.startswith("contraction")]
    assert gemms and all(0 < k.decisions["few_rows"] <= 32 for k in gemms), [k.decisions for k in gemms]
    top = max(k.decisions["few_rows"] for k in gemms)
    ref = eqfuse.reference(ENCODER)
    for n in (1, 6, top, top + 1, cap):
        x = rng.standard_normal((n, 96)).astype(np.float32)
        got = mod(x=_at_capacity(x, n, cap, 0), S_length=np.array([n]))
        assert not compare([got[:n]], [ref(x=x, **weights)]), n


@pytest.mark.heavy
def test_bf16_at_run_time_computes_what_the_bf16_compile_at_each_length_does():
    """precision="bf16" over three sequences (each GEMM's rows the dim behind the batch, packed from
    each batch's first rows: this machine's bf16 path, vdpbf16ps or the fallback): every element
    equal to the bf16 module compiled at that length."""
    cap = 64
    mod = eqfuse.compile(ENCODER_B3, dims={"S": cap}, live="S", precision="bf16")
    rng = np.random.default_rng(8)
    weights = _weights(ENCODER_B3, rng)
    for n in (7, 40):
        x = rng.standard_normal((3, n, 96)).astype(np.float32)
        want = eqfuse.compile(ENCODER_B3, dims={"S": n}, precision="bf16")(x=x, **weights)
        got = mod(x=_at_capacity(x, n, cap, 1), S_length=np.array([n]), **weights)
        np.testing.assert_array_equal(got[:, :n], want)


def test_verify_compares_the_first_positions_with_the_graph_at_the_length(monkeypatch):
    """verify= on a dim taken at run time: the results' first n positions against the graph at n
    (the positions past n are NaN in the inputs and anything in the results)."""
    mod = eqfuse.compile(COPIES, dims={"S": 32}, live="S", verify=True)
    rng = np.random.default_rng(6)
    w = {"w": rng.standard_normal((40, 40)).astype(np.float32), "g": rng.standard_normal(40).astype(np.float32)}
    for n in (3, 32):
        x = _at_capacity(rng.standard_normal((n, 40)).astype(np.float32), n, 32, 0)
        mod(x=x, S_length=np.array([n]), **w)  # (CheckFailed if any first position differs)
    c = mod.default.last
    run = c.run  # a result wrong at its first position, the rest as computed: the check sees it
    monkeypatch.setattr(c, "run", lambda a, t: [o + (np.arange(o.size).reshape(o.shape) == 0) for o in run(a, t)])
    with pytest.raises(eqfuse.CheckFailed, match="heads: compiled result differs from the numpy reference"):
        mod(x=x, S_length=np.array([32]), **w)


@pytest.mark.heavy
def test_buckets_take_the_dim_at_run_time_with_one_compile(monkeypatch):
    """buckets= on a .g graph's sequence: one module at a capacity, run at each call's length
    with the arrays at that length; a length past it compiles the next capacity once."""
    import eqfuse.pipeline as pipeline

    builds = []
    monkeypatch.setattr(pipeline.cbuild, "build", lambda *a, _b=pipeline.cbuild.build, **k: builds.append(1) or _b(*a, **k))
    mod = eqfuse.compile(ENCODER, buckets={"S": [128]})
    ref = eqfuse.reference(ENCODER)
    rng = np.random.default_rng(1)
    weights = _weights(ENCODER, rng)
    for n, compiled in ((7, 1), (100, 1), (1, 1), (128, 1), (30, 1), (129, 2), (3, 2), (256, 2)):
        x = rng.standard_normal((n, 96)).astype(np.float32)
        got = mod(x=x, **weights)
        assert got.shape == (n, 96) and not compare([got], [ref(x=x, **weights)]), n
        assert len(builds) == compiled, (n, len(builds))  # (129: the capacity 256)
    assert "S at run time up to 256" in repr(mod.default)


@pytest.mark.parametrize("body, result, why", [
    ("mean(relu(x @ w), axis=0)", "f32[40]", r"\(\w+: .*mean.*\) reads the dim but its result has no axis of it"),
    ("softmax(x @ w, axis=0)", "f32[S, 40]", r"\(\w+: .*softmax.*\) takes its rows along the dim"),
    ("transpose(x, perm=[1, 0]) @ (x @ w)", "f32[40, 40]", r"\(contraction: .*\) reads the dim but its result has no axis"),
], ids=["mean", "softmax", "contracted"])
def test_a_kernel_across_the_dim_is_refused_and_the_dim_padded(body, result, why):
    src = f"graph pool(x: f32[S, 40], w: f32[40, 40]) -> {result} {{\n    return {body}\n}}\n"
    with pytest.raises(RuntimeDimRefused, match=rf"live=: kernel eqf_pool_k\d+_\w+ {why}"):
        eqfuse.compile(src, dims={"S": 64}, live="S")
    mod = eqfuse.compile(src, buckets={"S": [64]})  # padded instead, or compiled per length
    x = np.random.default_rng(2).standard_normal((20, 40)).astype(np.float32)
    w = np.eye(40, dtype=np.float32)
    assert not compare([mod(x=x, w=w)], [eqfuse.reference(src)(x=x, w=w)])
    assert mod.default.runtime_refused and "run time" not in repr(mod.default)


def test_a_capacity_that_is_another_extent_and_a_length_past_it_are_refused():
    with pytest.raises(RuntimeDimRefused, match=r"live='S': its capacity 96 is also a fixed extent of encoder; "
                                                r"bind S to another capacity \(dims=\), e.g. 97"):
        eqfuse.compile(ENCODER, dims={"S": 96}, live="S")
    mod = eqfuse.compile(COPIES, dims={"S": 32}, live="S")
    x = np.zeros((32, 40), np.float32)
    w, g = np.zeros((40, 40), np.float32), np.zeros(40, np.float32)
    for n in (33, -1):
        with pytest.raises(eqfuse.ArgumentError, match=rf"heads\(\): the run-time length {n} is not in 0 \.\. 32"):
            mod(x=x, w=w, g=g, S_length=np.array([n]))


def test_lower_prints_the_loops_that_run_to_the_length(tmp_path):
    path = tmp_path / "heads.g"
    path.write_text(COPIES)
    out = subprocess.run([sys.executable, "-m", "eqfuse", "lower", "--dim", "S=32", "--live", "S", str(path)],
                         capture_output=True, text=True, check=True).stdout
    assert out.count("live: loops at run time: the first live of 32 along axis") >= 3, out


@st.composite
def random_graph(draw):
    """test_random_compile's graphs over [S, m], or [3, S, m] (the dim behind a batch): pointwise
    chains, contractions, row ops (one over axis 0: `sum(..., axis=0)`, across S, which the dim
    refuses, or across the batch)."""
    m = draw(st.sampled_from([5, 16, 33]))
    s = draw(st.sampled_from(["S", "3, S"]))
    names, lines = draw_lines(draw, draw(st.integers(2, 5)))
    return (f"graph r(a: f32[{s}, {m}], b: f32[{s}, {m}], c: f32[{m}], w: f32[{m}, {m}], g: f32[{m}], "
            f"be: f32[{m}]) -> f32[{s}, {m}] {{\n" + "\n".join(lines) + f"\n    return {names[-1]}\n}}\n")


@settings(max_examples=12, deadline=None)
@given(random_graph(), st.lists(st.integers(1, 40), min_size=3, max_size=3))
@pytest.mark.heavy
def test_random_graphs_at_run_time_lengths_match_the_reference(src, lengths):
    """Every random graph compiles with S at run time (capacity 40) but one with an op across S,
    and matches the reference at each length, the positions past it NaN."""
    cap = 40
    try:
        mod = eqfuse.compile(src, dims={"S": cap}, live="S")
    except RuntimeDimRefused as e:
        assert "axis=0" in src, (src, e.message)
        return
    ref = eqfuse.reference(src)
    rng = np.random.default_rng(3)
    m = dict(ref.default.params)["c"].shape[0]
    fixed = {"c": rng.standard_normal(m), "w": rng.standard_normal((m, m)) / m ** 0.5,
             "g": rng.standard_normal(m), "be": rng.standard_normal(m)}
    fixed = {k: v.astype(np.float32) for k, v in fixed.items()}
    lead = dict(ref.default.params)["a"].shape[:-2]  # (the batch: the dim at axis 1)
    for n in lengths:
        a, b = (rng.standard_normal((*lead, n, m)).astype(np.float32) for _ in range(2))
        got = mod(a=_at_capacity(a, n, cap, len(lead)), b=_at_capacity(b, n, cap, len(lead)), S_length=np.array([n]),
                  **fixed)
        assert not compare([got[..., :n, :]], [ref(a=a, b=b, **fixed)]), (src, n)


@pytest.mark.heavy
def test_an_onnx_bert_with_its_batch_bound_takes_the_sequence_at_run_time():
    """An export with dynamic batch and sequence axes, the batch bound by dims=: its import at a
    capacity and at one more position is the same graph but for the sequence's extent
    (eqfuse.frontend.onnx_dims.check_onnx_dim), so one module runs every length up to the capacity."""
    pytest.importorskip("torch")
    from test_padded import ATOL, RTOL, _export, _torch

    model, path = _export("bert")
    mod = eqfuse.compile(str(path), dims={"batch": 1}, buckets={"sequence": [48]})
    rng = np.random.default_rng(4)
    for n in (12, 5, 48, 33, 1):
        ids = rng.integers(0, 100, (1, n)).astype(np.int64)
        mask = np.ones((1, n), np.int64)
        mask[0, n - n // 3:] = 0
        np.testing.assert_allclose(mod(input_ids=ids, attention_mask=mask), _torch(model, ids, mask),
                                   rtol=RTOL, atol=ATOL)
    f = mod.default
    assert f.padding == {"sequence": "run-time"} and sorted(f.modules) == [(48,)], (f.padding, f.runtime_refused)
    assert "sequence at run time up to 48" in repr(f)


@pytest.mark.heavy
def test_an_onnx_sequence_at_run_time_reads_no_position_past_the_length():
    """live= on the export's sequence: the positions past the length hold real-looking tokens
    that the mask lets through; each result at the length is torch's on the first n tokens."""
    pytest.importorskip("torch")
    from test_padded import ATOL, RTOL, _export, _torch

    model, path = _export("bert")
    cap = 48  # (test_an_onnx_bert_with_its_batch_bound_takes_the_sequence_at_run_time's capacity: its module, in the kernel cache)
    rng = np.random.default_rng(5)
    # the batch bound, and the batch left free: three sequences, on the batch buckets 1 and 4
    # (each GEMM's rows the sequence behind the batch: one GEMM per batch over its first rows)
    for batch, dims in ((1, {"batch": 1}), (3, {})):
        step = eqfuse.compile(str(path), dims={**dims, "sequence": cap}, live="sequence")
        ids, mask = rng.integers(0, 100, (batch, cap)).astype(np.int64), np.ones((batch, cap), np.int64)
        for n in (1, 7, 23, cap):
            got = step(input_ids=ids, attention_mask=mask, sequence_length=np.array([n]))
            np.testing.assert_allclose(got[:, :n], _torch(model, ids[:, :n], mask[:, :n]), rtol=RTOL, atol=ATOL)
    assert [b.sizes for b in step.default.buckets.values()] == [[1, 4]]
    with pytest.raises(RuntimeDimRefused, match=r"live='sequence': its capacity 16 is also a fixed extent of "
                                                r"main_graph \(.*\); bind sequence to another capacity"):
        eqfuse.compile(str(path), dims={"batch": 1, "sequence": 16}, live="sequence")  # (its head size)


@pytest.mark.heavy
# (MPNet's relative positions in the extended tier, the suite's time: T5's take the same path)
@pytest.mark.parametrize("family", ["t5-encoder"] + [pytest.param(f, marks=pytest.mark.extended) for f in ("mpnet", "gpt-neo")])
def test_hugging_face_exports_take_their_sequence_at_run_time_beside_the_batch(family):
    """Exports with dynamic batch and sequence axes compiled without dims=: T5's relative-position
    bias over queries and keys (a gather and a copy with the dim at two axes), MPNet's, GPT-Neo's
    local attention; one module runs every (batch, sequence) up to its capacity, against torch."""
    torch = pytest.importorskip("torch")
    import zoo_models as zm

    model = zm.torch_model(family)
    mod = eqfuse.compile(str(zm.export_dynamic(family)), buckets={"sequence": [40]})
    rng = np.random.default_rng(6)
    for b, s in ((2, 9), (1, 3), (3, 40), (1, 17)):
        ids = rng.integers(2, zm.VOCAB, (b, s)).astype(np.int64)
        mask = np.ones((b, s), np.int64)
        mask[-1, s - s // 3:] = 0
        with torch.no_grad():
            want = model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        got = mod(input_ids=ids, attention_mask=mask)
        assert not compare([got], [want]), (b, s, compare([got], [want]))
    f = mod.default
    assert f.padding == {"sequence": "run-time"} and sorted(f.modules) == [(40,)], (f.padding, f.runtime_refused)
