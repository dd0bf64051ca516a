"""ONNX -> Graph IR: every ONNX node becomes eqfuse ops from the op table.

    model = import_model("model.onnx")      # Imported(graph, params)
    graph = import_onnx("model.onnx")        # what `eqfuse.frontend.load` calls
    params = onnx_params("model.onnx")       # {param name: float32 array}, for compile(params=)

Contract with `eqfuse.compile`: the graph's parameters are the model's runtime inputs (ONNX
order) followed by its weights. Every float initializer (and every constant tensor that is
not a scalar) that the graph reads as data becomes a parameter, named like the initializer
(sanitized); `onnx_params` returns exactly those arrays, so `compile(path, params=onnx_params(path))`
leaves only the runtime inputs to pass. Values known at import time that steer shapes (Reshape
shapes, Slice bounds, reduction axes, Shape of a concrete tensor, ...) are folded away and never
become parameters; scalars (and size-1 constants that cannot change a result's shape) become
"const" nodes; a weight nothing reads as data is dropped.

Dynamic dims (dim_param) become named dims unless `dims=` binds them. `values=` fixes runtime
inputs at import time (the onnx backend uses it for integer inputs such as a Reshape's shape).
"""

from __future__ import annotations

import keyword
import math
import os
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

import numpy as np

from .errors import EqfuseError, ShapeError
from .graph import Graph, Node
from .onnx_checks import check_dims, check_size, tensor_array
from .ops import OPS, complete_attrs
from .shapes import NUMPY_DTYPE, Dim, TType, dim_product, dtype_of_numpy

try:
    import onnx
    from onnx import helper, numpy_helper
except ImportError:  # pragma: no cover - exercised only without the optional dependency
    onnx = None

F32 = np.float32
RESERVED = {"graph", "kernel", "return", "true", "false", "f32"}
BIG = 2**31  # ONNX writes "to the end" as INT64_MAX (or INT32_MAX)
ONNX_DTYPES = {1: "f32", 7: "i64", 6: "i32", 9: "bool"}  # TensorProto element types eqfuse computes in


@dataclass
class Imported:
    graph: Graph
    params: dict[str, np.ndarray]  # parameter name -> float32 array, in parameter order
    inputs: list[str]  # ONNX names of the runtime inputs, in parameter order
    outputs: list[str]  # ONNX names of the outputs


def import_onnx(model, *, dims: Mapping[str, int] | None = None,
                values: Mapping[str, np.ndarray] | None = None) -> Graph:
    """The Graph of an ONNX model (a path, bytes or a ModelProto); weights are its last parameters."""
    return import_model(model, dims=dims, values=values).graph


def onnx_params(model, *, dims: Mapping[str, int] | None = None,
                values: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The arrays to bind with `eqfuse.compile(..., params=)`: one per weight parameter."""
    return import_model(model, dims=dims, values=values).params


def import_with_params(model, values: Mapping[str, np.ndarray] | None = None, *,
                       dims: Mapping[str, int] | None = None) -> tuple[Graph, dict[str, np.ndarray]]:
    """(graph, params) in one import; `values` fixes runtime inputs (see the module docstring)."""
    m = import_model(model, dims=dims, values=values)
    return m.graph, m.params


def import_model(model, *, dims: Mapping[str, int] | None = None,
                 values: Mapping[str, np.ndarray] | None = None) -> Imported:
    if onnx is None:
        raise EqfuseError("importing ONNX models needs the onnx package", hint="pip install 'eqfuse[onnx]'")
    proto = _load(model)
    return _Importer(proto, dict(dims or {}), dict(values or {})).run()


def _load(model) -> "onnx.ModelProto":
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        if isinstance(model, bytes):
            return onnx.load_from_string(model)
        return onnx.load(os.fspath(model))
    except FileNotFoundError:
        raise EqfuseError(f"{model}: no such file") from None
    except Exception as e:  # a protobuf DecodeError or an unreadable external-data file
        raise EqfuseError(f"{model}: not a readable ONNX model ({type(e).__name__}: {e})") from None


def sanitize(name: str) -> str:
    """An ONNX name as a .g identifier: '/layer1/Conv_output_0' -> 'layer1_Conv_output_0'."""
    s = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_")
    s = re.sub(r"__+", "_", s)
    if not s or s[0].isdigit():
        s = "v" + ("_" + s if s else "")
    if s in RESERVED or keyword.iskeyword(s):
        s += "_"
    return s


class _Namer:
    def __init__(self):
        self.taken: set[str] = set()

    def __call__(self, name: str) -> str:
        base = sanitize(name)
        out, k = base, 1
        while out in self.taken:
            k += 1
            out = f"{base}_{k}"
        self.taken.add(out)
        return out


class Unsupported(Exception):
    """Raised inside a handler; the importer adds the op type and node name."""


class _Importer:
    def __init__(self, model, dims: dict[str, int], values: dict[str, np.ndarray]):
        self.model = model
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        self.dims = dims
        self.values = values
        self.names = _Namer()
        self.graph = Graph(sanitize(model.graph.name or "model") or "model")
        self.env: dict[str, Any] = {}
        self.weights: set[str] = set()  # ONNX names of float initializers: parameters, never folded
        self.params: dict[str, np.ndarray] = {}
        self.param_ids: list[int] = []
        self.materialized: dict[str, int] = {}
        self.node: Any = None  # the ONNX node being imported, for error messages

    # ------------------------------------------------------------ driver

    def run(self) -> Imported:
        g = self.model.graph
        inits = {t.name: tensor_array(t, f"initializer '{t.name}'") for t in g.initializer}
        for name, arr in inits.items():
            self.env[name] = arr
            if arr.dtype.kind == "f":
                self.weights.add(name)
        runtime: list[str] = []
        for vi in g.input:
            if vi.name in inits:
                continue
            if vi.name in self.values:
                self.env[vi.name] = np.asarray(self.values[vi.name])
                continue
            self.env[vi.name] = self.input(vi)
            runtime.append(vi.name)
        inputs = [self.env[n] for n in runtime]
        for k, node in enumerate(g.node):
            self.node = node
            if node.op_type not in HANDLERS or node.domain not in ("", "ai.onnx"):
                # before the first error, look ahead: the message lists every op missing
                consts = {n for n, v in self.env.items() if self.is_const(v)}
                self.check_ops(list(g.node)[k:], consts)
            self.import_node(node)
        self.node = None
        outputs = [self.output(vi) for vi in g.output]
        self.graph.outputs = outputs
        graph = _prune(self.graph, inputs, self.param_ids)
        used = {graph.nodes[i].name for i in graph.inputs}
        params = {k: v for k, v in self.params.items() if k in used}
        return Imported(graph, params, runtime, [vi.name for vi in g.output])

    def check_ops(self, nodes, consts: set[str]) -> None:
        """One error listing every op eqfuse cannot import, with its count and first node: a node
        with no handler is fine when all its inputs are constants (it is folded); a Shape or Size
        is taken as a constant (it is one when the shapes are known)."""
        consts = consts - self.weights
        missing: dict[str, list[str]] = {}
        for node in nodes:
            key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
            all_const = all(n in consts for n in node.input if n) and node.domain in ("", "ai.onnx")
            if node.op_type in ("Shape", "Size") or (all_const and node.op_type != "Identity"):
                consts.update(o for o in node.output if o)
            elif node.op_type not in HANDLERS or node.domain not in ("", "ai.onnx"):
                missing.setdefault(key, []).append(node.name or (node.output[0] if node.output else key))
        if not missing:
            return
        if len(missing) == 1 and len(next(iter(missing.values()))) == 1:
            (op, (first,)), = missing.items()
            raise EqfuseError(f"unsupported ONNX op '{op}' in node '{first}'")
        parts = [f"'{op}' ({len(nodes)} node{'s' * (len(nodes) > 1)}, first '{nodes[0]}')" for op, nodes in missing.items()]
        raise EqfuseError(f"unsupported ONNX ops: {', '.join(parts)}",
                          hint="eqfuse ops lists what eqfuse computes; `eqfuse check MODEL.onnx` lists these again")

    def input(self, vi) -> int:
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is None:
            raise EqfuseError(f"input '{vi.name}' is not a tensor; eqfuse imports tensor inputs only")
        dtype = ONNX_DTYPES.get(tt.elem_type)
        if dtype is None:
            raise EqfuseError(f"input '{vi.name}' has dtype {_dtype_name(tt.elem_type)}; "
                              "eqfuse supports float32, int64, int32 and bool tensors")
        if not tt.HasField("shape"):
            raise EqfuseError(f"input '{vi.name}' has no shape; eqfuse needs every input's rank")
        shape: list[Dim] = []
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                shape.append(int(d.dim_value))
            else:
                name = sanitize(d.dim_param) if d.dim_param else f"{sanitize(vi.name)}_{axis}"
                shape.append(self.dims.get(d.dim_param, self.dims.get(name, name)))
        check_dims(shape, f"input '{vi.name}'")
        return self.add_input(vi.name, TType(tuple(shape), dtype))

    def add_input(self, onnx_name: str, t: TType) -> int:
        return self.graph.add(Node("input", type=t, name=self.names(onnx_name)))

    def output(self, vi) -> int:
        v = self.env.get(vi.name)
        if v is None:
            raise EqfuseError(f"graph output '{vi.name}' is not computed by any node")
        try:
            i = self.data(v, vi.name)
        except Unsupported as e:
            raise EqfuseError(f"unsupported {e} (graph output '{vi.name}')") from None
        n = self.graph.nodes[i]
        if n.name is None and n.op != "const":
            self.graph.nodes[i] = replace(n, name=self.names(vi.name))
        return i

    def import_node(self, node) -> None:
        if node.domain not in ("", "ai.onnx"):
            raise self.error(f"unsupported ONNX op '{node.domain}.{node.op_type}'")
        for name in node.input:
            if name and name not in self.env:
                raise self.error(f"input '{name}' is not defined before its use")
        ins = [self.env[n] if n else None for n in node.input]
        try:
            outs = None
            if self.foldable(node, ins):
                try:
                    outs = self.fold(node, ins)
                except EqfuseError:
                    if node.op_type not in HANDLERS:
                        raise  # else import it as an op over constants, which the optimizer folds or computes
            if outs is None:
                handler = HANDLERS.get(node.op_type)
                if handler is None:
                    raise self.error(f"unsupported ONNX op '{node.op_type}'")
                fn, known = handler
                attrs = {a.name: _attr(a) for a in node.attribute}
                for k in attrs:
                    if k not in known:
                        raise Unsupported(f"attribute '{k}'")
                outs = fn(self, ins, attrs)
        except Unsupported as e:
            raise self.error(f"unsupported {e} of ONNX op '{node.op_type}'") from None
        except (ShapeError, ValueError) as e:
            raise self.error(f"{node.op_type}: {e}") from None
        outs = outs if isinstance(outs, list) else [outs]
        for name, v in zip(node.output, outs):
            if name:
                self.env[name] = v
        for name in node.output[len(outs):]:
            if name:
                raise self.error(f"unsupported output {len(outs) + 1} ('{name}') of ONNX op '{node.op_type}'")

    def error(self, msg: str) -> EqfuseError:
        n = self.node
        where = f" in node '{n.name or (n.output[0] if n.output else n.op_type)}'" if n is not None else ""
        return EqfuseError(msg + where)

    # ------------------------------------------------------------ constants

    def is_const(self, v) -> bool:
        return isinstance(v, np.ndarray)

    def foldable(self, node, ins) -> bool:
        if node.op_type in ("Constant", "Identity") or not node.input:
            return False
        data = [(v, n) for v, n in zip(ins, node.input) if n]
        return all(self.is_const(v) and n not in self.weights for v, n in data)

    def fold(self, node, ins) -> list:
        from onnx.reference import ReferenceEvaluator

        try:
            ev = ReferenceEvaluator(node, opsets={"": self.opset})
            feeds = {n: v for n, v in zip(node.input, ins) if n}
            return [np.asarray(o) for o in ev.run(None, feeds)]
        except Exception as e:
            raise self.error(f"cannot fold ONNX op '{node.op_type}' on constants ({e})") from None

    def ints(self, v, what: str) -> list[int]:
        """A constant integer input (shape, axes, bounds), as a list."""
        if not self.is_const(v):
            raise Unsupported(f"non-constant input {what}")
        if np.asarray(v).dtype.kind not in "iu":
            raise ValueError(f"input {what} must be integers (int64), not {np.asarray(v).dtype}")
        return [int(x) for x in np.asarray(v).reshape(-1)]

    def data(self, v, name: str | None = None) -> int:
        """A value as a node id: a constant becomes a "const" (a scalar) or a parameter."""
        if not self.is_const(v):
            return v
        arr = np.asarray(v)
        if dtype_of_numpy(arr.dtype) is None:
            if arr.dtype.kind != "f":
                raise Unsupported(f"dtype {arr.dtype} of '{name}'")
            arr = arr.astype(F32)  # float64 / float16 constants compute in float32
        if arr.ndim == 0:
            return self.graph.add(Node("const", attrs=(("value", _f32(arr)),), type=TType(())))
        key = name if name is not None and name in self.env and self.env[name] is v else None
        if key is not None and key in self.materialized:
            return self.materialized[key]
        i = self.new_param(name or "const", arr)
        if key is not None:
            self.materialized[key] = i
        return i

    def new_param(self, base: str, arr: np.ndarray) -> int:
        dtype = dtype_of_numpy(arr.dtype) or "f32"
        i = self.add_input(base, TType(tuple(int(d) for d in arr.shape), dtype))
        if 0 in arr.shape:
            raise Unsupported(f"zero-size tensor '{base}'")
        self.params[self.graph.nodes[i].name] = np.ascontiguousarray(arr, dtype=NUMPY_DTYPE[dtype])
        self.param_ids.append(i)
        return i

    def operand(self, v, name: str, other_rank: int) -> int:
        """A binary op's operand: a size-1 constant that cannot change the result shape is a scalar."""
        if self.is_const(v) and v.size == 1 and v.ndim <= other_rank and v.dtype.kind in "fiub":
            return self.graph.add(Node("const", attrs=(("value", _f32(v.reshape(()))),), type=TType(())))
        return self.data(v, name)

    # ------------------------------------------------------------ building ops

    def op(self, name: str, args: list[int], **attrs) -> int:
        spec = OPS[name]
        full = complete_attrs(spec, attrs)
        t = spec.infer([self.graph.nodes[a].type for a in args], full)
        try:
            check_size(t, None)
        except EqfuseError as e:
            raise ValueError(e.message) from None
        return self.graph.add(Node(name, tuple(args), tuple(full.items()), t))

    def const(self, v: float) -> int:
        """A scalar literal (weakly typed: it takes the dtype of the tensor it meets)."""
        return self.graph.add(Node("const", attrs=(("value", float(v)),), type=TType(())))

    def type(self, i: int) -> TType:
        return self.graph.nodes[i].type

    def reshape_to(self, i: int, shape: tuple[Dim, ...]) -> int:
        """reshape(i) to a shape whose dims may be names; at most one name may differ in place."""
        cur = self.type(i).shape
        if tuple(shape) == tuple(cur):
            return i
        names = [d for d in shape if isinstance(d, str)]
        if len(names) > 1:
            raise Unsupported(f"reshape from {list(cur)} to {list(shape)} (several named dims; bind them with dims=)")
        return self.op("reshape", [i], shape=tuple(-1 if isinstance(d, str) else d for d in shape))

    def binary(self, name: str, a, b, names=("", "")) -> int:
        ra = 0 if a is None else (a.ndim if self.is_const(a) else self.type(a).rank)
        rb = b.ndim if self.is_const(b) else self.type(b).rank
        return self.op(name, [self.operand(a, names[0], rb), self.operand(b, names[1], ra)])


def _f32(x) -> float:
    """A float32 number as the shortest float that rounds to it (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(x)))


def _pair(v: list[int]) -> int | tuple[int, int]:
    return v[0] if v[0] == v[1] else tuple(v)


def _attr(a):
    v = helper.get_attribute_value(a)
    return v.decode() if isinstance(v, bytes) else v


def _dtype_name(elem_type: int) -> str:
    return onnx.TensorProto.DataType.Name(elem_type) if onnx else str(elem_type)


def _prune(g: Graph, runtime: list[int], params: list[int]) -> Graph:
    """Drop what no output needs (a LayerNormalization's unused Mean, a weight only Shape read);
    every runtime input stays, used or not, so the call signature is the model's."""
    live = set(g.outputs) | set(runtime)
    for i in range(len(g.nodes) - 1, -1, -1):
        if i in live:
            live.update(g.nodes[i].args)
    order = [i for i in range(len(g.nodes)) if i in live]
    new = {old: k for k, old in enumerate(order)}
    nodes = [replace(g.nodes[i], args=tuple(new[a] for a in g.nodes[i].args)) for i in order]
    inputs = [new[i] for i in runtime + params if i in live]
    return Graph(g.name, nodes, inputs, [new[o] for o in g.outputs])


def _prod(ds) -> tuple[int, tuple[str, ...]]:
    return dim_product(tuple(ds))


def _one_dim(ds) -> Dim:
    """The product of some dims as one dim: an int, or a name times 1."""
    n, names = _prod(ds)
    if not names:
        return n
    if len(names) == 1 and n == 1:
        return names[0]
    raise Unsupported(f"flattening dims {list(ds)} (a product of named dims; bind them with dims=)")


# ---------------------------------------------------------------- handlers, one per ONNX op


HANDLERS: dict[str, tuple[Callable, set[str]]] = {}


def handles(*op_types: str, attrs: tuple[str, ...] = ()):
    def deco(fn):
        for t in op_types:
            HANDLERS[t] = (fn, set(attrs))
        return fn
    return deco


for _onnx, _ours in {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Exp": "exp",
                     "Sqrt": "sqrt", "Neg": "neg", "Abs": "abs", "Log": "log"}.items():
    HANDLERS[_onnx] = ((lambda o: lambda imp, ins, at: imp.op(o, [imp.data(ins[0], imp.node.input[0])]))(_ours),
                       {"consumed_inputs"})


@handles("Reciprocal")
def _reciprocal(imp, ins, at):
    return imp.binary("div", np.asarray(1.0, F32), ins[0], ("", imp.node.input[0]))


@handles("Gelu", attrs=("approximate",))
def _gelu(imp, ins, at):
    return imp.op("gelu", [imp.data(ins[0], imp.node.input[0])], approximate=at.get("approximate", "none"))


@handles("Add", "Sub", "Mul", "Div", "Pow", attrs=("consumed_inputs",))
def _binary(imp, ins, at):
    name = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow"}[imp.node.op_type]
    b = ins[1]
    if name == "pow" and imp.is_const(b) and b.dtype.kind in "iu":  # Pow allows an integer exponent
        b = b.astype(F32)
    return imp.binary(name, ins[0], b, tuple(imp.node.input))


@handles("Max", "Min", "Sum", "Mean")
def _variadic(imp, ins, at):
    t = imp.node.op_type
    name = {"Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add"}[t]
    acc = imp.data(ins[0], imp.node.input[0])
    for v, n in zip(ins[1:], imp.node.input[1:]):
        acc = imp.binary(name, acc, v, ("", n))
    if t == "Mean" and len(ins) > 1:
        acc = imp.binary("div", acc, np.asarray(len(ins), F32))
    return acc


@handles("Identity", "Dropout", attrs=("ratio", "seed", "is_test"))
def _identity(imp, ins, at):
    if imp.node.op_type == "Dropout":
        if len(ins) > 2 and ins[2] is not None and (not imp.is_const(ins[2]) or bool(ins[2])):
            raise Unsupported("training_mode (eqfuse imports models for inference)")
        if len(imp.node.output) > 1 and imp.node.output[1]:
            raise Unsupported("mask output")
    return ins[0]


@handles("Constant", attrs=("value", "value_float", "value_floats", "value_int", "value_ints"))
def _constant(imp, ins, at):
    if "value" in at:
        return tensor_array(at["value"], f"the value of Constant '{imp.node.name or imp.node.output[0]}'")
    if "value_float" in at:
        return np.asarray(at["value_float"], F32)
    if "value_floats" in at:
        return np.asarray(at["value_floats"], F32)
    if "value_int" in at:
        return np.asarray(at["value_int"], np.int64)
    if "value_ints" in at:
        return np.asarray(at["value_ints"], np.int64)
    raise Unsupported("constant kind (sparse or string)")


@handles("Cast", "CastLike", attrs=("to", "saturate", "round_mode"))
def _cast(imp, ins, at):
    if imp.node.op_type == "CastLike":
        target = ins[1]
        to = dtype_of_numpy(target.dtype) if imp.is_const(target) else imp.type(target).dtype
    else:
        to = ONNX_DTYPES.get(at.get("to"), "f32" if at.get("to") in (10, 11, 16) else None)  # f16/f64/bf16 -> f32
    if to is None:
        raise Unsupported(f"cast to {_dtype_name(at.get('to'))}")
    if imp.is_const(ins[0]):
        return np.asarray(ins[0]).astype(NUMPY_DTYPE[to])
    if imp.type(ins[0]).dtype == to:
        return ins[0]
    return imp.op("cast", [ins[0]], to=to)


@handles("Shape", attrs=("start", "end"))
def _shape(imp, ins, at):
    shape = ins[0].shape if imp.is_const(ins[0]) else imp.type(ins[0]).shape
    shape = shape[slice(at.get("start", 0), at.get("end"))]
    if not all(isinstance(d, int) for d in shape):
        raise Unsupported(f"Shape of a tensor with named dims {list(shape)} (bind them with dims=)")
    return np.asarray(shape, np.int64)


@handles("Size")
def _size(imp, ins, at):
    n, names = _prod(ins[0].shape if imp.is_const(ins[0]) else imp.type(ins[0]).shape)
    if names:
        raise Unsupported(f"Size of a tensor with named dims {list(names)} (bind them with dims=)")
    return np.asarray(n, np.int64)


@handles("MatMul")
def _matmul(imp, ins, at):
    a, b = imp.data(ins[0], imp.node.input[0]), imp.data(ins[1], imp.node.input[1])
    ta, tb = imp.type(a).shape, imp.type(b).shape
    if len(ta) == 1:
        a = imp.reshape_to(a, (1,) + ta)
    if len(tb) == 1:
        b = imp.reshape_to(b, tb + (1,))
    y = imp.op("matmul", [a, b])
    out = imp.type(y).shape
    if len(tb) == 1:
        out = out[:-1]
    if len(ta) == 1:
        out = out[:-2] + out[-1:] if len(tb) != 1 else out[:-1]
    return imp.reshape_to(y, out)


@handles("Gemm", attrs=("alpha", "beta", "transA", "transB", "broadcast"))
def _gemm(imp, ins, at):
    a, b = imp.data(ins[0], imp.node.input[0]), imp.data(ins[1], imp.node.input[1])
    if at.get("transA", 0):
        a = imp.op("transpose", [a], perm=(1, 0))
    if at.get("transB", 0):
        b = imp.op("transpose", [b], perm=(1, 0))
    y = imp.op("matmul", [a, b])
    alpha, beta = at.get("alpha", 1.0), at.get("beta", 1.0)
    if alpha != 1.0:
        y = imp.binary("mul", y, np.asarray(alpha, F32))
    if len(ins) > 2 and ins[2] is not None and beta != 0.0:
        c = ins[2]
        if beta != 1.0:
            c = imp.binary("mul", c, np.asarray(beta, F32), (imp.node.input[2], ""))
        y = imp.binary("add", y, c, ("", imp.node.input[2]))
    return y


def _softmax_axis(imp, rank: int, at) -> int:
    axis = at.get("axis", 1 if imp.opset < 13 else -1)
    if not -rank <= axis < rank:
        raise ShapeError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


@handles("Softmax", attrs=("axis",))
def _softmax(imp, ins, at):
    x = imp.data(ins[0], imp.node.input[0])
    shape = imp.type(x).shape
    axis = _softmax_axis(imp, len(shape), at)
    if imp.opset >= 13 or axis == len(shape) - 1:
        return imp.op("softmax", [x], axis=axis - len(shape))
    # Before opset 13, Softmax normalizes over all the dims from `axis` on, flattened.
    flat = imp.reshape_to(x, (_one_dim(shape[:axis]), _one_dim(shape[axis:])))
    return imp.reshape_to(imp.op("softmax", [flat], axis=-1), shape)


@handles("LayerNormalization", attrs=("axis", "epsilon", "stash_type"))
def _layernorm(imp, ins, at):
    x = imp.data(ins[0], imp.node.input[0])
    shape = imp.type(x).shape
    rank = len(shape)
    axis = at.get("axis", -1)
    if not -rank <= axis < rank:
        raise ShapeError(f"axis {axis} is out of range for rank {rank}")
    axis %= rank
    eps = _f32(at.get("epsilon", 1e-5))
    tail = shape[axis:]
    gamma = _norm_param(imp, ins[1], imp.node.input[1], tail, 1.0)
    beta = _norm_param(imp, ins[2] if len(ins) > 2 else None, imp.node.input[2] if len(ins) > 2 else "", tail, 0.0)
    outs = [imp.op("layernorm", [x, gamma, beta], axis=axis - rank, eps=eps)]
    wanted = [o for o in imp.node.output[1:]]
    if any(wanted):
        axes = tuple(range(axis, rank))
        mean = imp.op("mean", [x], axis=axes, keepdims=True)
        d = imp.op("sub", [x, mean])
        var = imp.op("mean", [imp.op("mul", [d, d])], axis=axes, keepdims=True)
        inv = imp.op("rsqrt", [imp.binary("add", var, np.asarray(eps, F32))])
        outs += [mean, inv][:len(wanted)]
    return outs


def _norm_param(imp, v, name: str, tail: tuple[Dim, ...], fill: float) -> int:
    """gamma/beta of exactly the normalized shape (ONNX lets them broadcast)."""
    if v is None:
        if not all(isinstance(d, int) for d in tail):
            raise Unsupported(f"LayerNormalization without bias over named dims {list(tail)}")
        return imp.new_param(f"{imp.node.name or imp.node.output[0]}_{'bias' if fill == 0 else 'scale'}",
                             np.full(tail, fill, F32))
    if imp.is_const(v):
        if tuple(v.shape) != tuple(tail):
            if not all(isinstance(d, int) for d in tail):
                raise Unsupported(f"LayerNormalization parameter {name} of shape {list(v.shape)}")
            return imp.new_param(name, np.broadcast_to(v.astype(F32), tail))
        return imp.data(v, name)
    if imp.type(v).shape != tuple(tail):
        raise Unsupported(f"LayerNormalization parameter '{name}' that broadcasts to the normalized shape")
    return v


@handles("BatchNormalization", attrs=("epsilon", "momentum", "training_mode", "is_test", "spatial",
                                       "consumed_inputs"))
def _batchnorm(imp, ins, at):
    if at.get("training_mode", 0) or len([o for o in imp.node.output if o]) > 1:
        raise Unsupported("training_mode (eqfuse imports models for inference)")
    if at.get("spatial", 1) != 1:
        raise Unsupported("spatial=0")
    x, scale, bias, mean, var = [imp.data(v, n) for v, n in zip(ins, imp.node.input)]
    return imp.op("batchnorm", [x, mean, var, scale, bias], eps=_f32(at.get("epsilon", 1e-5)))


def _axes(imp, ins, at, k: int) -> list[int] | None:
    """Axes from the attribute (older opsets) or input k (newer); None when not given."""
    if "axes" in at:
        return list(at["axes"])
    if len(ins) > k and ins[k] is not None:
        return imp.ints(ins[k], "axes")
    return None


@handles("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceSumSquare", attrs=("axes", "keepdims", "noop_with_empty_axes"))
def _reduce(imp, ins, at):
    x = imp.data(ins[0], imp.node.input[0])
    if 0 in [d for d in imp.type(x).shape if isinstance(d, int)]:
        raise Unsupported("zero-size input")
    t = imp.node.op_type
    if t == "ReduceSumSquare":
        x, t = imp.op("mul", [x, x]), "ReduceSum"
    axes = _axes(imp, ins, at, 1)
    keep = bool(at.get("keepdims", 1))
    if not axes:
        if at.get("noop_with_empty_axes", 0):
            return x
        axes = None
    axis = None if axes is None else tuple(axes)
    name = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min"}[t]
    return imp.op(name, [x], axis=axis, keepdims=keep)


@handles("Transpose", attrs=("perm",))
def _transpose(imp, ins, at):
    x = imp.data(ins[0], imp.node.input[0])
    perm = tuple(at.get("perm", range(imp.type(x).rank - 1, -1, -1)))
    if perm == tuple(range(len(perm))):
        return x
    return imp.op("transpose", [x], perm=perm)


@handles("Reshape", attrs=("allowzero", "shape"))
def _reshape(imp, ins, at):
    x = imp.data(ins[0], imp.node.input[0])
    cur = imp.type(x).shape
    spec = list(at["shape"]) if "shape" in at else imp.ints(ins[1], "shape")
    if at.get("allowzero", 0) and 0 in spec:
        raise Unsupported("allowzero with a zero in the shape (zero-size tensors)")
    out: list[Dim] = [cur[i] if d == 0 else d for i, d in enumerate(spec)]
    if -1 in out:
        n_in, names_in = _prod(cur)
        n_out, names_out = _prod(d for d in out if d != -1)
        rest = list(names_in)
        for nm in names_out:
            if nm not in rest:
                raise Unsupported(f"reshape of {list(cur)} to {spec}")
            rest.remove(nm)
        if n_out == 0 or n_in % n_out:
            raise ShapeError(f"cannot reshape {list(cur)} to {spec}")
        fill = n_in // n_out
        if rest and (len(rest) > 1 or fill != 1):
            raise Unsupported(f"reshape of {list(cur)} to {spec} (the -1 is a product of named dims)")
        out[out.index(-1)] = rest[0] if rest else fill
    return imp.reshape_to(x, tuple(out))


@handles("Flatten", attrs=("axis",))
def _flatten(imp, ins, at):
    x = imp.data(ins[0], imp.node.input[0])
    shape = imp.type(x).shape
    axis = at.get("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    return imp.reshape_to(x, (_one_dim(shape[:axis]), _one_dim(shape[axis:])))


@handles("Squeeze", "Unsqueeze", attrs=("axes",))
def _squeeze(imp, ins, at):
    x = imp.data(ins[0], imp.node.input[0])
    shape = list(imp.type(x).shape)
    axes = _axes(imp, ins, at, 1)
    if imp.node.op_type == "Unsqueeze":
        rank = len(shape) + len(axes)
        for a in sorted(a % rank for a in axes):
            shape.insert(a, 1)
    else:
        rank = len(shape)
        drop = {a % rank for a in axes} if axes is not None else {i for i, d in enumerate(shape) if d == 1}
        if any(shape[a] != 1 for a in drop):
            raise ShapeError(f"cannot squeeze axes {sorted(drop)} of shape {shape}")
        shape = [d for i, d in enumerate(shape) if i not in drop]
    return imp.reshape_to(x, tuple(shape))


@handles("Slice", attrs=("starts", "ends", "axes"))
def _slice(imp, ins, at):
    x = imp.data(ins[0], imp.node.input[0])
    if imp.opset < 10:
        starts, ends, axes, steps = list(at["starts"]), list(at["ends"]), at.get("axes"), None
    else:
        starts, ends = imp.ints(ins[1], "starts"), imp.ints(ins[2], "ends")
        axes = imp.ints(ins[3], "axes") if len(ins) > 3 and ins[3] is not None else None
        steps = imp.ints(ins[4], "steps") if len(ins) > 4 and ins[4] is not None else None
    rank = imp.type(x).rank
    axes = list(range(len(starts))) if axes is None else [a % rank for a in axes]
    steps = steps or [1] * len(starts)
    if any(s < 1 for s in steps):
        raise Unsupported(f"steps {steps} (negative steps: reversing a tensor)")
    for axis, lo, hi, step in zip(axes, starts, ends, steps):
        n = imp.type(x).shape[axis]
        if isinstance(n, str):
            if lo == 0 and hi >= BIG:
                continue
            if lo < 0 or hi < 0 or hi >= BIG or step != 1:
                raise Unsupported(f"slice [{lo}:{hi}:{step}] of named dim {n} (bind it with dims=)")
        else:
            r = range(n)[lo:min(hi, BIG):step]
            lo, hi = r.start, r.stop
            if len(r) == 0:
                raise Unsupported(f"empty slice on axis {axis} (zero-size tensors)")
            if lo == 0 and hi == n and step == 1:
                continue
        x = imp.op("slice", [x], axis=axis, start=lo, stop=hi, step=step)
    return x


@handles("Concat", attrs=("axis",))
def _concat(imp, ins, at):
    args = [imp.data(v, n) for v, n in zip(ins, imp.node.input)]
    return imp.op("concat", args, axis=at.get("axis", 0 if imp.opset < 4 else None))


@handles("Conv", attrs=("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"))
def _conv(imp, ins, at):
    x, w = imp.data(ins[0], imp.node.input[0]), imp.data(ins[1], imp.node.input[1])
    xs, ws = imp.type(x).shape, imp.type(w).shape
    if len(xs) != 4:
        raise Unsupported(f"{len(xs) - 2}-D convolution (eqfuse supports 2-D, NCHW)")
    if at.get("group", 1) != 1:
        raise Unsupported(f"group={at['group']} (only group 1)")
    if any(d != 1 for d in at.get("dilations", [1, 1])):
        raise Unsupported(f"dilations {list(at['dilations'])}")
    strides = list(at.get("strides", [1, 1]))
    k = ws[2:]
    auto = at.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        p = list(at.get("pads", [0, 0, 0, 0]))
        pads = [(p[0], p[2]), (p[1], p[3])]
    elif auto == "VALID":
        pads = [(0, 0), (0, 0)]
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for n, kk, s in zip(xs[2:], k, strides):
            if not isinstance(n, int):
                raise Unsupported("auto_pad SAME over a named spatial dim")
            total = max((math.ceil(n / s) - 1) * s + kk - n, 0)
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
    else:
        raise Unsupported(f"auto_pad {auto!r}")
    # Asymmetric padding: pad both sides by the larger amount and slice the extra outputs off;
    # when the extra is at the end and the stride does not divide it, concatenate zeros there.
    for axis, ((a, b), s) in enumerate(zip(pads, strides), start=2):
        if b > a and (b - a) % s:
            shape = list(imp.type(x).shape)
            if not all(isinstance(d, int) for d in shape):
                raise Unsupported(f"asymmetric pads {[p for p in pads]} with stride {s} over named dims")
            shape[axis] = b - a
            zeros = imp.new_param(f"{imp.node.name or imp.node.output[0]}_pad", np.zeros(shape, F32))
            x = imp.op("concat", [x, zeros], axis=axis)
            xs = imp.type(x).shape
            pads[axis - 2] = (a, a)
    pad = [max(a, b) for a, b in pads]
    args = [x, w] + ([imp.data(ins[2], imp.node.input[2])] if len(ins) > 2 and ins[2] is not None else [])
    y = imp.op("conv2d", args, stride=_pair(strides), padding=_pair(pad))
    for axis, ((a, b), s, n, kk) in enumerate(zip(pads, strides, xs[2:], k), start=2):
        if a == b:
            continue
        first = (max(a, b) - a) // s
        count = (n + a + b - kk) // s + 1
        y = imp.op("slice", [y], axis=axis, start=first, stop=first + count)
    return y


@handles("Split", attrs=("axis", "split", "num_outputs"))
def _split(imp, ins, at):
    x = imp.data(ins[0], imp.node.input[0])
    shape = imp.type(x).shape
    axis = at.get("axis", 0) % len(shape)
    n = shape[axis]
    outs = [o for o in imp.node.output]
    if "split" in at:
        sizes = list(at["split"])
    elif len(ins) > 1 and ins[1] is not None:
        sizes = imp.ints(ins[1], "split")
    else:
        if not isinstance(n, int):
            raise Unsupported(f"Split of named dim {n}")
        k = at.get("num_outputs", len(outs))
        step = -(-n // k)  # the last part may be smaller
        sizes = [min(step, n - i * step) for i in range(k)]
    if not isinstance(n, int):
        raise Unsupported(f"Split of named dim {n}")
    if sum(sizes) != n or min(sizes) <= 0:
        raise ShapeError(f"split sizes {sizes} do not fill dimension {n} (or one is empty)")
    res, lo = [], 0
    for s in sizes:
        res.append(x if s == n else imp.op("slice", [x], axis=axis, start=lo, stop=lo + s))
        lo += s
    return res


from . import onnx_ops  # noqa: E402,F401  (registers the handlers of the mask, index and pooling ops)
