"""C for one GEMM with a fused epilogue, from csrc_templates/gemm.c.

C[b] = epilogue(A[b] @ B[b]); the epilogue is a C expression over `acc` (the dot product),
`i`, `j` (global row and column, long), `b` (batch index), the sizes `M`, `N`, `K`, and any
extra parameters it names (`extras`: (C element type, name) pairs, e.g. ("float", "bias")).
The blocking is the plan's (eqfuse.backend.lower_gemm.gemm_tiles): this module writes it, never
chooses it.
"""

from __future__ import annotations

from collections.abc import Sequence

from eqfuse.backend.cbuild import render
from eqfuse.backend.lower_gemm import direct, gemm_tiles
from eqfuse.backend.lower_gemm import direct_a as direct_a_rule
from eqfuse.machine import machine

# How threads share one GEMM when there are fewer batches than threads (the template's SPLIT).
SPLITS = {"auto": 0, "rows": 1, "cols": 2}


def emit_gemm(name: str, *, M: int, N: int, K: int, batch: int = 1, a_batch_stride: int = 0,
              b_batch_stride: int = 0, c_batch_stride: int = 0, lda: int, ldb: int, ldc: int, csc: int = 1,
              b_transposed: bool = False, epilogue: str = "acc", extras: Sequence[tuple[str, str]] = (),
              blocking: tuple[int, int, int, int, int] | None = None,
              split: str = "auto", direct_b: bool | None = None, row_epilogue: str = "",
              prepacked_b: bool = False, a_transposed: bool = False,
              parallel: bool = True, direct_a: bool | None = None) -> tuple[str, str]:
    """(C source, cdef) of `void NAME(const float* A, const float* B, float* C EXTRA_PARAMS)`.

    A is M x K (row stride lda), B is K x N (row stride ldb) or, with b_transposed, N x K
    (row stride ldb); C is M x N (row stride ldc, column stride csc); batch b starts at
    b * <x>_batch_stride.
    `extras` are the epilogue's extra parameters, `const TYPE* NAME` after C.
    `blocking` (MC, NC, KC, MR, NR) is the plan's tiles (None: gemm_tiles for this machine).
    `split` is how threads share one batch: "rows", "cols", or "auto" (decided in the C at run
    time from the thread count, see `_split` in csrc_templates/gemm.c). `direct_b` has the
    micro-kernel read B in place rather than from packed panels (None: the rule of `direct`;
    never with a transposed B).
    `row_epilogue` is a C statement run on the rows [eqf_r0, eqf_r1) of batch b's C (C, b and
    the extra parameters in scope) once the last K slice has finished them: each MR-row tile
    while it is in L1 when the whole row is one NC block, else each chunk of rows after its last
    B panel. A row epilogue makes the threads split batches or rows, never columns
    (one thread must own whole rows).
    `a_transposed`: A is given as its transpose, K x M (row stride lda), packed to the same panels.
    `direct_a`: the micro-kernel reads A where it is (row stride lda) instead of packed panels
    (None: the rule of lower_gemm.direct_a; never with a transposed A).
    `parallel`: whether the GEMM opens a parallel region (the plan's detail.parallel,
    lower_gemm.parallel; False runs it on the calling thread).
    `prepacked_b`: the B argument is the panels made once by `NAME_prepack(B, P)` (P of
    `NAME_prepack_floats()` floats, both in the cdef), for a B bound by params= and shared by
    every batch (b_batch_stride 0).
    """
    if prepacked_b and b_batch_stride and batch > 1:
        raise ValueError("a prepacked B is one matrix shared by every batch")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, not {split!r}")
    if row_epilogue:
        split = "rows"
        if csc != 1:
            raise ValueError("a row epilogue walks rows of C in memory: its column stride must be 1")
    if min(M, N, K, batch) < 1:
        raise ValueError(f"GEMM sizes must be positive: M={M} N={N} K={K} batch={batch}")
    extra_params = "".join(f", const {t}* restrict {n}" for t, n in extras)
    if blocking:
        mc, nc, kc, mr, nr = blocking
    else:
        t = gemm_tiles(M, N, K, machine())
        mc, nc, kc, mr, nr = t["mc"], t["nc"], t["kc"], t["mr"], t["nr"]
    up = lambda x, q: -(-x // q) * q  # noqa: E731  (a given blocking: no block larger than the problem)
    mc, nc, kc = min(mc, up(M, mr)), min(nc, up(N, nr)), min(kc, K)
    if mc % mr or nc % nr or min(mc, nc, kc) < 1:
        raise ValueError(f"blocking MC={mc} NC={nc} KC={kc} must be whole MR={mr} x NR={nr} tiles")
    b_at = f"B[(jc + jr + j) * {ldb}L + pc + k]" if b_transposed else f"B[(pc + k) * {ldb}L + jc + jr + j]"
    src = render("gemm.c", NAME=name, M=M, N=N, K=K, BATCH=batch, MR=mr, NR=nr, MC=mc, NC=nc, KC=kc,
                 LDA=lda, LDC=ldc, CSC=csc, B_AT=b_at, B_TRANSPOSED=int(b_transposed), B_LAYOUT="given transposed (N x K)" if b_transposed else "K x N",
                 A_BATCH_STRIDE=a_batch_stride, B_BATCH_STRIDE=b_batch_stride, C_BATCH_STRIDE=c_batch_stride,
                 EPILOGUE=epilogue, SPLIT=SPLITS[split], LDB=ldb,
                 DIRECT_B=0 if prepacked_b else int(direct(M, N, b_transposed, mr, nr) if direct_b is None
                                                    else direct_b and not b_transposed),
                 PREPACKED_B=int(prepacked_b), A_TRANSPOSED=int(a_transposed),
                 DIRECT_A=int(not a_transposed and (direct_a_rule(a_transposed) if direct_a is None else direct_a)),
                 A_LAYOUT="given transposed (K x M)" if a_transposed else "M x K",
                 EXTRA_PARAMS=extra_params, PARALLEL=int(parallel), ROW_EPILOGUE=row_epilogue or "(void)eqf_r0; (void)eqf_r1;",
                 EXTRA_ARGS="".join(", " + n for _, n in extras))
    cdef = f"void {name}(const float* A, const float* B, float* C{''.join(f', const {t}* {n}' for t, n in extras)});"
    if prepacked_b:
        cdef += f"\nlong {name}_prepack_floats(void);\nvoid {name}_prepack(const float* B, float* P);"
    return src, cdef
