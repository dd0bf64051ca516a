"""The graph IR every stage after parsing works on.

A Graph is a list of single-output nodes in topological order (SSA: a node's args are the ids
of earlier nodes). Pseudo-ops beside the op table: "input" (a parameter), "const" (a scalar
literal) and "kernel" (a fused block; its body is a Graph whose inputs line up with its args).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from eqfuse.errors import EqfuseError, Pos, ShapeError
from eqfuse.ir.ops import OPS
from eqfuse.ir.shapes import TType

Attrs = tuple[tuple[str, Any], ...]
PSEUDO_OPS = ("input", "const", "kernel")


@dataclass(frozen=True)
class Node:
    op: str
    args: tuple[int, ...] = ()
    attrs: Attrs = ()
    type: TType = TType()
    name: str | None = None
    pos: Pos | None = field(default=None, compare=False)
    body: "Graph | None" = None

    @property
    def attr(self) -> dict[str, Any]:
        return dict(self.attrs)

    @property
    def value(self) -> float:
        """The number of a "const" node."""
        return self.attr["value"]


@dataclass
class Graph:
    name: str
    nodes: list[Node] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)  # ids of the "input" nodes, in parameter order
    outputs: list[int] = field(default_factory=list)
    pos: Pos | None = None

    def add(self, node: Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    @property
    def params(self) -> list[tuple[str, TType]]:
        return [(self.nodes[i].name, self.nodes[i].type) for i in self.inputs]

    @property
    def result_types(self) -> list[TType]:
        return [self.nodes[i].type for i in self.outputs]

    def output_names(self) -> list[str]:
        """The outputs' names as `eqfuse run -o` saves them: the node's name, else out<i>."""
        names: list[str] = []
        for i, o in enumerate(self.outputs):
            n = self.nodes[o].name
            names.append(n if n and n not in names else f"out{i}")
        return names

    def users(self) -> list[int]:
        """How many times each node is read (by other nodes and by the return)."""
        count = [0] * len(self.nodes)
        for n in self.nodes:
            for a in n.args:
                count[a] += 1
        for o in self.outputs:
            count[o] += 1
        return count

    def signature(self) -> str:
        params = ", ".join(f"{n}: {t}" for n, t in self.params)
        res = self.result_types
        out = str(res[0]) if len(res) == 1 else "(" + ", ".join(str(t) for t in res) + ")"
        return f"{self.name}({params}) -> {out}"

    def dims(self) -> list[str]:
        """The named dimensions of the parameters, in order of first appearance."""
        seen: list[str] = []
        for _, t in self.params:
            seen += [d for d in t.shape if isinstance(d, str) and d not in seen]
        return seen

    def ancestors(self, i: int) -> set[int]:
        """Node i and every node it depends on (inputs and constants included)."""
        seen, stack = set(), [i]
        while stack:
            j = stack.pop()
            if j not in seen:
                seen.add(j)
                stack.extend(self.nodes[j].args)
        return seen

    def walk(self) -> Iterable[tuple["Graph", int, Node]]:
        """Every node, kernel bodies included (body nodes after their kernel)."""
        for i, n in enumerate(self.nodes):
            yield self, i, n
            if n.body is not None:
                yield from n.body.walk()


def infer_type(node: Node, arg_types: list[TType]) -> TType:
    """The result type of one node from its args' types (raises ShapeError)."""
    if node.op in ("input", "const"):
        return node.type
    if node.op == "kernel":
        body = retype(node.body, arg_types)
        return body.nodes[body.outputs[0]].type
    return OPS[node.op].infer(arg_types, node.attr)


def retype(graph: Graph, input_types: list[TType]) -> Graph:
    """The same graph with new input types, every other type inferred again."""
    nodes = list(graph.nodes)
    for i, t in zip(graph.inputs, input_types):
        nodes[i] = replace(nodes[i], type=t)
    for i, n in enumerate(nodes):
        if n.op == "input":
            continue
        arg_types = [nodes[a].type for a in n.args]
        body = retype(n.body, arg_types) if n.body is not None else None
        try:
            t = infer_type(n, arg_types)
        except ShapeError as e:
            raise EqfuseError(str(e), n.pos) from None
        nodes[i] = replace(n, type=t, body=body)
    return Graph(graph.name, nodes, list(graph.inputs), list(graph.outputs), graph.pos)


def bind_dims(graph: Graph, dims: Mapping[str, int]) -> Graph:
    """Substitute named dimensions by numbers and infer every type again."""
    return retype(graph, [t.bind(dims) for _, t in graph.params])


MAX_ELEMENTS = 1 << 40  # the builder's limit on one tensor (eqfuse.frontend.builder.check_size)


def oversized(graph: Graph, dims: Mapping[str, int]) -> str | None:
    """Why binding `dims` makes some tensor of the graph too large (None when none is): the
    bindings it names, the tensor and its size. Sizes and costs would overflow 64-bit integers."""
    for _, _, n in graph.walk():
        names = [d for d in n.type.shape if isinstance(d, str)]
        if not names or any(d not in dims for d in names):
            continue
        size = n.type.bind(dims).size()
        if size > MAX_ELEMENTS:
            given = ", ".join(f"{d}={dims[d]}" for d in dict.fromkeys(names))
            what = f"'{n.name}'" if n.name else f"the result of {n.op}"
            return (f"{given} make {what} ({n.type}) a tensor of {size} elements, "
                    f"too large (at most 2^40 elements)")
    return None
