"""Shape values of an ONNX export that depend on a named dim (a dynamic batch axis).

An exporter with a dynamic axis writes the shape arithmetic out as nodes: Shape -> Gather ->
Unsqueeze -> Concat -> Reshape. With every dim known the importer folds that arithmetic away;
with a named dim (ONNX dim_param) it folds it here, symbolically, so the graph keeps the name:

- `Sym`: a small integer tensor (rank 0 or 1) whose entries are ints or `SymDim`s (a name, or a
  `Prod` of names and an int). Shape of a tensor with named dims gives one; Gather, Slice,
  Unsqueeze, Squeeze, Concat, Reshape, Cast, Mul, Div, the comparisons and Where keep it symbolic.
  Where it is read as a shape (Reshape, Expand, ConstantOfShape, Range) it becomes IR; where
  it is read as data it is computed at run time from an input carrying the named dim.
- `Merged`: a tensor whose logical shape multiplies a named dim with others (GPT-2's
  `x.view(-1, 64)` of a [batch, 16, 64] tensor is [batch*16, 64]). The IR has no such dim, so
  the tensor stays in its physical, unmerged form and remembers which physical dims make each
  logical one; Gemm, MatMul, Transpose, Gather, elementwise ops, Shape and Reshape (usually
  back) read it (eqfuse/frontend/onnx_symbolic_ops.py).

Whatever cannot be represented raises Unsupported, which names the node; a result is never
guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eqfuse.frontend.onnx_registry import NeedsDims, Unsupported
from eqfuse.ir.shapes import Dim


@dataclass(frozen=True)
class Prod:
    """coef * the product of names (sorted), e.g. batch*16; never a plain int or one name. The
    importer keeps coef positive, so that a Prod is, like a name, at least 1."""

    coef: int
    names: tuple[str, ...]

    def __str__(self):
        return "*".join(list(self.names) + ([str(self.coef)] if self.coef != 1 else []))


SymDim = int | str | Prod


def split(d: SymDim) -> tuple[int, tuple[str, ...]]:
    if isinstance(d, (int, np.integer)):
        return int(d), ()
    if isinstance(d, str):
        return 1, (d,)
    return d.coef, d.names


def make(coef: int, names) -> SymDim:
    names = tuple(sorted(names))
    if not names or coef == 0:
        return coef
    if coef == 1 and len(names) == 1:
        return names[0]
    return Prod(coef, names)


def product(ds) -> SymDim:
    coef, names = 1, []
    for d in ds:
        c, n = split(d)
        coef, names = coef * c, names + list(n)
    return make(coef, names)


def divide(a: SymDim, b: SymDim) -> SymDim | None:
    """a / b when exact (b's names all in a, the ints dividing), else None."""
    (ca, na), (cb, nb) = split(a), split(b)
    rest = list(na)
    for n in nb:
        if n not in rest:
            return None
        rest.remove(n)
    if cb == 0 or ca % cb:
        return None
    return make(ca // cb, rest)


def fmt(ds) -> str:
    return "[" + ", ".join(map(str, ds)) + "]"


def is_sym(d) -> bool:
    return not isinstance(d, (int, np.integer))


@dataclass(frozen=True)
class Sym:
    """An int64 tensor of rank 0 (scalar) or 1 whose entries may be SymDims."""

    vals: tuple[SymDim, ...]
    scalar: bool = False

    @property
    def ndim(self) -> int:
        return 0 if self.scalar else 1

    def __str__(self):
        return str(self.vals[0]) if self.scalar else "[" + ", ".join(map(str, self.vals)) + "]"


def sym(vals, scalar: bool = False):
    """A Sym, or a plain int64 array when no entry is symbolic (then the importer folds it)."""
    vals = tuple(int(v) if not is_sym(v) else v for v in vals)
    if any(is_sym(v) for v in vals):
        return Sym(vals, scalar)
    arr = np.asarray(vals, np.int64)
    return arr.reshape(()) if scalar else arr


@dataclass(frozen=True)
class Merged:
    """A tensor stored as `node` (physical shape: the groups, concatenated); logical dim k is the
    product of groups[k]."""

    node: int
    groups: tuple[tuple[Dim, ...], ...]

    @property
    def shape(self) -> tuple[SymDim, ...]:
        return tuple(product(g) for g in self.groups)

    def __str__(self):
        return "[" + ", ".join(map(str, self.shape)) + "]"


def merged(node: int, groups) -> int | Merged:
    groups = tuple(tuple(g) for g in groups)
    return node if all(len(g) == 1 for g in groups) else Merged(node, groups)


def logical_shape(imp, v) -> tuple[SymDim, ...]:
    return v.shape if isinstance(v, Merged) else tuple(imp.type(v).shape)


def entries(v, what: str) -> tuple[list[SymDim], bool]:
    """(the entries, is it a scalar) of a Sym or a constant int array."""
    if isinstance(v, Sym):
        return list(v.vals), v.scalar
    arr = np.asarray(v)
    if arr.ndim > 1 or arr.dtype.kind not in "iub":
        raise Unsupported(f"{what} of shape {list(arr.shape)} and dtype {arr.dtype} next to a shape value")
    return [int(x) for x in arr.reshape(-1)], arr.ndim == 0


# ---------------------------------------------------------------- named dims at run time


def carrier(imp, name: str, pos: int, rank: int) -> int:
    """A bool tensor of `rank` dims, all 1 but `name` at `pos`: read from a runtime input that has
    the named dim, it is what broadcasts a tensor up to that dim (the IR's expand takes ints)."""
    if name not in imp.named_at:
        raise NeedsDims(f"named dim {name} that no input carries")
    key = ("carrier", name)
    if key not in imp.memo:
        node, axis = imp.named_at[name]
        x = node
        for a, d in enumerate(imp.type(node).shape):
            if a != axis and d != 1:
                x = imp.op("slice", [x], axis=a, start=0, stop=1)
        x = imp.op("reshape", [x], shape=(-1,))
        imp.memo[key] = imp.op("eq", [x, x])  # false at a NaN, and where(c, y, y) is y anyway
    c = imp.memo[key]
    return c if rank == 1 else imp.op("reshape", [c], shape=tuple(-1 if k == pos else 1 for k in range(rank)))


def dim_value(imp, d: SymDim) -> int:
    """A named (or product) dim as an i64 tensor of shape (1,), computed at run time."""
    coef, names = split(d)
    out = None
    for n in names:
        key = ("size", n)
        if key not in imp.memo:
            ones = imp.op("cast", [imp.op("where", [carrier(imp, n, 0, 1), imp.const(1), imp.const(1)])], to="i64")
            imp.memo[key] = imp.op("sum", [ones], axis=(0,), keepdims=True)
        out = imp.memo[key] if out is None else imp.op("mul", [out, imp.memo[key]])
    return out if coef == 1 else imp.op("mul", [out, imp.const(coef)])


def materialize(imp, v: Sym) -> int:
    """A Sym read as data: its entries computed at run time, concatenated."""
    parts, run = [], []
    for d in v.vals:
        if is_sym(d):
            if run:
                parts.append(imp.new_param("shape_part", np.asarray(run, np.int64)))
                run = []
            parts.append(dim_value(imp, d))
        else:
            run.append(int(d))
    if run:
        parts.append(imp.new_param("shape_part", np.asarray(run, np.int64)))
    out = parts[0] if len(parts) == 1 else imp.op("concat", parts, axis=0)
    out = imp.op("reshape", [out], shape=()) if v.scalar else out
    imp.sym_nodes[out] = v
    return out


def broadcast_to(imp, x: int, target: list[SymDim]) -> int:
    """ONNX Expand (two-way broadcasting) of node x to `target`, whose dims may be names: the
    int part through the IR's expand, each name x lacks through where(carrier, y, y)."""
    xs = list(imp.type(x).shape)
    rank = max(len(xs), len(target))
    xs = [1] * (rank - len(xs)) + xs
    ts = [1] * (rank - len(target)) + list(target)
    out: list[Dim] = []
    for a, b in zip(xs, ts):
        if isinstance(b, Prod) or (isinstance(a, str) and b not in (1, a)):
            raise Unsupported(f"Expand of {fmt(imp.type(x).shape)} to {fmt(target)}")
        if b == 1 or a == b:
            out.append(a)
        elif a == 1:
            out.append(b)
        else:
            raise ValueError(f"cannot expand {fmt(imp.type(x).shape)} to {fmt(target)}")
    ints = tuple(d if isinstance(d, int) else 1 for d in out)
    y = x
    if tuple(imp.type(y).shape) != tuple(out):
        y = imp.op("expand", [y], shape=ints) if any(d != 1 for d in ints) or rank > imp.type(y).rank else y
    for k, d in enumerate(out):
        if isinstance(d, str) and imp.type(y).shape[k] != d:
            y = imp.op("where", [carrier(imp, d, k, rank), y, y])
    return y


def arange(imp, n: SymDim, dtype: str) -> int:
    """range(0, n) for a named n: an exclusive cumsum of ones along the named dim."""
    if isinstance(n, Prod):
        raise NeedsDims(f"Range up to {n} (a product of named dims)")
    ones = imp.op("cast", [imp.op("where", [carrier(imp, n, 0, 1), imp.const(1), imp.const(1)])], to=dtype)
    return imp.op("cumsum", [ones], axis=0, exclusive=True)


# ---------------------------------------------------------------- reshape with named dims


def reshape(imp, x, spec: list[SymDim], allowzero: bool = False):
    """Reshape x (a node or a Merged) to `spec` (ints, SymDims, 0 = keep, one -1 = the rest)."""
    phys = list(imp.type(x.node if isinstance(x, Merged) else x).shape)
    node = x.node if isinstance(x, Merged) else x
    cur = logical_shape(imp, x)
    if allowzero and 0 in spec:
        raise Unsupported("allowzero with a zero in the shape (zero-size tensors)")
    if any(not is_sym(d) and d == 0 and i >= len(cur) for i, d in enumerate(spec)):
        raise ValueError(f"cannot reshape {fmt(cur)} to {fmt(spec)}: a 0 past the input's rank")
    out = [cur[i] if (not is_sym(d) and d == 0) else d for i, d in enumerate(spec)]
    total = product(cur)
    if sum(1 for d in out if not is_sym(d) and d == -1) > 1 or any(not is_sym(d) and d < -1 for d in out):
        raise ValueError(f"shape {fmt(spec)} has more than one -1 or a negative size")
    if any(not is_sym(d) and d == -1 for d in out):
        k = next(i for i, d in enumerate(out) if not is_sym(d) and d == -1)
        fill = divide(total, product(d for i, d in enumerate(out) if i != k))
        if fill is None and not is_sym(total) and not any(is_sym(d) for d in out):
            raise ValueError(f"cannot reshape {fmt(cur)} to {fmt(spec)}")
        if fill is None:
            raise NeedsDims(f"reshape of {fmt(cur)} to {fmt(spec)} (the -1 is no product of named dims and ints)")
        out[k] = fill
    elif product(out) != total:
        raise ValueError(f"cannot reshape {fmt(cur)} to {fmt(spec)}")
    if not any(isinstance(d, Prod) for d in out):
        return _plain_reshape(imp, node, phys, tuple(out))
    groups = _regroup(phys, out)
    if groups is None:
        raise NeedsDims(f"reshape of {fmt(cur)} to {fmt(out)} (a named dim split "
                          "or merged out of order; bind it with dims=)")
    flat = tuple(d for g in groups for d in g)
    return merged(_plain_reshape(imp, node, phys, flat), groups)


def _plain_reshape(imp, node: int, phys, out: tuple[Dim, ...]) -> int:
    names_in = sorted(d for d in phys if isinstance(d, str))
    names_out = sorted(d for d in out if isinstance(d, str))
    if len(names_out) > 1 and [d for d in phys if d != 1] == [d for d in out if d != 1] and tuple(out) != tuple(phys):
        # several named dims: the IR's reshape fills one -1 only, but 1s come and go by squeeze/unsqueeze
        ones = tuple(k for k, d in enumerate(phys) if d == 1)
        node = imp.op("squeeze", [node], axis=ones) if ones else node
        ones = tuple(k for k, d in enumerate(out) if d == 1)
        return imp.op("unsqueeze", [node], axis=ones) if ones else node
    if names_in != names_out or (len(names_out) > 1 and tuple(out) != tuple(phys)):
        raise NeedsDims(f"reshape of {fmt(phys)} to {fmt(out)} (named dims; bind them with dims=)")
    return imp.reshape_to(node, out)


def _regroup(phys: list[Dim], out: list[SymDim]) -> list[list[Dim]] | None:
    """Physical dims for each target dim: consecutive runs of `phys` (ints split when they must),
    so that row-major order is kept; None when the target does not line up with them."""
    queue, groups = _merge_ints(list(phys)), []  # (B, 3, 4) as (B, 12): [B*2, 6] splits the 12
    for t in out:
        coef, names = split(t)
        names, group = list(names), []
        while coef != 1 or names:
            if not queue:
                return None
            p = queue.pop(0)
            if isinstance(p, str):
                if p not in names:
                    return None
                names.remove(p)
                group.append(p)
            elif coef % p == 0:
                coef //= p
                group.append(p)
            elif p % coef == 0 and not names:
                group.append(coef)
                queue.insert(0, p // coef)
                coef = 1
            else:
                return None
        groups.append(group or [1])
    if any(d != 1 for d in queue):
        return None
    if groups:
        groups[-1] += queue
    return [_merge_ints(g) for g in groups]


def _merge_ints(group: list[Dim]) -> list[Dim]:
    """Consecutive ints of a group as one dim (their product): only a named dim must stay apart."""
    out: list[Dim] = []
    for d in group:
        if isinstance(d, int) and out and isinstance(out[-1], int):
            out[-1] *= d
        elif d != 1:
            out.append(d)
    return out or [1]
