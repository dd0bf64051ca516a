"""Shape inference, one table of cases per op: the inferred type must be the shape numpy produces.

Each case is (parameter types, attributes); the test builds `return op(x0, x1, ..., attrs)`,
binds the named dimensions to sizes, runs the numpy reference on random arrays and compares.
An op added to the table without cases here fails test_every_op_has_shape_cases.
"""

import pytest
from helpers import one_graph, rand_inputs, run, shape_of

from eqfuse.errors import EqfuseError, ShapeError
from eqfuse.ir.ops import OPS
from eqfuse.ir.shapes import NUMPY_DTYPE, TType, broadcast, dim_product, norm_axis

DIMS = {"B": 5, "T": 7, "H": 6, "W": 9}
UNARY_CASES = [(["B, 3"], ""), ([""], ""), (["2, 1, 4"], ""), (["1"], "")]
BINARY_CASES = [
    (["B, 1, 4", "3, 1"], ""),      # both sides stretch
    (["4", ""], ""),                # scalar on the right
    (["", "2, 3"], ""),             # scalar on the left
    (["", ""], ""),
    (["1", "2, 3"], ""),
    (["B, 3", "B, 1"], ""),         # a named dim meets itself
    (["B, T, 1", "1, T, 4"], ""),
]

CASES = {
    **{name: UNARY_CASES for name in
       ("neg", "abs", "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "erf", "silu",
        "sin", "cos", "sign", "ceil", "floor", "round", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh",
        "acosh", "atanh", "expm1", "log1p")},
    "gelu": UNARY_CASES + [(["B, 3"], 'approximate="tanh"'), (["4"], 'approximate="none"')],
    **{name: BINARY_CASES for name in ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "floordiv", "mod")},
    "matmul": [
        (["3, 4", "4, 5"], ""),
        (["B, 3, 4", "4, 5"], ""),             # batch on the left only
        (["4, 5", "2, 3, 5, 6"], ""),          # batch on the right only
        (["2, 1, 3, 4", "5, 4, 6"], ""),       # batch dims broadcast
        (["B, T, 4", "B, 4, T"], ""),
        (["1, 1", "1, 1"], ""),
    ],
    "conv1d": [
        (["1, 3, 20", "4, 3, 3"], ""),
        (["2, 4, 20", "6, 2, 3", "6"], "stride=2, padding=1, dilation=2, group=2"),
        (["B, 8, 9", "8, 1, 3"], "padding=1, group=8"),
    ],
    "conv_transpose2d": [
        (["1, 3, 5, 5", "3, 2, 3, 3"], ""),
        (["2, 4, 3, 4", "4, 3, 3, 2", "6"], "stride=2, padding=1, output_padding=[1, 0], group=2"),
    ],
    "conv2d": [
        (["1, 3, 8, 8", "4, 3, 3, 3"], ""),
        (["2, 3, 8, 8", "4, 3, 3, 3", "4"], "padding=1"),
        (["1, 3, 9, 8", "4, 3, 3, 3"], "stride=2, padding=1"),
        (["1, 2, 7, 6", "3, 2, 3, 2"], "stride=[2, 1], padding=[0, 2]"),
        (["B, 2, 5, 7", "3, 2, 5, 1"], ""),
        (["1, 2, H, W", "3, 2, 1, 1"], ""),    # 1x1: named spatial dims pass through
        (["1, 1, 4, 4", "1, 1, 4, 4"], ""),    # the window covers the whole input
        (["1, 1, 5, 5", "1, 1, 2, 2"], "stride=3"),
    ],
    **{name: [
        (["B, 4, 6"], ""),
        (["B, 4, 6"], "axis=1"),
        (["B, 4, 6"], "axis=-1"),
        (["B, 4, 6"], "axis=[0, 2]"),
        (["B, 4, 6"], "axis=[2, -3], keepdims=true"),
        (["B, 4, 6"], "keepdims=true"),
        (["B, 4, 6"], "axis=0, keepdims=false"),
        (["3"], "axis=0"),
        ([""], ""),
    ] for name in ("sum", "mean", "max")},
    "softmax": [(["B, 4, 6"], ""), (["B, 4, 6"], "axis=0"), (["B, 4, 6"], "axis=-2"), (["5"], "")],
    "layernorm": [
        (["B, 4, 6", "6", "6"], ""),
        (["B, 4, 6", "4, 6", "4, 6"], "axis=-2"),
        (["B, 4, 6", "4, 6", "4, 6"], "axis=1, eps=0.1"),
        (["B, 4, 6", "B, 4, 6", "B, 4, 6"], "axis=0"),
    ],
    "rmsnorm": [(["B, 5", "5"], ""), (["2, 3, 4", "4"], "eps=1e-3"), (["7", "7"], "")],
    "batchnorm": [
        (["B, 3, 4, 4", "3", "3", "3", "3"], ""),
        (["2, 3", "3", "3", "3", "3"], "eps=0.5"),
        (["2, 3, 5", "3", "3", "3", "3"], ""),
    ],
    "transpose": [
        (["B, 3, 4"], ""),
        (["B, 3, 4"], "perm=[1, 0, 2]"),
        (["2, 3, 4, 5"], "perm=[0, 2, 3, 1]"),
        (["4"], ""),
        ([""], ""),
        ([""], "perm=[]"),
    ],
    "reshape": [
        (["4, 6"], "shape=[24]"),
        (["4, 6"], "shape=[-1]"),
        (["4, 6"], "shape=[2, -1, 3]"),
        (["B, 4, 6"], "shape=[-1, 24]"),        # -1 absorbs the named dim
        (["B, 4, 6"], "shape=[-1, 2, 2, 6]"),
        (["4, B"], "shape=[2, 2, -1]"),
        (["1"], "shape=[1, 1, 1]"),
        ([""], "shape=[1, 1]"),
        (["2, 3"], "shape=[3, 2]"),
    ],
    "slice": [
        (["10, 3"], "axis=0, start=2, stop=5"),
        (["10, 3"], "axis=0, start=-3, stop=-1"),     # negative indices count from the end
        (["10, 3"], "axis=0, start=-3"),
        (["10, 3"], "axis=1, stop=2"),
        (["10, 3"], "axis=-1, start=1"),
        (["10, 3"], "axis=0, start=4, stop=100"),     # stop clamps, as in numpy
        (["10, 3"], "axis=0, start=-100, stop=2"),
        (["10, 3"], "axis=0, stop=-9"),
        (["B, 3"], "axis=0, start=1, stop=3"),      # named dim: non-negative bounds
        (["B, 3"], "axis=1, start=-2"),
    ],
    "concat": [
        (["2, 3"], "axis=0"),
        (["2, 3", "4, 3"], ""),
        (["2, 3", "2, 1", "2, 5"], "axis=1"),
        (["2, 3", "2, 1", "2, 5"], "axis=-1"),
        (["B, 3, 2", "B, 3, 4"], "axis=2"),         # named dims elsewhere are fine
        (["3", "3", "3", "3"], ""),
    ],
    # masks and indices
    **{name: [(["B, 3", "1, 3"], ""), (["i64: B, 3", "i64: 3"], ""), (["4", ""], "")]
       for name in ("eq", "ne", "lt", "le", "gt", "ge")},
    **{name: [(["bool: B, 3", "bool: 1, 3"], ""), (["bool: 4", "bool: "], "")] for name in ("logical_and", "logical_or")},
    "logical_not": [(["bool: B, 3"], "")],
    "isnan": UNARY_CASES,
    "where": [(["bool: B, 3", "B, 3", ""], ""), (["bool: 3", "2, 3", "1"], ""), (["bool: B, 1", "i64: 4", "i64: 1"], "")],
    "quantize_linear": [(["B, 3", "", "u8: "], ""), (["2, 3", "3", "i8: 3"], ""), (["2, 3", "2, 1", "u8: 2, 1"], "")],
    "dequantize_linear": [(["u8: B, 3", "", "u8: "], ""), (["i8: 2, 3", "2, 1", "i8: 2, 1"], ""), (["i32: 4", "", "i32: "], "")],
    "matmul_integer": [(["u8: B, 3", "i8: 3, 2", "u8: ", "i8: "], ""), (["u8: 2, 4, 3", "i8: 3, 5", "u8: ", "i8: 5"], ""),
                       (["i8: 2, 4, 3", "i8: 2, 3, 5", "i8: ", "i8: "], "")],
    "conv_integer": [(["u8: B, 4, 8, 8", "i8: 6, 2, 3, 3", "u8: ", "i8: 6"], "padding=1, group=2"),
                     (["i8: 1, 3, 9, 7", "i8: 4, 3, 3, 3", "i8: ", "i8: "], "stride=2, dilation=[1, 2]")],
    **{name: [(["B, 3"], ""), ([""], ""), (["2, 3, 4"], "")] for name in ("dynamic_scale", "dynamic_zero_point", "dynamic_range")},
    "cast": [(["i64: B, 3"], 'to="f32"'), (["u8: 4"], 'to="i32"'), (["i8: 4"], 'to="f32"'), (["B, 3"], 'to="i8"'), (["B, 3"], 'to="i64"'), (["bool: 4"], 'to="i32"'), (["i32: 4"], 'to="bool"')],
    "expand": [(["3"], "shape=[2, 3]"), (["B, 1"], "shape=[1, 5]"), ([""], "shape=[4]")],
    "clip": [(["B, 3"], "min=0"), (["i64: 4"], "min=0, max=2"), (["4"], "")],
    **{name: UNARY_CASES for name in ("leaky_relu", "hard_sigmoid", "hard_swish", "softplus")},
    **{name: [(["B, 4, 6"], "axis=1"), (["B, 4, 6"], "axis=[0, 2], keepdims=true"), (["3"], "")] for name in ("min", "prod")},
    "gather": [(["10, 4", "i64: B, 3"], ""), (["3, 10, 4", "i64: 5"], "axis=1"), (["10", "i32: "], "")],
    "gather_elements": [(["4, 5", "i64: 4, 2"], "axis=1"), (["4, 5", "i64: 2, 5"], "")],
    "scatter_add": [(["10, 4", "i64: 3", "3, 4"], ""), (["3, 10, 4", "i64: 2, 5", "3, 2, 5, 4"], "axis=1")],
    "cumsum": [(["B, 5"], "axis=1"), (["i64: 3, 4"], "axis=0, exclusive=true"), (["6"], "axis=0, reverse=true")],
    "argmax": [(["B, 5"], "axis=1"), (["3, 4"], "axis=0, keepdims=true"), (["6"], "")],
    "topk": [(["B, 5"], "k=2"), (["i64: 3, 4"], "k=3, axis=0, indices=true"), (["6"], "k=6, largest=false")],
    "tril": [(["4, 4"], ""), (["B, 3, 5"], "k=1")],
    "range": [([], "stop=5"), ([], 'start=2, stop=11, step=3, dtype="f32"'), ([], "start=4, stop=-4, step=-3")],
    "triu": [(["4, 4"], ""), (["2, 3, 5"], "k=-1")],
    "pad": [(["B, 3"], "pads=[0, 1, 0, 2]"), (["2, 3"], "pads=[1, 1, 1, 1], value=-1")],
    "max_pool2d": [(["1, 2, 8, 8"], "kernel_size=2"), (["B, 2, 7, 7"], "kernel_size=3, stride=2, padding=1")],
    "avg_pool2d": [(["1, 2, 8, 8"], "kernel_size=2"), (["B, 2, 7, 7"], "kernel_size=3, stride=2, padding=1")],
    "pool2d_grad": [(["1, 2, 8, 8", "1, 2, 4, 4"], 'mode="max", kernel_size=2'),
                    (["B, 2, 7, 7", "B, 2, 4, 4"], 'mode="avg", kernel_size=3, stride=2, padding=1')],
    "scatter_elements_add": [(["4, 5", "i64: 4, 2", "4, 2"], "axis=1"), (["4, 5", "i64: 2, 5", "2, 5"], "")],
    "softmax_grad": [(["B, 4, 6", "B, 4, 6"], "axis=1"), (["3, 5", "3, 5"], "")],
    "layernorm_grad": [(["B, 4, 6", "B, 4, 6", "6"], "eps=0.001"), (["2, 3, 4", "2, 3, 4", "3, 4"], "axis=1")],
    "attention_dq": [(["B, 2, 5, 4", "B, 2, 7, 4", "B, 2, 7, 6", "B, 2, 5, 6"], "scale=0.5"),
                     (["3, 5, 4", "3, 7, 4", "3, 7, 6", "3, 5, 6", "3, 1, 7"], "")],
    "attention_dk": [(["B, 2, 5, 4", "B, 2, 7, 4", "B, 2, 7, 6", "B, 2, 5, 6", "B, 1, 1, 7"], "scale=0.5")],
    "attention_dv": [(["B, 2, 5, 4", "B, 2, 7, 4", "B, 2, 5, 6"], "zero_nan=true"), (["5, 4", "7, 4", "5, 6"], "")],
    "squeeze": [(["B, 1, 3"], "axis=1"), (["1, 3, 1"], "")],
    "unsqueeze": [(["B, 3"], "axis=0"), (["3"], "axis=[0, -1]")],
    "flatten": [(["B, 3, 4"], ""), (["2, 3, 4"], "axis=0"), (["2, 3, 4"], "axis=-1")],
}


def call_text(op: str, types: list[str], attrs: str) -> str:
    """A one-op graph; a type is "dims" (f32) or "dtype: dims"."""
    typed = [t.split(":") if ":" in t else ("f32", t) for t in types]
    params = ", ".join(f"x{i}: {dt.strip()}[{d.strip()}]" for i, (dt, d) in enumerate(typed))
    args = ", ".join([f"x{i}" for i in range(len(types))] + ([attrs] if attrs else []))
    return f"graph g({params}) {{\n    return {op}({args})\n}}\n"


def test_every_op_has_shape_cases():
    assert set(CASES) == set(OPS)


@pytest.mark.parametrize("op, types, attrs",
                         [(op, types, attrs) for op, cases in CASES.items() for types, attrs in cases],
                         ids=lambda v: v if isinstance(v, str) else "/".join(f"[{t}]" for t in v))
def test_inferred_shape_is_the_shape_numpy_computes(op, types, attrs):
    g = one_graph(call_text(op, types, attrs))
    (inferred,) = g.result_types
    xs = rand_inputs(g, DIMS, seed=1, low=0.5, high=1.5)
    (out,) = run(g, xs)
    assert shape_of(inferred, DIMS) == out.shape
    assert out.dtype == NUMPY_DTYPE[inferred.dtype]


@pytest.mark.parametrize("op", sorted(n for n, o in OPS.items() if o.kind == "pointwise"
                                       and o.dtype in ("float", "numeric") and n != "expand"))
def test_pointwise_ops_keep_named_dims(op):
    types = ["B, T", "1, T"][: OPS[op].arity[0]]
    (t,) = one_graph(call_text(op, types, "")).result_types
    assert t == TType(("B", "T"))


def test_reshape_minus_one_keeps_the_named_dim():
    (t,) = one_graph(call_text("reshape", ["B, 4, 6"], "shape=[-1, 24]")).result_types
    assert t.shape == ("B", 24)


def test_slice_of_a_named_dim_has_the_slice_length():
    (t,) = one_graph(call_text("slice", ["B, 3"], "axis=0, start=1, stop=3")).result_types
    assert t.shape == (2, 3)


def test_conv2d_output_size_follows_the_formula():
    # out = (in + 2 * padding - kernel) // stride + 1, per spatial axis
    (t,) = one_graph(call_text("conv2d", ["1, 3, 32, 20", "8, 3, 5, 3"], "stride=[3, 2], padding=[2, 1]")).result_types
    assert t.shape == (1, 8, (32 + 4 - 5) // 3 + 1, (20 + 2 - 3) // 2 + 1)


# ---------------------------------------------------------------- shapes an op refuses

REFUSED = [
    ("add", ["4, 3", "5"], "", "cannot broadcast [4, 3] with [5]: dimension 3 vs 5"),
    ("mul", ["B", "T"], "", "dimension B vs T"),
    ("sub", ["B", "4"], "", "dimension B vs 4"),
    ("matmul", ["4, 3", "4, 3"], "", "inner dimensions differ"),
    ("matmul", ["4", "4, 3"], "", "rank >= 2"),
    ("quantize_linear", ["4", "", "i32: "], "", "needs a u8 or i8 zero point tensors, got i32"),
    ("quantize_linear", ["u8: 4", "", "u8: "], "", "needs f32 data and scale tensors, got u8"),
    ("dequantize_linear", ["u8: 4", "", "i8: "], "", "zero point of the data's dtype, got u8 and i8"),
    ("matmul_integer", ["u8: 2, 3", "i8: 3, 2", "u8: 2", "i8: "], "", "needs a scalar a_zp"),
    ("matmul_integer", ["u8: 2, 3", "i8: 3, 2", "u8: ", "u8: "], "", "each zero point of its operand's dtype"),
    ("conv_integer", ["u8: 1, 2, 5, 5", "i8: 4, 2, 3, 3", "u8: 1", "i8: "], "", "needs a scalar x_zp"),
    ("conv_integer", ["u8: 1, 2, 5, 5", "i8: 4, 2, 3, 3", "u8: ", "i8: 3"], "", "w_zp scalar or [O]"),
    ("conv_integer", ["f32: 1, 2, 5, 5", "i8: 4, 2, 3, 3", "u8: ", "i8: "], "", "needs u8 or i8 tensors, got f32"),
    ("add", ["u8: 4", "u8: 4"], "", "needs numeric"),
    ("matmul", ["2, 4, 3", "5, 3, 2"], "", "cannot broadcast [2] with [5]"),
    ("conv2d", ["1, 3, 8, 8", "4, 2, 3, 3"], "", "channels differ"),
    ("conv2d", ["1, 3, 8, 8", "4, 3, 3, 3", "3"], "", "bias must have shape [4]"),
    ("conv2d", ["1, 3, 2, 2", "4, 3, 3, 3"], "", "does not fit"),
    ("conv2d", ["3, 8, 8", "4, 3, 3, 3"], "", "rank 4"),
    ("conv2d", ["1, 3, 8, 8", "4, 3, 3, 3"], "stride=0", "stride must be >= 1"),
    ("conv2d", ["1, 3, H, 8", "4, 3, 3, 3"], "", "concrete spatial dimensions"),
    ("sum", ["2, 3"], "axis=2", "axis 2 is out of range for rank 2"),
    ("mean", ["2, 3"], "axis=-3", "axis -3 is out of range"),
    ("max", ["2, 3"], "axis=[1, -1]", "repeats an axis"),
    ("softmax", ["2, 3"], "axis=5", "out of range"),
    ("layernorm", ["2, 3", "2", "3"], "", "gamma must have shape [3]"),
    ("layernorm", ["2, 3", "2, 3", "3"], "axis=0", "beta must have shape [2, 3]"),
    ("rmsnorm", ["2, 3", "2"], "", "gamma must have shape [3]"),
    ("batchnorm", ["4", "4", "4", "4", "4"], "", "rank >= 2"),
    ("batchnorm", ["2, 3", "2", "3", "3", "3"], "", "mean must have shape [3]"),
    ("transpose", ["2, 3"], "perm=[0, 0]", "not a permutation"),
    ("transpose", ["2, 3"], "perm=[0, 1, 2]", "not a permutation"),
    ("reshape", ["4, 6"], "shape=[5, 5]", "sizes differ"),
    ("reshape", ["4, 6"], "shape=[-1, 5]", "cannot reshape [4, 6] (24 elements)"),
    ("reshape", ["4, 6"], "shape=[-1, -1]", "at most one -1"),
    ("reshape", ["4, 6"], "shape=[0, 24]", "positive or -1"),
    ("reshape", ["B, T"], "shape=[-1]", "cannot infer -1"),
    ("reshape", ["B, 4"], "shape=[4, 4]", "sizes differ"),
    ("slice", ["10"], "axis=0, start=5, stop=5", "is empty"),
    ("slice", ["10"], "axis=0, start=20", "is empty"),
    ("slice", ["10"], "axis=1", "out of range"),
    ("slice", ["B"], "axis=0, start=-2", "non-negative start and stop"),
    ("concat", ["2, 3", "2, 4"], "axis=0", "shapes [2, 3], [2, 4] differ"),
    ("concat", ["2, 3", "2"], "axis=0", "differ"),
    ("concat", ["B, 3", "B, 3"], "axis=0", "named dimension"),
]


@pytest.mark.parametrize("op, types, attrs, message", REFUSED, ids=[f"{r[0]}:{r[3][:30]}" for r in REFUSED])
def test_bad_shapes_are_refused_at_the_op(op, types, attrs, message):
    text = call_text(op, types, attrs)
    with pytest.raises(EqfuseError) as info:
        one_graph(text)
    err = info.value
    assert message in err.message
    assert (err.pos.line, err.pos.col) == (2, len("    return ") + 1)


# ---------------------------------------------------------------- shape arithmetic


@pytest.mark.parametrize("shapes, out", [
    (((2, 3), (3,)), (2, 3)),
    (((2, 1), (1, 3)), (2, 3)),
    (((), (4,)), (4,)),
    (((), ()), ()),
    ((("B", 1), (1, "T")), ("B", "T")),
    ((("B", 3), ("B", 1), (3,)), ("B", 3)),
    (((1, 1, 1), (2,)), (1, 1, 2)),
])
def test_broadcast(shapes, out):
    assert broadcast(*shapes) == out


@pytest.mark.parametrize("shapes", [((2,), (3,)), (("B",), ("T",)), (("B",), (2,)), ((2, 3), (3, 3), (1, 3))])
def test_broadcast_refuses(shapes):
    with pytest.raises(ShapeError, match="cannot broadcast"):
        broadcast(*shapes)


def test_axes_and_sizes():
    assert [norm_axis(a, 3) for a in (-3, -1, 0, 2)] == [0, 2, 0, 2]
    with pytest.raises(ShapeError):
        norm_axis(3, 3)
    assert dim_product((4, "T", 2, "B")) == (8, ("B", "T"))
    t = TType(("B", 4))
    assert str(t) == "f32[B, 4]" and str(TType()) == "f32"
    assert t.bind({"B": 3}) == TType((3, 4)) and t.size({"B": 3}) == 12
    with pytest.raises(ShapeError, match="dimension B is not bound"):
        t.size()
