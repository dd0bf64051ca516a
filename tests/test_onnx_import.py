"""ONNX import: how ONNX nodes map onto eqfuse ops, checked against onnx's reference evaluator.

Models are built in memory with onnx.helper; each `check` imports one, runs the numpy reference
of the imported graph (weights bound from `params`) and compares with onnx.reference.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import eqfuse  # noqa: E402
from eqfuse.errors import EqfuseError  # noqa: E402
from eqfuse.frontend.load import load  # noqa: E402
from eqfuse.frontend.onnx_import import import_model, import_onnx, onnx_params
from eqfuse.frontend.onnx_inputs import sanitize
from eqfuse.ir.printer import graph_text  # noqa: E402
from eqfuse.ir.reference import evaluate  # noqa: E402

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def model(nodes, inputs, outputs, inits=(), opset=18, name="g"):
    """inputs/outputs: (name, shape) pairs (shape None: unknown); inits: (name, array) pairs."""
    g = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F, s) for n, s in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def run(m, feeds, **kw):
    imp = import_model(m, **kw)
    it = iter(feeds[n] for n in imp.inputs)
    args = [imp.params[n] if n in imp.params else next(it) for n, _ in imp.graph.params]
    return imp, evaluate(imp.graph, args)


def check(m, feeds, rtol=1e-5, atol=1e-6, **kw):
    """Import, run the reference, compare with onnx's evaluator; returns the Imported model."""
    imp, got = run(m, feeds, **kw)
    want = ReferenceEvaluator(m).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    # the imported graph always prints as valid .g text that reads back to the same text
    text = graph_text(imp.graph)
    assert graph_text(load(text)[0]) == text
    return imp


# ---------------------------------------------------------------- op mapping


@pytest.mark.parametrize("alpha,beta,ta,tb,cshape", [
    (1.0, 1.0, 0, 0, (5,)), (0.5, 2.0, 1, 0, (3, 5)), (1.0, 0.25, 0, 1, (1, 5)), (2.0, 1.0, 1, 1, ()),
])
def test_gemm_attributes(alpha, beta, ta, tb, cshape):
    a = rand(4, 3) if ta else rand(3, 4)
    b = rand(5, 4) if tb else rand(4, 5)
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=alpha, beta=beta, transA=ta, transB=tb)
    m = model([node], [("a", a.shape)], [("y", None)], [("b", b), ("c", rand(*cshape))])
    imp = check(m, {"a": a})
    assert list(imp.params) == (["b", "c"] if cshape else ["b"])  # a scalar weight is a constant


def test_gemm_without_bias_and_zero_beta():
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], beta=0.0)
    m = model([node], [("a", (2, 3)), ("b", (3, 4)), ("c", (4,))], [("y", None)])
    imp = check(m, {"a": rand(2, 3), "b": rand(3, 4), "c": rand(4)})
    assert "add" not in [n.op for n in imp.graph.nodes]


@pytest.mark.parametrize("sa,sb", [((3,), (3, 4)), ((2, 3, 4), (4,)), ((4,), (4,)), ((2, 1, 3, 4), (5, 4, 2))])
def test_matmul_ranks(sa, sb):
    m = model([helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", sa), ("b", sb)], [("y", None)])
    check(m, {"a": rand(*sa), "b": rand(*sb)})


def test_pointwise_chain_with_scalar_constants():
    nodes = [
        helper.make_node("Constant", [], ["half"], value_float=0.5),
        helper.make_node("Constant", [], ["three"], value=numpy_helper.from_array(np.array([3.0], np.float32))),
        helper.make_node("Pow", ["x", "three"], ["p"]),
        helper.make_node("Mul", ["p", "half"], ["m"]),
        helper.make_node("Sub", ["m", "x"], ["s"]),
        helper.make_node("Div", ["s", "y"], ["d"]),
        helper.make_node("Tanh", ["d"], ["t"]),
        helper.make_node("Sigmoid", ["t"], ["u"]),
        helper.make_node("Erf", ["u"], ["e"]),
        helper.make_node("Exp", ["e"], ["v"]),
        helper.make_node("Sqrt", ["v"], ["w"]),
        helper.make_node("Relu", ["w"], ["z"]),
        helper.make_node("Gelu", ["z"], ["out"], approximate="tanh"),
    ]
    m = model(nodes, [("x", (2, 3)), ("y", (3,))], [("out", None)], opset=20)
    imp = check(m, {"x": rand(2, 3), "y": rand(3) + 3})
    assert imp.params == {}  # size-1 constants became scalars, not parameters
    assert "x ** 3 * 0.5 - x" in graph_text(imp.graph)


def test_softmax_and_reductions():
    nodes = [
        helper.make_node("Softmax", ["x"], ["s"], axis=1),
        helper.make_node("ReduceMean", ["s", "ax"], ["m"], keepdims=1),
        helper.make_node("ReduceSum", ["x"], ["t"], keepdims=0),
        helper.make_node("ReduceMax", ["x", "ax2"], ["u"], keepdims=0),
    ]
    m = model(nodes, [("x", (2, 3, 4))], [("m", None), ("t", None), ("u", None)],
              [("ax", np.array([-1], np.int64)), ("ax2", np.array([0, 2], np.int64))])
    imp = check(m, {"x": rand(2, 3, 4)})
    assert imp.params == {}  # integer initializers steer shapes and are folded


def test_reduce_axes_as_attribute_in_old_opsets():
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=0)
    check(model([node], [("x", (2, 3, 4))], [("y", None)], opset=13), {"x": rand(2, 3, 4)})


def test_softmax_before_opset_13_flattens_the_trailing_dims():
    # onnx.reference applies the opset-13 semantics here; the spec (and onnxruntime) flatten.
    node = helper.make_node("Softmax", ["x"], ["y"], axis=1)
    x = rand(2, 3, 4)
    _, (got,) = run(model([node], [("x", (2, 3, 4))], [("y", None)], opset=11), {"x": x})
    e = np.exp(x - x.max(axis=(1, 2), keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=(1, 2), keepdims=True), rtol=1e-5, atol=1e-6)


def test_layernorm_with_mean_and_inv_std_outputs_and_no_bias():
    node = helper.make_node("LayerNormalization", ["x", "g"], ["y", "mean", "inv"], axis=-2, epsilon=1e-3)
    m = model([node], [("x", (2, 3, 4))], [("y", None), ("mean", None), ("inv", None)], [("g", rand(3, 4))])
    imp = check(m, {"x": rand(2, 3, 4)})
    assert "layernorm(x, g, y_bias, axis=-2, eps=0.001)" in graph_text(imp.graph).replace("\n", "")


def test_instance_normalization_over_numbered_and_named_spatial_dims():
    """InstanceNormalization: one layernorm over the spatial dims when they are numbers, the
    mean and variance spelled out over a named one (Wav2Vec2's audio length)."""
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)
    m = model([node], [("x", (2, 3, "L"))], [("y", None)], [("s", rand(3)), ("b", rand(3))])
    x = rand(2, 3, 7) * 3 + 1
    named = check(m, {"x": x})
    assert "layernorm(" not in graph_text(named.graph)
    bound = check(m, {"x": x}, dims={"L": 7})
    assert "layernorm(" in graph_text(bound.graph)


def test_unused_optional_outputs_are_pruned():
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y", "mean"], axis=-1)
    m = model([node], [("x", (2, 4))], [("y", None)], [("g", rand(4)), ("b", rand(4))])
    imp = check(m, {"x": rand(2, 4)})
    assert [n.op for n in imp.graph.nodes if n.op != "input"] == ["layernorm"]


def test_layout_ops():
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Reshape", ["t", "shape"], ["r"]),
        helper.make_node("Slice", ["r", "starts", "ends", "axes"], ["s"]),
        helper.make_node("Concat", ["s", "s"], ["c"], axis=-1),
        helper.make_node("Flatten", ["c"], ["f"], axis=1),
        helper.make_node("Unsqueeze", ["f", "uax"], ["u"]),
        helper.make_node("Squeeze", ["u", "uax"], ["q"]),
        helper.make_node("Identity", ["q"], ["out"]),
    ]
    inits = [("shape", np.array([0, -1, 2], np.int64)), ("starts", np.array([1, -1], np.int64)),
             ("ends", np.array([2**63 - 1, 2**63 - 1], np.int64)), ("axes", np.array([1, 2], np.int64)),
             ("uax", np.array([0], np.int64))]
    check(model(nodes, [("x", (2, 4, 3))], [("out", None)], inits), {"x": rand(2, 4, 3)})


def test_split_into_equal_and_given_parts():
    nodes = [helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3),
             helper.make_node("Split", ["x", "sizes"], ["d", "e"], axis=-1)]
    m = model(nodes, [("x", (2, 9, 5))], [(n, None) for n in "abcde"], [("sizes", np.array([2, 3], np.int64))])
    check(m, {"x": rand(2, 9, 5)})


@pytest.mark.parametrize("attrs", [
    dict(pads=[1, 1, 1, 1]),
    dict(strides=[2, 2], pads=[1, 0, 1, 0]),
    dict(pads=[0, 1, 2, 1]),  # asymmetric: pad by the larger side, slice the extra outputs off
    dict(auto_pad="SAME_UPPER", strides=[2, 2]),
    dict(auto_pad="SAME_LOWER"),
    dict(auto_pad="VALID", strides=[1, 2]),
])
def test_conv_padding(attrs):
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    m = model([node], [("x", (1, 3, 7, 6))], [("y", None)], [("w", rand(4, 3, 3, 3)), ("b", rand(4))])
    check(m, {"x": rand(1, 3, 7, 6)}, rtol=1e-4, atol=1e-5)


def test_batchnorm_inference():
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "mean", "var"], ["y"], epsilon=1e-3)
    inits = [("s", rand(3)), ("b", rand(3)), ("mean", rand(3)), ("var", np.abs(rand(3)) + 0.5)]
    imp = check(model([node], [("x", (2, 3, 4, 4))], [("y", None)], inits), {"x": rand(2, 3, 4, 4)})
    assert "batchnorm(x, mean, var, s, b, eps=0.001)" in graph_text(imp.graph)


@pytest.mark.parametrize("shape", [(4, 3, 2, 5), (6, 3, 7)])
def test_batchnorm_in_training_mode_takes_the_batch_statistics(shape):
    # BiT's weight standardization: a training-mode batch norm over the conv's weight [1, O, I*kh*kw]
    # (the running statistics' outputs named, as TorchScript's export names them, and read by no one)
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "mean", "var"], ["y", "rm", "rv"], epsilon=1e-3,
                            training_mode=1)
    inits = [("s", rand(3)), ("b", rand(3)), ("mean", rand(3)), ("var", np.abs(rand(3)) + 0.5)]
    imp = check(model([node], [("x", shape)], [("y", None)], inits), {"x": rand(*shape) * 2 + 1})
    assert "batchnorm(" not in graph_text(imp.graph)


def test_max_min_sum_mean_are_pairwise():
    nodes = [helper.make_node("Max", ["a", "b", "c"], ["m"]), helper.make_node("Min", ["m", "a"], ["n"]),
             helper.make_node("Sum", ["n", "b"], ["s"]), helper.make_node("Mean", ["s", "c", "a"], ["y"])]
    check(model(nodes, [("a", (2, 3)), ("b", (3,)), ("c", (2, 1))], [("y", None)]),
          {"a": rand(2, 3), "b": rand(3), "c": rand(2, 1)})


# ---------------------------------------------------------------- constants and folding


def test_shape_arithmetic_is_folded_when_shapes_are_concrete():
    """The TorchScript exporter's Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Gather", ["shp", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        helper.make_node("Concat", ["b1", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [("zero", np.array(0, np.int64)), ("ax0", np.array([0], np.int64)), ("rest", np.array([-1], np.int64))]
    m = model(nodes, [("x", ("B", 3, 4))], [("y", None)], inits)
    imp = check(m, {"x": rand(2, 3, 4)}, dims={"B": 2})
    assert [n.op for n in imp.graph.nodes] == ["input", "reshape"]
    # left named, the same chain folds symbolically: [B, -1] is the reshape's own -1 rule
    imp = check(m, {"x": rand(5, 3, 4)})
    assert [n.op for n in imp.graph.nodes] == ["input", "reshape"]
    assert imp.graph.nodes[1].type.shape == ("B", 12)


def test_tensor_constants_become_parameters():
    mask = np.triu(np.full((3, 3), -1e9, np.float32), 1)
    nodes = [helper.make_node("Constant", [], ["mask"], value=numpy_helper.from_array(mask)),
             helper.make_node("Add", ["x", "mask"], ["s"]), helper.make_node("Softmax", ["s"], ["y"])]
    imp = check(model(nodes, [("x", (2, 3, 3))], [("y", None)]), {"x": rand(2, 3, 3)})
    assert [n for n, _ in imp.graph.params] == ["x", "mask"]
    np.testing.assert_array_equal(imp.params["mask"], mask)


def test_a_weight_read_twice_is_one_parameter():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("MatMul", ["a", "w"], ["y"])]
    imp = check(model(nodes, [("x", (2, 4))], [("y", None)], [("w", rand(4, 4))]), {"x": rand(2, 4)})
    assert list(imp.params) == ["w"]


def test_values_fix_runtime_inputs():
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, (2, 6)),
                                        helper.make_tensor_value_info("shape", TensorProto.INT64, (2,))],
                          [helper.make_tensor_value_info("y", F, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(EqfuseError, match="non-constant input shape of ONNX op 'Reshape'"):
        import_onnx(m)
    imp = check(m, {"x": rand(2, 6), "shape": np.array([3, -1], np.int64)}, values={"shape": np.array([3, -1])})
    assert imp.inputs == ["x"]


# ---------------------------------------------------------------- names and dims


def test_names_are_sanitized_into_identifiers():
    nodes = [helper.make_node("MatMul", ["input.1", "/layer.0/weight:0"], ["/layer.0/MatMul_output_0"]),
             helper.make_node("Relu", ["/layer.0/MatMul_output_0"], ["return"])]
    m = model(nodes, [("input.1", ("batch size", 4))], [("return", None)], [("/layer.0/weight:0", rand(4, 2))],
              name="torch-jit-export")
    imp = check(m, {"input.1": rand(3, 4)})
    text = graph_text(imp.graph)
    assert text.startswith("graph torch_jit_export(input_1: f32[batch_size, 4],")
    assert [n for n, _ in imp.graph.params] == ["input_1", "layer_0_weight_0"]
    assert text.endswith("    return_ = relu(input_1 @ layer_0_weight_0)\n    return return_\n}\n")
    assert sanitize("0abc") == "v_0abc" and sanitize("kernel") == "kernel_" and sanitize("::") == "v"


def test_dims_bind_named_dimensions():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [("x", ("N", "seq", 4))], [("y", None)])
    assert import_onnx(m).params[0][1].shape == ("N", "seq", 4)
    assert import_onnx(m, dims={"N": 2}).params[0][1].shape == (2, "seq", 4)


def test_reshape_keeps_a_named_batch_dim():
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    m = model([node], [("x", ("B", 8, 32))], [("y", None)], [("shape", np.array([0, 8, 4, 8], np.int64))])
    imp = check(m, {"x": rand(2, 8, 32)})
    assert imp.graph.result_types[0].shape == ("B", 8, 4, 8)
    assert "reshape(x, shape=[-1, 8, 4, 8])" in graph_text(imp.graph)


# ---------------------------------------------------------------- errors


def test_unsupported_op_names_the_op_and_node():
    node = helper.make_node("Mod", ["c", "x"], ["y"], name="Mod_12")
    m = model([node], [("c", (2,)), ("x", (2,))], [("y", None)])
    with pytest.raises(EqfuseError) as e:
        import_onnx(m)
    assert e.value.message == "unsupported ONNX op 'Mod' in node 'Mod_12'"


def test_every_unsupported_op_is_listed_once_with_its_count_and_first_node():
    nodes = [helper.make_node("Mod", ["x", "x"], ["a"], name="m1"), helper.make_node("Det", ["a"], ["b"], name="d1"),
             helper.make_node("Mod", ["b", "x"], ["y"], name="m2"), helper.make_node("Relu", ["y"], ["z"])]
    with pytest.raises(EqfuseError) as e:
        import_onnx(model(nodes, [("x", (2, 2))], [("z", None)]))
    assert e.value.message == ("unsupported ONNX ops: 'Mod' (2 nodes, first 'm1'), 'Det' (1 node, first 'd1')")


def test_a_random_op_over_constants_is_refused_not_frozen_into_the_model():
    # (ViTMAE's noise: folding it would make one draw a weight)
    nodes = [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.zeros((2, 3), np.float32))),
             helper.make_node("RandomUniformLike", ["k"], ["r"], name="noise"),
             helper.make_node("Add", ["x", "r"], ["y"])]
    with pytest.raises(EqfuseError) as e:
        import_onnx(model(nodes, [("x", (2, 3))], [("y", None)]))
    assert e.value.message == "unsupported ONNX op 'RandomUniformLike' in node 'noise'"


def test_an_op_without_a_handler_over_constants_is_folded():
    nodes = [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array([5.0, 3.0], np.float32))),
             helper.make_node("Constant", [], ["k2"], value=numpy_helper.from_array(np.array([2.0, 2.0], np.float32))),
             helper.make_node("Mod", ["k", "k2"], ["r"], fmod=1),
             helper.make_node("Add", ["x", "r"], ["y"])]
    check(model(nodes, [("x", (2,))], [("y", None)]), {"x": rand(2)})


@pytest.mark.parametrize("node,msg", [
    (helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="VALIDISH", name="c1"), r"auto_pad .*'Conv' in node 'c1'"),
    (helper.make_node("ConvTranspose", ["x", "w"], ["y"], dilations=[2, 2], name="c2"), r"dilations .*in node 'c2'"),
    (helper.make_node("Relu", ["x"], ["y"], foo=1, name="r"), r"unsupported attribute 'foo' of ONNX op 'Relu' in node 'r'"),
    (helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"], name="s"), r"steps \[0\].*in node 's'"),
])
def test_unsupported_attributes_name_the_op_and_node(node, msg):
    inits = [("w", rand(4, 4, 1, 1)), ("s", np.array([0])), ("e", np.array([4])), ("a", np.array([1])),
             ("st", np.array([0]))]
    m = model([node], [("x", (1, 4, 4, 4))], [("y", None)], [i for i in inits if i[0] in node.input])
    with pytest.raises(EqfuseError, match=msg):
        import_onnx(m)


def test_unsupported_dtype_and_custom_domain():
    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.STRING, name="cast")
    with pytest.raises(EqfuseError, match="cast to STRING of ONNX op 'Cast' in node 'cast'"):
        import_onnx(model([node], [("x", (2,))], [("y", None)]))
    node = helper.make_node("FusedGemm", ["x"], ["y"], domain="com.microsoft", name="fg")
    with pytest.raises(EqfuseError, match="unsupported ONNX op 'com.microsoft.FusedGemm' in node 'fg'"):
        import_onnx(model([node], [("x", (2,))], [("y", None)]))


def test_shape_errors_name_the_node():
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
    with pytest.raises(EqfuseError, match="MatMul: matmul inner dimensions differ.* in node 'mm'"):
        import_onnx(model([node], [("a", (2, 3)), ("b", (4, 5))], [("y", None)]))


def test_unreadable_file(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(EqfuseError, match="not a readable ONNX model"):
        load(str(bad))
    with pytest.raises(EqfuseError, match="no such file"):
        load(str(tmp_path / "missing.onnx"))


# ---------------------------------------------------------------- the .onnx path through the API


@pytest.mark.heavy
def test_onnx_path_through_reference_and_compile(tmp_path):
    w, b = rand(4, 3), rand(3)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    path = tmp_path / "m.onnx"
    onnx.save(model(nodes, [("x", ("B", 4))], [("y", None)], [("w", w), ("b", b)]), path)
    x = rand(5, 4)
    want = np.maximum(x @ w + b, 0)
    np.testing.assert_allclose(eqfuse.reference(str(path))(x, w, b), want, rtol=1e-5, atol=1e-6)
    assert list(onnx_params(path)) == ["w", "b"]
    if hasattr(eqfuse, "compile"):
        mod = eqfuse.compile(str(path), params=onnx_params(path))
        np.testing.assert_allclose(mod(x), want, rtol=1e-4, atol=1e-5)


def test_tile_over_a_named_dim():
    """Tile of a tensor whose batch is a named dim: copies joined along each tiled axis."""
    m = model([helper.make_node("Tile", ["x", "r"], ["y"])], [("x", ("N", 3))], [("y", None)],
              [("r", np.array([2, 3]))])
    check(m, {"x": rand(2, 3)}, dims={"N": 2})


def test_small_decompositions():
    """Ops without an eqfuse op of their own: Reciprocal, ReduceSumSquare, ReduceMin, an int exponent."""
    nodes = [helper.make_node("Reciprocal", ["x"], ["r"]),
             helper.make_node("ReduceSumSquare", ["r", "ax"], ["s"], keepdims=1),
             helper.make_node("ReduceMin", ["x", "ax0"], ["m"], keepdims=0),
             helper.make_node("Pow", ["x", "two"], ["p"]),
             helper.make_node("Dropout", ["p"], ["d"]),
             helper.make_node("Cast", ["d"], ["y"], to=TensorProto.FLOAT)]
    m = model(nodes, [("x", (2, 3))], [("s", None), ("m", None), ("y", None)],
              [("ax", np.array([1], np.int64)), ("ax0", np.array([0], np.int64)), ("two", np.array([2], np.int64))])
    check(m, {"x": rand(2, 3) + 3})


def test_only_weights_read_as_data_are_parameters():
    """A weight that only Shape reads is folded away; an unused runtime input stays in the signature."""
    nodes = [helper.make_node("Shape", ["w"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["y"])]
    imp = check(model(nodes, [("x", (6,)), ("unused", (2,))], [("y", None)], [("w", rand(2, 3))]),
                {"x": rand(6), "unused": rand(2)})
    assert [n for n, _ in imp.graph.params] == ["x", "unused"] and imp.params == {}


# ---------------------------------------------------------------- the ops exporters write, compiled


def _typed_model(nodes, inputs, outputs, inits=()):
    """inputs/outputs: (name, elem type, shape) triples."""
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                          [numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


I64 = TensorProto.INT64


@pytest.mark.parametrize("nodes, inputs, out_type, inits", [
    ([helper.make_node("Cast", ["x"], ["y"], to=I64)], [("x", F, (3, 4))], I64, ()),
    ([helper.make_node("Cast", ["i"], ["y"], to=F)], [("i", I64, (3, 4))], F, ()),
    ([helper.make_node("Cast", ["i"], ["b"], to=TensorProto.BOOL), helper.make_node("Not", ["b"], ["y"])],
     [("i", I64, (3, 4))], TensorProto.BOOL, ()),
    ([helper.make_node("Einsum", ["a", "b"], ["y"], equation="bhid,bhjd->bhij")],
     [("a", F, (2, 3, 4, 5)), ("b", F, (2, 3, 6, 5))], F, ()),
    ([helper.make_node("Einsum", ["a", "b"], ["y"], equation="ij,kj->ik")], [("a", F, (4, 5)), ("b", F, (6, 5))], F, ()),
    # Funnel's and Transformer-XL's: several free or contracted indices flattened, batch indices in
    # any order; an outer product; an index of one operand summed away
    ([helper.make_node("Einsum", ["a", "b"], ["y"], equation="td,dnh->tnh")], [("a", F, (4, 6)), ("b", F, (6, 2, 3))],
     F, ()),
    ([helper.make_node("Einsum", ["a", "b"], ["y"], equation="ibnd,jbnd->bnij")],
     [("a", F, (5, 2, 3, 4)), ("b", F, (6, 2, 3, 4))], F, ()),
    ([helper.make_node("Einsum", ["a", "b"], ["y"], equation="bnij,jbnd->ibnd")],
     [("a", F, (2, 3, 5, 6)), ("b", F, (6, 2, 3, 4))], F, ()),
    ([helper.make_node("Einsum", ["a", "b"], ["y"], equation="bi,bj->bij")], [("a", F, (3, 4)), ("b", F, (3, 5))], F, ()),
    ([helper.make_node("Einsum", ["a", "b"], ["y"], equation="bij,bjk->bk")],
     [("a", F, (2, 3, 4)), ("b", F, (2, 4, 5))], F, ()),
    ([helper.make_node("Einsum", ["a", "b"], ["y"], equation="abc,cde->abde")],
     [("a", F, (2, 3, 4)), ("b", F, (4, 5, 6))], F, ()),
    ([helper.make_node("CumSum", ["i", "ax"], ["y"], exclusive=1)], [("i", I64, (3, 5))], I64, [("ax", np.array(1))]),
    ([helper.make_node("CumSum", ["x", "ax"], ["y"], reverse=1)], [("x", F, (3, 5))], F, [("ax", np.array(-1))]),
    ([helper.make_node("Range", ["s", "e", "d"], ["r"]), helper.make_node("Add", ["i", "r"], ["y"])],
     [("i", I64, (2, 5))], I64, [("s", np.array(3)), ("e", np.array(13)), ("d", np.array(2))]),
    ([helper.make_node("Pad", ["x", "p", "v"], ["y"])], [("x", F, (2, 3))], F,
     [("p", np.array([0, 1, 2, 0])), ("v", np.array(-2.5, np.float32))]),
    ([helper.make_node("GatherND", ["x", "i"], ["y"])], [("x", F, (4, 5, 3)), ("i", I64, (2, 6, 2))], F, ()),
    ([helper.make_node("Trilu", ["x"], ["y"], upper=0)], [("x", F, (2, 4, 4))], F, ()),
    ([helper.make_node("ArgMax", ["x"], ["y"], axis=1, keepdims=0)], [("x", F, (3, 7))], I64, ()),
    # Tile as the TorchScript exporter writes DeBERTa-v2's relative positions (repeats [2, 1, 1])
    ([helper.make_node("Tile", ["x", "r"], ["y"])], [("x", F, (2, 3, 4))], F, [("r", np.array([2, 1, 3]))]),
    ([helper.make_node("Tile", ["i", "r"], ["y"])], [("i", I64, (3, 2))], I64, [("r", np.array([1, 4]))]),
])
def test_exported_op_compiles_and_matches_onnxruntime(nodes, inputs, out_type, inits):
    ort = pytest.importorskip("onnxruntime")
    import eqfuse
    from eqfuse.frontend.onnx_import import onnx_params

    m = _typed_model(nodes, inputs, [("y", out_type, None)], inits)
    rng = np.random.default_rng(3)
    feeds = {n: (rng.integers(-2, 4, s).astype(np.int64) if t == I64 else rng.standard_normal(s).astype(np.float32))
             for n, t, s in inputs}
    (want,) = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    imp = import_model(m)
    mod = eqfuse.compile(graph_text(imp.graph), params=onnx_params(m))
    got = mod(**{n.replace(".", "_"): v for n, v in feeds.items()})
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_nd_of_indices_computed_at_run_time_matches_onnxruntime(reduction):
    """ScatterND whose indices are an input: two of data's three axes indexed (negative indices
    too), each position written once (onnxruntime's reductions of a position written twice are
    in their order; eqfuse's run-time scatter adds them up, and `none` allows no such index)."""
    ort = pytest.importorskip("onnxruntime")
    import eqfuse
    from eqfuse.frontend.onnx_import import onnx_params

    m = _typed_model([helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)],
                     [("x", F, (4, 5, 3)), ("i", I64, (2, 3, 2)), ("u", F, (2, 3, 3))], [("y", F, None)])
    rng = np.random.default_rng(5)
    mod = eqfuse.compile(graph_text(import_model(m).graph), params=onnx_params(m))
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for _ in range(3):
        flat = rng.choice(20, 6, replace=False)
        i = np.stack([flat // 5, flat % 5], axis=-1).reshape(2, 3, 2)
        i = np.where(rng.random(i.shape) < 0.3, i - np.array([4, 5]), i).astype(np.int64)
        feeds = {"x": rng.standard_normal((4, 5, 3)).astype(np.float32), "i": i,
                 "u": rng.standard_normal((2, 3, 3)).astype(np.float32)}
        (want,) = sess.run(None, feeds)
        np.testing.assert_allclose(mod(**feeds), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("reduction, axis", [("none", 1), ("add", 0), ("none", -1)])
def test_scatter_elements_of_indices_computed_at_run_time_matches_onnxruntime(reduction, axis):
    """ScatterElements whose indices are an input, negative ones too, and smaller than data
    on the axes they do not index; each position written once (as in the ScatterND test)."""
    ort = pytest.importorskip("onnxruntime")
    import eqfuse
    from eqfuse.frontend.onnx_import import onnx_params

    ishape = (3, 4, 2) if axis == 0 else (4, 2, 3)
    m = _typed_model([helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=axis, reduction=reduction)],
                     [("x", F, (4, 5, 3)), ("i", I64, ishape), ("u", F, ishape)], [("y", F, None)])
    rng = np.random.default_rng(6)
    mod = eqfuse.compile(graph_text(import_model(m).graph), params=onnx_params(m))
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    size = (4, 5, 3)[axis]
    for _ in range(3):
        along = np.argsort(rng.random(ishape), axis=axis)  # distinct along the axis: written once
        i = np.where(rng.random(ishape) < 0.3, along - size, along).astype(np.int64)
        feeds = {"x": rng.standard_normal((4, 5, 3)).astype(np.float32), "i": i,
                 "u": rng.standard_normal(ishape).astype(np.float32)}
        (want,) = sess.run(None, feeds)
        np.testing.assert_allclose(mod(**feeds), want, rtol=1e-6, atol=1e-6)


def test_exported_top_k_gates_scattered_to_their_experts_match_torch(tmp_path):
    """A mixture of experts' router as transformers writes it (JetMoE's attention experts): the
    softmax of the top-k logits scattered into a zero [tokens, experts] table
    (`Tensor.scatter`), exported by TorchScript as ScatterElements of run-time indices."""
    torch = pytest.importorskip("torch")
    import eqfuse

    class Router(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(16, 6, bias=False)

        def forward(self, x):
            logits = self.w(x)
            top, idx = logits.topk(2, dim=-1)
            return torch.zeros_like(logits).scatter(1, idx, top.softmax(-1)) * logits.sigmoid()

    torch.manual_seed(0)
    model = Router().eval()
    x = torch.randn(10, 16)
    path = tmp_path / "router.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), input_names=["x"], dynamo=False)
    assert "ScatterElements" in {n.op_type for n in onnx.load(str(path)).graph.node}
    mod = eqfuse.compile(str(path))
    for _ in range(3):
        x = torch.randn(10, 16)
        np.testing.assert_allclose(mod(x.numpy()), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axes", [None, (2, 3)])
def test_a_pad_of_a_computed_value_matches_onnxruntime(axes):
    """A Pad whose constant_value is computed in the graph, as quantize_static writes a
    quantized model's explicit pad (MobileNetV2's, EfficientNet's): the zero point
    dequantized, a DequantizeLinear of constants, which the importer keeps as an op."""
    ort = pytest.importorskip("onnxruntime")
    import eqfuse
    from eqfuse.frontend.onnx_import import onnx_params

    pads = [0, 0, 1, 2, 0, 0, 2, 1] if axes is None else [1, 2, 2, 1]
    inits = [("q", np.array(7, np.uint8)), ("s", np.array(0.25, np.float32)), ("z", np.array(3, np.uint8)),
             ("p", np.array(pads, np.int64))] + ([("a", np.array(axes, np.int64))] if axes else [])
    m = _typed_model([helper.make_node("DequantizeLinear", ["q", "s", "z"], ["v"]),
                      helper.make_node("Pad", ["x", "p", "v"] + (["a"] if axes else []), ["y"])],
                     [("x", F, (2, 3, 4, 5))], [("y", F, None)], inits)
    mod = eqfuse.compile(graph_text(import_model(m).graph), params=onnx_params(m))
    x = np.random.default_rng(7).standard_normal((2, 3, 4, 5)).astype(np.float32)
    (want,) = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert want[0, 0, 0, 0] == 1.0  # ((7 - 3) x 0.25: the pad's value)
    np.testing.assert_array_equal(mod(x), want)


def test_a_shape_computed_through_quantize_and_dequantize_of_constants_folds():
    """quantize_static quantizes float arithmetic on shapes too (MobileViT's patch counts): a
    QuantizeLinear and a DequantizeLinear of a constant, whose scale and zero point are
    initializers of one element. Those fold with the constant, so the Reshape reading the result
    sees a constant shape; a weight of more elements stays a parameter."""
    ort = pytest.importorskip("onnxruntime")
    import eqfuse
    from eqfuse.frontend.onnx_import import onnx_params

    inits = [("six", np.array(6.0, np.float32)), ("s", np.array(0.5, np.float32)), ("z", np.array(0, np.uint8)),
             ("w", np.arange(24, dtype=np.float32).reshape(4, 6))]
    m = _typed_model([helper.make_node("QuantizeLinear", ["six", "s", "z"], ["q"]),
                      helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
                      helper.make_node("Cast", ["d"], ["n"], to=I64),
                      helper.make_node("Unsqueeze", ["n", "zero"], ["n1"]),
                      helper.make_node("Concat", ["minus", "n1"], ["shape"], axis=0),
                      helper.make_node("Mul", ["x", "w"], ["xw"]),
                      helper.make_node("Reshape", ["xw", "shape"], ["y"])],
                     [("x", F, (4, 6))], [("y", F, None)],
                     inits + [("zero", np.array([0], np.int64)), ("minus", np.array([-1], np.int64))])
    imported = import_model(m)
    assert "w" in onnx_params(m) and any(imported.graph.nodes[i].name == "w" for i in imported.graph.inputs)
    mod = eqfuse.compile(graph_text(imported.graph), params=onnx_params(m))
    x = np.random.default_rng(8).standard_normal((4, 6)).astype(np.float32)
    (want,) = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert want.shape == (4, 6)
    np.testing.assert_array_equal(mod(x), want)


@pytest.mark.parametrize("op, want", [("QLinearMul", 6), ("QLinearAdd", 5)])
def test_a_shape_computed_through_qlinear_ops_of_constants_folds(op, want):
    """quantize_static's QOperator form writes that shape arithmetic with com.microsoft's
    QLinearMul and QLinearAdd (MobileViT's patch counts): over constants they fold, as eqfuse
    computes them at run time, and the Reshape reading the result sees a constant shape."""
    ort = pytest.importorskip("onnxruntime")
    import eqfuse
    from eqfuse.frontend.onnx_import import onnx_params

    inits = [("two", np.array(2.0, np.float32)), ("three", np.array(3.0, np.float32)), ("s", np.array(0.5, np.float32)),
             ("z", np.array(0, np.uint8)), ("zero", np.array([0], np.int64)), ("minus", np.array([-1], np.int64))]
    m = _typed_model([helper.make_node("QuantizeLinear", ["two", "s", "z"], ["q2"]),
                      helper.make_node("QuantizeLinear", ["three", "s", "z"], ["q3"]),
                      helper.make_node(op, ["q2", "s", "z", "q3", "s", "z", "s", "z"], ["q"], domain="com.microsoft"),
                      helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
                      helper.make_node("Cast", ["d"], ["n"], to=I64),
                      helper.make_node("Unsqueeze", ["n", "zero"], ["n1"]),
                      helper.make_node("Concat", ["minus", "n1"], ["shape"], axis=0),
                      helper.make_node("Reshape", ["x", "shape"], ["y"])],
                     [("x", F, (5, 6))], [("y", F, None)], inits)
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    mod = eqfuse.compile(graph_text(import_model(m).graph), params=onnx_params(m))
    x = np.random.default_rng(8).standard_normal((5, 6)).astype(np.float32)
    (ref,) = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert ref.shape == (30 // want, want)
    np.testing.assert_array_equal(mod(x), ref)


@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization_matches_onnx_reference(opset):
    """GroupNormalization's scale and bias are per group at opset 18 and per channel from 21."""
    import eqfuse
    from eqfuse.frontend.onnx_import import onnx_params

    rng = np.random.default_rng(9)
    n = 3 if opset == 18 else 6
    g = helper.make_graph([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3, epsilon=1e-3)],
                          "g", [helper.make_tensor_value_info("x", F, (2, 6, 4, 5))],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(rng.uniform(0.5, 1.5, n).astype(np.float32), "s"),
                           numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    x = rng.standard_normal((2, 6, 4, 5)).astype(np.float32)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    mod = eqfuse.compile(graph_text(import_model(m).graph), params=onnx_params(m))
    np.testing.assert_allclose(mod(x), want, rtol=1e-5, atol=1e-5)


def test_scatter_nd_multiplying_at_indices_computed_at_run_time_is_one_clear_error():
    m = _typed_model([helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction="mul")],
                     [("x", F, (4, 5)), ("i", I64, (2, 1)), ("u", F, (2, 5))], [("y", F, None)])
    with pytest.raises(EqfuseError, match="reduction 'mul' with indices computed at run time"):
        import_model(m)


@pytest.mark.parametrize("name", ["graph", "node"])
def test_a_name_that_is_not_utf8_is_a_clear_error(name):
    """protobuf returns a string field holding invalid UTF-8 as bytes; the importer says which
    name is damaged instead of failing inside."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="nodeqq")], "graphqq",
                          [helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("y", F, [2])])
    data = helper.make_model(g).SerializeToString().replace(f"{name}qq".encode(), name.encode() + b"\x80q")
    with pytest.raises(EqfuseError, match="not UTF-8 text"):
        import_model(data)


def test_an_element_type_onnx_does_not_name_is_a_clear_error(tmp_path):
    """Found by tests/test_fuzz_cli.py: a mutated file whose input has elem_type 35."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    x.type.tensor_type.elem_type = 35
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]))
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    with pytest.raises(EqfuseError, match=r"35 \(not an ONNX element type\)"):
        import_onnx(path)
