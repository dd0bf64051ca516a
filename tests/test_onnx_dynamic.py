"""ONNX exports with a dynamic batch axis: the batch stays a named dim of the imported graph, and
one compiled module runs at any batch size.

An exporter with a dynamic axis writes the shape arithmetic out (Shape -> Gather -> Concat ->
Reshape, Expand to [batch, 1, 1], Range(0, batch), x.view(-1, 64) of a [batch, 16, 64] tensor);
eqfuse/frontend/onnx_symbolic.py folds it with the batch kept symbolic. The small graphs below
pin each piece against onnx's own evaluator at several batch sizes; the heavy tests export
BERT, GPT-2, ViT and MLP-Mixer (tests/model_exports.py) with both exporters and compare one
compiled module with torch at batch 1, 2 and 5.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
import model_exports  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import eqfuse  # noqa: E402
from eqfuse.errors import ArgumentError, EqfuseError  # noqa: E402
from eqfuse.frontend.onnx_import import import_model, import_onnx  # noqa: E402
from eqfuse.ir.reference import evaluate  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def model(nodes, inputs, outputs, inits=()):
    """inputs: (name, shape, elem type); a str dim is a dim_param."""
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, s, t in inputs],
                          [helper.make_tensor_value_info(n, F, None) for n in outputs],
                          [numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def ints(*v):
    return np.asarray(v, np.int64)


def check_batches(m, make_feeds, batches=(1, 2, 5)):
    """Import once; at each batch the numpy reference of the graph matches onnx's evaluator."""
    imp = import_model(m)
    assert any("B" in t.shape for _, t in imp.graph.params), imp.graph.params
    for b in batches:
        feeds = make_feeds(b)
        args = iter(feeds[n] for n in imp.inputs)
        got = evaluate(imp.graph, [imp.params[n] if n in imp.params else next(args) for n, _ in imp.graph.params])
        want = ReferenceEvaluator(m).run(None, feeds)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    return imp


SHAPE_OF_X = [helper.make_node("Shape", ["x"], ["shp"]), helper.make_node("Gather", ["shp", "zero"], ["b"], axis=0),
              helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"])]
INITS = [("zero", np.array(0, np.int64)), ("ax0", ints(0)), ("m1", ints(-1))]


def cls_expand():
    """ViT's cls token: Expand(cls, Where(shape == -1, 1, shape)) with shape [batch, -1, -1]."""
    nodes = SHAPE_OF_X + [
        helper.make_node("Concat", ["b1", "m1", "m1"], ["s"], axis=0),
        helper.make_node("ConstantOfShape", ["three"], ["ones"], value=numpy_helper.from_array(ints(1))),
        helper.make_node("Mul", ["ones", "mone"], ["neg"]), helper.make_node("Equal", ["s", "neg"], ["eq"]),
        helper.make_node("Where", ["eq", "ones", "s"], ["target"]),
        helper.make_node("Expand", ["cls", "target"], ["e"]), helper.make_node("Concat", ["e", "x"], ["y"], axis=1)]
    cls = np.arange(4, dtype=np.float32).reshape(1, 1, 4)
    m = model(nodes, [("x", ("B", 3, 4), F)], ["y"], INITS + [("three", ints(3)), ("mone", ints(-1)), ("cls", cls)])
    return m, lambda b: {"x": np.random.default_rng(b).standard_normal((b, 3, 4)).astype(np.float32)}


def view_gemm():
    """GPT-2's Conv1D: x.view(-1, 8) of [B, 3, 8], Gemm, view back to [B, 3, 5]."""
    nodes = [helper.make_node("Shape", ["x"], ["shp"]), helper.make_node("Slice", ["shp", "m1", "big"], ["last"]),
             helper.make_node("Concat", ["m1", "last"], ["flat"], axis=0),
             helper.make_node("Reshape", ["x", "flat"], ["x2"]), helper.make_node("Gemm", ["x2", "w", "c"], ["h"]),
             helper.make_node("Gather", ["shp", "zero"], ["b"], axis=0), helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
             helper.make_node("Concat", ["b1", "three", "five"], ["back"], axis=0),
             helper.make_node("Reshape", ["h", "back"], ["y"])]
    rng = np.random.default_rng(0)
    inits = INITS + [("big", ints(2**63 - 1)), ("three", ints(3)), ("five", ints(5)),
                     ("w", rng.standard_normal((8, 5)).astype(np.float32)), ("c", rng.standard_normal(5).astype(np.float32))]
    m = model(nodes, [("x", ("B", 3, 8), F)], ["y"], inits)
    return m, lambda b: {"x": rng.standard_normal((b, 3, 8)).astype(np.float32)}


def flat_gather():
    """The vmap mask of transformers' TorchScript export: flatten(mask)[arange(B)[:, None] * S + kv],
    with negative indices too (they count from the end of the flattened axis)."""
    nodes = SHAPE_OF_X + [
        helper.make_node("Squeeze", ["b1", "ax0"], ["bs"]),
        helper.make_node("Range", ["zero", "bs", "one"], ["r"]), helper.make_node("Unsqueeze", ["r", "ax1"], ["rc"]),
        helper.make_node("Mul", ["rc", "four"], ["base"]), helper.make_node("Add", ["base", "kv"], ["idx"]),
        helper.make_node("Sub", ["idx", "shift"], ["idx2"]),
        helper.make_node("Flatten", ["x"], ["fx"], axis=2), helper.make_node("Gather", ["fx", "idx2"], ["g"], axis=0),
        helper.make_node("Shape", ["idx2"], ["gs"]), helper.make_node("Reshape", ["g", "gs"], ["y"])]
    inits = INITS + [("one", np.array(1, np.int64)), ("ax1", ints(1)), ("four", ints(4)), ("kv", ints(3, 0, 2, 1)),
                     ("shift", ints(2))]
    m = model(nodes, [("x", ("B", 4), F)], ["y"], inits)
    return m, lambda b: {"x": np.arange(4 * b, dtype=np.float32).reshape(b, 4)}


def gather_nd():
    """The dynamo export's mask: GatherND over [B, 4], negative indices included."""
    m = model([helper.make_node("GatherND", ["x", "i"], ["y"])], [("x", ("B", 4), F), ("i", ("B", 3, 2), I64)], ["y"])

    def feeds(b):
        rng = np.random.default_rng(b)
        i = np.stack([rng.integers(-b, b, (b, 3)), rng.integers(-4, 4, (b, 3))], axis=-1)
        return {"x": rng.standard_normal((b, 4)).astype(np.float32), "i": i.astype(np.int64)}
    return m, feeds


def scatter_nd_rows():
    """The dynamo exporter's slice assignment (Funnel's `x[:, :, :16] = y`): the assigned axis moved
    first, a ScatterND of constant indices, the batch in the other axes; one position written twice
    under reduction add."""
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
             helper.make_node("Transpose", ["u"], ["ut"], perm=[1, 0, 2]),
             helper.make_node("ScatterND", ["xt", "i", "ut"], ["s"]),
             helper.make_node("ScatterND", ["s", "j", "ut"], ["a"], reduction="add"),
             helper.make_node("Transpose", ["a"], ["y"], perm=[1, 0, 2])]
    m = model(nodes, [("x", ("B", 6, 3), F), ("u", ("B", 3, 3), F)], ["y"],
              [("i", ints(4, -1, 0).reshape(3, 1)), ("j", ints(2, 5, 2).reshape(3, 1))])

    def feeds(b):
        rng = np.random.default_rng(b)
        return {"x": rng.standard_normal((b, 6, 3)).astype(np.float32),
                "u": rng.standard_normal((b, 3, 3)).astype(np.float32)}
    return m, feeds


def batch_as_data():
    """The batch size read as a number: computed at run time from an input with the named dim."""
    nodes = SHAPE_OF_X + [helper.make_node("Cast", ["b1"], ["bf"], to=F), helper.make_node("Add", ["x", "bf"], ["y"])]
    return model(nodes, [("x", ("B", 3), F)], ["y"], INITS), lambda b: {"x": np.ones((b, 3), np.float32)}


def expanded_ids():
    """The dynamo exporter's token type ids: an i64 zero expanded to the ids' [batch, 3], the
    indices of a Gather (an integer scalar keeps its dtype)."""
    nodes = [helper.make_node("Shape", ["ids"], ["shp"]), helper.make_node("Expand", ["zero", "shp"], ["tt"]),
             helper.make_node("Gather", ["table", "tt"], ["e"]), helper.make_node("Gather", ["words", "ids"], ["w"]),
             helper.make_node("Add", ["w", "e"], ["y"])]
    rng = np.random.default_rng(0)
    inits = INITS + [("table", rng.standard_normal((2, 4)).astype(np.float32)),
                     ("words", rng.standard_normal((7, 4)).astype(np.float32))]
    m = model(nodes, [("ids", ("B", 3), I64)], ["y"], inits)
    return m, lambda b: {"ids": np.random.default_rng(b).integers(0, 7, (b, 3)).astype(np.int64)}


GRAPHS = {f.__name__: f for f in (cls_expand, view_gemm, flat_gather, gather_nd, scatter_nd_rows, batch_as_data,
                                   expanded_ids)}


@pytest.mark.parametrize("name", GRAPHS)
def test_graph_keeps_the_batch_named(name):
    imp = check_batches(*GRAPHS[name]())
    out = imp.graph.nodes[imp.graph.outputs[0]].type.shape
    assert out[0] == "B" and all(isinstance(d, int) for d in out[1:]), out
    if name == "view_gemm":  # merged [B*3, 8] only in the importer: the graph holds [B, 3, 8] @ [8, 5]
        assert imp.graph.params[0][1].shape == ("B", 3, 8) and out == ("B", 3, 5)


@pytest.mark.heavy
@pytest.mark.parametrize("name", GRAPHS)
def test_graph_compiles_once_for_every_batch(name, tmp_path):
    m, make_feeds = GRAPHS[name]()
    path = tmp_path / f"{name}.onnx"
    onnx.save(m, str(path))
    mod = eqfuse.compile(str(path))
    for b in (1, 2, 5):
        feeds = make_feeds(b)
        (want,) = ReferenceEvaluator(m).run(None, feeds)
        got = mod(**feeds)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_reshape_splitting_the_batch_is_a_clear_error():
    nodes = SHAPE_OF_X + [helper.make_node("Concat", ["two", "m1"], ["s"], axis=0),
                          helper.make_node("Reshape", ["x", "s"], ["y"], name="split_batch")]
    m = model(nodes, [("x", ("B", 4), F)], ["y"], INITS + [("two", ints(2))])
    with pytest.raises(EqfuseError, match=r"reshape of \[B, 4\] to \[2, B\*2\].*in node 'split_batch'"):
        import_onnx(m)


def test_an_expand_to_a_product_of_the_batch_is_a_clear_error():
    nodes = SHAPE_OF_X + [helper.make_node("Mul", ["b1", "two"], ["s"]),
                          helper.make_node("Expand", ["c", "s"], ["y"], name="grow")]
    m = model(nodes, [("x", ("B", 4), F)], ["y"], INITS + [("two", ints(2)), ("c", np.ones(1, np.float32))])
    with pytest.raises(EqfuseError, match=r"Expand of \[1\] to \[B\*2\].*in node 'grow'"):
        import_onnx(m)


def test_a_slice_up_to_a_named_dim_is_a_clear_error():
    """BERT's position_ids[:, :seq] with the sequence named: a slice of a fixed table to a named
    length has no IR form."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Slice", ["s", "one", "two"], ["seq"]),
             helper.make_node("Slice", ["table", "zero1", "seq", "one"], ["y"], name="positions")]
    inits = [("one", ints(1)), ("two", ints(2)), ("zero1", ints(0)), ("table", np.ones((1, 64), np.float32))]
    m = model(nodes, [("x", ("B", "S"), F)], ["y"], inits)
    with pytest.raises(EqfuseError, match=r"input ends \[S\], which depends on named dims.*in node 'positions'"):
        import_onnx(m)


def test_ones_come_and_go_around_two_named_dims():
    """[B, 1, S, 3] -> [B, 1, S, 3, 1] (Flatten(axis=rank) of a mask does this): squeeze and
    unsqueeze, since the IR's reshape fills one named dim only."""
    m = model([helper.make_node("Reshape", ["x", "spec"], ["y"])], [("x", ("B", 1, "S", 3), F)], ["y"],
              [("spec", ints(0, 1, 0, 3, 1))])
    imp = check_batches(m, lambda b: {"x": np.random.default_rng(b).standard_normal((b, 1, b + 2, 3)).astype(np.float32)})
    assert imp.graph.nodes[imp.graph.outputs[0]].type.shape == ("B", 1, "S", 3, 1)


RESHAPES = [[-1, 4], [-1, 12], [-1], [0, -1], [0, 12], [-1, 3, 4], [0, 3, 2, 2], [-1, 2, 2], [-1, 6], [2, -1],
            [3, -1], [0, 4, 3], [-1, 1, 4], [1, -1, 4]]


def test_reshapes_of_a_named_dim_import_right_or_fail_clearly():
    """Every reshape of [B, 3, 4], followed by a transpose, a reshape back, a MatMul or a Relu:
    the import either matches onnx at batch 2, 4 and 6 or raises an EqfuseError naming a node."""
    rng = np.random.default_rng(0)
    imported = 0
    for spec in RESHAPES:
        out = np.empty((2, 3, 4)).reshape([2 if d == 0 else d for d in spec]).shape
        posts = {"none": [], "transpose": [helper.make_node("Transpose", ["r"], ["p"], perm=list(range(len(spec)))[::-1])],
                 "back": [helper.make_node("Shape", ["x"], ["sx"]), helper.make_node("Reshape", ["r", "sx"], ["p"])],
                 "matmul": [helper.make_node("MatMul", ["r", "w"], ["p"])], "relu": [helper.make_node("Relu", ["r"], ["p"])]}
        for post, tail in posts.items():
            nodes = [helper.make_node("Reshape", ["x", "spec"], ["r"])] + tail
            nodes.append(helper.make_node("Identity", ["p" if tail else "r"], ["y"]))
            w = rng.standard_normal((out[-1], 5)).astype(np.float32)
            m = model(nodes, [("x", ("B", 3, 4), F)], ["y"], [("spec", ints(*spec)), ("w", w)])
            try:
                imp = import_model(m)
            except EqfuseError as e:
                assert "in node" in str(e) or "graph output" in str(e), e
                continue
            imported += 1
            for b in (2, 4, 6):
                x = rng.standard_normal((b, 3, 4)).astype(np.float32)
                (want,) = ReferenceEvaluator(m).run(None, {"x": x})
                (got,) = evaluate(imp.graph, [imp.params[n] if n in imp.params else x for n, _ in imp.graph.params])
                assert got.shape == want.shape, (spec, post)
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert imported >= 36  # those ending in a merged [B*3, ...] tensor as the output fail, by design


def node(op, ins, out, **attrs):
    return helper.make_node(op, ins, [out], **attrs)


def normal(*shape):
    """Feeds of x at batch b, x's shape `shape` with "B" for the batch."""
    return lambda b: {"x": np.random.default_rng(b).standard_normal([b if d == "B" else d for d in shape]).astype(np.float32)}


def merged_ops():
    """[B, 3, 4] viewed as [B*3, 4]: flattened, scaled, gathered along the 4 and viewed back with
    the batch read from its Shape."""
    nodes = [node("Reshape", ["x", "m14"], "r"), node("Flatten", ["r"], "f", axis=1), node("Mul", ["f", "half"], "h"),
             node("Gather", ["h", "pick"], "g", axis=1), node("Identity", ["g"], "gi"), node("Shape", ["x"], "sx"),
             node("Shape", ["g"], "sg", start=1), node("Slice", ["sx", "z1", "two"], "lead"),
             node("Concat", ["lead", "sg"], "back", axis=0), node("Reshape", ["gi", "back"], "y")]
    inits = [("m14", ints(-1, 4)), ("half", np.float32(0.5)), ("pick", ints(3, 0)), ("z1", ints(0)), ("two", ints(2))]
    return model(nodes, [("x", ("B", 3, 4), F)], ["y"], inits), normal("B", 3, 4)


def merged_matmul():
    """A MatMul of two merged operands, [B*2, 3, 4] @ [B*2, 4, 5], viewed back to [B, 2, 3, 5]."""
    nodes = [node("Reshape", ["x", "m134"], "a"), node("Reshape", ["w", "m145"], "b"), node("MatMul", ["a", "b"], "p"),
             node("Shape", ["x"], "sx"), node("Slice", ["sx", "z1", "two"], "lead"),
             node("Concat", ["lead", "c35"], "back", axis=0), node("Reshape", ["p", "back"], "y")]
    inits = [("m134", ints(-1, 3, 4)), ("m145", ints(-1, 4, 5)), ("z1", ints(0)), ("two", ints(2)), ("c35", ints(3, 5))]
    m = model(nodes, [("x", ("B", 2, 3, 4), F), ("w", ("B", 2, 4, 5), F)], ["y"], inits)
    return m, lambda b: {**normal("B", 2, 3, 4)(b),
                         "w": np.random.default_rng(b + 9).standard_normal((b, 2, 4, 5)).astype(np.float32)}


def flat_gather_two_ints():
    """Elements of a flattened [B, 2, 3] by flat index (negative ones too): a group of two ints
    after the batch."""
    nodes = [node("Reshape", ["x", "m1"], "r"), node("Gather", ["r", "idx"], "y", axis=0)]
    return model(nodes, [("x", ("B", 2, 3), F)], ["y"], [("m1", ints(-1)), ("idx", ints(5, 0, -1, -6, 4))]), normal("B", 2, 3)


def shape_arithmetic():
    """[B, 4] * [1, 2] + [0, 0] (on either side) - [0, 1] = [B, 7], through an Identity; a
    ConstantOfShape of a float and one of an int over it."""
    nodes = [node("Shape", ["x"], "sx"), node("Identity", ["sx"], "si"), node("Mul", ["si", "c12"], "s2"),
             node("Add", ["s2", "c00"], "s3"), node("Add", ["c00", "s3"], "s4"), node("Sub", ["s4", "c01"], "s5"),
             node("ConstantOfShape", ["s5"], "k", value=numpy_helper.from_array(np.array([2.5], np.float32))),
             node("ConstantOfShape", ["s5"], "ki", value=numpy_helper.from_array(ints(3))), node("Cast", ["ki"], "kf", to=F),
             node("Add", ["k", "kf"], "y")]
    inits = [("c12", ints(1, 2)), ("c00", ints(0, 0)), ("c01", ints(0, 1))]
    return model(nodes, [("x", ("B", 4), F)], ["y"], inits), normal("B", 4)


def shape_comparisons():
    """Comparisons of the shape [B, 2]: known from dims being positive (B < 0 is false), of equal
    entries, and one unknown at import time (B > 16: computed at run time)."""
    nodes = [node("Shape", ["x"], "sx"), node("Equal", ["sx", "sx"], "e"), node("Less", ["sx", "c03"], "lt"),
             node("Greater", ["sx", "c16"], "gt"), node("Or", ["lt", "gt"], "o"), node("And", ["o", "e"], "c"),
             node("Neg", ["x"], "nx"), node("Where", ["c", "x", "nx"], "y")]
    return model(nodes, [("x", ("B", 2), F)], ["y"], [("c03", ints(0, 3)), ("c16", ints(16, 1))]), normal("B", 2)


def expanded_batch():
    """Expand of [B] to two entries: a ConstantOfShape [B, B]."""
    nodes = SHAPE_OF_X + [node("Expand", ["b1", "two"], "bb"),
                          node("ConstantOfShape", ["bb"], "y", value=numpy_helper.from_array(np.array([1.5], np.float32)))]
    return model(nodes, [("x", ("B", 4), F)], ["y"], INITS + [("two", ints(2))]), normal("B", 4)


def computed_at_run_time():
    """Shape values eqfuse cannot fold at import, computed at run time instead: B + 1, B == S of
    two named dims, the shape plus a run-time input, the shape reshaped to [1, 2]; and elements
    of a flattened [B, 2, 3, 2] by flat index (its ints merged: B*12)."""
    nodes = [node("Shape", ["x"], "sx"), node("Gather", ["sx", "zero"], "b"), node("Add", ["b", "one"], "b1"),
             node("Gather", ["sx", "one"], "s"), node("Equal", ["b", "s"], "same"), node("Add", ["sx", "k"], "sk"),
             node("Reshape", ["sx", "r12"], "s12"),
             *(node("Cast", [i], i + "f", to=F) for i in ("b1", "sk", "s12")),
             node("Neg", ["x"], "nx"), node("Where", ["same", "x", "nx"], "w"), node("Add", ["w", "b1f"], "t"),
             node("ReduceSum", ["t", "ax1"], "rs"), node("Add", ["skf", "s12f"], "u"), node("Mul", ["u", "rs"], "y0"),
             node("Reshape", ["z", "m1"], "zf"), node("Gather", ["zf", "idx"], "g"), node("Add", ["y0", "g"], "y")]
    inits = [("zero", np.array(0, np.int64)), ("one", np.array(1, np.int64)), ("r12", ints(1, 2)), ("m1", ints(-1)),
             ("idx", ints(11, 0)), ("ax1", ints(1))]
    m = model(nodes, [("x", ("B", "S"), F), ("k", (2,), I64), ("z", ("B", 2, 3, 2), F)], ["y"], inits)

    def feeds(b):
        rng = np.random.default_rng(b)
        return {"x": rng.standard_normal((b, 2)).astype(np.float32), "k": ints(3, -1),
                "z": rng.standard_normal((b, 2, 3, 2)).astype(np.float32)}
    return m, feeds


FOLDS = {f.__name__: f for f in (merged_ops, merged_matmul, flat_gather_two_ints, shape_arithmetic, shape_comparisons,
                                 expanded_batch, computed_at_run_time)}


@pytest.mark.parametrize("name", FOLDS)
def test_shape_arithmetic_and_merged_batches_import_as_onnx_evaluates(name):
    """Each graph imported once (no C build) matches onnx's evaluator at batch 1, 2 and 5."""
    check_batches(*FOLDS[name]())


SHAPE = [node("Shape", ["x"], "sx")]
BATCH = SHAPE_OF_X + [node("Squeeze", ["b1", "ax0"], "bs")]
SCALARS = [("one", np.array(1, np.int64)), ("z", np.array(0, np.int64)), ("three", np.array(3, np.int64))]


@pytest.mark.parametrize("nodes, inputs, inits, message", [
    (SHAPE + [node("Gather", ["sx", "three"], "g", name="bad"), node("Unsqueeze", ["g", "ax0"], "g1"),
              node("Reshape", ["x", "g1"], "y")], [("x", ("B", 4), F)], INITS + SCALARS,
     "Gather: index 3 out of range for 2 entries in node 'bad'"),
    (BATCH + [node("Range", ["one", "bs", "one"], "r", name="bad"), node("Cast", ["r"], "y", to=F)],
     [("x", ("B", 4), F)], INITS + SCALARS, "Range(1, B, 1) (only Range(0, n, 1) up to a named dim) of ONNX op 'Range' in node 'bad'"),
    (BATCH + [node("Range", ["start", "bs", "one"], "r", name="bad"), node("Cast", ["r"], "y", to=F)],
     [("x", ("B", 4), F), ("start", (), I64)], INITS + SCALARS,
     "Range up to B from a start or with a step not known at import time of ONNX op 'Range' in node 'bad'"),
    (BATCH + [node("Mul", ["bs", "three"], "b3"), node("Range", ["z", "b3", "one"], "r", name="bad"),
              node("Cast", ["r"], "y", to=F)], [("x", ("B", 4), F)], INITS + SCALARS,
     "Range up to B*3 (a product of named dims) of ONNX op 'Range' in node 'bad'"),
    (SHAPE + [node("Add", ["sx", "c123"], "s", name="bad"), node("Reshape", ["x", "s"], "y")], [("x", ("B", 4), F)],
     [("c123", ints(1, 2, 3))], "Add: cannot broadcast 2 with 3 entries in node 'bad'"),
    ([node("Reshape", ["x", "m14"], "r"), node("Softmax", ["r"], "sm", name="bad"), node("Shape", ["x"], "sx"),
      node("Reshape", ["sm", "sx"], "y")], [("x", ("B", 3, 4), F)], [("m14", ints(-1, 4))],
     "Softmax of a tensor of shape [B*3, 4] (a named dim multiplied with others; bind it with dims=) of ONNX op "
     "'Softmax' in node 'bad'"),
    ([node("Reshape", ["x", "m1"], "r"), node("Gather", ["r", "idx"], "y", axis=0, name="bad")], [("x", ("B", "S"), F)],
     [("m1", ints(-1)), ("idx", ints(0, 1))], "Gather along dim B*S of a tensor of shape [B*S] of ONNX op 'Gather' in node 'bad'"),
    ([node("Reshape", ["x", "mm"], "y", name="bad")], [("x", ("B", 4), F)], [("mm", ints(-1, -1))],
     "Reshape: shape [-1, -1] has more than one -1 or a negative size in node 'bad'"),
    ([node("Reshape", ["x", "zzz"], "y", name="bad")], [("x", ("B", 4), F)], [("zzz", ints(0, 0, 0))],
     "Reshape: cannot reshape [B, 4] to [0, 0, 0]: a 0 past the input's rank in node 'bad'"),
    (SHAPE_OF_X + [node("Concat", ["b1", "three1"], "t", axis=0), node("Expand", ["x", "t"], "y", name="bad")],
     [("x", ("B", 4), F)], INITS + [("three1", ints(3))], "Expand: cannot expand [B, 4] to [B, 3] in node 'bad'"),
    (SHAPE_OF_X + [node("Concat", ["b1", "c35"], "t", axis=0), node("Reshape", ["x", "t"], "y", name="bad")],
     [("x", ("B", 4), F)], INITS + [("c35", ints(3, 5))], "Reshape: cannot reshape [B, 4] to [B, 3, 5] in node 'bad'"),
    (SHAPE + [node("Concat", ["sx", "z1"], "s", axis=0), node("Reshape", ["x", "s"], "y", name="bad", allowzero=1)],
     [("x", ("B", 4), F)], [("z1", ints(0))],
     "allowzero with a zero in the shape (zero-size tensors) of ONNX op 'Reshape' in node 'bad'"),
], ids=["gather-out-of-range", "range-from-one", "range-run-time-start", "range-of-a-product", "broadcast-entries",
        "merged-softmax", "gather-two-names", "two-minus-ones", "zero-past-rank", "expand-mismatch", "reshape-sizes",
        "allowzero"])
def test_shape_arithmetic_eqfuse_cannot_fold_is_one_error_naming_the_node(nodes, inputs, inits, message):
    """One error, its first line naming the node (a named dim's error adds a note on binding it)."""
    with pytest.raises(EqfuseError) as e:
        import_onnx(model(nodes, inputs, ["y"], inits))
    lines = str(e.value).splitlines()
    assert message in lines[0] and all(ln.startswith("note: ") for ln in lines[1:]), str(e.value)


def test_an_empty_slice_concatenated_adds_nothing():
    """The pass-through part of a rotary embedding over the whole head (Phi-3's `q[..., rot:]`):
    an empty slice, which a concat takes as no operand; at any batch the graph is onnx's."""
    nodes = [node("Slice", ["x", "s0", "s4", "ax2"], "rot"), node("Slice", ["x", "s4", "big", "ax2"], "rest"),
             node("Mul", ["rot", "two"], "r2"), node("Concat", ["r2", "rest"], "y", axis=-1)]
    inits = [("s0", ints(0)), ("s4", ints(4)), ("big", ints(2**63 - 1)), ("ax2", ints(2)),
             ("two", np.float32(2))]
    m = model(nodes, [("x", ("B", 3, 4), F)], ["y"], inits)
    rng = np.random.default_rng(0)
    check_batches(m, lambda b: {"x": rng.standard_normal((b, 3, 4)).astype(np.float32)})


@pytest.mark.parametrize("use, message", [
    ([node("Relu", ["rest"], "y", name="bad")],
     ("unsupported empty slice on axis 2 (zero-size tensors), read by this op of ONNX op 'Relu' in node 'bad'")),
    ([node("Concat", ["rest", "rest"], "y", axis=2, name="bad")],
     ("unsupported empty slice on axis 2, concatenated only with empty tensors (zero-size tensors) of ONNX op "
      "'Concat' in node 'bad'")),
    ([node("Concat", ["x", "rest"], "y", axis=1, name="bad")],
     ("Concat: concat of shapes [B, 3, 4] and [B, 3, 0] along axis 1 in node 'bad'")),
    ([node("Identity", ["rest"], "y")], "unsupported empty slice on axis 2 (zero-size tensors)"),
], ids=["read", "only-empty", "other-axis", "output"])
def test_an_empty_slice_read_otherwise_is_one_error(use, message):
    m = model([node("Slice", ["x", "s4", "big", "ax2"], "rest")] + use, [("x", ("B", 3, 4), F)], ["y"],
              [("s4", ints(4)), ("big", ints(2**63 - 1)), ("ax2", ints(2))])
    with pytest.raises(EqfuseError) as e:
        import_onnx(m)
    assert message in str(e.value).splitlines()[0], str(e.value)


# ---------------------------------------------------------------- real exports


def _export(name: str, exporter: str):
    """(the torch model, its export with a dynamic batch axis: made once, then cached)."""
    import model_exports as me
    import torch

    model, names = me.torch_model(name)

    def write(path):
        args = tuple(torch.from_numpy(v) for v in me.inputs(name).values())
        if exporter == "torchscript":
            axes = {n: {0: "batch"} for n in (*names, "y")}
            torch.onnx.export(model, args, str(path), input_names=list(names), output_names=["y"], opset_version=17,
                              dynamo=False, dynamic_axes=axes)
        else:
            batch = torch.export.Dim("batch", min=1, max=1024)
            torch.onnx.export(model, args, str(path), input_names=list(names), output_names=["y"], opset_version=18,
                              dynamo=True, external_data=False, dynamic_shapes=tuple({0: batch} for _ in names))
    return model, me.cached(f"{name}-{exporter}-dynamic-batch", write)


def _feeds(name: str, b: int) -> dict[str, np.ndarray]:
    import model_exports as me

    rng = np.random.default_rng(b)
    if name in ("bert", "gpt2"):
        mask = np.ones((b, me.S), np.int64)
        mask[-1, me.S - 5:] = 0  # padding at the end of the last sequence
        return {"input_ids": rng.integers(1, me.VOCAB, (b, me.S)).astype(np.int64), "attention_mask": mask}
    key, side = ("pixel_values" if name == "vit" else "x"), (64 if name == "resnet18" else 32)
    return {key: rng.standard_normal((b, 3, side, side)).astype(np.float32)}


@pytest.mark.heavy  # (the conv models ResNet-18 and ViT, and the MLP-Mixer, in the extended tier: the suite's time)
@pytest.mark.parametrize("name, exporter", model_exports.matrix(default=("bert", "gpt2")))
def test_dynamic_batch_export_runs_at_any_batch(name, exporter):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model, path = _export(name, exporter)
    g = import_onnx(path)
    runtime = [t for n, t in g.params if n in _feeds(name, 1)]
    assert runtime and all(t.shape[0] == "batch" for t in runtime), g.params
    mod = eqfuse.compile(str(path))
    # batch is a batch dim (BERT's and GPT-2's masks read at the sample's own position,
    # eqfuse.ir.positions): compiled once for sizes 1 and 2, then 5 runs as chunks of them
    assert mod.default.batch_dim == "batch"
    for b in (2, 1, 5):
        feeds = _feeds(name, b)
        with torch.no_grad():
            want = model(*(torch.from_numpy(v) for v in feeds.values())).numpy()
        got = mod(**feeds)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    assert not mod.default.cache and [b.sizes for b in mod.default.buckets.values()] == [[1, 2]]


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_a_dynamic_sequence_bound_by_dims_leaves_the_batch_a_batch_dim(name):
    """Exported with dynamic batch and sequence axes (as optimum exports them), the model loads
    when dims= binds the sequence: the importer folds its shape arithmetic with it, and the batch
    stays a batch dim (one compile, any batch size)."""
    torch = pytest.importorskip("torch")
    import model_exports as me

    model, path = _export_batch_and_sequence(name)
    with pytest.raises(ArgumentError, match="not a dimension of the model .its named dimensions: batch, sequence"):
        eqfuse.compile(str(path), dims={"seq": me.S})
    mod = eqfuse.compile(str(path), dims={"sequence": me.S})
    assert mod.default.batch_dim == "batch"
    for b in (2, 1, 3):
        feeds = _feeds(name, b)
        with torch.no_grad():
            want = model(*(torch.from_numpy(v) for v in feeds.values())).numpy()
        np.testing.assert_allclose(mod(**feeds), want, rtol=RTOL, atol=ATOL)
    assert not mod.default.cache


def _export_batch_and_sequence(name: str):
    """(the torch model, its torchscript export with dynamic batch and sequence axes: made once,
    then cached; tests/test_padded.py's too)."""
    import model_exports as me
    import torch

    model, names = me.torch_model(name)

    def write(path):
        args = tuple(torch.from_numpy(v) for v in _feeds(name, 2).values())
        axes = {n: {0: "batch", 1: "sequence"} for n in (*names, "y")}
        torch.onnx.export(model, args, str(path), input_names=list(names), output_names=["y"], opset_version=17,
                          dynamo=False, dynamic_axes=axes)
    return model, me.cached(f"{name}-torchscript-dynamic-batch-sequence", write)


@pytest.mark.heavy
def test_the_command_line_binds_an_onnx_sequence_at_import(tmp_path):
    """`--dim sequence=16` reaches the importer for run, opt and check; a --dim the model's inputs
    do not have is a usage error naming the ones they have."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    _, path = _export_batch_and_sequence("bert")
    np.savez(tmp_path / "in.npz", **_feeds("bert", 2))

    def cli(*argv):
        return subprocess.run([sys.executable, "-m", "eqfuse", *argv], capture_output=True, text=True)
    r = cli("run", str(path), "--dim", "sequence=16", "--inputs", str(tmp_path / "in.npz"), "--verify")
    assert r.returncode == 0 and "verified" in r.stderr, r.stderr
    r = cli("opt", str(path), "--dim", "sequence=16")
    assert r.returncode == 0 and "#   batch: a batch dim, any size at run time from one compile" in r.stdout, r.stderr
    r = cli("check", str(path), "--dim", "seq=16")
    assert r.returncode == 2 and "has no dimension named 'seq' (its named dimensions: batch, sequence)" in r.stderr
    assert "Traceback" not in r.stderr
