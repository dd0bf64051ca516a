"""C for the few-rows GEMM over a bound, prepacked B, from csrc_templates/gemm_skinny.c.

C = epilogue(A @ B) where B is read as the panels `NAME_prepack(B, P)` made once (P of
`NAME_prepack_floats()` floats): the memory-bound path lower_gemm.skinny chooses for batch 1-16
inference. The epilogue is the same C expression as eqfuse.backend.gemm's (acc, i, j, b = 0, M,
N, K and the extra parameters). The tile (MR, NR) and the prefetch distance are the plan's
(lower_gemm.skinny_tiles): this module writes them, never chooses them.
"""

from __future__ import annotations

from collections.abc import Sequence

from eqfuse.backend.cbuild import render


def emit_gemm_skinny(name: str, *, M: int, N: int, K: int, lda: int, ldb: int, ldc: int, mr: int, nr: int,
                     pf: int = 0, b_transposed: bool = False, a_transposed: bool = False,
                     epilogue: str = "acc", extras: Sequence[tuple[str, str]] = (), row_epilogue: str = "",
                     parallel: bool = True, pack_parts: int = 0) -> tuple[str, str]:
    """(C source, cdef) of `void NAME(const float* A, const float* P, float* C EXTRA_PARAMS)`
    and of its prepacking functions.

    A is M x K (row stride lda), or with a_transposed K x M (row stride lda); B, given to
    NAME_prepack, is K x N (row stride ldb) or with b_transposed N x K; C is M x N at row
    stride ldc. `mr` x `nr` is the register tile (nr a multiple of 4: of the vector width the
    kernel is built for, or it runs the 4-float generic vectors), `pf` the software prefetch
    distance in floats (0: none). `row_epilogue` is a C statement over the rows [eqf_r0, eqf_r1)
    of C (C, b and the extra parameters in scope), run once every column is done.
    With `parallel`, the panels (then the rows of a row epilogue) are chunks of the claim-based
    pool of common.h (eqf_parallel_for), one panel each; with `pack_parts` (the plan's,
    lower_gemm.skinny_pack_parts) the packing of A is too, before them, in that many parts of K
    per group of MR rows (0: the calling thread packs A).
    """
    if min(M, N, K, mr, nr) < 1 or nr % 4 or mr > M:
        raise ValueError(f"skinny GEMM: M={M} N={N} K={K} MR={mr} NR={nr} (NR a multiple of 4, MR <= M)")
    if ldc < N or lda < (M if a_transposed else K) or ldb < (K if b_transposed else N):
        raise ValueError(f"skinny GEMM: leading dimensions lda={lda} ldb={ldb} ldc={ldc} too small")
    a_at = "A[k * {0}L + i]" if a_transposed else "A[i * {0}L + k]"
    b_at = "B[(j0 + j) * {0}L + k]" if b_transposed else "B[k * {0}L + j0 + j]"
    src = render("gemm_skinny.c", NAME=name, M=M, N=N, K=K, MR=mr, NR=nr, GROUPS=-(-M // mr), PF=pf, LDC=ldc,
                 A_AT=a_at.format(lda), B_AT=b_at.format(ldb),
                 A_LAYOUT="given transposed (K x M)" if a_transposed else "M x K",
                 B_LAYOUT="given transposed (N x K)" if b_transposed else "K x N",
                 EPILOGUE=epilogue, PARALLEL=int(parallel), ROW_EPILOGUE_ON=int(bool(row_epilogue)),
                 ROW_EPILOGUE=row_epilogue or "(void)eqf_r0;",
                 EXTRA_PARAMS="".join(f", const {t}* restrict {n}" for t, n in extras),
                 EXTRA_ARGS="".join(", " + n for _, n in extras), PER_CHUNK=1,
                 PACK_PARTS=max(1, pack_parts), PACK_PARALLEL=int(parallel and pack_parts > 0),
                 EXTRA_FIELDS=" ".join(f"const {t}* {n};" for t, n in extras),
                 EXTRA_UNPACK=" ".join(f"const {t}* restrict {n} = jb->{n}; (void){n};" for t, n in extras),
                 EXTRA_INIT="".join(", " + n for _, n in extras))
    cdef = (f"void {name}(const float* A, const float* B, float* C{''.join(f', const {t}* {n}' for t, n in extras)});"
            f"\nlong {name}_prepack_floats(void);\nvoid {name}_prepack(const float* B, float* P);")
    return src, cdef
