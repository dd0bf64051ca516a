"""A QuantizeLinear after a softmax or a normalization is part of the row kernel (rules
epilogue_*_quantize, eqfuse/optimizer/rules/fusion.rw): the kernel computes its rows in f32
scratch rows and stores only the u8 / i8 result (the plan's quantize_out; docs/precision.md,
"Quantized models"). Its integers are those the separate kernels give, and numpy's quantization
of the row op's f32 result."""

import re

import numpy as np
import pytest

import eqfuse
from eqfuse.runtime.verify import ATOL, RTOL

# As quantize_static writes them: each row op reads a DequantizeLinear of u8 and its result is
# quantized per tensor. Rows of 40 (not a multiple of 16) and 300 (a softmax block of one row),
# 13 rows (a last softmax block of 5 of 8), a softmax along the first axis (its output strided),
# and an i8 result.
S_X, S_LN, S_SM, S_RMS = 0.05, 0.02, 1 / 255, 0.03
HEAD = "graph rows(a: u8[13, 40], c: u8[6, 300], az: u8, g: f32[40], b: f32[40], g2: f32[300], z: u8, zi: i8)"
XY = f"x = dequantize_linear(a, {S_X}, az)\n    y = dequantize_linear(c, {S_X}, az)"
RESULTS = ["layernorm(x, g, b, eps=1e-5)", "softmax(x, axis=-1)", "softmax(x, axis=0)", "rmsnorm(y, g2, eps=1e-5)",
           "softmax(y, axis=-1)", "rmsnorm(x, g, eps=1e-5)"]
SCALES = [S_LN, S_SM, S_SM, S_RMS, S_SM, S_RMS]
ZPS = ["z", "z", "z", "zi", "zi", "z"]
ROWS = HEAD + " {\n    " + XY + "\n    return " + ", ".join(
    f"quantize_linear({r}, {s}, {z})" for r, s, z in zip(RESULTS, SCALES, ZPS)) + "\n}"
# the same row ops in f32: their kernels read the same u8 through the same dequantize, so they
# round as written too (fp_contract=0) and compute the fused kernels' f32 values
ROWS_F32 = HEAD + " {\n    " + XY + "\n    return " + ", ".join(RESULTS) + "\n}"
QUANTIZE_RULES = ["epilogue_softmax_quantize", "epilogue_layernorm_quantize", "epilogue_rmsnorm_quantize"]


@pytest.fixture(scope="module")
def modules():
    return (eqfuse.compile(ROWS), eqfuse.compile(ROWS, disable=QUANTIZE_RULES), eqfuse.compile(ROWS_F32))


@pytest.fixture(scope="module")
def feeds():
    rng = np.random.default_rng(0)
    return {"a": rng.integers(0, 256, (13, 40), dtype=np.uint8), "c": rng.integers(0, 256, (6, 300), dtype=np.uint8),
            "az": np.array(128, np.uint8), "g": rng.standard_normal(40).astype(np.float32),
            "b": rng.standard_normal(40).astype(np.float32), "g2": rng.standard_normal(300).astype(np.float32),
            "z": np.array(100, np.uint8), "zi": np.array(-20, np.int8)}


def _quantize(y, s, z):
    """ONNX QuantizeLinear in numpy: y / s in the dtype of y (f32: correctly rounded, as C's), half to even."""
    lo, hi = np.iinfo(z.dtype).min, np.iinfo(z.dtype).max
    return np.clip(np.rint(y / y.dtype.type(s)) + int(z), lo, hi).astype(z.dtype)


@pytest.mark.heavy  # (the fast tier's time)
def test_a_quantize_after_a_row_op_is_one_row_kernel_storing_integers(modules):
    fused, separate, _ = modules
    assert [(k.kind, k.decisions["quantize_out"]) for k in fused.kernels] == [("row", 1)] * 6
    for k in fused.kernels:  # the quantize is the op table's eqf_quantize, in the row's last pass
        assert "eqf_quantize(" in k.c_source and "_QUANTIZE_OUT 1" in k.c_source, k.name
    # without the rules: each row op a row kernel storing f32, each quantize a pointwise kernel
    assert sorted(k.kind for k in separate.kernels) == ["pointwise"] * 6 + ["row"] * 6
    assert all(k.decisions["quantize_out"] == 0 for k in separate.kernels if k.kind == "row")


@pytest.mark.heavy
def test_the_fused_integers_are_the_separate_kernels_and_numpys_quantization(modules, feeds):
    fused, separate, f32 = modules
    got, sep, ys = fused(**feeds), separate(**feeds), f32(**feeds)
    zps = [feeds[z] for z in ZPS]
    for k, (q, qs, y, s, z) in enumerate(zip(got, sep, ys, SCALES, zps)):
        assert q.dtype == z.dtype and y.dtype == np.float32
        # the same f32 values (scratch row or output row) quantized by the same eqf_quantize: equal
        np.testing.assert_array_equal(q, qs, err_msg=f"output {k}")
        np.testing.assert_array_equal(q, _quantize(y, s, z), err_msg=f"output {k}")
        assert len(np.unique(q)) > 10, k  # (the scales spread the values over many integers)


@pytest.mark.heavy
def test_the_fused_integers_are_within_one_step_of_the_float64_reference_only_at_ties(feeds, modules):
    """Against the float64 row ops, quantized: an integer may be one step off only where the f32
    result can lie on the other side of a rounding boundary, i.e. where the float64 value y is
    within B = ATOL + RTOL |y| of a half-integer multiple of the scale (B: eqfuse's f32 tolerance,
    eqfuse.runtime.verify, which the f32 row kernels meet); everywhere else it is exact."""
    fused = modules[0]
    x = (feeds["a"].astype(np.float64) - 128) * np.float64(np.float32(S_X))
    y2 = (feeds["c"].astype(np.float64) - 128) * np.float64(np.float32(S_X))
    g, b, g2 = (feeds[n].astype(np.float64) for n in ("g", "b", "g2"))

    def softmax(v, axis):
        e = np.exp(v - v.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)

    def layernorm(v):
        return (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + 1e-5) * g + b

    def rmsnorm(v, w, eps=1e-5):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w

    refs = [layernorm(x), softmax(x, -1), softmax(x, 0), rmsnorm(y2, g2), softmax(y2, -1), rmsnorm(x, g)]
    zps = [feeds[z] for z in ZPS]
    ties = 0
    for k, (q, y, s, z) in enumerate(zip(fused(**feeds), refs, SCALES, zps)):
        s = np.float64(np.float32(s))
        bound = (ATOL + RTOL * np.abs(y)) / s
        t = y / s
        near = np.abs(t - np.floor(t) - 0.5) <= bound  # a half-integer within the bound
        want = _quantize(y, s, z)
        d = np.abs(q.astype(np.int32) - want.astype(np.int32))
        assert d.max() <= 1 and not np.any(d[~near]), f"output {k}: {np.argwhere(d[~near] > 0)[:5]}"
        ties += int(near.sum())
    assert ties < sum(r.size for r in refs) // 10  # (the allowance is rare, not every element)


MUST_NOT = """graph keep(x: f32[8, 40], w: f32[40, 40], g: f32[40], b: f32[40], s: f32[40], zc: u8[40], z: u8) {
    return quantize_linear(layernorm(x, g, b), s, zc), quantize_linear(layernorm(x @ w, g, b), 0.02, z)
}
"""


def test_a_per_channel_quantize_stays_a_kernel_and_a_gemms_row_epilogue_does_not_take_one(tmp_path, capsys):
    """Must not rewrite: the rules take a per-tensor quantize only (rank(?s) == 0), so a
    per-channel one stays a pointwise kernel; and classify refuses a quantized GEMM row epilogue
    (its C is f32), so after a matmul the quantized layernorm is a row kernel of its own."""
    from eqfuse.cli.main import main
    path = tmp_path / "keep.g"
    path.write_text(MUST_NOT)
    assert main(["opt", str(path)]) == 0
    text = capsys.readouterr().out
    assert re.search(r"(k\d+) = kernel \{ layernorm\(x, g, b\) \}", text), text
    assert re.search(r"kernel \{ quantize_linear\(k\d+, s, zc\) \}", text), text
    mm = re.search(r"(k\d+) = kernel \{ x @ w \}", text)
    assert mm and f"kernel {{ quantize_linear(layernorm({mm.group(1)}, g, b), 0.02, z) }}" in text, text


def test_a_row_kernel_writing_integers_but_by_a_quantize_is_refused_naming_the_block(tmp_path, capsys):
    from eqfuse.cli.main import main
    path = tmp_path / "bad.g"
    path.write_text('graph bad(x: f32[8, 40]) {\n    return kernel { cast(softmax(x), to="u8") }\n}\n')
    assert main(["lower", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2:12: error: this kernel block cannot be lowered: a softmax kernel writes f32" in err, err


# A kernel block whose epilogue reads the columns (g, b) between the layernorm and the quantize:
# its block of rows is quantized row by row (quantize_flat 0), the other kernels above in one loop
# over the block (1; not the softmax along axis 0, whose rows are strided in the output). Its f32
# twin, in the same module, gives the f32 values it quantizes (the same kernel C but the store).
EPI = """graph epi(a: u8[13, 40], az: u8, g: f32[40], b: f32[40], z: u8) {
    x = dequantize_linear(a, 0.05, az)
    return kernel { quantize_linear(layernorm(x, g, b, eps=1e-5) * g + b, 0.02, z) }, kernel { layernorm(x, g, b, eps=1e-5) * g + b }
}
"""


@pytest.mark.heavy  # (the fast tier's time)
def test_a_block_of_rows_is_quantized_in_one_loop_where_the_output_rows_are_consecutive(modules, feeds):
    assert [k.decisions["quantize_flat"] for k in modules[0].kernels] == [1, 1, 0, 1, 1, 1]
    # the norms reading u8 through their prologue sum each row apart (eqf_row_sum: the pass's
    # vectors hold 64 bytes), in the f32 twins too; a norm reading f32 sums in its first pass
    for mod in (modules[0], modules[2]):
        assert [k.decisions.get("sum_apart") for k in mod.kernels] == [1, 0, 0, 1, 0, 1]
    mod = eqfuse.compile(EPI, fuse="manual")  # (the blocks as written)
    q, y = mod(**{n: feeds[n] for n in ("a", "az", "g", "b", "z")})
    rows = [(k.decisions["quantize_out"], k.decisions["quantize_flat"]) for k in mod.kernels if k.kind == "row"]
    assert rows == [(1, 0), (0, 0)]  # (and the dequantize a kernel of its own)
    assert not any(k.decisions.get("sum_apart") for k in mod.kernels)
    np.testing.assert_array_equal(q, _quantize(y, 0.02, feeds["z"]))
    assert len(np.unique(q)) > 10
