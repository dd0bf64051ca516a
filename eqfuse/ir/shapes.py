"""Tensor types and the shape arithmetic that every op's shape rule uses.

A dimension is an int or a name (a dimension bound later, at compile time or at the first call).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import zip_longest
from math import prod
from typing import Mapping, Union

from eqfuse.errors import ShapeError

Dim = Union[int, str]
DTYPES = ("f32", "i64", "i32", "bool", "u8", "i8")
INT_DTYPES = ("i64", "i32")  # the integers of arithmetic and indices
# The 8-bit integers of quantized models: stored, moved, cast, quantized and dequantized, and the
# operands of matmul_integer; arithmetic on them needs a cast to i32 first (no silent wraparound).
QUANT_DTYPES = ("u8", "i8")
NUMPY_DTYPE = {"f32": "float32", "i64": "int64", "i32": "int32", "bool": "bool", "u8": "uint8", "i8": "int8"}
C_TYPE = {"f32": "float", "i64": "int64_t", "i32": "int32_t", "bool": "_Bool", "u8": "uint8_t", "i8": "int8_t"}


def dtype_of_numpy(dt) -> str | None:
    """The eqfuse dtype of a numpy dtype, or None when eqfuse has none for it."""
    return {v: k for k, v in NUMPY_DTYPE.items()}.get(str(dt))


@dataclass(frozen=True)
class TType:
    shape: tuple[Dim, ...] = ()
    dtype: str = "f32"

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def concrete(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def size(self, dims: Mapping[str, int] | None = None) -> int:
        return prod(resolve(d, dims) for d in self.shape)

    def bind(self, dims: Mapping[str, int]) -> "TType":
        return TType(tuple(dims.get(d, d) if isinstance(d, str) else d for d in self.shape), self.dtype)

    def __str__(self) -> str:
        if not self.shape:
            return self.dtype
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"


def resolve(d: Dim, dims: Mapping[str, int] | None) -> int:
    if isinstance(d, int):
        return d
    if dims is None or d not in dims:
        raise ShapeError(f"dimension {d} is not bound")
    return dims[d]


def fmt(shape: tuple[Dim, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def broadcast(*shapes: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """numpy broadcasting; named dims broadcast only with 1 or the same name."""
    out: list[Dim] = []
    for ds in zip_longest(*(reversed(s) for s in shapes), fillvalue=1):
        keep: Dim = 1
        for d in ds:
            if d == 1 or d == keep:
                continue
            if keep == 1:
                keep = d
            else:
                raise ShapeError(
                    "cannot broadcast " + " with ".join(fmt(s) for s in shapes) + f": dimension {keep} vs {d}"
                )
        out.append(keep)
    return tuple(reversed(out))


def norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:  # a scalar has no axis at all
        raise ShapeError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def dim_product(dims: tuple[Dim, ...]) -> tuple[int, tuple[str, ...]]:
    """Split a shape's size into its integer part and the sorted names multiplying it."""
    ints = prod(d for d in dims if isinstance(d, int))
    names = tuple(sorted(d for d in dims if isinstance(d, str)))
    return ints, names
