"""The integer GEMM's exact AVX2 fallback (kinds.contraction.qgemm.int8_path "fallback": any s8 or
u8 weights on a CPU without VNNI, vpmaddwd on int16 pairs). Its panels hold each K-group as two
vectors of int16 (B's even and odd bytes, csrc_templates/gemm_u8s8.c), and A's four bytes of a
K-group are split the same way in the vector registers. These tests check that layout against
numpy's int64 products where the kernel quantizes its A itself: K not a multiple of 4, an s8 and a
u8 zero point, a zero point per weight column (the row sums), the weights' extremes, K in blocks
(partial sums between them), 1 and 2 threads. A model without VNNI is pinned, so the path runs on
every AVX2, AVX-512 and AMX host."""

from __future__ import annotations

import numpy as np
import pytest

import eqfuse

# quantize_linear inside the GEMM's kernel (QUANT_A): rows of 1101 bytes (K in blocks, a last
# partial K-group) with a u8 zero point, and rows of 30 with an s8 one and a zero point per column
QUANT_A = """
graph qm(x: f32[9, 1101], w: i8[1101, 37], s: f32, az: u8, wz: i8, y: f32[21, 30], w2: i8[30, 70], sz: i8,
         wzc: i8[70]) {
    return kernel { cast(matmul_integer(quantize_linear(x, s, az), w, az, wz), to="f32") },
           kernel { cast(matmul_integer(quantize_linear(y, s, sz), w2, sz, wzc), to="f32") }
}
"""


def _quantize(x, s, zp, lo, hi):
    return np.clip(np.rint(x / s) + zp, lo, hi).astype(np.int64)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_fallback_is_exact_on_its_int16_panels(no_vnni, threads):
    rng = np.random.default_rng(31)
    w = rng.integers(-128, 128, (1101, 37)).astype(np.int8)
    w2 = rng.integers(-128, 128, (30, 70)).astype(np.int8)
    w[:, 0], w2[:, 0] = -128, 127  # (the weights' extremes, where vpmaddubsw would saturate)
    s = np.asarray(0.125, np.float32)
    # activations that saturate at both ends of u8 and s8, ties (k + 0.5 steps) included
    x = np.concatenate([rng.uniform(-40, 40, (9, 1000)), (rng.integers(-99, 99, (9, 101)) + 0.5) * 0.125], 1)
    x[0] = 40.0  # (a row of the largest activations)
    y = rng.uniform(-20, 20, (21, 30))
    az, wz, sz = np.asarray(7, np.uint8), np.asarray(-3, np.int8), np.asarray(-5, np.int8)
    wzc = rng.integers(-128, 128, 70).astype(np.int8)
    mod = eqfuse.compile(QUANT_A, params={"w": w, "w2": w2}, fuse="manual", threads=threads)
    got = mod(x.astype(np.float32), s, az, wz, y.astype(np.float32), sz, wzc)
    plans = [p for p in mod.default.last.plans if p.kind == "contraction"]
    assert [p.precision_path for p in plans] == ["fallback"] * 2 and all(p.detail.quantize_a for p in plans)
    assert any(p.tiles["kc"] < p.detail.K for p in plans)  # (K in blocks: partial sums between them)
    assert all("_PATH 1 " in k.c_source for k in mod.kernels)  # (the plan is what runs)
    qx = _quantize(x.astype(np.float32), 0.125, 7, 0, 255)
    qy = _quantize(y.astype(np.float32), 0.125, -5, -128, 127)
    want = [(qx - 7) @ (w.astype(np.int64) + 3), (qy + 5) @ (w2.astype(np.int64) - wzc.astype(np.int64))]
    for g, wt in zip(got, want):  # (the exact int32 sums, rounded once to f32 by the cast)
        np.testing.assert_array_equal(g, wt.astype(np.float32))
