"""The op table, continued: masks, indices and the other ops that exported models write.

Comparisons, logical ops, where and cast are pointwise (they fuse into float kernels, which
read the mask or the integers directly); gather, cumsum, argmax, pooling and the like are
kernels of the "index" kind (eqfuse/backend/kinds/index.py). squeeze, unsqueeze and flatten are
reshapes: `canonical` rewrites them so that no later stage sees them.
"""

from __future__ import annotations

import numpy as np

from eqfuse.errors import ShapeError
from eqfuse.ir.ops import (
    F32,
    OPS,
    Attr,
    bcast_infer,
    define,
    pair,
    reduce_axes,
    reduce_infer,
    same_infer,
)
from eqfuse.ir.shapes import NUMPY_DTYPE, TType, broadcast, fmt, norm_axis

_DTYPES = tuple(NUMPY_DTYPE)

# ---------------------------------------------------------------- pointwise: masks and casts

_COMPARE = [("eq", np.equal, "=="), ("ne", np.not_equal, "!="), ("lt", np.less, "<"),
            ("le", np.less_equal, "<="), ("gt", np.greater, ">"), ("ge", np.greater_equal, ">=")]
for _name, _ufunc, _sym in _COMPARE:
    define(name=_name, kind="pointwise", arity=(2, 2), infer=bcast_infer, dtype="compare", infix=_sym,
        numpy=(lambda u: lambda a, _: u(a[0], a[1]))(_ufunc), c="((" + "{0}) " + _sym + " ({1}))")

define(name="logical_and", kind="pointwise", arity=(2, 2), infer=bcast_infer, dtype="logical",
    numpy=lambda a, _: np.logical_and(a[0], a[1]), c="(({0}) && ({1}))")
define(name="logical_or", kind="pointwise", arity=(2, 2), infer=bcast_infer, dtype="logical",
    numpy=lambda a, _: np.logical_or(a[0], a[1]), c="(({0}) || ({1}))")
define(name="logical_not", kind="pointwise", arity=(1, 1), infer=same_infer, dtype="logical",
    numpy=lambda a, _: np.logical_not(a[0]), c="(!({0}))")
define(name="isnan", kind="pointwise", arity=(1, 1), infer=same_infer, dtype="compare",
    numpy=lambda a, _: np.isnan(a[0]), c="(({0}) != ({0}))")
define(name="where", kind="pointwise", arity=(3, 3), infer=bcast_infer, dtype="where",
    numpy=lambda a, _: np.where(a[0], a[1], a[2]), c="(({0}) ? ({1}) : ({2}))")

_CAST_C = {"f32": "((float)({0}))", "i64": "((int64_t)({0}))", "i32": "((int32_t)({0}))", "bool": "(({0}) != 0)",
           "u8": "((uint8_t)({0}))", "i8": "((int8_t)({0}))"}
define(name="cast", kind="pointwise", arity=(1, 1), infer=same_infer, dtype="cast",
    attrs=(Attr("to", "str", choices=_DTYPES),),
    numpy=lambda a, at: np.asarray(a[0]).astype(NUMPY_DTYPE[at["to"]]), c=lambda at: _CAST_C[at["to"]])


def _expand_infer(ts, attrs):
    return TType(broadcast(ts[0].shape, tuple(attrs["shape"])))


# expand is a broadcast read: the identity of its operand, read at the output's index.
define(name="expand", kind="pointwise", arity=(1, 1), infer=_expand_infer, dtype="any", attrs=(Attr("shape", "ints"),),
    numpy=lambda a, at: np.broadcast_to(a[0], broadcast(a[0].shape, tuple(at["shape"]))), c="({0})", flops=0)

# NaN passes through as in numpy: each comparison is false for NaN and the operand is returned.
define(name="clip", kind="pointwise", arity=(1, 1), infer=same_infer, dtype="numeric",
    attrs=(Attr("min", "float", None), Attr("max", "float", None)),
    numpy=lambda a, at: _clip_np(a[0], at), c=lambda at: _clip_c(at))
define(name="leaky_relu", kind="pointwise", arity=(1, 1), infer=same_infer, attrs=(Attr("alpha", "float", 0.01),),
    numpy=lambda a, at: np.where(a[0] >= 0, a[0], a[0] * F32(at["alpha"])),
    c=lambda at: "(({0}) >= 0 ? ({0}) : " + f"{_f(at['alpha'])} * ({{0}}))")
define(name="hard_sigmoid", kind="pointwise", arity=(1, 1), infer=same_infer,
    attrs=(Attr("alpha", "float", 0.2), Attr("beta", "float", 0.5)),
    numpy=lambda a, at: np.clip(a[0] * F32(at["alpha"]) + F32(at["beta"]), 0, 1),
    c=lambda at: f"eqf_hard_sigmoid({{0}}, {_f(at['alpha'])}, {_f(at['beta'])})", flops=3)
define(name="hard_swish", kind="pointwise", arity=(1, 1), infer=same_infer,
    numpy=lambda a, _: a[0] * np.clip(a[0] * F32(1 / 6) + F32(0.5), 0, 1),
    c="(({0}) * eqf_hard_sigmoid({0}, 0.16666667f, 0.5f))", flops=4)
define(name="softplus", kind="pointwise", arity=(1, 1), infer=same_infer, numpy=lambda a, _: np.logaddexp(F32(0), a[0]),
    c="eqf_softplus({0})", flops=5)


def _f(v: float) -> str:
    from eqfuse.ir.ops import flit

    return flit(v)


def _clip_np(x, at):
    lo, hi = at["min"], at["max"]
    out = x
    if lo is not None:
        out = np.where(out < lo, np.asarray(lo).astype(x.dtype), out)
    if hi is not None:
        out = np.where(out > hi, np.asarray(hi).astype(x.dtype), out)
    return out


def _clip_c(at):
    e = "({0})"
    if at["min"] is not None:
        e = f"(({e}) < {_f(at['min'])} ? {_f(at['min'])} : ({e}))"
    if at["max"] is not None:
        e = f"(({e}) > {_f(at['max'])} ? {_f(at['max'])} : ({e}))"
    return e


# ---------------------------------------------------------------- reductions

define(name="min", kind="reduce", arity=(1, 1), infer=reduce_infer, dtype="numeric",
    attrs=(Attr("axis", "axes", None), Attr("keepdims", "bool", False)),
    numpy=lambda a, at: np.min(a[0], axis=reduce_axes(at, a[0].ndim), keepdims=at["keepdims"]))
define(name="prod", kind="reduce", arity=(1, 1), infer=reduce_infer, dtype="numeric",
    attrs=(Attr("axis", "axes", None), Attr("keepdims", "bool", False)),
    numpy=lambda a, at: np.prod(a[0], axis=reduce_axes(at, a[0].ndim), keepdims=at["keepdims"]))

# ---------------------------------------------------------------- index kernels


def _gather_infer(ts, attrs):
    data, idx = ts
    if data.rank < 1:
        raise ShapeError("gather needs data of rank >= 1")
    ax = norm_axis(attrs["axis"], data.rank)
    return TType(data.shape[:ax] + idx.shape + data.shape[ax + 1:])


def _taking(take):
    """numpy of a gather: negative indices count from the end of the axis, as in ONNX."""
    def run(a, at):
        data, idx = a
        ax = at["axis"] % data.ndim
        return take(data, np.where(idx < 0, idx + data.shape[ax], idx), axis=ax)
    return run


define(name="gather", kind="index", arity=(2, 2), infer=_gather_infer, dtype="gather",
    attrs=(Attr("axis", "int", 0),), numpy=_taking(np.take))


def _gather_el_infer(ts, attrs):
    data, idx = ts
    norm_axis(attrs["axis"], data.rank)
    if idx.rank != data.rank:
        raise ShapeError(f"gather_elements needs indices of the data's rank, got {fmt(idx.shape)} for {fmt(data.shape)}")
    return TType(idx.shape)


define(name="gather_elements", kind="index", arity=(2, 2), infer=_gather_el_infer, dtype="gather",
    attrs=(Attr("axis", "int", 0),), numpy=_taking(np.take_along_axis))


def _scatter_infer(ts, attrs):
    x, idx, upd = ts
    if x.rank < 1:
        raise ShapeError("scatter_add needs x of rank >= 1")
    ax = norm_axis(attrs["axis"], x.rank)
    want = x.shape[:ax] + idx.shape + x.shape[ax + 1:]
    if tuple(upd.shape) != tuple(want):
        raise ShapeError(f"scatter_add updates must have shape {fmt(want)} (what gather would read), got {fmt(upd.shape)}")
    if upd.dtype != x.dtype and not (upd.rank == 0):
        raise ShapeError(f"scatter_add mixes dtypes {x.dtype} and {upd.dtype}")
    return TType(x.shape)


def _scatter_np(a, at):
    x, idx, upd = a
    ax = at["axis"] % x.ndim
    out = np.array(x, copy=True)
    moved = np.moveaxis(out, ax, 0)  # a view: adding into it adds into out
    upd = np.moveaxis(upd.reshape(x.shape[:ax] + (idx.size,) + x.shape[ax + 1:]), ax, 0)
    np.add.at(moved, np.where(idx < 0, idx + x.shape[ax], idx).reshape(-1), upd)
    return out


# the inverse of gather: x with each slice of updates added at its index along axis= (repeated
# indices add up); the gradient of gather with respect to its data
define(name="scatter_add", kind="index", arity=(3, 3), infer=_scatter_infer, dtype="gather",
    attrs=(Attr("axis", "int", 0),), numpy=_scatter_np)


def _axis_same(ts, attrs):
    norm_axis(attrs["axis"], ts[0].rank)
    return TType(ts[0].shape)


def _cumsum_np(a, at):
    x = a[0]
    ax = at["axis"] % x.ndim
    if at["reverse"]:
        x = np.flip(x, ax)
    out = np.cumsum(x, axis=ax, dtype=x.dtype)
    if at["exclusive"]:
        out = out - x
    return np.flip(out, ax) if at["reverse"] else out


define(name="cumsum", kind="index", arity=(1, 1), infer=_axis_same, dtype="numeric",
    attrs=(Attr("axis", "int"), Attr("exclusive", "bool", False), Attr("reverse", "bool", False)),
    numpy=_cumsum_np)


def _argmax_infer(ts, attrs):
    x = ts[0]
    ax = norm_axis(attrs["axis"], x.rank)
    if attrs["keepdims"]:
        return TType(x.shape[:ax] + (1,) + x.shape[ax + 1:])
    return TType(x.shape[:ax] + x.shape[ax + 1:])


define(name="argmax", kind="index", arity=(1, 1), infer=_argmax_infer, dtype="index",
    attrs=(Attr("axis", "int", 0), Attr("keepdims", "bool", False)),
    numpy=lambda a, at: np.argmax(a[0], axis=at["axis"], keepdims=at["keepdims"]))


def _topk_infer(ts, attrs):
    x = ts[0]
    ax = norm_axis(attrs["axis"], x.rank)
    n = x.shape[ax]
    if attrs["k"] < 1 or (isinstance(n, int) and attrs["k"] > n):
        raise ShapeError(f"topk: k={attrs['k']} is not in 1..{x.shape[ax]} (the length of axis {ax})")
    return TType(x.shape[:ax] + (attrs["k"],) + x.shape[ax + 1:])


def topk_order(x: np.ndarray, largest: bool) -> np.ndarray:
    """The order topk takes the elements of x along its last axis in: the largest first (largest=
    false: the smallest first), NaN above every number, equal values in the order of their index."""
    nan = np.isnan(x) if x.dtype.kind == "f" else np.zeros(x.shape, bool)
    if largest:  # (np.lexsort is stable and sorts by its last key first)
        return np.lexsort((-np.where(nan, 0, x), ~nan), axis=-1)
    return np.lexsort((np.where(nan, 0, x), nan), axis=-1)


def _topk_np(a, at):
    x = np.moveaxis(a[0], at["axis"], -1)
    order = topk_order(x, at["largest"])[..., :at["k"]]
    out = order.astype(np.int64) if at["indices"] else np.take_along_axis(x, order, -1)
    return np.moveaxis(out, -1, at["axis"])


define(name="topk", kind="index", arity=(1, 1), infer=_topk_infer, dtype="topk",
    attrs=(Attr("k", "int"), Attr("axis", "int", -1), Attr("largest", "bool", True), Attr("indices", "bool", False)),
    numpy=_topk_np)


def _range_infer(ts, attrs):
    if attrs["step"] == 0:
        raise ShapeError("range step must not be 0")
    n = len(range(attrs["start"], attrs["stop"], attrs["step"]))
    if n <= 0:
        raise ShapeError(f"range({attrs['start']}, {attrs['stop']}, {attrs['step']}) is empty")
    return TType((n,))


# range: position ids and the like, computed by a kernel with no inputs
define(name="range", kind="index", arity=(0, 0), infer=_range_infer, dtype="dtype_attr",
    attrs=(Attr("start", "int", 0), Attr("stop", "int"), Attr("step", "int", 1),
           Attr("dtype", "str", "i64", choices=("i64", "i32", "f32"))),
    numpy=lambda a, at: np.arange(at["start"], at["stop"], at["step"]).astype(NUMPY_DTYPE[at["dtype"]]))


def _tri_np(fn):
    return lambda a, at: fn(a[0], k=at["k"])


for _name, _fn in (("tril", np.tril), ("triu", np.triu)):
    define(name=_name, kind="index", arity=(1, 1), dtype="any", attrs=(Attr("k", "int", 0),),
        infer=lambda ts, at: _need_rank(ts[0], 2, "tril/triu"), numpy=_tri_np(_fn))


def _need_rank(t: TType, r: int, name: str) -> TType:
    if t.rank < r:
        raise ShapeError(f"{name} needs rank >= {r}, got {fmt(t.shape)}")
    return TType(t.shape)


def _pad_infer(ts, attrs):
    x, pads = ts[0], attrs["pads"]
    if len(pads) != 2 * x.rank or min(pads) < 0:
        raise ShapeError(f"pad needs {2 * x.rank} non-negative pads (begins, then ends), got {list(pads)}")
    out = []
    for d, lo, hi in zip(x.shape, pads[:x.rank], pads[x.rank:]):
        if not isinstance(d, int) and (lo or hi):
            raise ShapeError(f"pad of named dimension {d}")
        out.append(d + lo + hi if isinstance(d, int) else d)
    return TType(tuple(out))


define(name="pad", kind="index", arity=(1, 1), infer=_pad_infer, dtype="any",
    attrs=(Attr("pads", "ints"), Attr("value", "float", 0.0)),
    numpy=lambda a, at: np.pad(a[0], list(zip(at["pads"][:a[0].ndim], at["pads"][a[0].ndim:])),
                               constant_values=at["value"]))


def _pool_infer(ts, attrs):
    x = ts[0]
    if x.rank != 4:
        raise ShapeError(f"pooling needs NCHW input (rank 4), got {fmt(x.shape)}")
    (kh, kw), (sh, sw), (ph, pw) = pair(attrs["kernel_size"]), pair(attrs["stride"] or attrs["kernel_size"]), pair(attrs["padding"])
    if not all(isinstance(d, int) for d in x.shape[2:]):
        raise ShapeError("pooling needs concrete spatial dimensions")
    oh, ow = (x.shape[2] + 2 * ph - kh) // sh + 1, (x.shape[3] + 2 * pw - kw) // sw + 1
    if oh <= 0 or ow <= 0 or ph >= kh or pw >= kw:
        raise ShapeError(f"pooling window {kh}x{kw} with padding {ph},{pw} does not fit {fmt(x.shape)}")
    return TType((x.shape[0], x.shape[1], oh, ow))


def pool_numpy(x, at, kind: str):
    (kh, kw), (sh, sw), (ph, pw) = pair(at["kernel_size"]), pair(at["stride"] or at["kernel_size"]), pair(at["padding"])
    # (a max pool's padding is never a window's max: -inf, or the least of an integer dtype; every
    # window holds a tap of x, as padding < kernel_size)
    pad = (np.iinfo(x.dtype).min if np.issubdtype(x.dtype, np.integer) else -np.inf) if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=pad)
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]
    if kind == "max":
        return win.max(axis=(4, 5))
    if at["count_include_pad"]:
        return win.mean(axis=(4, 5))
    ones = np.pad(np.ones(x.shape[2:], np.float32), ((ph, ph), (pw, pw)))
    cnt = np.lib.stride_tricks.sliding_window_view(ones, (kh, kw))[::sh, ::sw].sum(axis=(2, 3))
    return win.sum(axis=(4, 5)) / cnt


_POOL = (Attr("kernel_size", "int_or_ints"), Attr("stride", "int_or_ints", None), Attr("padding", "int_or_ints", 0))
define(name="max_pool2d", kind="index", arity=(1, 1), infer=_pool_infer, dtype="max_pool", attrs=_POOL,
    numpy=lambda a, at: pool_numpy(a[0], at, "max"))
define(name="avg_pool2d", kind="index", arity=(1, 1), infer=_pool_infer,
    attrs=_POOL + (Attr("count_include_pad", "bool", False),), numpy=lambda a, at: pool_numpy(a[0], at, "avg"))



def _pool_grad_infer(ts, attrs):
    x, dy = ts
    want = _pool_infer([x], attrs).shape
    if tuple(dy.shape) != tuple(want):
        raise ShapeError(f"pool2d_grad needs the gradient of the pooled shape {fmt(want)}, got {fmt(dy.shape)}")
    return TType(x.shape)


def pool_grad_numpy(x, dy, at):
    """The vector-Jacobian product of max_pool2d (mode="max": each window's dy goes to its first
    largest element, the first NaN if any, as torch's backward does) or avg_pool2d (mode="avg":
    spread evenly over the window's elements counted in its mean)."""
    (kh, kw), (sh, sw), (ph, pw) = pair(at["kernel_size"]), pair(at["stride"] or at["kernel_size"]), pair(at["padding"])
    N, C, H, W = x.shape
    OH, OW = dy.shape[2:]
    dxp = np.zeros((N, C, H + 2 * ph, W + 2 * pw), dtype=dy.dtype)
    real = np.pad(np.ones((H, W), bool), ((ph, ph), (pw, pw)))
    if at["mode"] == "max":
        xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=-np.inf)
        win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]
        rwin = np.lib.stride_tricks.sliding_window_view(real, (kh, kw))[::sh, ::sw].reshape(OH, OW, kh * kw)
        flat = np.where(rwin, win.reshape(N, C, OH, OW, kh * kw), -np.inf)
        arg = np.argmax(flat, axis=-1)
        # a window whose cells are all -inf: its first cell inside the image (as the C does)
        first = np.argmax(rwin, axis=-1)
        arg = np.where(np.take_along_axis(rwin[None, None], arg[..., None], -1)[..., 0], arg, first[None, None])
        n, c, oh, ow = np.indices(arg.shape)
        np.add.at(dxp, (n, c, oh * sh + arg // kw, ow * sw + arg % kw), dy)
    else:
        cnt = (np.full((OH, OW), kh * kw, dy.dtype) if at["count_include_pad"] else
               np.lib.stride_tricks.sliding_window_view(real, (kh, kw))[::sh, ::sw].sum(axis=(2, 3)).astype(dy.dtype))
        share = dy / cnt
        for dh in range(kh):
            for dw in range(kw):
                dxp[:, :, dh:dh + sh * OH:sh, dw:dw + sw * OW:sw] += share
    return dxp[:, :, ph:ph + H, pw:pw + W]


# the gradient of max_pool2d and avg_pool2d with respect to x (eqfuse/grad/derivatives.rw)
define(name="pool2d_grad", kind="index", arity=(2, 2), infer=_pool_grad_infer,
    attrs=(Attr("mode", "str", choices=("max", "avg")),) + _POOL + (Attr("count_include_pad", "bool", False),),
    numpy=lambda a, at: pool_grad_numpy(a[0], a[1], at))


def _scatter_el_infer(ts, attrs):
    x, idx, upd = ts
    norm_axis(attrs["axis"], x.rank)
    if idx.rank != x.rank or tuple(upd.shape) != tuple(idx.shape):
        raise ShapeError(f"scatter_elements_add needs indices and updates of one shape and x's rank, got "
                         f"{fmt(idx.shape)} and {fmt(upd.shape)} for {fmt(x.shape)}")
    if upd.dtype != x.dtype:
        raise ShapeError(f"scatter_elements_add mixes dtypes {x.dtype} and {upd.dtype}")
    return TType(x.shape)


def _scatter_el_np(a, at):
    x, idx, upd = a
    ax = at["axis"] % x.ndim
    out = np.array(x, copy=True)
    pos = list(np.indices(idx.shape))
    pos[ax] = np.where(idx < 0, idx + x.shape[ax], idx)
    np.add.at(out, tuple(pos), upd)
    return out


# the inverse of gather_elements: x with each element of updates added at its index along axis=
# (repeated indices add up); the gradient of gather_elements with respect to its data
define(name="scatter_elements_add", kind="index", arity=(3, 3), infer=_scatter_el_infer, dtype="gather",
    attrs=(Attr("axis", "int", 0),), numpy=_scatter_el_np)

# ---------------------------------------------------------------- reshapes by another name


def _squeeze_shape(t: TType, at) -> tuple:
    axes = at["axis"]
    axes = tuple(i for i, d in enumerate(t.shape) if d == 1) if axes is None else tuple(norm_axis(a, t.rank) for a in axes)
    for a in axes:
        if t.shape[a] != 1:
            raise ShapeError(f"squeeze axis {a} has size {t.shape[a]}, not 1")
    return tuple(d for i, d in enumerate(t.shape) if i not in axes)


def _unsqueeze_shape(t: TType, at) -> tuple:
    rank = t.rank + len(at["axis"])
    axes = sorted(norm_axis(a, rank) for a in at["axis"])
    out, src = [], iter(t.shape)
    for i in range(rank):
        out.append(1 if i in axes else next(src))
    return tuple(out)


def _flatten_shape(t: TType, at) -> tuple:
    ax = at["axis"] + t.rank if at["axis"] < 0 else at["axis"]
    if not 0 <= ax <= t.rank:
        raise ShapeError(f"flatten axis {at['axis']} is out of range for rank {t.rank}")
    lo, hi = t.shape[:ax], t.shape[ax:]
    return (_prod_dim(lo), _prod_dim(hi))


def _prod_dim(ds):
    if not all(isinstance(d, int) for d in ds):
        if len([d for d in ds if d != 1]) == 1:
            return next(d for d in ds if d != 1)
        raise ShapeError(f"flatten of named dimensions {fmt(ds)}")
    return int(np.prod(ds)) if ds else 1


RESHAPES = {"squeeze": _squeeze_shape, "unsqueeze": _unsqueeze_shape, "flatten": _flatten_shape}
for _name, _shape in RESHAPES.items():
    define(name=_name, kind="layout", arity=(1, 1), dtype="any",
        attrs=(Attr("axis", "axes", None),) if _name != "flatten" else (Attr("axis", "int", 1),),
        infer=(lambda f: lambda ts, at: TType(f(ts[0], at)))(_shape),
        numpy=(lambda f, n: lambda a, at: np.reshape(a[0], f(TType(a[0].shape), at)))(_shape, _name))


def canonical(op: str, arg_types: list[TType], attrs: dict) -> tuple[str, dict]:
    """The op the later stages see: squeeze/unsqueeze/flatten become reshape."""
    if op in RESHAPES:
        shape = RESHAPES[op](arg_types[0], attrs)
        if all(isinstance(d, int) for d in shape):
            return "reshape", {"shape": tuple(shape)}
    return op, attrs


INDEX_OPS = tuple(n for n, o in OPS.items() if o.kind == "index")
