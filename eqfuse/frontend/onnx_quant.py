"""ONNX handlers of quantized models as onnxruntime's quantizers write them: QuantizeLinear and
DequantizeLinear (QDQ, per tensor and per channel), DynamicQuantizeLinear, MatMulInteger and
ConvInteger (quantize_dynamic), QLinearMatMul and QLinearConv (quantize_static's QOperator format)
and the com.microsoft contrib ops that format writes (QLinearAdd, QLinearGlobalAveragePool, QGemm,
...: the end of this file). Each turns into the ops of eqfuse.ir.ops_quant, whose numpy reference
and C compute what onnxruntime computes, integer for integer (the contrib ops that onnxruntime
computes with f32 steps of its own: to one step, docs/precision.md).

Per-channel (axis=) scales and zero points are reshaped to broadcast along the axis ([C, 1, 1]
for axis 1 of a rank-4 tensor), so the ops stay pointwise. A zero point of another type than uint8
and int8 (int32 only for DequantizeLinear, float8, int4, int16) and the blocked form (block_size)
are refused with the node's name.
"""

from __future__ import annotations

import numpy as np

from eqfuse.frontend.onnx_handlers import conv_geometry, softmax_of
from eqfuse.frontend.onnx_registry import (
    HANDLERS,
    ONNX_DTYPES,
    Unsupported,
    dtype_name,
    handles,
)
from eqfuse.ir.shapes import NUMPY_DTYPE, QUANT_DTYPES, broadcast, dtype_of_numpy

F32 = np.float32


def _dtype(imp, v) -> str | None:
    return dtype_of_numpy(np.asarray(v).dtype) if imp.is_const(v) else imp.type(v).dtype


def _dtype_text(imp, v) -> str:
    """The dtype of v for a message: eqfuse's name, or numpy's for a constant eqfuse has no dtype
    for (int16, uint16)."""
    return _dtype(imp, v) or str(np.asarray(v).dtype)


def _zero_point(imp, ins, i: int, dtype: str, allowed: tuple[str, ...]) -> tuple[object, str]:
    """Input i as a zero point (a zero of `dtype` when absent) and its dtype, refused unless allowed."""
    v = ins[i] if len(ins) > i and ins[i] is not None else np.zeros((), NUMPY_DTYPE[dtype])
    dt = _dtype(imp, v)
    if dt not in allowed:
        what = str(np.asarray(v).dtype) if imp.is_const(v) else dt
        raise Unsupported(f"zero point type {what} (input {i}, '{imp.node.input[i]}'; eqfuse takes "
                          f"{', '.join(NUMPY_DTYPE[a] for a in allowed)})")
    return v, dt


def _along(imp, v, name: str, rank: int, axis: int):
    """A scale or zero point as a node broadcasting against a tensor of rank `rank`: a scalar (or a
    one-element tensor) per tensor, a 1-D tensor per channel of `axis`."""
    if imp.is_const(v):
        arr = np.asarray(v)
        if arr.size == 1:
            arr = arr.reshape(())
        elif arr.ndim == 1 and rank > 0:
            arr = arr.reshape((arr.size,) + (1,) * (rank - 1 - axis % rank))
        else:
            raise Unsupported(f"scale or zero point of shape {list(arr.shape)} ('{name}'; blocked quantization)")
        if arr.ndim == 0 and arr.dtype.kind in "iu":  # a typed zero point, not a weakly typed literal
            # one parameter per dtype and value, so that equal zero points are one e-class (the
            # rule dequantize_quantize matches a pair of nodes by their scale and zero point)
            key = ("zero_point", arr.dtype.str, int(arr))
            if key not in imp.memo:
                imp.memo[key] = imp.new_param("zero_point", arr)
            return imp.memo[key]
        return imp.data(arr, None if arr.shape != np.asarray(v).shape else name)
    t = imp.type(v)
    if t.rank == 0:
        return v
    if t.rank == 1 and t.shape[0] == 1:
        return imp.reshape_to(v, ())
    if t.rank == 1 and rank > 0:
        return imp.reshape_to(v, (t.shape[0],) + (1,) * (rank - 1 - axis % rank))
    raise Unsupported(f"scale or zero point of shape {list(t.shape)} ('{name}'; blocked quantization)")


def _check_attrs(at) -> None:
    if at.get("block_size", 0):
        raise Unsupported(f"attribute 'block_size' = {at['block_size']} (blocked quantization)")


@handles("QuantizeLinear", attrs=("axis", "saturate", "block_size", "output_dtype"))
def _quantize(imp, ins, at):
    _check_attrs(at)
    default = "u8"
    if at.get("output_dtype"):
        default = ONNX_DTYPES.get(at["output_dtype"])
        if default not in QUANT_DTYPES:
            raise Unsupported(f"attribute 'output_dtype' = {dtype_name(at['output_dtype'])} (eqfuse quantizes to uint8, int8)")
    zp, _ = _zero_point(imp, ins, 2, default, QUANT_DTYPES)
    x = imp.data(ins[0], imp.node.input[0])
    rank, axis = imp.type(x).rank, at.get("axis", 1)
    scale = _along(imp, ins[1], imp.node.input[1], rank, axis)
    zpn = _along(imp, zp, imp.node.input[2] if len(ins) > 2 else "zero point", rank, axis)
    return imp.op("quantize_linear", [x, scale, zpn])


@handles("DequantizeLinear", attrs=("axis", "block_size"))
def _dequantize(imp, ins, at):
    _check_attrs(at)
    xdt = _dtype(imp, ins[0])
    if xdt not in QUANT_DTYPES + ("i32",):
        raise Unsupported(f"input type {_dtype_text(imp, ins[0])} (eqfuse dequantizes uint8, int8 and int32)")
    zp, _ = _zero_point(imp, ins, 2, xdt, (xdt,))
    x = imp.data(ins[0], imp.node.input[0])
    rank, axis = imp.type(x).rank, at.get("axis", 1)
    scale = _along(imp, ins[1], imp.node.input[1], rank, axis)
    zpn = _along(imp, zp, imp.node.input[2] if len(ins) > 2 else "zero point", rank, axis)
    return imp.op("dequantize_linear", [x, scale, zpn])


@handles("DynamicQuantizeLinear")
def _dynamic_quantize(imp, ins, at):
    """onnxruntime's formula in f32: the range [min(x, 0), max(x, 0)], scale = its width / 255 (1
    when it is empty), zero point = saturate(round(-min / scale)), y = saturate(round(x / scale) + zp).
    The scale and the zero point are one op each (eqfuse.ir.ops_quant), y a quantize_linear; both
    are taken of dynamic_range(x), the same values (a range's range is itself), so that x is read
    once for the range, not once for each."""
    x = imp.data(ins[0], imp.node.input[0])
    r = imp.op("dynamic_range", [x])
    scale, zp = imp.op("dynamic_scale", [r]), imp.op("dynamic_zero_point", [r])
    return [imp.op("quantize_linear", [x, scale, zp]), scale, zp]


def _matmul_integer_node(imp, a, b, azp, bzp):
    ta, tb = imp.type(a), imp.type(b)
    if ta.rank < 2 or tb.rank < 2:
        raise Unsupported(f"operands of rank {ta.rank} and {tb.rank} (eqfuse takes rank >= 2)")
    for v, what in ((azp, "a"), (bzp, "b")):
        if imp.is_const(v) and np.asarray(v).size != 1 and what == "a":
            raise Unsupported("a_zero_point per row (eqfuse takes a scalar)")
    azn = _along(imp, azp, "a_zero_point", 0, 0) if imp.is_const(azp) and np.asarray(azp).size == 1 else \
        _along(imp, azp, "a_zero_point", 1, 0)
    bzn = _along(imp, bzp, "b_zero_point", 1, 0)
    if tb.rank > 2:  # batch dims that broadcast (a multi-query attention's one key head): both expanded
        batch = broadcast(ta.shape[:-2], tb.shape[:-2])
        a, b = (t if tuple(tt.shape[:-2]) == batch else imp.op("expand", [t], shape=batch + tuple(tt.shape[-2:]))
                for t, tt in ((a, ta), (b, tb)))
    return imp.op("matmul_integer", [a, b, azn, bzn])


@handles("MatMulInteger")
def _matmul_integer(imp, ins, at):
    adt, bdt = _dtype(imp, ins[0]), _dtype(imp, ins[1])
    for dt, i in ((adt, 0), (bdt, 1)):
        if dt not in QUANT_DTYPES:
            raise Unsupported(f"input type {_dtype_text(imp, ins[i])} (input {i}; eqfuse takes uint8 and int8)")
    azp, _ = _zero_point(imp, ins, 2, adt, (adt,))
    bzp, _ = _zero_point(imp, ins, 3, bdt, (bdt,))
    a, b = imp.data(ins[0], imp.node.input[0]), imp.data(ins[1], imp.node.input[1])
    return _matmul_integer_node(imp, a, b, azp, bzp)


@handles("QLinearMatMul")
def _qlinear_matmul(imp, ins, at):
    """onnxruntime's requantization: the i32 product times a_scale * b_scale / y_scale (in that order,
    in f32), rounded half to even, plus y's zero point, saturated (quantize_linear with scale 1: x / 1
    is x)."""
    adt, bdt = _dtype(imp, ins[0]), _dtype(imp, ins[3])
    for dt, i in ((adt, 0), (bdt, 3)):
        if dt not in QUANT_DTYPES:
            raise Unsupported(f"input type {_dtype_text(imp, ins[i])} (input {i}; eqfuse takes uint8 and int8)")
    azp, _ = _zero_point(imp, ins, 2, adt, (adt,))
    bzp, _ = _zero_point(imp, ins, 5, bdt, (bdt,))
    yzp, _ = _zero_point(imp, ins, 7, "u8", QUANT_DTYPES)
    a, b = imp.data(ins[0], imp.node.input[0]), imp.data(ins[3], imp.node.input[3])
    acc = imp.op("cast", [_matmul_integer_node(imp, a, b, azp, bzp)], to="f32")
    if not all(imp.is_const(ins[i]) for i in (1, 4, 6)):
        raise Unsupported("scales computed at run time (eqfuse takes constant scales)")
    return _requantize(imp, acc, ins[1], ins[4], ins[6], yzp, 1)


def _requantize(imp, acc, a_scale, b_scale, y_scale, yzp, rank: int):
    """onnxruntime's requantization of an i32 accumulator (acc, already cast to f32): times
    a_scale * b_scale / y_scale, computed in that order in f32 (b_scale per tensor, or one per
    output channel: axis 1 of a rank-4 conv output, the last axis of a matmul's when rank is 1),
    rounded half to even, plus y's zero point, saturated (quantize_linear with scale 1: x / 1 is x)."""
    mult = (np.asarray(a_scale, F32).reshape(()) * np.asarray(b_scale, F32).reshape(-1)) / np.asarray(y_scale, F32).reshape(())
    zp_name = imp.node.input[7] if len(imp.node.input) > 7 else "y_zero_point"
    return _requantize_by(imp, acc, mult, yzp, zp_name, rank)


def _requantize_by(imp, acc, mult: np.ndarray, yzp, zp_name: str, rank: int):
    """acc (f32, the exact integer sum) times the f32 multiplier `mult` (one, or one per channel of
    axis 1 of a rank-4 result, the last axis when rank is 1), rounded half to even, plus y's zero
    point, saturated: MLAS's MlasRequantizeOutput, which QLinearMatMul, QLinearConv, QGemm and
    QLinearGlobalAveragePool end with."""
    mult = mult.reshape(()) if mult.size == 1 else mult.reshape((mult.size,) + (1,) * (rank - 1))
    mult = imp.data(mult, None)
    one = imp.new_param("unit_scale", np.asarray(1, F32))
    return imp.op("quantize_linear", [imp.op("mul", [acc, mult]), one, _along(imp, yzp, zp_name, 0, 0)])


def _conv_integer_node(imp, x, w, xzp, wzp, at):
    """conv_integer over ONNX Conv attributes (2-D only). Asymmetric pads: both sides padded by
    the larger amount and the extra outputs sliced off, when the stride divides the shift."""
    xs, ws = imp.type(x).shape, imp.type(w).shape
    if len(xs) != 4 or len(ws) != 4:
        raise Unsupported(f"a {len(xs) - 2}-D convolution (eqfuse's integer convolution is 2-D, NCHW)")
    strides, pads, dilations, spans = conv_geometry(xs, ws, at)
    # more padding at the end, the stride not dividing the extra: the extra is concatenated, a
    # block of x's zero point (what the padding reads; one computed at run time, a
    # DynamicQuantizeLinear's, expanded to the block), and the conv is padded evenly
    for axis, ((a, b), s) in enumerate(zip(pads, strides), start=2):
        if b > a and (b - a) % s:
            shape = list(imp.type(x).shape)
            if not all(isinstance(d, int) for d in shape):
                raise Unsupported(f"asymmetric pads {[list(p) for p in pads]} with stride {s} and named dims")
            shape[axis] = b - a
            if imp.is_const(xzp):
                block = imp.new_param(f"{imp.node.name or imp.node.output[0]}_pad",
                                      np.full(shape, np.asarray(xzp).reshape(())))
            else:
                block = imp.op("expand", [_along(imp, xzp, "x_zero_point", 0, 0)], shape=tuple(shape))
            x = imp.op("concat", [x, block], axis=axis)
            xs = imp.type(x).shape
            pads[axis - 2] = (a, a)
    pad = [max(a, b) for a, b in pads]
    wzn = _along(imp, wzp, "w_zero_point", 1, 0)
    if imp.type(wzn).rank == 1 and imp.type(wzn).shape[0] != ws[0]:
        raise Unsupported(f"w_zero_point of shape {list(imp.type(wzn).shape)} (eqfuse takes a scalar or one per "
                          f"output channel, {ws[0]})")
    y = imp.op("conv_integer", [x, w, _along(imp, xzp, "x_zero_point", 0, 0), wzn], stride=tuple(strides),
               padding=tuple(pad), dilation=tuple(dilations), group=at.get("group", 1))
    for axis, ((a, b), s, n, kk) in enumerate(zip(pads, strides, xs[2:], spans), start=2):
        if a != b:
            first = (max(a, b) - a) // s
            y = imp.op("slice", [y], axis=axis, start=first, stop=first + (n + a + b - kk) // s + 1)
    return y


def _integer_operands(imp, ins, ia: int, ib: int, what=("x", "w")) -> tuple[str, str]:
    dts = _dtype(imp, ins[ia]), _dtype(imp, ins[ib])
    for dt, i, name in zip(dts, (ia, ib), what):
        if dt not in QUANT_DTYPES:
            raise Unsupported(f"input type {_dtype_text(imp, ins[i])} ({name}, input {i}; eqfuse takes uint8 and int8)")
    return dts


_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _conv_operands(imp, ins, ix: int, iw: int, at):
    """x and w as conv_integer takes them, the attributes, and the function giving the result
    its rank back: a 1-D conv (Wav2Vec2's and Whisper's, as quantize_dynamic writes them) is the
    2-D conv of height 1 (x [N, C, L] as [N, C, 1, L], w [O, I, k] as [O, I, 1, k])."""
    x = imp.data(ins[ix], imp.node.input[ix])
    if imp.type(x).rank != 3:
        return x, imp.data(ins[iw], imp.node.input[iw]), at, lambda y: y
    xs = imp.type(x).shape
    w = ins[iw]
    w = imp.data(w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]), imp.node.input[iw]) if imp.is_const(w) else \
        imp.reshape_to(imp.data(w, imp.node.input[iw]), (imp.type(w).shape[0], imp.type(w).shape[1], 1, -1))
    at = dict(at)
    for name, fill in (("strides", 1), ("dilations", 1), ("kernel_shape", 1)):
        if name in at:
            at[name] = [fill, *at[name]]
    if "pads" in at:
        at["pads"] = [0, at["pads"][0], 0, at["pads"][1]]
    x = imp.reshape_to(x, (xs[0], xs[1], 1, xs[2]))
    return x, w, at, lambda y: imp.reshape_to(y, tuple(imp.type(y).shape[:2]) + (imp.type(y).shape[3],))


@handles("ConvInteger", attrs=_CONV_ATTRS)
def _conv_integer(imp, ins, at):
    """(x - x_zp) conv (w - w_zp), exact in i32, the padding x_zp (onnxruntime's ConvInteger)."""
    xdt, wdt = _integer_operands(imp, ins, 0, 1)
    xzp, _ = _zero_point(imp, ins, 2, xdt, (xdt,))
    wzp, _ = _zero_point(imp, ins, 3, wdt, (wdt,))
    x, w, at, back = _conv_operands(imp, ins, 0, 1, at)
    return back(_conv_integer_node(imp, x, w, xzp, wzp, at))


@handles("QLinearConv", attrs=_CONV_ATTRS)
def _qlinear_conv(imp, ins, at):
    """onnxruntime's QLinearConv: the exact i32 conv of (x - x_zp) and (w - w_zp) (padding x_zp),
    plus the i32 bias, then requantized as QLinearMatMul (_requantize); w's scale and zero point
    per tensor or per output channel."""
    xdt, wdt = _integer_operands(imp, ins, 0, 3)
    xzp, _ = _zero_point(imp, ins, 2, xdt, (xdt,))
    wzp, _ = _zero_point(imp, ins, 5, wdt, (wdt,))
    yzp, _ = _zero_point(imp, ins, 7, "u8", QUANT_DTYPES)
    if not all(imp.is_const(ins[i]) for i in (1, 4, 6)):
        raise Unsupported("scales computed at run time (eqfuse takes constant scales)")
    x, w, at, back = _conv_operands(imp, ins, 0, 3, at)
    M = imp.type(w).shape[0] if imp.type(w).rank == 4 else None
    if np.asarray(ins[4]).size not in (1, M):
        raise Unsupported(f"w_scale of shape {list(np.asarray(ins[4]).shape)} (eqfuse takes a scalar or one per "
                          f"output channel, {M})")
    acc = _conv_integer_node(imp, x, w, xzp, wzp, at)
    if len(ins) > 8 and ins[8] is not None:
        bdt = _dtype(imp, ins[8])
        if bdt != "i32":
            raise Unsupported(f"bias type {_dtype_text(imp, ins[8])} (input 8; QLinearConv's bias is int32)")
        b = imp.data(ins[8], imp.node.input[8])
        if imp.type(b).shape != (M,):
            raise Unsupported(f"bias of shape {list(imp.type(b).shape)} (one int32 per output channel, {M})")
        acc = imp.op("add", [acc, imp.reshape_to(b, (M, 1, 1))])
    return back(_requantize(imp, imp.op("cast", [acc], to="f32"), ins[1], ins[4], ins[6], yzp, 3))


# ---------------------------------------------------------------- onnxruntime's QOperator contrib ops
# quantize_static(..., quant_format=QuantFormat.QOperator) writes these in the com.microsoft domain
# around its QLinearConv and QLinearMatMul: each takes u8 (or i8) tensors with a scale and zero point
# per tensor and gives one. Each is imported as what it means, dequantize -> the f32 op ->
# quantize, which the optimizer fuses into the kernel of the f32 op; QGemm and
# QLinearGlobalAveragePool as the exact integer sums onnxruntime computes, requantized as
# QLinearMatMul is.

MS = "com.microsoft"


def _per_tensor(imp, v, name: str):
    """A per-tensor scale or zero point (a scalar or a one-element tensor) as a node."""
    size = np.asarray(v).size if imp.is_const(v) else None
    if size is None:
        t = imp.type(v)
        size = 1 if t.rank == 0 or (t.rank == 1 and t.shape[0] == 1) else None
    if size != 1:
        shape = list(np.asarray(v).shape) if imp.is_const(v) else list(imp.type(v).shape)
        raise Unsupported(f"scale or zero point of shape {shape} ('{name}'; this op takes one per tensor)")
    return _along(imp, v, name, 0, 0)


def _input_name(imp, i: int, default: str) -> str:
    return imp.node.input[i] if len(imp.node.input) > i and imp.node.input[i] else default


def _dequantized(imp, ins, i: int):
    """Inputs i, i + 1, i + 2 (x, its scale, its optional zero point) as dequantize_linear(x, s, zp),
    and x's dtype."""
    dt = _dtype(imp, ins[i])
    if dt not in QUANT_DTYPES:
        raise Unsupported(f"input type {_dtype_text(imp, ins[i])} (input {i}; eqfuse takes uint8 and int8)")
    zp, _ = _zero_point(imp, ins, i + 2, dt, (dt,))
    x = imp.data(ins[i], imp.node.input[i])
    scale = _per_tensor(imp, ins[i + 1], _input_name(imp, i + 1, "scale"))
    return imp.op("dequantize_linear", [x, scale, _per_tensor(imp, zp, _input_name(imp, i + 2, "zero point"))]), dt


def _quantized(imp, y, ins, i: int, dt: str):
    """The f32 y quantized by inputs i (scale) and i + 1 (the optional zero point, of dtype dt: a
    contrib op's output has its input's type)."""
    zp, _ = _zero_point(imp, ins, i + 1, dt, (dt,))
    scale = _per_tensor(imp, ins[i], _input_name(imp, i, "y_scale"))
    return imp.op("quantize_linear", [y, scale, _per_tensor(imp, zp, _input_name(imp, i + 1, "y_zero_point"))])


@handles("QLinearAdd", "QLinearMul", domain=MS)
def _qlinear_binary(imp, ins, at):
    """C = quantize(dequantize(A) op dequantize(B)), broadcasting as Add and Mul. onnxruntime's
    kernel folds the scale ratios A_scale / C_scale, B_scale / C_scale and the zero points into one
    multiply-add per operand before it rounds, so where the exact value lies within f32 rounding of
    a half-integer the two round to neighbouring integers: one step of C apart (docs/precision.md)."""
    a, dt = _dequantized(imp, ins, 0)
    b, bdt = _dequantized(imp, ins, 3)
    if bdt != dt:
        raise Unsupported(f"operands of types {dt} and {bdt} (QLinear ops take one type)")
    y = imp.op("add" if imp.node.op_type == "QLinearAdd" else "mul", [a, b])
    return _quantized(imp, y, ins, 6, dt)


def fold_qlinear_binary(node, ins) -> list[np.ndarray]:
    """QLinearAdd or QLinearMul over constants, as _qlinear_binary computes it at run time (the op
    table's dequantize_linear, add or mul, quantize_linear): a QOperator model's shape arithmetic
    (MobileViT's patch counts, quantized by quantize_static) becomes a constant that a Reshape can
    read. A missing zero point is 0 of A's type."""
    from eqfuse.ir.ops import OPS

    ins = list(ins) + [None] * (8 - len(ins))
    dt = np.asarray(ins[0]).dtype
    zp = lambda z: np.zeros((), dt) if z is None else np.asarray(z)  # noqa: E731
    deq, q = OPS["dequantize_linear"].numpy, OPS["quantize_linear"].numpy
    a = deq([np.asarray(ins[0]), np.asarray(ins[1], np.float32), zp(ins[2])], {})
    b = deq([np.asarray(ins[3]), np.asarray(ins[4], np.float32), zp(ins[5])], {})
    y = np.add(a, b) if node.op_type == "QLinearAdd" else np.multiply(a, b)
    return [np.asarray(q([y.astype(np.float32), np.asarray(ins[6], np.float32), zp(ins[7])], {}))]


# the contrib ops the importer folds over constants (`_Importer.foldable`), and how
CONTRIB_FOLDS = {(MS, "QLinearAdd"): fold_qlinear_binary, (MS, "QLinearMul"): fold_qlinear_binary}


@handles("QLinearSigmoid", "QLinearLeakyRelu", attrs=("alpha",), domain=MS)
def _qlinear_activation(imp, ins, at):
    """quantize(f(dequantize(x))): onnxruntime tabulates exactly this for the 256 values of x."""
    x, dt = _dequantized(imp, ins, 0)
    if imp.node.op_type == "QLinearSigmoid":
        y = imp.op("sigmoid", [x])
    else:
        y = imp.op("leaky_relu", [x], alpha=at.get("alpha", 0.01))
    return _quantized(imp, y, ins, 3, dt)


@handles("QLinearAveragePool", attrs=("auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape",
                                      "pads", "strides", "channels_last"), domain=MS)
def _qlinear_average_pool(imp, ins, at):
    """quantize(AveragePool(dequantize(x))): onnxruntime dequantizes x, pools in f32 and quantizes
    (adding the zero point before it rounds, which can move a value one step at a tie)."""
    if at.get("channels_last", 0):
        raise Unsupported("attribute 'channels_last' = 1 (eqfuse takes NCHW)")
    x, dt = _dequantized(imp, ins, 0)
    fn, _ = HANDLERS["AveragePool"]
    y = fn(imp, [x], {k: v for k, v in at.items() if k != "channels_last"})
    return _quantized(imp, y, ins, 3, dt)


# the f32 sum of u8 or i8 values is an exact integer while it stays below 2^24
_EXACT_SUM_PIXELS = (1 << 24) // 256


@handles("QLinearGlobalAveragePool", attrs=("channels_last",), domain=MS)
def _qlinear_global_average_pool(imp, ins, at):
    """onnxruntime's kernel (MLAS's QLinearGlobalAveragePool): the integer sum over each channel's N
    pixels minus N x_zp, times x_scale / (y_scale * N) computed in that order in f32, then
    requantized as QLinearMatMul. Here the sum is an f32 sum of the integers, exact (every partial
    sum an integer below 2^24) for N up to 65536 pixels, so the result is onnxruntime's integer for
    integer."""
    if at.get("channels_last", 0):
        raise Unsupported("attribute 'channels_last' = 1 (eqfuse takes NCHW)")
    dt = _dtype(imp, ins[0])
    if dt not in QUANT_DTYPES:
        raise Unsupported(f"input type {_dtype_text(imp, ins[0])} (input 0; eqfuse takes uint8 and int8)")
    xzp, _ = _zero_point(imp, ins, 2, dt, (dt,))
    yzp, _ = _zero_point(imp, ins, 4, dt, (dt,))
    if not all(imp.is_const(v) for v in (ins[1], ins[3], xzp)):
        raise Unsupported("scales or zero point computed at run time (eqfuse takes constants)")
    for v, i in ((ins[1], 1), (ins[3], 3), (xzp, 2)):
        _per_tensor(imp, v, _input_name(imp, i, "zero point"))
    x = imp.data(ins[0], imp.node.input[0])
    shape = imp.type(x).shape
    if len(shape) < 3 or not all(isinstance(d, int) for d in shape[2:]):
        raise Unsupported(f"input of shape {list(shape)} (eqfuse takes N, C and known spatial dims)")
    n = int(np.prod(shape[2:]))
    if n > _EXACT_SUM_PIXELS:
        raise Unsupported(f"{n} pixels per channel (eqfuse's exact sum takes at most {_EXACT_SUM_PIXELS})")
    axes = tuple(range(2, len(shape)))
    acc = imp.op("sum", [imp.op("cast", [x], to="f32")], axis=axes, keepdims=True)
    offset = int(np.asarray(xzp).reshape(())) * n
    if offset:
        acc = imp.op("sub", [acc, imp.const(offset)])
    x_scale, y_scale = np.asarray(ins[1], F32).reshape(()), np.asarray(ins[3], F32).reshape(())
    mult = np.asarray(x_scale / (y_scale * F32(n)), F32)
    return _requantize_by(imp, acc, mult, yzp, _input_name(imp, 4, "y_zero_point"), 0)


@handles("QLinearSoftmax", attrs=("axis", "opset"), domain=MS)
def _qlinear_softmax(imp, ins, at):
    """quantize(softmax(dequantize(x))), the softmax of the opset its attribute `opset` names (over
    the dims from `axis` on, flattened, before 13; over that axis from 13 on), as onnxruntime's
    kernel takes it. onnxruntime tabulates exp of the 256 values of x - max(x) and divides by the
    row's sum: its f32 steps are not eqfuse's, so the two agree to one step of y."""
    x, dt = _dequantized(imp, ins, 0)
    return _quantized(imp, softmax_of(imp, x, at.get("axis"), at.get("opset", imp.opset)), ins, 3, dt)


@handles("QLinearConcat", attrs=("axis",), domain=MS)
def _qlinear_concat(imp, ins, at):
    """Inputs y_scale, y_zero_point, then (x, scale, zero point) per tensor: each x requantized to
    y's scale and zero point, quantize(dequantize(x)) (onnxruntime's table for an x of another
    scale; the same values where they are equal, which the rule dequantize_quantize removes), then
    concatenated."""
    if len(ins) < 5 or (len(ins) - 2) % 3:
        raise Unsupported(f"{len(ins)} inputs (y_scale, y_zero_point, then three per tensor)")
    parts, dt = [], None
    for i in range(2, len(ins), 3):
        x, xdt = _dequantized(imp, ins, i)
        if dt not in (None, xdt):
            raise Unsupported(f"tensors of types {dt} and {xdt} (QLinear ops take one type)")
        dt = xdt
        parts.append(x)
    ys = _per_tensor(imp, ins[0], _input_name(imp, 0, "y_scale"))
    yzp, _ = _zero_point(imp, ins, 1, dt, (dt,))
    yz = _per_tensor(imp, yzp, _input_name(imp, 1, "y_zero_point"))
    parts = [imp.op("quantize_linear", [p, ys, yz]) for p in parts]
    if "axis" not in at:
        raise Unsupported("no attribute 'axis'")
    rank = imp.type(parts[0]).rank
    return parts[0] if len(parts) == 1 else imp.op("concat", parts, axis=at["axis"] % rank)


@handles("QGemm", attrs=("alpha", "transA", "transB"), domain=MS)
def _qgemm(imp, ins, at):
    """onnxruntime's QGemm: the exact i32 product of (A - a_zp) and (B - b_zp) (each transposed as
    transA, transB say), plus the i32 bias C, then times alpha * a_scale * b_scale (per tensor or
    per column, in that order in f32), divided by y_scale and requantized as QLinearMatMul; without
    y_scale and y_zero_point the f32 product is the output."""
    adt, bdt = _integer_operands(imp, ins, 0, 3, ("A", "B"))
    azp, _ = _zero_point(imp, ins, 2, adt, (adt,))
    bzp, _ = _zero_point(imp, ins, 5, bdt, (bdt,))
    has_y = [len(ins) > k and ins[k] is not None for k in (7, 8)]
    if has_y[0] != has_y[1]:
        raise Unsupported("y_scale without y_zero_point or the reverse (eqfuse takes both or neither)")
    scales = [ins[1], ins[4]] + ([ins[7]] if has_y[0] else [])
    if not all(imp.is_const(v) for v in scales):
        raise Unsupported("scales computed at run time (eqfuse takes constant scales)")
    a = imp.data(ins[0], imp.node.input[0])
    if imp.type(a).rank != 2:
        raise Unsupported(f"A of rank {imp.type(a).rank} (QGemm's A is a matrix)")
    if at.get("transA", 0):
        a = imp.op("transpose", [a], perm=(1, 0))
    b = ins[3]
    if imp.is_const(b) and np.asarray(b).ndim == 2 and at.get("transB", 0):
        b = imp.new_param(f"{imp.node.input[3]}_t", np.ascontiguousarray(np.asarray(b).T))
    else:
        b = imp.data(b, imp.node.input[3])
        if imp.type(b).rank != 2:
            raise Unsupported(f"B of rank {imp.type(b).rank} (QGemm's B is a matrix)")
        if at.get("transB", 0):
            b = imp.op("transpose", [b], perm=(1, 0))
    N = imp.type(b).shape[1]
    if np.asarray(ins[4]).size not in (1, N) or np.asarray(ins[1]).size != 1:
        raise Unsupported(f"a_scale of shape {list(np.asarray(ins[1]).shape)} and b_scale of shape "
                          f"{list(np.asarray(ins[4]).shape)} (eqfuse takes one a_scale and one or {N} b_scales)")
    acc = _matmul_integer_node(imp, a, b, azp, bzp)
    if len(ins) > 6 and ins[6] is not None:
        if _dtype(imp, ins[6]) != "i32":
            raise Unsupported(f"bias type {_dtype_text(imp, ins[6])} (input 6; QGemm's C is int32)")
        c = np.asarray(ins[6]).reshape(-1) if imp.is_const(ins[6]) and np.asarray(ins[6]).ndim == 0 else ins[6]
        acc = imp.op("add", [acc, imp.data(c, imp.node.input[6])])
    acc = imp.op("cast", [acc], to="f32")
    mult = (F32(at.get("alpha", 1.0)) * np.asarray(ins[1], F32).reshape(())) * np.asarray(ins[4], F32).reshape(-1)
    if not has_y[0]:
        mult = mult.reshape(()) if mult.size == 1 else mult
        return imp.op("mul", [acc, imp.data(np.asarray(mult, F32), None)])
    mult = mult / np.asarray(ins[7], F32).reshape(())
    yzp, _ = _zero_point(imp, ins, 8, "u8", QUANT_DTYPES)
    return _requantize_by(imp, acc, np.asarray(mult, F32), yzp, _input_name(imp, 8, "y_zero_point"), 1)


@handles("QAttention", attrs=("num_heads", "unidirectional", "mask_filter_value", "do_rotary", "qkv_hidden_sizes",
                              "scale", "past_present_share_buffer"), domain=MS)
def _qattention(imp, ins, at):
    """onnxruntime's QAttention (com.microsoft, its quantized Attention):
    Q, K and V = the exact i32 product of (input - input_zero_point) and (weight - weight_zero_point)
    (weight [hidden, 3 x H]: Q's columns, then K's, then V's, each num_heads heads of H / num_heads),
    times input_scale * weight_scale, plus the bias, in f32; then per head softmax(q k^T * scale) v
    (scale 1 / sqrt(head size) unless given; unidirectional=1 adds mask_filter_value to the scores of
    later keys, as onnxruntime does), the heads side by side. A mask_index sets the scores of the keys
    it masks to mask_filter_value plus the score (onnxruntime's mask: set once, not added twice where
    unidirectional masks the key too): _attention_keep's forms.
    A past [2, batch, heads, P, head size] (the keys, then the values, of P earlier positions) puts
    its keys and values before the new ones: the second output, present [2, batch, heads, T, head
    size], is concat(past, the new keys and values, axis 3) (without a past, the new ones alone),
    the attention reads its T = P + sequence keys and values from it, query i attends to keys
    0 .. P + i under unidirectional=1, and a mask_index covers all T keys."""
    adt, bdt = _dtype(imp, ins[0]), _dtype(imp, ins[1])
    for dt, i in ((adt, 0), (bdt, 1)):
        if dt not in QUANT_DTYPES:
            raise Unsupported(f"input type {_dtype_text(imp, ins[i])} (input {i}; eqfuse takes uint8 and int8)")
    past = ins[8] if len(ins) > 8 else None
    if past is not None and at.get("past_present_share_buffer", 0):
        raise Unsupported("past_present_share_buffer=1 (a past buffer of the maximum length with a run-time "
                          "past_sequence_length; eqfuse takes a past of the past length, as onnxruntime's CPU kernel)")
    if at.get("do_rotary", 0) or at.get("qkv_hidden_sizes"):
        raise Unsupported("do_rotary or qkv_hidden_sizes (eqfuse takes Q, K and V of one size, no rotary embedding)")
    if not all(len(ins) > k and imp.is_const(ins[k]) and np.asarray(ins[k]).size == 1 for k in (3, 4)):
        raise Unsupported("scales computed at run time or per column (eqfuse takes one constant input_scale "
                          "and weight_scale)")
    azp, _ = _zero_point(imp, ins, 6, adt, (adt,))
    bzp, _ = _zero_point(imp, ins, 7, bdt, (bdt,))
    x, w = imp.data(ins[0], imp.node.input[0]), imp.data(ins[1], imp.node.input[1])
    tx, tw = imp.type(x), imp.type(w)
    nh = int(at.get("num_heads", 0))
    if tx.rank != 3 or tw.rank != 2 or tw.shape[1] % 3 or nh <= 0 or tw.shape[1] // 3 % nh:
        raise Unsupported(f"input of shape {list(tx.shape)} and weight of shape {list(tw.shape)} with num_heads "
                          f"{nh} (eqfuse takes input [batch, sequence, hidden], weight [hidden, 3 x H], H a "
                          "multiple of num_heads)")
    B, S, _ = tx.shape
    H = tw.shape[1] // 3
    hd = H // nh
    acc = imp.op("cast", [_matmul_integer_node(imp, x, w, azp, bzp)], to="f32")
    scale = np.asarray(np.asarray(ins[3], F32).reshape(()) * np.asarray(ins[4], F32).reshape(()), F32)
    qkv = imp.op("add", [imp.op("mul", [acc, imp.data(scale)]), imp.data(ins[2], imp.node.input[2])])
    qkv = imp.reshape_to(qkv, (B, S, 3, nh, hd))  # (one named dim at most: NeedsDims)

    def part(k):  # [B, heads, S, head size]
        p = imp.reshape_to(imp.op("slice", [qkv], axis=2, start=k, stop=k + 1), (B, S, nh, hd))
        return imp.op("transpose", [p], perm=(0, 2, 1, 3))

    q, k, v = part(0), part(1), part(2)
    P, present = 0, None
    if past is not None or (len(imp.node.output) > 1 and imp.node.output[1]):
        # present [2, B, heads, P + S, head size]: the past's keys and values, then the new ones,
        # along the sequence axis (one concat); the attention reads its keys and values from it
        present = imp.op("transpose", [imp.op("slice", [qkv], axis=2, start=1, stop=3)], perm=(2, 0, 3, 1, 4))
        if past is not None:
            p = _attention_past(imp, past, B, nh, hd)
            P = imp.type(p).shape[3]
            present = imp.op("concat", [p, present], axis=3)
            T = imp.type(present).shape[3]
            k, v = (imp.reshape_to(imp.op("slice", [present], axis=0, start=i, stop=i + 1), (B, nh, T, hd))
                    for i in (0, 1))
    T = imp.type(k).shape[2]
    s = F32(at.get("scale", 0.0) or 1.0 / np.sqrt(hd))
    scores = imp.op("mul", [imp.op("matmul", [q, imp.op("transpose", [k], perm=(0, 1, 3, 2))]), imp.data(np.asarray(s, F32))])
    fill = F32(at.get("mask_filter_value", -10000.0))
    # query i attends to keys 0 .. P + i (onnxruntime masks nothing when the sequence is one query)
    later = np.triu(np.ones((S, T), bool), P + 1) if at.get("unidirectional", 0) and S > 1 else None
    keep = _attention_keep(imp, ins[5], B, S, T) if len(ins) > 5 and ins[5] is not None else None
    if keep is not None:  # a masked key's score plus mask_filter_value; a later key's (unidirectional)
        # plus the lowest float, which onnxruntime sets over the padding's value (a query whose keys
        # are all masked then attends to the padded keys before it, as onnxruntime's does)
        mask = imp.op("where", [keep, imp.const(0.0), imp.const(fill)])
        if later is not None:
            mask = imp.op("where", [imp.data(later), imp.const(float(np.finfo(F32).min)), mask])
        scores = imp.op("add", [scores, mask])
    elif later is not None:
        scores = imp.op("add", [scores, imp.data(np.where(later, fill, F32(0)).astype(F32))])
    ctx = imp.op("matmul", [imp.op("softmax", [scores], axis=-1), v])
    out = imp.reshape_to(imp.op("transpose", [ctx], perm=(0, 2, 1, 3)), (B, S, H))
    return [out] if present is None else [out, present]


def _attention_past(imp, past, B, nh: int, hd: int) -> int:
    """An Attention's past input, checked to be [2, B, heads, P, head size] (the keys of P earlier
    positions, then their values) in f32; P a number, or a name when the past length is a named dim."""
    p = imp.data(past, imp.node.input[8])
    t = imp.type(p)
    if t.dtype != "f32":
        raise Unsupported(f"past of type {_dtype_text(imp, past)} (input 8; QAttention's past is float32)")
    if t.rank != 5 or any(d != w for d, w in zip(t.shape, (2, B, nh, None, hd)) if w is not None):
        raise ValueError(f"past of shape {list(t.shape)} (input 8, '{imp.node.input[8]}'): onnxruntime's past is "
                         f"[2, batch, num_heads, past length, head size], here [2, {B}, {nh}, P, {hd}]")
    return p


def _attention_keep(imp, mask, B: int, S: int, T) -> int | None:
    """Which keys each query of each batch attends to, as a bool tensor broadcasting against the
    scores [B, heads, S, T] (T = past length + S keys), from an Attention's int32 mask_index in the
    forms of onnxruntime's contrib op spec (its AttentionBase::CheckMask):
      [B, T]     key padding, the raw 0/1 attention mask (a key is kept where the mask is > 0);
      [B, S, T]  per query (likewise);
      [B]        right padding: the keys before each batch's end position (its length);
      [2 x B]    the end positions, then the start positions (left padding: keys from the start);
      [1, 1] or [B, 1] (when not [B, T]): onnxruntime's dummy mask, no mask (None)."""
    m = imp.data(mask, imp.node.input[5])
    t = imp.type(m)
    if t.dtype != "i32":
        raise Unsupported(f"mask_index of type {_dtype_text(imp, mask)} (input 5; QAttention's mask_index is int32)")
    shape = tuple(t.shape)
    if shape != (B, T) and len(shape) == 2 and shape[0] in (1, B) and shape[1] == 1:
        return None
    zero = imp.const(0.0)
    if shape == (B, T):
        return imp.reshape_to(imp.op("gt", [m, zero]), (B, 1, 1, T))
    if shape == (B, S, T):
        return imp.reshape_to(imp.op("gt", [m, zero]), (B, 1, S, T))
    if shape == (B,) or (isinstance(B, int) and shape == (2 * B,)):
        keys = imp.data(np.arange(T, dtype=np.int32).reshape(1, T))
        if shape == (B,):
            return imp.reshape_to(imp.op("lt", [keys, imp.reshape_to(m, (B, 1))]), (B, 1, 1, T))
        end = imp.op("reshape", [imp.op("slice", [m], axis=0, start=0, stop=B)], shape=(B, 1))
        start = imp.op("reshape", [imp.op("slice", [m], axis=0, start=B, stop=2 * B)], shape=(B, 1))
        keep = imp.op("logical_and", [imp.op("lt", [keys, end]), imp.op("ge", [keys, start])])
        return imp.op("reshape", [keep], shape=(B, 1, 1, T))
    two = f"2 x {B}" if isinstance(B, str) else 2 * B  # ([2 x batch] of a named batch: bind it with dims=)
    raise Unsupported(f"mask_index of shape {list(shape)} (input 5; eqfuse takes [batch], [2 x batch], "
                      f"[batch, total] and [batch, sequence, total], total = past length + sequence: "
                      f"[{B}], [{two}], [{B}, {T}], [{B}, {S}, {T}])")
