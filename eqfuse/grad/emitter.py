"""Appending ops to a graph while differentiating it: types inferred, identical nodes shared.

The backward graph is written into the forward graph's node list, so a gradient that recomputes
a forward value (`sigmoid(x)` in silu's rule) reads the forward node instead of a copy.
"""

from __future__ import annotations

from eqfuse.errors import EqfuseError, Pos, ShapeError
from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.ops import OPS, complete_attrs
from eqfuse.ir.shapes import TType


class GradError(EqfuseError):
    """A graph cannot be differentiated (bad --wrt, a non-scalar loss, an op without a rule)."""


class Emitter:
    def __init__(self, g: Graph):
        self.g = Graph(g.name, list(g.nodes), list(g.inputs), list(g.outputs), g.pos)
        self.memo: dict[tuple, int] = {}
        self.pos: Pos | None = None  # the forward node being differentiated, for error messages
        for i, n in enumerate(self.g.nodes):
            if n.op != "input":
                self.memo.setdefault(self._key(n.op, n.args, n.attrs), i)

    @staticmethod
    def _key(op, args, attrs) -> tuple:
        return (op, tuple(args), tuple((k, repr(v)) for k, v in attrs))

    def type(self, i: int) -> TType:
        return self.g.nodes[i].type

    def shape(self, i: int, concrete: bool = True) -> tuple:
        s = self.type(i).shape
        if concrete and not all(isinstance(d, int) for d in s):
            raise GradError(f"this gradient needs concrete dimensions, got {list(s)}: bind the named "
                            "dimensions (--dim NAME=INT, dims=, or call with arrays)", self.pos)
        return s

    def const(self, v: float) -> int:
        key = ("const", (), (("value", repr(float(v))),))
        if key not in self.memo:
            self.memo[key] = self.g.add(Node("const", attrs=(("value", float(v)),), type=TType(())))
        return self.memo[key]

    def op(self, name: str, args, **attrs) -> int:
        spec = OPS[name]
        try:
            full = complete_attrs(spec, attrs)
            t = spec.infer([self.type(a) for a in args], full)
        except (ShapeError, ValueError) as e:
            raise GradError(f"internal: the gradient's {name} does not type-check: {e}", self.pos) from None
        if name in ("reshape", "transpose") and self.g.nodes[args[0]].op == "const":
            # a scalar constant is no tensor to lay out: broadcast it (the loss's seed gradient)
            return self.op("expand", args, shape=tuple(t.shape))
        key = self._key(name, args, tuple(full.items()))
        if key not in self.memo:
            self.memo[key] = self.g.add(Node(name, tuple(args), tuple(full.items()), t))
        return self.memo[key]
