"""C for one GEMM with a fused epilogue, from csrc_templates/gemm.c.

C[b] = epilogue(A[b] @ B[b]); the epilogue is a C expression over `acc` (the dot product),
`i`, `j` (global row and column, long), `b` (batch index), the sizes `M`, `N`, `K`, and any
extra parameters it names (declared by `extra_params`, e.g. ", const float* restrict bias").
"""

from __future__ import annotations

import re

from .cbuild import render
from .machine import gemm_blocking, machine, register_tile

# The micro-kernel's register tile for this machine (see machine.gemm_blocking for the choice).
_, _, _, MR, NR = gemm_blocking()
# How threads share one GEMM when there are fewer batches than threads (the template's SPLIT).
SPLITS = {"auto": 0, "rows": 1, "cols": 2}


def param_names(extra_params: str) -> list[str]:
    """The names declared by ", const float* restrict bias, const float* res": ['bias', 'res']."""
    names = []
    for decl in extra_params.split(","):
        decl = decl.strip()
        if not decl:
            continue
        m = re.search(r"([A-Za-z_]\w*)\s*(\[[^\]]*\]\s*)*$", decl)
        if not m:
            raise ValueError(f"cannot find the parameter name in {decl!r}")
        names.append(m.group(1))
    return names


def direct(M: int, b_transposed: bool, mr: int) -> bool:
    """Whether the micro-kernel reads B where it is (row stride ldb) instead of packed panels.

    With few rows, packing B costs about as much as the products: every B element is read from
    memory and written to the panel for only ceil(M / MR) uses, and the packing and the
    micro-kernel run one after the other; read in place, the B stream from memory overlaps the
    FMAs. Measured on one thread (relu(x @ w + b)): 8 x 768 x 3072 0.97 -> 0.56 ms, 32 x 784 x
    1024 0.61 -> 0.54, 64 x 1024 x 1024 1.41 -> 1.29, 128 rows 2.91 -> 2.75, 256 rows 5.24 ->
    5.17, 512 rows 10.13 -> 10.16 (even): so up to 32 MR tiles. A transposed B (N x K) is
    always packed: its k-major rows are what the packing makes. A last panel narrower than NR
    is packed either way (zero padded)."""
    return not b_transposed and -(-M // mr) <= 32


def emit_gemm(name: str, *, M: int, N: int, K: int, batch: int = 1, a_batch_stride: int = 0,
              b_batch_stride: int = 0, c_batch_stride: int = 0, lda: int, ldb: int, ldc: int,
              b_transposed: bool = False, epilogue: str = "acc", extra_params: str = "",
              extra_args_cdef: str = "",
              blocking: tuple[int, int, int, int, int] | None = None,
              split: str = "auto", direct_b: bool | None = None, row_epilogue: str = "",
              prepacked_b: bool = False, a_transposed: bool = False) -> tuple[str, str]:
    """(C source, cdef) of `void NAME(const float* A, const float* B, float* C EXTRA_PARAMS)`.

    A is M x K (row stride lda), B is K x N (row stride ldb) or, with b_transposed, N x K
    (row stride ldb); C is M x N (row stride ldc); batch b starts at b * <x>_batch_stride.
    `blocking` (MC, NC, KC, MR, NR) overrides the machine's choice (for tuning and tests).
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
    if min(M, N, K, batch) < 1:
        raise ValueError(f"GEMM sizes must be positive: M={M} N={N} K={K} batch={batch}")
    if extra_params and not extra_params.lstrip().startswith(","):
        extra_params = ", " + extra_params
    if extra_args_cdef and not extra_args_cdef.lstrip().startswith(","):
        extra_args_cdef = ", " + extra_args_cdef
    if blocking:
        mc, nc, kc, mr, nr = blocking
    else:
        m = machine()
        mr, nr = register_tile(m.simd_floats, N)
        kc = gemm_blocking(m, mr, nr)[2]
        # A K a little deeper than KC is done in one slice, and a deeper one in equal slices:
        # every slice but the last costs a pass over C, a thin last slice would be almost all cost.
        kc = K if K <= kc * 5 // 4 else -(-K // -(-K // kc))
        mc, nc, kc, mr, nr = gemm_blocking(m, mr, nr, kc)
    # No block larger than the problem: smaller packing buffers.
    up = lambda x, q: -(-x // q) * q  # noqa: E731
    mc, nc, kc = min(mc, up(M, mr)), min(nc, up(N, nr)), min(kc, K)
    b_at = f"B[(jc + jr + j) * {ldb}L + pc + k]" if b_transposed else f"B[(pc + k) * {ldb}L + jc + jr + j]"
    src = render("gemm.c", NAME=name, M=M, N=N, K=K, BATCH=batch, MR=mr, NR=nr, MC=mc, NC=nc, KC=kc,
                 LDA=lda, LDC=ldc, B_AT=b_at, B_TRANSPOSED=int(b_transposed), B_LAYOUT="given transposed (N x K)" if b_transposed else "K x N",
                 A_BATCH_STRIDE=a_batch_stride, B_BATCH_STRIDE=b_batch_stride, C_BATCH_STRIDE=c_batch_stride,
                 EPILOGUE=epilogue, SPLIT=SPLITS[split], LDB=ldb,
                 DIRECT_B=0 if prepacked_b else int(direct(M, b_transposed, mr) if direct_b is None
                                                    else direct_b and not b_transposed),
                 PREPACKED_B=int(prepacked_b), A_TRANSPOSED=int(a_transposed),
                 A_LAYOUT="given transposed (K x M)" if a_transposed else "M x K",
                 EXTRA_PARAMS=extra_params, ROW_EPILOGUE=row_epilogue or "(void)eqf_r0; (void)eqf_r1;",
                 EXTRA_ARGS="".join(", " + n for n in param_names(extra_params)))
    cdef = f"void {name}(const float* A, const float* B, float* C{extra_args_cdef});"
    if prepacked_b:
        cdef += f"\nlong {name}_prepack_floats(void);\nvoid {name}_prepack(const float* B, float* P);"
    return src, cdef
