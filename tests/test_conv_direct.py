"""The direct conv2d kernel (eqfuse.backend.kinds.contraction.conv, csrc_templates/conv_direct.c): every
variant against the numpy reference (strides, padding, 1x1 / 3x3 / 7x7 windows, channel counts
that are not a multiple of the block, one or two images, bound and unbound weights, bias,
batchnorm, relu and a residual add fused), both kinds of register tile, the planning rules on
pinned machines, and the pooling that follows a ResNet stem."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import covering

import eqfuse
from eqfuse.backend.kinds.contraction.conv import (
    ConvDirectDetail,
    choose_tile,
    one_d_pixels,
    register_tiles,
    use_direct,
)
from eqfuse.machine import MODELS, pinned


@pytest.fixture(autouse=True)
def _direct_kernel(monkeypatch):
    """The direct kernel's tests: Winograd off (its own in tests/test_contraction/conv.py)."""
    monkeypatch.setenv("EQFUSE_CONV_WINOGRAD", "0")


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _conv_src(N, C, H, O, k, s, p, bias=True, residual=True):
    OH = (H + 2 * p - k) // s + 1
    b = ", b" if bias else ""
    r = f", r: f32[{N}, {O}, {OH}, {OH}]" if residual else ""
    body = f"batchnorm(conv2d(x, w{b}, stride={s}, padding={p}), m, v, g, be, eps=0.00001)"
    return OH, f"""
graph c(x: f32[{N}, {C}, {H}, {H}], w: f32[{O}, {C}, {k}, {k}]{f', b: f32[{O}]' if bias else ''}, m: f32[{O}],
        v: f32[{O}], g: f32[{O}], be: f32[{O}]{r}) -> f32[{N}, {O}, {OH}, {OH}] {{
  return relu({body}{' + r' if residual else ''})
}}
"""


def _arrays(N, C, H, O, k, OH, bias=True, residual=True):
    xs = {"x": _rand(N, C, H, H), "w": _rand(O, C, k, k, seed=1) * 0.2, "m": _rand(O, seed=3),
          "v": np.abs(_rand(O, seed=4)) + 0.5, "g": _rand(O, seed=5), "be": _rand(O, seed=6)}
    if bias:
        xs["b"] = _rand(O, seed=2)
    if residual:
        xs["r"] = _rand(N, O, OH, OH, seed=7)
    return xs


def _check(N, C, H, O, k, s, p, bound, bias=True, residual=True):
    """Compile, compare two calls with the reference (a prepacked weight is packed at the first),
    return the conv's plan."""
    OH, src = _conv_src(N, C, H, O, k, s, p, bias, residual)
    xs = _arrays(N, C, H, O, k, OH, bias, residual)
    mod = eqfuse.compile(src, params={"w": xs["w"]} if bound else None)
    args = {n: a for n, a in xs.items() if not (bound and n == "w")}
    want = eqfuse.reference(src)(**xs)
    for _ in range(2):
        np.testing.assert_allclose(mod(**args), want, rtol=1e-4, atol=1e-4)
    (f,) = mod.functions.values()
    (conv,) = [q for q in f.last.plans if q.kind == "conv2d"]
    return conv


CASES = {  # (N, C, H, O, k, stride, padding)
    "3x3/1, 16 channels": (2, 16, 8, 16, 3, 1, 1),
    "3x3/2, 19 -> 37 channels (partial blocks), 3 images": (3, 19, 7, 37, 3, 2, 0),
    "3x3/2, 64 -> 128 at 4x4 (2x2 out)": (2, 64, 4, 128, 3, 2, 1),
    "3x3/1, 128 at 2x2, one image": (1, 128, 2, 128, 3, 1, 1),
    "7x7/2 stem, 3 -> 16 channels, padding 3": (2, 3, 20, 16, 7, 2, 3),
    "5x5/1, 5 -> 24 channels, padding 2": (1, 5, 9, 24, 5, 1, 2),
    "3x3/1 no padding, 40 -> 20": (2, 40, 6, 20, 3, 1, 0),
}


@pytest.mark.parametrize("case,bound", covering(list(CASES), [False, True],
                                               ids=lambda c: f"{c[0]}-{'bound-weights' if c[1] else 'weights'}"))
def test_direct_conv_with_bias_batchnorm_relu_and_residual_matches_the_reference(case, bound):
    conv = _check(*CASES[case], bound=bound)
    d = conv.detail
    assert isinstance(d, ConvDirectDetail)
    assert (d.prepack is not None) == bound  # weights bound by params= are blocked once
    assert (d.v, d.rw) in register_tiles(d.vl, d.rows)


@pytest.mark.parametrize("bias,residual", [(False, False), (True, False), (False, True)])
def test_direct_conv_without_bias_or_residual(bias, residual):
    conv = _check(2, 12, 6, 20, 3, 1, 1, bound=True, bias=bias, residual=residual)
    assert isinstance(conv.detail, ConvDirectDetail)


@pytest.mark.heavy  # (the fast tier's time)
@pytest.mark.parametrize("case", [(2, 24, 5, 40, 1, 1, 0), (1, 16, 9, 32, 1, 2, 0)], ids=["1x1/1", "1x1/2"])
def test_1x1_conv_is_im2col_unless_forced_and_both_match(case, monkeypatch):
    conv = _check(*case, bound=True)
    assert not isinstance(conv.detail, ConvDirectDetail)  # use_direct: a 1x1 window stays a GEMM
    monkeypatch.setenv("EQFUSE_CONV", "direct")
    conv = _check(*case, bound=True)
    assert isinstance(conv.detail, ConvDirectDetail)


@pytest.mark.parametrize("tile", ["3,2,1", "4,6,0", "1,12,1", "2,8,0", "4,6,1"])  # (the fast tier runs the first: the cheapest build)
def test_every_kind_of_register_tile_matches_the_reference(tile, monkeypatch):
    # row tiles whose last tile per row is short (7 columns), pixel tiles spanning rows and images
    monkeypatch.setenv("EQFUSE_CONV_TILE", tile)
    with pinned("zen4") as m:
        if m.simd_floats < 16:  # (the pinned model is clamped to the host: an AVX2 host cannot run them;
            # the AVX2 tiles are tested by the other cases, which pin "avx2")
            pytest.skip("AVX-512 register tiles on a host without AVX-512 (the AVX2 tiles: "
                        "test_pinned_machines_plan_and_run[avx2])")
        conv = _check(2, 20, 7, 70, 3, 1, 1, bound=False)
    v, rw, rows = (int(t) for t in tile.split(","))
    assert (conv.detail.v, conv.detail.rw, conv.detail.rows) == (v, rw, bool(rows))


@pytest.mark.parametrize("model", ["avx2", "zen4", "xeon-spr"])
def test_pinned_machines_plan_and_run(model):
    with pinned(model) as m:
        conv = _check(2, 24, 6, 40, 3, 2, 1, bound=True)
        d = conv.detail
        assert d.vl == m.simd_floats and d.cb == min(24, m.simd_floats)
        assert (d.v, d.rw, d.rows) == choose_tile(m, (2, 3, 3, 40, d.cb * 3, 2 * 3))


def test_tile_choices_on_pinned_machines_are_fixed():
    # (N, OH, OW, O, CB x KW, blocks x KH): ResNet shapes; the choice is a pure function of the model
    shapes = {"stem": (2, 32, 32, 16, 21, 7), "64 @ 56": (1, 56, 56, 64, 48, 12), "128 @ 2x2": (2, 2, 2, 128, 48, 24)}
    got = {(m, s): choose_tile(MODELS[m], shape) for m in ("avx2", "zen4", "xeon-spr") for s, shape in shapes.items()}
    assert got[("zen4", "stem")] == (1, 11, True)  # one 16-channel block, a long row of pixels
    assert got[("zen4", "128 @ 2x2")] == (2, 8, False)  # all 8 pixels of both images in one tile
    assert got[("zen4", "64 @ 56")][2]  # row tiles on a wide map
    for (m, _), (v, rw, rows) in got.items():
        regs = 32 if MODELS[m].simd_floats >= 16 else 16
        assert rw * v + v + 1 <= regs and (rows or rw <= 8)
    assert got == {(m, s): choose_tile(MODELS[m], shape) for m in ("avx2", "zen4", "xeon-spr")
                   for s, shape in shapes.items()}


def test_use_direct_rule_and_override(monkeypatch):
    monkeypatch.delenv("EQFUSE_CONV", raising=False)
    assert use_direct(3, 3, 1, 1) and use_direct(3, 3, 2, 2) and use_direct(7, 7, 2, 2) and use_direct(1, 3, 1, 1)
    assert not use_direct(1, 1, 1, 1) and not use_direct(1, 1, 2, 2)  # 1x1: im2col is (a part of) the input
    assert not use_direct(4, 4, 4, 4) and not use_direct(2, 2, 3, 3)  # patches that do not overlap
    monkeypatch.setenv("EQFUSE_CONV", "im2col")
    assert not use_direct(3, 3, 1, 1)
    monkeypatch.setenv("EQFUSE_CONV", "direct")
    assert use_direct(1, 1, 1, 1)


def test_a_bad_forced_tile_is_refused(monkeypatch):
    monkeypatch.setenv("EQFUSE_CONV_TILE", "4,9,0")  # 36 accumulators: not a register tile
    _, src = _conv_src(1, 8, 5, 16, 3, 1, 1)
    with pytest.raises(ValueError, match="not a register tile"):
        eqfuse.compile(src)


def test_resnet_stem_then_max_pool_matches_the_reference():
    src = """
graph s(x: f32[2, 3, 32, 32], w: f32[16, 3, 7, 7]) -> f32[2, 16, 8, 8] {
  return max_pool2d(relu(conv2d(x, w, stride=2, padding=3)), kernel_size=3, stride=2, padding=1)
}
"""
    xs = {"x": _rand(2, 3, 32, 32), "w": _rand(16, 3, 7, 7, seed=1)}
    mod = eqfuse.compile(src, params={"w": xs["w"]})
    np.testing.assert_allclose(mod(x=xs["x"]), eqfuse.reference(src)(**xs), rtol=1e-4, atol=1e-4)
    kinds = [q.detail for q in mod.functions["s"].last.plans if q.kind == "conv2d"]
    assert isinstance(kinds[0], ConvDirectDetail)


@pytest.mark.parametrize("op,H,k,s,p", covering(["max_pool2d", "avg_pool2d"], [
    (9, 3, 2, 1), (7, 3, 1, 1), (6, 2, 2, 1), (5, 5, 3, 2), (3, 3, 1, 1), (37, 3, 2, 1), (40, 2, 2, 0), (70, 5, 2, 2)]))
def test_pooling_interior_and_border_pixels_match_the_reference(op, H, k, s, p):
    # stride 2 with more than 16 output pixels a row: the AVX-512 max pool's full and partial
    # 16-pixel steps, and its masked loads at both borders
    OH = (H + 2 * p - k) // s + 1
    extra = ", count_include_pad=false" if op == "avg_pool2d" else ""
    src = (f"graph g(x: f32[2, 3, {H}, {H}]) -> f32[2, 3, {OH}, {OH}] "
           f"{{ return {op}(x, kernel_size={k}, stride={s}, padding={p}{extra}) }}")
    x = _rand(2, 3, H, H)
    x[0, 0, 1, 1] = np.nan  # max_pool2d propagates NaN
    x[1, 2, H - 1, H - 2] = np.nan  # (in the last step of a row)
    x[1, 1, H // 2] = -np.inf  # a row of -inf: a max of it is -inf, not a border's load
    mod = eqfuse.compile(src)
    np.testing.assert_allclose(mod(x=x), eqfuse.reference(src)(x=x), rtol=1e-6, atol=1e-6)
    if op == "max_pool2d" and s == 2:
        assert "eqf_pool_lanes" in mod.kernels[0].c_source


def test_bound_weights_are_blocked_once_by_the_runtime():
    _, src = _conv_src(1, 8, 5, 16, 3, 1, 1)
    xs = _arrays(1, 8, 5, 16, 3, 5)
    mod = eqfuse.compile(src, params={"w": xs["w"]})
    args = {n: a for n, a in xs.items() if n != "w"}
    mod(**args)
    c = mod.functions["c"].last
    (step,) = [s for s, q in enumerate(k for k in c.plans if k.kind != "view") if q.kind == "conv2d"]
    assert [s for s, _ in c.memory.prepacks] == [step]
    (blocks,) = [P for _, P in c.runner._packed.values()]
    d = c.plans[step].detail
    assert blocks.size == -(-16 // d.obw) * d.obw * -(-8 // d.cb) * d.cb * 9  # [NOB][NCB][KH][KW][CB][OBW]
    assert any("blocked once" in u.what for u in c.plans[step].uops)


CHAIN = """
graph t(x: f32[{N}, {C}, {H}, {H}], w1: f32[{M}, {C}, 3, 3], b1: f32[{M}], w2: f32[{O}, {M}, 3, 3],
        r: f32[{N}, {O}, {H}, {H}]) -> f32[{N}, {O}, {H}, {H}] {{
  y = relu(conv2d(x, w1, b1, padding=1))
  return relu(conv2d(y, w2, padding=1) + r){extra}
}}
"""


@pytest.mark.heavy  # (the fast tier's time)
@pytest.mark.parametrize("model", ["avx2", "zen4"])
@pytest.mark.parametrize("N,C,H,M,O", [(2, 16, 8, 32, 16), (1, 3, 9, 16, 24), (2, 20, 5, 48, 32)])
def test_the_blocked_layout_is_kept_between_two_direct_convs(model, N, C, H, M, O, monkeypatch):
    # y is read only by the second conv, as its input: stored and read in blocks of VL channels
    # (the channel-vector kernel's layout: the pixel-vector kernel, which few channels would
    # take, writes NCHW; test_a_pixel_vector_conv_keeps_nchw)
    monkeypatch.setenv("EQFUSE_CONV_PIXELS", "0")
    src = CHAIN.format(N=N, C=C, H=H, M=M, O=O, extra="")
    xs = {"x": _rand(N, C, H, H), "w1": _rand(M, C, 3, 3, seed=1) * 0.2, "b1": _rand(M, seed=2),
          "w2": _rand(O, M, 3, 3, seed=3) * 0.2, "r": _rand(N, O, H, H, seed=4)}
    with pinned(model):
        mod = eqfuse.compile(src, params={"w1": xs["w1"], "w2": xs["w2"]})
        args = {k: v for k, v in xs.items() if k not in ("w1", "w2")}
        for _ in range(2):
            np.testing.assert_allclose(mod(**args), eqfuse.reference(src)(**xs), rtol=1e-4, atol=1e-4)
    first, second = [p for p in mod.functions["t"].last.plans if p.kind == "conv2d"]
    assert (first.detail.in_blocked, first.detail.out_blocked) == (False, True)
    assert (second.detail.in_blocked, second.detail.out_blocked) == (True, False)
    assert any("blocks of" in u.what for u in first.uops) and any("in blocks already" in u.what for u in second.uops)


def test_a_result_read_by_another_kernel_or_returned_stays_nchw():
    # y is also a graph output (and read by a pointwise kernel): no blocked layout anywhere
    src = """
graph t(x: f32[1, 16, 6, 6], w1: f32[16, 16, 3, 3], w2: f32[16, 16, 3, 3]) -> (f32[1, 16, 6, 6], f32[1, 16, 6, 6]) {
  y = relu(conv2d(x, w1, padding=1))
  return conv2d(y, w2, padding=1), y
}
"""
    xs = {"x": _rand(1, 16, 6, 6), "w1": _rand(16, 16, 3, 3, seed=1), "w2": _rand(16, 16, 3, 3, seed=2)}
    mod = eqfuse.compile(src)
    for got, want in zip(mod(**xs), eqfuse.reference(src)(**xs)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    for p in mod.functions["t"].last.plans:
        if p.kind == "conv2d":
            assert not p.detail.in_blocked and not p.detail.out_blocked


PIXEL_CASES = {  # (N, C, H, O, k, stride, padding): at most one vector of output channels
    "stem 7x7/2, 3 -> 16": (2, 3, 20, 16, 7, 2, 3),
    "3x3/1, 16 at 16x16": (2, 16, 16, 16, 3, 1, 1),
    "5x5/3, 4 -> 5, 31x31": (1, 4, 31, 5, 5, 3, 1),
    "5x5/1, 6 -> 12, no padding": (1, 6, 21, 12, 5, 1, 0),
}


@pytest.mark.parametrize("bound", [False, True], ids=["weights", "bound-weights"])
@pytest.mark.parametrize("case", list(PIXEL_CASES))
def test_pixel_vector_kernel_matches_the_reference(case, bound):
    # few output channels and a wide map: the pixels go in the vector lanes (conv_pixels.c)
    with pinned("zen4") as m:
        if m.simd_floats < 16:  # (the pinned model is clamped to the host: an AVX2 host cannot run them;
            # the 8-lane kernel runs there in test_pixel_vector_kernel_on_pinned_machines[avx2])
            pytest.skip("16-lane tiles on a host without AVX-512 (the 8-lane kernel: "
                        "test_pixel_vector_kernel_on_pinned_machines[avx2])")
        conv = _check(*PIXEL_CASES[case], bound=bound)
    d = conv.detail
    assert d.pixels is not None and (d.prepack is not None) == bound
    assert "output pixels in the vector lanes" in conv_source(conv)


def conv_source(plan) -> str:
    from eqfuse.backend.kinds.contraction.conv import emit_conv_direct

    return emit_conv_direct(plan)


@pytest.mark.parametrize("model", ["avx2", "xeon-spr"])
def test_pixel_vector_kernel_on_pinned_machines(model):
    with pinned(model):
        conv = _check(2, 8, 12, 8, 3, 1, 1, bound=True)
    assert conv.detail.pixels is not None


@pytest.mark.heavy
def test_pixel_vectors_can_be_turned_off_and_wide_channels_never_use_them(monkeypatch):
    monkeypatch.setenv("EQFUSE_CONV_PIXELS", "0")
    assert _check(2, 16, 16, 16, 3, 1, 1, bound=True).detail.pixels is None
    monkeypatch.delenv("EQFUSE_CONV_PIXELS")
    assert _check(2, 16, 16, 64, 3, 1, 1, bound=True).detail.pixels is None  # 64 channels: 4 vectors
    assert _check(2, 16, 3, 16, 3, 1, 1, bound=True).detail.pixels is None  # 3 pixels a row: lanes idle


def test_a_long_conv1d_takes_pixels_in_the_lanes_while_its_window_fits_l1():
    # Whisper's encoder convs on the pinned model: conv1 (80 -> 384, 3000 frames) a 6 x 64 pixel
    # tile whose 21 KB window fits L1; conv2 (384 channels, stride 2: a 200 KB window) keeps
    # channels in the lanes, as do 2-D convs and rows shorter than 4 vectors
    m = MODELS["zen4"]
    assert one_d_pixels(m, 1, 80, 1, 1, 3, 1, 3000, 384, 1) == (6, 1, 4)
    assert one_d_pixels(m, 1, 384, 1, 1, 3, 1, 1500, 384, 2) is None
    assert one_d_pixels(m, 1, 80, 2, 1, 3, 2, 3000, 384, 1) is None
    assert one_d_pixels(m, 1, 80, 1, 1, 3, 1, 63, 384, 1) is None


CONV1D_PIXELS = {  # graph: (N, C, L, O, k, stride, padding); many output channels, long rows
    "s1": (2, 8, 150, 44, 3, 1, 1),  # a short last tile, channels not a whole tile, channel tiles outermost
    "s2": (1, 12, 201, 20, 5, 2, 2),  # two column phases, channel tiles innermost
}


@pytest.mark.heavy
def test_a_long_conv1d_with_pixels_in_the_lanes_matches_the_reference():
    # the 1-D path of conv_pixels.c (one_d_pixels; the weights in channel tiles, o_inner both ways),
    # the GELU in its epilogue, weights not bound (blocked at each call)
    with pinned("zen4") as m:
        if m.simd_floats < 16:  # (the pinned model is clamped to the host: an AVX2 host cannot run
            # 16-lane tiles; the pixel kernel's 8-lane form runs there in test_pixel_vector_kernel_on_pinned_machines)
            pytest.skip("16-lane tiles on a host without AVX-512 (the 8-lane pixel kernel is tested "
                        "by test_pixel_vector_kernel_on_pinned_machines)")
        src = ""
        for name, (N, C, L, O, k, s, p) in CONV1D_PIXELS.items():
            ol = (L + 2 * p - k) // s + 1
            src += (f"graph {name}(x: f32[{N}, {C}, {L}], w: f32[{O}, {C}, {k}], b: f32[{O}]) -> f32[{N}, {O}, {ol}] {{\n"
                    f"  return gelu(conv1d(x, w, b, stride={s}, padding={p}))\n}}\n")
        mod = eqfuse.compile(src)
    rng = np.random.default_rng(5)
    orders = set()
    for name, (N, C, L, O, k, s, p) in CONV1D_PIXELS.items():
        xs = {"x": rng.standard_normal((N, C, L)).astype(np.float32),
              "w": (rng.standard_normal((O, C, k)) / np.sqrt(C * k)).astype(np.float32),
              "b": rng.standard_normal(O).astype(np.float32)}
        fn = mod.functions[name]
        got = fn(**xs)
        (conv,) = [q for q in fn.last.plans if str(q.kind) == "conv2d"]
        assert conv.detail.algorithm == "pixels", name
        orders.add(conv.detail.o_inner)
        np.testing.assert_allclose(got, np.asarray(getattr(eqfuse.reference(src), name)(**xs)), rtol=1e-4, atol=1e-5)
    assert orders == {False, True}  # (both tile orders)


@pytest.mark.heavy  # (the fast tier's time)
def test_a_pixel_vector_conv_keeps_nchw():
    src = CHAIN.format(N=2, C=16, H=16, M=16, O=16, extra="")
    xs = {"x": _rand(2, 16, 16, 16), "w1": _rand(16, 16, 3, 3, seed=1) * 0.2, "b1": _rand(16, seed=2),
          "w2": _rand(16, 16, 3, 3, seed=3) * 0.2, "r": _rand(2, 16, 16, 16, seed=4)}
    mod = eqfuse.compile(src, params={"w1": xs["w1"], "w2": xs["w2"]})
    np.testing.assert_allclose(mod(**{k: xs[k] for k in ("x", "b1", "r")}), eqfuse.reference(src)(**xs),
                               rtol=1e-4, atol=1e-4)
    for p in mod.functions["t"].last.plans:
        if p.kind == "conv2d" and p.detail.pixels:
            assert not p.detail.in_blocked and not p.detail.out_blocked


@pytest.mark.parametrize("model,H,s", covering(["avx2", "zen4"], [(16, 1), (23, 1), (37, 2), (20, 1)]))
@pytest.mark.heavy
def test_an_nchw_output_stored_in_blocks_then_reordered_matches_the_reference(model, H, s, monkeypatch):
    # conv_direct.c's REORDER: the result in blocks, then transposed VL x VL into NCHW rows (a
    # row's last VL pixels overlapping the previous ones unless VL divides it); with an NCHW
    # residual (the graph's input) and with a residual in blocks (a conv's result), 2 images
    monkeypatch.setenv("EQFUSE_CONV_PIXELS", "0")
    from eqfuse.backend.kinds.contraction.conv import reorders

    with pinned(model) as m:
        conv = _check(2, 16, H, 32, 3, s, 1, bound=True)
        assert reorders(conv.detail) == (conv.detail.rows and conv.detail.OW >= m.simd_floats)
        O = (H + 2 - 3) // s + 1
        src = f"""
graph t(x: f32[2, 32, {H}, {H}], w1: f32[32, 32, 3, 3], w2: f32[32, 32, 3, 3], w3: f32[32, 32, 1, 1]) -> f32[2, 32, {O}, {O}] {{
  y = relu(conv2d(x, w1, padding=1))
  return relu(conv2d(y, w2, stride={s}, padding=1) + conv2d(y, w3, stride={s}))
}}
"""
        xs = {"x": _rand(2, 32, H, H), "w1": _rand(32, 32, 3, 3, seed=1) * 0.1,
              "w2": _rand(32, 32, 3, 3, seed=2) * 0.1, "w3": _rand(32, 32, 1, 1, seed=3) * 0.2}
        xs["x"][1, 4, 2, 3] = np.nan
        mod = eqfuse.compile(src)
        want = eqfuse.reference(src)(**xs)
        for th in (1, 2):
            mod.default.threads = th
            np.testing.assert_allclose(mod(**xs), want, rtol=1e-4, atol=1e-4)
    last = [q for q in mod.functions["t"].last.plans if q.kind == "conv2d" and not q.detail.out_blocked]
    assert last and all(q.detail.blocked_args for q in last if q.detail.in_blocked)


@pytest.mark.heavy
def test_a_conv1d_s_bound_weights_read_through_a_view_are_blocked_once():
    # a conv1d's weights [O][C][K] reach its conv2d as a view [O][C][1][K] of the bound input:
    # blocked once from the bound array itself (lower._bound_inputs), on both templates
    rng = np.random.default_rng(7)
    for algorithm, (C, L, O, s) in {"pixels": (8, 150, 44, 1), "channels": (32, 40, 64, 2)}.items():
        ol = (L + 2 - 3) // s + 1
        src = (f"graph c(x: f32[1, {C}, {L}], w: f32[{O}, {C}, 3], b: f32[{O}]) -> f32[1, {O}, {ol}] {{\n"
               f"  return gelu(conv1d(x, w, b, stride={s}, padding=1))\n}}\n")
        w = (rng.standard_normal((O, C, 3)) / np.sqrt(3 * C)).astype(np.float32)
        b = rng.standard_normal(O).astype(np.float32)
        fn = eqfuse.compile(src, params={"w": w, "b": b}).functions["c"]
        for seed in (0, 1):  # (the second call reads the blocks the first made)
            x = _rand(1, C, L, seed=seed)
            np.testing.assert_allclose(fn(x=x), np.asarray(eqfuse.reference(src).c(x=x, w=w, b=b)),
                                       rtol=1e-4, atol=1e-5)
        kernels = [q for q in fn.last.plans if q.kind != "view"]
        (step,) = [k for k, q in enumerate(kernels) if q.kind == "conv2d"]
        assert kernels[step].detail.algorithm == algorithm
        assert [k for k, _ in fn.last.memory.prepacks] == [step], algorithm
        assert any("blocked once" in u.what for u in kernels[step].uops), algorithm
