"""Folding bound constants (eqfuse/optimizer/fold.py): batchnorm after conv2d becomes the conv's weights and bias.

Every case compares numbers with the numpy reference of the ORIGINAL graph (SPEC tolerance), and
checks that the batchnorm is gone from the compiled graph exactly when all its constants are bound.
Weights are scaled like a trained network's (std 1/sqrt(fan_in)): folding changes float32 rounding,
and standard-normal 3x3x16 weights make conv outputs large enough that the cancellation in
`conv * s + bias` alone exceeds atol 1e-5, for the reference itself as much as for the folded conv.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ROOT, assert_same_values, one_graph

import eqfuse
from eqfuse.ir.reference import evaluate
from eqfuse.optimizer.fold import fold_params
from eqfuse.optimizer.optimize import report_text

CONV_BN_RELU = ROOT / "examples" / "conv_bn_relu.g"


def conv_bn_params(rng, cout: int, cin: int, k: int = 3, bias: tuple[int, ...] | None = None) -> dict:
    """w, mean, var (positive), gamma, beta and optionally a bias of shape `bias`."""
    p = {"w": rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k),
         "mean": rng.standard_normal(cout) * 0.5, "var": rng.uniform(0.3, 2.0, cout),
         "gamma": rng.uniform(0.5, 2.0, cout) * rng.choice([-1, 1], cout), "beta": rng.standard_normal(cout)}
    if bias is not None:
        p["b"] = rng.standard_normal(bias)
    return {k: v.astype(np.float32) for k, v in p.items()}


def compile_and_check(src: str, params: dict, x: np.ndarray, folds: int) -> eqfuse.Module:
    """Compile with params bound; the result matches the original graph's reference; `folds`
    batchnorms were folded (and exactly the others remain in the compiled graph)."""
    mod = eqfuse.compile(src, params=params)
    g = eqfuse.reference(src).default
    want = evaluate(g, [x if n == "x" else params[n] for n, _ in g.params])
    assert_same_values([mod(x)], want)
    assert len(mod.report["folded"]) == folds, mod.report["folded"]
    remaining = sum(n.op == "batchnorm" for n in g.nodes) - folds
    assert mod.graph.count("batchnorm(") == remaining, mod.graph
    assert sum(k.body.count("batchnorm(") for k in mod.kernels) == remaining
    return mod


def test_conv_bn_relu_example_folds_into_one_conv_kernel():
    rng = np.random.default_rng(0)
    p = conv_bn_params(rng, 32, 16)
    x = rng.standard_normal((2, 16, 32, 32)).astype(np.float32)
    mod = compile_and_check(str(CONV_BN_RELU), p, x, folds=1)
    # the callable takes only x; the folded weight and bias replace the five bound params
    assert "conv_bn_relu(x: f32[N, 16, 32, 32],\n" in mod.graph
    assert "kernel { relu(conv2d(x, w_bn, w_bn_bias, padding=1)) }" in mod.graph
    assert mod.report["folded"] == ["batchnorm(conv2d(..., w), mean, var, gamma, beta) -> conv2d(..., w_bn, w_bn_bias)"]
    assert "#   folded: batchnorm(conv2d(..., w)" in report_text(mod.report)
    [k] = mod.kernels
    assert "batchnorm" not in k.c_source


CONV_BN = """
graph f(x: f32[{n}, {cin}, {h}, {w}], w: f32[{cout}, {cin}, {k}, {k}],
        mean: f32[{cout}], var: f32[{cout}], gamma: f32[{cout}], beta: f32[{cout}]) {{
    return relu(batchnorm(conv2d(x, w, stride={stride}, padding={pad}), mean, var, gamma, beta, eps={eps}))
}}
"""


@pytest.mark.parametrize("n, cin, cout, h, w, k, stride, pad, eps", [
    (1, 3, 8, 9, 7, 3, 2, 1, 1e-5),     # stride 2, odd sizes
    (3, 5, 7, 6, 11, 1, 1, 0, 1e-3),    # 1x1 conv, odd channel counts
    (2, 4, 6, 10, 10, 5, 2, 2, 0.1),    # 5x5 window, large eps
])
def test_conv_bn_shapes(n, cin, cout, h, w, k, stride, pad, eps):
    rng = np.random.default_rng(cin * cout)
    src = CONV_BN.format(n=n, cin=cin, cout=cout, h=h, w=w, k=k, stride=stride, pad=pad, eps=eps)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    compile_and_check(src, conv_bn_params(rng, cout, cin, k), x, folds=1)


@pytest.mark.parametrize("unbound", ["gamma", "w"])
def test_not_folded_when_a_constant_is_unbound(unbound):
    """Only some params bound: the batchnorm stays (computed per element) and results still match."""
    rng = np.random.default_rng(1)
    p = conv_bn_params(rng, 6, 3)
    src = CONV_BN.format(n=2, cin=3, cout=6, h=8, w=8, k=3, stride=1, pad=1, eps=1e-5)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    mod = eqfuse.compile(src, params={k: v for k, v in p.items() if k != unbound})
    g = one_graph(src)
    assert_same_values([mod(x, p[unbound])], evaluate(g, [x] + [p[n] for n, _ in g.params[1:]]))
    assert mod.report["folded"] == []
    assert "batchnorm(" in mod.graph


@pytest.mark.parametrize("conv, bias_shape", [
    ("conv2d(x, w, b, padding=1)", (6,)),          # the conv's own bias
    ("conv2d(x, w, padding=1) + b", (6, 1, 1)),    # a per-channel add after it
    ("b + conv2d(x, w, padding=1)", (1, 6, 1, 1)),
    ("conv2d(x, w, padding=1) + 0.5", None),       # a scalar literal
])
def test_conv_with_bias_then_bn(conv, bias_shape):
    rng = np.random.default_rng(2)
    p = conv_bn_params(rng, 6, 3, bias=bias_shape)
    b = f", b: f32[{', '.join(map(str, bias_shape))}]" if bias_shape else ""
    src = f"""graph f(x: f32[2, 3, 7, 7], w: f32[6, 3, 3, 3]{b},
                      mean: f32[6], var: f32[6], gamma: f32[6], beta: f32[6]) {{
        return batchnorm({conv}, mean, var, gamma, beta) * 2.0
    }}"""
    x = rng.standard_normal((2, 3, 7, 7)).astype(np.float32)
    mod = compile_and_check(src, p, x, folds=1)
    assert "conv2d(x, w_bn, w_bn_bias, padding=1) * 2" in mod.graph


# ---------------------------------------------------------------- the pass alone (no C)


def fold_and_evaluate(src: str, params: dict, x: np.ndarray):
    """(folded result, the original graph's reference, the fold) for one graph."""
    g = one_graph(src)
    f = fold_params(g, params)
    got = evaluate(f.graph, [x if n == "x" else f.params[n] for n, _ in f.graph.params])
    want = evaluate(g, [x if n == "x" else params[n] for n, _ in g.params])
    return got, want, f


def test_batchnorm_of_batchnorm_folds_twice():
    rng = np.random.default_rng(3)
    p = conv_bn_params(rng, 4, 2)
    src = """graph f(x: f32[1, 2, 5, 5], w: f32[4, 2, 3, 3], mean: f32[4], var: f32[4], gamma: f32[4], beta: f32[4]) {
        return batchnorm(batchnorm(conv2d(x, w), mean, var, gamma, beta), beta, var, gamma, mean)
    }"""
    got, want, f = fold_and_evaluate(src, p, rng.standard_normal((1, 2, 5, 5)).astype(np.float32))
    assert_same_values(got, want)
    assert len(f.notes) == 2
    assert [n for n, _ in f.graph.params] == ["x", "w_bn_bn", "w_bn_bn_bias"]


def test_folds_inside_a_hand_written_kernel_block():
    rng = np.random.default_rng(6)
    p = conv_bn_params(rng, 4, 2)
    src = """graph f(x: f32[1, 2, 5, 5], w: f32[4, 2, 3, 3], mean: f32[4], var: f32[4], gamma: f32[4], beta: f32[4]) {
        y = kernel { relu(batchnorm(conv2d(x, w, padding=1), mean, var, gamma, beta)) }
        return y
    }"""
    got, want, f = fold_and_evaluate(src, p, rng.standard_normal((1, 2, 5, 5)).astype(np.float32))
    assert_same_values(got, want)
    assert [n.op for n in f.graph.nodes] == ["input", "input", "input", "conv2d", "relu"]


@pytest.mark.parametrize("body", [
    "c = conv2d(x, w)\n return batchnorm(c, mean, var, gamma, beta) + c",   # the conv is read twice
    "return batchnorm(conv2d(x, w) + beta, mean, var, gamma, beta)",         # beta [C] adds along W, not C
    "return batchnorm(relu(conv2d(x, w)), mean, var, gamma, beta)",          # not linear
])
def test_must_not_fold(body):
    rng = np.random.default_rng(4)
    p = conv_bn_params(rng, 3, 2)
    src = f"""graph f(x: f32[1, 2, 5, 5], w: f32[3, 2, 3, 3], mean: f32[3], var: f32[3], gamma: f32[3], beta: f32[3]) {{
        {body}
    }}"""
    got, want, f = fold_and_evaluate(src, p, rng.standard_normal((1, 2, 5, 5)).astype(np.float32))
    assert_same_values(got, want, exact=True)
    assert f.notes == [] and f.graph.nodes == one_graph(src).nodes


# ---------------------------------------------------------------- ONNX: initializers are bound params


def test_onnx_conv_bn_folds(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    p = conv_bn_params(rng, 8, 3, bias=(8,))
    p2 = conv_bn_params(rng, 8, 8)
    inits = {**p, **{f"{k}2": v for k, v in p2.items()}}
    nodes = [  # a ResNet-style stem: conv(+bias) -> bn -> relu -> conv -> bn, + residual, relu
        helper.make_node("Conv", ["x", "w", "b"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c1", "gamma", "beta", "mean", "var"], ["b1"], epsilon=1e-3),
        helper.make_node("Relu", ["b1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c2", "gamma2", "beta2", "mean2", "var2"], ["b2"]),
        helper.make_node("Add", ["b2", "r1"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 5, 5])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    path = tmp_path / "stem.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)

    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    from onnx.reference import ReferenceEvaluator

    mod = compile_and_check(str(path), inits, x, folds=2)
    assert_same_values([mod(x)], ReferenceEvaluator(str(path)).run(None, {"x": x}))
    assert mod.stem.free == ["x"]


# ---------------------------------------------------------------- a gather of every element in order is a view


@pytest.mark.parametrize("idx, folds", [
    (np.arange(6).reshape(2, 3), True),               # an exported mask's b x total + j
    (np.array([[0, 1, 2], [3, 4, -1]]), True),         # -1: the last row, in order
    (np.array([[0, 1, 2], [3, 5, 4]]), False),         # two rows swapped
    (np.array([[0, 1, 2], [3, 4, 4]]), False),         # a row read twice, one never
])
def test_gather_by_bound_indices_in_order_folds_to_a_reshape(idx, folds):
    """gather(x, idx) with idx bound to 0 .. n - 1 in order (flattened) is reshape(x); any other
    bound idx stays a gather. Values against the reference of the original graph, exactly."""
    src = """graph f(x: f32[6, 4], idx: i64[2, 3]) {
        return gather(x, idx) * 2
    }"""
    x = np.random.default_rng(5).standard_normal((6, 4)).astype(np.float32)
    got, want, f = fold_and_evaluate(src, {"idx": idx.astype(np.int64)}, x)
    assert_same_values(got, want, exact=True)
    assert [n.op for n in f.graph.nodes if n.op in ("gather", "reshape")] == (["reshape"] if folds else ["gather"])
    assert len(f.notes) == folds and ("idx" not in [f.graph.nodes[i].name for i in f.graph.inputs]) == folds


@pytest.mark.parametrize("wscale, folded", [
    ("0.02", ["b"]),                  # a per-tensor weight: its dequantization stays (the integer GEMM's rules)
    ("ws", ["b", "w"]),               # a per-channel one, which those rules do not take, folds too
])
def test_bound_dequantizations_fold_except_a_per_tensor_weight(wscale, folded):
    """quantize_static's QDQ Gemm: DequantizeLinear of the int32 bias and of the int8 weight, all
    bound. The bias folds to f32 (computed once, by the op table's numpy form: the same f32 steps,
    so the values are exactly the original graph's); the weight folds only when per channel."""
    src = f"""graph f(x: f32[3, 8], w: i8[5, 8], wz: i8, ws: f32[5, 1], b: i32[5], bz: i32) {{
        return x @ transpose(dequantize_linear(w, {wscale}, wz), perm=[1, 0]) + dequantize_linear(b, 0.001, bz)
    }}"""
    rng = np.random.default_rng(7)
    params = {"w": rng.integers(-127, 128, (5, 8)).astype(np.int8), "wz": np.array(0, np.int8),
              "ws": rng.uniform(0.01, 0.03, (5, 1)).astype(np.float32),
              "b": rng.integers(-5000, 5000, 5).astype(np.int32), "bz": np.array(0, np.int32)}
    x = rng.standard_normal((3, 8)).astype(np.float32)
    got, want, f = fold_and_evaluate(src, params, x)
    assert_same_values(got, want, exact=True)
    assert sorted(n.split("(")[1].split(",")[0] for n in f.notes) == folded, f.notes
    assert sum(n.op == "dequantize_linear" for n in f.graph.nodes) == 2 - len(folded)
