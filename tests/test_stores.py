"""Layout copies written in place (eqfuse.backend.stores): a concat, transpose or reshape copy
whose operands' kernels write its storage directly, through element strides (plan.out_strides)
where the kernel's kind writes through strides. Every compiled result is checked against the
numpy reference."""

from dataclasses import replace

import model_exports as me  # noqa: I001  (tests/ is on the path)
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import eqfuse
from eqfuse import machine
from eqfuse.backend.kinds import KIND
from eqfuse.ir.kernels import K


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _run(src, **arrays):
    mod = eqfuse.compile(src)
    for k in range(2):  # twice: the returned arrays are pooled between calls
        arrays = {n: a + k for n, a in arrays.items()}
        got = mod(**arrays)
        want = eqfuse.reference(src)(**arrays)
        for g, w in zip(*((got, want) if isinstance(got, tuple) else ((got,), (want,)))):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    return mod


def _kinds(mod):
    return [k.kind for k in mod.kernels]


def _plans(mod):
    (f,) = mod.functions.values()
    return f.last.plans


def _writers(mod):
    return {p.name.rsplit("_", 1)[-1] + str(i): (p.into, p.out_strides)
            for i, p in enumerate(_plans(mod)) if p.into is not None}


# ---------------------------------------------------------------- written in place


CLS = """
graph v(cls: f32[1, 1, 8], x: f32[3, 4, 8], g: f32[8], b: f32[8]) -> f32[3, 5, 8] {
  z = concat(expand(cls * 2, shape=[3, 1, 8]), relu(x), axis=1)
  return layernorm(z, g, b)
}
"""


def test_a_cls_token_concat_along_an_inner_axis_is_written_through_the_concats_row_strides():
    mod = _run(CLS, cls=_rand(1, 1, 8), x=_rand(3, 4, 8, seed=1), g=_rand(8, seed=2), b=_rand(8, seed=3))
    assert _kinds(mod) == ["pointwise", "pointwise", "view", "row"]
    cat = next(p.node for p in _plans(mod) if p.kind == "view")
    # the cls rows at offset 0 and the patches one row on, both at the concat's strides (40, 8, 1) (a size-1 axis has stride 0)
    assert sorted(_writers(mod).values()) == [((cat, 0), (40, 0, 1)), ((cat, 8), (40, 8, 1))]
    # each writer's schedule says so, after the planning again that its strides caused
    assert [p.uops[-1].what for p in _plans(mod) if p.into] == [
        f"result written in place into t{cat} at element offset 0 at strides [40, 0, 1]",
        f"result written in place into t{cat} at element offset 8 at strides [40, 8, 1]"]


VIT = """
graph v(cls: f32[2, 1, 8], x: f32[2, 8, 2, 2], g: f32[8], b: f32[8]) -> f32[2, 5, 8] {
  p = transpose(reshape(exp(x), shape=[2, 8, 4]), perm=[0, 2, 1])
  return layernorm(concat(cls + 1, p, axis=1), g, b)
}
"""


def test_a_flattened_transposed_result_is_written_by_its_kernel_at_the_composed_strides():
    # ViT's patch embedding: the channels-first [B, C, h, w] result, flattened and transposed to
    # [B, h*w, C], goes after the cls token: its kernel writes each (b, c, y, x) at row 1 + y*2 + x
    mod = _run(VIT, cls=_rand(2, 1, 8), x=_rand(2, 8, 2, 2, seed=1), g=_rand(8, seed=2), b=_rand(8, seed=3))
    assert [k for k in _kinds(mod) if k != "view"] == ["pointwise", "pointwise", "row"]
    strides = sorted(s for _, s in _writers(mod).values())
    assert strides == [(40, 0, 1), (40, 1, 16, 8)]


def test_a_transposed_pointwise_result_returned_by_the_graph_is_written_transposed():
    src = """
graph t(x: f32[4, 6]) -> f32[6, 4] {
  return transpose(exp(x))
}
"""
    mod = _run(src, x=_rand(4, 6))
    assert _kinds(mod) == ["pointwise", "view"]
    assert [s for _, s in _writers(mod).values()] == [(1, 4)]


@pytest.mark.parametrize("table, writer", [("exp(t)", "pointwise"), ("t @ w", "contraction")])
def test_a_transpose_for_a_reader_that_cannot_take_strides_is_written_transposed_by_its_kernel(table, writer):
    # gather reads its table contiguous: the transpose is a copy, unless its producer writes the
    # transposed layout itself (a pointwise kernel does; a GEMM too, its columns at a stride:
    # plan_gemm.c_layout)
    src = f"""
graph e(t: f32[4, 10], w: f32[10, 10], ids: i64[3]) -> f32[3, 4] {{
  return gather(transpose({table}), ids)
}}
"""
    ids = np.array([7, 0, 9], dtype=np.int64)
    mod = eqfuse.compile(src)
    t, w = _rand(4, 10), _rand(10, 10, seed=1)
    want = (np.exp(t) if writer == "pointwise" else t @ w).T[ids]
    np.testing.assert_allclose(mod(t=t, w=w, ids=ids), want, rtol=1e-4, atol=1e-5)
    assert [k for k in _kinds(mod) if k != "view"] == [writer, "index"]


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_concat_of_pointwise_results_along_any_axis_is_written_in_place(axis, batch):
    src = f"""
graph c(x: f32[{batch}, 4, 6], y: f32[{batch}, 4, 6], w: f32[6, 5]) -> f32[{batch * 8}, 5] {{
  z = concat(exp(x), y * 2 + 1, axis={axis})
  return reshape(z, shape=[-1, 6]) @ w
}}
"""
    mod = _run(src, x=_rand(batch, 4, 6), y=_rand(batch, 4, 6, seed=1), w=_rand(6, 5, seed=2))
    assert "layout" not in _kinds(mod)


@pytest.mark.extended  # (the suite's budget: the concat tests here run in the default run)
@settings(max_examples=12, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3), st.data())
def test_random_concats_of_kernels_views_and_inputs_match_the_reference(shape, data):
    rank = len(shape)
    axis = data.draw(st.integers(0, rank - 1))
    params, operands, arrays = [], [], {}
    for k in range(data.draw(st.integers(2, 3))):
        s = list(shape)
        s[axis] = data.draw(st.integers(1, 3))
        form = data.draw(st.sampled_from(["exp", "transposed", "input"]))
        if form == "transposed" and rank > 1:  # the kernel computes the transpose's source
            perm = list(reversed(range(rank)))
            src = [s[p] for p in perm]
            operands.append(f"transpose(tanh(x{k}), perm={perm})")
        else:
            src = s
            operands.append(f"x{k}" if form == "input" else f"exp(x{k} * 0.5)")
        params.append(f"x{k}: f32{src}")
        arrays[f"x{k}"] = _rand(*src, seed=k)
    out = list(shape)
    out[axis] = sum(a.shape[axis] if "transpose" not in o else a.shape[rank - 1 - axis]
                    for o, a in zip(operands, arrays.values()))
    src = f"""
graph c({', '.join(params)}) -> f32{out} {{
  return concat({', '.join(operands)}, axis={axis}) + 1
}}
"""
    _run(src, **arrays)


@pytest.mark.parametrize("axis, other", [(0, "[5, 6]"), (1, "[32, 3]")])
def test_a_reshape_copy_writes_its_rows_into_the_concat(axis, other):
    # the flattened transpose has no strides: a copy, which walks its source and writes the
    # concat's storage at the strides of the source's shape there (kinds.layout.writes_through)
    src = f"""
graph c(x: f32[4, 6, 8], y: f32{other}) -> f32{[37, 6] if axis == 0 else [32, 9]} {{
  return concat(reshape(transpose(x, perm=[0, 2, 1]), shape=[32, 6]), exp(y), axis={axis})
}}
"""
    shape = [int(d) for d in other.strip("[]").split(",")]
    mod = _run(src, x=_rand(4, 6, 8), y=_rand(*shape, seed=1))
    assert [k for k in _kinds(mod) if k != "view"] == ["layout", "pointwise"]
    copy = next(p for p in _plans(mod) if p.kind == "layout")
    assert copy.into is not None and copy.out_strides == (None if axis == 0 else (9, 1))


def test_a_reshape_copy_whose_source_shape_has_no_strides_in_the_concat_stays_its_own_copy():
    # [4, 8, 6] -> [16, 12] splits the 8 across rows of 15 in the concat: no strides over [4, 8, 6]
    src = """
graph c(x: f32[4, 6, 8], y: f32[16, 3]) -> f32[16, 15] {
  return concat(reshape(transpose(x, perm=[0, 2, 1]), shape=[16, 12]), exp(y), axis=1)
}
"""
    mod = _run(src, x=_rand(4, 6, 8), y=_rand(16, 3, seed=1))
    copies = [p for p in _plans(mod) if p.kind == "layout"]
    assert [p.body.nodes[p.shape.anchor].op for p in copies] == ["reshape", "concat"]
    assert copies[0].into is None and copies[1].unread == {1}  # exp(y) still written in place


@pytest.mark.parametrize("other", ["y - 1", "z", "transpose(z, perm=[0, 2, 1])"])
def test_a_concat_returned_by_the_graph_is_written_through_strides_in_the_returned_array(other):
    # returned with another output: its own, the same concat again (copied after the call), or
    # a transpose of it (its own copy: a graph output is its root's whole buffer)
    shape = {"y - 1": "[2, 2, 4]", "z": "[2, 5, 4]"}.get(other, "[2, 4, 5]")
    src = f"""
graph c(x: f32[2, 3, 4], y: f32[2, 2, 4]) -> (f32[2, 5, 4], f32{shape}) {{
  z = concat(tanh(x), exp(y), axis=1)
  return z, {other}
}}
"""
    mod = _run(src, x=_rand(2, 3, 4), y=_rand(2, 2, 4, seed=1))
    assert "concat" not in [p.body.nodes[p.shape.anchor].op for p in _plans(mod) if p.kind == "layout"]


def test_the_concats_storage_lives_from_its_first_writer_to_its_last_reader():
    mod = _run(CLS, cls=_rand(1, 1, 8), x=_rand(3, 4, 8, seed=1), g=_rand(8, seed=2), b=_rand(8, seed=3))
    (f,) = mod.functions.values()
    mem = f.last.memory
    cat = next(p.node for p in _plans(mod) if p.kind == "view")
    writers = [p.node for p in _plans(mod) if p.into is not None]
    assert {mem.root[w] for w in writers} == {mem.root[cat]}
    assert mem.lifetimes[cat] == (3 * 5 * 8 * 4, 0, 2)  # steps: the two writers, then the layernorm


# ---------------------------------------------------------------- stays a copy


NOT_IN_PLACE = {
    # one GEMM over the rows of both batches (B shared), which the concat does not space evenly
    "a writer that cannot write through these strides": "concat(x @ w, exp(y), axis=1)",
    "an operand read elsewhere too": "concat(h, exp(y), axis=1) * sum(reshape(h, shape=[6, 4]) @ w)",
    "an operand read twice by the concat": "concat(h, h, axis=1)",
    "an operand that is a slice of a result": "concat(slice(exp(v), axis=1, stop=3), exp(y), axis=1)",
}


@pytest.mark.parametrize("case", list(NOT_IN_PLACE))
def test_a_concat_whose_operands_cannot_all_be_written_in_place_stays_a_copy(case):
    src = f"""
graph c(x: f32[2, 3, 4], w: f32[4, 4], y: f32[2, 3, 4], v: f32[2, 6, 4]) -> f32[2, 6, 4] {{
  h = tanh(x)
  return {NOT_IN_PLACE[case]}
}}
"""
    mod = _run(src, x=_rand(2, 3, 4), w=_rand(4, 4, seed=1), y=_rand(2, 3, 4, seed=2), v=_rand(2, 6, 4, seed=3))
    assert "layout" in _kinds(mod)


def test_a_concat_copies_only_the_operands_that_no_kernel_writes_in_place():
    # ViT's dynamo export: the cls token is a bound input, copied; the patches are written in place
    src = """
graph c(x: f32[2, 3, 4], y: f32[2, 1, 4]) -> f32[2, 4, 4] {
  return concat(y, tanh(x), axis=1) * 2
}
"""
    mod = _run(src, x=_rand(2, 3, 4), y=_rand(2, 1, 4, seed=1))
    (cat,) = [p for p in _plans(mod) if p.kind == "layout"]
    assert cat.unread == {1} and cat.bytes == 2 * 2 * 4 * 4  # y only, read and written
    assert list(_writers(mod).values()) == [((cat.node, 4), (16, 4, 1))]
    (k,) = [k for k in mod.kernels if k.kind == "layout"]
    assert k.c_source.count("for (long o = 0;") == 1  # one copy block: y's


def test_an_operand_that_is_also_a_graph_output_keeps_its_own_buffer():
    src = """
graph c(x: f32[2, 3, 4], y: f32[2, 3, 4]) -> (f32[2, 6, 4], f32[2, 3, 4]) {
  e = exp(y)
  return concat(tanh(x), e, axis=1), e
}
"""
    mod = _run(src, x=_rand(2, 3, 4), y=_rand(2, 3, 4, seed=1))
    assert "layout" in _kinds(mod)


def test_only_the_kinds_that_write_through_strides_say_so():
    assert {k for k, kind in KIND.items() if kind.writes_strided} == {
        K.POINTWISE, K.LAYOUT, K.VIEW, K.ROW, K.CONTRACTION, K.CONV2D, K.CONTRACTION_ROW, K.ATTENTION_GRAD}


@pytest.mark.parametrize("axis", [1, 2])
def test_row_kernels_write_their_rows_through_strides(axis):
    # a softmax writes at any strides, a layernorm its rows of 4 contiguous wherever they are;
    # a layernorm along axis 1, whose rows are strided, is copied
    src = f"""
graph c(x: f32[2, 3, 4], y: f32[2, 3, 4], g: f32[4], b: f32[4], g3: f32[3], b3: f32[3]) -> (f32[2, {6 if axis == 1 else 3}, {8 if axis == 2 else 4}], f32[2, 6, 4], f32[2, 3, 8]) {{
  t = transpose(x, perm=[0, 2, 1])
  return concat(softmax(x * 2, axis=-1), exp(y), axis={axis}), concat(layernorm(x, g, b), exp(y) + 1, axis=1),
         concat(transpose(layernorm(t, g3, b3), perm=[0, 2, 1]), y * 3, axis=2)
}}
"""
    mod = _run(src, x=_rand(2, 3, 4), y=_rand(2, 3, 4, seed=1), g=_rand(4, seed=2), b=_rand(4, seed=3),
               g3=_rand(3, seed=4), b3=_rand(3, seed=5))
    rows = [p for p in _plans(mod) if p.kind == "row"]
    assert [p.body.nodes[p.shape.anchor].op for p in rows] == ["softmax", "layernorm", "layernorm"]
    assert rows[0].into is not None and rows[0].out_strides is not None
    assert rows[1].into is not None and rows[1].out_strides == (24, 4, 1)
    assert rows[2].into is None  # its rows of 3 are columns of the concat
    assert [k for k in _kinds(mod) if k == "layout"] == ["layout"]


GEMM_WRITERS = {
    # one GEMM over all rows, written at the concat's row stride ldc = 8
    "fold": ("x: f32[6, 4], w: f32[4, 4], y: f32[6, 4]", "f32[6, 8]", "concat(relu(x @ w + 1), exp(y), axis=1)",
             dict(x=(6, 4), w=(4, 4), y=(6, 4)), (8, 1)),
    # a batched GEMM, its batches at the concat's batch stride 24, its rows at ldc = 4
    "batch": ("x: f32[2, 3, 4], w: f32[2, 4, 4], y: f32[2, 3, 4]", "f32[2, 6, 4]", "concat(exp(y), x @ w, axis=1)",
              dict(x=(2, 3, 4), w=(2, 4, 4), y=(2, 3, 4)), (24, 4, 1)),
}


@pytest.mark.parametrize("mode", list(GEMM_WRITERS))
def test_a_gemm_writes_its_result_into_a_concat_along_an_inner_axis(mode):
    params, out, expr, shapes, strides = GEMM_WRITERS[mode]
    src = f"graph c({params}) -> {out} {{\n  return {expr}\n}}\n"
    mod = _run(src, **{n: _rand(*s, seed=i) for i, (n, s) in enumerate(shapes.items())})
    assert "layout" not in _kinds(mod)
    (gemm,) = [p for p in _plans(mod) if p.kind == "contraction"]
    assert gemm.out_strides == strides and gemm.detail.gemm.mode == mode


def test_a_gemm_whose_batches_are_looped_writes_contiguous_only():
    # A and B each batched along another axis: the wrapper loops over the batches
    src = """
graph c(x: f32[2, 3, 3, 4], w: f32[3, 4, 4], y: f32[2, 3, 3, 4]) -> f32[2, 3, 6, 4] {
  return concat(x @ w, exp(y), axis=2)
}
"""
    mod = _run(src, x=_rand(2, 3, 3, 4), w=_rand(3, 4, 4, seed=1), y=_rand(2, 3, 3, 4, seed=2))
    (gemm,) = [p for p in _plans(mod) if p.kind == "contraction"]
    assert gemm.detail.gemm.mode == "loop" and gemm.out_strides is None


def test_a_result_written_through_strides_is_not_streamed():
    # with a 64 KiB L3 a 64 KiB pointwise result streams past the caches in whole 64-byte lines;
    # written at the rows of a concat along an inner axis it cannot, and stores element by element
    src = """
graph c(x: f32[2, 64, 128], y: f32[2, 64, 128]) -> (f32[2, 128, 128], f32[2, 64, 128]) {
  return concat(exp(x), tanh(y), axis=1), x * 3
}
"""
    small = replace(machine.machine(), l3=1 << 16)
    with machine.pinned(small):
        mod = _run(src, x=_rand(2, 64, 128), y=_rand(2, 64, 128, seed=1))
    pw = [p for p in _plans(mod) if p.kind == "pointwise"]
    assert [(p.out_strides is not None, p.tiles["stream"]) for p in pw] == [(True, 0), (True, 0), (False, 1)]


# ---------------------------------------------------------------- the exported ViT


@pytest.mark.heavy
@pytest.mark.parametrize("exporter", [pytest.param("torchscript", marks=pytest.mark.extended), "dynamo"])  # (the suite's time)
def test_exported_vit_writes_its_patch_tokens_in_place(exporter):
    pytest.importorskip("transformers")
    mod = eqfuse.compile(str(me.export("vit", exporter)))
    (f,) = mod.functions.values()
    plans = f.compiled({}).plans
    # the conv2d writes its output, flattened and transposed to tokens, into the cls concat
    (conv,) = [p for p in plans if p.kind == "conv2d"]
    assert conv.into is not None and conv.out_strides is not None
    # TorchScript computes the cls rows (an expand): that kernel writes them in place, and the
    # concat runs no code; dynamo binds them as an input, which the concat copies alone
    copies = [p for p in plans if p.kind == "layout"]
    if exporter == "torchscript":
        assert copies == []
    else:
        (cat,) = copies
        assert cat.body.nodes[cat.shape.anchor].op == "concat" and cat.unread == {1}


def test_a_patch_embedding_writes_its_tokens_transposed_into_the_cls_concat():
    # ViT: conv2d (stride = kernel), flatten, transpose to tokens, the cls token in front; the
    # conv's GEMM stores C (channels x pixels) at a column stride (plan_gemm.conv_c_layout)
    src = """
graph vit(img: f32[3, 3, 8, 8], w: f32[16, 3, 4, 4], b: f32[16], cls: f32[3, 1, 16]) -> f32[3, 5, 16] {
  p = reshape(conv2d(img, w, b, stride=4), shape=[3, 16, 4])
  return concat(exp(cls), transpose(p, perm=[0, 2, 1]), axis=1)
}
"""
    mod = _run(src, img=_rand(3, 3, 8, 8), w=_rand(16, 3, 4, 4, seed=1), b=_rand(16, seed=2), cls=_rand(3, 1, 16, seed=3))
    assert "layout" not in _kinds(mod)
    (conv,) = [p for p in _plans(mod) if p.kind == "conv2d"]
    assert conv.into is not None and conv.out_strides == (80, 1, 32, 16)  # tokens of 16 after the cls row
