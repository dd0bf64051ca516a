"""The C of a GEMM kernel: the epilogues and wrappers of a planned matmul or conv2d GEMM, the blocked GEMM (csrc_templates/gemm.c) and the few-rows GEMM over prepacked B (csrc_templates/gemm_skinny.c).

C for one GEMM with a fused epilogue, from csrc_templates/gemm.c.

C[b] = epilogue(A[b] @ B[b]); the epilogue is a C expression over `acc` (the dot product),
`i`, `j` (global row and column, long), `b` (batch index), the sizes `M`, `N`, `K`, and any
extra parameters it names (`extras`: (C element type, name) pairs, e.g. ("float", "bias")).
The blocking is the plan's (eqfuse.backend.kinds.contraction.plan_gemm.gemm_tiles): this module writes it, never
chooses it.

C for the few-rows GEMM over a bound, prepacked B, from csrc_templates/gemm_skinny.c.

C = epilogue(A @ B) where B is read as the panels `NAME_prepack(B, P)` made once (P of
`NAME_prepack_floats()` floats): the memory-bound path plan_gemm.skinny chooses for batch 1-16
inference. The epilogue is the same C expression as eqfuse.backend.kinds.contraction.emit_gemm's (acc, i, j, b = 0, M,
N, K and the extra parameters). The tile (MR, NR) and the prefetch distance are the plan's
(plan_gemm.skinny_tiles): this module writes them, never chooses them.

Stage `emit` for the GEMM kinds: matmul and conv2d with fused epilogues (and row epilogues).

The GEMM itself is csrc_templates/gemm.c (eqfuse.backend.kinds.contraction.emit_gemm fills it), with the tiles and decisions
of the plan (eqfuse.backend.kinds.contraction.plan_gemm); this module writes the epilogue expressions, the row epilogue
function and the wrappers (matmul.c, conv2d.c) that call the GEMM.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import count

from eqfuse.backend.cexpr import I1, I2, Exprs, Space, render
from eqfuse.backend.cexpr import kernel_params as _params
from eqfuse.backend.indexing import bstrides, offset
from eqfuse.backend.kinds.contraction.conv_geometry import ConvGeometry, conv_geometry
from eqfuse.backend.kinds.contraction.plan_gemm import (
    AMX_KB,
    AMX_MR,
    AMX_NR,
    blocking,
    c_layout,
    conv_c_layout,
    direct,
)
from eqfuse.backend.kinds.contraction.plan_gemm import direct_a as direct_a_rule
from eqfuse.backend.kinds.row import with_rows_head
from eqfuse.backend.plan import KernelPlan, size
from eqfuse.ir.graph import Graph
from eqfuse.ir.kernels import K as PlanKind
from eqfuse.ir.kernels import computed_ancestors as _ancestors
from eqfuse.ir.ops import flit
from eqfuse.ir.shapes import C_TYPE

# How threads share one GEMM when there are fewer batches than threads (the template's SPLIT).
SPLITS = {"auto": 0, "rows": 1, "cols": 2}
# The templates' BF16 for a plan's instruction path (KernelPlan.precision_path): f32; bf16 on the
# fallback (bf16 B widened by a shift, f32 FMA); bf16 K-pairs through vdpbf16ps (AVX512_BF16);
# bf16 tiles through tdpbf16ps (AMX-BF16: gemm.c only)
BF16_PATHS = {"f32": 0, "fallback": 1, "avx512_bf16": 2, "amx_bf16": 3}


def edge_rows(name: str, live: bool, mr: int, aq: str, ars: str, aks: str) -> str:
    """gemm.c's micro-kernel calls for a last tile of each row count below MR (EDGE_ROWS_*): the
    rows of a dim taken at run time end anywhere in a tile; empty for rows fixed at compile time
    (the last tile has M's own count, EDGE)."""
    if not live:
        return ""
    return "".join(f"            else if (mr == {k})\n                {name}_CALL({k}, {aq}, {ars}, {aks});\n"
                   for k in range(1, mr))


def emit_gemm(name: str, *, M: int, N: int, K: int, batch: int = 1, a_batch_stride: int = 0,
              b_batch_stride: int = 0, c_batch_stride: int = 0, lda: int, ldb: int, ldc: int, csc: int = 1,
              b_transposed: bool = False, epilogue: str = "acc", extras: Sequence[tuple[str, str]] = (),
              blocking: tuple[int, int, int, int, int],
              split: str = "auto", direct_b: bool | None = None, row_epilogue: str = "",
              prepacked_b: bool = False, a_transposed: bool = False,
              parallel: bool = True, direct_a: bool | None = None, path: str = "f32",
              live_rows: bool = False, live_stride: int = 0, image: ConvGeometry | None = None,
              pool: bool = False) -> tuple[str, str]:
    """(C source, cdef) of `void NAME(const float* A, const float* B, float* C EXTRA_PARAMS)`.

    A is M x K (row stride lda), B is K x N (row stride ldb) or, with b_transposed, N x K
    (row stride ldb); C is M x N (row stride ldc, column stride csc); batch b starts at
    b * <x>_batch_stride.
    `extras` are the epilogue's extra parameters, `const TYPE* NAME` after C.
    `blocking` (MC, NC, KC, MR, NR) is the plan's tiles (plan_gemm.gemm_tiles for the machine the
    caller was given: this module reads no machine model).
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
    (None: the rule of plan_gemm.direct_a; never with a transposed A). Neither with bf16
    operands (`path`): both are converted while packed; None is then False, True an error.
    `parallel`: whether the GEMM opens a parallel region (the plan's detail.parallel,
    plan_gemm.parallel; False runs it on the calling thread).
    `prepacked_b`: the B argument is the panels made once by `NAME_prepack(B, P)` (P of
    `NAME_prepack_floats()` floats, both in the cdef), for a B bound by params= and shared by
    every batch (b_batch_stride 0).
    `path`: the instruction path (BF16_PATHS): "f32", or bf16 operands ("avx512_bf16":
    vdpbf16ps; "fallback": bf16 B widened to f32; "amx_bf16": tdpbf16ps on tiles, with the
    blocking of plan_gemm.amx_tiles), which packs A and B (never in place) and needs an even KC
    (AMX: a multiple of AMX_KB) when K takes more than one slice.
    `live_rows`: one more parameter, `long live`, after the extras: the rows are a dim taken at run
    time (eqfuse.backend.runtime_dim), and the GEMM computes its first `live` rows (at most M), its
    last tile by the micro-kernel of that tile's rows (`edge_rows`); with bf16 operands (their own
    micro-kernels) in whole MR tiles. With `live_stride` as well, the M rows are M / live_stride
    batches of live_stride rows (a dim at run time behind a batch: B shared, A not transposed, no
    row epilogue, A packed, not on AMX), and the GEMM computes the first `live` rows of each: its
    row i is row AROW(i) = i / live x live_stride + i % live of A and C (the epilogue's `i` too).
    `image`: the implicit im2col of a conv on AMX tiles (path "amx_bf16"): B is the conv's input
    copied with its padding (conv2d.c: C planes of in_rows(OH) x in_cols(OW) per image, the batch
    stride), and its K x N column matrix (K = C x KH x KW, N = OH x OW) is never built: the panels
    are packed from the copy (csrc_templates/im2col_b.c).
    `pool`: the column panels run as ranges of the claim-based pool instead of an OpenMP region
    (plan_gemm.amx_few_rows: a few rows over a prepacked B on AMX tiles; one batch, no row
    epilogue, rows fixed at compile time).
    """
    if pool and (not prepacked_b or batch > 1 or row_epilogue or live_rows or BF16_PATHS[path] != 3):
        raise ValueError("a GEMM on the pool: prepacked B on AMX tiles, one batch, no row epilogue, fixed rows")
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
    extra_args = "".join(", " + n for _, n in extras)
    if live_stride:  # (`live` reaches the blocks, the macro kernel and A's packing: an extra)
        if not live_rows or a_transposed or row_epilogue or direct_a or BF16_PATHS[path] == 3 or M % live_stride:
            raise ValueError("rows at run time behind a batch: live rows, A packed in rows, no row epilogue, no AMX")
        extra_params, extra_args = extra_params + ", long live", extra_args + ", live"
    mc, nc, kc, mr, nr = blocking
    up = lambda x, q: -(-x // q) * q  # noqa: E731  (a given blocking: no block larger than the problem)
    mc, nc, kc = min(mc, up(M, mr)), min(nc, up(N, nr)), min(kc, K)
    if mc % mr or nc % nr or min(mc, nc, kc) < 1:
        raise ValueError(f"blocking MC={mc} NC={nc} KC={kc} must be whole MR={mr} x NR={nr} tiles")
    bf16 = BF16_PATHS[path]
    if bf16 and kc < K and kc % 2:
        raise ValueError(f"a bf16 GEMM's K slices are whole K-pairs: KC={kc} must be even")
    if bf16 == 2 and nr % 16:
        raise ValueError(f"the vdpbf16ps micro-kernel needs NR a multiple of 16, got {nr}")
    if bf16 == 3 and (mr, nr) != (AMX_MR, AMX_NR):
        raise ValueError(f"the AMX micro-kernel's tile is {AMX_MR} x {AMX_NR} (2 x 2 C tiles), got {mr} x {nr}")
    if bf16 == 3 and kc < K and kc % AMX_KB:
        raise ValueError(f"an AMX GEMM's K slices are whole {AMX_KB}-element blocks: KC={kc}")
    if bf16:  # (A and B converted while packed: the plan says so, plan_gemm.plan_contraction)
        if direct_b or direct_a:
            raise ValueError("a bf16 GEMM packs A and B (converted while packed): neither is read in place")
        direct_b, direct_a = False, False
    if image is not None and (bf16 != 3 or b_transposed or prepacked_b or (K, N) != (
            image.C * image.KH * image.KW, image.OH * image.OW)):
        raise ValueError("the implicit im2col is an AMX conv's B: the image's column matrix, packed per call")
    b_at = f"B[(jc + jr + j) * {ldb}L + pc + k]" if b_transposed else f"B[(pc + k) * {ldb}L + jc + jr + j]"
    head = render("im2col_b.c", NAME=name, HP=image.in_rows(image.OH), WP=image.in_cols(image.OW),
                  **image.shape_c("N", "C", "H", "W", "PH", "PW")) + "\n" if image is not None else ""
    src = head + render("gemm.c", NAME=name, IMPLICIT=int(image is not None), M=M, N=N, K=K, BATCH=batch, MR=mr, NR=nr, MC=mc, NC=nc, KC=kc,
                 LDA=lda, LDC=ldc, CSC=csc, B_AT=b_at, B_TRANSPOSED=int(b_transposed), B_LAYOUT="given transposed (N x K)" if b_transposed else "K x N",
                 A_BATCH_STRIDE=a_batch_stride, B_BATCH_STRIDE=b_batch_stride, C_BATCH_STRIDE=c_batch_stride,
                 EPILOGUE=epilogue, SPLIT=SPLITS[split], LDB=ldb,
                 DIRECT_B=0 if prepacked_b else int(direct(M, N, b_transposed, mr, nr) if direct_b is None
                                                    else direct_b and not b_transposed),
                 PREPACKED_B=int(prepacked_b), A_TRANSPOSED=int(a_transposed),
                 DIRECT_A=int(not a_transposed and (direct_a_rule(a_transposed) if direct_a is None else direct_a)),
                 A_LAYOUT="given transposed (K x M)" if a_transposed else "M x K",
                 EXTRA_PARAMS=extra_params, PARALLEL=int(parallel), ROW_EPILOGUE=row_epilogue or "(void)eqf_r0; (void)eqf_r1;",
                 EXTRA_ARGS=extra_args, BF16=bf16, POOL=int(pool),
                 EXTRA_FIELDS=" ".join(f"const {t}* {n};" for t, n in extras),
                 EXTRA_UNPACK=" ".join(f"const {t}* restrict {n} = jb->{n}; (void){n};" for t, n in extras),
                 EXTRA_INIT="".join(", " + n for _, n in extras),
                 LIVE_PARAM=", long live" if live_rows and not live_stride else "",
                 ROWS_LIVE=f"eqf_minl({name}_M, live * {M // max(live_stride, 1)})" if live_stride else
                 (f"eqf_minl({name}_M, (live + {mr - 1}) / {mr} * {mr})" if bf16 else
                  f"eqf_minl({name}_M, live)") if live_rows else f"{name}_M",
                 ROWMAP=int(bool(live_stride)), ROWMAP_PARAM=", long live" if live_stride else "",
                 ROWMAP_ARG=", live" if live_stride else "",
                 AROW=f"((i) / live * {live_stride}L + (i) % live)" if live_stride else "(i)",
                 EDGE_ROWS_DIRECT=edge_rows(name, live_rows and not bf16, mr, f"A + (ic + ir) * {lda}L + pc", f"{lda}L", "1"),
                 EDGE_ROWS_PACKED=edge_rows(name, live_rows and not bf16, mr, "ap + ir * kc", "1", f"{name}_MR"))
    cdef = (f"void {name}(const float* A, const float* B, float* C{''.join(f', const {t}* {n}' for t, n in extras)}"
            f"{', long live' if live_rows else ''});")
    if prepacked_b:
        cdef += f"\nlong {name}_prepack_floats(void);\nvoid {name}_prepack(const float* B, float* P);"
    return src, cdef


def emit_gemm_skinny(name: str, *, M: int, N: int, K: int, lda: int, ldb: int, ldc: int, mr: int, nr: int,
                     pf: int = 0, b_transposed: bool = False, a_transposed: bool = False,
                     epilogue: str = "acc", extras: Sequence[tuple[str, str]] = (), row_epilogue: str = "",
                     parallel: bool = True, pack_parts: int = 0, path: str = "f32",
                     runs: bool = False) -> tuple[str, str]:
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
    plan_gemm.skinny_pack_parts) the packing of A is too, before them, in that many parts of K
    per group of MR rows (0: the calling thread packs A). With `runs` (the plan's,
    plan_gemm.skinny_runs) each thread's panels are one contiguous run (common_pool.h,
    eqf_runs_claim) instead of claimed in turn. `path` is the instruction path (BF16_PATHS, as
    emit_gemm's).
    """
    if min(M, N, K, mr, nr) < 1 or nr % 4 or mr > M:
        raise ValueError(f"skinny GEMM: M={M} N={N} K={K} MR={mr} NR={nr} (NR a multiple of 4, MR <= M)")
    if ldc < N or lda < (M if a_transposed else K) or ldb < (K if b_transposed else N):
        raise ValueError(f"skinny GEMM: leading dimensions lda={lda} ldb={ldb} ldc={ldc} too small")
    if BF16_PATHS[path] == 2 and nr % 16:
        raise ValueError(f"the vdpbf16ps micro-kernel needs NR a multiple of 16, got {nr}")
    if BF16_PATHS[path] == 3:
        raise ValueError("the few-rows GEMM has no AMX path (plan_gemm.plan_skinny plans vdpbf16ps)")
    a_at = "A[k * {0}L + i]" if a_transposed else "A[i * {0}L + k]"
    b_at = "B[(j0 + j) * {0}L + k]" if b_transposed else "B[k * {0}L + j0 + j]"
    src = render("gemm_skinny.c", NAME=name, M=M, N=N, K=K, MR=mr, NR=nr, GROUPS=-(-M // mr), PF=pf, LDC=ldc,
                 A_AT=a_at.format(lda), B_AT=b_at.format(ldb),
                 A_LAYOUT="given transposed (K x M)" if a_transposed else "M x K",
                 B_LAYOUT="given transposed (N x K)" if b_transposed else "K x N",
                 EPILOGUE=epilogue, PARALLEL=int(parallel), ROW_EPILOGUE_ON=int(bool(row_epilogue)),
                 ROW_EPILOGUE=row_epilogue or "(void)eqf_r0;",
                 EXTRA_PARAMS="".join(f", const {t}* restrict {n}" for t, n in extras),
                 EXTRA_ARGS="".join(", " + n for _, n in extras), PACK_PARTS=pack_parts,
                 EXTRA_FIELDS=" ".join(f"const {t}* {n};" for t, n in extras),
                 EXTRA_UNPACK=" ".join(f"const {t}* restrict {n} = jb->{n}; (void){n};" for t, n in extras),
                 EXTRA_INIT="".join(", " + n for _, n in extras), BF16=BF16_PATHS[path],
                 A_TRANSPOSED=int(a_transposed), RUNS=int(runs and parallel))
    cdef = (f"void {name}(const float* A, const float* B, float* C{''.join(f', const {t}* {n}' for t, n in extras)});"
            f"\nlong {name}_prepack_floats(void);\nvoid {name}_prepack(const float* B, float* P);")
    return src, cdef


def _few_rows(plan: KernelPlan, gname: str, ldc: int, bt: bool, expr: str, extras, row_call: str) -> str:
    """The C of a GEMM whose rows are a dim at run time with detail.few_rows = T (plan_gemm.
    few_rows_plan): the few-rows kernel compiled at T rows (`<gname>_few`, over the blocked
    kernel's own panels: the same layout), and `<gname>_rt`, which runs it for a call of at most T
    rows on one thread (the rows from the length to T are scratch, as every row past it) and the
    blocked kernel otherwise."""
    d, t = plan.detail, plan.tiles
    T, (mr, pf, par, parts, runs) = d.few_rows, d.few
    few, _ = emit_gemm_skinny(f"{gname}_few", M=T, N=d.N, K=d.K, lda=d.gemm.lda, ldb=d.gemm.ldb, ldc=ldc, mr=mr,
                              nr=t["nr"], pf=pf, b_transposed=bt, epilogue=expr,
                              extras=[(c_type(plan.body, i), pn) for i, pn in extras], row_epilogue=row_call,
                              parallel=par, pack_parts=parts, runs=runs)
    ps = "".join(f", const {c_type(plan.body, i)}* restrict {pn}" for i, pn in extras)
    args = "".join(", " + pn for _, pn in extras)
    return (few + f"\n/* {gname}_rt: at most {T} rows on one thread by the few-rows kernel, else the blocked one */\n"
            f"static void {gname}_rt(const float* A, const float* B, float* C{ps}, long live)\n{{\n"
            f"    if (live <= {T} && eqf_pool_threads() == 1)\n        {gname}_few(A, B, C{args});\n"
            f"    else\n        {gname}(A, B, C{args}, live);\n}}\n")


def c_type(body: Graph, i: int) -> str:
    """The C element type of body value i (an epilogue may read masks and integers)."""
    return C_TYPE[body.nodes[i].type.dtype]


def _eptrs(body: Graph) -> dict[int, str]:
    return {i: f"eqf_e{k}" for k, i in enumerate(body.inputs)}  # names unlikely to meet the GEMM's own


def gemm_epilogue(plan: KernelPlan, groups, preset: dict[int, str], root: int | None = None, shape=None):
    """The GEMM epilogue expression (the value of `root`, by default the body's output) and the
    tensors it reads (extra parameters e<k>); `shape`: the index space of root, when it is not the
    kernel's output (a fused depthwise conv's prologue, conv_dwpw)."""
    body = plan.body
    eptrs = _eptrs(body)
    space = Space(plan.out_shape if shape is None else shape, groups, "", count())
    ex = Exprs(body, space, eptrs, preset, "", prefix="eqf_v", strides=plan.base_strides())
    expr = ex.expression(body.outputs[0] if root is None else root)
    return expr, [(i, eptrs[i]) for i in body.inputs if f"{eptrs[i]}[" in expr]


def _row_epilogue(plan: KernelPlan, groups, fname: str, pre_extras):
    """(C of `void fname(long b, long r0, long r1, float* out, extras...)`, the extras (input,
    name) that it and the GEMM epilogue read, the call the GEMM makes on the rows [eqf_r0,
    eqf_r1) of C it has just finished). The function is a row template (row_layernorm.c, row_rmsnorm.c,
    row_softmax.c) whose input row is the row of C itself (the GEMM epilogue stored the row op's
    input there); `groups` are the GEMM epilogue's index groups, "i" (the GEMM's row) becoming
    the template's row r."""
    body = plan.body
    row = plan.shape.parts.row
    rn = body.nodes[row]
    out = tuple(plan.out_shape)
    N = out[-1]
    eptrs = _eptrs(body)
    rgroups = [("r" if v == "i" else v, dims, v != "j") for v, dims, _ in groups]
    space = Space(out, rgroups, I1, count())
    epi = Exprs(body, space, eptrs, {row: "v"}, I2, forbid=_ancestors(body, rn.args[0]), prefix="eqf_v",
                strides=plan.base_strides())
    e = epi.value(body.outputs[0])
    text = "\n".join(space.decls) + epi.text() + e
    used = {i for i, _ in pre_extras} | {i for i in body.inputs if f"{eptrs[i]}[" in text} | set(rn.args[1:])
    extras = [(i, eptrs[i]) for i in body.inputs if i in used]
    params = ", ".join(["long b", "long r0", "long r1", "float* restrict out"]
                       + [f"const {c_type(body, i)}* restrict {pn}" for i, pn in extras])
    # called by one GEMM thread on rows it owns (the plan's split=rows): no parallel region of its
    # own (PARALLEL -1)
    common = {"NAME": fname, "PARAMS": params, "R0": "r0", "ROWS": "r1", "L": N, "PARALLEL": -1,
              "PRO_BODY": "", "X": "y[j]", "OFFSETS": "\n".join(space.decls + [f"{I1}(void)b;"]),
              "EPI_BODY": epi.text(), "EPI": e, "NEXT": "NULL",  # the row is C's, in cache: no prefetch
              "QUANTIZE_OUT": 0, "QUANTIZE_FLAT": 0, "QUANTIZE_BLOCK": ""}  # (C is f32: classify refuses a quantized GEMM row epilogue)
    common = with_rows_head(common, "1")  # (PARALLEL -1: the rows r0 .. r1 - 1)
    if rn.op == "softmax":
        src = render("row_softmax.c", YBASE=f"r * {N}L", YS=1, ZERO_NAN=int(rn.attr["zero_nan"]), **common)
    else:
        extra = {"GAMMA": eptrs[rn.args[1]], "EPS": flit(rn.attr["eps"]), "YBASE": f"r * {N}L", "SUM_APART": 0}
        if rn.op == "layernorm":
            extra["BETA"] = eptrs[rn.args[2]]
        src = render(f"row_{rn.op}.c", **common, **extra)
    call = f"{fname}(b, eqf_r0, eqf_r1, C{''.join(', ' + pn for _, pn in extras)});"
    return src, extras, call


def _gemm_args(plan: KernelPlan, extras) -> dict:
    """emit_gemm's arguments that come from the plan: its tiles and decisions."""
    t, d = plan.tiles, plan.detail
    return {"blocking": blocking(t), "split": d.split, "direct_b": d.direct_b,
            "direct_a": d.direct_a, "parallel": d.parallel, "extras": [(c_type(plan.body, i), pn) for i, pn in extras],
            "path": plan.precision_path, "pool": d.pool}


def emit_contraction(plan: KernelPlan) -> str:
    body, a = plan.body, plan.shape.anchor
    params, ptrs = _params(plan)
    out = tuple(plan.out_shape)
    nb = len(out) - 2
    d = plan.detail
    M, N, K, bt, at = d.M, d.N, d.K, d.b_transposed, d.a_transposed
    g = d.gemm  # how the matmul maps onto GEMM calls (plan_gemm._matmul_gemm)
    mode, Asrc, Bsrc, ast, bst = g.mode, g.a_src, g.b_src, g.a_strides, g.b_strides
    batch = out[:-2]
    nbatch = size(batch)
    if mode == "fold":  # B shared by every batch: one GEMM with M' = batch * M
        groups = [("i", list(range(nb)) + [nb], False), ("j", [nb + 1], False)]
    elif mode == "batch":
        groups = [("b", list(range(nb)), False), ("i", [nb], False), ("j", [nb + 1], False)]
    else:
        groups = [("i", [nb], False), ("j", [nb + 1], False)]
    row_call = ""
    if plan.kind == PlanKind.CONTRACTION_ROW:
        expr, extras = gemm_epilogue(plan, groups, {a: "acc"}, root=body.nodes[plan.shape.parts.row].args[0])
        row_src, extras, row_call = _row_epilogue(plan, groups, f"{plan.name}_rowop", extras)
    else:
        expr, extras = gemm_epilogue(plan, groups, {a: "acc"})
    if mode == "loop":  # the wrapper offsets every pointer for batch g; the epilogue sees one matrix
        eparts = []
        views = plan.base_strides()  # (an operand read through a view: its own strides, as the epilogue reads it)
        for i, pn in extras:
            st = bstrides(body.nodes[i].type.shape, out, views.get(i))
            eparts.append(f"{ptrs[i]} + ({offset('g', list(batch), st[:nb])})")
        aoff = f"{ptrs[Asrc]} + ({offset('g', list(batch), ast)})"
        boff_ = f"{ptrs[Bsrc]} + ({offset('g', list(batch), bst)})"
        coff = f"out + (g * {M * N})"
    else:
        eparts = [ptrs[i] for i, _ in extras]
        aoff, boff_, coff = ptrs[Asrc], ptrs[Bsrc], "out"
    gname = f"{plan.name}_gemm"
    # A B bound by params= (lower marks it only when it is one matrix for every batch, the
    # "fold" mode) is packed once: the kernel's B argument is then the panels of {gname}_prepack,
    # which the runtime makes on the first call (plan.detail.prepack tells it how).
    prepacked = d.prepack is not None
    # (or "batch" at B's stride 0: a GEMM whose rows are a dim taken at run time behind its batches,
    # eqfuse.backend.runtime_dim._rows_behind_batches)
    assert not prepacked or (mode in ("fold", "batch") and g.strides[1] == 0 and d.prepack.fn == f"{gname}_prepack")
    sa, sb, sc = g.strides
    ldc, csc = N, 1
    if plan.out_strides is not None:  # C written in place into a layout's storage (eqfuse.backend.stores)
        ldc, csc, sc = c_layout(plan, plan.out_strides)
    if d.path == "skinny":  # few rows over a bound B: the memory-bound kernel (plan_gemm.skinny)
        assert prepacked and g.batch == 1 and sc == 0 and csc == 1
        t = plan.tiles
        src, _ = emit_gemm_skinny(gname, M=g.M, N=N, K=K, lda=g.lda, ldb=g.ldb, ldc=ldc, mr=t["mr"], nr=t["nr"],
                                  pf=t["pf"], b_transposed=bt, a_transposed=at, epilogue=expr,
                                  extras=[(c_type(plan.body, i), pn) for i, pn in extras], row_epilogue=row_call,
                                  parallel=d.parallel, pack_parts=d.pack_parts, path=plan.precision_path,
                                  runs=d.runs)
    else:
        live = plan.live is not None and plan.live.what == "dim"  # rows at run time (eqfuse.backend.runtime_dim)
        src, _ = emit_gemm(gname, M=g.M, N=N, K=K, batch=g.batch, a_batch_stride=sa, b_batch_stride=sb,
                           c_batch_stride=sc, lda=g.lda, ldb=g.ldb, ldc=ldc, csc=csc, b_transposed=bt,
                           a_transposed=at, epilogue=expr, prepacked_b=prepacked, row_epilogue=row_call,
                           live_rows=live, live_stride=d.live_stride, **_gemm_args(plan, extras))
        if live:
            params += ", long live"
            eparts = eparts + ["live"]
        if d.few_rows:  # (few rows on one thread: the few-rows kernel over the same panels)
            src += "\n" + _few_rows(plan, gname, ldc, bt, expr, extras, row_call)
            gname += "_rt"
    shapes = f"{mode} batch={nbatch} M={M} N={N} K={K}" + (" (A transposed)" if at else "") + \
        (" (B transposed)" if bt else "")
    if row_call:
        shapes += f", then {d.row_op} over each finished row of C"
    wrapper = render("matmul.c", NAME=plan.name, SHAPES=shapes, GEMM=gname, PARAMS=params, OUTER=g.outer,
                     OFFSETS="        (void)g;", ARGS=", ".join([aoff, boff_, coff] + eparts))
    return (row_src + "\n" if row_call else "") + src + "\n" + wrapper


def emit_conv2d(plan: KernelPlan) -> str:
    body, a = plan.body, plan.shape.anchor
    cv = body.nodes[a]
    params, ptrs = _params(plan)
    geo = conv_geometry(plan, a)
    N, C, KH, KW, OH, OW = geo.N, geo.C, geo.KH, geo.KW, geo.OH, geo.OW
    O = cv.type.shape[1]
    d = plan.detail
    swap = d.pixels_as_rows  # the GEMM's rows are pixels, its columns channels (plan_gemm.pixels_as_rows)
    ch, px = ("j", "i") if swap else ("i", "j")
    groups = [("b", [0], False), (ch, [1], False), (px, [2, 3], False)]
    # the conv's own bias belongs to the anchor value: acc + bias[channel]
    anchor = f"(acc + eqf_e{plan.body.inputs.index(cv.args[2])}[{ch}])" if len(cv.args) == 3 else "acc"
    expr, extras = gemm_epilogue(plan, groups, {a: anchor})
    if len(cv.args) == 3 and cv.args[2] not in dict(extras):
        extras.append((cv.args[2], f"eqf_e{plan.body.inputs.index(cv.args[2])}"))
        extras.sort(key=lambda t: plan.body.inputs.index(t[0]))
    K, P = C * KH * KW, OH * OW
    gname = f"{plan.name}_gemm"
    g = d.gemm
    ldc, csc, sc = P, 1, O * P  # C = out: channels x pixels per image
    if plan.out_strides is not None:  # C written in place into a layout's storage (eqfuse.backend.stores)
        ldc, csc, sc = conv_c_layout(plan, plan.out_strides)
    if swap:  # C^T = col^T . W^T: pixels x channels, stored transposed into out
        assert (g.M, g.batch, g.strides) == (P, N, (K * P, 0, O * P)), "the plan's GEMM is this conv's"
        assert d.prepack is None or d.prepack.fn == f"{gname}_prepack"
        src, _ = emit_gemm(gname, M=P, N=O, K=K, batch=N, a_batch_stride=K * P, b_batch_stride=0, c_batch_stride=sc,
                           lda=P, ldb=K, ldc=csc, csc=ldc, a_transposed=True, b_transposed=True, epilogue=expr,
                           prepacked_b=d.prepack is not None, **_gemm_args(plan, extras))
        args = ["col", ptrs[cv.args[1]], "out"] + [ptrs[i] for i, _ in extras]
    else:
        assert (g.M, g.batch, g.strides) == (O, N, (0, K * P, O * P)), "the plan's GEMM is this conv's"
        image = geo if d.implicit else None  # (B the padded images: no column matrix)
        src, _ = emit_gemm(gname, M=O, N=P, K=K, batch=N, a_batch_stride=0,
                           b_batch_stride=geo.C * geo.in_rows(geo.OH) * geo.in_cols(geo.OW) if image else K * P,
                           c_batch_stride=sc,
                           lda=K, ldb=P, ldc=ldc, csc=csc, b_transposed=False, epilogue=expr, image=image,
                           **_gemm_args(plan, extras))
        args = [ptrs[cv.args[1]], "col", "out"] + [ptrs[i] for i, _ in extras]
    wrapper = render("conv2d.c", NAME=plan.name, PARAMS=params, X=ptrs[cv.args[0]],
                     O=O, **geo.shape_c(), IM2COL=int(d.im2col), IMPLICIT=int(d.implicit),
                     HP=geo.in_rows(geo.OH), WP=geo.in_cols(geo.OW), GEMM=gname, ARGS=", ".join(args), PARALLEL=int(plan.detail.parallel))
    return src + "\n" + wrapper


