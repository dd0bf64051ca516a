"""The channels-first layernorm (ConvNeXt's stem and downsampling LayerNorm: a layernorm over
the channels of an NCHW tensor's NHWC view, permuted back) with its rows in the lanes
(csrc_templates/row_layernorm_lanes.c, eqfuse.backend.kinds.row.lanes_block): the plan's `lanes`,
the permute back written in place (no copy kernel), and the result against numpy in float64 at
the zoo's tolerance (rtol 1e-4, atol 1e-5: a layernorm of unit-sized values in f32, two passes)."""

import numpy as np
import pytest

import eqfuse
from eqfuse.backend.kinds.row import LANES_TILE_BYTES
from eqfuse.machine import machine


def _src(n: int, c: int, h: int, w: int, res: bool) -> str:
    x = "x + r" if res else "x"
    return (f"graph g(x: f32[{n}, {c}, {h}, {w}], r: f32[{n}, {c}, {h}, {w}], ga: f32[{c}], be: f32[{c}]) "
            f"-> f32[{n}, {c}, {h}, {w}] {{\n"
            f"    return transpose(layernorm(transpose({x}, perm=[0, 2, 3, 1]), ga, be, eps=1e-6), perm=[0, 3, 1, 2])\n}}\n")


def _reference(x, r, ga, be, res: bool):
    v = (x + r if res else x).astype(np.float64)
    m = v.mean(axis=1, keepdims=True)
    var = ((v - m) ** 2).mean(axis=1, keepdims=True)
    return (v - m) / np.sqrt(var + 1e-6) * ga[:, None, None] + be[:, None, None]


# (batch, channels, height, width, a residual add before the layernorm, rows in the lanes): the
# zoo's tiny ConvNeXt's stem (16 channels at 8 x 8, batch 2); a run of 400 rows in blocks of 160
# (96 channels: LANES_TILE_BYTES) with a shorter last block, on both cores; 2 x 2 images, fewer
# rows at stride 1 than a vector: the rows one at a time
CASES = [(2, 16, 8, 8, False, True), (1, 96, 20, 20, True, True), (3, 8, 2, 2, True, False)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:4])) + ("+r" if c[4] else ""))
def test_channels_first_layernorm_rows_in_the_lanes(case):
    n, c, h, w, res, lanes = case
    rng = np.random.default_rng(c)
    args = [rng.standard_normal((n, c, h, w)).astype(np.float32) + 1, rng.standard_normal((n, c, h, w)).astype(np.float32),
            rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)]
    mod = eqfuse.compile(_src(n, c, h, w, res))
    np.testing.assert_allclose(mod(*args), _reference(*args, res), rtol=1e-4, atol=1e-5)
    (row,) = [k for k in mod.kernels if k.kind == "row"]
    vl = machine().simd_floats
    want = min(h * w, LANES_TILE_BYTES // (4 * c) // vl * vl) if lanes and h * w >= vl else 0
    assert row.decisions["lanes"] == want
    # the permute back is written by the layernorm in place when its rows are in the lanes, else a copy
    assert ("layout" in [k.kind for k in mod.kernels]) == (not want)
