"""The sample's own position indexing a mask (eqfuse.ir.positions): transformers' exported
attention masks keep their batch a batch dim; any other use of the position does not."""

from __future__ import annotations

import numpy as np
import pytest

import eqfuse
from eqfuse.frontend.load import load
from eqfuse.ir.separable import batch_dims

# result[b, j] = x[b, j] * mask[b, j], with the mask read as transformers' exports read it: a flat
# index b * 4 + j from arange(batch), split again into quotient and remainder
MASKED = """
graph f(x: f32[B, 4], mask: f32[B, 4], j: i64[1, 4]) -> f32[B, 4] {
    p = cumsum(cast(where(reshape(slice(x, axis=1, stop=1), shape=[-1]) == 0.5, 1, 1), to="i64"), axis=0,
               exclusive=true)
    flat = reshape(p, shape=[-1, 1]) * 4 + j
    q = cast(cast(flat, to="f32") / 4, to="i64")
    r = flat - q * 4
    rows = gather(mask, @Q@, axis=0)
    return x * reshape(gather_elements(rows, reshape(r, shape=[-1, 4, 1]), axis=2), shape=[-1, 4])@EXTRA@
}
"""
J = np.arange(4, dtype=np.int64).reshape(1, 4)


def masked(q: str = "q", extra: str = "") -> str:
    return MASKED.replace("@Q@", q).replace("@EXTRA@", extra)


@pytest.mark.heavy
def test_a_mask_read_at_the_samples_own_position_keeps_the_batch_dim():
    src = masked()
    g = load(src)[0]
    assert batch_dims(g) == ([], {"B": "reads the sample's position (an arange over it) through j, "
                                        "which params= does not bind"})
    assert batch_dims(g, {"j": J}) == (["B"], {})
    mod = eqfuse.compile(src, params={"j": J})
    assert mod.default.batch_dim == "B"
    rng = np.random.default_rng(0)
    for n in (8, 1, 3, 13):
        x, m = (rng.standard_normal((n, 4)).astype(np.float32) for _ in range(2))
        np.testing.assert_allclose(mod(x, m), x * m, rtol=1e-6)
    assert not mod.default.cache


@pytest.mark.parametrize("q,extra,why", [
    ("q * 0", "", "reads other samples' rows"),  # every sample reads row 0
    ("q", " + cast(reshape(p, shape=[-1, 1]), to=\"f32\")", "other than as a gather's index"),
])
def test_other_uses_of_the_position_are_not_batch_dims(q, extra, why):
    g = load(masked(q, extra))[0]
    ok, reasons = batch_dims(g, {"j": J})
    assert ok == [] and why in reasons["B"]


def test_an_index_within_the_sample_that_depends_on_the_position_is_refused():
    src = masked().replace("reshape(r, shape=[-1, 4, 1])", "reshape(r * 0 + q, shape=[-1, 4, 1])")
    g = load(src)[0]
    ok, reasons = batch_dims(g, {"j": J})
    assert ok == [] and "index depends on the sample's position" in reasons["B"]
