"""The ops that carry the gradients of pooling and gather_elements (pool2d_grad,
scatter_elements_add): their C kernels against the op table's numpy semantics."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import covering

import eqfuse
from eqfuse.errors import EqfuseError


@pytest.mark.parametrize("mode, extra, H, k, s, p", covering([("max", ""), ("avg", ""), ("avg", ", count_include_pad=true")],
                                                             [(7, 3, 2, 1), (8, 2, 2, 0), (5, 3, 1, 1)]))
def test_pool2d_grad_matches_the_reference(mode, extra, H, k, s, p):
    OH = (H + 2 * p - k) // s + 1
    src = f"""graph g(x: f32[2, 3, {H}, {H}], dy: f32[2, 3, {OH}, {OH}]) -> f32[2, 3, {H}, {H}] {{
  return pool2d_grad(x, dy, mode="{mode}", kernel_size={k}, stride={s}, padding={p}{extra})
}}"""
    rng = np.random.default_rng(H * k)
    x = rng.standard_normal((2, 3, H, H)).astype(np.float32)
    x[0, 0, 0, :3] = 5.0  # ties: the first largest element gets the gradient
    x[1, 2, 1, 1] = np.nan  # a NaN: it gets its windows' gradients
    dy = rng.standard_normal((2, 3, OH, OH)).astype(np.float32)
    np.testing.assert_allclose(eqfuse.compile(src)(x, dy), eqfuse.reference(src)(x, dy), rtol=1e-6, atol=1e-6)


def test_scatter_elements_add_matches_the_reference_and_refuses_a_bad_index():
    src = """graph g(x: f32[3, 5], i: i64[3, 4], u: f32[3, 4]) -> f32[3, 5] {
  return scatter_elements_add(x, i, u, axis=1)
}"""
    rng = np.random.default_rng(0)
    x, u = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    i = np.array([[0, 0, -1, 4], [2, 2, 2, 2], [1, 3, -5, 0]], np.int64)  # repeats add up
    mod = eqfuse.compile(src)
    np.testing.assert_allclose(mod(x, i, u), eqfuse.reference(src)(x, i, u), rtol=1e-6, atol=1e-6)
    with pytest.raises(EqfuseError, match="out of range"):
        mod(x, np.full((3, 4), 5, np.int64), u)
