"""ATen handlers: each turns one ATen overload of a functional AOTAutograd graph into ops of the
op table (registered into `HANDLERS` below, which eqfuse.frontend.torch_fx reads). A handler gets the converter, then
the node's arguments with every tensor replaced by a `V`; it raises Unsupported for the cases it
does not take (the node then runs in torch). Shapes come from torch (`cv.out_type`), so views
and broadcasts need no shape arithmetic here; dtypes follow torch's promotion, made explicit
with casts, since eqfuse never promotes implicitly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from eqfuse.frontend import pooling

# ---------------------------------------------------------------- pointwise

DTYPES = {torch.float32: "f32", torch.int64: "i64", torch.int32: "i32", torch.bool: "bool"}
TORCH_DTYPES = {v: k for k, v in DTYPES.items()}


class Unsupported(Exception):
    """A node eqfuse cannot compute; the message says why (it is listed in the fallback report)."""


@dataclass(frozen=True)
class V:
    """A tensor value of the graph being built: the id of its node."""

    id: int


class _Empty:
    """The value of a zero-size tensor (a KV cache's empty start, torch.tensor([])): no tensor of
    the graph; cat drops it, a copy passes it on, any other op refuses it (torch_fx)."""

    def __repr__(self) -> str:
        return "a zero-size tensor"


EMPTY = _Empty()

HANDLERS: dict[Any, Callable] = {}


def aten(*names: str):
    """Registers a handler for ATen overloads given as "add.Tensor" (the packet's "default" as "relu")."""
    def deco(fn):
        for name in names:
            packet, _, overload = name.partition(".")
            HANDLERS[getattr(getattr(torch.ops.aten, packet), overload or "default")] = fn
        return fn
    return deco



def _float_unary(name: str):
    return lambda cv, x, *rest, **kw: cv.op(name, cv.cast(x, "f32"))


for _aten, _ours in {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "log": "log",
                     "sqrt": "sqrt", "rsqrt": "rsqrt", "erf": "erf", "silu": "silu", "hardswish": "hard_swish", "sin": "sin", "cos": "cos",
                     "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh",
                     "asinh": "asinh", "acosh": "acosh", "atanh": "atanh", "expm1": "expm1", "log1p": "log1p"}.items():
    aten(_aten)(_float_unary(_ours))


@aten("elu", "celu")
def _elu(cv, x, alpha=1.0, scale=1.0, input_scale=1.0):
    """elu (selu is elu with scale): scale * (x if x > 0 else alpha * (exp(x * input_scale) - 1));
    celu: alpha * (exp(x / alpha) - 1) below 0."""
    x = cv.cast(x, "f32")
    if cv.node.target.__name__.startswith("celu"):
        scale, input_scale = 1.0, 1.0 / alpha
    e = cv.op("expm1", cv.op("mul", x, cv.const(input_scale)) if input_scale != 1 else x)
    y = cv.op("where", cv.op("gt", x, cv.const(0.0)), x, cv.op("mul", e, cv.const(alpha)))
    return y if scale == 1 else cv.op("mul", y, cv.const(scale))


@aten("mish")
def _mish(cv, x):
    x = cv.cast(x, "f32")
    return cv.op("mul", x, cv.op("tanh", cv.op("softplus", x)))


@aten("threshold")
def _threshold(cv, x, threshold, value):
    return cv.op("where", cv.op("gt", x, cv.const(threshold)), x, cv.const(value))


@aten("log_sigmoid_forward")
def _log_sigmoid(cv, x):
    """log(sigmoid(x)) = -softplus(-x); the second output is backward's buffer, not computed."""
    return cv.op("neg", cv.op("softplus", cv.op("neg", x))), None


@aten("round", "trunc", "frac")
def _round(cv, x):
    """round halves to even; trunc toward 0 (the floor of |x| with x's sign); frac is x - trunc(x);
    an integer tensor rounds to itself."""
    name = cv.node.target.__name__.split(".")[0]
    if cv.type(x).dtype in ("i64", "i32") and cv.out_type.dtype == cv.type(x).dtype:
        return x if name != "frac" else cv.op("mul", x, cv.const(0))
    x = cv.cast(x, "f32")
    if name == "round":
        return cv.op("round", x)
    whole = cv.op("where", cv.op("lt", x, cv.const(0.0)), cv.op("ceil", x), cv.op("floor", x))
    return whole if name == "trunc" else cv.op("sub", x, whole)


@aten("sign")
def _sign(cv, x):
    return cv.op("sign", cv.cast(x, cv.out_type.dtype))


@aten("ceil", "floor")
def _ceil_floor(cv, x):
    """torch rounds an integer tensor to itself (its dtype kept); floats round in f32."""
    if cv.type(x).dtype in ("i64", "i32") and cv.out_type.dtype == cv.type(x).dtype:
        return x
    return cv.op(cv.node.target.__name__.split(".")[0], cv.cast(x, "f32"))


@aten("neg", "abs")
def _neg_abs(cv, x):
    return cv.op(cv.node.target.__name__.split(".")[0], cv.cast(x, cv.out_type.dtype))


@aten("reciprocal")
def _reciprocal(cv, x):
    return cv.op("div", 1.0, cv.cast(x, "f32"))


@aten("gelu")
def _gelu(cv, x, approximate="none"):
    return cv.op("gelu", cv.cast(x, "f32"), approximate=approximate)


def _compute_dtype(cv, *args) -> str:
    """torch's promoted dtype of the operands (0-d tensors and numbers count less, as in torch)."""
    probes = []
    for a in args:
        if isinstance(a, V):
            t = cv.type(a)
            probes.append(torch.empty(() if t.rank == 0 else (1,), dtype=TORCH_DTYPES[t.dtype]))
        else:
            probes.append(a)
    dt = probes[0] if len(probes) == 1 else torch.result_type(*probes[:2])
    if len(probes) > 2:
        dt = torch.promote_types(dt, torch.result_type(*probes[1:]))
    return {torch.float32: "f32", torch.int64: "i64", torch.int32: "i32", torch.bool: "bool"}.get(dt) or \
        _raise(f"dtype {dt}")


def _raise(msg: str):
    raise Unsupported(msg)


def _arith(name: str):
    def handler(cv, a, b, alpha=1, rounding_mode=None):
        if rounding_mode is not None:
            raise Unsupported(f"rounding_mode={rounding_mode!r}")
        dt = cv.out_type.dtype
        a, b = cv.cast(a, dt), cv.cast(b, dt)
        if alpha != 1:
            b = cv.op("mul", b, alpha)
        return cv.op(name, a, b)
    return handler


for _names, _ours in ((("add.Tensor", "add.Scalar"), "add"), (("sub.Tensor", "sub.Scalar"), "sub"),
                      (("mul.Tensor", "mul.Scalar"), "mul"), (("div.Tensor", "div.Scalar"), "div"),
                      (("pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar"), "pow"),
                      (("maximum",), "maximum"), (("minimum",), "minimum")):
    aten(*_names)(_arith(_ours))


@aten("remainder.Tensor", "remainder.Scalar", "floor_divide", "floor_divide.Scalar")
def _floor_ops(cv, a, b):
    """torch's remainder takes the divisor's sign and floor_divide rounds down, as numpy's."""
    name = "mod" if cv.node.target.__name__.startswith("remainder") else "floordiv"
    dt = cv.out_type.dtype
    return cv.op(name, cv.cast(a, dt), cv.cast(b, dt))


@aten("div.Tensor_mode", "div.Scalar_mode")
def _div_mode(cv, a, b, rounding_mode=None):
    """a / b rounded down (floor) or toward 0 (trunc)."""
    if rounding_mode is None:
        return _arith("div")(cv, a, b)
    dt = cv.out_type.dtype
    if rounding_mode == "floor":
        return cv.op("floordiv", cv.cast(a, dt), cv.cast(b, dt))
    if rounding_mode != "trunc" or dt != "f32":
        raise Unsupported(f"rounding_mode={rounding_mode!r} of {dt}")
    q = cv.op("div", cv.cast(a, dt), cv.cast(b, dt))
    return cv.op("where", cv.op("lt", q, cv.const(0.0)), cv.op("ceil", q), cv.op("floor", q))


@aten("rsub.Scalar", "rsub.Tensor")
def _rsub(cv, a, b, alpha=1):
    return _arith("sub")(cv, b, a if alpha == 1 else cv.op("mul", cv.cast(a, cv.out_type.dtype), alpha))


def _compare(name: str):
    def handler(cv, a, b):
        dt = _compute_dtype(cv, a, b)
        return cv.op(name, cv.cast(a, dt), cv.cast(b, dt))
    return handler


for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    aten(f"{_n}.Tensor", f"{_n}.Scalar")(_compare(_n))


def _logical(ours: str, bitwise: bool):
    def handler(cv, *args):
        if bitwise and any(isinstance(a, V) and cv.type(a).dtype != "bool" for a in args):
            raise Unsupported("bitwise ops on integers")
        return cv.op(ours, *[cv.cast(a, "bool") for a in args])
    return handler


for _n, _ours in (("and", "logical_and"), ("or", "logical_or")):
    aten(f"bitwise_{_n}.Tensor")(_logical(_ours, True))
    aten(f"logical_{_n}")(_logical(_ours, False))
aten("bitwise_not")(_logical("logical_not", True))
aten("logical_not")(_logical("logical_not", False))


@aten("isnan")
def _isnan(cv, x):
    return cv.op("isnan", cv.cast(x, "f32"))


@aten("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def _where(cv, cond, a, b):
    dt = cv.out_type.dtype
    return cv.op("where", cv.cast(cond, "bool"), cv.cast(a, dt), cv.cast(b, dt))


@aten("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(cv, x, mask, value):
    return _where(cv, mask, value, x)


@aten("clamp", "clamp_min", "clamp_max", "hardtanh")
def _clamp(cv, x, lo=None, hi=None):
    kind = cv.node.target.__name__.split(".")[0]
    lo, hi = {"clamp_max": (None, lo), "hardtanh": (-1.0 if lo is None else lo, 1.0 if hi is None else hi)}.get(kind, (lo, hi))
    if isinstance(lo, V) or isinstance(hi, V):
        raise Unsupported("tensor bounds")
    attrs = {k: float(v) for k, v in (("min", lo), ("max", hi)) if v is not None}
    return cv.op("clip", cv.cast(x, cv.out_type.dtype), **attrs)


@aten("leaky_relu")
def _leaky_relu(cv, x, negative_slope=0.01):
    return cv.op("leaky_relu", x, alpha=float(negative_slope))


@aten("hardsigmoid")
def _hardsigmoid(cv, x):
    return cv.op("hard_sigmoid", x, alpha=1 / 6, beta=0.5)


@aten("softplus")
def _softplus(cv, x, beta=1, threshold=20):
    if beta != 1 or threshold < 15:  # above 15, log(1 + e^x) rounds to x in f32: the threshold changes nothing
        raise Unsupported(f"softplus with beta={beta}, threshold={threshold}")
    return cv.op("softplus", x)


# ---------------------------------------------------------------- creation and dtype


@aten("scalar_tensor")
def _scalar_tensor(cv, value, **kw):
    return cv.const(value)


FILLS = {"ones": 1.0, "new_ones": 1.0, "ones_like": 1.0, "zeros": 0.0, "new_zeros": 0.0, "zeros_like": 0.0}


@aten("full", "new_full", "full_like", *FILLS)
def _full(cv, *args, **kw):
    kind = cv.node.target.__name__.split(".")[0]
    value = FILLS[kind] if kind in FILLS else args[-1]  # full(size, v), new_full(x, size, v), full_like(x, v)
    if isinstance(value, V):
        raise Unsupported("a tensor fill value")
    t = cv.out_type
    return cv.op("cast", cv.op("expand", float(value), shape=t.shape), to=t.dtype)


@aten("arange", "arange.start", "arange.start_step")
def _arange(cv, *args, **kw):
    nums = [a for a in args if isinstance(a, (int, float))]
    if not all(isinstance(a, int) and not isinstance(a, bool) or isinstance(a, float) and a.is_integer() for a in nums):
        raise Unsupported("non-integer bounds")
    nums = [int(a) for a in nums]  # Funnel's arange(0, n, 1.0, dtype=torch.int64): whole floats are the same range
    start, stop, step = (0, nums[0], 1) if len(nums) == 1 else (nums[0], nums[1], nums[2] if len(nums) > 2 else 1)
    dt = cv.out_type.dtype
    if dt == "bool":
        raise Unsupported("a bool range")
    return cv.op("range", start=start, stop=stop, step=step, dtype=dt)


@aten("_to_copy", "clone", "alias", "detach", "lift_fresh_copy", "contiguous")
def _copy(cv, x, *args, **kw):
    return x if x is EMPTY else cv.cast(x, cv.out_type.dtype)


# ---------------------------------------------------------------- layout


@aten("view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "squeeze.dim", "squeeze.dims", "flatten.using_ints")
def _reshape(cv, x, *args):
    shape = cv.out_type.shape
    return x if cv.type(x).shape == shape else cv.op("reshape", x, shape=shape)


def _strides_agree(size, a, b) -> bool:
    """Whether two strides address the same elements of a tensor of `size` (a dim of one element
    takes any stride)."""
    return len(a) == len(b) == len(size) and all(n == 1 or s == t for n, s, t in zip(size, a, b))


@aten("as_strided")
def _as_strided(cv, x, size, stride, storage_offset=None):
    """as_strided where it is a view eqfuse has (AdaptiveAvgPool1d's decomposition writes one):
    x itself (its own size, and its strides in torch's memory), or x's elements in their order
    under another shape (x contiguous in torch's memory, the strides a contiguous tensor's of
    `size`). Any other window over x's memory runs in torch."""
    src = cv.node.args[0].meta.get("val")
    size, stride = tuple(int(d) for d in size), tuple(int(d) for d in stride)
    if storage_offset or not isinstance(src, torch.Tensor) or src.storage_offset() != 0:
        raise Unsupported("an offset into the storage")
    if size == tuple(src.shape) and _strides_agree(size, stride, src.stride()):
        return x
    dense = tuple(int(math.prod(size[k + 1:])) for k in range(len(size)))
    if src.is_contiguous() and math.prod(size) == src.numel() and _strides_agree(size, stride, dense):
        return cv.op("reshape", x, shape=size)
    raise Unsupported("a window over the storage that is no reshape")


@aten("permute")
def _permute(cv, x, dims):
    r = cv.type(x).rank
    perm = tuple(d % r for d in dims)
    return x if perm == tuple(range(r)) else cv.op("transpose", x, perm=perm)


@aten("transpose.int")
def _transpose(cv, x, d0, d1):
    r = cv.type(x).rank
    perm = list(range(r))
    perm[d0 % r], perm[d1 % r] = perm[d1 % r], perm[d0 % r]
    return _permute(cv, x, perm)


@aten("t")
def _t(cv, x):
    return _permute(cv, x, list(range(cv.type(x).rank))[::-1])


@aten("expand")
def _expand(cv, x, size, implicit=False):
    shape = cv.out_type.shape
    return x if cv.type(x).shape == shape else cv.op("expand", x, shape=shape)


def _slice(cv, x, dim, start, stop, step=1):
    n = cv.type(x).shape[dim]
    start, stop, _ = slice(start, stop, step).indices(n)
    if start == 0 and stop >= n and step == 1:
        return x
    return cv.op("slice", x, axis=dim % cv.type(x).rank, start=start, stop=stop, step=step)


@aten("slice.Tensor")
def _slice_tensor(cv, x, dim=0, start=None, end=None, step=1):
    return _slice(cv, x, dim, start, end, step)


@aten("select.int")
def _select(cv, x, dim, index):
    n = cv.type(x).shape[dim]
    index = index % n
    return cv.op("reshape", _slice(cv, x, dim, index, index + 1), shape=cv.out_type.shape)


@aten("slice_scatter")
def _slice_scatter(cv, x, src, dim=0, start=None, end=None, step=1):
    """x with its slice start:end along dim replaced by src (an indexed assignment, BEiT's and
    Funnel's position tables built in forward): the parts before and after, and src, joined."""
    r = cv.type(x).rank
    d = dim % r
    n = cv.type(x).shape[d]
    start, end, step = slice(start, end, step).indices(n)
    if step != 1:
        raise Unsupported("slice_scatter with a step")
    parts = ([_slice(cv, x, d, 0, start)] if start > 0 else []) + [src] + ([_slice(cv, x, d, end, n)] if end < n else [])
    parts = [cv.cast(p, cv.out_type.dtype) for p in parts]
    return parts[0] if len(parts) == 1 else cv.op("concat", *parts, axis=d)


@aten("select_scatter")
def _select_scatter(cv, x, src, dim, index):
    """x with x.select(dim, index) replaced by src."""
    t = cv.type(x)
    d = dim % t.rank
    index %= t.shape[d]
    row = cv.op("reshape", src, shape=t.shape[:d] + (1,) + t.shape[d + 1:])
    return _slice_scatter(cv, x, row, d, index, index + 1)


@aten("fill.Tensor", "fill.Scalar")
def _fill(cv, x, value):
    """x's shape filled with value (a scalar, or a tensor of one element)."""
    t = cv.out_type
    v = value if not isinstance(value, V) else cv.op("reshape", value, shape=())
    return cv.op("expand", cv.cast(v, t.dtype), shape=t.shape)


@aten("copy")
def _copy(cv, x, src, non_blocking=False):
    """x's shape and dtype with src's values (broadcast)."""
    t = cv.out_type
    src = cv.cast(src, t.dtype)
    return src if cv.type(src).shape == t.shape else cv.op("expand", src, shape=t.shape)


@aten("split.Tensor", "split_with_sizes")
def _split(cv, x, sizes, dim=0):
    n = cv.type(x).shape[dim]
    if isinstance(sizes, int):
        sizes = [min(sizes, n - s) for s in range(0, n, sizes)]
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    return tuple(_slice(cv, x, dim, s, s + z) for s, z in zip(starts, sizes))


@aten("unbind.int")
def _unbind(cv, x, dim=0):
    t = cv.type(x)
    shape = t.shape[:dim % t.rank] + t.shape[dim % t.rank + 1:]
    return tuple(cv.op("reshape", _slice(cv, x, dim, k, k + 1), shape=shape) for k in range(t.shape[dim]))


@aten("cat")
def _cat(cv, tensors, dim=0):
    """concat; a zero-size tensor adds nothing and is dropped (torch also takes a 1-D empty one
    beside tensors of any rank: a KV cache's start, transformers' DynamicCache)."""
    tensors = [t for t in tensors if t is not EMPTY]
    if not tensors:
        return EMPTY
    dt = cv.out_type.dtype
    rank = cv.out_type.rank
    if len(tensors) == 1:
        return cv.cast(tensors[0], dt)
    return cv.op("concat", *[cv.cast(t, dt) for t in tensors], axis=dim % rank)


@aten("repeat")
def _repeat(cv, x, repeats):
    """Tensor.repeat (a tile): x with leading 1s to len(repeats) axes, each axis d as [1, n_d]
    expanded to [r_d, n_d] (the copies outermost, as the tile lays them out), merged back."""
    shape = tuple(cv.type(x).shape)
    reps = list(repeats)
    shape = (1,) * (len(reps) - len(shape)) + shape
    if all(r == 1 for r in reps):
        return x if tuple(cv.type(x).shape) == tuple(cv.out_type.shape) else cv.op("reshape", x, shape=cv.out_type.shape)
    split = tuple(d for n in shape for d in (1, n))
    wide = tuple(d for r, n in zip(reps, shape) for d in (r, n))
    y = cv.op("expand", cv.op("reshape", x, shape=split), shape=wide)
    return cv.op("reshape", y, shape=cv.out_type.shape)


def _roll_axis(cv, x, d, shift):
    n = cv.type(x).shape[d]
    s = shift % n
    if s == 0:
        return x
    return cv.op("concat", _slice(cv, x, d, n - s, n), _slice(cv, x, d, 0, n - s), axis=d)


@aten("roll")
def _roll(cv, x, shifts, dims=()):
    """torch.roll: along each dim, its last `shift` elements moved to the front (a slice of the
    end joined to a slice of the start); without dims, over the tensor flattened."""
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    shape = cv.type(x).shape
    if not dims:
        flat = cv.op("reshape", x, shape=(math.prod(shape),))
        return cv.op("reshape", _roll_axis(cv, flat, 0, shifts[0]), shape=shape)
    for s, d in zip(shifts, dims):
        x = _roll_axis(cv, x, d % len(shape), s)
    return x


@aten("flip")
def _flip(cv, x, dims):
    """torch.flip: along each dim, its rows gathered in reverse order (as the ONNX import reads a
    Slice with a negative step)."""
    shape = cv.type(x).shape
    for d in {d % len(shape) for d in dims}:
        n = shape[d]
        if not isinstance(n, int):
            raise Unsupported(f"a flip of named dim {n}")
        if n > 1:
            x = cv.op("gather", x, cv.op("range", start=n - 1, stop=-1, step=-1, dtype="i64"), axis=d)
    return x


@aten("stack")
def _stack(cv, tensors, dim=0):
    rank = cv.out_type.rank
    d = dim % rank
    parts = [cv.op("unsqueeze", cv.cast(t, cv.out_type.dtype), axis=d) for t in tensors]
    return cv.op("concat", *parts, axis=d)


@aten("constant_pad_nd")
def _pad(cv, x, pad, value=0):
    r = cv.type(x).rank
    begins, ends = [0] * r, [0] * r
    for k in range(len(pad) // 2):
        begins[r - 1 - k], ends[r - 1 - k] = pad[2 * k], pad[2 * k + 1]
    if min(begins + ends) < 0:
        raise Unsupported("negative padding")
    return cv.op("pad", x, pads=tuple(begins + ends), value=float(value))


@aten("im2col")
def _im2col(cv, x, kernel_size, dilation, padding, stride):
    """nn.Unfold (ConvBERT's span-based convolution): the padded input's strided slice at each
    kernel offset, stacked after the channels and merged, as torch lays them out:
    [N, C * kh * kw, oh * ow]."""
    shape = tuple(cv.type(x).shape)
    r = len(shape)
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = kernel_size, dilation, padding, stride
    h, w = shape[-2:]
    if not (isinstance(h, int) and isinstance(w, int)):
        raise Unsupported("named spatial dims")
    if ph or pw:
        x = cv.op("pad", x, pads=(0,) * (r - 2) + (ph, pw) + (0,) * (r - 2) + (ph, pw), value=0.0)
    oh, ow = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    parts = []
    for i in range(kh):
        for j in range(kw):
            part = x
            for axis, start, n, step, size in ((r - 2, i * dh, oh, sh, h + 2 * ph), (r - 1, j * dw, ow, sw, w + 2 * pw)):
                if (start, n, step) != (0, size, 1):
                    part = cv.op("slice", part, axis=axis, start=start, stop=start + (n - 1) * step + 1, step=step)
            parts.append(cv.op("unsqueeze", part, axis=r - 2))
    stacked = cv.op("concat", *parts, axis=r - 2) if len(parts) > 1 else parts[0]  # [N, C, kh * kw, oh, ow]
    return cv.op("reshape", stacked, shape=cv.out_type.shape)


@aten("tril", "triu")
def _tri(cv, x, diagonal=0):
    return cv.op(cv.node.target.__name__.split(".")[0], x, k=diagonal)


# ---------------------------------------------------------------- reductions


def _axes(cv, x, dims):
    r = cv.type(x).rank
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(r))
    dims = [dims] if isinstance(dims, int) else dims
    return tuple(sorted(d % r for d in dims))


@aten("sum.dim_IntList", "sum", "mean.dim", "mean", "amax", "amin", "prod.dim_int", "prod")
def _reduce(cv, x, dims=None, keepdim=False, dtype=None):
    kind = cv.node.target.__name__.split(".")[0]
    if kind in ("sum", "mean", "prod") and cv.node.target._overloadname == "default":
        dims, keepdim = None, False
    ours = {"amax": "max", "amin": "min"}.get(kind, kind)
    if ours in ("max", "min") and cv.type(x).dtype == "bool":
        raise Unsupported("max of bools")
    return cv.op(ours, cv.cast(x, cv.out_type.dtype), axis=_axes(cv, x, dims), keepdims=bool(keepdim))


@aten("var.correction", "std.correction")
def _var(cv, x, dims=None, correction=None, keepdim=False):
    """The mean of the squared deviations with N - correction in the denominator (1 by default,
    Bessel's); std its square root."""
    axes = _axes(cv, x, dims)
    x = cv.cast(x, "f32")
    n = math.prod(cv.type(x).shape[a] for a in axes)
    dev = cv.op("sub", x, cv.op("mean", x, axis=axes, keepdims=True))
    total = cv.op("sum", cv.op("mul", dev, dev), axis=axes, keepdims=bool(keepdim))
    var = cv.op("div", total, cv.const(max(n - (1 if correction is None else correction), 0)))
    return var if cv.node.target.__name__.startswith("var") else cv.op("sqrt", var)


@aten("logsumexp")
def _logsumexp(cv, x, dims, keepdim=False):
    """log(sum(exp(x - m))) + m, m the maximum, taken as 0 where it is infinite (torch's own way: a
    row of -inf gives -inf, one holding +inf gives +inf)."""
    axes = _axes(cv, x, dims)
    x = cv.cast(x, "f32")

    def finite_max(keep: bool):
        m = cv.op("max", x, axis=axes, keepdims=keep)
        return cv.op("where", _infinite(cv, m), cv.const(0.0), m)

    m = finite_max(True)
    total = cv.op("sum", cv.op("exp", cv.op("sub", x, m)), axis=axes, keepdims=bool(keepdim))
    return cv.op("add", cv.op("log", total), m if keepdim else finite_max(False))


def _infinite(cv, x):
    """Where x is +-inf: x - x is NaN there and where x is NaN."""
    return cv.op("logical_and", cv.op("isnan", cv.op("sub", x, x)), cv.op("logical_not", cv.op("isnan", x)))


@aten("nan_to_num")
def _nan_to_num(cv, x, nan=0.0, posinf=None, neginf=None):
    """NaN to `nan`, +-inf to `posinf` and `neginf` (f32's largest and lowest by default)."""
    if cv.type(x).dtype != "f32":
        return x
    big = float(torch.finfo(torch.float32).max)
    posinf, neginf = big if posinf is None else posinf, -big if neginf is None else neginf
    infinite = _infinite(cv, x)
    y = cv.op("where", infinite, cv.op("where", cv.op("gt", x, cv.const(0.0)), cv.const(posinf), cv.const(neginf)), x)
    return cv.op("where", cv.op("isnan", x), cv.const(nan), y)


@aten("index_select")
def _index_select(cv, x, dim, index):
    return cv.op("gather", x, index, axis=dim % cv.type(x).rank)


@aten("topk")
def _topk(cv, x, k, dim=-1, largest=True, sorted=True):
    """The k largest (smallest) along dim and their indices, in order; equal values in index order."""
    kw = dict(k=int(k), axis=dim % cv.type(x).rank, largest=bool(largest))
    return cv.op("topk", x, **kw), cv.op("topk", x, **kw, indices=True)


@aten("sort", "sort.stable")
def _sort(cv, x, *args, stable=None, dim=-1, descending=False):
    """A whole axis through topk: ascending puts NaN last, descending first (torch's order), and
    equal values keep their index order (stable=True's; the default promises no order for them)."""
    if args:  # sort.default(self, dim, descending)
        dim, *rest = args
        descending = rest[0] if rest else descending
    ax = dim % cv.type(x).rank
    kw = dict(k=cv.type(x).shape[ax], axis=ax, largest=bool(descending))
    return cv.op("topk", x, **kw), cv.op("topk", x, **kw, indices=True)


@aten("argmax", "argmin")
def _argmax(cv, x, dim=None, keepdim=False):
    """The first largest (argmin: the first largest of -x, the first smallest)."""
    if dim is None:
        x, dim = cv.op("reshape", x, shape=(-1,)), 0
        if keepdim:
            raise Unsupported("argmax over all axes with keepdim")
    x = cv.cast(x, "f32")
    if cv.node.target.__name__.startswith("argmin"):
        x = cv.op("neg", x)
    return cv.op("argmax", x, axis=dim % cv.type(x).rank, keepdims=bool(keepdim))


@aten("max.dim", "min.dim")
def _max_dim(cv, x, dim, keepdim=False):
    """torch.max(x, dim) and torch.min(x, dim): the values and the index of the first of them."""
    if cv.type(x).dtype != "f32":
        raise Unsupported(f"max over a dim of {cv.type(x).dtype}")
    axis = dim % cv.type(x).rank
    is_max = cv.node.target.__name__.startswith("max")
    values = cv.op("max" if is_max else "min", x, axis=(axis,), keepdims=bool(keepdim))
    index = cv.op("argmax", x if is_max else cv.op("neg", x), axis=axis, keepdims=bool(keepdim))
    return values, index


@aten("cumsum")
def _cumsum(cv, x, dim, dtype=None):
    return cv.op("cumsum", cv.cast(x, cv.out_type.dtype), axis=dim % cv.type(x).rank)


# ---------------------------------------------------------------- rows and normalization


@aten("_softmax", "_safe_softmax")
def _softmax(cv, x, dim, half_to_float=False):
    safe = cv.node.target.__name__.startswith("_safe")
    return cv.op("softmax", cv.cast(x, "f32"), axis=dim % cv.type(x).rank, zero_nan=safe)


@aten("_log_softmax")
def _log_softmax(cv, x, dim, half_to_float=False):
    ax = dim % cv.type(x).rank
    shifted = cv.op("sub", x, cv.op("max", x, axis=ax, keepdims=True))
    return cv.op("sub", shifted, cv.op("log", cv.op("sum", cv.op("exp", shifted), axis=ax, keepdims=True)))


def _ones(cv, shape, value=1.0):
    return cv.op("expand", value, shape=tuple(shape))


@aten("native_layer_norm")
def _layer_norm(cv, x, normalized_shape, weight, bias, eps):
    n = len(normalized_shape)
    g = weight if weight is not None else _ones(cv, normalized_shape)
    b = bias if bias is not None else _ones(cv, normalized_shape, 0.0)
    return (cv.op("layernorm", x, g, b, axis=-n, eps=float(eps)), None, None)


@aten("native_group_norm")
def _group_norm(cv, x, weight, bias, n, c, hw, groups, eps):
    """GroupNorm: x [N, C, ...] as [N, groups, C / groups * spatial], each row layer-normalized,
    then scaled and shifted per channel (Wav2Vec2's first conv, PoolFormer)."""
    shape = cv.type(x).shape
    rows = (shape[0], groups, -1)
    width = math.prod(shape[1:]) // groups
    y = cv.op("layernorm", cv.op("reshape", x, shape=rows), _ones(cv, (width,)), _ones(cv, (width,), 0.0),
              axis=-1, eps=float(eps))
    return (_per_channel_affine(cv, cv.op("reshape", y, shape=tuple(shape)), weight, bias), None, None)


def _per_channel_affine(cv, y, weight, bias):
    """y [N, C, ...] times weight [C] plus bias [C] (either may be None)."""
    per_channel = (-1,) + (1,) * (cv.type(y).rank - 2)
    if weight is not None:
        y = cv.op("mul", y, cv.op("reshape", weight, shape=per_channel))
    if bias is not None:
        y = cv.op("add", y, cv.op("reshape", bias, shape=per_channel))
    return y


@aten("_weight_norm_interface")
def _weight_norm(cv, v, g, dim=0):
    """weight_norm's weight v * g / |v|, the norm over every axis but `dim` (Wav2Vec2's positional
    conv); and the norm."""
    r = cv.type(v).rank
    norm = cv.op("sqrt", cv.op("sum", cv.op("mul", v, v), axis=tuple(a for a in range(r) if a != dim % r),
                               keepdims=True))
    return (cv.op("mul", v, cv.op("div", g, norm)), norm)


@aten("_native_batch_norm_legit.no_stats")
def _batch_norm_batch_stats(cv, x, weight, bias, training, momentum, eps):
    """Batch norm over the batch's own statistics, every axis but the channels (BiT's weight
    standardization normalizes its conv weights so)."""
    r = cv.type(x).rank
    axes = (0, *range(2, r))
    d = cv.op("sub", x, cv.op("mean", x, axis=axes, keepdims=True))
    y = cv.op("mul", d, cv.op("rsqrt", cv.op("add", cv.op("mean", cv.op("mul", d, d), axis=axes, keepdims=True),
                                              float(eps))))
    return (_per_channel_affine(cv, y, weight, bias), None, None)


@aten("linalg_vector_norm")
def _vector_norm(cv, x, ord=2, dim=None, keepdim=False, dtype=None):
    """The 1-, 2- and max-norms over `dim` (ConvNeXt V2's global response norm, Swin V2's cosine
    attention)."""
    axes = _axes(cv, x, dim)
    if ord == 2:
        return cv.op("sqrt", cv.op("sum", cv.op("mul", x, x), axis=axes, keepdims=bool(keepdim)))
    if ord == 1:
        return cv.op("sum", cv.op("abs", x), axis=axes, keepdims=bool(keepdim))
    if ord == float("inf"):
        return cv.op("max", cv.op("abs", x), axis=axes, keepdims=bool(keepdim))
    raise Unsupported(f"the {ord}-norm")


@aten("_native_batch_norm_legit_no_training")
def _batch_norm(cv, x, weight, bias, mean, var, momentum, eps):
    c = (cv.type(x).shape[1],)
    g = weight if weight is not None else _ones(cv, c)
    b = bias if bias is not None else _ones(cv, c, 0.0)
    return (cv.op("batchnorm", x, mean, var, g, b, eps=float(eps)), None, None)


# ---------------------------------------------------------------- contractions


@aten("mm", "bmm")
def _mm(cv, a, b):
    return cv.op("matmul", a, b)


@aten("addmm", "baddbmm")
def _addmm(cv, bias, a, b, beta=1, alpha=1):
    y = cv.op("matmul", a, b)
    if alpha != 1:
        y = cv.op("mul", y, alpha)
    if beta == 0:
        return y
    return cv.op("add", y, bias if beta == 1 else cv.op("mul", bias, beta))


@aten("convolution")
def _convolution(cv, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    nd = cv.type(x).rank - 2
    if nd not in (1, 2):
        raise Unsupported(f"a {nd}-d convolution")
    if isinstance(padding, str):
        raise Unsupported(f"padding={padding!r}")
    one = lambda v: v[0] if len(set(v)) == 1 else tuple(v)  # an int, or one value per spatial axis
    args = (x, w) if b is None else (x, w, b)
    stride, padding, dilation = list(stride), list(padding), list(dilation)
    if transposed:
        if nd != 2:
            raise Unsupported(f"a transposed {nd}-d convolution")
        if any(d != 1 for d in dilation):
            raise Unsupported("a dilated transposed convolution")
        return cv.op("conv_transpose2d", *args, stride=one(stride), padding=one(padding),
                     output_padding=one(list(output_padding)), group=groups)
    if nd == 1:
        return cv.op("conv1d", *args, stride=stride[0], padding=padding[0], dilation=dilation[0], group=groups)
    return cv.op("conv2d", *args, stride=one(stride), padding=one(padding), dilation=one(dilation), group=groups)


@aten("conv1d", "conv2d")
def _conv_nd(cv, x, w, b=None, stride=(1,), padding=(0,), dilation=(1,), groups=1):
    nd = cv.type(x).rank - 2
    rep = lambda v: list(v) * nd if len(v) == 1 else list(v)
    return _convolution(cv, x, w, b, rep(stride), padding if isinstance(padding, str) else rep(padding),
                        rep(dilation), False, [0] * nd, groups)


@aten("conv_transpose2d.input")
def _conv_transpose_nd(cv, x, w, b=None, stride=(1,), padding=(0,), output_padding=(0,), groups=1, dilation=(1,)):
    rep = lambda v: list(v) * 2 if len(v) == 1 else list(v)
    return _convolution(cv, x, w, b, rep(stride), rep(padding), rep(dilation), True, rep(output_padding), groups)


# ---------------------------------------------------------------- indexing and pooling


@aten("embedding")
def _embedding(cv, weight, indices, *args):
    return cv.op("gather", weight, indices, axis=0)


@aten("gather")
def _gather(cv, x, dim, index, sparse_grad=False):
    xt, it = cv.type(x), cv.type(index)
    d = dim % xt.rank
    for ax in range(xt.rank):
        if ax != d and it.shape[ax] < xt.shape[ax]:
            x = _slice(cv, x, ax, 0, it.shape[ax])
    return cv.op("gather_elements", x, index, axis=d)


@aten("index.Tensor", "_unsafe_index.Tensor")
def _index(cv, x, indices):
    """x[:, ..., i0, i1, ...]: index tensors over consecutive axes after any leading full ones
    (None), broadcast together, as one gather from x with those axes flattened. Upsampling
    decomposes so (aten.upsample_nearest2d and upsample_bilinear2d into _unsafe_index with
    [None, None, rows [OH, 1], columns [OW]])."""
    lead = next((k for k, i in enumerate(indices) if i is not None), len(indices))
    idx = list(indices[lead:])
    if not idx or any(i is None for i in idx) or any(cv.type(i).dtype not in ("i64", "i32") for i in idx):
        raise Unsupported("None or mask indices after an index tensor")
    xs = cv.type(x).shape
    k = len(idx)
    linear = None
    for n, i in enumerate(idx):
        axis = lead + n
        i = cv.cast(i, "i64")
        i = cv.op("where", cv.op("lt", i, 0), cv.op("add", i, xs[axis]), i)  # negative counts from the end
        stride = math.prod(xs[axis + 1:lead + k])
        term = i if stride == 1 else cv.op("mul", i, stride)
        linear = term if linear is None else cv.op("add", linear, term)
    flat = cv.op("reshape", x, shape=tuple(xs[:lead]) + (math.prod(xs[lead:lead + k]),) + tuple(xs[lead + k:]))
    return cv.op("gather", flat, linear, axis=lead)


def _pooled(cv, x, kind, kernel_size, stride, padding, ceil_mode, count_include_pad=False):
    """torch's 2-D pooling (symmetric padding, ceil_mode) through eqfuse.frontend.pooling."""
    shape = cv.type(x).shape
    if len(shape) != 4 or not all(isinstance(d, int) for d in shape[2:]):
        raise Unsupported("unbatched pooling or named spatial dims")
    two = lambda v: list(v) * (2 // len(v)) if isinstance(v, (list, tuple)) else [v, v]  # noqa: E731
    kernel, pads = two(kernel_size), two(padding)
    return pooling.pool(lambda name, args, **attrs: cv.op(name, *args, **attrs), lambda shp: _ones(cv, shp), x,
                        shape, kind, kernel, two(stride) if stride else kernel, pads, pads, bool(ceil_mode),
                        bool(count_include_pad))


@aten("max_pool2d_with_indices")
def _max_pool(cv, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    if any(d != 1 for d in ([dilation] if isinstance(dilation, int) else dilation)):
        raise Unsupported("dilation")
    return (_pooled(cv, x, "max", kernel_size, stride, padding, ceil_mode), None)


@aten("avg_pool2d")
def _avg_pool(cv, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    if divisor_override is not None:
        raise Unsupported("divisor_override")
    return _pooled(cv, x, "avg", kernel_size, stride, padding, ceil_mode, count_include_pad)


@aten("_adaptive_avg_pool2d")
def _adaptive_avg_pool(cv, x, output_size):
    h, w = cv.type(x).shape[-2:]
    oh, ow = output_size
    if cv.type(x).rank != 4 or h % oh or w % ow:
        raise Unsupported("an output size that does not divide the input")
    if (oh, ow) == (1, 1):
        return cv.op("mean", x, axis=(2, 3), keepdims=True)
    return cv.op("avg_pool2d", x, kernel_size=(h // oh, w // ow), stride=(h // oh, w // ow))
