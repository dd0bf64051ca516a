"""What every ONNX op handler shares: the registry of handlers (`HANDLERS`, filled by the
`@handles` decorators of onnx_handlers, onnx_ops, onnx_quant and onnx_symbolic_ops, which
eqfuse.frontend.onnx_import imports once; keyed by handler_key, an op of another domain than
ONNX's own, as onnxruntime's com.microsoft ops, by "domain.OpType"), the importer's errors,
and the checks of an ONNX file's own data before the
importer trusts it: an initializer's dims and bytes, an input's dims. A damaged or hostile file
gets one clear error, never a numpy exception."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from eqfuse.errors import EqfuseError
from eqfuse.frontend.builder import MAX_RANK
from eqfuse.ir.graph import MAX_ELEMENTS
from eqfuse.ir.shapes import Dim, dim_product

try:
    import onnx
except ImportError:  # the importer refuses models without it
    onnx = None


class Unsupported(Exception):
    """Raised inside an ONNX handler; the importer adds the op type and node name."""


@dataclass(frozen=True)
class Empty:
    """A zero-size tensor, which the IR cannot hold: an empty slice, as the pass-through part of a
    rotary embedding that covers the whole head (Phi-3's `q[..., rotary_dim:]`). Concat takes it as
    no operand; any other use is refused with `why` (onnx_import.Importer.import_node)."""

    shape: tuple[Dim, ...]
    why: str


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


BIG = 2**31  # ONNX writes "to the end" as INT64_MAX (or INT32_MAX)


ONNX_DTYPES = {1: "f32", 7: "i64", 6: "i32", 9: "bool", 2: "u8", 3: "i8"}  # TensorProto element types eqfuse computes in


HANDLERS: dict[str, tuple[Callable, set[str]]] = {}  # keyed by handler_key

ONNX_DOMAINS = ("", "ai.onnx")  # the standard ops; another domain's ops are keyed "domain.OpType"


def handler_key(op_type: str, domain: str = "") -> str:
    """The key of an op in HANDLERS: its type for a standard op, "com.microsoft.QLinearAdd" for an op of
    another domain (onnxruntime's contrib ops), so that an op of one domain never takes another's handler."""
    return op_type if domain in ONNX_DOMAINS else f"{domain}.{op_type}"


def handles(*op_types: str, attrs: tuple[str, ...] = (), domain: str = ""):
    def deco(fn):
        for t in op_types:
            HANDLERS[handler_key(t, domain)] = (fn, set(attrs))
        return fn
    return deco


def f32_float(x) -> float:
    """A float32 number as the shortest float that rounds to it (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(x)))


def pair(v: list[int]) -> int | tuple[int, int]:
    return v[0] if v[0] == v[1] else tuple(v)


def dtype_name(elem_type: int) -> str:
    """ONNX's name of a tensor element type; a number no onnx version names (a damaged file) is
    said as such."""
    try:
        return onnx.TensorProto.DataType.Name(elem_type) if onnx else str(elem_type)
    except ValueError:
        return f"{elem_type} (not an ONNX element type)"


def prod_dims(ds) -> tuple[int, tuple[str, ...]]:
    return dim_product(tuple(ds))


def one_dim(ds) -> Dim:
    """The product of some dims as one dim: an int, or a name times 1."""
    n, names = prod_dims(ds)
    if not names:
        return n
    if len(names) == 1 and n == 1:
        return names[0]
    raise NeedsDims(f"flattening dims {list(ds)} (a product of named dims; bind them with dims=)")

