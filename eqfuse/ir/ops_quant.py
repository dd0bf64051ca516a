"""The ops of quantized models, with onnxruntime's exact semantics (eqfuse.frontend imports the ONNX
QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and MatMulInteger nodes to them).

    quantize_linear(x, scale, zp)    saturate(round_half_even(x / scale) + zp), in zp's dtype (u8, i8)
    dequantize_linear(q, scale, zp)  (int32(q) - int32(zp)) * scale, in f32 (q, zp: u8, i8 or i32)
    matmul_integer(a, b, a_zp, b_zp) (int32(a) - a_zp) @ (int32(b) - b_zp), exact in i32
    conv_integer(x, w, x_zp, w_zp)   conv2d(int32(x) - x_zp, int32(w) - w_zp), exact in i32; the
                                     padding is x_zp (a padded tap adds 0), as onnxruntime's
                                     ConvInteger and QLinearConv pad
    dynamic_scale(x)                 DynamicQuantizeLinear's scale of x: over the range
                                     [lo, hi] = [min(x, 0), max(x, 0)], (hi - lo) / 255 in f32 (1
                                     when hi == lo)
    dynamic_zero_point(x)            its zero point: saturate(round_half_even(-lo / scale)), u8
    dynamic_range(x)                 the range itself, f32 [2]: [min(x, 0), max(x, 0)]

The last three are one op each, not the min / max / where / divide they are made of: the
e-graph does not fuse the dozen scalar ops of every DynamicQuantizeLinear into each other and into
every kernel that reads the scale (which, before every conv of a dynamically quantized ResNet,
grew the fusion e-graph past its time limit). Over a tensor x each is an index kernel.
The range of a range is itself (it holds 0: lo <= 0 <= hi), so dynamic_scale(dynamic_range(x)) is
dynamic_scale(x) and likewise the zero point: the ONNX importer writes them so, x read in one pass
by dynamic_range. Of those two floats the scale and the zero point are C expressions
(RANGE_SCALARS, below), computed by the kernels that read them: the integer GEMM that quantizes
x by them, and its epilogue's x_scale * w_scale.

scale and zp broadcast against x as numpy does: per-tensor they are scalars, per-channel (ONNX's
axis=) they are shaped to broadcast along that axis ([C, 1, 1] for axis 1 of NCHW), so the first two
are plain pointwise ops. x / scale is a true f32 division (onnxruntime divides; a multiply by
1 / scale would round differently at ties); clamping before or after rounding is the same, the
bounds being integers.
"""

from __future__ import annotations

import numpy as np

from eqfuse.errors import ShapeError
from eqfuse.ir.ops import OPS, bcast_infer, conv2d_numpy, define, symmetric_pads
from eqfuse.ir.shapes import TType, broadcast, fmt


def _quantize_np(args, attrs):
    x, scale, zp = (np.asarray(a) for a in args)
    lo, hi = (0, 255) if zp.dtype == np.uint8 else (-128, 127)
    with np.errstate(all="ignore"):
        r = np.rint(x.astype(np.float32) / scale.astype(np.float32)) + zp.astype(np.float32)
    # a NaN saturates to the low end, as onnxruntime's max(x, low) gives its second operand
    return np.clip(np.where(np.isnan(r), lo, r), lo, hi).astype(zp.dtype)


def _dequantize_np(args, attrs):
    q, scale, zp = (np.asarray(a) for a in args)
    return (q.astype(np.int32) - zp.astype(np.int32)).astype(np.float32) * scale.astype(np.float32)


def _matmul_integer_infer(ts, attrs):
    a, b, azp, bzp = ts
    if a.rank < 2 or b.rank < 2:
        raise ShapeError(f"matmul_integer needs operands of rank >= 2, got {fmt(a.shape)} and {fmt(b.shape)}")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul_integer inner dimensions differ: {fmt(a.shape)} @ {fmt(b.shape)}")
    if b.rank > 2 and (b.rank > a.rank or tuple(b.shape[:-2]) != tuple(a.shape[a.rank - b.rank:-2])):
        raise ShapeError(f"matmul_integer needs b of rank 2 or with a's batch dims, got {fmt(a.shape)} @ {fmt(b.shape)}")
    if azp.rank != 0:
        raise ShapeError(f"matmul_integer needs a scalar a_zp, got {fmt(azp.shape)}")
    if bzp.rank > 1 or (bzp.rank == 1 and bzp.shape[0] != b.shape[-1]):
        raise ShapeError(f"matmul_integer needs b_zp scalar or [N] (one per column of b), got {fmt(bzp.shape)}")
    return TType(tuple(broadcast(a.shape[:-2], b.shape[:-2])) + (a.shape[-2], b.shape[-1]))


def _matmul_integer_np(args, attrs):
    a, b, azp, bzp = (np.asarray(x).astype(np.int32) for x in args)
    # int32 products and sums, as the C (and onnxruntime) accumulate: exact unless int32 overflows
    return np.matmul(a - azp, b - bzp).astype(np.int32)


def _conv_integer_infer(ts, attrs):
    x, w, xzp, wzp = ts
    if xzp.rank != 0:
        raise ShapeError(f"conv_integer needs a scalar x_zp, got {fmt(xzp.shape)}")
    if wzp.rank > 1 or (wzp.rank == 1 and w.rank == 4 and wzp.shape[0] != w.shape[0]):
        raise ShapeError(f"conv_integer needs w_zp scalar or [O] (one per output channel), got {fmt(wzp.shape)}")
    if symmetric_pads(attrs["padding"]) is None:
        # (the integer kernels pad each axis alike at both ends; the ONNX importer meets uneven
        # pads so, then slices the extra outputs off)
        raise ShapeError(f"conv_integer padding {list(attrs['padding'])} is uneven: the integer conv pads each "
                         "axis alike at both ends (pad by the larger amount and slice the extra outputs off)")
    return OPS["conv2d"].shape_rule([x, w], attrs)


def _conv_integer_np(args, attrs):
    x, w, xzp, wzp = (np.asarray(a).astype(np.int64) for a in args)
    wzp = wzp.reshape(-1, 1, 1, 1) if wzp.ndim == 1 else wzp
    # int64 products and sums of (x - x_zp) padded with 0, then int32: exact (a sum of K terms of
    # at most 255 x 255 overflows int32 only past K = 33025, beyond any real conv's C x KH x KW)
    return conv2d_numpy([x - xzp, w - wzp], attrs).astype(np.int32)


def _dynamic_range(x) -> tuple[np.float32, np.float32]:
    x = np.asarray(x, np.float32)
    # the range always holds 0 (onnxruntime's min(min(x), 0), max(max(x), 0)); a NaN is passed over
    return np.fmin.reduce(x, axis=None, initial=np.float32(0)), np.fmax.reduce(x, axis=None, initial=np.float32(0))


def _dynamic_scale_np(args, attrs):
    lo, hi = _dynamic_range(args[0])
    # f32 arithmetic as onnxruntime: (hi - lo) rounded, then divided (not times 1/255)
    return np.asarray(np.float32(1) if hi == lo else np.float32(hi - lo) / np.float32(255), np.float32)


def _dynamic_zero_point_np(args, attrs):
    lo, _ = _dynamic_range(args[0])
    scale = _dynamic_scale_np(args, attrs)
    return _quantize_np([-lo, scale, np.zeros((), np.uint8)], {})


def _dynamic_range_np(args, attrs):
    return np.asarray(_dynamic_range(args[0]), np.float32)


# DynamicQuantizeLinear's scale and zero point, ops of dynamic_range's two floats: C expressions of
# those two floats (eqf_range_scale, eqf_range_zero_point in common.h), so a kernel that reads the
# range computes them itself (eqfuse.ir.kernels.range_scalar): no kernel of their own
RANGE_SCALARS = ("dynamic_scale", "dynamic_zero_point")


def _scalar_infer(ts, attrs):
    return TType(())


def _pair_infer(ts, attrs):
    return TType((2,))


# The C reads the saturation range off the zero point's C type (EQF_QLO / EQF_QHI in common.h).
define(name="quantize_linear", kind="pointwise", arity=(3, 3), infer=bcast_infer, dtype="quantize",
    numpy=_quantize_np, flops=4, c="eqf_quantize({0}, {1}, (float)({2}), EQF_QLO({2}), EQF_QHI({2}))")
define(name="dequantize_linear", kind="pointwise", arity=(3, 3), infer=bcast_infer, dtype="dequantize",
    numpy=_dequantize_np, flops=2, c="((float)((int32_t)({0}) - (int32_t)({2})) * ({1}))")
# matmul_integer is a contraction: the u8 x s8 GEMM of the contraction kind (csrc_templates/gemm_u8s8.c),
# its dequantization, bias and activation a pointwise epilogue on the exact int32 sum.
define(name="matmul_integer", kind="contraction", arity=(4, 4), infer=_matmul_integer_infer, dtype="matmul_integer",
    numpy=_matmul_integer_np)
# conv_integer is a contraction too: im2col into the integer GEMM's A buffer (qgemm's im2col), the
# weights its B, the requantization or dequantization its epilogue
define(name="conv_integer", kind="contraction", arity=(4, 4), infer=_conv_integer_infer, dtype="matmul_integer",
    numpy=_conv_integer_np, attrs=OPS["conv2d"].attrs)
# DynamicQuantizeLinear's scale and zero point, and the range they are computed over: index kernels
# (one pass over x each, eqfuse.backend.kinds.index)
define(name="dynamic_scale", kind="index", arity=(1, 1), infer=_scalar_infer, dtype="float", numpy=_dynamic_scale_np)
define(name="dynamic_zero_point", kind="index", arity=(1, 1), infer=_scalar_infer, dtype="dynamic_zero_point",
    numpy=_dynamic_zero_point_np)
define(name="dynamic_range", kind="index", arity=(1, 1), infer=_pair_infer, dtype="float", numpy=_dynamic_range_np)
