"""The GEMM template against numpy: odd sizes, batches, transposed B, fused epilogues, no warnings."""

import numpy as np
import pytest

from eqfuse.cbuild import COMMON_C, COMMON_CDEF, build, warnings_for
from eqfuse.gemm import emit_gemm

HEADER = "#include <stdlib.h>\n#include <math.h>\n"
EPILOGUES = {
    "acc": ("acc", "", ""),
    "bias_relu": ("fmaxf(acc + bias[j], 0.0f)", ", const float* restrict bias", ", const float* bias"),
    "residual": ("acc * 0.5f + res[b * {MN} + i * {N} + j]", ", const float* restrict res", ", const float* res"),
}


def gemm(M, N, K, batch, bt, epi):
    expr, params, cdef_params = EPILOGUES[epi]
    src, cdef = emit_gemm("g", M=M, N=N, K=K, batch=batch, a_batch_stride=M * K, b_batch_stride=K * N,
                          c_batch_stride=M * N, lda=K, ldb=K if bt else N, ldc=N, b_transposed=bt,
                          epilogue=expr.format(MN=M * N, N=N), extra_params=params, extra_args_cdef=cdef_params)
    return HEADER + COMMON_C + src, COMMON_CDEF + "\n" + cdef


@pytest.fixture(scope="module", autouse=True)
def cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("EQFUSE_CACHE_DIR", str(tmp_path_factory.mktemp("gemm-cache")))
    yield
    mp.undo()


@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (7, 13, 5), (33, 17, 65), (100, 257, 129), (128, 128, 128), (13, 40, 400)])
@pytest.mark.parametrize("bt", [False, True])
@pytest.mark.parametrize("epi", sorted(EPILOGUES))
def test_gemm_matches_numpy(M, N, K, bt, epi):
    batch = 2
    src, cdef = gemm(M, N, K, batch, bt, epi)
    lib = build(src, cdef, "gemm_test")
    rng = np.random.default_rng(M * 1000 + N + K)
    A = rng.standard_normal((batch, M, K), dtype=np.float32)
    B = rng.standard_normal((batch, K, N), dtype=np.float32)
    extra = {"bias_relu": rng.standard_normal(N, dtype=np.float32),
             "residual": rng.standard_normal((batch, M, N), dtype=np.float32)}.get(epi)
    C = np.full((batch, M, N), np.nan, np.float32)
    Bin = np.ascontiguousarray(B.transpose(0, 2, 1)) if bt else B
    ptr = lambda a: lib.ffi.cast("float*", lib.ffi.from_buffer(a))  # noqa: E731
    args = [ptr(A), ptr(Bin), ptr(C)] + ([ptr(extra)] if extra is not None else [])
    lib.lib.g(*args)
    acc = A.astype(np.float64) @ B
    want = {"acc": acc, "bias_relu": np.maximum(acc + (extra if extra is not None else 0), 0),
            "residual": acc * 0.5 + (extra if extra is not None else 0)}[epi]
    tol = 1e-5 * np.sqrt(K) * max(1.0, np.abs(want).max())
    np.testing.assert_allclose(C, want, rtol=1e-4, atol=tol)


def test_generated_gemm_compiles_without_warnings():
    for bt in (False, True):
        src, _ = gemm(33, 17, 65, 2, bt, "bias_relu")
        assert warnings_for(src) == ""
