"""torch.fx (ATen level, from AOTAutograd) -> Graph IR, and the split of an FX graph into the
parts eqfuse computes and the parts left to torch.

    conv = FxConverter("fused_0")
    graph = conv.convert(submodule)            # every node of `submodule` must be supported
    why = support.reason(node)                 # None when eqfuse can take the node, else why not

The graphs are functional ATen (AOTAutograd functionalizes in-place ops and lifts the module's
parameters and buffers to graph inputs), with concrete shapes in each node's meta["val"] (a fake
tensor). One handler per ATen overload (eqfuse/frontend/torch_aten.py) turns a node into ops of
the op table; every converted node's type is checked against torch's shape and dtype, so a node
whose conversion disagrees with torch is refused (and runs in torch) rather than miscomputed.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import fx

from eqfuse.errors import ShapeError
from eqfuse.frontend.onnx_inputs import sanitize
from eqfuse.frontend.torch_aten import (
    DTYPES,
    EMPTY,
    HANDLERS,
    Unsupported,
    V,
)
from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.ops import OPS, complete_attrs
from eqfuse.ir.shapes import TType


def op_name(node: fx.Node) -> str:
    t = node.target
    return str(t).removeprefix("aten.") if isinstance(t, torch._ops.OpOverload) else getattr(t, "__name__", str(t))


def is_empty(val) -> bool:
    """Whether torch's value is a tensor of known shape with no element."""
    return isinstance(val, torch.Tensor) and all(isinstance(d, int) for d in val.shape) and 0 in tuple(val.shape)


def ttype(val, what: str = "value") -> TType:
    """The eqfuse type of a fake tensor (Unsupported for dtypes, devices and sizes eqfuse lacks)."""
    if not isinstance(val, torch.Tensor):
        raise Unsupported(f"a non-tensor {what} ({type(val).__name__})")
    if val.dtype not in DTYPES:
        raise Unsupported(f"dtype {str(val.dtype).removeprefix('torch.')}")
    if val.device.type != "cpu":
        raise Unsupported(f"device {val.device}")
    shape = tuple(val.shape)
    if not all(isinstance(d, int) for d in shape):
        raise Unsupported("symbolic shape")
    if any(d == 0 for d in shape):
        raise Unsupported("a zero-size tensor")
    return TType(tuple(int(d) for d in shape), DTYPES[val.dtype])


class FxConverter:
    """Builds one Graph from FX nodes; handlers call the helpers below."""

    def __init__(self, name: str):
        self.graph = Graph(sanitize(name) or "fx")
        self.placeholders: list[str | None] = []  # convert's inputs in order: their names, None for a zero-size one
        self.env: dict[fx.Node, Any] = {}
        self.taken: set[str] = set()
        self.node: fx.Node | None = None  # the node being converted: handlers read its meta["val"]

    # ------------------------------------------------------------ building

    def add_input(self, name: str, t: TType) -> V:
        base = sanitize(name)
        out, k = base, 1
        while out in self.taken:
            k += 1
            out = f"{base}_{k}"
        self.taken.add(out)
        i = self.graph.add(Node("input", type=t, name=out))
        self.graph.inputs.append(i)
        return V(i)

    def op(self, name: str, *args: Any, **attrs) -> V:
        ids = [self.tensor(a).id for a in args]
        full = complete_attrs(OPS[name], attrs)
        try:
            t = OPS[name].infer([self.graph.nodes[i].type for i in ids], full)
        except ShapeError as e:
            raise Unsupported(f"{name}: {e}") from None
        return V(self.graph.add(Node(name, tuple(ids), tuple(full.items()), t)))

    def const(self, value: float) -> V:
        return V(self.graph.add(Node("const", attrs=(("value", float(value)),), type=TType(()))))

    def tensor(self, v: Any) -> V:
        """A handler's operand as a node: a Python number becomes a (weakly typed) constant."""
        if isinstance(v, V):
            return v
        if isinstance(v, (bool, int, float)):
            return self.const(float(v))
        if v is EMPTY:
            raise Unsupported("a zero-size tensor")
        raise Unsupported(f"operand {v!r}")

    def type(self, v: V) -> TType:
        return self.graph.nodes[v.id].type

    def is_scalar_const(self, v: Any) -> bool:
        return not isinstance(v, V) or self.graph.nodes[v.id].op == "const"

    def cast(self, v: Any, dtype: str) -> Any:
        if not isinstance(v, V) or self.graph.nodes[v.id].op == "const" or self.type(v).dtype == dtype:
            return v
        return self.op("cast", v, to=dtype)

    @property
    def out(self):
        """torch's value of the node being converted (a fake tensor, or a tuple of them)."""
        return self.node.meta.get("val")

    @property
    def out_type(self) -> TType:
        return ttype(self.out)

    # ------------------------------------------------------------ converting

    def resolve(self, a: Any) -> Any:
        if isinstance(a, fx.Node):
            if a not in self.env:
                raise Unsupported(f"input '{a.name}' is not available")
            return self.env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self.resolve(x) for x in a)
        if isinstance(a, torch.SymInt):
            raise Unsupported("symbolic integer")
        return a

    def convert_node(self, node: fx.Node) -> Any:
        """Converts one call_function node (its inputs already in env); returns its value."""
        self.node = node
        if node.op != "call_function":
            raise Unsupported(f"{node.op} node")
        if node.target is _getitem:
            src = self.resolve(node.args[0])
            item = src[node.args[1]] if isinstance(src, (tuple, list)) else None
            if item is None:
                raise Unsupported(f"output {node.args[1]} of {op_name(node.args[0])}")
            return item
        fn = HANDLERS.get(node.target)
        if fn is None:
            raise Unsupported("no eqfuse equivalent")
        try:
            value = fn(self, *self.resolve(node.args), **self.resolve(node.kwargs))
        except (ShapeError, ValueError) as e:
            raise Unsupported(str(e)) from None
        except (TypeError, KeyError, IndexError, AttributeError) as e:  # a call form the handler does not know
            raise Unsupported(f"arguments not understood ({type(e).__name__}: {e})") from None
        self.check(value, self.out)
        return value

    def check(self, value: Any, val: Any) -> None:
        """The converted value's type must be torch's (a weak scalar constant may stand for a 0-d tensor)."""
        if isinstance(value, (tuple, list)):
            for v, t in zip(value, val):
                if v is not None:
                    self.check(v, t)
            return
        if (value is EMPTY) != is_empty(val):
            raise Unsupported("a zero-size tensor")
        if value is EMPTY:
            return
        want = ttype(val)
        got = self.type(self.tensor(value))
        if got.shape != want.shape or (got.dtype != want.dtype and not self.is_scalar_const(value)):
            raise Unsupported(f"converted to {got}, torch computes {want}")

    def convert(self, gm: fx.GraphModule) -> Graph:
        """The Graph of a whole (sub)module: placeholders are its inputs, in order."""
        outputs: list = []
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                val = node.meta.get("val")
                # (a zero-size input is no parameter of the graph: EqfuseGraph passes it no array)
                self.env[node] = EMPTY if is_empty(val) else self.add_input(node.name, ttype(val, f"input '{node.name}'"))
                self.placeholders.append(None if is_empty(val) else self.graph.nodes[self.env[node].id].name)
            elif node.op == "output":
                outs = node.args[0]
                outputs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
            else:
                self.env[node] = self.convert_node(node)
        for o in outputs:
            if self.env[o] is EMPTY:
                raise Unsupported("a zero-size result")
            v = self.tensor(self.env[o])
            self.node = o
            v = self.cast(v, ttype(o.meta["val"]).dtype) if self.graph.nodes[v.id].op != "const" else v
            if self.graph.nodes[v.id].op == "const":  # a constant result: a real 0-d (or broadcast) tensor
                v = self.op("cast", self.op("expand", v, shape=tuple(self.out_type.shape)), to=self.out_type.dtype)
            self.graph.outputs.append(v.id)
        return self.graph


_getitem = __import__("operator").getitem


class Support:
    """Which nodes eqfuse computes: a node is supported when it converts on its own (inputs made
    from torch's types) and every tuple item its users take converts too. Reasons are kept."""

    def __init__(self):
        self.reasons: dict[fx.Node, str | None] = {}
        self.values: dict[fx.Node, Any] = {}

    def reason(self, node: fx.Node) -> str | None:
        if node not in self.reasons:
            self.reasons[node] = self._reason(node)
        return self.reasons[node]

    def _reason(self, node: fx.Node) -> str | None:
        if node.op != "call_function":
            return f"{node.op} node"
        if node.target is _getitem:
            src = node.args[0]
            if not isinstance(src, fx.Node) or self.reason(src) is not None:
                return "item of an unsupported node"
            vals = self.values.get(src)
            return None if isinstance(vals, (tuple, list)) and vals[node.args[1]] is not None else \
                f"output {node.args[1]} of {op_name(src)}"
        conv = FxConverter("probe")
        try:
            for a in node.all_input_nodes:
                conv.env[a] = _probe_input(conv, a)
            value = conv.convert_node(node)
        except Unsupported as e:
            return str(e)
        if isinstance(value, (tuple, list)):
            for u in node.users:
                if u.target is not _getitem or value[u.args[1]] is None:
                    return f"{'output ' + str(u.args[1]) if u.target is _getitem else 'a tuple result'} is needed"
        self.values[node] = value
        return None


def _probe_input(conv: FxConverter, a: fx.Node) -> Any:
    val = a.meta.get("val")
    if isinstance(val, (tuple, list)):
        return type(val)(conv.add_input(f"{a.name}_{k}", ttype(v)) if isinstance(v, torch.Tensor) else None
                         for k, v in enumerate(val))
    if is_empty(val):
        return EMPTY
    return conv.add_input(a.name, ttype(val, f"input '{a.name}'"))


def fallback_counts(gm: fx.GraphModule, support: Support) -> Counter:
    """(op, reason) -> count of the call_function nodes left to torch."""
    out: Counter = Counter()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is not _getitem:
            why = support.reason(node)
            if why is not None:
                out[(op_name(node), why)] += 1
    return out
