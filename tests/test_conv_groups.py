"""Convolutions as users have them: conv2d with group= (grouped, depthwise, channel multiplier)
and dilation=, conv1d, conv_transpose2d. Each is compiled to C and checked against the numpy
reference; the reference against torch; ONNX imports against onnxruntime; torch.compile against
eager; the gradients against finite differences and the compiled joint graph against its
reference. Tolerances are the project's (rtol 1e-4, atol 1e-5).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import Compiled

import eqfuse
from eqfuse.errors import EqfuseError
from eqfuse.frontend.load import load
from eqfuse.grad.check import CASES, check_case
from eqfuse.grad.vjp import grad_graph
from eqfuse.ir.ops import OPS
from eqfuse.ir.reference import evaluate

RTOL, ATOL = 1e-4, 1e-5

# (name, op, x shape, w shape, bias, attributes as written in .g)
CASES_C = [
    ("dw3", "conv2d", (2, 8, 9, 9), (8, 1, 3, 3), True, "padding=1, group=8"),
    ("dw3_s2", "conv2d", (1, 6, 11, 10), (6, 1, 3, 3), True, "stride=2, padding=1, group=6"),
    ("dw5_odd", "conv2d", (1, 5, 7, 13), (5, 1, 5, 5), False, "padding=2, group=5"),
    ("dw_dil2", "conv2d", (1, 4, 10, 9), (4, 1, 3, 3), True, "padding=2, dilation=2, group=4"),
    ("dw7_wide", "conv2d", (1, 20, 21, 19), (20, 1, 7, 7), True, "padding=3, group=20"),
    ("dw7_s2", "conv2d", (1, 16, 23, 40), (16, 1, 7, 7), False, "stride=2, padding=3, group=16"),
    ("g16_lanes", "conv2d", (1, 32, 9, 11), (32, 16, 3, 3), True, "padding=1, group=2"),
    ("g32_s2_lanes", "conv2d", (2, 16, 10, 9), (64, 8, 3, 3), False, "stride=2, padding=1, group=2"),
    ("g16_dil_lanes", "conv2d", (1, 16, 11, 10), (32, 8, 3, 3), True, "padding=2, dilation=2, group=2"),
    ("dw_mult", "conv2d", (2, 4, 7, 6), (12, 1, 3, 3), True, "padding=1, group=4"),
    ("dw_asym", "conv2d", (1, 3, 8, 11), (6, 1, 3, 2), False, "stride=[2, 1], padding=[0, 1], dilation=[1, 3], group=3"),
    ("g2", "conv2d", (2, 6, 9, 7), (4, 3, 3, 3), True, "padding=1, group=2"),
    ("g2_s2_dil2", "conv2d", (2, 6, 11, 10), (8, 3, 3, 3), True, "stride=2, padding=2, dilation=2, group=2"),
    ("g4_1x1", "conv2d", (1, 8, 5, 5), (8, 2, 1, 1), False, "group=4"),
    ("dil2", "conv2d", (2, 3, 11, 10), (5, 3, 3, 3), True, "padding=2, dilation=2"),
    ("dil_s2", "conv2d", (1, 3, 12, 9), (4, 3, 3, 2), False, "stride=2, padding=[2, 1], dilation=[2, 3]"),
    ("c1", "conv1d", (2, 6, 17), (4, 6, 3), True, "padding=1"),
    ("c1_s2", "conv1d", (2, 5, 16), (8, 5, 3), True, "stride=2, padding=1"),
    ("c1_g_dil", "conv1d", (2, 6, 15), (6, 2, 5), True, "padding=4, dilation=2, group=3"),
    ("c1_dw", "conv1d", (1, 4, 9), (8, 1, 3), False, "stride=2, padding=1, group=4"),
    ("ct", "conv_transpose2d", (2, 4, 5, 4), (4, 3, 3, 3), True, "stride=2, padding=1, output_padding=1"),
    ("ct_g", "conv_transpose2d", (2, 6, 5, 4), (6, 2, 3, 3), True, "stride=2, padding=1, output_padding=1, group=3"),
    ("ct_asym", "conv_transpose2d", (1, 4, 5, 4), (4, 3, 2, 3), False, "stride=[3, 1], padding=[0, 1], output_padding=[2, 0]"),
    ("ct_bigpad", "conv_transpose2d", (1, 4, 5, 4), (4, 3, 4, 4), True, "stride=2, padding=3"),
    ("ct_s1", "conv_transpose2d", (1, 3, 6, 5), (3, 4, 3, 3), False, "padding=1"),
]


def _dims(s) -> str:
    return ", ".join(map(str, s))


def _graph(name, op, xs, ws, bias, at) -> str:
    """The case as a .g graph: relu(op(x, w[, b], attributes))."""
    g = load(f"graph p(x: f32[{_dims(xs)}], w: f32[{_dims(ws)}]) {{ return {op}(x, w, {at}) }}")[0]
    o = g.result_types[0].shape
    params = f"x: f32[{_dims(xs)}], w: f32[{_dims(ws)}]" + (f", b: f32[{o[1]}]" if bias else "")
    return f"graph {name}({params}) -> f32[{_dims(o)}] {{\n    return relu({op}(x, w{', b' if bias else ''}, {at}))\n}}\n"


def _attrs(case) -> dict:
    """The case's attributes as the op table normalizes them (read from the parsed graph)."""
    g = load(_graph(*case))[0]
    return next(n.attr for n in g.nodes if n.op == case[1])


@pytest.fixture(scope="module")
def compiled():
    """Every case's graph, compiled when its test first runs (helpers.Compiled)."""
    return Compiled({c[0]: _graph(*c) for c in CASES_C})


def _out_channels(op, ws, full) -> int:
    return ws[1] * full["group"] if op == "conv_transpose2d" else ws[0]


def _inputs(rng, op, xs, ws, bias, full):
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    return [x, w] + ([rng.standard_normal(_out_channels(op, ws, full)).astype(np.float32)] if bias else [])


@pytest.mark.heavy  # (a module compiled for each case)
@pytest.mark.parametrize("case", CASES_C, ids=[c[0] for c in CASES_C])
def test_compiled_matches_reference(compiled, case):
    name, op, xs, ws, bias, at = case
    full = _attrs(case)
    args = _inputs(np.random.default_rng(CASES_C.index(case)), op, xs, ws, bias, full)
    want = np.maximum(OPS[op].numpy(args, full), 0)
    got = getattr(compiled, name)(*args)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", CASES_C, ids=[c[0] for c in CASES_C])
def test_reference_matches_torch(case):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    name, op, xs, ws, bias, at = case
    full = _attrs(case)
    args = _inputs(np.random.default_rng(1), op, xs, ws, bias, full)
    ta = [torch.from_numpy(a) for a in args] + [None] * (3 - len(args))
    if op == "conv2d":
        want = F.conv2d(*ta, stride=full["stride"], padding=full["padding"], dilation=full["dilation"],
                        groups=full["group"])
    elif op == "conv1d":
        want = F.conv1d(*ta, stride=full["stride"], padding=full["padding"], dilation=full["dilation"],
                        groups=full["group"])
    else:
        want = F.conv_transpose2d(*ta, stride=full["stride"], padding=full["padding"],
                                  output_padding=full["output_padding"], groups=full["group"])
    got = OPS[op].numpy(args, full)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want.numpy(), rtol=RTOL, atol=ATOL)


# Groups of at least a vector of output channels that are not whole vectors (RegNet's group widths
# 24, 56, 120 over AVX-512's 16 lanes): ceil(OG / VL) blocks of one group each, the last one masked
# (conv_grouped.ConvGroupedDetail.grouped; 24 runs as three blocks of 8 lanes, conv_grouped.lanes).
# (name, x shape, w shape, attributes as written in .g)
WIDTHS = [
    ("g24", (1, 48, 9, 11), (48, 24, 3, 3), "padding=1, group=2"),  # 3 x 8 lanes
    ("g20_s2", (2, 20, 10, 9), (40, 10, 3, 3), "stride=2, padding=1, group=2"),  # 8 + 8 + 4 lanes, 10 inputs a group
    ("g40_dil", (1, 80, 8, 7), (80, 40, 3, 3), "padding=2, dilation=2, group=2"),  # 16 + 16 + 8
    ("g56_5x5", (1, 112, 6, 5), (112, 56, 5, 5), "padding=2, group=2"),  # 3 x 16 + 8
    ("g24_mult", (1, 2, 7, 8), (48, 1, 3, 3), "padding=1, group=2"),  # one input channel, 24 outputs a group
]


def _width_graph(name, xs, ws, at) -> str:
    return _graph(name, "conv2d", xs, ws, True, at)


@pytest.fixture(scope="module", params=["zen4", pytest.param("avx2", marks=pytest.mark.extended)])
def widths(request):
    """The WIDTHS cases' graphs, each compiled when its test first runs (helpers.Compiled), once
    per machine model: AVX-512's 16 lanes (24 per group at 8 lanes, the others with a masked
    block), and AVX2's 8 (x86-64-v3 kernels: 20 per group masked, 8 + 8 + 4; the others whole
    vectors)."""
    return Compiled({c[0]: _width_graph(*c) for c in WIDTHS}, request.param)


@pytest.mark.parametrize("case", WIDTHS, ids=[c[0] for c in WIDTHS])
def test_groups_of_part_vectors_run_channels_in_the_lanes(widths, case):
    name, xs, ws, at = case
    full = _attrs((name, "conv2d", xs, ws, True, at))
    rng = np.random.default_rng(WIDTHS.index(case))
    # (weights scaled by 1 / sqrt(K), K = CG x KH x KW, as a trained layer's are: outputs of unit
    # scale, whose f32 rounding the project's atol covers)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    args = [rng.standard_normal(xs).astype(np.float32), w, rng.standard_normal(ws[0]).astype(np.float32)]
    want = np.maximum(OPS["conv2d"].numpy(args, full), 0)
    np.testing.assert_allclose(getattr(widths, name)(*args), want, rtol=RTOL, atol=ATOL)
    (k,) = [k for k in getattr(widths, name).last.kernels if k.kind == "conv2d"]
    assert (k.decisions["channels"], k.decisions["grouped"]) == (1, 1)


def test_groups_of_24_channels_match_onnxruntime(tmp_path):
    """RegNet's group width 24 (a vector and a masked half on AVX-512), Conv + BatchNormalization +
    Relu as an ONNX file, weights bound: eqfuse against onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inits = {"w": f(72, 24, 3, 3) * 0.2, "g": f(72), "be": f(72), "m": f(72) * 0.1, "v": np.abs(f(72)) + 0.5}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1] * 4, group=3),
             helper.make_node("BatchNormalization", ["c", "g", "be", "m", "v"], ["bn"], epsilon=1e-5),
             helper.make_node("Relu", ["bn"], ["y"])]
    gr = helper.make_graph(nodes, "g24", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 72, 10, 12])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                           [numpy_helper.from_array(a, n) for n, a in inits.items()])
    path = tmp_path / "g24.onnx"
    onnx.save(helper.make_model(gr, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    x = f(1, 72, 10, 12)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    mod = eqfuse.compile(str(path))
    np.testing.assert_allclose(mod(x), want, rtol=RTOL, atol=ATOL)
    assert [(k.decisions["channels"], k.decisions["grouped"]) for k in mod.kernels if k.kind == "conv2d"] == [(1, 1)]


@pytest.mark.heavy  # (a few seconds: the whole suite runs it, the fast tier not)
def test_depthwise_block_fuses_batchnorm_and_relu6():
    """A MobileNetV2 inverted residual block: three kernels, the depthwise conv's batchnorm and
    ReLU6 in its epilogue; bound, the batchnorms fold into the weights and biases and the block is
    one kernel (rules fuse_pw_dw_clip and fuse_dw_pw: the expanded tensor, 24 channels at 10 x 10,
    fits L1)."""
    src = """graph block(x: f32[1, 8, 10, 10],
        w1: f32[24, 8, 1, 1], m1: f32[24], v1: f32[24], g1: f32[24], b1: f32[24],
        w2: f32[24, 1, 3, 3], m2: f32[24], v2: f32[24], g2: f32[24], b2: f32[24],
        w3: f32[8, 24, 1, 1], m3: f32[8], v3: f32[8], g3: f32[8], b3: f32[8]) -> f32[1, 8, 10, 10] {
    h = clip(batchnorm(conv2d(x, w1), m1, v1, g1, b1), min=0.0, max=6.0)
    d = clip(batchnorm(conv2d(h, w2, padding=1, group=24), m2, v2, g2, b2), min=0.0, max=6.0)
    return batchnorm(conv2d(d, w3), m3, v3, g3, b3) + x
}"""
    g = load(src)[0]
    rng = np.random.default_rng(0)
    arrays = {n: (rng.uniform(0.5, 2, t.shape) if n[0] == "v" else rng.standard_normal(t.shape)).astype(np.float32)
              for n, t in g.params}
    want = evaluate(g, list(arrays.values()))[0]
    for params in (None, {k: v for k, v in arrays.items() if k != "x"}):
        mod = eqfuse.compile(src, params=params)
        assert mod.report["kernels_after"] == (3 if params is None else 1)
        assert "group=24" in mod.report["graph"]
        dw = [line for line in mod.report["graph"].splitlines() if "group=24" in line][0]
        assert "clip(" in dw and ("batchnorm(" in dw) == (params is None)
        got = mod(arrays["x"]) if params else mod(*arrays.values())
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-4)


@pytest.mark.parametrize("src, message", [
    ("graph b(x: f32[1, 8, 5, 5], w: f32[6, 3, 3, 3]) { return conv2d(x, w, group=3) }",
     "conv2d group=3 does not divide the input's 8 channels"),
    ("graph b(x: f32[1, 8, 5, 5], w: f32[8, 4, 3, 3]) { return conv2d(x, w, group=4) }",
     "conv2d channels differ: x has 8 channels in 4 groups of 2, w expects 4 per group"),
    ("graph b(x: f32[1, 8, 5, 5], w: f32[6, 2, 3, 3]) { return conv2d(x, w, group=4) }",
     "conv2d group=4 does not divide the weights' 6 output channels"),
    ("graph b(x: f32[1, 8, 5, 5], w: f32[8, 1, 3, 3]) { return conv2d(x, w, dilation=3, group=8) }",
     "conv2d window 3 (dilation 3: 7 wide) with padding 0 does not fit input size 5"),
    ("graph b(x: f32[1, 6, 9], w: f32[4, 3, 3]) { return conv1d(x, w, group=4) }",
     "conv1d group=4 does not divide the input's 6 channels"),
    ("graph b(x: f32[1, 6, 3, 3], w: f32[6, 2, 3, 3]) { return conv_transpose2d(x, w, group=4) }",
     "conv_transpose2d group=4 does not divide the input's 6 channels"),
    ("graph b(x: f32[1, 6, 3, 3], w: f32[6, 2, 3, 3]) { return conv_transpose2d(x, w, stride=2, output_padding=2) }",
     "output_padding [2, 2] must be >= 0 and smaller than the stride [2, 2]"),
])
def test_bad_group_is_one_clear_error(src, message):
    with pytest.raises(EqfuseError) as e:
        eqfuse.compile(src)
    assert message in str(e.value)
    assert "Traceback" not in str(e.value)


def test_gradients_match_finite_differences():
    """The derivative rules of the new ops and attributes (what `eqfuse check-grads` runs)."""
    cases = [(e, p) for e, p in CASES if ("group=" in e or "dilation=" in e or "conv1d" in e or "conv_transpose" in e)]
    assert len(cases) >= 8
    for expr, params in cases:
        for r in check_case(expr, params):
            assert r.ok, r


@pytest.mark.heavy  # (a few seconds: the whole suite runs it, the fast tier not)
def test_compiled_gradients_of_a_depthwise_and_a_transposed_conv():
    src = """graph t(x: f32[2, 4, 7, 6], w: f32[8, 1, 3, 3], b: f32[8], v: f32[8, 3, 2, 2]) {
        h = relu(conv2d(x, w, b, stride=2, padding=1, dilation=[1, 2], group=4))
        y = conv_transpose2d(h, v, stride=2, output_padding=1)
        return sum(y * y)
    }"""
    wrt = ["x", "w", "b", "v"]
    mod = eqfuse.compile(src, grad=wrt)
    rng = np.random.default_rng(0)
    g = load(src)[0]
    args = [rng.standard_normal(t.shape).astype(np.float32) for _, t in g.params]
    out = mod(*args)
    for a, b in zip(out, evaluate(grad_graph(g, wrt), args)):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=1e-4)


# ---------------------------------------------------------------- importers

def _modules():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return {
        "depthwise_bn_relu6": (nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8), nn.ReLU6()),
                               (2, 8, 9, 9)),
        "grouped_dilated": (nn.Conv2d(6, 4, 3, stride=2, padding=2, dilation=2, groups=2), (2, 6, 11, 10)),
        "multiplier": (nn.Conv2d(4, 8, (3, 5), padding=(1, 2), groups=4, bias=False), (1, 4, 7, 6)),
        # channel multiplier 3, 36 output channels (a last block of fewer than a vector)
        "multiplier_7x7": (nn.Conv2d(12, 36, 7, padding=3, groups=12), (1, 12, 9, 11)),
        # groups of 4 channels, fewer than a vector
        "groups_of_4": (nn.Sequential(nn.Conv2d(24, 24, 3, stride=(1, 2), padding=1, groups=6), nn.BatchNorm2d(24),
                                      nn.ReLU()), (2, 24, 10, 12)),
        "conv1d": (nn.Sequential(nn.Conv1d(6, 4, 3, padding=1), nn.GELU(), nn.Conv1d(4, 8, 3, stride=2, padding=1)),
                   (2, 6, 17)),
        "conv1d_grouped": (nn.Conv1d(6, 6, 5, padding=4, dilation=2, groups=3), (2, 6, 15)),
        "conv_transpose": (nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1, groups=2), (2, 6, 5, 4)),
    }


MODULES = ["depthwise_bn_relu6", "grouped_dilated", "multiplier", "multiplier_7x7", "groups_of_4", "conv1d",
           "conv1d_grouped", "conv_transpose"]
# these run with output channels in the vector lanes, each lane reading its own group's inputs
# (conv_grouped.use_channels: a channel multiplier, groups smaller than a vector)
LANES = {"multiplier", "multiplier_7x7", "groups_of_4"}


def _randomized(m):
    import torch

    with torch.no_grad():
        for b in m.modules():
            if isinstance(b, torch.nn.BatchNorm2d):
                b.running_mean.uniform_(-0.5, 0.5)
                b.running_var.uniform_(0.5, 2.0)
    return m.eval()


@pytest.mark.parametrize("name", MODULES)
def test_onnx_import_matches_onnxruntime(name, tmp_path):
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    m, shape = _modules()[name]
    m = _randomized(m)
    x = torch.randn(*shape)
    path = tmp_path / f"{name}.onnx"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (x,), str(path), input_names=["x"], output_names=["y"], opset_version=17, dynamo=False)
    want = ort.InferenceSession(str(path)).run(None, {"x": x.numpy()})[0]
    mod = eqfuse.compile(str(path))
    got = mod(x.numpy())
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    if name in LANES:
        assert [k.decisions["channels"] for k in mod.kernels if k.kind == "conv2d"] == [1]


@pytest.mark.heavy  # (a few seconds: the whole suite runs it, the fast tier not)
# (test_onnx_import_matches_onnxruntime runs every module; through torch.compile the extended tier
# runs the conv1d and grouped-dilated ones and the lanes' but the multiplier: the suite's time)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.extended)
                                  if n in LANES - {"multiplier"} | {"grouped_dilated", "conv1d", "conv1d_grouped"} else n
                                  for n in MODULES])
def test_torch_compile_matches_eager(name):
    torch = pytest.importorskip("torch")
    from eqfuse import torch_backend
    from eqfuse.torch_backend import REPORTS

    torch_backend.register()
    torch._dynamo.reset()
    del REPORTS[:]
    m, shape = _modules()[name]
    m = _randomized(m)
    x = torch.randn(*shape)
    with torch.no_grad():
        got = torch.compile(m, backend="eqfuse")(x)
        want = m(x)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    assert REPORTS and all(r.partitions for r in REPORTS), "eqfuse computed nothing"
    assert not {op for r in REPORTS for op, _ in r.fallbacks}, [r.summary() for r in REPORTS]
    torch._dynamo.reset()


def test_a_pointwise_op_after_a_conv1d_joins_its_kernel():
    # conv1d is conv2d between two reshapes (eqfuse.ir.conv_forms): a one-input pointwise op after
    # it is applied before the reshape back, so it is the conv2d kernel's epilogue (Whisper's GELU),
    # not its own pass over the output
    src = ("graph c(x: f32[1, 8, 40], w: f32[16, 8, 3], b: f32[16]) -> f32[1, 16, 40] {\n"
           "  return relu(gelu(conv1d(x, w, b, padding=1)))\n}\n")
    rng = np.random.default_rng(3)
    xs = {"x": rng.standard_normal((1, 8, 40)).astype(np.float32),
          "w": (rng.standard_normal((16, 8, 3)) / 5).astype(np.float32), "b": rng.standard_normal(16).astype(np.float32)}
    mod = eqfuse.compile(src)
    got = mod.c(**xs)
    assert [str(p.kind) for p in mod.c.last.plans if str(p.kind) != "view"] == ["conv2d"]
    np.testing.assert_allclose(got, np.asarray(eqfuse.reference(src)(**xs)), rtol=RTOL, atol=ATOL)


def test_a_conv1d_over_a_named_batch_runs_at_any_batch():
    # (Wav2Vec2 and Whisper exported with a dynamic batch: the conv2d form's reshapes take the
    # named batch as -1)
    src = ("graph c(x: f32[N, 4, 21], w: f32[6, 4, 5], b: f32[6]) -> f32[N, 6, 10] {\n"
           "  return gelu(conv1d(x, w, b, stride=2, padding=1))\n}\n")
    rng = np.random.default_rng(4)
    w, b = rng.standard_normal((6, 4, 5)).astype(np.float32) / 3, rng.standard_normal(6).astype(np.float32)
    mod = eqfuse.compile(src)
    for n in (1, 3):
        x = rng.standard_normal((n, 4, 21)).astype(np.float32)
        np.testing.assert_allclose(mod.c(x=x, w=w, b=b), np.asarray(eqfuse.reference(src)(x=x, w=w, b=b)),
                                   rtol=RTOL, atol=ATOL)


# TF's "same" padding of a conv, (0, 1) on each axis (conv2d padding [0, 0, 1, 1]: a pad op and
# a conv2d before optimization, rule kernel_conv2d_pad_same folds them back into one kernel): the
# grouped conv kernel takes it on each of its paths (eqfuse.ir.kernels.uneven_pads_conv), a tap
# past the bottom or right edge reading the copies' zero border; a dense conv keeps the pad kernel.
# (name, x shape, w shape, attributes, the plan's decisions, the kernels)
UNEVEN = [
    ("u_pixels", (1, 4, 9, 40), (4, 1, 3, 3), "group=4", dict(channels=0), ["conv2d"]),
    # (Hugging Face's tiny MobileNetV2: the 16x16 -> 8x8 stride-2 block, bands of output rows)
    ("u_dw_s2", (1, 48, 16, 16), (48, 1, 3, 3), "stride=2, group=48", dict(channels=1, grouped=0), ["conv2d"]),
    ("u_dw5_prefetch", (1, 16, 11, 12), (16, 1, 5, 5), "stride=2, dilation=2, group=16",
     dict(channels=1, grouped=0, prefetch=1), ["conv2d"]),
    ("u_mult", (2, 4, 7, 6), (12, 1, 3, 3), "group=4", dict(channels=1, grouped=0), ["conv2d"]),
    ("u_lanes_cg2", (1, 8, 9, 10), (8, 2, 3, 3), "stride=2, group=4", dict(channels=1, grouped=0), ["conv2d"]),
    ("u_grouped", (1, 32, 9, 11), (32, 16, 3, 3), "group=2", dict(channels=1, grouped=1), ["conv2d"]),
    ("u_grouped_masked", (1, 48, 8, 9), (48, 24, 3, 3), "stride=2, group=2", dict(channels=1, grouped=1),
     ["conv2d"]),
    ("u_dense", (1, 4, 6, 6), (3, 4, 3, 3), "stride=2", {}, ["index", "conv2d"]),
]


def _uneven_graph(name, xs, ws, at, _decisions, _kernels) -> str:
    return (f"graph {name}(x: f32[{_dims(xs)}], w: f32[{_dims(ws)}], b: f32[{ws[0]}]) {{\n"
            f"    return relu(conv2d(x, w, b, padding=[0, 0, 1, 1], {at}))\n}}\n")


@pytest.fixture(scope="module")
def uneven():
    """The uneven-padding cases' graphs, each compiled when its test first runs (helpers.Compiled)."""
    return Compiled({c[0]: _uneven_graph(*c) for c in UNEVEN})


@pytest.mark.parametrize("case", UNEVEN, ids=[c[0] for c in UNEVEN])
def test_uneven_padding_folds_into_the_grouped_conv_on_each_path(uneven, case):
    name, _, _, _, decisions, kernels = case
    g = load(_uneven_graph(*case))[0]
    rng = np.random.default_rng(UNEVEN.index(case))
    args = [rng.standard_normal(t.shape).astype(np.float32) for _, t in g.params]
    args[1] /= np.float32(np.sqrt(np.prod(args[1].shape[1:])))  # (sums of about unit size)
    fn = getattr(uneven, name)
    np.testing.assert_allclose(fn(*args), evaluate(g, args)[0], rtol=RTOL, atol=ATOL)
    ks = [k for k in fn.last.kernels if k.kind != "view"]
    assert [k.kind for k in ks] == kernels
    conv = ks[-1].decisions
    assert {k: conv[k] for k in decisions} == decisions, conv
