"""The parallel loops written once as eqf_region ranges (csrc_templates/common_pool.h: the direct
convs with channels and pixels in the lanes, Winograd, pooling in both layouts, pointwise
kernels, layernorm, rmsnorm and softmax rows) run in the mode
each call picks (eqfuse.runtime.load.call_threads): OpenMP's static split when every core is
free, the claim-based pool when another runtime's threads run in the process, the calling thread
alone when other processes hold the cores. The mode, and which thread ran a range, change no bit
of a result; each result is numpy's within the documented bound.

One f32 module holds a few-rows GEMM (the pool's panels), a reduction of rows (OpenMP), direct
convs (channels and pixels in the lanes), a max pool between convs (blocked), an average pool
(NCHW), a Winograd conv, a pointwise kernel (with sin's two passes) and layernorm and softmax
rows; one bf16 module a direct conv and a Winograd conv (their bf16
templates; under -m extended). Each is compiled once, at 2 threads, and called in every mode.
A third module has only eqf_region kernels (grouped convs with channels in the lanes, depthwise
and groups of a masked vector, and with pixels in the lanes; a small max pool on one thread): with no OpenMP kernel its call runs the loops on the
pool even when every core is free (load.call_threads' `openmp_kernels`)."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

import eqfuse
from eqfuse import machine
from eqfuse.runtime import load

SRC = """
graph g(a: f32[8, 512], w: f32[512, 1024], q: f32[64, 4096], x: f32[1, 8, 128, 128], k0: f32[32, 8, 3, 3],
        k1: f32[32, 32, 3, 3], k2: f32[4, 8, 3, 3], gm: f32[4096], bt: f32[4096]) -> (
    f32[8, 1024], f32[64], f32[1, 32, 32, 32], f32[1, 4, 128, 128], f32[1, 8, 127, 127], f32[64, 4096],
    f32[64, 4096], f32[64, 4096]) {
  p = max_pool2d(relu(conv2d(x, k0, stride=2, padding=1)), kernel_size=3, stride=2, padding=1)
  c = relu(conv2d(p, k1, padding=1))
  return relu(a @ w), sum(q * q, axis=[1]), c, conv2d(x, k2, padding=1), avg_pool2d(x, kernel_size=2, stride=1),
    sin(q) * 2.0 + 1.0, layernorm(q, gm, bt), softmax(q * 0.5)
}
"""

BF16 = """
graph h(x: f32[1, 32, 28, 28], k0: f32[32, 32, 3, 3], k1: f32[64, 32, 3, 3]) -> (f32[1, 32, 28, 28], f32[1, 64, 14, 14]) {
  return relu(conv2d(x, k0, padding=1)), conv2d(x, k1, stride=2, padding=1)
}
"""

GROUPED = """
graph gr(x: f32[1, 48, 40, 40], k0: f32[48, 1, 7, 7], k1: f32[48, 24, 3, 3], k2: f32[48, 1, 3, 3]) -> f32[1, 48, 20, 20] {
  d = relu(conv2d(x, k0, padding=3, group=48))
  e = conv2d(conv2d(d, k1, padding=1, group=2), k2, padding=1, group=48)
  return max_pool2d(e, kernel_size=2, stride=2)
}
"""

# the mode -> (free_cores: this process's other runtimes counted; free_cores_beside_peers: not)
MODES = {"openmp": (2, 2), "pool": (1, 2), "caller": (1, 1)}


def _mode(monkeypatch, mode: str) -> None:
    free, beside = MODES[mode]
    monkeypatch.setattr(load, "free_cores", lambda now=None, mine=None: free)
    monkeypatch.setattr(load, "free_cores_beside_peers", lambda now=None, mine=None: beside)
    monkeypatch.setattr(load, "team_running", lambda *a, **k: 0)  # (no OpenMP worker seen spinning)


def _inputs(shapes: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {n: (rng.standard_normal(s) / np.sqrt(np.prod(s[1:]) if len(s) == 4 else 1)).astype(np.float32)
            for n, s in shapes.items()}


@pytest.fixture(scope="module")
def f32():
    xs = _inputs({"a": (8, 512), "w": (512, 1024), "q": (64, 4096), "x": (1, 8, 128, 128), "k0": (32, 8, 3, 3),
                  "k1": (32, 32, 3, 3), "k2": (4, 8, 3, 3), "gm": (4096,), "bt": (4096,)}, 0)
    w = {"w": xs.pop("w") / 23}  # bound: the few-rows GEMM's prepacked path
    return eqfuse.compile(SRC, params=w, threads=2), xs, w


@pytest.fixture(scope="module")
def bf16():
    xs = _inputs({"x": (1, 32, 28, 28), "k0": (32, 32, 3, 3), "k1": (64, 32, 3, 3)}, 1)
    w = {k: xs.pop(k) for k in ("k0", "k1")}
    with machine.pinned(dataclasses.replace(machine.machine(), bf16_fallback_all=True)):  # (bf16 convs on any CPU)
        return eqfuse.compile(BF16, params=w, threads=2, precision="bf16"), xs, w


@pytest.fixture(scope="module")
def grouped():
    xs = _inputs({"x": (1, 48, 40, 40), "k0": (48, 1, 7, 7), "k1": (48, 24, 3, 3), "k2": (48, 1, 3, 3)}, 2)
    w = {k: xs.pop(k) for k in ("k0", "k1", "k2")}
    return eqfuse.compile(GROUPED, params=w, threads=2), xs, w


def _regions(mod) -> dict:
    return next(iter(mod.functions.values())).last.runner.last_threads()


def _region_kinds(mod, xs) -> tuple[set, set]:
    """{(precision, algorithm or op)} of the module's parallel eqf_region kernels, and those of them
    in blocks of channels."""
    mod(**xs)
    seen, blocked = set(), set()
    for p in next(iter(mod.functions.values())).last.plans:
        d = p.detail
        if getattr(d, "regions", False) and d.parallel is True:
            kind = getattr(d, "algorithm", None) or getattr(d, "op", None) or type(d).__name__
            seen.add((p.precision, kind))
            if getattr(d, "in_blocked", False) or getattr(d, "out_blocked", False):
                blocked.add(kind)
    return seen, blocked


def test_the_kernels_under_test_are_eqf_region_loops(f32):
    seen, blocked = _region_kinds(*f32[:2])
    assert {("f32", "channels"), ("f32", "pixels"), ("f32", "winograd"), ("f32", "max_pool2d"),
            ("f32", "avg_pool2d"), ("f32", "PointwiseDetail"), ("f32", "layernorm"), ("f32", "softmax")} <= seen, seen
    assert "max_pool2d" in blocked, blocked  # the pooling between convs, in blocks of channels


def test_every_mode_gives_the_same_bits_and_numpys_result(f32, monkeypatch):
    mod, xs, w = f32
    ref = [np.asarray(r) for r in eqfuse.reference(SRC)(**xs, **w)]
    want = None
    for mode in ("caller", "openmp", "pool"):
        _mode(monkeypatch, mode)
        for _ in range(5):  # on the pool the ranges go to either thread differently from call to call
            got = mod(**xs)
            t = _regions(mod)
            assert (t["regions"], t["region_threads"]) == {"openmp": ("openmp", 2), "pool": ("pool", 2),
                                                           "caller": ("caller", 1)}[mode]
            assert t["openmp"] == (2 if mode == "openmp" else 1) and t["pool"] == 2
            if want is None:
                want = got
                for g, r in zip(got, ref):  # f32 with sums of up to 4096 terms
                    np.testing.assert_allclose(g, r.reshape(g.shape), rtol=2e-4, atol=2e-3)
            for g, r in zip(got, want):
                assert np.array_equal(g, r), mode


@pytest.mark.extended
def test_bf16_convs_give_the_same_bits_in_every_mode(bf16, monkeypatch):
    # (their error bound against numpy: tests/test_bf16_conv.py, on the same templates)
    mod, xs, _ = bf16
    assert {("bf16", "channels"), ("bf16", "winograd")} <= _region_kinds(mod, xs)[0]
    # a graph with no OpenMP kernel takes the pool when the cores are free (docs/backend.md,
    # "Threads"): marked as having one, so that OpenMP's static split runs here too
    monkeypatch.setattr(next(iter(mod.functions.values())).last.runner, "_openmp", True)
    want = None
    for mode in ("caller", "openmp", "pool"):
        _mode(monkeypatch, mode)
        for _ in range(3):
            got = mod(**xs)
            assert _regions(mod)["regions"] == mode
            want = got if want is None else want
            for g, r in zip(got, want):
                assert np.array_equal(g, r), mode


def test_a_graph_of_region_loops_alone_runs_them_on_the_pool_in_every_mode_with_the_same_bits(grouped, monkeypatch):
    mod, xs, w = grouped
    seen, _ = _region_kinds(mod, xs)
    assert ("f32", "ConvGroupedDetail") in seen, seen
    plans = next(iter(mod.functions.values())).last.plans
    convs = [p.detail for p in plans if type(p.detail).__name__ == "ConvGroupedDetail"]
    # depthwise 7x7 and groups of 24 with channels in the lanes, depthwise 3x3 with pixels
    assert [(d.channels, d.grouped, d.parallel) for d in convs] == [(True, False, True), (True, True, True),
                                                                    (False, False, True)], convs
    runner = next(iter(mod.functions.values())).last.runner
    assert runner._openmp is False  # (no kernel opens an OpenMP region)
    ref = np.asarray(eqfuse.reference(GROUPED)(**xs, **w))
    want = None
    # every core free: the pool (the rule); forced to OpenMP's static split as a graph with OpenMP
    # kernels would run it; another runtime's threads: the pool; other processes: the caller
    for mode, openmp, expect in (("openmp", False, ("pool", 2)), ("openmp", True, ("openmp", 2)),
                                 ("pool", False, ("pool", 2)), ("caller", False, ("caller", 1))):
        _mode(monkeypatch, mode)
        monkeypatch.setattr(runner, "_openmp", openmp)
        for _ in range(5):
            got = np.asarray(mod(**xs))
            t = _regions(mod)
            assert (t["regions"], t["region_threads"]) == expect, (mode, openmp, t)
            if want is None:
                want = got
                np.testing.assert_allclose(got, ref.reshape(got.shape), rtol=2e-4, atol=2e-4)
            assert np.array_equal(got, want), (mode, openmp)


@pytest.mark.heavy
def test_a_conv_s_finer_tile_ranges_give_the_same_bits_in_every_mode(monkeypatch):
    # region_chunks: 256 equal ranges of the tiles' loop for convs of at least 2^27 multiply-adds
    # (Whisper's two; a small conv keeps 64), here forced on two small conv1d (both templates)
    from eqfuse.backend.kinds.contraction import conv

    assert conv.region_chunks(1500 * 384 * 384 * 3) == conv.region_chunks(3000 * 384 * 80 * 3) == 256
    assert conv.region_chunks(56 * 56 * 64 * 64 * 9) == 64
    monkeypatch.setattr(conv, "region_chunks", lambda macs: 256)
    # The first conv's pixels in the lanes, the second's channels: its input window of 256 channels
    # is past L1 at 8 lanes as at 16 (conv.one_d_pixels). (At 16 lanes the pixel conv's 1344 tiles
    # in ranges of 5 or 6, the other's 200 in ranges of 0 or 1; at 8 lanes 5375 and 800 tiles.)
    src = ("graph c(x: f32[1, 8, 2000], w: f32[256, 8, 3], v: f32[64, 256, 3]) -> f32[1, 64, 1000] {\n"
           "  return gelu(conv1d(gelu(conv1d(x, w, padding=1)), v, stride=2, padding=1))\n}\n")
    xs = _inputs({"x": (1, 8, 2000), "w": (256, 8, 3), "v": (64, 256, 3)}, 3)
    xs["w"], xs["v"] = xs["w"] / np.float32(np.sqrt(24)), xs["v"] / np.float32(np.sqrt(768))  # (outputs of order 1)
    mod = eqfuse.compile(src, threads=2)
    want = None
    for mode in ("caller", "pool", "openmp"):
        _mode(monkeypatch, mode)
        got = mod(**xs)
        assert _regions(mod)["regions"] == ("pool" if mode == "openmp" else mode)  # (a graph of region loops alone)
        plans = [p for p in next(iter(mod.functions.values())).last.plans if p.kind == "conv2d"]
        assert sorted(p.detail.algorithm for p in plans) == ["channels", "pixels"]
        assert {p.detail.region_chunks for p in plans} == {256}
        if want is None:
            want = got
            np.testing.assert_allclose(got, np.asarray(eqfuse.reference(src).c(**xs)), rtol=1e-4, atol=1e-5)
        assert np.array_equal(got, want), mode


# A few-rows GEMM (the pool's chunks) beside an OpenMP reduction, in a graph of its own (one
# library, so one pool, for this test alone)
TEAM = """
graph tm(a: f32[8, 384], w: f32[384, 768], q: f32[48, 1536]) -> (f32[8, 768], f32[48]) {
  return relu(a @ w), sum(q * q, axis=[1])
}
"""


def test_the_pool_kernels_of_a_graph_with_openmp_kernels_run_on_openmps_team_in_its_mode(monkeypatch):
    """In OpenMP's mode the few-rows GEMM's chunks run on OpenMP's team (common_pool.h,
    eqf_team_for), so the pool never starts a worker; beside another runtime's threads they run on
    the pool, which starts one. The bits are the same in every mode."""
    xs = _inputs({"a": (8, 384), "w": (384, 768), "q": (48, 1536)}, 3)
    w = {"w": xs.pop("w") / 20}
    mod = eqfuse.compile(TEAM, params=w, threads=2)
    fn = next(iter(mod.functions.values()))
    _mode(monkeypatch, "openmp")
    want = [np.asarray(o) for o in mod(**xs)]
    runner = fn.last.runner
    assert any(getattr(p.detail, "path", None) == "skinny" and p.detail.parallel for p in fn.last.plans)
    assert runner._openmp is True
    ref = eqfuse.reference(TEAM)(**xs, **w)
    for got, r in zip(want, ref):
        np.testing.assert_allclose(got, np.asarray(r), rtol=2e-4, atol=2e-4)
    for _ in range(5):
        assert all(np.array_equal(np.asarray(g), v) for g, v in zip(mod(**xs), want))
        assert (_regions(mod)["regions"], _regions(mod)["pool"]) == ("openmp", 2)
    assert runner._pool_of() == []  # (no chunk went to the pool)
    _mode(monkeypatch, "pool")
    for _ in range(5):
        assert all(np.array_equal(np.asarray(g), v) for g, v in zip(mod(**xs), want))
        assert _regions(mod)["regions"] == "pool"
    for _ in range(1000):  # (a worker writes its id when it starts: it may not have yet)
        if runner._pool_of():
            break
        time.sleep(0.002)
    assert len(runner._pool_of()) == 1
