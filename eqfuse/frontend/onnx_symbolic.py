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
  logical one; Gemm, MatMul, Gather, Shape and Reshape (usually back) read it.

Whatever cannot be represented raises Unsupported, which names the node; a result is never
guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from eqfuse.frontend.onnx_checks import tensor_array
from eqfuse.frontend.onnx_import import Unsupported
from eqfuse.ir.shapes import Dim


@dataclass(frozen=True)
class Prod:
    """coef * the product of names (sorted), e.g. batch*16; never a plain int or one name."""

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
    if not names:
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
        raise Unsupported(f"named dim {name} that no input carries")
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
    return imp.op("reshape", [out], shape=()) if v.scalar else out


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
        raise Unsupported(f"Range up to {n} (a product of named dims)")
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
    if sum(1 for d in out if not is_sym(d) and d == -1) > 1:
        raise ValueError(f"shape {fmt(spec)} has more than one -1")
    if any(not is_sym(d) and d == -1 for d in out):
        k = next(i for i, d in enumerate(out) if not is_sym(d) and d == -1)
        fill = divide(total, product(d for i, d in enumerate(out) if i != k))
        if fill is None and not is_sym(total) and not any(is_sym(d) for d in out):
            raise ValueError(f"cannot reshape {fmt(cur)} to {fmt(spec)}")
        if fill is None:
            raise Unsupported(f"reshape of {fmt(cur)} to {fmt(spec)} (the -1 is no product of named dims and ints)")
        out[k] = fill
    elif product(out) != total:
        raise ValueError(f"cannot reshape {fmt(cur)} to {fmt(spec)}")
    if not any(isinstance(d, Prod) for d in out):
        return _plain_reshape(imp, node, phys, tuple(out))
    groups = _regroup(phys, out)
    if groups is None:
        raise Unsupported(f"reshape of {fmt(cur)} to {fmt(out)} (a named dim split "
                          "or merged out of order; bind it with dims=)")
    flat = tuple(d for g in groups for d in g)
    return merged(_plain_reshape(imp, node, phys, flat), groups)


def _plain_reshape(imp, node: int, phys, out: tuple[Dim, ...]) -> int:
    names_in = sorted(d for d in phys if isinstance(d, str))
    names_out = sorted(d for d in out if isinstance(d, str))
    if names_in != names_out or (len(names_out) > 1 and tuple(out) != tuple(phys)):
        raise Unsupported(f"reshape of {fmt(phys)} to {fmt(out)} (named dims; bind them with dims=)")
    return imp.reshape_to(node, out)


def _regroup(phys: list[Dim], out: list[SymDim]) -> list[list[Dim]] | None:
    """Physical dims for each target dim: consecutive runs of `phys` (ints split when they must),
    so that row-major order is kept; None when the target does not line up with them."""
    queue, groups = list(phys), []
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


# ---------------------------------------------------------------- ops on Merged tensors


def merged_op(imp, ins, at):
    """The ops a Merged tensor may flow through; anything else is an error naming its shape."""
    op = imp.node.op_type
    m = next(v for v in ins if isinstance(v, Merged))
    if op in ("Identity", "Dropout"):
        return ins[0]
    if op == "Shape":
        s = m.shape[slice(at.get("start", 0), at.get("end"))]
        return sym(s)
    if op == "Reshape" and ins[0] is m and not isinstance(ins[1], Merged):
        spec = list(at["shape"]) if "shape" in at else entries(ins[1], "shape")[0]
        return reshape(imp, m, spec, bool(at.get("allowzero", 0)))
    if op == "Flatten" and ins[0] is m:
        shape, axis = m.shape, at.get("axis", 1)
        axis = axis + len(shape) if axis < 0 else axis
        return reshape(imp, m, [product(shape[:axis]), product(shape[axis:])])
    if op in ("Gemm", "MatMul") and ins[0] is m and all(not isinstance(v, Merged) for v in ins[1:]):
        if at.get("transA", 0) or len(m.groups[-1]) != 1:
            raise Unsupported(f"{op} contracting a dim made of a named dim ({m})")
        from eqfuse.frontend.onnx_import import HANDLERS

        y = HANDLERS[op][0](imp, [m.node] + list(ins[1:]), at)
        return merged(y, m.groups[:-1] + ((imp.type(y).shape[-1],),))
    if op == "MatMul" and all(isinstance(v, Merged) for v in ins):
        a, b = ins
        if a.groups[:-2] != b.groups[:-2] or any(len(g) != 1 for g in a.groups[-2:] + b.groups[-2:]):
            raise Unsupported(f"MatMul of tensors of shapes {a} and {b}")
        y = imp.op("matmul", [a.node, b.node])
        return merged(y, a.groups[:-2] + a.groups[-2:-1] + b.groups[-1:])
    if op == "Transpose":
        rank = len(m.groups)
        perm = list(at.get("perm", range(rank - 1, -1, -1)))
        starts = [sum(len(g) for g in m.groups[:k]) for k in range(rank)]
        phys = [starts[p] + j for p in perm for j in range(len(m.groups[p]))]
        y = m.node if phys == sorted(phys) else imp.op("transpose", [m.node], perm=tuple(phys))
        return merged(y, [m.groups[p] for p in perm])
    if op == "Cast" and ins[0] is m:
        from eqfuse.frontend.onnx_import import HANDLERS

        return merged(HANDLERS[op][0](imp, [m.node], at), m.groups)
    if op == "Gather" and ins[0] is m and not isinstance(ins[1], (Merged, Sym)):
        return gather(imp, m, ins[1], at.get("axis", 0))
    raise Unsupported(f"{op} of a tensor of shape {m} (a named dim multiplied with others; bind it with dims=)")


def gather(imp, m: Merged, index, axis: int):
    """Gather along logical axis of a Merged table: along one physical axis when the logical one
    is a single dim; else the flat index i splits into (i // G, i % G) over the group's trailing
    ints G, and a gather then gather_elements read the physical element."""
    rank = len(m.groups)
    axis %= rank
    idx = imp.data(index, imp.node.input[1])
    ishape = tuple(imp.type(idx).shape)
    pos = sum(len(g) for g in m.groups[:axis])
    group = m.groups[axis]
    if len(group) == 1:
        y = imp.op("gather", [m.node, idx], axis=pos)
        return merged(y, m.groups[:axis] + tuple((d,) for d in ishape) + m.groups[axis + 1:])
    tail = group[1:]
    if not all(isinstance(d, int) for d in tail) or imp.type(idx).dtype not in ("i64", "i32"):
        raise Unsupported(f"Gather along dim {product(group)} of a tensor of shape {m}")
    G = math.prod(tail)
    q, r = _floordiv(imp, idx, G)
    pre = tuple(d for g in m.groups[:axis] for d in g)
    post = tuple(d for g in m.groups[axis + 1:] for d in g)
    y = imp.op("gather", [m.node, q], axis=pos)  # pre + ishape + tail + post
    at = pos + len(ishape)
    for k, g in enumerate(tail):
        inner = tail[k + 1:]
        stride = math.prod(inner)
        rk = r if stride == 1 else _floordiv(imp, r, stride)[0]
        if k + 1 < len(tail):
            r = imp.op("sub", [r, imp.op("mul", [rk, imp.const(stride)])])
        e = imp.reshape_to(rk, ishape + (1,) * (1 + len(inner) + len(post)))
        e = broadcast_to(imp, e, list(pre + ishape + (1,) + inner + post))
        y = imp.op("gather_elements", [y, e], axis=at)
        y = imp.reshape_to(y, pre + ishape + inner + post)
    return merged(y, m.groups[:axis] + tuple((d,) for d in ishape) + m.groups[axis + 1:])


def _floordiv(imp, i: int, G: int) -> tuple[int, int]:
    """(i // G, i % G) of an integer tensor, floored as Python does (a negative flat index counts
    from the end). The IR has no integer division: (i + 0.5) / G in float32 is at least 0.5 / G
    away from an integer, so truncating and correcting below zero is exact for |i| < 2^22."""
    dt = imp.type(i).dtype
    f = imp.op("div", [imp.op("add", [imp.op("cast", [i], to="f32"), imp.const(0.5)]), imp.const(G)])
    t = imp.op("cast", [f], to=dt)
    below = imp.op("cast", [imp.op("lt", [f, imp.op("cast", [t], to="f32")])], to=dt)
    q = imp.op("sub", [t, below])
    return q, imp.op("sub", [i, imp.op("mul", [q, imp.const(G)])])


# ---------------------------------------------------------------- ops on Sym values

_CMP = {"Equal": lambda a, b: a == b, "Less": lambda a, b: a < b, "Greater": lambda a, b: a > b,
        "LessOrEqual": lambda a, b: a <= b, "GreaterOrEqual": lambda a, b: a >= b}


def _arith(op: str, a: SymDim, b: SymDim):
    """One entry of Mul/Div/Add/Sub; None when the result is no SymDim (batch + 1, batch / 3)."""
    if not is_sym(a) and not is_sym(b):
        a, b = int(a), int(b)
        return {"Mul": a * b, "Add": a + b, "Sub": a - b, "Div": a // b if b and a % b == 0 else None}[op]
    if op == "Mul":
        return product([a, b])
    if op == "Div":
        return divide(a, b)
    if op in ("Add", "Sub") and not is_sym(b) and int(b) == 0:
        return a
    if op == "Add" and not is_sym(a) and int(a) == 0:
        return b
    return None


def _compare(op: str, a: SymDim, b: SymDim):
    """A comparison known from dims being positive (batch == -1 is false), else None."""
    if not is_sym(a) and not is_sym(b):
        return _CMP[op](int(a), int(b))
    if a == b:
        return op in ("Equal", "LessOrEqual", "GreaterOrEqual")
    if is_sym(a) and is_sym(b):
        return None
    sym_first = is_sym(a)
    v = int(b if sym_first else a)
    if v >= 1:
        return None  # batch == 16 is not known at import time
    lo = {"Equal": False, "Less": False, "LessOrEqual": False, "Greater": True, "GreaterOrEqual": True}
    hi = {"Equal": False, "Less": True, "LessOrEqual": True, "Greater": False, "GreaterOrEqual": False}
    return (lo if sym_first else hi)[op]


def _zip(ins, what):
    (a, sa), (b, sb) = entries(ins[0], what), entries(ins[1], what)
    n = max(len(a), len(b))
    if len(a) not in (1, n) or len(b) not in (1, n):
        raise ValueError(f"cannot broadcast {len(a)} with {len(b)} entries")
    return [(a[k % len(a)], b[k % len(b)]) for k in range(n)], sa and sb


def sym_op(imp, ins, at):
    """The node's outputs with a Sym among its inputs, or None: then the importer computes the
    Sym at run time (materialize) and imports the node as ops."""
    op = imp.node.op_type
    v = ins[0]
    # a Sym read as a shape, by an op over data
    if op == "Reshape" and isinstance(ins[1], Sym):
        return reshape(imp, imp.data(v, imp.node.input[0]) if not isinstance(v, Merged) else v,
                       list(ins[1].vals), bool(at.get("allowzero", 0)))
    if op == "Expand" and isinstance(ins[1], Sym) and not isinstance(v, (Sym, Merged)):
        return broadcast_to(imp, imp.data(v, imp.node.input[0]), list(ins[1].vals))
    if op == "ConstantOfShape" and isinstance(v, Sym):
        value = at.get("value")
        arr = np.zeros((), np.float32) if value is None else tensor_array(value, "the value of ConstantOfShape").reshape(())
        return broadcast_to(imp, imp.data(arr) if arr.dtype.kind == "f" else _int_scalar(imp, arr), list(v.vals))
    if op == "Range" and isinstance(ins[1], Sym):
        if not (imp.is_const(ins[0]) and imp.is_const(ins[2])):
            raise Unsupported(f"Range up to {ins[1]} from a start or with a step not known at import time")
        if np.asarray(ins[0]).ndim or np.asarray(ins[2]).ndim or not ins[1].scalar:
            raise ValueError("Range needs scalar start, limit and delta")
        start, delta = int(np.asarray(ins[0])), int(np.asarray(ins[2]))
        if start != 0 or delta != 1:
            raise Unsupported(f"Range({start}, {ins[1]}, {delta}) (only Range(0, n, 1) up to a named dim)")
        return arange(imp, ins[1].vals[0], "i64" if np.asarray(ins[0]).dtype != np.int32 else "i32")
    # Dropout, Identity and Cast pass a Sym on; every other op folds only over Syms and constants
    if op in ("Identity", "Dropout"):
        return v
    if any(x is not None and not isinstance(x, Sym) and not imp.is_const(x) for x in ins):
        return None
    if op == "Cast":
        return v if isinstance(v, Sym) and at.get("to") in (6, 7) else None
    if op == "Shape" and isinstance(v, Sym):
        return np.asarray([len(v.vals)] if not v.scalar else [], np.int64)[slice(at.get("start", 0), at.get("end"))]
    if op == "Gather" and isinstance(v, Sym) and not isinstance(ins[1], Sym):
        idx = np.asarray(ins[1]).astype(np.int64)
        if not all(-len(v.vals) <= i < len(v.vals) for i in idx.reshape(-1)):
            raise ValueError(f"index {idx.tolist()} out of range for {len(v.vals)} entries")
        picked = [v.vals[int(i)] for i in idx.reshape(-1)]
        return sym(picked, idx.ndim == 0) if idx.ndim <= 1 else None
    if op == "Slice" and isinstance(v, Sym) and all(not isinstance(x, Sym) for x in ins[1:]):
        lo, hi = int(np.asarray(ins[1]).reshape(-1)[0]), int(np.asarray(ins[2]).reshape(-1)[0])
        step = int(np.asarray(ins[4]).reshape(-1)[0]) if len(ins) > 4 and ins[4] is not None else 1
        return sym(v.vals[lo:hi:step], False)
    if op in ("Unsqueeze", "Squeeze") and isinstance(v, Sym):
        axes = list(at["axes"]) if "axes" in at else (entries(ins[1], "axes")[0] if len(ins) > 1 and ins[1] is not None else None)
        if op == "Unsqueeze" and v.scalar and axes in ([0], [-1]):
            return Sym(v.vals)
        if op == "Squeeze" and not v.scalar and len(v.vals) == 1 and axes in (None, [0], [-1]):
            return Sym(v.vals, True)
        return None
    if op == "Concat" and all(isinstance(x, Sym) or np.asarray(x).ndim == 1 for x in ins):
        return sym([d for x in ins for d in entries(x, "a Concat input")[0]])
    if op == "Reshape" and isinstance(v, Sym):
        spec = list(at["shape"]) if "shape" in at else entries(ins[1], "shape")[0]
        if isinstance(ins[1], Sym) or len(spec) > 1:
            return None
        return Sym(v.vals, True) if not spec and len(v.vals) == 1 else Sym(v.vals)
    if op in ("Mul", "Div", "Add", "Sub") and not any(isinstance(x, Merged) for x in ins):
        if any(not isinstance(x, Sym) and np.asarray(x).dtype.kind not in "iu" for x in ins):
            return None
        pairs, scalar = _zip(ins, op)
        out = [_arith(op, a, b) for a, b in pairs]
        return None if any(o is None for o in out) else sym(out, scalar)
    if op in _CMP:
        pairs, scalar = _zip(ins, op)
        out = [_compare(op, a, b) for a, b in pairs]
        if any(o is None for o in out):
            return None
        arr = np.asarray(out, bool)
        return arr.reshape(()) if scalar else arr
    if op == "Where" and not isinstance(ins[0], Sym) and all(not isinstance(x, Merged) for x in ins):
        cond = np.asarray(ins[0])
        if cond.ndim > 1:
            return None
        (a, _), (b, _) = entries(ins[1], "Where"), entries(ins[2], "Where")
        n = max(len(a), len(b), cond.size)
        c = np.broadcast_to(cond.reshape(-1), (n,))
        return sym([a[k % len(a)] if c[k] else b[k % len(b)] for k in range(n)], cond.ndim == 0 and len(a) == len(b) == 1)
    return None


def _int_scalar(imp, arr: np.ndarray) -> int:
    """An integer or bool scalar as a node of its dtype (a weak const would compute in float)."""
    one = imp.new_param("fill", arr.reshape(1))
    return imp.op("reshape", [one], shape=())
