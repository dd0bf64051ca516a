"""`import eqfuse.numpy as enp`: eqfuse's array namespace, for functions under `@eqfuse.jit`.

Every op of the op table (eqfuse/ir/ops.py, `eqfuse ops`) is a function here under its own name,
made from its table entry: the inputs positionally, the attributes as keywords
(`enp.softmax(x, axis=-1)`, `enp.layernorm(x, g, b, eps=1e-5)`, `enp.gelu(x, approximate="tanh")`).
Beside them, numpy's and the array API standard's names where they fit (`enp.concatenate`,
`enp.transpose(x, axes)`, `enp.sum(x, 1, keepdims=True)`, `enp.expand_dims`, `enp.astype`,
`enp.subtract`, ...). Under a trace they record graph nodes; on numpy arrays they run eagerly,
through the numpy reference.
"""

from __future__ import annotations

import builtins
import inspect
import math as _math

import numpy as _np

from eqfuse.errors import EqfuseError
from eqfuse.ir.ops import OPS, REQUIRED, Op
from eqfuse.ir.shapes import dtype_of_numpy
from eqfuse.trace.tracer import API, Traced, apply, user_pos

float32, int64, int32, bool_ = _np.float32, _np.int64, _np.int32, _np.bool_
newaxis = None
pi, e, inf, nan = _math.pi, _math.e, _math.inf, _math.nan

_ARG_NAMES = {1: ("x",), 2: ("a", "b"), 3: ("x", "y", "z")}


def _from_op(op: Op):
    """The function of one op table entry: inputs by position, attributes by keyword."""
    lo, hi = op.arity

    def fn(*args, **attrs):
        return apply(op.name, args, attrs)

    if hi >= 0:
        names = _ARG_NAMES.get(hi, tuple(f"x{i}" for i in builtins.range(hi)))
        if op.name == "where":
            names = ("cond", "a", "b")
        params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY,
                                    default=inspect.Parameter.empty if i < lo else None)
                  for i, n in enumerate(names)]
    else:
        params = [inspect.Parameter("xs", inspect.Parameter.VAR_POSITIONAL)]
    params += [inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY,
                                 default=inspect.Parameter.empty if a.default is REQUIRED else a.default)
               for a in op.attrs]
    fn.__signature__ = inspect.Signature(params)
    fn.__name__ = fn.__qualname__ = op.name
    fn.__doc__ = f"{op.doc}\n\nThe eqfuse op `{op.name}` ({op.kind}); `eqfuse ops {op.name}` shows it in full."
    return fn


for _name, _op in OPS.items():
    globals()[_name] = _from_op(_op)
del _name, _op


# ------------------------------------------------------------------ numpy and array API names

def _alias(name: str, op: str):
    f = globals()[op]
    g = lambda *a, **k: f(*a, **k)  # noqa: E731
    g.__name__ = g.__qualname__ = name
    g.__doc__ = f"numpy's name for {op}: " + (f.__doc__ or "")
    g.__signature__ = f.__signature__
    return g


for _np_name, _op_name in {"subtract": "sub", "multiply": "mul", "divide": "div", "true_divide": "div",
                           "power": "pow", "negative": "neg", "absolute": "abs", "equal": "eq",
                           "not_equal": "ne", "less": "lt", "less_equal": "le", "greater": "gt",
                           "greater_equal": "ge"}.items():
    globals()[_np_name] = _alias(_np_name, _op_name)
del _np_name, _op_name

_REDUCE = {n: globals()[n] for n in ("sum", "mean", "max", "min", "prod")}


def _reduction(name: str):
    op = _REDUCE[name]

    def fn(x, axis=None, keepdims=False):
        return op(x, axis=axis, keepdims=keepdims)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = op.__doc__
    return fn


sum, mean, max, min, prod = (_reduction(n) for n in ("sum", "mean", "max", "min", "prod"))
amax, amin = max, min


def var(x, axis=None, keepdims=False):
    """The variance over axis (numpy's, ddof=0): mean((x - mean(x))^2)."""
    d = x - mean(x, axis, keepdims=True)
    return mean(d * d, axis, keepdims)


def std(x, axis=None, keepdims=False):
    return sqrt(var(x, axis, keepdims))  # noqa: F821 (made from the op table)


def transpose(x, axes=None):
    """numpy.transpose: permute the axes (reverse them when axes is None)."""
    return apply("transpose", [x], {"perm": None if axes is None else tuple(axes)})


def permute_dims(x, axes):
    return transpose(x, axes)


def swapaxes(x, a, b):
    p = list(builtins.range(x.ndim))
    p[a], p[b] = p[b], p[a]
    return transpose(x, p)


def reshape(x, shape):
    """numpy.reshape: one -1 is inferred."""
    return apply("reshape", [x], {"shape": (shape,) if isinstance(shape, (int, _np.integer)) else tuple(shape)})


def concatenate(arrays, axis=0):
    """numpy.concatenate: join a list of arrays along axis."""
    return apply("concat", list(arrays), {"axis": axis})


def concat(*arrays, axis=0):
    """The array API's concat(arrays, axis=0); the op table's form concat(x0, x1, ..., axis=0) too."""
    if len(arrays) == 1 and isinstance(arrays[0], (list, tuple)):
        arrays = tuple(arrays[0])
    return apply("concat", list(arrays), {"axis": axis})


def stack(arrays, axis=0):
    """numpy.stack: a new axis, then concatenate along it."""
    return concatenate([expand_dims(a, axis) for a in arrays], axis)


def expand_dims(x, axis):
    return apply("unsqueeze", [x], {"axis": axis})


def broadcast_to(x, shape):
    return apply("expand", [x], {"shape": tuple(shape)})


def _dtype_name(dtype) -> str:
    if isinstance(dtype, str) and dtype in ("f32", "i64", "i32", "bool", "u8", "i8"):
        return dtype
    try:
        dt = _np.dtype(dtype)
    except TypeError:
        dt = None
    name = "f32" if dt == _np.float64 else dtype_of_numpy(dt) if dt is not None else None
    if name is None:
        raise EqfuseError(f"unknown dtype {dtype!r}: eqfuse has float32, int64, int32 and bool", user_pos())
    return name


def astype(x, dtype):
    """x converted to dtype (numpy's dtype objects or names, or "f32", "i64", "i32", "bool")."""
    return apply("cast", [x], {"to": _dtype_name(dtype)})


def clip(x, a_min=None, a_max=None):
    """numpy.clip: numbers for bounds are the clip op's attributes; array bounds are maximum/minimum."""
    if isinstance(a_min, Traced) or isinstance(a_max, Traced):
        y = x if a_min is None else maximum(x, a_min)  # noqa: F821
        return y if a_max is None else minimum(y, a_max)  # noqa: F821
    return apply("clip", [x], {"min": a_min, "max": a_max})


def square(x):
    return x * x


def reciprocal(x):
    return 1.0 / x


def dot(a, b):
    return matmul(a, b)  # noqa: F821


def cumsum(x, axis=None):
    if axis is None:
        x, axis = reshape(x, -1), 0
    return apply("cumsum", [x], {"axis": axis})


cumulative_sum = cumsum


def argmax(x, axis=None, keepdims=False):
    if axis is None:
        return apply("argmax", [reshape(x, -1)], {"axis": 0})
    return apply("argmax", [x], {"axis": axis, "keepdims": keepdims})


def take(x, indices, axis=None):
    if axis is None:
        x, axis = reshape(x, -1), 0
    return apply("gather", [x, indices], {"axis": axis})


def take_along_axis(arr, indices, axis):
    """numpy.take_along_axis: the op gather_elements along axis (None: of the flattened array),
    axis by position as numpy takes it."""
    if axis is None:
        arr, axis = reshape(arr, -1), 0
    return apply("gather_elements", [arr, indices], {"axis": axis})


def arange(start, stop=None, step=1, dtype=None):
    """numpy.arange of integers (dtype int64 by default, or int32 or float32)."""
    if stop is None:
        start, stop = 0, start
    return apply("range", [], {"start": start, "stop": stop, "step": step,
                               "dtype": "i64" if dtype is None else _dtype_name(dtype)})


def full(shape, fill_value, dtype=None):
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    x = apply("expand", [fill_value], {"shape": shape})
    return x if dtype is None or _dtype_name(dtype) == "f32" else astype(x, dtype)


def zeros(shape, dtype=None):
    return full(shape, 0.0, dtype)


def ones(shape, dtype=None):
    return full(shape, 1.0, dtype)


def full_like(x, fill_value, dtype=None):
    return full(x.shape, fill_value, x.dtype if dtype is None else dtype)


def zeros_like(x, dtype=None):
    return full_like(x, 0.0, dtype)


def ones_like(x, dtype=None):
    return full_like(x, 1.0, dtype)


def pad(x, pad_width, constant_values=0):
    """numpy.pad, mode "constant": pad_width is ((before, after), ...) per axis, or one pair or int."""
    pw = _np.broadcast_to(_np.asarray(pad_width, dtype=_np.int64), (x.ndim, 2))
    return apply("pad", [x], {"pads": tuple(int(v) for v in pw[:, 0]) + tuple(int(v) for v in pw[:, 1]),
                              "value": float(constant_values)})


def log_softmax(x, axis=-1):
    z = x - max(x, axis, keepdims=True)
    return z - log(sum(exp(z), axis, keepdims=True))  # noqa: F821


# numpy's function names that differ from the ones here, for np.f(traced) (eqfuse.trace.tracer._dispatch)

__all__ = sorted(n for n, v in globals().items()
                 if not n.startswith("_") and n not in ("annotations", "builtins", "inspect", "OPS", "REQUIRED",
                                                        "Op", "EqfuseError", "Traced", "apply", "user_pos",
                                                        "dtype_of_numpy", "API"))

API.update({name: globals()[name] for name in __all__ if callable(globals()[name])})
