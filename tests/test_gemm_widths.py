"""The GEMM micro-kernels of the narrower vector widths against numpy: the AVX2+FMA one (8-float
vectors, built for x86-64-v3) and the portable one (4-float generic vectors, x86-64-v2, no AVX),
each with the tiles its width plans, on sizes that are not multiples of them (M, N or K of 1,
K over several KC slices, a partial last panel), through emit_gemm and through eqfuse.compile.
"""

import dataclasses
import shutil
import subprocess

import numpy as np
import pytest
from helpers import covering

import eqfuse
from eqfuse import machine
from eqfuse.backend.cbuild import COMMON_C, COMMON_CDEF, build, header_c
from eqfuse.backend.kinds.contraction.emit_gemm import emit_gemm
from eqfuse.backend.kinds.contraction.plan_gemm import blocking as blocking_of
from eqfuse.backend.kinds.contraction.plan_gemm import gemm_tiles

pytestmark = pytest.mark.heavy

PORTABLE = dataclasses.replace(machine.MODELS["avx2"], simd_floats=4)
WIDTHS = {"portable": PORTABLE, "avx2": machine.MODELS["avx2"]}
HEADER = header_c() + COMMON_C

# (M, N, K, B transposed, direct_b) with direct_b None for the plan's rule: K = 1, N = 1, M = 1,
# sizes one past a tile, K deeper than one KC slice (the portable KC is 336, AVX2's 256), few
# rows with B read in place (the rule packs it unless B is one panel wide: N <= NR)
CASES = [(1, 1, 1, False, None), (7, 1, 13, False, None), (1, 9, 1, False, None), (13, 17, 1, True, None),
         (5, 3, 700, False, None), (7, 9, 600, True, None), (37, 45, 300, False, None), (61, 130, 517, False, None),
         (19, 33, 70, False, True), (13, 8, 40, False, None), (6, 16, 9, False, None)]
# hand-given blocking (MC, NC, KC, MR, NR): several row chunks, panels and K slices; NR = 6 takes
# the plain-C micro-kernel (no whole vectors), NR = 12 the 4-float one at MR = 5
BLOCKED = [((23, 50, 31), (12, 12, 16, 6, 6)), ((23, 50, 31), (10, 24, 8, 5, 12))]


def _variants():
    return [(c, None) for c in CASES] + [((*s, False, None), blk) for s, blk in BLOCKED]


def _source(name, case, blocking, m):
    """The GEMM of `case`, with the hand-given blocking or the plan's for machine m."""
    M, N, K, bt, direct = case
    return emit_gemm(name, M=M, N=N, K=K, lda=K, ldb=K if bt else N, ldc=N, b_transposed=bt,
                     epilogue="fmaxf(acc + bias[j], 0.0f)", extras=[("float", "bias")],
                     blocking=blocking or blocking_of(gemm_tiles(M, N, K, m)),
                     direct_b=direct)


@pytest.fixture(scope="module", params=sorted(WIDTHS))
def width(request):
    m = WIDTHS[request.param]
    if m.simd_floats > machine.host_simd_floats():  # (the suite's floor is AVX2: only an older host skips)
        pytest.skip(f"this host has no {m.simd_floats}-float vectors")
    with machine.pinned(m, clamp=False):
        parts = [_source(f"w{n}", *v, m) for n, v in enumerate(_variants())]
        built = build(HEADER + "\n".join(s for s, _ in parts), COMMON_CDEF + "\n" + "\n".join(c for _, c in parts),
                      f"gemm_{request.param}")
        yield request.param, m, built


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", range(len(_variants())))
def test_gemm_of_each_width_matches_numpy(width, n, threads):
    _, _, built = width
    (M, N, K, bt, _), _ = _variants()[n]
    rng = np.random.default_rng(n)
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((K, N), dtype=np.float32)
    bias = rng.standard_normal(N, dtype=np.float32)
    C = np.full((M, N), np.nan, np.float32)  # every element must be written
    ffi = built.ffi
    ptr = lambda a: ffi.cast("float*", ffi.from_buffer(a))  # noqa: E731
    built.lib.eqf_set_threads(threads)
    Bin = np.ascontiguousarray(B.T) if bt else B  # (a name: a cast pointer does not keep its array alive)
    getattr(built.lib, f"w{n}")(ptr(A), ptr(Bin), ptr(C), ptr(bias))
    want = np.maximum(A.astype(np.float64) @ B + bias, 0)
    np.testing.assert_allclose(C, want, rtol=1e-4, atol=1e-4 * np.sqrt(K) * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("N", [256, 8, 3])  # a narrower tile for few columns
def test_each_width_plans_its_own_register_tile(width, N):
    """The portable tile fits 16 xmm registers without FMA, AVX2's the 16 ymm: MR x NR/vector
    accumulators plus one row of B and one broadcast A element (plus the product, without FMA)."""
    name, m, _ = width
    t = gemm_tiles(256, N, 256, m)
    assert t["nr"] < 2 * N or t["nr"] == m.simd_floats
    vecs = t["mr"] * t["nr"] // m.simd_floats
    assert t["nr"] % m.simd_floats == 0
    assert vecs + t["nr"] // m.simd_floats + 1 + (name == "portable") <= 16


# the instruction check reads the built library with binutils' objdump (present wherever gcc is)
@pytest.mark.skipif(not shutil.which("objdump"), reason="needs objdump")
def test_each_width_runs_its_own_micro_kernel(width):
    """The build really takes the intended path: FMAs on ymm registers for AVX2 (none on zmm); no
    AVX register at all for the portable build, whose products are SSE mulps."""
    name, _, built = width
    dis = subprocess.run(["objdump", "-d", str(built.path)], capture_output=True, text=True, check=True).stdout
    assert "zmm" not in dis
    if name == "avx2":
        assert any("vfmadd" in ln and "ymm" in ln for ln in dis.splitlines())
    else:
        assert "ymm" not in dis and "mulps" in dis


GRAPH = """graph f(x: f32[{M}, {K}], w: f32[{K}, {N}], b: f32[{N}]) -> f32[{M}, {N}] {{
    return relu(x @ w + b)
}}"""


# bound True: w bound by params=, its panels packed once
@pytest.mark.parametrize("M,N,K,bound", covering([(1, 1, 1), (9, 31, 700), (67, 1, 5), (3, 50, 1)], [False, True]))
def test_compiled_portable_gemm_matches_the_reference(M, N, K, bound):
    src = GRAPH.format(M=M, N=N, K=K)
    rng = np.random.default_rng(M + N + K)
    x, w, b = (rng.standard_normal(s, dtype=np.float32) for s in ((M, K), (K, N), (N,)))
    with machine.pinned(PORTABLE, clamp=False):
        mod = eqfuse.compile(src, params={"w": w} if bound else None, threads=1)
    got = mod(x, b) if bound else mod(x, w, b)
    want = eqfuse.reference(src)(x, w, b)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(K) * max(1.0, float(np.abs(want).max())))
