"""ONNX -> Graph IR: every ONNX node becomes eqfuse ops from the op table.

    model = import_model("model.onnx")      # Imported(graph, params)
    graph = import_onnx("model.onnx")        # what `eqfuse.frontend.load.load` calls
    params = onnx_params("model.onnx")       # {param name: float32 array}, for compile(params=)

Contract with `eqfuse.compile`: the graph's parameters are the model's runtime inputs (ONNX
order) followed by its weights. Every float initializer (and every constant tensor that is
not a scalar) that the graph reads as data becomes a parameter, named like the initializer
(sanitized); `onnx_params` returns exactly those arrays, so `compile(path, params=onnx_params(path))`
leaves only the runtime inputs to pass. Values known at import time that steer shapes (Reshape
shapes, Slice bounds, reduction axes, Shape of a concrete tensor, ...) are folded away and never
become parameters; scalars (and size-1 constants that cannot change a result's shape) become
"const" nodes; a weight nothing reads as data is dropped.

Dynamic dims (dim_param) become named dims unless `dims=` binds them. The shape arithmetic an
exporter writes over a named dim (Shape of a [batch, 16] tensor, Concat, Reshape to it) folds
symbolically, the name kept (eqfuse/frontend/onnx_symbolic.py). `values=` fixes runtime
inputs at import time (the onnx backend uses it for integer inputs such as a Reshape's shape).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from eqfuse.errors import DimsNeeded, EqfuseError, NamedSum, ShapeError
from eqfuse.frontend import onnx_handlers, onnx_ops, onnx_quant  # noqa: F401  (their @handles fill HANDLERS)
from eqfuse.frontend import onnx_symbolic as sy
from eqfuse.frontend import onnx_symbolic_ops as so
from eqfuse.frontend.builder import check_size
from eqfuse.frontend.onnx_inputs import (
    DIMS_HINT,
    Imported,
    graph_name,
    load_model,
    sanitize,
    window_slices,
)
from eqfuse.frontend.onnx_registry import (
    HANDLERS,
    ONNX_DOMAINS,
    ONNX_DTYPES,
    Empty,
    NeedsDims,
    Unsupported,
    check_dims,
    dtype_name,
    f32_float,
    handler_key,
    tensor_array,
)
from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.ops import OPS, complete_attrs
from eqfuse.ir.shapes import NUMPY_DTYPE, Dim, TType, dtype_of_numpy

try:
    import onnx
    from onnx import helper
except ImportError:  # pragma: no cover - exercised only without the optional dependency
    onnx = None

F32 = np.float32


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
                 values: Mapping[str, np.ndarray] | None = None, whole_windows: bool = False) -> Imported:
    """The model's graph and weights. whole_windows=True imports the Slices that keep a
    sliding-window layer's last cache rows as identities (onnx_inputs.window_slices): compile's
    live= steps keep such a cache whole."""
    if onnx is None:
        raise EqfuseError("importing ONNX models needs the onnx package", hint="pip install 'eqfuse[onnx]'")
    proto = load_model(model)
    _check_text(proto)
    imp = _Importer(proto, dict(dims or {}), dict(values or {}))
    if whole_windows:
        imp.rewrites = window_slices(proto)
    return imp.run()


def _check_text(proto) -> None:
    """Every name and op type must be text: protobuf hands a string field that is not valid
    UTF-8 back as bytes (a damaged file), which the importer would trip on."""
    g = proto.graph
    fields = [("the graph's name", g.name)]
    for n in g.node:
        fields += [(f"node '{n.name}'", x) for x in (n.name, n.op_type, n.domain, *n.input, *n.output)]
        fields += [(f"an attribute of node '{n.name}'", a.name) for a in n.attribute]
    fields += [("a tensor name", t.name) for t in (*g.initializer, *g.input, *g.output, *g.value_info)]
    for where, x in fields:
        if not isinstance(x, str):
            raise EqfuseError(f"not a readable ONNX model: {where} has a string that is not UTF-8 text ({x!r:.60})")


# Ops that draw random numbers: folding one over constants would freeze one draw into the model
# (ViTMAE's patch shuffle draws its noise with RandomUniformLike), so they are never folded.
RANDOM_OPS = frozenset({"RandomUniformLike", "RandomNormalLike", "Multinomial", "Bernoulli"})


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


# the ops that fold over weights of one element (`_Importer.foldable`): their result is one element too
SCALAR_FOLDS = frozenset({"QuantizeLinear", "DequantizeLinear", "Cast", "Add", "Sub", "Mul", "Div", "Neg", "Sqrt",
                          "Floor", "Ceil", "Round", "Min", "Max", "Clip", "Reshape", "Unsqueeze", "Squeeze"})


class _Importer:
    def __init__(self, model, dims: dict[str, int], values: dict[str, np.ndarray]):
        self.model = model
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        self.dims = dims
        self.values = values
        self.names = _Namer()
        self.graph = Graph(graph_name(model))
        self.env: dict[str, Any] = {}
        self.weights: set[str] = set()  # ONNX names of float initializers: parameters, never folded (`foldable`)
        self.params: dict[str, np.ndarray] = {}
        self.param_ids: list[int] = []
        self.materialized: dict[str, int] = {}
        self.node: Any = None  # the ONNX node being imported, for error messages
        self.named_at: dict[str, tuple[int, int]] = {}  # named dim -> (an input node, its axis)
        self.memo: dict[tuple, int] = {}  # nodes built once per import (a named dim's carrier, size)
        self.sym_nodes: dict[int, Any] = {}  # node computing a Sym at run time -> the Sym, for errors
        self.rewrites: dict[str, str] = {}  # output of a node -> "identity" or "zero" (import_model's whole_windows)
        # every value a node or the graph's outputs read (an output no one reads may go uncomputed)
        self.read: set[str] = {n for node in model.graph.node for n in node.input} | {o.name for o in model.graph.output}

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
        looked = False
        for k, node in enumerate(g.node):
            self.node = node
            if not looked and handler_key(node.op_type, node.domain) not in HANDLERS:
                # before the first error, look ahead: the message lists every op missing. Once:
                # the look-ahead follows the constants through the nodes after this one, so it
                # has checked theirs (a look-ahead at every node without a handler made the import
                # quadratic in the graph's size)
                consts = {n for n, v in self.env.items() if self.is_const(v) or isinstance(v, sy.Sym)}
                self.check_ops(list(g.node)[k:], consts)
                looked = True
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
            key = handler_key(node.op_type, node.domain)
            all_const = all(n in consts for n in node.input if n) and node.domain in ONNX_DOMAINS
            if node.op_type in ("Shape", "Size") or (all_const and node.op_type != "Identity"):
                consts.update(o for o in node.output if o)
            elif key not in HANDLERS:
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
            raise EqfuseError(f"input '{vi.name}' has dtype {dtype_name(tt.elem_type)}; "
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
        i = self.add_input(vi.name, TType(tuple(shape), dtype))
        for axis, d in enumerate(shape):
            if isinstance(d, str):
                self.named_at.setdefault(d, (i, axis))
        return i

    def add_input(self, onnx_name: str, t: TType) -> int:
        return self.graph.add(Node("input", type=t, name=self.names(onnx_name)))

    def output(self, vi) -> int:
        v = self.env.get(vi.name)
        if v is None:
            raise EqfuseError(f"graph output '{vi.name}' is not computed by any node")
        try:
            i = self.data(v, vi.name)
        except Unsupported as e:
            if isinstance(e, NeedsDims):
                raise DimsNeeded(f"unsupported {e} (graph output '{vi.name}')", hint=DIMS_HINT) from None
            raise EqfuseError(f"unsupported {e} (graph output '{vi.name}')") from None
        n = self.graph.nodes[i]
        if n.name is None and n.op != "const":
            self.graph.nodes[i] = replace(n, name=self.names(vi.name))
        return i

    def import_node(self, node) -> None:
        key = handler_key(node.op_type, node.domain)
        if key not in HANDLERS and node.domain not in ONNX_DOMAINS:
            raise self.error(f"unsupported ONNX op '{key}'")
        for name in node.input:
            if name and name not in self.env:
                raise self.error(f"input '{name}' is not defined before its use")
        self.check_arity(node)
        how = self.rewrites.get(node.output[0]) if node.output else None
        if how == "identity":
            self.env[node.output[0]] = self.env[node.input[0]]
            return
        if how == "zero":  # (Max(0, past - k): its constant operand)
            self.env[node.output[0]] = np.zeros_like(next((v for v in map(self.env.get, node.input)
                                                           if isinstance(v, np.ndarray)), np.int64(0)))
            return
        ins = [self.env[n] if n else None for n in node.input]
        try:
            outs = None
            empty = next((v for v in ins if isinstance(v, Empty)), None)
            if empty is not None and node.op_type != "Concat":
                raise Unsupported(f"{empty.why} (zero-size tensors), read by this op")
            attrs = {a.name: _attr(a) for a in node.attribute}
            try:
                if any(isinstance(v, sy.Merged) for v in ins):
                    outs = so.merged_op(self, ins, attrs)
                elif any(isinstance(v, sy.Sym) for v in ins):
                    outs = so.sym_op(self, ins, attrs)
                    if outs is None:  # computed at run time
                        ins = [sy.materialize(self, v) if isinstance(v, sy.Sym) else v for v in ins]
            except (IndexError, KeyError, TypeError, ZeroDivisionError) as e:  # a malformed shape value
                raise self.error(f"cannot import ONNX op '{node.op_type}' over a shape value with named dims "
                                 f"({type(e).__name__}: {e})") from None
            if outs is None and self.foldable(node, ins):
                try:
                    outs = self.fold(node, ins)
                except EqfuseError:
                    if key not in HANDLERS:
                        raise  # else import it as an op over constants, which the optimizer folds or computes
            if outs is None:
                handler = HANDLERS.get(key)
                if handler is None:
                    raise self.error(f"unsupported ONNX op '{node.op_type}'")
                fn, known = handler
                for k in attrs:
                    if k not in known:
                        raise Unsupported(f"attribute '{k}'")
                outs = fn(self, ins, attrs)
        except NeedsDims as e:
            raise DimsNeeded(self.error(f"unsupported {e} of ONNX op '{node.op_type}'").message, hint=DIMS_HINT) from None
        except NamedSum as e:  # concat along a named axis: the model is bound per call (runtime.padded)
            err = DimsNeeded(self.error(f"{node.op_type}: {e}").message, hint=DIMS_HINT)
            err.sums = e.names
            raise err from None
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

    def check_arity(self, node) -> None:
        """As many inputs as the op's schema at the model's opset allows (the handlers index them)."""
        try:
            schema = onnx.defs.get_schema(node.op_type, self.opset, node.domain or "")
        except Exception:  # no schema (an op onnx does not know): the handler's own error follows
            return
        n, lo, hi = len(node.input), schema.min_input, schema.max_input
        if not lo <= n <= hi:
            want = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi < 1 << 30 else f"at least {lo}"
            raise self.error(f"ONNX op '{node.op_type}' takes {want} input{'s' * (want != '1')}, not {n}")

    def error(self, msg: str) -> EqfuseError:
        n = self.node
        where = f" in node '{n.name or (n.output[0] if n.output else n.op_type)}'" if n is not None else ""
        return EqfuseError(msg + where)

    # ------------------------------------------------------------ constants

    def is_const(self, v) -> bool:
        return isinstance(v, np.ndarray)

    def foldable(self, node, ins) -> bool:
        """Every input a constant, and none a weight, unless every input is one element: a
        quantized model quantizes its float arithmetic on shapes too (quantize_static: MobileViT's
        patch counts), a QuantizeLinear and a DequantizeLinear of a constant whose scale is a
        weight of one element; those fold, so that a Reshape reading the result sees a constant.
        (A weight's DequantizeLinear keeps it quantized: its data has more elements. Only ops whose
        result is as small as their inputs, SCALAR_FOLDS: an Expand of a scalar weight stays an op.)
        The QOperator form's contrib ops of that arithmetic (QLinearMul, QLinearAdd) fold too, by
        eqfuse's own evaluation (onnx_quant.CONTRIB_FOLDS)."""
        if (node.op_type in ("Constant", "Identity") or node.op_type in RANDOM_OPS or not node.input
                or (node.domain not in ONNX_DOMAINS and (node.domain, node.op_type) not in onnx_quant.CONTRIB_FOLDS)):
            return False
        data = [(v, n) for v, n in zip(ins, node.input) if n]
        if not all(self.is_const(v) for v, _ in data):
            return False
        return all(n not in self.weights for _, n in data) or \
            ((node.op_type in SCALAR_FOLDS or node.domain not in ONNX_DOMAINS) and all(np.size(v) == 1 for v, _ in data))

    def fold(self, node, ins) -> list:
        from onnx.reference import ReferenceEvaluator

        contrib = onnx_quant.CONTRIB_FOLDS.get((node.domain, node.op_type))
        if contrib is not None:
            return contrib(node, [v if n else None for v, n in zip(ins, node.input)])
        try:
            ev = ReferenceEvaluator(node, opsets={"": self.opset})
            feeds = {n: v for n, v in zip(node.input, ins) if n}
            return [np.asarray(o) for o in ev.run(None, feeds)]
        except Exception as e:
            raise self.error(f"cannot fold ONNX op '{node.op_type}' on constants ({e})") from None

    def ints(self, v, what: str) -> list[int]:
        """A constant integer input (shape, axes, bounds), as a list."""
        v = self.sym_nodes.get(v, v) if isinstance(v, int) else v  # a Sym computed at run time
        if isinstance(v, sy.Sym):
            raise NeedsDims(f"input {what} {v}, which depends on named dims (bind them with dims=)")
        if not self.is_const(v):
            raise Unsupported(f"non-constant input {what}")
        if np.asarray(v).dtype.kind not in "iu":
            raise ValueError(f"input {what} must be integers (int64), not {np.asarray(v).dtype}")
        return [int(x) for x in np.asarray(v).reshape(-1)]

    def data(self, v, name: str | None = None) -> int:
        """A value as a node id: a constant becomes a "const" (a scalar) or a parameter."""
        if isinstance(v, sy.Sym):
            return sy.materialize(self, v)
        if isinstance(v, Empty):
            raise Unsupported(f"{v.why} (zero-size tensors)")
        if isinstance(v, sy.Merged):
            raise NeedsDims(f"a tensor of shape {v} (a named dim multiplied with others; bind it with dims=)")
        if not self.is_const(v):
            return v
        arr = np.asarray(v)
        if dtype_of_numpy(arr.dtype) is None:
            if arr.dtype.kind != "f":
                raise Unsupported(f"dtype {arr.dtype} of '{name}'")
            arr = arr.astype(F32)  # float64 / float16 constants compute in float32
        if arr.ndim == 0 and arr.dtype not in (np.uint8, np.int8):  # a quantized zero point keeps its type
            return self.graph.add(Node("const", attrs=(("value", f32_float(arr)),), type=TType(())))
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
        # np.array, not np.ascontiguousarray: that makes a rank-0 parameter (a zero point) 1-D. An
        # initializer's read-only array (numpy's view of its immutable bytes, which nothing can
        # change) is kept as it is when it has the dtype and layout: a second copy of every weight
        # was most of a warm compile's import
        keep = not arr.flags.writeable and arr.flags.c_contiguous and arr.dtype == NUMPY_DTYPE[dtype]
        self.params[self.graph.nodes[i].name] = arr if keep else np.array(arr, dtype=NUMPY_DTYPE[dtype], order="C")
        self.param_ids.append(i)
        return i

    def operand(self, v, name: str, other_rank: int) -> int:
        """A binary op's operand: a size-1 constant that cannot change the result shape is a scalar."""
        if self.is_const(v) and v.size == 1 and v.ndim <= other_rank and v.dtype.kind in "fiub":
            return self.graph.add(Node("const", attrs=(("value", f32_float(v.reshape(()))),), type=TType(())))
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
            raise NeedsDims(f"reshape from {list(cur)} to {list(shape)} (several named dims; bind them with dims=)")
        return self.op("reshape", [i], shape=tuple(-1 if isinstance(d, str) else d for d in shape))

    def binary(self, name: str, a, b, names=("", "")) -> int:
        ra = 0 if a is None else (a.ndim if self.is_const(a) else self.type(a).rank)
        rb = b.ndim if self.is_const(b) else self.type(b).rank
        return self.op(name, [self.operand(a, names[0], rb), self.operand(b, names[1], ra)])


def _attr(a):
    """An attribute's value; a damaged one (no type, or a type with no value) is a ValueError,
    reported for its node."""
    try:
        v = helper.get_attribute_value(a)
    except Exception as e:  # onnx's helper raises for a type it does not know
        raise ValueError(f"attribute '{a.name}' cannot be read ({e})") from None
    if v is None:
        raise ValueError(f"attribute '{a.name}' has no value (attribute type {a.type})")
    return v.decode() if isinstance(v, bytes) else v


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


