"""The blocked channel layout across a graph (eqfuse.backend.kinds.contraction.conv): a ResNet stem, its
pooling and basic blocks (residual adds, a strided 1x1 downsample) kept in blocks of VL channels
from the first conv to the last, checked against the numpy reference on pinned machines (VL 16
and 8), with pooling in every combination of blocked and NCHW input and output."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import covering

import eqfuse
from eqfuse.backend.kinds.contraction.conv import ConvDirectDetail
from eqfuse.machine import pinned


def _rand(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


RESNET = """
graph r(x: f32[{N}, 3, {H}, {H}], w0: f32[{C}, 3, 7, 7], b0: f32[{C}],
        w1: f32[{C}, {C}, 3, 3], b1: f32[{C}], w2: f32[{C}, {C}, 3, 3], b2: f32[{C}],
        w3: f32[{D}, {C}, 3, 3], b3: f32[{D}], w4: f32[{D}, {D}, 3, 3], b4: f32[{D}],
        wd: f32[{D}, {C}, 1, 1], bd: f32[{D}]) -> f32[{N}, {D}, {Q}, {Q}] {{
  s = max_pool2d(relu(conv2d(x, w0, b0, stride=2, padding=3)), kernel_size=3, stride=2, padding=1)
  y = relu(conv2d(s, w1, b1, padding=1))
  z = relu(conv2d(y, w2, b2, padding=1) + s)
  u = relu(conv2d(z, w3, b3, stride=2, padding=1))
  return relu(conv2d(u, w4, b4, padding=1) + conv2d(z, wd, bd, stride=2))
}}
"""


def _resnet(N, C, D, H):
    P = (H - 1) // 2 // 2 + 1  # after the stem's conv /2 and pool /2 (H even)
    Q = (P - 1) // 2 + 1
    src = RESNET.format(N=N, C=C, D=D, H=H, Q=Q)
    xs = {"x": _rand(N, 3, H, H)}
    for i, (o, c, k) in enumerate([(C, 3, 7), (C, C, 3), (C, C, 3), (D, C, 3), (D, D, 3)]):
        xs[f"w{i}"] = _rand(o, c, k, k, seed=2 * i + 1, scale=(c * k * k) ** -0.5)
        xs[f"b{i}"] = _rand(o, seed=2 * i + 2, scale=0.1)
    xs["wd"], xs["bd"] = _rand(D, C, 1, 1, seed=20, scale=C ** -0.5), _rand(D, seed=21, scale=0.1)
    return src, xs


@pytest.mark.heavy
@pytest.mark.parametrize("model,C,D,bound", covering([("zen4", 32, 64), ("avx2", 16, 24)], [True, False]))
def test_a_resnet_stem_and_two_stages_stay_blocked_and_match_the_reference(model, C, D, bound):
    src, xs = _resnet(2, C, D, 30)
    ws = {k: v for k, v in xs.items() if k[0] == "w"}
    with pinned(model):
        mod = eqfuse.compile(src, params=ws if bound else None)
        args = {k: v for k, v in xs.items() if not (bound and k in ws)}
        want = eqfuse.reference(src)(**xs)
        for _ in range(2):
            np.testing.assert_allclose(mod(**args), want, rtol=1e-4, atol=1e-4)
    plans = [p for p in mod.functions["r"].last.plans if p.kind != "view"]
    convs = [p for p in plans if p.kind == "conv2d"]
    assert all(isinstance(p.detail, ConvDirectDetail) for p in convs)  # the 1x1 too: planned again
    (pool,) = [p for p in plans if p.kind == "index"]
    assert pool.detail.in_blocked and pool.detail.out_blocked
    assert not convs[0].detail.in_blocked and convs[0].detail.out_blocked  # the graph's input: NCHW
    last = [p for p in convs if p.node in mod.functions["r"].last.graph.outputs]
    assert len(last) == 1 and not last[0].detail.out_blocked  # the graph's output: NCHW
    # (24 channels, three of avx2's vectors of 8: blocked too; channels that do not fill the
    # vectors would not be: tested below)
    assert all(p.detail.in_blocked for p in convs[1:])
    assert sum(len(p.detail.blocked_args) for p in convs) == 2  # the two residual adds
    # bound weights are blocked once, the strided 1x1 downsample's too (planned again as a
    # direct conv after the GEMM planning had left it unpacked)
    assert [bool(p.prepack) for p in convs] == [bound] * len(convs)


@pytest.mark.heavy  # (the fast tier's time)
def test_channels_that_do_not_fill_the_vectors_stay_nchw():
    src, xs = _resnet(1, 16, 20, 22)  # 20 channels: 1.25 vectors of 16 lanes, 2.5 of 8 (16: whole ones)
    with pinned("zen4"):
        mod = eqfuse.compile(src)
        np.testing.assert_allclose(mod(**xs), eqfuse.reference(src)(**xs), rtol=1e-4, atol=1e-4)
    convs = [p for p in mod.functions["r"].last.plans if p.kind == "conv2d"]
    assert any(p.detail.O == 20 for p in convs) and any(p.detail.C == 20 for p in convs)
    assert any(p.detail.out_blocked for p in convs if p.detail.O == 16)  # (the 16 channels between: blocked)
    for p in convs:
        if p.detail.O == 20:
            assert not p.detail.out_blocked
        if p.detail.C == 20:
            assert not p.detail.in_blocked


POOL = """
graph p(x: f32[2, {C}, {H}, {H}], w: f32[{C}, {C}, 3, 3], v: f32[{C}, {C}, 3, 3]) -> f32[2, {C}, {O}, {O}] {{
  {body}
}}
"""


@pytest.mark.heavy  # (the fast tier's time)
@pytest.mark.parametrize("op,where,H,k,s,p", covering(
    [(op, where) for op in ("max_pool2d", "avg_pool2d", "avg_pool2d_pad") for where in ("between", "in", "out")],
    [(9, 3, 2, 1), (8, 2, 2, 0), (7, 3, 1, 1), (11, 3, 2, 1), (10, 5, 2, 2)]))
def test_pooling_in_blocks_matches_the_reference(op, where, H, k, s, p, monkeypatch):
    # between two convs (blocks in and out), after a conv as the graph's output (blocks in), on
    # the graph's input before a conv (NCHW); the channel-vector kernel (16 channels would
    # take the pixel-vector one, which writes NCHW). max_pool2d's taps outside the image read the
    # nearest inside one (conv._max_pool_taps): padding 2 of a 5 x 5 window, odd sizes.
    # A NaN of x reaches the pool through the conv too (a 3 x 3 patch of NaN in every channel).
    monkeypatch.setenv("EQFUSE_CONV_PIXELS", "0")
    C, O = 16, (H + 2 * p - k) // s + 1
    name, extra = ("avg_pool2d", f", count_include_pad={'true' if op.endswith('pad') else 'false'}") \
        if op.startswith("avg") else (op, "")
    pool = f"{name}({{}}, kernel_size={k}, stride={s}, padding={p}{extra})"
    body = {"between": f"return conv2d({pool.format('relu(conv2d(x, w, padding=1))')}, v, padding=1)",
            "in": f"return {pool.format('relu(conv2d(x, w, padding=1))')}",
            "out": f"return conv2d({pool.format('x')}, v, padding=1)"}[where]
    src = POOL.format(C=C, H=H, O=O, body=body)
    xs = {"x": _rand(2, C, H, H), "w": _rand(C, C, 3, 3, seed=1, scale=0.1), "v": _rand(C, C, 3, 3, seed=2, scale=0.1)}
    if name == "max_pool2d":
        xs["x"][0, 3, 1, 1] = np.nan  # a NaN in a window: max_pool2d keeps it
        xs["x"][1, 5, H - 1, H - 2] = np.nan  # (at the bottom edge)
    with pinned("zen4"):
        mod = eqfuse.compile(src)
        np.testing.assert_allclose(mod(**xs), eqfuse.reference(src)(**xs), rtol=1e-4, atol=1e-5)
    (pool_plan,) = [q for q in mod.functions["p"].last.plans if q.kind == "index"]
    d = pool_plan.detail
    # (on the graph's input, NCHW in and out: a pool writes blocks only from blocks, conv._writes_blocked)
    assert (d.in_blocked, d.out_blocked) == {"between": (True, True), "in": (True, False), "out": (False, False)}[where]


def test_a_residual_also_read_by_another_kind_of_kernel_stays_nchw():
    src = """
graph t(x: f32[1, 16, 6, 6], w1: f32[16, 16, 3, 3], w2: f32[16, 16, 3, 3]) -> (f32[1, 16, 6, 6], f32[1, 16]) {
  y = relu(conv2d(x, w1, padding=1))
  return relu(conv2d(y, w2, padding=1) + y), sum(y, axis=[2, 3])
}
"""
    xs = {"x": _rand(1, 16, 6, 6), "w1": _rand(16, 16, 3, 3, seed=1, scale=0.1), "w2": _rand(16, 16, 3, 3, seed=2, scale=0.1)}
    with pinned("zen4"):
        mod = eqfuse.compile(src)
        for got, want in zip(mod(**xs), eqfuse.reference(src)(**xs)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    for p in mod.functions["t"].last.plans:
        if p.kind == "conv2d":
            assert not p.detail.out_blocked and not p.detail.blocked_args


@pytest.mark.heavy
@pytest.mark.parametrize("in_place,H,s", covering(["1", "0"], [(12, 1), (13, 2), (5, 1), (3, 1)]))
def test_a_blocked_input_read_in_place_or_through_the_padded_copy_matches_the_reference(in_place, H, s, monkeypatch):
    # in place: the tiles whose window crosses the image's edges (all of them at 3 x 3, where the
    # window is wider than the image) copy it, zero padded; unbound weights (blocked in the call,
    # by one thread, before any tile reads them)
    monkeypatch.setenv("EQFUSE_CONV_INPLACE", in_place)
    monkeypatch.setenv("EQFUSE_CONV_PIXELS", "0")
    O = (H + 2 - 3) // s + 1
    src = f"""
graph t(x: f32[2, 16, {H}, {H}], w1: f32[32, 16, 3, 3], w2: f32[32, 32, 3, 3], w3: f32[32, 32, 1, 1]) -> f32[2, 32, {O}, {O}] {{
  y = relu(conv2d(x, w1, padding=1))
  return relu(conv2d(y, w2, stride={s}, padding=1) + conv2d(y, w3, stride={s}))
}}
"""
    xs = {"x": _rand(2, 16, H, H), "w1": _rand(32, 16, 3, 3, seed=1, scale=0.1),
          "w2": _rand(32, 32, 3, 3, seed=2, scale=0.1), "w3": _rand(32, 32, 1, 1, seed=3, scale=0.2)}
    with pinned("zen4"):
        mod = eqfuse.compile(src)
        want = eqfuse.reference(src)(**xs)
        for th in (1, 2):
            mod.default.threads = th
            for _ in range(3):
                np.testing.assert_allclose(mod(**xs), want, rtol=1e-4, atol=1e-4)
    readers = [p for p in mod.functions["t"].last.plans if p.kind == "conv2d" and p.detail.in_blocked]
    assert len(readers) == 2 and all(p.detail.in_place == (in_place == "1" and p.detail.rows) for p in readers)


@pytest.mark.heavy
def test_a_downsample_planned_again_as_a_direct_conv_blocks_its_bound_weights_once():
    """At one 58x58 image the strided 1x1 downsample's GEMM takes no prepacked weights; planned
    again as a direct conv between blocked tensors, its bound weights are blocked once like the
    other convs' (they were blocked again at every call)."""
    src, xs = _resnet(1, 32, 64, 58)
    ws = {k: v for k, v in xs.items() if k[0] == "w"}
    with pinned("zen4"):
        mod = eqfuse.compile(src, params=ws)
        got = mod(**{k: v for k, v in xs.items() if k not in ws})
    np.testing.assert_allclose(got, eqfuse.reference(src)(**xs), rtol=1e-4, atol=1e-4)
    convs = [p for p in mod.functions["r"].last.plans if p.kind == "conv2d"]
    assert len(convs) == 6 and all(isinstance(p.detail, ConvDirectDetail) and p.prepack for p in convs)
