"""conv2d as a GEMM in both orientations (plan_gemm.pixels_as_rows): channels x pixels, or, with
fewer output pixels than channels, pixels x channels stored transposed, the weights read as B
(packed once when bound). Every case against the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import covering

import eqfuse
from eqfuse.backend.kinds.contraction.plan_gemm import pixels_as_rows


@pytest.fixture(autouse=True)
def _im2col(monkeypatch):
    # these are the im2col GEMM's cases: the direct kernel (eqfuse.backend.kinds.contraction.conv, which
    # would take the 3x3 ones) has its own tests in tests/test_contraction/conv.py
    monkeypatch.setenv("EQFUSE_CONV", "im2col")


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


CASES = {  # (N, C, H, O, k, stride, padding): output pixels vs channels
    "2x2, 128 channels": (2, 64, 4, 128, 3, 2, 1),
    "4x4, 64 channels, one image": (1, 32, 4, 64, 3, 1, 1),
    "3x3, 37 channels, three images": (3, 19, 7, 37, 3, 2, 0),
    "1x1 conv, 2x2": (2, 24, 2, 40, 1, 1, 0),
    "8x8, 16 channels (channels x pixels)": (2, 8, 8, 16, 3, 1, 1),
}


@pytest.mark.heavy  # (the fast tier's time)
@pytest.mark.parametrize("case,bound", covering(list(CASES), [False, True],
                                               ids=lambda c: f"{c[0]}-{'bound-weights' if c[1] else 'weights'}"))
def test_conv_with_bias_batchnorm_relu_and_residual_matches_the_reference(case, bound):
    N, C, H, O, k, s, p = CASES[case]
    OH = (H + 2 * p - k) // s + 1
    src = f"""
graph c(x: f32[{N}, {C}, {H}, {H}], w: f32[{O}, {C}, {k}, {k}], b: f32[{O}], m: f32[{O}], v: f32[{O}],
        g: f32[{O}], be: f32[{O}], r: f32[{N}, {O}, {OH}, {OH}]) -> f32[{N}, {O}, {OH}, {OH}] {{
  y = batchnorm(conv2d(x, w, b, stride={s}, padding={p}), m, v, g, be, eps=0.00001)
  return relu(y + r)
}}
"""
    xs = {"x": _rand(N, C, H, H), "w": _rand(O, C, k, k, seed=1) * 0.2, "b": _rand(O, seed=2), "m": _rand(O, seed=3),
              "v": np.abs(_rand(O, seed=4)) + 0.5, "g": _rand(O, seed=5), "be": _rand(O, seed=6), "r": _rand(N, O, OH, OH, seed=7)}
    mod = eqfuse.compile(src, params={"w": xs["w"]} if bound else None)
    args = {n: a for n, a in xs.items() if not (bound and n == "w")}
    for _ in range(2):  # (a prepacked weight is packed at the first call)
        np.testing.assert_allclose(mod(**args), eqfuse.reference(src)(**xs), rtol=1e-4, atol=1e-4)
    (f,) = mod.functions.values()
    (conv,) = [p for p in f.last.plans if p.kind == "conv2d"]
    assert conv.detail.pixels_as_rows == pixels_as_rows(O, OH * OH)
    assert (conv.detail.prepack is not None) == (bound and conv.detail.pixels_as_rows)


def test_pixels_as_rows_writes_its_transposed_tokens_into_a_concat():
    # the stored-transposed C of a pixels-as-rows conv, itself written transposed into a concat:
    # tokens [N, pixels, channels] after a cls row, the GEMM's C in its natural row-major layout
    src = """
graph t(x: f32[2, 8, 4, 4], w: f32[32, 8, 2, 2], cls: f32[2, 1, 32]) -> f32[2, 5, 32] {
  p = reshape(conv2d(x, w, stride=2), shape=[2, 32, 4])
  return concat(exp(cls), transpose(p, perm=[0, 2, 1]), axis=1)
}
"""
    xs = {"x": _rand(2, 8, 4, 4), "w": _rand(32, 8, 2, 2, seed=1), "cls": _rand(2, 1, 32, seed=2)}
    mod = eqfuse.compile(src)
    np.testing.assert_allclose(mod(**xs), eqfuse.reference(src)(**xs), rtol=1e-4, atol=1e-4)
    (f,) = mod.functions.values()
    (conv,) = [p for p in f.last.plans if p.kind == "conv2d"]
    assert conv.detail.pixels_as_rows and conv.into is not None
    assert "layout" not in [p.kind for p in f.last.plans]
