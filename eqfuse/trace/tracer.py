"""Recording Python code over `eqfuse.numpy` as graph IR.

While `@eqfuse.jit` traces a function, each array argument is a `Traced`: a handle on one node
of the graph being recorded. Operators (`x @ w + b`, `x[1:, None]`, `x.T`) and the functions of
`eqfuse.numpy` add nodes, with the op table's attribute, shape and dtype checks; a check that
fails is an EqfuseError at the user's own file and line. Python numbers become constants, numpy
arrays the function reads (closed over or passed in a container it indexes) become parameters
bound to those arrays.

A traced array has a shape and a dtype but no values, so whatever would need them (`if x > 0:`,
`bool(t)`, `float(t)`, `np.asarray(t)`) is an error naming the line: Python control flow is
unrolled at trace time and may depend only on shapes and other Python values.

Outside a trace the same functions run eagerly on numpy arrays, through the numpy reference
(`eqfuse.ir.reference`): the semantics the compiled code is checked against.
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
from typing import Any, Sequence

import numpy as np

from eqfuse.errors import EqfuseError, Pos, ShapeError
from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.ops import OPS, complete_attrs
from eqfuse.ir.shapes import NUMPY_DTYPE, TType, dtype_of_numpy

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../eqfuse


class DataDependentError(EqfuseError):
    """The traced function needed an array's values (control flow, conversion to a Python number)."""


def user_pos() -> Pos | None:
    """The position of the innermost frame outside the eqfuse package: the user's call."""
    f = sys._getframe(1)
    while f is not None and os.path.abspath(f.f_code.co_filename).startswith(_PACKAGE + os.sep):
        f = f.f_back
    if f is None:
        return None
    file, line, col, width = f.f_code.co_filename, f.f_lineno, 1, 1
    try:
        positions = list(f.f_code.co_positions())[f.f_lasti // 2]
        if positions[0] == line and positions[2] is not None:
            col = positions[2] + 1
            if positions[1] == line and positions[3] is not None:
                width = max(1, positions[3] - positions[2])
    except (AttributeError, IndexError):  # Python < 3.11: the line alone
        pass
    return Pos(file, line, col, linecache.getline(file, line), width)


def array_dtype(a: np.ndarray, what: str) -> str:
    """The eqfuse dtype of an array (float64 is taken as f32: eqfuse computes floats in f32)."""
    if a.dtype == np.float64 or a.dtype == np.float16:
        return "f32"
    dt = dtype_of_numpy(a.dtype)
    if dt is None:
        raise EqfuseError(f"{what} has dtype {a.dtype}; eqfuse takes float32, int64, int32 and bool arrays",
                          user_pos())
    return dt


class Trace:
    """One graph being recorded; its inputs are the function's arrays, then captured arrays."""

    def __init__(self, name: str):
        self.graph = Graph(name)
        self.captured: list[tuple[str, np.ndarray]] = []  # (parameter name, array), in order
        self._captured_ids: dict[int, int] = {}  # id(array) -> node

    def input(self, name: str, t: TType) -> "Traced":
        i = self.graph.add(Node("input", type=t, name=name))
        self.graph.inputs.append(i)
        return Traced(self, i)

    def capture(self, a: np.ndarray) -> int:
        """A numpy array the function reads: a parameter bound to it (one per array object)."""
        node = self._captured_ids.get(id(a))
        if node is None:
            dt = array_dtype(a, "an array the function reads")
            name = f"c{len(self.captured)}"
            self.captured.append((name, np.ascontiguousarray(a, dtype=NUMPY_DTYPE[dt])))
            node = self.input(name, TType(tuple(int(d) for d in a.shape), dt)).node
            self._captured_ids[id(a)] = node
        return node

    def const(self, v) -> int:
        return self.graph.add(Node("const", attrs=(("value", float(v)),), type=TType(())))


_ACTIVE = threading.local()  # .stack: the traces under way in this thread, innermost last


def active() -> Trace | None:
    stack = getattr(_ACTIVE, "stack", None)
    return stack[-1] if stack else None


class tracing:
    """`with tracing(trace):` records into `trace`."""

    def __init__(self, trace: Trace):
        self.trace = trace

    def __enter__(self) -> Trace:
        if not hasattr(_ACTIVE, "stack"):
            _ACTIVE.stack = []
        _ACTIVE.stack.append(self.trace)
        return self.trace

    def __exit__(self, *exc) -> None:
        _ACTIVE.stack.pop()


def _node_of(trace: Trace, x, opname: str) -> int:
    if isinstance(x, Traced):
        if x.trace is not trace:
            raise EqfuseError(f"{opname}: this array belongs to another trace (a traced array kept from an "
                              "earlier call, or one from an enclosing jit function)", user_pos())
        return x.node
    if isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating)):
        return trace.const(x)
    if isinstance(x, np.ndarray) and x.ndim == 0 and x.dtype.kind in "biuf":
        return trace.const(x.item())
    if isinstance(x, (np.ndarray, list, tuple)):
        a = np.asarray(x)
        if a.dtype.kind not in "biuf":
            raise EqfuseError(f"{opname}: cannot use {type(x).__name__} of {a.dtype} as an array", user_pos())
        if isinstance(x, (list, tuple)) and a.dtype == np.float64:
            a = a.astype(np.float32)
        return trace.capture(a)
    raise EqfuseError(f"{opname}: expected an array or a number, got {type(x).__name__}", user_pos())


def apply(opname: str, args: Sequence[Any], attrs: dict[str, Any] | None = None) -> "Traced | np.ndarray":
    """Record op(args, attrs) in the active trace, or run it eagerly (numpy reference) outside one."""
    trace = next((a.trace for a in args if isinstance(a, Traced)), None) or active()
    if trace is None:
        return _eager(opname, args, attrs or {})
    op = OPS[opname]
    lo, hi = op.arity
    if len(args) < lo or (hi >= 0 and len(args) > hi):
        want = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi >= 0 else f"at least {lo}"
        raise EqfuseError(f"{opname} takes {want} array argument{'s' * (hi != 1)}, got {len(args)}", user_pos())
    given = {k: _attr_value(v) for k, v in (attrs or {}).items() if v is not None}
    unknown = [k for k in given if op.attr_spec(k) is None]
    if unknown:
        known = ", ".join(a.name for a in op.attrs) or "none"
        raise EqfuseError(f"{opname} has no attribute {unknown[0]}= (its attributes: {known})", user_pos())
    try:
        full = complete_attrs(op, given)
    except ValueError as e:
        raise EqfuseError(str(e), user_pos()) from None
    nodes = [_node_of(trace, a, opname) for a in args]
    g = trace.graph
    try:
        t = op.infer([g.nodes[i].type for i in nodes], full)
    except ShapeError as e:
        msg = str(e) if str(e).startswith(opname) else f"{opname}: {e}"
        raise EqfuseError(msg, user_pos()) from None
    return Traced(trace, g.add(Node(opname, tuple(nodes), tuple(full.items()), t)))


def _attr_value(v):
    """numpy scalars and lists as the op table's attribute values (ints, floats, tuples)."""
    if isinstance(v, (list, tuple)):
        return tuple(_attr_value(x) for x in v)
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v


def _eager(opname: str, args, attrs):
    """op on numpy arrays: a one-op trace over the arrays, run by the numpy reference."""
    from eqfuse.ir.reference import evaluate

    trace = Trace("eager")
    with tracing(trace):
        out = apply(opname, args, attrs)
    trace.graph.outputs = [out.node]
    return evaluate(trace.graph, [a for _, a in trace.captured])[0]


def _data_dependent(what: str, t: "Traced") -> DataDependentError:
    return DataDependentError(
        f"data-dependent control flow: {what} of a traced array ({t.type}) needs its values, which "
        "do not exist while the function is traced",
        user_pos(),
        hint="eqfuse.jit traces the function once per signature of shapes and dtypes: Python control flow "
             "may depend on shapes and other Python values only; select by value with enp.where(cond, a, b)")


class Traced:
    """An array of the graph being traced: a shape and a dtype, no values."""

    __slots__ = ("trace", "node")
    __array_priority__ = 1000  # numpy defers `ndarray + traced` to us

    def __init__(self, trace: Trace, node: int):
        self.trace, self.node = trace, node

    # ------------------------------------------------------------ what is known while tracing
    @property
    def type(self) -> TType:
        return self.trace.graph.nodes[self.node].type

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.type.shape)

    @property
    def ndim(self) -> int:
        return self.type.rank

    @property
    def size(self) -> int:
        return self.type.size()

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(NUMPY_DTYPE[self.type.dtype])

    def __len__(self) -> int:
        if not self.shape:
            raise EqfuseError("len() of a 0-d array", user_pos())
        return self.shape[0]

    def __iter__(self):  # unrolled: the first axis is known
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        return f"<traced array {self.type}>"

    # ------------------------------------------------------------ what would need values
    def __bool__(self):
        raise _data_dependent("bool() (an `if`, `while`, `and`, `or` or `not` on it)", self)

    def __float__(self):
        raise _data_dependent("float()", self)

    def __int__(self):
        raise _data_dependent("int()", self)

    def __index__(self):
        raise _data_dependent("use as a Python index", self)

    def __complex__(self):
        raise _data_dependent("complex()", self)

    def __array__(self, *args, **kwargs):
        raise _data_dependent("conversion to a numpy array (np.asarray)", self)

    def item(self):
        raise _data_dependent(".item()", self)

    def tolist(self):
        raise _data_dependent(".tolist()", self)

    def __setitem__(self, key, value):
        raise EqfuseError("traced arrays cannot be assigned to in place; build a new one "
                          "(enp.where(mask, value, x), enp.concatenate)", user_pos())

    # ------------------------------------------------------------ operators
    def _bin(self, op, other, reverse=False):
        return apply(op, [other, self] if reverse else [self, other])

    __add__ = lambda s, o: s._bin("add", o)  # noqa: E731
    __radd__ = lambda s, o: s._bin("add", o, True)  # noqa: E731
    __sub__ = lambda s, o: s._bin("sub", o)  # noqa: E731
    __rsub__ = lambda s, o: s._bin("sub", o, True)  # noqa: E731
    __mul__ = lambda s, o: s._bin("mul", o)  # noqa: E731
    __rmul__ = lambda s, o: s._bin("mul", o, True)  # noqa: E731
    __truediv__ = lambda s, o: s._bin("div", o)  # noqa: E731
    __rtruediv__ = lambda s, o: s._bin("div", o, True)  # noqa: E731
    __pow__ = lambda s, o: s._bin("pow", o)  # noqa: E731
    __rpow__ = lambda s, o: s._bin("pow", o, True)  # noqa: E731
    __matmul__ = lambda s, o: s._bin("matmul", o)  # noqa: E731
    __rmatmul__ = lambda s, o: s._bin("matmul", o, True)  # noqa: E731
    __lt__ = lambda s, o: s._bin("lt", o)  # noqa: E731
    __le__ = lambda s, o: s._bin("le", o)  # noqa: E731
    __gt__ = lambda s, o: s._bin("gt", o)  # noqa: E731
    __ge__ = lambda s, o: s._bin("ge", o)  # noqa: E731
    __eq__ = lambda s, o: s._bin("eq", o)  # noqa: E731
    __ne__ = lambda s, o: s._bin("ne", o)  # noqa: E731
    __and__ = lambda s, o: s._bin("logical_and", o)  # noqa: E731
    __rand__ = lambda s, o: s._bin("logical_and", o, True)  # noqa: E731
    __or__ = lambda s, o: s._bin("logical_or", o)  # noqa: E731
    __ror__ = lambda s, o: s._bin("logical_or", o, True)  # noqa: E731
    __hash__ = object.__hash__

    def __neg__(self):
        return apply("neg", [self])

    def __pos__(self):
        return self

    def __abs__(self):
        return apply("abs", [self])

    def __invert__(self):
        return apply("logical_not", [self])

    @property
    def T(self):
        return apply("transpose", [self])

    def __getitem__(self, key):
        return API["getitem"](self, key)

    # ------------------------------------------------------------ numpy's methods
    def reshape(self, *shape):
        return API["reshape"](self, shape[0] if len(shape) == 1 else shape)

    def transpose(self, *axes):
        return API["transpose"](self, (axes[0] if len(axes) == 1 else axes) or None)

    def astype(self, dtype):
        return API["astype"](self, dtype)

    def __getattr__(self, name):  # x.sum(axis=1), x.mean(), x.max(), x.clip(0, 1), ...
        if name in _METHODS:
            fn = API[name]
            return lambda *a, **k: fn(self, *a, **k)
        raise AttributeError(f"traced array has no attribute '{name}'")

    # numpy functions and ufuncs on traced arrays (np.exp(t), np.sum(t, axis=1)) go to eqfuse.numpy
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _dispatch(ufunc.__name__, inputs, kwargs, method == "__call__" and not kwargs.get("out"))

    def __array_function__(self, func, types, args, kwargs):
        return _dispatch(func.__name__, args, kwargs, True)


# The traced-array API, by numpy name: eqfuse.numpy's functions and eqfuse.trace.indexing's getitem,
# registered by those modules (the eqfuse package imports both), so that a Traced's methods, indexing
# and numpy's own functions on a Traced reach them.
API: dict[str, Any] = {}
NUMPY_NAMES = {"add": "add", "amax": "max", "amin": "min", "absolute": "abs"}  # numpy's other names

_METHODS = ("sum", "mean", "max", "min", "prod", "argmax", "clip", "cumsum", "squeeze", "flatten", "var", "std")


def _dispatch(name: str, args, kwargs, ok: bool):
    fn = API.get(NUMPY_NAMES.get(name, name))
    if not ok or fn is None or not callable(fn):
        raise EqfuseError(f"numpy.{name} cannot run on a traced array; use the functions of eqfuse.numpy "
                          "(import eqfuse.numpy as enp)", user_pos())
    return fn(*args, **kwargs)
