"""Checks of an ONNX file's own data before the importer trusts it: an initializer's dims and
bytes, an input's dims. A damaged or hostile file gets one clear error, never a numpy exception."""

from __future__ import annotations

import math

import numpy as np

from eqfuse.errors import EqfuseError
from eqfuse.frontend.builder import MAX_RANK, check_size  # noqa: F401 (check_size: for the importer)
from eqfuse.ir.graph import MAX_ELEMENTS


class Unsupported(Exception):
    """Raised inside an ONNX handler; the importer adds the op type and node name."""


class NeedsDims(Unsupported):
    """Unsupported until some named dims are bound: shape arithmetic on several of them, which
    the IR's shapes cannot hold (the importer raises it as DimsNeeded)."""


def check_dims(dims, what: str, allow_zero: bool = False) -> None:
    """Raise unless `dims` are a shape eqfuse can hold: rank and size bounded, every int positive
    (a name, an input's dim_param, is any size). Constants may be empty (an export's empty
    Resize roi); the importer refuses an empty one read as data."""
    if len(dims) > MAX_RANK:
        raise EqfuseError(f"{what} has rank {len(dims)}, more dimensions than numpy allows ({MAX_RANK})")
    dims = [int(d) for d in dims if not isinstance(d, str)]
    bad = next(((axis, d) for axis, d in enumerate(dims) if d < 0 or (d == 0 and not allow_zero)), None)
    if bad is not None:
        axis, d = bad
        raise EqfuseError(f"{what} has dimension {d} at axis {axis}; eqfuse needs positive dimensions "
                          "(zero-size and negative dims are not supported)")
    size = math.prod(dims)
    if size > MAX_ELEMENTS:
        raise EqfuseError(f"{what} has {size} elements, too large (at most 2^40 elements)")


def tensor_array(t, what: str) -> np.ndarray:
    """A TensorProto as an array, its dims checked first and its data checked against them."""
    from onnx import numpy_helper

    dims = [int(d) for d in t.dims]
    if dims:  # a scalar has no dims
        check_dims(dims, what, allow_zero=True)
    try:
        arr = numpy_helper.to_array(t)
    except Exception as e:  # short raw_data, a wrong count of values, an unknown data type, ...
        raise EqfuseError(f"{what}: its data does not match its dims {dims} and type "
                          f"({type(e).__name__}: {e})") from None
    if list(arr.shape) != dims:
        raise EqfuseError(f"{what}: its data has shape {list(arr.shape)}, not its dims {dims}")
    return arr
