"""Appending ops to a graph while differentiating it: types inferred, identical nodes shared.

The backward graph is written into the forward graph's node list, so a gradient that recomputes
a forward value (`sigmoid(x)` in silu's rule) reads the forward node instead of a copy.
"""

from __future__ import annotations

import numpy as np

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

    def uniform(self, i: int) -> float | None:
        """The value of a constant or of a constant broadcast by expand, else None."""
        n = self.g.nodes[i]
        if n.op == "expand" and self.g.nodes[n.args[0]].op == "const":
            n = self.g.nodes[n.args[0]]
        return n.value if n.op == "const" else None

    def op(self, name: str, args, **attrs) -> int:
        spec = OPS[name]
        try:
            full = complete_attrs(spec, attrs)
            t = spec.infer([self.type(a) for a in args], full)
        except (ShapeError, ValueError) as e:
            raise GradError(f"internal: the gradient's {name} does not type-check: {e}", self.pos) from None
        uniform = [self.uniform(a) for a in args]
        if name == "expand" and uniform[0] is not None:
            args = [self.const(uniform[0])]  # expand(expand(c)) is expand(c)
        elif args and t.dtype == "f32" and all(u is not None for u in uniform) and (
                spec.kind == "pointwise" or name in ("reshape", "transpose")):
            # an op over constants (the loss's seed gradient and what rules make of it) is a
            # constant: folded here, as a scalar is no tensor a layout kernel could read
            v = float(spec.numpy([np.float32(u) for u in uniform], full)) if spec.kind == "pointwise" else uniform[0]
            c = self.const(v)
            return c if t.shape == () else self.op("expand", [c], shape=tuple(t.shape))
        key = self._key(name, args, tuple(full.items()))
        if key not in self.memo:
            self.memo[key] = self.g.add(Node(name, tuple(args), tuple(full.items()), t))
        return self.memo[key]
