"""C for one GEMM with a fused epilogue, from csrc_templates/gemm.c.

C[b] = epilogue(A[b] @ B[b]); the epilogue is a C expression over `acc` (the dot product),
`i`, `j` (row and column), `b` (batch) and any extra parameters it names.
"""

from __future__ import annotations

from .cbuild import render
from .machine import gemm_blocking

MR, NR = 12, 32  # the micro-kernel's register tile: 12 x 2 AVX-512 accumulators


def emit_gemm(name: str, *, M: int, N: int, K: int, batch: int = 1, a_batch_stride: int = 0,
              b_batch_stride: int = 0, c_batch_stride: int = 0, lda: int, ldb: int, ldc: int,
              b_transposed: bool = False, epilogue: str = "acc", extra_params: str = "",
              extra_args_cdef: str = "") -> tuple[str, str]:
    """(C source, cdef) of `void NAME(const float* A, const float* B, float* C EXTRA_PARAMS)`."""
    mc, nc, kc, _, _ = gemm_blocking(mr=MR, nr=NR)
    nc = min(nc, (N + NR - 1) // NR * NR)
    kc = min(kc, K)
    # B is K x N (row stride ldb), or given transposed as N x K (row stride ldb).
    b_at = "B[(jc + jr + j) * %d + pc + k]" % ldb if b_transposed else "B[(pc + k) * %d + jc + jr + j]" % ldb
    src = render("gemm.c", NAME=name, M=M, N=N, K=K, BATCH=batch, MR=MR, NR=NR, MC=mc, NC=nc, KC=kc,
                 LDA=lda, LDC=ldc, B_AT=b_at, B_LAYOUT="transposed (N x K)" if b_transposed else "K x N",
                 A_BATCH_STRIDE=a_batch_stride, B_BATCH_STRIDE=b_batch_stride, C_BATCH_STRIDE=c_batch_stride,
                 EPILOGUE=epilogue, EXTRA_PARAMS=extra_params)
    cdef = f"void {name}(const float* A, const float* B, float* C{extra_args_cdef});"
    return src, cdef
