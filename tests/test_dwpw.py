"""The inverted residual as one kernel (rule fuse_dw_pw, eqfuse.ir.kernels.ConvPrologue,
backend/kinds/contraction/conv_dwpw.py): a depthwise conv + its bias and ReLU6, then the 1x1 conv
reading it + its bias (+ the residual add), compiled from .g and checked against the numpy
reference at the project's tolerances (rtol 1e-4, atol 1e-5). The cases take each path of the
kernel: the band's pixels in the lanes with the depthwise sums as one run of vectors (flat) or
pixel by pixel, channels in the lanes (olanes: a small image), strides 1 and 2, a dilation,
channel counts that are not a multiple of the vector width, with and without biases and the
residual add, and the 1x1 conv's weights transposed once when bound (params=). The whole block
(rule fuse_pw_dw, ConvPrologue.ex): the expand 1x1 conv + its bias and ReLU6 before the depthwise
conv, on each path, with a parallel band of two output rows recomputing the expand conv of its
halo rows. TF's "same" padding of a stride-2 depthwise conv ((0, 1) on each axis: a pad op, or
padding [0, 0, 1, 1] on the conv) folds into the fused kernel (rules kernel_conv2d_pad_same*,
fuse_pw_pad_dw_clip), and into a grouped conv kernel of its own (tests/test_conv_groups.py); a
dense conv keeps its pad kernel."""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import Compiled

import eqfuse
from eqfuse.frontend.load import load
from eqfuse.ir.reference import evaluate

RTOL, ATOL = 1e-4, 1e-5

# (name, N, C, H, O, K, stride, padding, dilation, biases, residual, the path the plan takes)
# Each case takes its path at 16 lanes (AVX-512) and at 8 (AVX2): pixels_nobias's band of padded
# rows is under two vectors of 8 (conv_dwpw.uses_flat), and the 1x1 conv's O of the other cases
# costs less with the pixels in the lanes at either width (conv_dwpw.olanes_cheaper)
CASES = [
    ("flat_res", 2, 13, 11, 11, 3, 1, 1, 1, True, True, dict(flat=1, olanes=0)),
    ("flat_s2", 1, 19, 13, 4, 3, 2, 1, 1, True, False, dict(flat=1, olanes=0)),
    ("olanes_res", 2, 37, 2, 37, 3, 1, 1, 1, True, True, dict(flat=0, olanes=1)),
    ("olanes_s2", 2, 21, 4, 40, 3, 2, 1, 1, True, False, dict(flat=0, olanes=1)),
    ("pixels_nobias", 1, 5, 3, 3, 3, 1, 1, 1, False, False, dict(flat=0, olanes=0)),
    ("flat_dil_5x5", 1, 7, 9, 3, 5, 1, 4, 2, True, False, dict(flat=1, olanes=0)),
]


def _out(h, k, s, p, d) -> int:
    return (h + 2 * p - d * (k - 1) - 1) // s + 1


def _graph(name, n, c, h, o, k, s, p, d, biases, residual, _path) -> str:
    oh = _out(h, k, s, p, d)
    ps = [f"x: f32[{n}, {c}, {h}, {h}]", f"wd: f32[{c}, 1, {k}, {k}]", f"wp: f32[{o}, {c}, 1, 1]"]
    ps += [f"bd: f32[{c}]", f"bp: f32[{o}]"] if biases else []
    ps += [f"r: f32[{n}, {o}, {oh}, {oh}]"] if residual else []
    bd, bp = (", bd", ", bp") if biases else ("", "")
    dw = f"clip(conv2d(x, wd{bd}, stride={s}, padding={p}, dilation={d}, group={c}), min=0.0, max=6.0)"
    body = f"conv2d({dw}, wp{bp})"
    return f"graph {name}({', '.join(ps)}) {{\n    return {'r + ' if residual else ''}{body}\n}}\n"


def _arrays(case) -> list[np.ndarray]:
    g = load(_graph(*case))[0]
    rng = np.random.default_rng(CASES.index(case))
    out = []
    for name, t in g.params:
        a = rng.standard_normal(t.shape).astype(np.float32)
        if name in ("wd", "wp"):  # (sums of about unit size)
            a /= np.float32(np.sqrt(np.prod(t.shape[1:])))
        out.append(a)
    return out


PADS = """
graph pads(a: f32[5], b: f32[3, 4], c: f32[2, 3, 5, 6], d: f32[7, 8], e: f32[2, 3, 5, 16], x: f32[2, 8, 6, 6],
           w: f32[8, 1, 3, 3], bw: f32[8]) {
    pa = pad(a, pads=[2, 3], value=1.5)
    pb = pad(b, pads=[1, 0, 0, 2], value=-7)
    pc = pad(c, pads=[0, 1, 0, 2, 1, 0, 3, 1])
    pd = pad(d, pads=[1, 0, 1, 0])
    pe = pad(e, pads=[1, 0, 2, 0, 0, 1, 1, 0], value=0.5)
    cv = conv2d(pad(x, pads=[0, 0, 1, 1, 0, 0, 1, 1]), w, group=8) + reshape(bw, shape=[8, 1, 1])
    return pa, pb, pc, pd, pe, cv
}
"""

# TF's "same" padding before a stride-2 conv, (0, 1) on each axis (Hugging Face's MobileNetV2)
SAME = """
graph same(x: f32[2, 13, 8, 8], wd: f32[13, 1, 3, 3], bd: f32[13], wp: f32[9, 13, 1, 1], bp: f32[9]) {
    d = clip(conv2d(pad(x, pads=[0, 0, 0, 0, 0, 0, 1, 1]), wd, bd, stride=2, group=13), min=0.0, max=6.0)
    return conv2d(d, wp, bp)
}
graph same_block(x: f32[1, 6, 8, 8], we: f32[21, 6, 1, 1], be: f32[21], wd: f32[21, 1, 3, 3], bd: f32[21],
                 wp: f32[7, 21, 1, 1], bp: f32[7]) {
    e = clip(conv2d(x, we, be), min=0.0, max=6.0)
    d = clip(conv2d(pad(e, pads=[0, 0, 0, 0, 0, 0, 1, 1]), wd, bd, stride=2, group=21), min=0.0, max=6.0)
    return conv2d(d, wp, bp)
}
graph same_written(x: f32[1, 5, 7, 6], wd: f32[5, 1, 3, 3], wp: f32[4, 5, 1, 1]) {
    return conv2d(conv2d(x, wd, stride=2, padding=[0, 0, 1, 1], group=5), wp)
}
graph same_dense(x: f32[1, 4, 6, 6], w: f32[3, 4, 3, 3]) {
    return conv2d(x, w, stride=2, padding=[0, 0, 1, 1])
}
"""
# graph -> its kernels: the fused kernel (the whole block with its expand conv); a dense conv
# (not depthwise) keeps its pad kernel
SAME_SRC = {m.group(1): m.group(0) for m in re.finditer(r"graph (\w+)\(.*?\n}\n", SAME, re.S)}
SAME_KERNELS = {"same": ["conv2d"], "same_block": ["conv2d"], "same_written": ["conv2d"],
                "same_dense": ["index", "conv2d"]}

BIG = ("big", 1, 48, 8, 8, 3, 1, 1, 1, True, False, {})

# the whole inverted residual: (name, N, CI, C, H, O, stride, residual, the path the plan takes).
# The depthwise conv is 3x3 with padding 1, every conv has its bias, ReLU6 after the expand and
# the depthwise convs; CI, C and O are not multiples of the vector width. Below a vector of
# output pixels (2 x 2) the expand conv stays a kernel of its own (ir.kernels.DW_EXPAND_L1_SHARE)
# Each path is the same at 16 lanes and at 8: ex_pixels_res's 4 x 4 input is a vector of 16 pixels
# (its expand conv fuses), and at stride 2 its band of padded rows is under two vectors of 8
BLOCKS = [
    ("ex_flat_res", 2, 5, 13, 8, 5, 1, True, dict(expand=1, flat=1, olanes=0)),
    ("ex_flat_s2", 1, 6, 19, 9, 9, 2, False, dict(expand=1, flat=1, olanes=0)),
    ("ex_pixels_res", 2, 4, 37, 4, 3, 2, True, dict(expand=1, flat=0, olanes=0)),
    ("ex_band_s2", 1, 24, 32, 16, 24, 2, False, dict(expand=1, flat=1, band=2, parallel=1)),
    ("ex_small_res", 2, 7, 21, 2, 7, 1, True, dict(expand=0, flat=0, olanes=1)),
    ("ex_l1_res", 1, 8, 48, 8, 8, 1, True, dict(expand=1, flat=1, olanes=0)),  # (12 KB: > L1 / 4, whole)
]
BIG_BLOCK = ("ex_big", 1, 24, 144, 8, 24, 1, True, {})  # (36 KB: > L1, three kernels)


def _block(name, n, ci, c, h, o, s, residual, _path) -> str:
    oh = _out(h, 3, s, 1, 1)
    ps = [f"x: f32[{n}, {ci}, {h}, {h}]", f"we: f32[{c}, {ci}, 1, 1]", f"be: f32[{c}]", f"wd: f32[{c}, 1, 3, 3]",
          f"bd: f32[{c}]", f"wp: f32[{o}, {c}, 1, 1]", f"bp: f32[{o}]"]
    ps += [f"r: f32[{n}, {o}, {oh}, {oh}]"] if residual else []
    e = "clip(conv2d(x, we, be), min=0.0, max=6.0)"
    d = f"clip(conv2d({e}, wd, bd, stride={s}, padding=1, group={c}), min=0.0, max=6.0)"
    return f"graph {name}({', '.join(ps)}) {{\n    return {'r + ' if residual else ''}conv2d({d}, wp, bp)\n}}\n"


@pytest.fixture(scope="module")
def compiled():
    """The cases, the large ones, the pads and the same paddings: each graph compiled when its
    test first runs (helpers.Compiled)."""
    return Compiled({c[0]: _graph(*c) for c in CASES + [BIG]} | {b[0]: _block(*b) for b in BLOCKS + [BIG_BLOCK]}
                    | {"pads": PADS} | SAME_SRC)


@pytest.mark.heavy  # (the fast tier's time)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fused_inverted_residual_matches_the_reference(compiled, case):
    g = load(_graph(*case))[0]
    args = _arrays(case)
    want = evaluate(g, args)[0]
    fn = getattr(compiled, case[0])
    got = fn(*args)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    (k,) = fn.last.kernels  # one kernel, on the path the case is for
    assert k.kind == "conv2d" and {f: k.decisions[f] for f in case[-1]} == case[-1], k.decisions


@pytest.mark.heavy  # (the fast tier's time)
@pytest.mark.parametrize("case", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_whole_inverted_residual_matches_the_reference(compiled, case):
    g = load(_block(*case))[0]
    rng = np.random.default_rng(BLOCKS.index(case) + 20)
    args = []
    for name, t in g.params:
        a = rng.standard_normal(t.shape).astype(np.float32)
        if name in ("we", "wd", "wp"):  # (sums of about unit size)
            a /= np.float32(np.sqrt(np.prod(t.shape[1:])))
        args.append(a)
    fn = getattr(compiled, case[0])
    np.testing.assert_allclose(fn(*args), evaluate(g, args)[0], rtol=RTOL, atol=ATOL)
    ks = fn.last.kernels  # the whole block one kernel (else the expand conv, then the rest), on the case's path
    assert [k.kind for k in ks] == ["conv2d"] * (2 - case[-1]["expand"])
    assert {f: ks[-1].decisions[f] for f in case[-1]} == case[-1], ks[-1].decisions


@pytest.mark.heavy  # (the fast tier's time)
def test_an_expanded_tensor_larger_than_l1_stays_three_kernels(compiled):
    """Above L1 / DW_EXPAND_L1_SHARE per image (144 channels at 8 x 8) the expand conv, the
    depthwise conv and the 1x1 conv are three kernels (the depthwise output is above L1 / 4 too),
    with the same result."""
    g = load(_block(*BIG_BLOCK))[0]
    rng = np.random.default_rng(11)
    args = [rng.standard_normal(t.shape).astype(np.float32) / 8 for _, t in g.params]
    np.testing.assert_allclose(compiled.ex_big(*args), evaluate(g, args)[0], rtol=RTOL, atol=ATOL)
    assert [k.kind for k in compiled.ex_big.last.kernels] == ["conv2d"] * 3


def test_bound_weights_are_transposed_once_and_match():
    case = CASES[2]
    g = load(_graph(*case))[0]
    args = _arrays(case)
    names = [n for n, _ in g.params]
    params = {n: a for n, a in zip(names, args) if n not in ("x", "r")}
    mod = eqfuse.compile(_graph(*case), params=params)
    (k,) = mod.kernels
    assert k.decisions["olanes"] == 1 and k.decisions["prepacked_b"] == 1
    got = mod(args[names.index("x")], args[names.index("r")])
    np.testing.assert_allclose(got, evaluate(g, args)[0], rtol=RTOL, atol=ATOL)


@pytest.mark.heavy  # (the fast tier's time)
def test_a_large_depthwise_output_stays_two_kernels(compiled):
    """Above L1 / DW_FUSE_L1_SHARE per image (here 48 channels at 8 x 8) the separate depthwise
    and 1x1 kernels are faster: extraction keeps them apart, and the result is the same."""
    g = load(_graph(*BIG))[0]
    rng = np.random.default_rng(9)
    args = [rng.standard_normal(t.shape).astype(np.float32) / 8 for _, t in g.params]
    np.testing.assert_allclose(compiled.big(*args), evaluate(g, args)[0], rtol=RTOL, atol=ATOL)
    assert [k.kind for k in compiled.big.last.kernels] == ["conv2d", "conv2d"]


@pytest.mark.heavy  # (the fast tier's time)
def test_pad_rows_and_a_pad_folded_into_the_conv_match_the_reference(compiled):
    """The pad kernel (a row at a time: the value, the input's row, the value) over ranks 1, 2 and
    4 with pads on every side, and on the outer axes alone (rows copied whole: gcc 12 at -O3 once
    vectorized such a kernel wrongly, see kinds/index.py's _pad); a zero pad of 1 on every side of
    a conv2d's image is its padding (rule conv2d_pad_1_nobias: no pad kernel)."""
    g = load(PADS)[0]
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(t.shape).astype(np.float32) for _, t in g.params]
    for got, want in zip(compiled.pads(*args), evaluate(g, args)):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    kinds = sorted(k.kind for k in compiled.pads.last.kernels if k.kind != "view")
    assert kinds == ["conv2d"] + ["index"] * 5, kinds  # (five pads; the sixth is the conv's padding)


@pytest.mark.heavy  # (the fast tier's time)
@pytest.mark.parametrize("name", list(SAME_KERNELS))
def test_tf_same_padding_folds_into_the_fused_depthwise_kernel(compiled, name):
    """A (0, 1) zero pad before a stride-2 depthwise conv (or the conv's padding [0, 0, 1, 1]) is
    the fused kernel's padding: no pad kernel, one kernel for the depthwise and 1x1 convs (and
    the expand conv before them); before a dense conv the pad stays a kernel. Against the numpy
    reference, which pads the input explicitly."""
    g = next(x for x in load(SAME) if x.name == name)
    rng = np.random.default_rng(sorted(SAME_KERNELS).index(name) + 30)
    args = []
    for pname, t in g.params:
        a = rng.standard_normal(t.shape).astype(np.float32)
        if pname != "x":  # (sums of about unit size)
            a /= np.float32(np.sqrt(np.prod(t.shape[1:]) if len(t.shape) > 1 else 4))
        args.append(a)
    fn = getattr(compiled, name)
    np.testing.assert_allclose(fn(*args), evaluate(g, args)[0], rtol=RTOL, atol=ATOL)
    assert [k.kind for k in fn.last.kernels if k.kind != "view"] == SAME_KERNELS[name]


def test_an_uneven_conv_padding_is_the_explicit_pad():
    """The reference of conv2d padding [top, left, bottom, right]: the conv of the input padded
    so, without padding."""
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((1, 2, 5, 4)).astype(np.float32), rng.standard_normal((3, 2, 3, 2)).astype(np.float32)
    from eqfuse.ir.ops import conv2d_numpy
    got = conv2d_numpy([x, w], {"stride": (2, 1), "padding": (2, 0, 1, 3)})
    want = conv2d_numpy([np.pad(x, ((0, 0), (0, 0), (2, 1), (0, 3))), w], {"stride": (2, 1), "padding": 0})
    assert got.shape == (1, 3, 3, 6)
    np.testing.assert_array_equal(got, want)


def test_an_onnx_zero_pad_before_a_conv_joins_its_padding_when_the_sum_is_symmetric(tmp_path):
    """ONNX Pad (1 on every side of the image) + depthwise Conv with a bias: one conv2d of
    padding 1, no pad kernel; the (0, 1) Pad before a stride-2 Conv folds into the grouped conv
    kernel (padding [0, 0, 1, 1]). Both against onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    w = (rng.standard_normal((4, 1, 3, 3)) / 3).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "p1"),
             numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "p2")]
    nodes = [helper.make_node("Pad", ["x", "p1"], ["xp1"]),
             helper.make_node("Conv", ["xp1", "w", "b"], ["y1"], group=4),
             helper.make_node("Pad", ["x", "p2"], ["xp2"]),
             helper.make_node("Conv", ["xp2", "w", "b"], ["y2"], group=4, strides=[2, 2])]
    g = helper.make_graph(nodes, "padconv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                          [helper.make_tensor_value_info("y1", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)], inits)
    path = tmp_path / "padconv.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    mod = eqfuse.compile(str(path))
    for got, ref in zip(mod(x), want):
        np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL)
    lines = [line for line in mod.report["graph"].splitlines() if "kernel {" in line]
    assert not any("pad(" in line for line in lines), lines
    assert any("padding=1" in line for line in lines) and any("padding=[0, 0, 1, 1]" in line for line in lines), lines


def test_a_stride_2_conv_of_narrow_rows_matches_the_reference():
    """A 7x7 stride-2 depthwise conv of 9-pixel rows, the top rows of its band in the padding
    (flat path, at 16 lanes and at 8: 4 output channels, whose 1x1 conv keeps the pixels in the
    lanes): the padded rows' copy once compiled wrongly there (conv_dwpw.c)."""
    src = ("graph s2(x: f32[1, 12, 20, 9], wd: f32[12, 1, 7, 7], bd: f32[12], wp: f32[4, 12, 1, 1], bp: f32[4]) {\n"
           "    return conv2d(clip(conv2d(x, wd, bd, stride=2, padding=3, group=12), min=0.0, max=6.0), wp, bp)\n}\n")
    g = load(src)[0]
    rng = np.random.default_rng(13)
    args = [rng.standard_normal(t.shape).astype(np.float32) for _, t in g.params]
    mod = eqfuse.compile(src)
    np.testing.assert_allclose(mod(*args), evaluate(g, args)[0], rtol=RTOL, atol=ATOL)
    (k,) = mod.kernels
    assert k.kind == "conv2d" and k.decisions["flat"] == 1 and k.decisions["olanes"] == 0, k.decisions
