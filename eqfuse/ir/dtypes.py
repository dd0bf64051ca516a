"""Element types of op results: the dtype rule each op of the op table names.

Float compute stays f32; integer and bool tensors carry indices and masks. A scalar literal is
weakly typed (as in JAX): a rank-0 f32 next to a tensor of another dtype takes that dtype, so
`ids + 1` stays i64 and `where(mask, s, -1e9)` stays f32. Every other mix is an error that
names the op and the dtypes, as numpy's silent promotion would hide a bug in a model.
"""

from __future__ import annotations

from typing import Any, Mapping

from eqfuse.errors import ShapeError
from eqfuse.ir.shapes import INT_DTYPES, TType

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
    if rule == "dtype_attr":
        return attrs["dtype"]
    raise ValueError(f"unknown dtype rule {rule}")
