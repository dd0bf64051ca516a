"""Parallel loops on the claim-based pool (csrc_templates/common_pool.h, eqf_region): which
thread runs a chunk, and whether a worker ran any, changes no bit of a result. One module holds
a few-rows GEMM (the pool's panels), a reduction of rows, direct convs (channels and
pixels in the lanes), a max pool and a Winograd conv (the pool's ranges); its 2-thread calls must equal its 1-thread call exactly."""

from __future__ import annotations

import numpy as np
import pytest

import eqfuse
from eqfuse.runtime import load

SRC = """
graph g(a: f32[8, 512], w: f32[512, 1024], q: f32[64, 4096], x: f32[1, 8, 128, 128], k0: f32[32, 8, 3, 3],
        k1: f32[32, 32, 3, 3], k2: f32[4, 8, 3, 3]) -> (f32[8, 1024], f32[64], f32[1, 32, 32, 32],
                                                    f32[1, 4, 128, 128]) {
  p = max_pool2d(relu(conv2d(x, k0, stride=2, padding=1)), kernel_size=3, stride=2, padding=1)
  return relu(a @ w), sum(q * q, axis=[1]), relu(conv2d(p, k1, padding=1)), conv2d(x, k2, padding=1)
}
"""


def _two_cores(monkeypatch):
    # two threads whatever else runs on the machine (eqfuse.runtime.load would give one beside a busy process)
    monkeypatch.setattr(load, "free_cores", lambda now=None, mine=None: 2)
    monkeypatch.setattr(load, "free_cores_beside_peers", lambda now=None, mine=None: 2)


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(0)
    xs = {"a": rng.standard_normal((8, 512)), "w": rng.standard_normal((512, 1024)) / 23,
          "q": rng.standard_normal((64, 4096)), "x": rng.standard_normal((1, 8, 128, 128)),
          "k0": rng.standard_normal((32, 8, 3, 3)) / 9, "k2": rng.standard_normal((4, 8, 3, 3)) / 9,
          "k1": rng.standard_normal((32, 32, 3, 3)) / 17}
    xs = {n: v.astype(np.float32) for n, v in xs.items()}
    w = {"w": xs.pop("w")}  # bound: the few-rows GEMM's prepacked path
    return eqfuse.compile(SRC, params=w, threads=1), eqfuse.compile(SRC, params=w, threads=2), xs, w


def test_the_kernels_under_test_run_on_the_pool(case):
    _, two, xs, _ = case
    two(**xs)
    plans = two.functions["g"].last.plans
    kinds = {(p.kind, getattr(p.detail, "algorithm", getattr(p.detail, "path", getattr(p.detail, "op", None))))
             for p in plans if getattr(p.detail, "parallel", False) is True}
    assert {("contraction", "skinny"), ("row", "sum"), ("conv2d", "channels"), ("conv2d", "pixels"),
            ("conv2d", "winograd"), ("index", "max_pool2d")} <= kinds, kinds


def test_two_threads_equal_one_bit_for_bit(case, monkeypatch):
    _two_cores(monkeypatch)
    one, two, xs, w = case
    want = one(**xs)
    ref = eqfuse.reference(SRC)(**xs, **w)
    for got, r in zip(want, ref):  # (the 1-thread result itself right)
        np.testing.assert_allclose(got, np.asarray(r).reshape(got.shape), rtol=2e-4, atol=2e-3)
    for _ in range(20):  # the chunks go to either thread differently from call to call
        for got, w in zip(two(**xs), want):
            assert np.array_equal(got, w)
