"""Element types of op results: the dtype rule each op of the op table names.

Float compute stays f32; integer and bool tensors carry indices and masks. A scalar literal is
weakly typed (as in JAX): a rank-0 f32 next to a tensor of another dtype takes that dtype, so
`ids + 1` stays i64 and `where(mask, s, -1e9)` stays f32. Every other mix is an error that
names the op and the dtypes, as numpy's silent promotion would hide a bug in a model.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Mapping

import numpy as np

from eqfuse.errors import ShapeError
from eqfuse.ir.shapes import INT_DTYPES, QUANT_DTYPES, TType

NUMERIC = ("f32",) + INT_DTYPES


def _weak(t: TType) -> bool:
    return t.rank == 0 and t.dtype == "f32"


def common(opname: str, ts: list[TType]) -> str:
    """The one dtype of ts, weak scalars taking the others' dtype."""
    strong = {t.dtype for t in ts if not _weak(t)}
    if not strong:
        return "f32"
    if len(strong) > 1:
        raise ShapeError(f"{opname} mixes dtypes {', '.join(sorted(strong))}; convert one with cast(x, to=...)")
    return strong.pop()


def _need(opname: str, dt: str, allowed: tuple[str, ...], what: str) -> str:
    if dt not in allowed:
        raise ShapeError(f"{opname} needs {what} tensors, got {dt}")
    return dt


def result_dtype(rule: str, opname: str, ts: list[TType], attrs: Mapping[str, Any]) -> str:
    """The dtype of an op's result under its rule (raises ShapeError for operands it refuses).

    float    every operand f32, result f32 (transcendental, contraction, row ops)
    numeric  operands of one numeric dtype, result that dtype (arithmetic, sum, max, cumsum)
    any      result the first operand's dtype, any dtype (layout ops)
    compare  operands of one dtype, result bool
    logical  bool operands, bool result
    where    a bool condition, then two operands of one dtype
    gather   the data's dtype; indices i64 or i32 (the second operand)
    cast     the attribute to=
    dtype_attr  the attribute dtype= (range)
    index    i64 (argmax)
    topk     numeric operands: i64 with indices=true, else the operand's dtype
    quantize        x and scale f32, the zero point u8 or i8: the zero point's dtype
    dequantize      q and its zero point of one dtype (u8, i8 or i32), scale f32: f32
    matmul_integer  a, b u8 or i8, each zero point of its operand's dtype: i32 (conv_integer too)
    dynamic_zero_point  x f32: u8 (DynamicQuantizeLinear's zero point)
    max_pool        f32, or a quantized model's u8 or i8 (max_pool2d: rule maxpool_dequantized, quant.rw)
    """
    if rule == "float":
        for t in ts:
            if t.dtype != "f32":
                raise ShapeError(f"{opname} needs f32 tensors, got {t.dtype}; convert with cast(x, to=\"f32\")")
        return "f32"
    if rule == "numeric":
        return _need(opname, common(opname, ts), NUMERIC, "numeric (f32, i64, i32)")
    if rule == "any":
        if len(ts) > 1:
            return common(opname, ts)
        return ts[0].dtype
    if rule == "compare":
        common(opname, ts)
        return "bool"
    if rule == "logical":
        _need(opname, common(opname, [TType(t.shape, "bool") if _weak(t) else t for t in ts]), ("bool",), "bool")
        return "bool"
    if rule == "where":
        if ts[0].dtype != "bool":
            raise ShapeError(f"where needs a bool condition, got {ts[0].dtype}")
        return common(opname, ts[1:])
    if rule == "gather":
        _need(opname, ts[1].dtype, INT_DTYPES, "integer index")
        return ts[0].dtype
    if rule == "cast":
        return attrs["to"]
    if rule == "index":
        return "i64"
    if rule == "topk":
        dt = _need(opname, ts[0].dtype, NUMERIC, "numeric (f32, i64, i32)")
        return "i64" if attrs["indices"] else dt
    if rule == "quantize":
        for t in ts[:2]:
            _need(opname, t.dtype, ("f32",), "f32 data and scale")
        return _need(opname, ts[2].dtype, QUANT_DTYPES, "a u8 or i8 zero point")
    if rule == "dequantize":
        _need(opname, ts[1].dtype, ("f32",), "an f32 scale")
        if ts[0].dtype != ts[2].dtype:
            raise ShapeError(f"{opname} needs the zero point of the data's dtype, got {ts[0].dtype} and {ts[2].dtype}")
        _need(opname, ts[0].dtype, QUANT_DTYPES + ("i32",), "u8, i8 or i32")
        return "f32"
    if rule == "matmul_integer":
        for t, z in ((ts[0], ts[2]), (ts[1], ts[3])):
            _need(opname, t.dtype, QUANT_DTYPES, "u8 or i8")
            if z.dtype != t.dtype:
                raise ShapeError(f"{opname} needs each zero point of its operand's dtype, got {t.dtype} and {z.dtype}")
        return "i32"
    if rule == "dynamic_zero_point":
        _need(opname, ts[0].dtype, ("f32",), "f32")
        return "u8"
    if rule == "dtype_attr":
        return attrs["dtype"]
    if rule == "max_pool":
        return _need(opname, ts[0].dtype, ("f32",) + QUANT_DTYPES, "f32, u8 or i8")
    raise ValueError(f"unknown dtype rule {rule}")


# ---------------------------------------------------------------- the f32 value of a literal
# (the parser reads literals with these, the printer and the C emitter write them)

def round_f32(v: float) -> np.float32:
    """v rounded to float32 as numpy does (the reference's meaning of a constant), without numpy's
    overflow warning: a value beyond the f32 range is inf."""
    with np.errstate(over="ignore"):
        return np.float32(v)


def same_f32(a, b) -> bool:
    """Bit for bit, except that every NaN equals every NaN (payloads and signs are not kept)."""
    a, b = np.float32(a), np.float32(b)
    return bool(np.isnan(a) and np.isnan(b)) or a.view(np.uint32) == b.view(np.uint32)


def f32_of_decimal(text: str) -> np.float32:
    """The float32 nearest to the exact value of a decimal literal, ties to even (inf beyond the
    overflow threshold 2^128 * (1 - 2^-25)).

    np.float32(float(text)) rounds twice: it is wrong when the double lands exactly halfway between
    two f32 neighbours (or on the overflow threshold) while the decimal itself does not, so only then
    is the decimal compared exactly with the halfway point."""
    d = float(text)
    f = round_f32(d)
    if math.isnan(d) or math.isinf(d) or float(f) == d:
        return f
    big = math.copysign(2.0 ** 128, d)  # the f32 "neighbour" above FLT_MAX: halfway to it rounds to inf
    g = big if np.isinf(f) else float(f)
    toward = np.float32(math.copysign(math.inf, d - g))
    with np.errstate(over="ignore"):
        n = np.nextafter(f, toward)
    n = big if np.isinf(n) else float(n)
    half = (g + n) / 2  # exact: both are f32 values (or 2^128)
    if d != half:  # rounding is monotonic: the decimal is on d's side of every double but d
        return f
    exact = Fraction(text)
    if exact == Fraction(half):  # a true tie: to even, as numpy rounded it
        return f
    return round_f32(g if (exact > Fraction(half)) == (g > half) else n)


def f32_literal(f: np.float32) -> float:
    """A float (double) that rounds to the f32 value f and prints short: 3.4028235e+38 for FLT_MAX,
    1e-45 for the smallest subnormal (as the ONNX importer stores constants)."""
    s = float(np.format_float_scientific(f, unique=True))
    return s if same_f32(round_f32(s), f) else float(f)
