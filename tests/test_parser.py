"""The graph language: parsing, Python's precedence, and print(parse(text)) as a fixed point.

Every .g file in examples/ and tests/good/ must print to a canonical text that prints to itself,
and that computes exactly what the original computes.
"""

import ast

import numpy as np
import pytest
from helpers import (
    EXAMPLES,
    GOOD,
    assert_same_values,
    load_text,
    nearest_f32,
    one_graph,
    rand_inputs,
    reprint,
    run,
    tree,
)
from hypothesis import example, given
from hypothesis import strategies as st

from eqfuse.errors import EqfuseError
from eqfuse.ir.ops import OPS, REQUIRED, complete_attrs
from eqfuse.ir.ops_index import RESHAPES
from eqfuse.ir.printer import module_text

SAMPLES = EXAMPLES + GOOD
DIMS = {"B": 2, "N": 2, "T": 3}


def ids(paths):
    return [p.parent.name + "/" + p.name for p in paths]


def test_there_are_samples_of_every_kind():
    assert len(EXAMPLES) >= 4 and len(GOOD) >= 10


@pytest.mark.parametrize("path", SAMPLES, ids=ids(SAMPLES))
def test_printing_a_parsed_file_is_a_fixed_point(path):
    once = reprint(path.read_text())
    assert reprint(once) == once


@pytest.mark.parametrize("path", SAMPLES, ids=ids(SAMPLES))
def test_printed_graphs_compute_the_same_values(path):
    original = load_text(path.read_text(), str(path))
    printed = load_text(module_text(original))
    assert [g.name for g in printed] == [g.name for g in original]
    for g, p in zip(original, printed):
        assert p.signature() == g.signature()
        for seed, bounds in ((0, {}), (1, {"low": 0.25, "high": 2.0})):
            xs = rand_inputs(g, DIMS, seed, **bounds)
            assert_same_values(run(p, xs), run(g, xs), exact=True)


def test_every_op_appears_in_the_good_samples():
    used = {n.op for p in GOOD for g in load_text(p.read_text()) for _, _, n in g.walk()}
    # squeeze, unsqueeze and flatten are reshapes once built: look for them in the text
    used |= {op for op in RESHAPES if any(f"{op}(" in p.read_text() for p in GOOD)}
    assert set(OPS) <= used


# ---------------------------------------------------------------- precedence, as in Python

PREC_HEADER = "graph p(a: f32[3, 3], b: f32[3, 3], c: f32[3, 3], x: f32[3, 3]) -> f32[3, 3] {\n    return %s\n}\n"

PRECEDENCE = {
    # source: (its structure, its canonical printed form)
    "-x ** 2": (("neg", ("pow", "x", 2.0)), "-x ** 2"),
    "2 ** -x": (("pow", 2.0, ("neg", "x")), "2 ** -x"),
    "a - (b - c)": (("sub", "a", ("sub", "b", "c")), "a - (b - c)"),
    "a - b - c": (("sub", ("sub", "a", "b"), "c"), "a - b - c"),
    "(a - b) - c": (("sub", ("sub", "a", "b"), "c"), "a - b - c"),
    "(a @ b) @ c": (("matmul", ("matmul", "a", "b"), "c"), "a @ b @ c"),
    "a @ (b @ c)": (("matmul", "a", ("matmul", "b", "c")), "a @ (b @ c)"),
    "a / (b * c)": (("div", "a", ("mul", "b", "c")), "a / (b * c)"),
    "a / b * c": (("mul", ("div", "a", "b"), "c"), "a / b * c"),
    "a + b * c": (("add", "a", ("mul", "b", "c")), "a + b * c"),
    "(a + b) * c": (("mul", ("add", "a", "b"), "c"), "(a + b) * c"),
    "a @ b * c": (("mul", ("matmul", "a", "b"), "c"), "a @ b * c"),
    "a * b @ c": (("matmul", ("mul", "a", "b"), "c"), "a * b @ c"),
    "x ** 2 ** 0.5": (("pow", "x", ("pow", 2.0, 0.5)), "x ** 2 ** 0.5"),
    "(x ** 2) ** 0.5": (("pow", ("pow", "x", 2.0), 0.5), "(x ** 2) ** 0.5"),
    "(-x) ** 2": (("pow", ("neg", "x"), 2.0), "(-x) ** 2"),
    "-2 ** x": (("neg", ("pow", 2.0, "x")), "-2 ** x"),
    "(-2) ** x": (("pow", -2.0, "x"), "(-2) ** x"),
    "-(a + b)": (("neg", ("add", "a", "b")), "-(a + b)"),
    "- -x": (("neg", ("neg", "x")), "--x"),
    "a * -b": (("mul", "a", ("neg", "b")), "a * -b"),
    "a - -2": (("sub", "a", -2.0), "a - -2"),
    "-a @ b": (("matmul", ("neg", "a"), "b"), "-a @ b"),
    "-(a @ b)": (("neg", ("matmul", "a", "b")), "-(a @ b)"),
    "a ** -2 * b": (("mul", ("pow", "a", -2.0), "b"), "a ** -2 * b"),
    "((((a))))": ("a", "a"),
    "relu(a) ** 2": (("pow", ("relu", "a"), 2.0), "relu(a) ** 2"),
    "x / 2 / 2": (("div", ("div", "x", 2.0), 2.0), "x / 2 / 2"),
    "x / (2 / 2)": (("div", "x", ("div", 2.0, 2.0)), "x / (2 / 2)"),
}


def python_value(expr: str, env: dict):
    """What Python computes for expr over numpy float32 arrays (literals as float32 scalars)."""
    return eval(expr, {"relu": lambda v: np.maximum(v, np.float32(0))}, env)


@pytest.mark.parametrize("src", PRECEDENCE)
def test_infix_operators_follow_python_precedence(src):
    want_tree, want_text = PRECEDENCE[src]
    g = one_graph(PREC_HEADER % src)
    assert tree(g) == want_tree
    assert f"    return {want_text}\n" in module_text([g])
    xs = rand_inputs(g, seed=3, low=0.5, high=1.5)
    env = dict(zip("abcx", xs))
    with np.errstate(all="ignore"):
        want = python_value(src, env)
    assert_same_values(run(g, xs), [np.asarray(want, dtype=np.float32)])


# ---------------------------------------------------------------- syntax details


def test_canonical_text_of_a_small_model():
    src = """
    # leading comment
    graph small(x: f32[B, 4],w: f32[4, 2] ,) -> f32[B, 2]{   # odd spacing
        y = relu( x @ w ) # trailing
        return y*2
    }
    """
    assert reprint(src) == (
        "graph small(x: f32[B, 4], w: f32[4, 2]) -> f32[B, 2] {\n"
        "    y = relu(x @ w)\n"
        "    return y * 2\n"
        "}\n"
    )


def test_a_graph_may_sit_on_one_line():
    assert reprint("graph g(x: f32[3]) -> f32[3] { return relu(x) }") == \
        "graph g(x: f32[3]) -> f32[3] {\n    return relu(x)\n}\n"


def test_windows_line_ends_and_a_byte_order_mark_are_accepted():
    src = "\ufeffgraph g(x: f32[3]) -> f32[3] {\r\n    y = x + 1\r\n    return y\r\n}\r\n"
    assert reprint(src) == "graph g(x: f32[3]) -> f32[3] {\n    y = x + 1\n    return y\n}\n"
    assert reprint(src.encode("utf-8")) == reprint(src)


def test_several_graphs_keep_their_order_and_signatures():
    graphs = load_text((GOOD[0].parent / "multi.g").read_text())
    assert [g.signature() for g in graphs] == [
        "scalars(s: f32, t: f32) -> f32",
        "no_result_type(x: f32[3]) -> f32[3]",
        "two(x: f32[2, 3]) -> (f32[2, 3], f32[3, 2])",
        "same_twice(x: f32[2]) -> (f32[2], f32[2])",
        "constant() -> f32",
        "alias(x: f32[2]) -> f32[2]",
        "names_like_keywords(kernels: f32[2], returned: f32[2], graph: f32[2], true_: f32[2]) -> f32[2]",
    ]


def test_a_scalar_type_differs_from_a_one_element_tensor():
    g = one_graph("graph g(s: f32, t: f32[1], u: f32[]) -> (f32, f32[1], f32) { return s, t, u }")
    assert [str(t) for _, t in g.params] == ["f32", "f32[1]", "f32"]


def test_named_dimensions_are_kept_in_order_of_appearance():
    g = one_graph("graph g(x: f32[B, T, 4], y: f32[T, H]) -> f32[B, T, 4] { return x }")
    assert g.dims() == ["B", "T", "H"]


def test_attribute_values_of_every_kind():
    g = one_graph(
        "graph g(x: f32[2, 3, 4]) -> f32[3, 4, 1] {\n"
        "    a = sum(x, axis=[0], keepdims=false)\n"          # list, bool
        "    b = layernorm(a, a, a, axis=0, eps=0.5)\n"        # int, float
        "    c = gelu(b, approximate='tanh')\n"                # string in single quotes
        "    return reshape(c, shape=[3, -1, 1])\n"            # negative number in a list
        "}\n")
    attrs = [n.attr for n in g.nodes if n.op not in ("input", "const")]
    assert attrs == [{"axis": (0,), "keepdims": False}, {"axis": 0, "eps": 0.5},
                     {"approximate": "tanh"}, {"shape": (3, -1, 1)}]


@pytest.mark.parametrize("text, value", [
    ("0", 0.0), ("7", 7.0), ("2.5", 2.5), (".5", 0.5), ("1.", 1.0), ("1e-3", 1e-3), ("2E+2", 200.0),
    ("-3", -3.0), ("-0", -0.0), ("123456789", 123456789.0), ("3.4e38", 3.4e38),
])
def test_number_literals(text, value):
    g = one_graph(f"graph g() -> f32 {{ return {text} }}")
    (out,) = run(g, [])
    assert g.nodes[g.outputs[0]].value == value
    assert out == np.float32(value) and np.signbit(out) == np.signbit(np.float32(value))
    assert reprint(reprint(f"graph g() -> f32 {{ return 1 / {text} }}")) == reprint(
        f"graph g() -> f32 {{ return 1 / {text} }}")


def test_negative_zero_survives_printing():
    src = "graph g() -> f32 { return 1 / -0 }"
    (out,) = run(one_graph(reprint(src)), [])
    assert out == -np.inf


def test_kernel_blocks_print_on_one_line_or_indented():
    src = (
        "graph g(x: f32[1, 4], w: f32[4, 4]) -> f32[1, 4] {\n"
        "    h = kernel { relu(x @ w) }\n"
        "    return kernel {\n"
        "        t = h * 2\n"
        "        u = t + x\n"
        "        sigmoid(u) * t\n"
        "    }\n"
        "}\n")
    assert reprint(src) == src


def test_kernel_body_names_are_local():
    src = "graph g(x: f32[4]) -> f32[4] {\n    h = kernel {\n        t = x + 1\n        t * 2\n    }\n    return t\n}\n"
    with pytest.raises(EqfuseError, match="unknown name 't'"):
        load_text(src)


def test_kernel_inputs_are_the_outer_tensors_it_reads():
    g = one_graph("graph g(x: f32[4], y: f32[4]) -> f32[4] { return kernel { x * y + x } }")
    k = g.nodes[g.outputs[0]]
    assert k.op == "kernel"
    assert [g.nodes[a].name for a in k.args] == ["x", "y"]
    assert [k.body.nodes[i].name for i in k.body.inputs] == ["x", "y"]


def test_nesting_up_to_the_limit_works_and_prints_in_pieces():
    depth = 150
    src = "graph g(x: f32[2]) -> f32[2] {\n    return " + "relu(" * depth + "x" + ")" * depth + "\n}\n"
    g = one_graph(src)
    once = reprint(src)
    assert reprint(once) == once
    assert max(len(line) for line in once.splitlines()) < 200
    xs = rand_inputs(g, seed=0)
    assert_same_values(run(one_graph(once), xs), run(g, xs), exact=True)


# ---------------------------------------------------------------- random expression trees

PARAMS = {"a": (2, 3), "b": (3,), "s": ()}
HEADER = "graph r(a: f32[2, 3], b: f32[3], s: f32) {\n    return %s\n}\n"
# f32 -> f32 ops without attributes that need values (the mask ops have tests of their own)
F32_OPS = {n for n, op in OPS.items() if op.kind == "pointwise" and op.dtype in ("float", "numeric")
           and all(a.default is not REQUIRED for a in op.attrs)}
UNARY_CALLS = sorted(n for n in F32_OPS if OPS[n].arity == (1, 1))
BINARY_CALLS = sorted(n for n in F32_OPS if OPS[n].arity == (2, 2))
INFIX = {op.infix: n for n, op in OPS.items() if op.infix and op.kind == "pointwise" and op.arity == (2, 2)
         and op.dtype != "compare"}  # Python chains comparisons; eqfuse does not
PY_BINOP = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}


def wrap(text: str, paren: bool) -> str:
    return f"({text})" if paren else text


leaves = st.one_of(
    st.sampled_from(sorted(PARAMS)),
    st.floats(min_value=0, max_value=1e6, allow_nan=False).map(repr),
    st.integers(min_value=0, max_value=1000).map(str),
)


def extend(kids):
    return st.one_of(
        st.builds(lambda op, x: f"{op}({x})", st.sampled_from(UNARY_CALLS), kids),
        st.builds(lambda x, how: f"gelu({x}, approximate={how})", kids, st.sampled_from(['"tanh"', "'none'"])),
        st.builds(lambda x, p: "-" + wrap(x, p), kids, st.booleans()),
        st.builds(lambda lhs, sym, rhs, pl, pr: f"{wrap(lhs, pl)} {sym} {wrap(rhs, pr)}",
                  kids, st.sampled_from(sorted(INFIX)), kids, st.booleans(), st.booleans()),
        st.builds(lambda op, lhs, rhs: f"{op}({lhs}, {rhs})", st.sampled_from(BINARY_CALLS), kids, kids),
    )


expressions = st.recursive(leaves, extend, max_leaves=10)


def literal(value) -> float:
    """A literal's meaning: the f32 nearest to its decimal (the leaves are written as repr() of
    an int or a float), as a float."""
    return float(nearest_f32(repr(value)))


def python_tree(node: ast.AST):
    """The structure Python's own parser gives an expression (the oracle for precedence), with
    constants as their f32 values."""
    if isinstance(node, ast.Expression):
        return python_tree(node.body)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Constant):
        return literal(node.value)
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.operand, ast.Constant):  # a negative literal is a constant: -0 is -0.0
            return -literal(node.operand.value)
        return ("neg", python_tree(node.operand))
    if isinstance(node, ast.BinOp):
        return (INFIX[PY_BINOP[type(node.op)]], python_tree(node.left), python_tree(node.right))
    if isinstance(node, ast.Call):
        op = OPS[node.func.id]
        args = tuple(python_tree(a) for a in node.args)
        given = {k.arg: k.value.value for k in node.keywords}
        attrs = complete_attrs(op, given)
        return (op.name, *args, *((attrs,) if attrs else ()))
    raise AssertionError(ast.dump(node))


def f32_tree(t):
    """A tree() with its constants as f32 values (the parser may keep a double that rounds to it)."""
    if isinstance(t, float):
        return float(np.float32(t))
    return tuple(f32_tree(x) for x in t) if isinstance(t, tuple) else t


def signed_zeros(t):
    """The signs of the zero constants of a tree, in order (-0 and 0 compare equal as floats)."""
    if isinstance(t, float):
        return [np.signbit(t)] if t == 0 else []
    return [z for x in t for z in signed_zeros(x)] if isinstance(t, tuple) else []


class ToUfuncs(ast.NodeTransformer):
    """Python's parse, numpy's semantics: literals become float32 (the f32 nearest to the
    decimal), a minus applied to a literal negates it as a float (-0 is -0.0, as Python's -0.0 and
    numpy's np.negative(np.float32(0)) are), operators become ufunc calls (numpy's scalar `**` can
    differ from the np.power ufunc in the last bit)."""

    UFUNC = {ast.Add: "add", ast.Sub: "subtract", ast.Mult: "multiply", ast.Div: "divide", ast.Pow: "power"}

    def call(self, func, args, node):
        return ast.copy_location(ast.Call(ast.Attribute(ast.Name("np", ast.Load()), func, ast.Load()), args, []), node)

    def visit_Constant(self, node):
        return node if isinstance(node.value, str) else self.call("float32", [ast.Constant(literal(node.value))], node)

    def visit_UnaryOp(self, node):
        if isinstance(node.operand, ast.Constant):  # the parser's negative literal
            return self.call("float32", [ast.Constant(-literal(node.operand.value))], node)
        return self.call("negative", [self.visit(node.operand)], node)

    def visit_BinOp(self, node):
        return self.call(self.UFUNC[type(node.op)], [self.visit(node.left), self.visit(node.right)], node)


def numpy_eval(src: str, env: dict):
    code = compile(ast.fix_missing_locations(ToUfuncs().visit(ast.parse(src, mode="eval"))), "<e>", "eval")
    funcs = {name: (lambda op: lambda *a, **kw: np.float32(op.numpy(list(a), complete_attrs(op, kw))))(op)
             for name, op in OPS.items()}
    with np.errstate(all="ignore"):
        return eval(code, {**funcs, "np": np}, env)


@given(expressions)
@example("a / -0")  # issue 29: -0 is the f32 -0.0 (numpy's -np.float32(0)), so this is -inf, not inf
@example("-(0) / b - -0.0 * s")
@example("b * 1.0000000596046448")  # a double halfway between two f32s: the decimal is above it
def test_random_expressions_parse_like_python_and_print_to_a_fixed_point(src):
    g = one_graph(HEADER % src)
    want_tree = python_tree(ast.parse(src, mode="eval"))
    assert f32_tree(tree(g)) == want_tree
    assert signed_zeros(f32_tree(tree(g))) == signed_zeros(want_tree)
    once = module_text([g])
    printed = one_graph(once)
    assert module_text([printed]) == once
    assert tree(printed) == tree(g)
    xs = rand_inputs(g, seed=len(src))
    got = run(g, xs)
    assert_same_values(run(printed, xs), got, exact=True)
    want = numpy_eval(src, dict(zip(PARAMS, xs)))
    assert_same_values(got, [np.asarray(want, dtype=np.float32)], exact=True)
