"""Stage 2: syntax tree -> Graph IR, with every check that needs names, ops, attributes and shapes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from eqfuse.errors import EqfuseError, NamedSum, Pos, ShapeError, did_you_mean
from eqfuse.frontend import syntax as S
from eqfuse.ir.graph import MAX_ELEMENTS, Graph, Node
from eqfuse.ir.kernels import SUPPORTED, Split, Unsupported, classify
from eqfuse.ir.ops import INFIX, OPS, complete_attrs
from eqfuse.ir.ops_index import canonical
from eqfuse.ir.shapes import DTYPES, TType


def build_type(t: S.TypeAst) -> TType:
    if t.dtype not in DTYPES:
        hint = "f64 and other dtypes are not supported yet" if t.dtype in ("f64", "f16", "bf16", "i8", "u8") else None
        raise EqfuseError(f"unknown dtype '{t.dtype}': eqfuse supports {', '.join(DTYPES)}", t.pos, hint)
    dims = t.dims or ()
    for d in dims:
        if isinstance(d, int) and d <= 0:
            raise EqfuseError(f"dimension {d} must be positive", t.pos)
    return check_size(TType(tuple(dims), t.dtype), t.pos)


MAX_RANK = 64  # numpy's own limit (NPY_MAXDIMS)


def check_size(t: TType, pos: Pos | None) -> TType:
    """A type beyond any memory or numpy's rank limit is refused where it appears (sizes and costs
    would overflow 64-bit integers, and a named dim costed as 64 makes 300 of them overflow floats)."""
    if len(t.shape) > MAX_RANK:
        raise EqfuseError(f"a tensor of rank {len(t.shape)} has too many dimensions (at most {MAX_RANK}, as numpy)", pos)
    size = math.prod(d for d in t.shape if isinstance(d, int))
    if size > MAX_ELEMENTS:
        raise EqfuseError(f"a tensor of {size} elements is too large (at most 2^40 elements)", pos)
    return t


class GraphBuilder:
    """Builds one Graph; a kernel block gets its own builder whose outer scope is this one."""

    def __init__(self, name: str, pos: Pos | None, outer: "GraphBuilder | None" = None,
                 dims: Mapping[str, int] | None = None):
        self.graph = Graph(name, pos=pos)
        self.dims = dict(dims or {}) if outer is None else outer.dims  # compile's dims= (NamedSum below)
        self.scope: dict[str, int] = {}
        self.defined_at: dict[str, Pos] = {}
        self.outer = outer
        self.outer_args: list[int] = []  # kernel builders: outer node ids read, one per body input

    def define(self, name: str, node_id: int, pos: Pos) -> None:
        prev = self.defined_at.get(name) or (self.outer and self.outer.defined_at.get(name))
        if prev is not None:
            raise EqfuseError(f"'{name}' is already defined at line {prev.line}", pos,
                              "each name is assigned once (values are immutable)")
        self.scope[name] = node_id
        self.defined_at[name] = pos

    def assign(self, stmt: S.Assign) -> None:
        node = self.expr(stmt.expr)
        self.define(stmt.name, node, stmt.pos)
        if self.graph.nodes[node].name is None:  # `y = x` only aliases: x keeps its name
            self.graph.nodes[node] = replace(self.graph.nodes[node], name=stmt.name)

    def lookup(self, name: S.Name) -> int:
        if name.id in self.scope:
            return self.scope[name.id]
        if self.outer is not None and name.id in self.outer.defined_at:
            # A kernel reads a tensor from outside: it becomes one of the body's inputs.
            outer_id = self.outer.lookup(name)
            t = self.outer.graph.nodes[outer_id].type
            inner = self.graph.add(Node("input", type=t, name=name.id, pos=name.pos))
            self.graph.inputs.append(inner)
            self.outer_args.append(outer_id)
            self.scope[name.id] = inner
            return inner
        known = list(self.scope) + (list(self.outer.scope) if self.outer else [])
        raise EqfuseError(f"unknown name '{name.id}'", name.pos, did_you_mean(name.id, known))

    def add_op(self, op: str, args: list[int], attrs: dict, pos: Pos) -> int:
        types = [self.graph.nodes[a].type for a in args]
        try:
            try:
                t = OPS[op].infer(types, attrs)
            except NamedSum as e:  # concat along a named dim: holds when dims= binds the names it sums
                if not all(d in self.dims for d in e.names):
                    raise NamedSum(f"{e}: bind {', '.join(e.names)} with compile's dims= (--dim)", e.names) from None
                t = OPS[op].infer([u.bind({d: self.dims[d] for d in e.names}) for u in types], attrs)
            op, attrs = canonical(op, types, attrs)
        except ShapeError as e:
            raise EqfuseError(str(e), pos) from None
        check_size(t, pos)
        node = Node(op, tuple(args), tuple(attrs.items()), pos=pos)
        return self.graph.add(Node(op, node.args, node.attrs, t, pos=pos))

    def expr(self, e: S.Expr) -> int:
        if isinstance(e, S.Name):
            return self.lookup(e)
        if isinstance(e, S.Num):
            return self.graph.add(Node("const", attrs=(("value", e.value),), type=TType(()), pos=e.pos))
        if isinstance(e, S.Neg):
            if isinstance(e.x, S.Num):  # a negative literal is a constant, not an op
                return self.graph.add(Node("const", attrs=(("value", -e.x.value),), type=TType(()), pos=e.pos))
            return self.add_op("neg", [self.expr(e.x)], {}, e.pos)
        if isinstance(e, S.BinOp):
            return self.add_op(INFIX[e.op], [self.expr(e.lhs), self.expr(e.rhs)], {}, e.pos)
        if isinstance(e, S.Call):
            return self.call(e)
        if isinstance(e, S.Kernel):
            return self.kernel(e)
        raise TypeError(e)

    def call(self, e: S.Call) -> int:
        op = OPS.get(e.op)
        if op is None:
            if e.op == "kernel":
                raise EqfuseError("'kernel' is written as kernel { ... }, not called", e.pos)
            raise EqfuseError(f"unknown op '{e.op}'", e.pos, did_you_mean(e.op, OPS))
        lo, hi = op.arity
        n = len(e.args)
        if n < lo or (hi >= 0 and n > hi):
            want = f"{lo}" if lo == hi else (f"at least {lo}" if hi < 0 else f"{lo} to {hi}")
            raise EqfuseError(f"{e.op} takes {want} tensor argument{'s' * (want[-2:] != ' 1' and want != '1')}, "
                              f"got {n}", e.pos)
        given: dict = {}
        for kw in e.kwargs:
            if op.attr_spec(kw.name) is None:
                valid = ", ".join(a.name for a in op.attrs) or "none"
                raise EqfuseError(f"{e.op} has no attribute '{kw.name}' (its attributes: {valid})", kw.pos)
            if kw.name in given:
                raise EqfuseError(f"attribute '{kw.name}' given twice", kw.pos)
            given[kw.name] = kw.value
        try:
            attrs = complete_attrs(op, given)
        except ValueError as err:
            bad = next((kw.pos for kw in e.kwargs if str(err).startswith(f"attribute {kw.name}=")), e.pos)
            raise EqfuseError(str(err), bad) from None
        return self.add_op(e.op, [self.expr(a) for a in e.args], attrs, e.pos)

    def kernel(self, e: S.Kernel) -> int:
        if self.outer is not None:
            raise EqfuseError("kernel blocks cannot be nested", e.pos)
        inner = GraphBuilder("kernel", e.pos, outer=self)
        for a in e.assigns:
            inner.assign(a)
        out = inner.expr(e.result)
        body = inner.graph
        if body.nodes[out].op == "input" and not any(n.op != "input" for n in body.nodes):
            raise EqfuseError("a kernel block must compute something", e.pos)
        body.outputs = [out]
        try:
            classify(body)
        except Split:
            pass  # a shape the backend computes as separate kernels (lower splits it)
        except Unsupported as why:
            raise EqfuseError(f"this kernel block cannot be lowered: {why}", e.pos,
                              f"supported kernel shapes: {SUPPORTED}") from None
        t = body.nodes[out].type
        return self.graph.add(Node("kernel", tuple(inner.outer_args), (), t, pos=e.pos, body=body))


def build_graph(g: S.GraphAst, dims: Mapping[str, int] | None = None) -> Graph:
    """The graph of g. `dims` (compile's dims=) gives a concat along named dims its length (the
    sum of their values: a decode step's past + new rows, errors.NamedSum); every other type
    keeps its names."""
    b = GraphBuilder(g.name, g.pos, dims=dims)
    for p in g.params:
        node = b.graph.add(Node("input", type=build_type(p.type), name=p.name, pos=p.pos))
        b.graph.inputs.append(node)
        b.define(p.name, node, p.pos)
    ret: S.Return | None = None
    for stmt in g.body:
        if ret is not None:
            raise EqfuseError("statement after return", stmt.pos)
        if isinstance(stmt, S.Return):
            ret = stmt
            b.graph.outputs = [b.expr(e) for e in stmt.exprs]
        else:
            b.assign(stmt)
    if ret is None:
        raise EqfuseError(f"graph '{g.name}' has no return statement", g.end,
                          "end the body with: return EXPR")
    _check_results(g, ret, b.graph, b.dims)
    return b.graph


def _check_results(g: S.GraphAst, ret: S.Return, graph: Graph, dims: Mapping[str, int]) -> None:
    if g.results is None:
        return
    got = graph.result_types
    if len(got) != len(g.results):
        raise EqfuseError(f"graph '{g.name}' returns {len(got)} value{'s' * (len(got) != 1)} "
                          f"but declares {len(g.results)}", ret.pos)
    for e, want_ast, t in zip(ret.exprs, g.results, got):
        want = build_type(want_ast)
        if want != t and want.bind(dims) != t.bind(dims):  # (a result a NamedSum made a number)
            raise EqfuseError(f"graph '{g.name}' returns {t} here but declares {want}", e.pos)


def build_module(m: S.ModuleAst, dims: Mapping[str, int] | None = None) -> list[Graph]:
    seen: dict[str, Pos] = {}
    graphs = []
    for g in m.graphs:
        if g.name in seen:
            raise EqfuseError(f"graph '{g.name}' is already defined at line {seen[g.name].line}", g.pos)
        seen[g.name] = g.pos
        graphs.append(build_graph(g, dims))
    return graphs
