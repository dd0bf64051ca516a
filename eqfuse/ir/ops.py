"""The op table: the single source of truth about every operator.

Each op is one `Op` entry: its name, kind, arity, attributes (with types and defaults), shape
rule, numpy implementation (the reference semantics), C expression (pointwise ops) and a FLOP
estimate. The parser's checks, shape inference, the numpy reference, the e-graph encoding, the
rule checker and the C emitter all read this table; adding an op means adding one entry here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Callable, Mapping

import numpy as np

from eqfuse.errors import NamedSum, ShapeError
from eqfuse.ir.dtypes import (
    f32_literal,
    f32_of_decimal,
    result_dtype,
    round_f32,
    same_f32,
)
from eqfuse.ir.opdocs import DOCS
from eqfuse.ir.shapes import Dim, TType, broadcast, dim_product, fmt, norm_axis

F32 = np.float32
REQUIRED = object()

# Attribute kinds: how a value written in a .g file is checked and normalized.
#   int, float, bool, str; ints (list of ints); int_or_ints (an int or a list, normalized to a
#   tuple); pads2d (conv2d's padding: an int, [h, w], or [top, left, bottom, right]); axes (None,
#   an int or a list of ints, normalized to a tuple or None).


def flit(v: float) -> str:
    """A float as a C literal, as the op table's C semantics (`c_expr`) write constants.

    The literal is of v's float32 value (np.float32(v), what the reference computes with), which
    the compiler's correctly rounded reading of it gives back bit for bit: Python's text of the
    double when that reads back as the same float32, else numpy's shortest text of the float32
    (3.4028235e+38f is FLT_MAX, 1e-45f the smallest subnormal; -0.0f keeps its sign)."""
    f = round_f32(v)
    if np.isnan(f):
        return "NAN"
    if np.isinf(f):
        return "INFINITY" if f > 0 else "(-INFINITY)"
    text = float.__repr__(float(v))
    if not same_f32(f32_of_decimal(text), f):
        text = float.__repr__(f32_literal(f))
        if not same_f32(f32_of_decimal(text), f):
            text = np.format_float_scientific(f, unique=False, precision=9)  # 9 digits: exact for f32
    return f"({text}f)" if np.signbit(f) else f"{text}f"


class OpKind(StrEnum):
    """What an op is to the kernels: one spelling each (a reduction is `reduce`, as its plan kind)."""

    POINTWISE = "pointwise"
    CONTRACTION = "contraction"
    REDUCE = "reduce"
    ROW = "row"
    CHANNEL = "channel"  # batchnorm: pointwise per channel
    LAYOUT = "layout"
    INDEX = "index"
    ATTENTION_GRAD = "attention_grad"


@dataclass(frozen=True)
class Attr:
    name: str
    kind: str
    default: Any = REQUIRED
    choices: tuple = ()


@dataclass(frozen=True)
class Op:
    name: str
    kind: OpKind
    arity: tuple[int, int]  # (min, max) inputs; max -1 = any number
    infer: Callable[[list[TType], Mapping[str, Any]], TType]
    numpy: Callable[..., np.ndarray]  # numpy(args, attrs) -> float32 array
    attrs: tuple[Attr, ...] = ()
    c: str | Callable[[Mapping[str, Any]], str] | None = None  # pointwise: C expr over {0}, {1}
    # pointwise: a cheaper C expression exact only where `c_fast_guard` holds (both over {0}, {1}).
    # A pointwise kernel runs a tile with it and reruns the tile with `c` if the guard failed for
    # any element (csrc_templates/pointwise.c's two passes)
    c_fast: str | None = None
    c_fast_guard: str | None = None
    infix: str | None = None  # binary infix symbol, or "-" prefix for neg
    flops: int = 1  # per output element (pointwise and row ops)
    dtype: str = "float"  # the dtype rule of eqfuse.ir.dtypes.result_dtype
    shape_rule: Callable | None = None  # `infer` without the dtype rule (the rule checker draws f64 values)
    doc: str = ""  # one line of meaning, from eqfuse/ir/opdocs.py (`eqfuse ops`)

    def attr_spec(self, name: str) -> Attr | None:
        return next((a for a in self.attrs if a.name == name), None)

    def c_expr(self, attrs: Mapping[str, Any]) -> str:
        if self.c is None:
            raise ValueError(f"op {self.name} has no C expression")
        return self.c(attrs) if callable(self.c) else self.c


# The table, filled by `define` here and in ops_index, ops_attention and ops_grad (eqfuse.ir imports
# them all, so importing any module of eqfuse.ir gives the whole table).
OPS: dict[str, Op] = {}
INFIX: dict[str, str] = {}  # binary infix symbol -> op name


def define(**kw) -> None:
    """Register an op; its `infer` is the shape rule, wrapped so that it also gives the dtype."""
    shape_rule, name, rule = kw["infer"], kw["name"], kw.get("dtype", "float")

    def infer(ts, attrs):
        return TType(shape_rule(ts, attrs).shape, result_dtype(rule, name, ts, attrs))

    op = Op(**{"doc": DOCS.get(name, ("", ""))[1], **kw, "kind": OpKind(kw["kind"]), "infer": infer,
               "shape_rule": shape_rule})
    OPS[op.name] = op
    if op.infix and op.arity == (2, 2):
        INFIX[op.infix] = op.name


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=F32)


# ---------------------------------------------------------------- pointwise

def same_infer(ts, attrs):
    return TType(ts[0].shape)


def bcast_infer(ts, attrs):
    return TType(broadcast(*(t.shape for t in ts)))


def _erf(x):
    from scipy.special import erf

    return erf(x)


def _gelu_np(args, attrs):
    x = args[0]
    if attrs["approximate"] == "tanh":
        return 0.5 * x * (1 + np.tanh(F32(math.sqrt(2 / math.pi)) * (x + F32(0.044715) * x * x * x)))
    return 0.5 * x * (1 + _erf(x * F32(1 / math.sqrt(2))))


def _gelu_c(attrs):
    return "eqf_gelu_tanh({0})" if attrs["approximate"] == "tanh" else "eqf_gelu_erf({0})"


_UNARY = [
    # name, numpy, C, flops
    ("neg", lambda a, _: -a[0], "(-{0})", 1),
    ("abs", lambda a, _: np.abs(a[0]), "fabsf({0})", 1),
    ("relu", lambda a, _: np.maximum(a[0], F32(0)), "eqf_relu({0})", 1),
    ("sigmoid", lambda a, _: 1 / (1 + np.exp(-a[0])), "eqf_sigmoid({0})", 4),
    ("tanh", lambda a, _: np.tanh(a[0]), "eqf_tanhf({0})", 4),
    ("exp", lambda a, _: np.exp(a[0]), "eqf_expf({0})", 4),
    ("log", lambda a, _: np.log(a[0]), "logf({0})", 4),
    ("sqrt", lambda a, _: np.sqrt(a[0]), "sqrtf({0})", 2),
    ("rsqrt", lambda a, _: 1 / np.sqrt(a[0]), "(1.0f / sqrtf({0}))", 3),
    ("erf", lambda a, _: _erf(a[0]), "eqf_erff({0})", 8),
    ("silu", lambda a, _: a[0] / (1 + np.exp(-a[0])), "eqf_silu({0})", 5),
    # common.h's eqf_sinf and eqf_cosf: reduced correctly for every finite x (rotary angles reach
    # thousands), within 1 ulp, and vectorizable (libm's sinf and cosf are scalar calls); their
    # fast forms (_TWO_PASS) skip the table reduction of |x| >= 2^24
    ("sin", lambda a, _: np.sin(a[0]), "eqf_sinf({0})", 8),
    ("cos", lambda a, _: np.cos(a[0]), "eqf_cosf({0})", 8),
    # -1, 0 or 1 in the operand's dtype; a NaN stays NaN (x != x is false for integers)
    ("sign", lambda a, _: np.sign(a[0]), "(({0}) != ({0}) ? ({0}) : (({0}) > 0) - (({0}) < 0))", 2),
    ("ceil", lambda a, _: np.ceil(a[0]), "ceilf({0})", 1),
    ("floor", lambda a, _: np.floor(a[0]), "floorf({0})", 1),
    # halves to even, as numpy and ONNX's Round (rintf in the default rounding mode)
    ("round", lambda a, _: np.round(a[0]), "rintf({0})", 1),
    # the rest of ONNX's trigonometry: libm's scalar calls (rare in models; not vectorized)
    ("tan", lambda a, _: np.tan(a[0]), "tanf({0})", 8),
    ("asin", lambda a, _: np.arcsin(a[0]), "asinf({0})", 8),
    ("acos", lambda a, _: np.arccos(a[0]), "acosf({0})", 8),
    ("atan", lambda a, _: np.arctan(a[0]), "atanf({0})", 8),
    ("sinh", lambda a, _: np.sinh(a[0]), "sinhf({0})", 8),
    ("cosh", lambda a, _: np.cosh(a[0]), "coshf({0})", 8),
    ("asinh", lambda a, _: np.arcsinh(a[0]), "asinhf({0})", 8),
    ("acosh", lambda a, _: np.arccosh(a[0]), "acoshf({0})", 8),
    ("atanh", lambda a, _: np.arctanh(a[0]), "atanhf({0})", 8),
    # torch's: exact near 0, where exp(x) - 1 and log(1 + x) cancel
    ("expm1", lambda a, _: np.expm1(a[0]), "expm1f({0})", 8),
    ("log1p", lambda a, _: np.log1p(a[0]), "log1pf({0})", 8),
]
# op -> (fast C expression, the guard under which it is exact)
_TWO_PASS = {
    "sin": ("eqf_sinf_small({0})", "fabsf({0}) < 16777216.0f"),
    "cos": ("eqf_cosf_small({0})", "fabsf({0}) < 16777216.0f"),
}
for _name, _np, _c, _fl in _UNARY:
    _fast, _guard = _TWO_PASS.get(_name, (None, None))
    define(name=_name, kind="pointwise", arity=(1, 1), infer=same_infer, numpy=_np, c=_c, flops=_fl,
        infix="-" if _name == "neg" else None, dtype="numeric" if _name in ("neg", "abs", "sign") else "float",
        c_fast=_fast, c_fast_guard=_guard)
define(name="gelu", kind="pointwise", arity=(1, 1), infer=same_infer, numpy=_gelu_np, c=_gelu_c, flops=10,
    attrs=(Attr("approximate", "str", "none", ("none", "tanh")),))

_BINARY = [
    ("add", np.add, "({0} + {1})", "+"),
    ("sub", np.subtract, "({0} - {1})", "-"),
    ("mul", np.multiply, "({0} * {1})", "*"),
    ("div", None, "eqf_div({0}, {1})", "/"),  # _divide below: integers truncate, x / 0 is 0
    ("pow", np.power, "eqf_pow({0}, {1})", "**"),
    ("maximum", np.maximum, "eqf_max({0}, {1})", None),
    ("minimum", np.minimum, "eqf_min({0}, {1})", None),
    # integer (and float) division floored as Python and numpy do; x // 0 and x % 0 are 0 for
    # integers (numpy's result, and never a trap in the C)
    ("floordiv", np.floor_divide, "eqf_floordiv({0}, {1})", None),
    ("mod", np.remainder, "eqf_mod({0}, {1})", None),
]


def _divide(a, b):
    """a / b as numpy's true division for floats. An integer division (an i64 or i32 tensor, and a
    literal next to it that is an integer, as the C writes it) truncates as C and ONNX's Div do;
    an integer divided by 0 gives 0, as floordiv and mod (numpy's int64 true division would give
    inf, no integer; C's integer division would trap)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind not in "iu" and b.dtype.kind not in "iu":
        return np.divide(a, b)
    a, b = (x.astype(np.int64) if x.dtype.kind == "f" and x.ndim == 0 and float(x).is_integer() else x for x in (a, b))
    if a.dtype.kind not in "iu" or b.dtype.kind not in "iu":
        return np.divide(a, b)  # by a non-integer literal: in floats, truncated to the tensor's dtype
    with np.errstate(all="ignore"):
        d = np.where(b == 0, 1, b)
        q = np.floor_divide(a, d)  # INT64_MIN // -1 wraps to INT64_MIN, as the C
        q = q + ((q * d != a) & ((a < 0) != (d < 0)))  # floored -> truncated toward 0
        return np.where(b == 0, 0, q)


for _name, _ufunc, _c, _infix in _BINARY:
    _ufunc = _divide if _name == "div" else _ufunc
    define(name=_name, kind="pointwise", arity=(2, 2), infer=bcast_infer,
        numpy=(lambda u: lambda a, _: u(a[0], a[1]))(_ufunc), c=_c, infix=_infix,
        flops=4 if _name == "pow" else 1, dtype="float" if _name == "pow" else "numeric")

# ---------------------------------------------------------------- contraction


def _matmul_infer(ts, attrs):
    a, b = ts
    if a.rank < 2 or b.rank < 2:
        raise ShapeError(f"matmul needs operands of rank >= 2, got {fmt(a.shape)} and {fmt(b.shape)}")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(
            f"matmul inner dimensions differ: {fmt(a.shape)} @ {fmt(b.shape)} ({a.shape[-1]} vs {b.shape[-2]})"
        )
    batch = broadcast(a.shape[:-2], b.shape[:-2])
    return TType(batch + (a.shape[-2], b.shape[-1]))


define(name="matmul", kind="contraction", arity=(2, 2), infer=_matmul_infer,
    numpy=lambda a, _: np.matmul(a[0], a[1]), infix="@")


def pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def conv_pads(padding) -> tuple[int, int, int, int]:
    """conv2d's padding as (top, left, bottom, right): an int pads every side, [h, w] both sides
    of each axis, [top, left, bottom, right] each side (the TF "same" padding of a stride-2 conv,
    (0, 1) on each axis, folded from a pad op by rule conv2d_pad_same)."""
    p = pair(padding)
    return (p[0], p[1], p[0], p[1]) if len(p) == 2 else tuple(p)


def symmetric_pads(padding) -> tuple[int, int] | None:
    """conv2d's padding as (h, w) when each axis is padded alike on both sides, else None: the
    kernels other than the fused depthwise + 1x1 conv (conv_dwpw) take only such padding."""
    t, left, b, r = conv_pads(padding)
    return (t, left) if (t, left) == (b, r) else None


def _conv_out(h: Dim, k: Dim, s: int, p: int, d: int = 1, op: str = "conv2d", p_end: int | None = None) -> Dim:
    """Output size of a convolution window k (dilation d: it spans (k - 1) x d + 1 inputs) over
    an input padded by p before and p_end (p when None) after."""
    p_end = p if p_end is None else p_end
    if not (isinstance(h, int) and isinstance(k, int)):
        if k == 1 and s == 1 and p == 0 and p_end == 0:
            return h
        raise ShapeError(f"{op} needs concrete spatial dimensions (bind them with --dim)")
    span = (k - 1) * d + 1
    out = (h + p + p_end - span) // s + 1
    if out <= 0:
        what = f"window {k}" + (f" (dilation {d}: {span} wide)" if d != 1 else "")
        raise ShapeError(f"{op} {what} with padding {p} does not fit input size {h}")
    return out


def _conv_groups(op: str, x, w, group: int, wt_in: int = 1) -> None:
    """The channel checks of a (grouped) convolution: x's channels (axis 1) and the weights'
    output channels (axis 0) split into `group` groups, and the weights' per-group input channels
    (axis `wt_in`) equal to x's channels per group."""
    C, O, I = x.shape[1], w.shape[0], w.shape[wt_in]
    if group < 1:
        raise ShapeError(f"{op} group must be >= 1, got {group}")
    if group == 1:
        if C != I:
            raise ShapeError(f"{op} channels differ: x has {C}, w expects {I}")
        return
    if not all(isinstance(d, int) for d in (C, O, I)):
        raise ShapeError(f"{op} with group={group} needs concrete channel dimensions")
    if C % group:
        raise ShapeError(f"{op} group={group} does not divide the input's {C} channels")
    if wt_in == 1 and O % group:
        raise ShapeError(f"{op} group={group} does not divide the weights' {O} output channels")
    if I != C // group:
        raise ShapeError(f"{op} channels differ: x has {C} channels in {group} groups of {C // group}, "
                         f"w expects {I} per group")


def _conv_infer(ts, attrs):
    x, w = ts[0], ts[1]
    if x.rank != 4 or w.rank != 4:
        raise ShapeError(f"conv2d needs x in NCHW and w in OIHW (rank 4), got {fmt(x.shape)} and {fmt(w.shape)}")
    _conv_groups("conv2d", x, w, attrs["group"])
    if len(ts) == 3 and ts[2].shape != (w.shape[0],):
        raise ShapeError(f"conv2d bias must have shape [{w.shape[0]}], got {fmt(ts[2].shape)}")
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = pair(attrs["stride"]), conv_pads(attrs["padding"]), pair(attrs["dilation"])
    if min(sh, sw) < 1 or min(pt, pl, pb, pr) < 0:
        raise ShapeError("conv2d stride must be >= 1 and padding >= 0")
    if min(dh, dw) < 1:
        raise ShapeError("conv2d dilation must be >= 1")
    return TType((x.shape[0], w.shape[0], _conv_out(x.shape[2], w.shape[2], sh, pt, dh, p_end=pb),
                  _conv_out(x.shape[3], w.shape[3], sw, pl, dw, p_end=pr)))


def _conv2d_one(x, w, stride, padding, dilation):
    """One group's convolution (float32 in, float32 out): windows of the padded input, every
    dilation-th element of a (k - 1) x dilation + 1 span, contracted with w; padding is (top,
    left, bottom, right)."""
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = stride, padding, dilation
    kh, kw = w.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    span = ((kh - 1) * dh + 1, (kw - 1) * dw + 1)
    win = np.lib.stride_tricks.sliding_window_view(xp, span, axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    return np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)


def conv2d_numpy(args, attrs):
    x, w = args[0], args[1]
    geo = pair(attrs["stride"]), conv_pads(attrs["padding"]), pair(attrs.get("dilation", 1))
    g = attrs.get("group", 1)
    if g == 1:
        out = _conv2d_one(x, w, *geo)
    else:  # a convolution per group of input channels, with its group of output channels
        cg, og = x.shape[1] // g, w.shape[0] // g
        out = np.concatenate([_conv2d_one(x[:, i * cg:(i + 1) * cg], w[i * og:(i + 1) * og], *geo)
                              for i in range(g)], axis=1)
    if len(args) == 3:
        out = out + args[2][None, :, None, None]
    return out


_CONV_ATTRS = (Attr("stride", "int_or_ints", 1), Attr("padding", "pads2d", 0),
               Attr("dilation", "int_or_ints", 1), Attr("group", "int", 1))
define(name="conv2d", kind="contraction", arity=(2, 3), infer=_conv_infer, numpy=conv2d_numpy, attrs=_CONV_ATTRS)


def _conv1d_infer(ts, attrs):
    x, w = ts[0], ts[1]
    if x.rank != 3 or w.rank != 3:
        raise ShapeError(f"conv1d needs x in NCW and w in OIW (rank 3), got {fmt(x.shape)} and {fmt(w.shape)}")
    _conv_groups("conv1d", x, w, attrs["group"])
    if len(ts) == 3 and ts[2].shape != (w.shape[0],):
        raise ShapeError(f"conv1d bias must have shape [{w.shape[0]}], got {fmt(ts[2].shape)}")
    s, p, d = attrs["stride"], attrs["padding"], attrs["dilation"]
    if s < 1 or p < 0 or d < 1:
        raise ShapeError("conv1d stride and dilation must be >= 1 and padding >= 0")
    return TType((x.shape[0], w.shape[0], _conv_out(x.shape[2], w.shape[2], s, p, d, "conv1d")))


def conv1d_numpy(args, attrs):
    """conv2d's reference over a height of 1."""
    x, w = args[0][:, :, None, :], args[1][:, :, None, :]
    at = {"stride": (1, attrs["stride"]), "padding": (0, attrs["padding"]), "dilation": (1, attrs["dilation"]),
          "group": attrs["group"]}
    return conv2d_numpy([x, w, *args[2:]], at)[:, :, 0, :]


define(name="conv1d", kind="contraction", arity=(2, 3), infer=_conv1d_infer, numpy=conv1d_numpy,
    attrs=(Attr("stride", "int", 1), Attr("padding", "int", 0), Attr("dilation", "int", 1), Attr("group", "int", 1)))


def _convt_out(h: Dim, k: Dim, s: int, p: int, op_: int) -> Dim:
    if not (isinstance(h, int) and isinstance(k, int)):
        raise ShapeError("conv_transpose2d needs concrete spatial dimensions (bind them with --dim)")
    out = (h - 1) * s - 2 * p + k + op_
    if out <= 0:
        raise ShapeError(f"conv_transpose2d of input size {h} with window {k}, stride {s} and padding {p} is empty")
    return out


def _convt_infer(ts, attrs):
    x, w = ts[0], ts[1]
    if x.rank != 4 or w.rank != 4:
        raise ShapeError("conv_transpose2d needs x in NCHW and w as [C_in, C_out / group, kH, kW] (rank 4), "
                         f"got {fmt(x.shape)} and {fmt(w.shape)}")
    g = attrs["group"]
    if g < 1:
        raise ShapeError(f"conv_transpose2d group must be >= 1, got {g}")
    C = x.shape[1]
    if g != 1 and not isinstance(C, int):
        raise ShapeError(f"conv_transpose2d with group={g} needs concrete channel dimensions")
    if g != 1 and C % g:
        raise ShapeError(f"conv_transpose2d group={g} does not divide the input's {C} channels")
    if w.shape[0] != C:
        raise ShapeError(f"conv_transpose2d channels differ: x has {C}, w expects {w.shape[0]} (w is [C_in, C_out / group, kH, kW])")
    O = w.shape[1] * g if isinstance(w.shape[1], int) else w.shape[1]
    if len(ts) == 3 and ts[2].shape != (O,):
        raise ShapeError(f"conv_transpose2d bias must have shape [{O}], got {fmt(ts[2].shape)}")
    (sh, sw), (ph, pw), (oh, ow) = pair(attrs["stride"]), pair(attrs["padding"]), pair(attrs["output_padding"])
    if min(sh, sw) < 1 or min(ph, pw) < 0:
        raise ShapeError("conv_transpose2d stride must be >= 1 and padding >= 0")
    if not (0 <= oh < sh and 0 <= ow < sw):
        raise ShapeError(f"conv_transpose2d output_padding {[oh, ow]} must be >= 0 and smaller than the stride {[sh, sw]}")
    return TType((x.shape[0], O, _convt_out(x.shape[2], w.shape[2], sh, ph, oh),
                  _convt_out(x.shape[3], w.shape[3], sw, pw, ow)))


def conv_transpose2d_numpy(args, attrs):
    """Scatter-add: every input pixel adds its value times the kernel into the output window at
    (stride x pixel - padding); per group, in float32."""
    x, w = args[0], args[1]
    (sh, sw), (ph, pw), (oph, opw) = pair(attrs["stride"]), pair(attrs["padding"]), pair(attrs["output_padding"])
    g = attrs["group"]
    N, C, H, W = x.shape
    _, og, kh, kw = w.shape
    cg = C // g
    OH, OW = (H - 1) * sh - 2 * ph + kh + oph, (W - 1) * sw - 2 * pw + kw + opw
    full = np.zeros((N, og * g, (H - 1) * sh + kh + oph, (W - 1) * sw + kw + opw), np.result_type(x, w))
    for i in range(g):
        xi, wi = x[:, i * cg:(i + 1) * cg], w[i * cg:(i + 1) * cg]
        t = np.tensordot(xi, wi, axes=([1], [0]))  # [N, H, W, og, kh, kw]
        for a in range(kh):
            for b in range(kw):
                full[:, i * og:(i + 1) * og, a:a + (H - 1) * sh + 1:sh, b:b + (W - 1) * sw + 1:sw] += \
                    t[:, :, :, :, a, b].transpose(0, 3, 1, 2)
    out = full[:, :, ph:ph + OH, pw:pw + OW]
    if len(args) == 3:
        out = out + args[2][None, :, None, None]
    return out


define(name="conv_transpose2d", kind="contraction", arity=(2, 3), infer=_convt_infer, numpy=conv_transpose2d_numpy,
    attrs=(Attr("stride", "int_or_ints", 1), Attr("padding", "int_or_ints", 0),
           Attr("output_padding", "int_or_ints", 0), Attr("group", "int", 1)))

# ---------------------------------------------------------------- reductions


def reduce_axes(attrs, rank: int) -> tuple[int, ...]:
    axis = attrs["axis"]
    if axis is None:
        return tuple(range(rank))
    axes = tuple(norm_axis(a, rank) for a in axis)
    if len(set(axes)) != len(axes):
        raise ShapeError(f"axis {list(axis)} repeats an axis")
    return tuple(sorted(axes))


def reduce_infer(ts, attrs):
    x = ts[0]
    axes = reduce_axes(attrs, x.rank)
    if attrs["keepdims"]:
        return TType(tuple(1 if i in axes else d for i, d in enumerate(x.shape)))
    return TType(tuple(d for i, d in enumerate(x.shape) if i not in axes))


_RED_ATTRS = (Attr("axis", "axes", None), Attr("keepdims", "bool", False))
for _name, _fn in (("sum", np.sum), ("mean", np.mean), ("max", np.max)):
    define(name=_name, kind="reduce", arity=(1, 1), infer=reduce_infer, attrs=_RED_ATTRS,
        dtype="float" if _name == "mean" else "numeric",
        numpy=(lambda fn: lambda a, at: fn(a[0], axis=reduce_axes(at, a[0].ndim), keepdims=at["keepdims"]))(_fn))

# ---------------------------------------------------------------- row ops


def _softmax_infer(ts, attrs):
    norm_axis(attrs["axis"], ts[0].rank)
    return TType(ts[0].shape)


def _softmax_np(args, attrs):
    x, ax = args[0], attrs["axis"]
    e = np.exp(x - np.max(x, axis=ax, keepdims=True))
    p = e / np.sum(e, axis=ax, keepdims=True)
    # zero_nan: where(isnan(p), 0, p), as exporters write around a fully masked row
    return np.where(np.isnan(p), np.float32(0), p) if attrs["zero_nan"] else p


def norm_params(ts, tail: tuple[Dim, ...], opname: str, names: tuple[str, ...]):
    for t, n in zip(ts, names):
        if t.shape != tail:
            raise ShapeError(f"{opname} {n} must have shape {fmt(tail)} (the normalized dims), got {fmt(t.shape)}")


def _layernorm_infer(ts, attrs):
    x = ts[0]
    ax = norm_axis(attrs["axis"], x.rank)
    norm_params(ts[1:], x.shape[ax:], "layernorm", ("gamma", "beta"))
    return TType(x.shape)


def _layernorm_np(args, attrs):
    x, g, b = args
    axes = tuple(range(norm_axis(attrs["axis"], x.ndim), x.ndim))
    mu = np.mean(x, axis=axes, keepdims=True)
    var = np.mean(np.square(x - mu), axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(var + F32(attrs["eps"])) * g + b


def _rmsnorm_infer(ts, attrs):
    x = ts[0]
    if x.rank < 1:
        raise ShapeError("rmsnorm needs rank >= 1")
    norm_params(ts[1:], x.shape[-1:], "rmsnorm", ("gamma",))
    return TType(x.shape)


def _rmsnorm_np(args, attrs):
    x, g = args
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + F32(attrs["eps"])) * g


def _batchnorm_infer(ts, attrs):
    x = ts[0]
    if x.rank < 2:
        raise ShapeError(f"batchnorm needs rank >= 2 (channel axis 1), got {fmt(x.shape)}")
    norm_params(ts[1:], (x.shape[1],), "batchnorm", ("mean", "var", "gamma", "beta"))
    return TType(x.shape)


def _batchnorm_np(args, attrs):
    x, mean, var, g, b = args
    shp = (1, -1) + (1,) * (x.ndim - 2)
    return (x - mean.reshape(shp)) / np.sqrt(var.reshape(shp) + F32(attrs["eps"])) * g.reshape(shp) + b.reshape(shp)


define(name="softmax", kind="row", arity=(1, 1), infer=_softmax_infer, numpy=_softmax_np,
    attrs=(Attr("axis", "int", -1), Attr("zero_nan", "bool", False)), flops=6)
define(name="layernorm", kind="row", arity=(3, 3), infer=_layernorm_infer, numpy=_layernorm_np,
    attrs=(Attr("axis", "int", -1), Attr("eps", "float", 1e-5)), flops=8)
define(name="rmsnorm", kind="row", arity=(2, 2), infer=_rmsnorm_infer, numpy=_rmsnorm_np,
    attrs=(Attr("eps", "float", 1e-6),), flops=5)
define(name="batchnorm", kind="channel", arity=(5, 5), infer=_batchnorm_infer, numpy=_batchnorm_np,
    attrs=(Attr("eps", "float", 1e-5),), flops=4)

# ---------------------------------------------------------------- layout


def perm_of(attrs, rank):
    p = attrs["perm"]
    return tuple(reversed(range(rank))) if p is None else tuple(p)


def _transpose_infer(ts, attrs):
    x = ts[0]
    p = perm_of(attrs, x.rank)
    if sorted(p) != list(range(x.rank)):
        raise ShapeError(f"perm {list(p)} is not a permutation of {x.rank} axes")
    return TType(tuple(x.shape[i] for i in p))


def _reshape_infer(ts, attrs):
    x, shape = ts[0], list(attrs["shape"])
    if shape.count(-1) > 1:
        raise ShapeError("reshape allows at most one -1")
    if any(d == 0 or d < -1 for d in shape):
        raise ShapeError(f"reshape sizes must be positive or -1, got {shape}")
    n_in, names_in = dim_product(x.shape)
    known = math.prod(d for d in shape if d != -1)
    if -1 in shape:
        if names_in:
            if len(names_in) != 1 or n_in != known:
                raise ShapeError(f"cannot infer -1 when reshaping {fmt(x.shape)} to {shape}")
            fill: Dim = names_in[0]
        else:
            if n_in % known:
                raise ShapeError(f"cannot reshape {fmt(x.shape)} ({n_in} elements) to {shape}")
            fill = n_in // known
        return TType(tuple(fill if d == -1 else d for d in shape))
    if names_in or n_in != known:
        raise ShapeError(f"cannot reshape {fmt(x.shape)} to {shape}: sizes differ")
    return TType(tuple(shape))


def slice_bounds(n: Dim, attrs) -> tuple[int, int, int]:
    """(first index, end, count) of a slice; negative start/stop count from the end (numpy)."""
    start, stop, step = attrs["start"], attrs["stop"], attrs["step"]
    if step < 1:
        raise ShapeError(f"slice step must be positive, got {step}")
    if not isinstance(n, int):
        if start < 0 or stop is None or stop < 0 or step != 1:
            raise ShapeError(f"slice of named dimension {n} needs non-negative start and stop and step 1")
        return start, stop, stop - start
    r = range(n)[start:stop:step]
    return r.start, r.stop, len(r)


def _slice_infer(ts, attrs):
    x = ts[0]
    ax = norm_axis(attrs["axis"], x.rank)
    lo, hi, count = slice_bounds(x.shape[ax], attrs)
    if count <= 0:
        raise ShapeError(f"slice [{attrs['start']}:{attrs['stop']}] of dimension {x.shape[ax]} is empty")
    return TType(x.shape[:ax] + (count,) + x.shape[ax + 1:])


def _slice_np(args, attrs):
    x = args[0]
    ax = norm_axis(attrs["axis"], x.ndim)
    lo, hi, _ = slice_bounds(x.shape[ax], attrs)
    idx = [slice(None)] * x.ndim
    idx[ax] = slice(lo, hi, attrs["step"])
    return x[tuple(idx)]


def _concat_infer(ts, attrs):
    rank = ts[0].rank
    ax = norm_axis(attrs["axis"], rank)
    total: Dim = 0
    for t in ts:
        if t.rank != rank or any(t.shape[i] != ts[0].shape[i] for i in range(rank) if i != ax):
            raise ShapeError(f"concat along axis {attrs['axis']}: shapes {', '.join(fmt(t.shape) for t in ts)} differ")
    parts = [t.shape[ax] for t in ts]
    named = tuple(dict.fromkeys(d for d in parts if isinstance(d, str)))
    if named:  # a sum of names (past + sequence): holds once they are bound (errors.NamedSum)
        raise NamedSum(f"concat along axis {attrs['axis']} sums named dimensions ({' + '.join(str(d) for d in parts)}), "
                       "which a shape cannot hold (a dim is a number or one name): they must be bound "
                       "(an ONNX model binds them per call)", named)
    for d in parts:
        total += d
    return TType(ts[0].shape[:ax] + (total,) + ts[0].shape[ax + 1:])


define(name="transpose", kind="layout", dtype="any", arity=(1, 1), infer=_transpose_infer,
    numpy=lambda a, at: np.transpose(a[0], perm_of(at, a[0].ndim)), attrs=(Attr("perm", "ints", None),))
define(name="reshape", kind="layout", dtype="any", arity=(1, 1), infer=_reshape_infer,
    numpy=lambda a, at: np.reshape(a[0], at["shape"]), attrs=(Attr("shape", "ints"),))
define(name="slice", kind="layout", dtype="any", arity=(1, 1), infer=_slice_infer, numpy=_slice_np,
    attrs=(Attr("axis", "int"), Attr("start", "int", 0), Attr("stop", "int", None), Attr("step", "int", 1)))
define(name="concat", kind="layout", dtype="any", arity=(1, -1), infer=_concat_infer,
    numpy=lambda a, at: np.concatenate(a, axis=at["axis"]), attrs=(Attr("axis", "int", 0),))



# ---------------------------------------------------------------- attribute checking


def normalize_attr(spec: Attr, value: Any) -> Any:
    """Check one attribute value against its spec; return the normalized value or raise ValueError."""
    k = spec.kind
    is_int = isinstance(value, int) and not isinstance(value, bool)
    is_ints = isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if value is None and spec.default is None:
        return None
    if k == "int" and is_int:
        return value
    if k == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if k == "bool" and isinstance(value, bool):
        return value
    if k == "str" and isinstance(value, str):
        if spec.choices and value not in spec.choices:
            raise ValueError(f"must be one of {', '.join(repr(c) for c in spec.choices)}")
        return value
    if k == "ints" and is_ints:
        return value
    if k == "int_or_ints":
        if is_int:
            return value
        if is_ints and len(value) == 2:
            return value
        raise ValueError("must be an integer or a list of two integers")
    if k == "pads2d":
        if is_int:
            return value
        if is_ints and len(value) in (2, 4):
            return value
        raise ValueError("must be an integer, a list of two integers [h, w] or of four [top, left, bottom, right]")
    if k == "axes":
        if is_int:
            return (value,)
        if is_ints:
            return value
    want = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
            "ints": "a list of integers", "axes": "an integer or a list of integers"}[k]
    raise ValueError(f"must be {want}")


def complete_attrs(op: Op, given: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults filled in, values normalized; raises ValueError naming the attribute."""
    out: dict[str, Any] = {}
    for spec in op.attrs:
        if spec.name in given:
            try:
                out[spec.name] = normalize_attr(spec, given[spec.name])
            except ValueError as e:
                raise ValueError(f"attribute {spec.name}= of {op.name} {e}") from None
        elif spec.default is REQUIRED:
            raise ValueError(f"{op.name} needs the attribute {spec.name}=")
        else:
            out[spec.name] = spec.default
    return out
