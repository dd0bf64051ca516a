"""Layout ops in place (eqfuse.backend.views, eqfuse.optimizer.layout): slices, transposes and
reshapes read through strides by the kernel next to them, and the flatten / GEMM / unflatten
of exported linear layers as one batched GEMM. Every compiled result is checked against the
numpy reference; the kernel counts of the exported GPT-2 and MLP-Mixer are the issue's figures."""

import model_exports as me  # noqa: I001  (tests/ is on the path)
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import eqfuse
from eqfuse.backend.indexing import reshape_strides
from eqfuse.backend.views import affine


def _run(src, **arrays):
    mod = eqfuse.compile(src)
    got = mod(**arrays)
    want = eqfuse.reference(src)(**arrays)
    for g, w in zip(*((got, want) if isinstance(got, tuple) else ((got,), (want,)))):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    return mod


def _kinds(mod):
    return [k.kind for k in mod.kernels if k.kind != "view"]


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------- the index maps


def test_affine_recognizes_offsets_and_strides():
    base = np.arange(6 * 8).reshape(6, 8)
    assert affine(base[1:5:2, 3:]) == (11, (16, 1))
    assert affine(base.T) == (0, (1, 8))
    assert affine(base.T.reshape(-1)) is None  # a transpose flattened is no single stride


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.randoms(use_true_random=False), st.data())
def test_reshape_strides_agree_with_the_composed_index_map(shape, rnd, data):
    # a random view of a buffer: permuted axes and a sliced axis, then a random reshape of it
    base = np.arange(int(np.prod(shape)) * 2).reshape(tuple(shape[:-1]) + (shape[-1] * 2,))
    view = base[..., ::2] if data.draw(st.booleans()) else base[..., : shape[-1]]
    perm = list(range(len(shape)))
    rnd.shuffle(perm)
    view = view.transpose(perm)
    m = affine(view)
    assert m is not None
    size = view.size
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    a = data.draw(st.sampled_from(divisors))
    new = (a, size // a)
    got = reshape_strides(view.shape, m[1], new)
    composed = affine(view.reshape(new))  # the truth: the reshaped index array itself
    if composed is None:
        assert got is None
    else:
        assert got is not None and [s for n, s in zip(new, got) if n != 1] == \
            [s for n, s in zip(new, composed[1]) if n != 1]


# ---------------------------------------------------------------- kernels reading views


QKV = """
graph attn(x: f32[2, 16, 64], w: f32[64, 192]) -> f32[2, 16, 64] {
  qkv = x @ w
  q = transpose(reshape(slice(qkv, axis=2, stop=64), shape=[2, 16, 4, 16]), perm=[0, 2, 1, 3])
  k = transpose(reshape(slice(qkv, axis=2, start=64, stop=128), shape=[2, 16, 4, 16]), perm=[0, 2, 3, 1])
  v = transpose(reshape(slice(qkv, axis=2, start=128), shape=[2, 16, 4, 16]), perm=[0, 2, 1, 3])
  o = softmax(q @ k * 0.25, axis=-1) @ v
  return reshape(transpose(o, perm=[0, 2, 1, 3]), shape=[2, 16, 64])
}
"""


def test_attention_reads_q_k_v_as_slices_of_one_fused_projection():
    mod = _run(QKV, x=_rand(2, 16, 64), w=_rand(64, 192, seed=1) * 0.1)
    assert _kinds(mod) == ["contraction", "attention"]  # no layout kernel copies q, k or v


MERGED_HEADS = """
graph att(q: f32[2, 4, 16, 8], k: f32[2, 4, 24, 8], v: f32[2, 4, 24, 8], bias: f32[8, 1, 24], c: f32[16, 24],
          m: f32[2, 1, 16, 24]) {
  s = reshape(reshape(q, shape=[8, 16, 8]) @ transpose(reshape(k, shape=[8, 24, 8]), perm=[0, 2, 1]) * 0.35 + bias + c,
              shape=[2, 4, 16, 24])
  p = reshape(softmax(s + m, axis=-1), shape=[8, 16, 24])
  return reshape(p @ reshape(v, shape=[8, 24, 8]), shape=[2, 4, 16, 8])
}
"""


# XGLM's eager attention: the same split for the mask and a clamp at f32's lowest value, merged
# again before the softmax, which runs over [B * heads, S, T]
MERGED_SOFTMAX = """
graph att(q: f32[2, 4, 16, 8], k: f32[2, 4, 24, 8], v: f32[2, 4, 24, 8], bias: f32[8, 1, 24], c: f32[16, 24],
          m: f32[2, 1, 16, 24]) {
  s = reshape(reshape(q, shape=[8, 16, 8]) @ transpose(reshape(k, shape=[8, 24, 8]), perm=[0, 2, 1]) * 0.35 + bias + c,
              shape=[2, 4, 16, 24])
  p = softmax(reshape(maximum(s + m, -3.4028234663852886e38), shape=[8, 16, 24]), axis=-1)
  return reshape(p @ reshape(v, shape=[8, 24, 8]), shape=[2, 4, 16, 8])
}
"""


@pytest.mark.parametrize("src", [MERGED_HEADS, MERGED_SOFTMAX], ids=["bloom", "xglm"])
def test_an_attention_over_merged_batch_and_heads_is_one_kernel(src):
    # BLOOM's eager attention: batched matmuls over [B * heads, S, T], its ALiBi bias [B * heads, 1,
    # T] and a bias of rank 2 added to the scores, split into [B, heads, S, T] for the mask and the softmax, merged
    # again for the product with v (eqfuse.optimizer.layout: the split moved onto the operands); XGLM's
    # softmax over the merged shape moves onto the split too
    mask = np.where(np.arange(24)[None, :] <= np.arange(16)[:, None] + 8, 0, np.finfo(np.float32).min)
    mod = _run(src, q=_rand(2, 4, 16, 8), k=_rand(2, 4, 24, 8, seed=1), v=_rand(2, 4, 24, 8, seed=2),
               bias=_rand(8, 1, 24, seed=3), c=_rand(16, 24, seed=4), m=np.broadcast_to(mask, (2, 1, 16, 24)).astype(np.float32))
    assert _kinds(mod) == ["attention"]


STRIDED_BIAS = """
graph g(x: f32[32, 64], y: f32[32, 64], b3: f32[16, 16, 4]) {
  q3 = kernel { reshape(x, shape=[2, 16, 4, 16]) }
  q = kernel { transpose(q3, perm=[0, 2, 1, 3]) }
  k3 = kernel { reshape(y, shape=[2, 16, 4, 16]) }
  k = kernel { transpose(k3, perm=[0, 2, 1, 3]) }
  bt = kernel { transpose(b3, perm=[2, 0, 1]) }
  bias = kernel { reshape(bt, shape=[1, 4, 16, 16]) }
  return kernel { ROW(q @ transpose(k, perm=[0, 1, 3, 2]) + bias) }
}
"""


@pytest.mark.parametrize("row", ["", "softmax"])
def test_a_batched_gemm_per_matrix_reads_its_epilogue_operand_through_the_operands_view(row):
    # q and k are views whose batch dims do not merge, so each batch's GEMM is called with its own
    # pointers (mode "loop"); the bias is a view of b3 transposed (T5's relative position bias
    # through torch.compile): each batch's pointer into it takes the view's strides, not its
    # shape's (reading past b3 before)
    mod = eqfuse.compile(STRIDED_BIAS.replace("ROW", row), fuse="manual")
    arrays = dict(x=_rand(32, 64), y=_rand(32, 64, seed=1), b3=_rand(16, 16, 4, seed=2))
    want = eqfuse.reference(STRIDED_BIAS.replace("ROW", row))(**arrays)
    np.testing.assert_allclose(mod(**arrays), want, rtol=1e-4, atol=1e-5)


KT_CHAIN = """
graph kt(q: f32[2, 4, 16, 8], x: f32[2, 16, 96], v: f32[2, 4, 16, 8]) -> f32[2, 4, 16, 8] {
  k = transpose(reshape(slice(x, axis=2, start=32, stop=64), shape=[2, 16, 4, 8]), perm=[0, 2, 1, 3])
  kt = reshape(transpose(reshape(k, shape=[8, 16, 8]), perm=[0, 2, 1]), shape=[2, 4, 8, 16])
  return softmax(q @ kt, axis=-1) @ v
}
"""


def test_a_chain_through_a_reshape_that_is_no_view_is_still_one_view_at_its_end():
    # k^T as GPT-2's dynamo export writes it: the [8, 16, 8] reshape of the transposed slice has
    # no strides, the whole chain has
    mod = _run(KT_CHAIN, q=_rand(2, 4, 16, 8), x=_rand(2, 16, 96, seed=1), v=_rand(2, 4, 16, 8, seed=2))
    assert _kinds(mod) == ["attention"]


def test_pointwise_operands_are_read_through_slices_and_transposes():
    src = """
graph pw(x: f32[8, 12], y: f32[6, 8]) -> f32[6, 8] {
  return relu(transpose(slice(x, axis=1, start=2, stop=8)) + y) * 2
}
"""
    mod = _run(src, x=_rand(8, 12), y=_rand(6, 8, seed=1))
    assert _kinds(mod) == ["pointwise"]


def test_a_row_op_reads_a_transposed_input_in_place():
    src = """
graph ln(x: f32[2, 16, 64], g: f32[16], b: f32[16]) -> f32[2, 64, 16] {
  return layernorm(transpose(x, perm=[0, 2, 1]), g, b)
}
"""
    mod = _run(src, x=_rand(2, 16, 64), g=_rand(16, seed=1), b=_rand(16, seed=2))
    assert _kinds(mod) == ["row"]


def test_a_reshape_of_a_transpose_read_by_a_gemm_is_copied_once():
    # [4, 8, 6] with strides (48, 1, 8) flattened to [32, 6] has no strides: one copy, then rows
    src = """
graph g(x: f32[4, 6, 8], w: f32[6, 5]) -> f32[32, 5] {
  return reshape(transpose(x, perm=[0, 2, 1]), shape=[32, 6]) @ w
}
"""
    mod = _run(src, x=_rand(4, 6, 8), w=_rand(6, 5, seed=1))
    assert _kinds(mod) == ["layout", "contraction"]


@pytest.mark.parametrize("a, shape, m", [
    ("slice(x, axis=1, start=8, stop=32)", "[6, 40]", 6),  # rows of A at leading dimension 40
    ("reshape(transpose(x, perm=[2, 0, 1]), shape=[5, 24])", "[4, 6, 5]", 5),  # columns in memory, lda 5
    ("transpose(slice(x, axis=0, start=4, stop=28))", "[30, 6]", 6),  # A^T of a slice
])
def test_a_gemm_reads_a_strided_a_in_place(a, shape, m):
    src = f"""
graph g(x: f32{shape}, w: f32[24, 5]) -> f32[{m}, 5] {{
  return relu({a} @ w)
}}
"""
    x = _rand(*[int(d) for d in shape.strip("[]").split(",")])
    mod = _run(src, x=x, w=_rand(24, 5, seed=1))
    assert _kinds(mod) == ["contraction"]


def test_a_batched_gemm_reads_head_slices_of_one_buffer():
    # q @ k^T per head, q and k slices of one [B, S, 2*H*D] projection: batch strides, not copies
    src = """
graph g(x: f32[2, 8, 32]) -> f32[2, 2, 8, 8] {
  q = transpose(reshape(slice(x, axis=2, stop=16), shape=[2, 8, 2, 8]), perm=[0, 2, 1, 3])
  k = transpose(reshape(slice(x, axis=2, start=16), shape=[2, 8, 2, 8]), perm=[0, 2, 3, 1])
  return q @ k
}
"""
    mod = _run(src, x=_rand(2, 8, 32))
    assert _kinds(mod) == ["contraction"]


def test_a_slice_returned_by_the_graph_is_written_to_its_own_buffer():
    src = """
graph s(x: f32[6, 10]) -> (f32[6, 4], f32[3, 10]) {
  y = exp(x)
  return slice(y, axis=1, start=3, stop=7), slice(y, axis=0, start=1, step=2)
}
"""
    _run(src, x=_rand(6, 10))


def test_a_contiguous_slice_is_a_pointer_into_its_buffer():
    src = """
graph s(x: f32[6, 10], w: f32[10, 4]) -> f32[3, 4] {
  return relu(slice(exp(x), axis=0, start=2, stop=5) @ w)
}
"""
    mod = _run(src, x=_rand(6, 10), w=_rand(10, 4, seed=1))
    assert _kinds(mod) == ["pointwise", "contraction"]


# ---------------------------------------------------------------- concats written in place


def _all_kinds(mod):
    return [k.kind for k in mod.kernels]


def test_a_concat_is_written_in_place_by_a_gemm_and_a_pointwise_kernel():
    src = """
graph c(x: f32[6, 8], w1: f32[8, 5], y: f32[4, 5], w2: f32[5, 3]) -> f32[10, 3] {
  z = concat(relu(x @ w1), exp(y * 2), axis=0)
  return tanh(z @ w2)
}
"""
    mod = _run(src, x=_rand(6, 8), w1=_rand(8, 5, seed=1), y=_rand(4, 5, seed=2), w2=_rand(5, 3, seed=3))
    assert "layout" not in _all_kinds(mod)
    assert _kinds(mod) == ["contraction", "pointwise", "contraction"]
    # the operands are the concat's storage at their offsets; it lives from the GEMM's step on
    last = mod.c.last
    (cat,) = [p.node for p in last.plans if p.kind == "view"]
    gemm, pw = [p for p in last.plans if p.into is not None]
    assert (gemm.into, pw.into) == ((cat, 0), (cat, 30))
    mem = last.memory
    assert mem.root[gemm.node] == mem.root[pw.node] == mem.root[cat] and mem.view_offsets[pw.node] == 30
    assert mem.lifetimes[cat] == (10 * 5 * 4, 0, 2)


def test_a_concat_along_axis_1_after_leading_size_1_dims_is_written_in_place():
    src = """
graph c(x: f32[1, 6, 8], w1: f32[8, 5], y: f32[1, 3, 5]) -> f32[1, 9, 5] {
  z = concat(relu(x @ w1), exp(y * 2), axis=1)
  return z * 3
}
"""
    mod = _run(src, x=_rand(1, 6, 8), w1=_rand(8, 5, seed=1), y=_rand(1, 3, 5, seed=2))
    assert "layout" not in _all_kinds(mod)


def test_a_concat_returned_by_the_graph_is_written_in_the_returned_array():
    src = """
graph c(x: f32[6, 8], w1: f32[8, 5], y: f32[4, 5]) -> (f32[10, 5], f32[4, 5]) {
  z = concat(relu(x @ w1), exp(y * 2), axis=0)
  return z, y + 1
}
"""
    mod = _run(src, x=_rand(6, 8), w1=_rand(8, 5, seed=1), y=_rand(4, 5, seed=2))
    assert "layout" not in _all_kinds(mod)
    for _ in range(2):  # the returned arrays are pooled between calls: still right
        _run(src, x=_rand(6, 8, seed=4), w1=_rand(8, 5, seed=5), y=_rand(4, 5, seed=6))


NOT_IN_PLACE = {
    "an operand read elsewhere too": ("f32[10, 5]", ("h = relu(x @ w1)\n  z = concat(h, exp(y * 2), axis=0)\n"
                                       "  return z * sum(h, axis=0, keepdims=true)")),
    "an operand that is a graph input": ("f32[10, 5]", "return concat(relu(x @ w1), y, axis=0)"),
    "one kernel read twice": ("f32[12, 5]", "h = relu(x @ w1)\n  return concat(h, h, axis=0)"),
    "an operand that is a graph output": ("(f32[10, 5], f32[4, 5])", "e = exp(y * 2)\n  return concat(relu(x @ w1), e, axis=0), e"),
}


@pytest.mark.parametrize("case", list(NOT_IN_PLACE))
def test_a_concat_whose_operands_cannot_all_be_written_in_place_keeps_a_copy_kernel(case):
    out, body = NOT_IN_PLACE[case]
    src = f"""
graph c(x: f32[6, 8], w1: f32[8, 5], y: f32[4, 5]) -> {out} {{
  {body}
}}
"""
    mod = _run(src, x=_rand(6, 8), w1=_rand(8, 5, seed=1), y=_rand(4, 5, seed=2))
    assert "layout" in _all_kinds(mod)


def test_a_concat_along_the_last_axis_is_written_through_strides_by_pointwise_kernels():
    src = """
graph c(x: f32[2, 3], y: f32[2, 3]) -> f32[2, 6] {
  return concat(exp(x), y * 2, axis=1)
}
"""
    mod = _run(src, x=_rand(2, 3), y=_rand(2, 3, seed=1))
    assert _all_kinds(mod) == ["pointwise", "pointwise", "view"]
    assert [p.out_strides for p in mod.c.last.plans if p.into] == [(6, 1), (6, 1)]


def test_a_concat_along_the_last_axis_of_a_gemm_result_is_written_by_the_gemm():
    # the GEMM stores C at the concat's row stride (plan_gemm.c_layout), the pointwise kernel
    # its rows beside
    src = """
graph c(x: f32[2, 4], w: f32[4, 3], y: f32[2, 3]) -> f32[2, 6] {
  return concat(x @ w, y * 2, axis=1)
}
"""
    mod = _run(src, x=_rand(2, 4), w=_rand(4, 3, seed=2), y=_rand(2, 3, seed=1))
    assert "layout" not in _all_kinds(mod)
    assert [p.out_strides for p in mod.c.last.plans if p.into] == [(6, 1), (6, 1)]


# ---------------------------------------------------------------- exported linear layers


def test_flatten_gemm_unflatten_is_one_batched_gemm_with_its_epilogue():
    src = """
graph lin(x: f32[2, 16, 64], w: f32[64, 32], b: f32[32], r: f32[2, 16, 32]) -> f32[2, 16, 32] {
  y = reshape(reshape(x, shape=[32, 64]) @ w + b, shape=[2, 16, 32])
  return gelu(y) + r
}
"""
    mod = _run(src, x=_rand(2, 16, 64), w=_rand(64, 32, seed=1) * 0.1, b=_rand(32, seed=2), r=_rand(2, 16, 32, seed=3))
    assert _kinds(mod) == ["contraction"]


def test_a_flattened_gemm_read_twice_stays_as_written():
    src = """
graph two(x: f32[2, 4, 8], w: f32[8, 6]) -> (f32[2, 4, 6], f32[8, 6]) {
  m = reshape(x, shape=[8, 8]) @ w
  return reshape(m, shape=[2, 4, 6]), m
}
"""
    _run(src, x=_rand(2, 4, 8), w=_rand(8, 6, seed=1))


# ---------------------------------------------------------------- the exported models


def _per_layer(name, exporter):
    two = eqfuse.compile(str(me.export(name, exporter)))
    one = eqfuse.compile(str(me.export(name, exporter, layers=1)))
    return len(_kinds(two)) - len(_kinds(one)), two


@pytest.mark.heavy  # (one exporter of each model in the default run, both in the extended tier: the suite's time)
@pytest.mark.parametrize("exporter", ["torchscript", pytest.param("dynamo", marks=pytest.mark.extended)])
def test_exported_gpt2_runs_at_most_seven_kernels_per_layer(exporter):
    pytest.importorskip("transformers")
    per_layer, mod = _per_layer("gpt2", exporter)
    assert per_layer <= 7, per_layer
    assert "layout" not in _kinds(mod)  # q, k and v are read in place from the QKV projection


@pytest.mark.heavy
@pytest.mark.parametrize("exporter", [pytest.param("torchscript", marks=pytest.mark.extended), "dynamo"])
def test_exported_mlp_mixer_token_mixing_runs_in_at_most_four_kernels(exporter):
    pytest.importorskip("torch")
    per_block, mod = _per_layer("mixer", exporter)
    # a block: token mixing (layernorm, GEMM + GELU reading the transpose, GEMM) and channel
    # mixing (layernorm reading the transposed token output, GEMM + GELU, GEMM + residual)
    assert per_block <= 6, per_block
    assert "layout" not in _kinds(mod)  # (test_onnx_models matches these exports with onnxruntime)
