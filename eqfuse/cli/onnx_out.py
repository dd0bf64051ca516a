"""`eqfuse opt MODEL --onnx-out fused.onnx`: the optimized graph as ONNX, each kernel an ONNX
local function (FunctionProto) named after its kind, so that the fusion opens in an ONNX viewer
(Netron) and the file runs in onnxruntime.

The graph is lowered as eqfuse.compile lowers it (the pipeline's `lower` stage, no C built), so
the functions are the kernels the compiled module runs and the views it reads in place (kind
`view`, docs/optimizing.md, "Kernel counts"). Inside a function each eqfuse op is one ONNX node
(or a few, for ops ONNX lacks: rsqrt, silu, rmsnorm); an op without a mapping is refused with an
error that names it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from eqfuse.errors import EqfuseError
from eqfuse.ir.graph import Graph, Node

OPSET = 20  # Gelu (opset 20) and the axes-as-input reductions (opset 18)
DOMAIN = "eqfuse.kernels"  # the domain of the kernels' functions

DTYPES = {"f32": np.float32, "f64": np.float64, "i64": np.int64, "i32": np.int32, "bool": np.bool_}
# eqfuse op -> ONNX op of the same meaning, for the ops whose operands and attributes map as they are
POINTWISE = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow", "maximum": "Max",
             "minimum": "Min", "neg": "Neg", "abs": "Abs", "relu": "Relu", "sigmoid": "Sigmoid",
             "tanh": "Tanh", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "erf": "Erf", "sin": "Sin",
             "cos": "Cos", "sign": "Sign", "ceil": "Ceil", "floor": "Floor", "matmul": "MatMul"}
REDUCE = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax"}
INT64_MAX = 2**63 - 1


class Body:
    """The ONNX nodes of one graph (a kernel's body or the top level), with fresh value names."""

    def __init__(self, prefix: str):
        self.nodes: list = []
        self.prefix = prefix
        self.count = 0

    def fresh(self) -> str:
        self.count += 1
        return f"{self.prefix}{self.count}"

    def node(self, op: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        from onnx import helper

        out = out or self.fresh()
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def const(self, value, dtype=np.int64) -> str:
        from onnx import helper, numpy_helper

        out = self.fresh()
        t = numpy_helper.from_array(np.asarray(value, dtype=dtype), out + "_value")
        self.nodes.append(helper.make_node("Constant", [], [out], value=t))
        return out


def op_nodes(b: Body, n: Node, ins: list[str], out: str) -> None:
    """ONNX nodes computing eqfuse op n of inputs `ins` into value `out`."""
    a = n.attr
    if n.op in POINTWISE:
        b.node(POINTWISE[n.op], ins, out)
    elif n.op == "rsqrt":
        b.node("Reciprocal", [b.node("Sqrt", ins)], out)
    elif n.op == "silu":
        b.node("Mul", [ins[0], b.node("Sigmoid", ins)], out)
    elif n.op == "gelu":
        b.node("Gelu", ins, out, approximate=a.get("approximate", "none"))
    elif n.op == "softmax" and not a.get("zero_nan"):
        b.node("Softmax", ins, out, axis=a.get("axis", -1))
    elif n.op == "layernorm":
        b.node("LayerNormalization", ins, out, axis=a.get("axis", -1), epsilon=float(a.get("eps", 1e-5)))
    elif n.op == "rmsnorm":  # x / sqrt(mean(x * x over the last axis) + eps) * gamma
        ms = b.node("ReduceMean", [b.node("Mul", [ins[0], ins[0]]), b.const([-1])], keepdims=1)
        eps = b.const(np.float32(a.get("eps", 1e-6)), np.float32)
        b.node("Mul", [b.node("Div", [ins[0], b.node("Sqrt", [b.node("Add", [ms, eps])])]), ins[1]], out)
    elif n.op in REDUCE:
        axis = a.get("axis")
        axes = [] if axis is None else [axis] if isinstance(axis, int) else list(axis)
        keep = int(bool(a.get("keepdims")))
        if axes:
            b.node(REDUCE[n.op], [ins[0], b.const(axes)], out, keepdims=keep)
        else:  # every axis
            b.node(REDUCE[n.op], ins, out, keepdims=keep)
    elif n.op == "transpose":
        perm = a.get("perm")
        if perm is None:
            b.node("Transpose", ins, out)
        else:
            b.node("Transpose", ins, out, perm=list(perm))
    elif n.op == "reshape":
        b.node("Reshape", [ins[0], b.const(list(a["shape"]))], out)
    elif n.op == "slice":
        stop = a.get("stop")
        b.node("Slice", [ins[0], b.const([a.get("start", 0)]), b.const([INT64_MAX if stop is None else stop]),
                         b.const([a["axis"]]), b.const([a.get("step", 1)])], out)
    elif n.op == "concat":
        b.node("Concat", ins, out, axis=a.get("axis", 0))
    else:
        raise EqfuseError(f"--onnx-out: eqfuse op '{n.op}' has no ONNX mapping; the ops written as ONNX are "
                          + ", ".join(sorted({*POINTWISE, *REDUCE, "rsqrt", "silu", "gelu", "softmax", "layernorm",
                                              "rmsnorm", "transpose", "reshape", "slice", "concat"})))


def scalar_const(b: Body, n: Node, out: str) -> None:
    """A scalar literal of the graph (a rank-0 const of its dtype)."""
    from onnx import helper, numpy_helper

    if n.type.rank:
        raise EqfuseError(f"--onnx-out: a constant tensor of shape {list(n.type.shape)} has no ONNX mapping here")
    t = numpy_helper.from_array(np.asarray(n.value, dtype=DTYPES[n.type.dtype]), out + "_value")
    b.nodes.append(helper.make_node("Constant", [], [out], value=t))


def function(name: str, body: Graph):
    """The FunctionProto of one kernel body: its inputs in order, one output."""
    from onnx import helper

    b = Body("v")
    names: dict[int, str] = {}
    for k, i in enumerate(body.inputs):
        names[i] = f"in{k}"
    for i, n in enumerate(body.nodes):
        if n.op == "input":
            continue
        names[i] = b.fresh()
        if n.op == "const":
            scalar_const(b, n, names[i])
        else:
            op_nodes(b, n, [names[a] for a in n.args], names[i])
    outs = [names[o] for o in body.outputs]
    return helper.make_function(DOMAIN, name, [names[i] for i in body.inputs], outs, b.nodes,
                                [helper.make_opsetid("", OPSET)])


def value_info(name: str, n: Node):
    from onnx import helper

    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(DTYPES[n.type.dtype])),
                                         [d if isinstance(d, int) else str(d) for d in n.type.shape])


def onnx_model(opt: Graph, dims: Mapping[str, int], params: frozenset[str] = frozenset(),
               weights: Mapping[str, np.ndarray] | None = None, precision: str = "f32"):
    """The ModelProto of optimized graph `opt` at `dims` (every dim bound): the top-level graph
    calls one local function per kernel (domain eqfuse.kernels), named after the kernel's kind
    and numbered when a kind has several kernels; `weights` become initializers."""
    from onnx import checker, helper, numpy_helper

    from eqfuse.pipeline import lower

    missing = [d for d in opt.dims() if d not in dims]
    if missing:
        raise EqfuseError(f"--onnx-out needs every dim bound (the kernels are the lowered ones): bind "
                          f"{', '.join(missing)} with --dim NAME=INT")
    _, kg, plans = lower(opt, dims, True, params, precision)
    kinds = {p.node: str(p.kind) for p in plans}
    per_kind: dict[str, int] = {}
    for p in plans:
        per_kind[str(p.kind)] = per_kind.get(str(p.kind), 0) + 1
    seen: dict[str, int] = {}
    top = Body("t")
    names: dict[int, str] = {}
    taken = {n.name for n in kg.nodes if n.name}
    functions, inits = [], []
    for i, n in enumerate(kg.nodes):
        if n.op == "input":
            names[i] = n.name
            continue
        names[i] = n.name if n.name and n.op != "const" else next(f"t{j}" for j in range(i, 10**9)
                                                              if f"t{j}" not in taken)
        taken.add(names[i])
        if n.op == "const":
            scalar_const(top, n, names[i])
        elif n.op == "kernel":
            kind = kinds.get(i, "kernel")
            seen[kind] = seen.get(kind, 0) + 1
            fname = kind if per_kind.get(kind, 1) == 1 else f"{kind}_{seen[kind]}"
            if len(n.body.inputs) != len(n.args):
                raise EqfuseError(f"--onnx-out: kernel {names[i]} reads {len(n.args)} tensors but its body "
                                  f"declares {len(n.body.inputs)} inputs")
            functions.append(function(fname, n.body))
            top.nodes.append(helper.make_node(fname, [names[a] for a in n.args], [names[i]], domain=DOMAIN,
                                              name=names[i]))
        else:  # an op left outside any kernel block: written as it is
            op_nodes(top, n, [names[a] for a in n.args], names[i])
    outputs = []
    for k, o in enumerate(kg.outputs):
        name = f"output{k}" if kg.nodes[o].op == "input" or kg.outputs.index(o) != k else names[o]
        if name != names[o]:  # a returned input or a tensor returned twice: ONNX names each output once
            top.node("Identity", [names[o]], name)
        outputs.append(value_info(name, kg.nodes[o]))
    inputs = []
    for i in kg.inputs:
        n = kg.nodes[i]
        if weights is not None and n.name in weights:
            inits.append(numpy_helper.from_array(np.asarray(weights[n.name]), n.name))
        else:
            inputs.append(value_info(n.name, n))
    graph = helper.make_graph(top.nodes, opt.name, inputs, outputs, initializer=inits)
    model = helper.make_model(graph, functions=functions, producer_name="eqfuse",
                              opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 9  # (onnxruntime reads up to its own version; 9 has local functions)
    checker.check_model(model)
    return model


def write(path: str, model) -> None:
    import onnx

    try:
        onnx.save(model, path)
    except OSError as e:
        raise EqfuseError(f"{path}: cannot write ({e.strerror})") from None
