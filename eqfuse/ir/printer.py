"""Graph IR -> canonical .g text. Printing, parsing and printing again gives the same text.

A node gets its own `name = ...` line when it has a name, is read more than once, is a kernel
read by another kernel, is read by a kernel block, or would nest too deeply; everything else is
inlined into its reader.

Views: `graph_text(g, views=ids)` prints the kernels `ids` (those lowering reads in place: a
reshape, transpose or slice, which run no code) as their ops outside any kernel block,
`v = reshape(k1, shape=[2, 16, 4, 16])`. Kernel blocks are the kernels that run; an op outside a
block in a fused graph is a view. It reads back as that op, which optimizing or lowering again
makes the same view.
"""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np

from eqfuse.ir.dtypes import f32_literal, f32_of_decimal, round_f32, same_f32
from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.ops import OPS

MAX_INLINE_DEPTH = 24
WRAP = 100

# Precedence levels, as in the grammar: compare < sum < product < unary < power < atom.
COMPARE, SUM, PRODUCT, UNARY, POWER, ATOM = 0, 1, 2, 3, 4, 5
PREC = {"+": SUM, "-": SUM, "*": PRODUCT, "/": PRODUCT, "@": PRODUCT, "**": POWER,
        **{c: COMPARE for c in ("==", "!=", "<", "<=", ">", ">=")}}


def fmt_number(v: float) -> str:
    """The text of a constant: reads back (eqfuse.frontend.parser) as the same f32 bits.

    Integers print exactly (so that i64 uses keep them); other values print as Python's shortest
    text of the double, unless that text lies on the other side of an f32 halfway point than the
    double does (then the f32's shortest text)."""
    f = round_f32(v)
    if math.isnan(v):
        return "nan"
    if np.isinf(f):  # beyond the f32 range too: the constant means inf, as the reference computes it
        return "-inf" if f < 0 else "inf"
    if v == 0 and math.copysign(1, v) < 0:
        return "-0"  # not "0": 1 / -0 is -inf
    if float(v).is_integer() and abs(v) < 1e16:
        return str(int(v))  # exact
    for text in _spellings(float(v), f):
        if same_f32(f32_of_decimal(text), f):
            return text
    raise AssertionError(f"no spelling of {v!r} reads back as {f!r}")


def _spellings(v: float, f: np.float32):
    yield repr(v)
    if v.is_integer():
        yield str(int(v))  # exact
    yield repr(f32_literal(f))
    yield str(Decimal(float(f)))  # exact


def fmt_attr(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, tuple):
        return "[" + ", ".join(fmt_attr(x) for x in v) + "]"
    if isinstance(v, float):  # 1.0 stays a float (the parser reads 1 as an int)
        return repr(v) if v.is_integer() and np.isfinite(round_f32(v)) else fmt_number(v)
    return str(v)


def _is_default(v, default) -> bool:
    """An attribute left out when printed: value=-0.0 is not the default 0.0 (1 / -0 is -inf)."""
    if isinstance(v, float) and v == 0 and isinstance(default, (int, float)):
        return default == 0 and math.copysign(1.0, v) == math.copysign(1.0, default)
    return v == default


class Printer:
    def __init__(self, graph: Graph, names: dict[int, str], taken: set[str]):
        self.g = graph
        self.users = graph.users()
        self.taken = taken
        self.names = dict(names)  # node id -> the name it is printed as
        self.used = set(self.names.values())  # those names, for a test in O(1) (a 20,000-node graph)
        self.lines: list[str] = []
        self.depth: dict[int, int] = {}
        self.counter = 0
        self.indent = ""  # of the lines being printed, so a kernel inlined into a return nests under it
        self.kernel_reads = {a for n in graph.nodes if n.op == "kernel" for a in n.args}  # printed by name

    def fresh(self, base: str) -> str:
        while True:
            self.counter += 1
            name = f"{base}{self.counter}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def needs_line(self, i: int, n: Node) -> bool:
        if n.op in ("input", "const") and i in self.names:
            return False
        if n.name is not None or self.users[i] > 1 or i in self.kernel_reads:
            return True
        if n.op == "kernel":
            # A kernel read by an op other than the return is named so its body stays readable.
            return i not in self.g.outputs
        return self.depth.get(i, 1) > MAX_INLINE_DEPTH

    def expr(self, i: int) -> tuple[str, int]:
        """The text of node i as an expression, and its precedence."""
        if i in self.names:
            return self.names[i], ATOM
        n = self.g.nodes[i]
        if n.op == "const":
            text = fmt_number(n.value)
            return text, (UNARY if text.startswith("-") else ATOM)
        if n.op == "kernel":
            return kernel_text(n, self.names, self.taken, indent=self.indent), ATOM
        op = OPS[n.op]
        if n.op == "neg":
            a, pa = self.expr(n.args[0])
            if pa == ATOM and (a[0].isdigit() or a in ("inf", "nan")):  # "-2" would be read back as
                # the constant -2, not neg(2)
                return f"neg({a})", ATOM
            return "-" + (a if pa >= UNARY else f"({a})"), UNARY
        if op.infix:
            p = PREC[op.infix]
            (a, pa), (b, pb) = self.expr(n.args[0]), self.expr(n.args[1])
            if p == POWER:  # right-associative; the left side must be an atom
                a = a if pa == ATOM else f"({a})"
                b = b if pb >= UNARY else f"({b})"
            else:  # left-associative; comparisons do not chain at all
                a = a if pa > p or (pa == p and p != COMPARE) else f"({a})"
                b = b if pb > p else f"({b})"
            return f"{a} {op.infix} {b}", p
        args = [self.expr(a)[0] for a in n.args]
        attrs = [f"{k}={fmt_attr(v)}" for k, v in n.attrs if not _is_default(v, op.attr_spec(k).default)]
        return f"{n.op}({', '.join(args + attrs)})", ATOM

    def body(self, indent: str) -> None:
        """Emit the assignment lines of every node that needs one."""
        self.indent = indent
        for i, n in enumerate(self.g.nodes):
            self.depth[i] = 1 + max((self.depth[a] for a in n.args if a not in self.names), default=0)
            if n.op == "input" or not self.needs_line(i, n):
                continue
            if i in self.g.outputs and n.name is None and self.users[i] == 1:
                continue
            name = n.name if n.name is not None and n.name not in self.used else None
            name = name or self.fresh("k" if n.op == "kernel" else "t")
            if n.op == "kernel":
                text = kernel_text(n, self.names, self.taken, indent)
            else:
                text = self.expr(i)[0]
            self.lines.append(f"{indent}{name} = {text}")
            self.names[i] = name
            self.used.add(name)


def kernel_text(n: Node, outer_names: dict[int, str], taken: set[str], indent: str | None) -> str:
    body = n.body
    names = {inp: outer_names.get(arg, body.nodes[inp].name) for inp, arg in zip(body.inputs, n.args)}
    p = Printer(body, names, taken)
    inner_indent = (indent or "") + "    "
    p.body(inner_indent)
    result = p.expr(body.outputs[0])[0]
    if not p.lines:
        return f"kernel {{ {result} }}"
    return "kernel {\n" + "\n".join(p.lines) + f"\n{inner_indent}{result}\n{indent or ''}}}"


def graph_text(graph: Graph, views=frozenset()) -> str:
    """The graph's text; the kernel nodes `views` printed as their ops, outside kernel blocks."""
    if views:
        graph = _views_inlined(graph, views)
    taken = {n.name for _, _, n in graph.walk() if n.name}
    names = {i: graph.nodes[i].name for i in graph.inputs}
    p = Printer(graph, names, taken)
    p.body("    ")
    rets = ", ".join(p.expr(o)[0] for o in graph.outputs)
    params = [f"{name}: {t}" for name, t in graph.params]
    res = graph.result_types
    results = str(res[0]) if len(res) == 1 else "(" + ", ".join(str(t) for t in res) + ")"
    head = f"graph {graph.name}(" + ", ".join(params) + f") -> {results} {{"
    if len(head) > WRAP:
        pad = " " * len(f"graph {graph.name}(")
        head = f"graph {graph.name}(" + (",\n" + pad).join(params) + f") -> {results} {{"
    return "\n".join([head, *p.lines, f"    return {rets}", "}"]) + "\n"


def module_text(graphs: list[Graph]) -> str:
    return "\n".join(graph_text(g) for g in graphs)


def _views_inlined(g: Graph, views) -> Graph:
    """g with the kernel nodes `views` replaced by their bodies' ops (the kernel's name on the last)."""
    from dataclasses import replace

    out = Graph(g.name, pos=g.pos)
    at: dict[int, int] = {}
    for i, n in enumerate(g.nodes):
        if i not in views:
            at[i] = out.add(replace(n, args=tuple(at[a] for a in n.args)))
            continue
        inner = {bi: at[a] for bi, a in zip(n.body.inputs, n.args)}
        for bi, bn in enumerate(n.body.nodes):
            if bn.op != "input":
                last = bi == n.body.outputs[0]
                inner[bi] = out.add(replace(bn, args=tuple(inner[a] for a in bn.args),
                                            name=n.name if last else None, pos=n.pos if last else bn.pos))
        at[i] = inner[n.body.outputs[0]]
    out.inputs = [at[i] for i in g.inputs]
    out.outputs = [at[o] for o in g.outputs]
    return out
