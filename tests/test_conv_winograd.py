"""3x3 stride-1 convs by Winograd F(2x2, 3x3) (eqfuse.backend.kinds.contraction.conv,
csrc_templates/conv_winograd.c): every variant against the numpy reference (padding 0-2, odd and
non-square maps, one or two images, channel counts of one or several vectors, bound and unbound
weights, bias, relu and a residual add fused, NCHW or blocked input and output), its rounding
against the direct kernel's, both machines' vector widths, two threads, a scratch buffer that
cannot be allocated, and the rule that picks it."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from helpers import covering

import eqfuse
from eqfuse.backend.kinds.contraction.conv import (
    ConvDirectDetail,
    can_run,
    gemm_tile,
    tiles_per_block,
    use_winograd,
)
from eqfuse.machine import MODELS, pinned


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _src(N, C, H, W, O, p, bias=True, residual=True):
    OH, OW = H + 2 * p - 2, W + 2 * p - 2
    b = ", b: f32[{O}]".format(O=O) if bias else ""
    r = f", r: f32[{N}, {O}, {OH}, {OW}]" if residual else ""
    return OH, OW, f"""
graph c(x: f32[{N}, {C}, {H}, {W}], w: f32[{O}, {C}, 3, 3]{b}{r}) -> f32[{N}, {O}, {OH}, {OW}] {{
  return relu(conv2d(x, w{', b' if bias else ''}, padding={p}){' + r' if residual else ''})
}}
"""


def _arrays(N, C, H, W, O, OH, OW, bias=True, residual=True):
    xs = {"x": _rand(N, C, H, W), "w": _rand(O, C, 3, 3, seed=1) * 0.2}
    if bias:
        xs["b"] = _rand(O, seed=2)
    if residual:
        xs["r"] = _rand(N, O, OH, OW, seed=3)
    return xs


def _conv_plan(mod):
    (f,) = mod.functions.values()
    return [q for q in f.last.plans if q.kind == "conv2d"]


def _check(N, C, H, W, O, p, bound=True, bias=True, residual=True, threads=None):
    OH, OW, src = _src(N, C, H, W, O, p, bias, residual)
    xs = _arrays(N, C, H, W, O, OH, OW, bias, residual)
    mod = eqfuse.compile(src, params={"w": xs["w"]} if bound else None, threads=threads)
    args = {n: a for n, a in xs.items() if not (bound and n == "w")}
    want = eqfuse.reference(src)(**xs)
    for _ in range(2):  # (bound weights are transformed at the first call)
        np.testing.assert_allclose(mod(**args), want, rtol=1e-4, atol=1e-4)
    (conv,) = _conv_plan(mod)
    assert isinstance(conv.detail, ConvDirectDetail) and conv.detail.winograd, conv.detail
    assert (conv.detail.prepack is not None) == bound
    (c_source,) = [k.c_source for k in mod.kernels if k.kind == "conv2d"]
    return conv, c_source


CASES = {  # (N, C, H, W, O, padding)
    "16 channels, 8x8": (1, 16, 8, 8, 16, 1),
    "odd map 9x11, two images, 48 outputs": (2, 32, 9, 11, 48, 1),
    "no padding": (1, 16, 12, 10, 32, 0),
    "padding 2": (1, 16, 8, 9, 16, 2),
    "64 channels at 20x20": (1, 64, 20, 20, 64, 1),
}


@pytest.mark.heavy  # (the fast tier's time)
@pytest.mark.parametrize("name,bound", covering(list(CASES), [True, False]))
def test_winograd_conv_matches_the_reference(name, bound, monkeypatch):
    case = CASES[name]
    monkeypatch.setenv("EQFUSE_CONV_WINOGRAD", "1")
    _check(*case, bound=bound)


@pytest.mark.heavy  # (the fast tier's time)
@pytest.mark.parametrize("bias,residual", [(False, False), (True, False), (False, True)])
def test_winograd_conv_without_bias_or_residual(bias, residual, monkeypatch):
    monkeypatch.setenv("EQFUSE_CONV_WINOGRAD", "1")
    _check(1, 16, 9, 9, 32, 1, bias=bias, residual=residual)


@pytest.mark.heavy
def test_an_nchw_output_wide_enough_is_reordered_and_a_narrow_one_stored_pixel_by_pixel(monkeypatch):
    monkeypatch.setenv("EQFUSE_CONV_WINOGRAD", "1")
    for W, reorder in ((20, True), (5, False)):  # (OW 20 and 5: at least VL, or less, on either machine)
        _, c = _check(1, 16, 10, W, 16, 1)
        assert ("_reorder_row(const float" in c) == reorder  # (the function is there only when used)


def test_two_threads_match_one(monkeypatch):
    # the pool's threads claim blocks of tiles: the last block ends inside a register tile of rows
    # (two threads even with the other core busy: eqfuse.runtime.load would give one)
    from eqfuse.runtime import load
    monkeypatch.setattr(load, "free_cores", lambda now=None, mine=None: 2)
    monkeypatch.setattr(load, "free_cores_beside_peers", lambda now=None, mine=None: 2)
    monkeypatch.setenv("EQFUSE_CONV_WINOGRAD", "1")
    conv, _ = _check(2, 32, 15, 13, 32, 1, threads=2)
    assert conv.detail.parallel


CHAIN = """
graph t(x: f32[{N}, {C}, {H}, {H}], w1: f32[{M}, {C}, 3, 3], b1: f32[{M}], w2: f32[{M}, {M}, 3, 3],
        w3: f32[{M}, {M}, 3, 3]) -> f32[{N}, {M}, {H}, {H}] {{
  a = relu(conv2d(x, w1, b1, padding=1))
  h = relu(conv2d(a, w2, padding=1))
  return relu(conv2d(h, w3, padding=1) + a)
}}
"""


@pytest.mark.heavy  # (the fast tier's time)
@pytest.mark.parametrize("model", ["avx2", "zen4"])
def test_a_resnet_block_keeps_the_blocked_layout_between_winograd_convs(model):
    # a and h pass between convs in blocks of VL channels; a is also the last conv's residual,
    # read in blocks at the output element's offset (a ResNet's basic block)
    N, C, H, M = 2, 16, 12, 32
    src = CHAIN.format(N=N, C=C, H=H, M=M)
    xs = {"x": _rand(N, C, H, H), "w1": _rand(M, C, 3, 3, seed=1) * 0.2, "b1": _rand(M, seed=2),
          "w2": _rand(M, M, 3, 3, seed=3) * 0.2, "w3": _rand(M, M, 3, 3, seed=4) * 0.2}
    with pinned(model) as m:
        mod = eqfuse.compile(src, params={k: xs[k] for k in ("w1", "w2", "w3")})
        args = {"x": xs["x"], "b1": xs["b1"]}
        for _ in range(2):
            np.testing.assert_allclose(mod(**args), eqfuse.reference(src)(**xs), rtol=1e-4, atol=1e-4)
        first, second, third = _conv_plan(mod)
        assert all(c.detail.winograd and c.detail.vl == m.simd_floats for c in (first, second, third))
    assert (first.detail.in_blocked, first.detail.out_blocked) == (False, True)
    assert (second.detail.in_blocked, second.detail.out_blocked) == (True, True)
    assert (third.detail.in_blocked, third.detail.out_blocked, third.detail.blocked_args != ()) == (True, False, True)


@pytest.mark.heavy  # (the fast tier's time)
def test_rounding_is_close_to_the_direct_kernels(monkeypatch):
    # against float64, on inputs with a large common offset (the transforms' sums of +-d values
    # are where Winograd loses precision): at most a few times the direct kernel's error
    N, C, H, O = 1, 32, 12, 32
    x = (_rand(N, C, H, H) + 30.0).astype(np.float32)
    w = _rand(O, C, 3, 3, seed=1) * 0.1
    src = f"graph c(x: f32[{N}, {C}, {H}, {H}], w: f32[{O}, {C}, 3, 3]) -> f32[{N}, {O}, {H}, {H}] {{\n" \
          "  return conv2d(x, w, padding=1)\n}\n"
    from eqfuse.ir.ops import conv2d_numpy
    exact = conv2d_numpy([x.astype(np.float64), w.astype(np.float64)], {"stride": 1, "padding": 1})
    errs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("EQFUSE_CONV_WINOGRAD", flag)
        mod = eqfuse.compile(src, params={"w": w})
        (conv,) = _conv_plan(mod)
        assert bool(conv.detail.winograd) == (flag == "1")
        errs[flag] = np.abs(mod(x=x) - exact).max() / np.abs(exact).max()
    assert errs["1"] < max(8 * errs["0"], 1e-6), errs
    assert errs["1"] < 2e-6, errs


def test_a_scratch_buffer_that_cannot_be_allocated_is_a_memory_error(monkeypatch):
    # the input's blocked copy fits under the cap, a thread's transformed tiles (Vb, Mb) do not:
    # the failure inside the parallel region reaches the caller, and the next call computes
    monkeypatch.setenv("EQFUSE_CONV_WINOGRAD", "1")
    OH, OW, src = _src(1, 16, 8, 8, 16, 1, bias=False, residual=False)
    xs = _arrays(1, 16, 8, 8, 16, OH, OW, bias=False, residual=False)
    mod = eqfuse.compile(src, params={"w": xs["w"]})
    (conv,) = _conv_plan(mod)
    tb = conv.detail.winograd
    assert 16 * 8 * 8 * 4 < 64 << 10 < tb * (16 * 32 + 32) * 4  # (the copy and Vb + Mb, bytes)
    got = {}

    def run(key):
        try:
            got[key] = mod(x=xs["x"])
        except MemoryError as e:
            got[key] = e

    monkeypatch.setenv("EQFUSE_SCRATCH_LIMIT", str(64 << 10))
    t = threading.Thread(target=run, args=("capped",))  # (a fresh thread: fresh scratch buffers)
    t.start()
    t.join()
    assert isinstance(got["capped"], MemoryError) and "scratch buffer" in str(got["capped"])
    monkeypatch.delenv("EQFUSE_SCRATCH_LIMIT")
    t = threading.Thread(target=run, args=("free",))
    t.start()
    t.join()
    np.testing.assert_allclose(got["free"], eqfuse.reference(src)(**xs), rtol=1e-4, atol=1e-4)


def test_the_rule_takes_3x3_stride_1_convs_of_whole_vectors_on_maps_from_8x8(monkeypatch):
    monkeypatch.delenv("EQFUSE_CONV_WINOGRAD", raising=False)
    tile = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), cb=16, vl=16, v=2, rw=8, rows=True, parallel=True)
    d = ConvDirectDetail(N=1, C=64, H=56, W=56, O=64, KH=3, KW=3, OH=56, OW=56, **tile)
    assert can_run(d, 16) and use_winograd(d, 16)
    small = ConvDirectDetail(N=1, C=512, H=7, W=7, O=512, KH=3, KW=3, OH=7, OW=7, **tile)
    assert can_run(small, 16) and not use_winograd(small, 16)  # (16 MB of weights for 16 tiles)
    for other in (dict(stride=(2, 2)), dict(KH=5, KW=5), dict(C=24), dict(O=20)):
        from dataclasses import replace
        assert not use_winograd(replace(d, **other), 16), other
    monkeypatch.setenv("EQFUSE_CONV_WINOGRAD", "1")
    assert use_winograd(small, 16)
    monkeypatch.setenv("EQFUSE_CONV_WINOGRAD", "0")
    assert not use_winograd(d, 16)


@pytest.mark.parametrize("model", ["avx2", "zen4", "xeon-spr"])
def test_gemm_tiles_fit_the_registers_and_blocks_fit_half_of_l2(model):
    m = MODELS[model]
    regs = 32 if m.simd_floats >= 16 else 16
    for C, O in ((16, 16), (64, 64), (128, 128), (256, 256), (32, 48)):
        v, rw = gemm_tile(m, C, O)
        assert rw * v + v + 1 <= regs and O % (v * m.simd_floats) == 0
        tb = tiles_per_block(m, C, O, rw)
        assert tb % rw == 0 and (tb * (16 * (C + O) + 32) * 4 <= m.l2 // 2 or tb == rw)
