"""ONNX Resize (nearest, linear and cubic, the coordinate transforms upsampling heads export) against
onnxruntime: every case is one Resize node of one model, compiled once. Unsupported modes are
refused naming the node."""

from __future__ import annotations

import numpy as np
import pytest

import eqfuse
from eqfuse.errors import EqfuseError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

COORDS = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel")
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
X = (1, 2, 5, 7)
# (mode, coordinate transform, nearest mode, "scales" or "sizes", values)
CASES = ([("nearest", c, n, "scales", (1, 1, 2, 2)) for c in COORDS for n in NEAREST]
         + [("nearest", c, n, "scales", (1, 1, 1.5, 0.6)) for c in COORDS for n in NEAREST]
         + [("nearest", c, "round_prefer_floor", "sizes", (1, 2, 8, 3)) for c in COORDS]
         + [("nearest", c, "floor", "sizes", (1, 2, 1, 13)) for c in COORDS]
         + [("linear", c, "round_prefer_floor", kind, v) for c in COORDS
            for kind, v in (("scales", (1, 1, 2, 2)), ("scales", (1, 1, 1.7, 0.5)), ("sizes", (1, 2, 9, 4)),
                            ("sizes", (1, 2, 1, 3)), ("scales", (1, 1, 3, 1)))]
         # cubic (DINOv2's and YOLOS's position embeddings resized to the image): its four taps per
         # axis read the edge past it, or with exclude_outside weigh 0; TF's coefficient -0.5
         + [("cubic", c, "round_prefer_floor", kind, v) for c in COORDS
            for kind, v in (("scales", (1, 1, 2, 2)), ("sizes", (1, 2, 9, 4)))]
         + [("cubic", "half_pixel", "round_prefer_floor", "scales", (1, 1, 1.7, 0.5), {"exclude_outside": 1}),
            ("cubic", "asymmetric", "round_prefer_floor", "sizes", (1, 2, 3, 11), {"cubic_coeff_a": -0.5})])

# the default tier's cases: each mode and transform once, upsampling and an odd size; the whole
# matrix runs under -m extended
FAST = [0, 21, 27, 38, 40, 41, 52, 58, 60, 65, 68, 69]


def _model(cases, opset=19):
    nodes, inits, outs = [], [], []
    for k, (mode, coord, nearest, kind, v, *extra) in enumerate(cases):
        arr = np.array(v, np.float32 if kind == "scales" else np.int64)
        inits.append(numpy_helper.from_array(arr, f"{kind}{k}"))
        ins = ["x", "", f"{kind}{k}"] if kind == "scales" else ["x", "", "", f"{kind}{k}"]
        nodes.append(helper.make_node("Resize", ins, [f"y{k}"], name=f"resize{k}", mode=mode,
                                      coordinate_transformation_mode=coord, nearest_mode=nearest, **dict(*extra)))
        outs.append(helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "r", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X))], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _run(tmp_path_factory, cases):
    path = tmp_path_factory.mktemp("resize") / "resize.onnx"
    onnx.save(_model(cases), path)
    x = np.random.default_rng(0).standard_normal(X).astype(np.float32)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = eqfuse.compile(str(path))(x)
    return want, got


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    return _run(tmp_path_factory, [CASES[k] for k in FAST])


@pytest.fixture(scope="module")
def every(tmp_path_factory):
    return _run(tmp_path_factory, CASES)


def _ids(cases):
    return ["-".join(map(str, c[:4])) + str(c[4]) for c in cases]


def _check(results, k):
    want, got = results
    assert got[k].shape == want[k].shape
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


@pytest.mark.heavy  # (one compile of the cases, shared)
@pytest.mark.parametrize("k", range(len(FAST)), ids=_ids([CASES[k] for k in FAST]))
def test_resize_matches_onnxruntime(fast, k):
    _check(fast, k)


@pytest.mark.extended
@pytest.mark.parametrize("k", range(len(CASES)), ids=_ids(CASES))
def test_every_resize_matches_onnxruntime(every, k):
    _check(every, k)


@pytest.mark.parametrize("attrs, said", [
    ({"mode": "area"}, "mode 'area'"),
    ({"coordinate_transformation_mode": "tf_crop_and_resize"}, "coordinate_transformation_mode 'tf_crop_and_resize'"),
    ({"keep_aspect_ratio_policy": "not_larger"}, "keep_aspect_ratio_policy 'not_larger'"),
])
def test_unsupported_resize_is_refused_naming_the_node(tmp_path, attrs, said):
    g = helper.make_graph([helper.make_node("Resize", ["x", "", "s"], ["y"], name="up_head", **attrs)], "r",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")])
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)]), path)
    with pytest.raises(EqfuseError) as e:
        eqfuse.compile(str(path))
    assert said in e.value.message and "'up_head'" in e.value.message and "Resize" in e.value.message


@pytest.mark.extended  # (torch.compile's start-up)
def test_torch_upsampling_runs_in_eqfuse_and_matches_eager():
    """F.interpolate nearest and bilinear (align_corners either way) under torch.compile: the
    upsample ops decompose into _unsafe_index gathers, which eqfuse computes (no node falls back
    to torch), and the results are eager's."""
    torch = pytest.importorskip("torch")
    import warnings

    from eqfuse.torch_backend import FallbackWarning

    F = torch.nn.functional

    class Up(torch.nn.Module):
        def forward(self, x):
            return (F.interpolate(x, scale_factor=2, mode="nearest"), F.interpolate(x, size=(9, 4), mode="nearest"),
                    F.interpolate(x, size=(9, 4), mode="bilinear", align_corners=False),
                    F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True))

    m, x = Up(), torch.randn(X)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        got = torch.compile(m, backend="eqfuse")(x)
    for g, w in zip(got, m(x)):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.heavy  # (make_fx)
def test_index_after_full_axes_is_one_gather():
    """aten.index / _unsafe_index with leading full axes (None), as upsampling decomposes:
    converted and evaluated by the reference, equal to torch's indexing (negative indices too)."""
    torch = pytest.importorskip("torch")
    from torch.fx.experimental.proxy_tensor import make_fx

    from eqfuse.frontend.torch_fx import FxConverter
    from eqfuse.ir.reference import evaluate

    def f(x, i, j):
        return x[i], x[:, i], x[:, :, i, j], torch.ops.aten._unsafe_index(x, [None, i.unsqueeze(1), j])

    x, i, j = torch.randn(4, 5, 6, 7), torch.tensor([3, 0, -1]), torch.tensor([1, 5, 2])
    g = FxConverter("t").convert(make_fx(f, tracing_mode="fake")(x, i, j))
    for got, want in zip(evaluate(g, [x.numpy(), i.numpy(), j.numpy()]), f(x, i, j)):
        np.testing.assert_array_equal(got, want.numpy())
