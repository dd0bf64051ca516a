"""Planning the GEMM kernels: a matmul or conv2d with a fused epilogue (and a row epilogue).

`gemm_tiles` is the one place the GEMM blocking is chosen: the plan's tiles are the constants
of csrc_templates/gemm.c (emit_gemm writes them and decides nothing). The uop schedule follows
that template's loop order, pc (KC slices of K) > row chunks (MC) > jc (NC columns) > MR-row
tiles > NR-column panels, and its counts are those of one call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from eqfuse.backend.indexing import contiguous, joint_groups, view_strides
from eqfuse.backend.kinds.contraction.conv_geometry import ConvGeometry, conv_geometry
from eqfuse.backend.plan import (
    KernelPlan,
    UOp,
    computes_f32,
    not_ancestors,
    ops_text,
    pointwise_flops,
    size,
)
from eqfuse.ir.kernels import F32, row_epilogue_fits
from eqfuse.ir.kernels import K as Kind
from eqfuse.ir.ops import OPS
from eqfuse.machine import Machine, bf16_peak_ratio, gemm_blocking, register_tile, skinny_tile


@dataclass(frozen=True)
class GemmCalls:
    """How a contraction maps onto calls of the GEMM (csrc_templates/gemm.c, eqfuse.backend.kinds.contraction.emit_gemm)."""

    mode: str  # "fold" (one GEMM over every batch's rows), "batch" (one call, a stride per operand),
    #            "loop" (the wrapper calls the GEMM once per batch) or "conv" (one call per image)
    M: int  # rows of one GEMM (fold: batch x M)
    batch: int  # batches inside one call
    outer: int  # calls the wrapper makes
    strides: tuple[int, int, int]  # batch strides of A, B and C inside one call
    a_src: int | None = None  # the body inputs A and B are read from (a matmul's)
    b_src: int | None = None
    a_strides: tuple[int, ...] = ()  # their batch strides over the result's batch axes
    b_strides: tuple[int, ...] = ()
    lda: int = 0
    ldb: int = 0


@dataclass(frozen=True)
class Prepack:
    """A B bound by params= packed once (the runtime calls `fn` at the first call): the body
    input position `arg`, the packing function and the function giving its size in floats."""

    arg: int
    fn: str
    floats: str


@dataclass(frozen=True)
class GemmDetail:
    """The plan of a GEMM kind (contraction, contraction_row, conv2d): what emit_gemm writes."""

    M: int  # the matmul's rows, columns and depth (conv2d: O, OH x OW, C x KH x KW)
    N: int
    K: int
    batch: int  # the result's batches (conv2d: images)
    a_transposed: bool  # A (B) given transposed: columns in memory
    b_transposed: bool
    gemm: GemmCalls
    direct_b: bool  # the micro-kernel reads B in place (`direct`)
    split: str  # "rows": threads split whole rows (a row epilogue); "auto" (`thread_rule`)
    parallel: bool  # each GEMM call opens a parallel region (`parallel`)
    pool: bool = False  # ... or runs its column panels on the claim-based pool (`amx_few_rows`)
    row_op: str | None = None  # contraction_row: softmax, layernorm or rmsnorm
    prepack: Prepack | None = None  # B bound by params=, packed once (kinds.contraction.mark_bound_b)
    # conv2d: the GEMM's rows are the output pixels and its columns the output channels (C is
    # the result transposed, A the column matrix, B the weights), when there are fewer pixels
    # than channels (`pixels_as_rows`)
    pixels_as_rows: bool = False
    # "blocked": csrc_templates/gemm.c; "skinny": few rows over a bound B, the memory-bound
    # csrc_templates/gemm_skinny.c (`skinny`; its tiles are mr, nr, groups, pf)
    path: str = "blocked"
    direct_a: bool = False  # the micro-kernel reads A in place, not packed (`direct_a`): gemm.c's DIRECT_A
    pack_parts: int = 0  # skinny path: A packed by the pool in this many parts of K (`skinny_pack_parts`)
    runs: bool = False  # skinny path: each thread's panels one contiguous run (`skinny_runs`)
    im2col: bool = False  # conv2d: the column matrix is built (False: a 1x1, stride-1, unpadded conv reads x; implicit)
    # conv2d on AMX tiles, im2col and not pixels_as_rows: B's panels are packed from the image, the
    # column matrix never built (`implicit_im2col`)
    implicit: bool = False
    # rows a dim at run time behind a batch (eqfuse.backend.runtime_dim): the fold's rows are
    # batches of this many, of which each batch's first `live` are computed (gemm.c's AROW); 0: none
    live_stride: int = 0
    # rows a dim at run time, leading (runtime_dim): a call of at most this many rows on one thread
    # runs the few-rows kernel compiled at this many over the same panels (`few_rows_plan`); 0: never
    few_rows: int = 0
    few: tuple = ()  # ... its tiles and rules: (mr, pf, parallel, pack_parts, runs)


DIRECT_MAX_TILES = 32  # B read in place up to this many MR-row tiles (see `direct`)
DIRECT_MIN_NR = 64  # ... and only with panels this wide (or one panel in all)
# Below this many multiply-adds per call a kernel of the contraction and attention kinds runs on
# the calling thread with no parallel region (the pointwise and row kernels' PARALLEL_MIN rule):
# 2^18 FMAs are worth a few fork/joins on quiet cores, and a fork/join costs up to milliseconds
# when another process holds the other core (issue 12; benchmarks/bench_load.py).
PARALLEL_MIN_FMAS = 1 << 18
# ... and a GEMM or a conv as a GEMM (`parallel`: the blocked GEMM's OpenMP region) below this
# many. Its region after a stretch of one-thread kernels wakes an OpenMP worker that has gone to
# sleep (GOMP_SPINCOUNT, eqfuse.backend.cbuild), which on some VMs cost more than half of a GEMM
# of under 2^20 multiply-adds: the tiny ViT's and MLP-Mixer's GEMMs of 400K multiply-adds and
# their patch conv ran two to three times as long on 2 threads as on 1, the whole call slower than
# on one thread (`benchmarks/bench_models.py --model vit --model mixer`). The few-rows GEMMs on
# the claim-based pool have their own bar (SKINNY_PARALLEL_MIN).
GEMM_PARALLEL_MIN_FMAS = 1 << 20


def parallel(M: int, N: int, K: int, batch: int) -> bool:
    """Whether a GEMM of batch x M x N x K opens a parallel region (GEMM_PARALLEL_MIN_FMAS)."""
    return M * N * K * batch >= GEMM_PARALLEL_MIN_FMAS


def cdiv(a: int, b: int) -> int:
    return -(-a // max(b, 1))


def bf16_path(m: Machine) -> str:
    """The instruction path of a bf16 GEMM on machine m: "avx512_bf16" (vdpbf16ps on K-pairs,
    f32 accumulation) where the CPU has AVX512_BF16, else "fallback" (bf16 weights widened to f32
    by a shift, f32 FMA: the same bf16 operands, half the weight bytes). The convs, attention and
    the few-rows GEMM take this path; the blocked GEMM may take AMX tiles (gemm_bf16_path)."""
    return "avx512_bf16" if m.avx512_bf16 and m.simd_floats >= 16 else "fallback"


def bf16_pays(m: Machine, path: str | None = None) -> bool:
    """Whether a compute-bound kernel asked for bf16 (a blocked GEMM, a conv, an attention of
    several query rows) multiplies in bf16 on machine m, on instruction path `path` (bf16_path's
    by default): where that path multiplies faster than the f32 FMA (machine.bf16_peak_ratio above
    1: AMX tiles; vdpbf16ps where it issues as often as the FMA), yes. Elsewhere, no, and the
    kernel computes in f32 (f32_reason says why):
    - on the fallback path bf16 only halves the bytes of the weights, which such a kernel reads
      from the caches many times a call, while it pays the widening of each weight vector and the
      rounding of its activations and loses f32 tiles the bf16 layout has no counterpart of (the
      direct conv's pixel tiles);
    - where vdpbf16ps issues more rarely than the FMA (Machine.bf16_dot_ratio), its two
      multiply-adds a lane do no more work a cycle than f32 FMAs, and the rounding of the
      operands is added work.
    The few-rows GEMM over weights larger than L2, whose time is their stream, keeps bf16
    (plan_skinny), and so does a decode step's KV cache (eqfuse.backend.live).
    benchmarks/bench_models.py --precision bf16 measures both choices on such a CPU, and
    benchmarks/bench_bf16_fallback.py the few-rows GEMM's by the size of its weights;
    Machine.bf16_fallback_all keeps every kernel in bf16."""
    return bf16_peak_ratio(m, path or bf16_path(m)) > 1 or m.bf16_fallback_all


NO_BF16_MULTIPLY = "this CPU has no bf16 multiply (AVX512_BF16, AMX)"
SLOW_BF16_DOT = "this CPU's vdpbf16ps multiplies no faster than its f32 FMAs (Machine.bf16_dot_ratio)"
FALLBACK_F32 = (f"{NO_BF16_MULTIPLY}: bf16 would only halve the bytes of weights packed once, and this kernel's time "
                "is not their stream, so it would gain nothing and pay their widening; it computes in f32 "
                "(docs/precision.md, \"Without a bf16 multiply\")")
SLOW_DOT_F32 = (f"{SLOW_BF16_DOT}, and this kernel has no AMX path: bf16 would gain nothing and add the rounding of its "
                "operands; it computes in f32 (docs/precision.md, \"Where vdpbf16ps is slow\")")


def why_not_bf16(m: Machine) -> str:
    """Why bf16 does not pay on machine m's vdpbf16ps-or-fallback path (bf16_path), in a clause."""
    return NO_BF16_MULTIPLY if bf16_path(m) == "fallback" else SLOW_BF16_DOT


def f32_reason(m: Machine, path: str | None = None) -> str:
    """The note of a compute-bound kernel that computes in f32 under precision="bf16" because bf16
    does not pay on path `path` (bf16_pays)."""
    return FALLBACK_F32 if (path or bf16_path(m)) == "fallback" else SLOW_DOT_F32


def narrow_f32(N: int, m: Machine) -> str:
    """Why a matmul GEMM of N output columns computes in f32 under precision="bf16" (empty: it
    need not). At most one vector of columns (a classifier head: an MLP's 10 outputs, a model's
    few labels), bf16 gains no time: the K-pair panels still pad N to a vector, and the blocked
    GEMM of 256 x 1024 x 10 ran slower in bf16 than in f32 (benchmarks/RESULTS.md, "bf16 and
    int8 on a CPU with AVX512_BF16 and VNNI"). Such a GEMM's outputs are usually the model's own, and
    in f32 they lose no digits to rounded operands (docs/precision.md)."""
    if N > m.simd_floats:
        return ""
    return (f"{N} output columns, at most one vector: bf16 gains no time on so narrow a GEMM, so it keeps f32's "
            "accuracy (docs/precision.md, \"Narrow GEMMs\")")


def computes_as_wanted(plan: KernelPlan, m: Machine, path: str) -> bool:
    """Set a compute-bound kernel's precision (KernelPlan.precision): bf16 on `path` where it was
    asked for and pays on machine m (bf16_pays), else f32, with f32_reason as the note where
    bf16 was asked for. Whether it computes in bf16."""
    bf16 = plan.wanted_precision == "bf16" and bf16_pays(m, path)
    if bf16:
        plan.precision, plan.precision_path, plan.precision_note = "bf16", path, ""
    else:
        computes_f32(plan, f32_reason(m, path))
    return bf16


# The AMX-BF16 blocked GEMM (csrc_templates/gemm.c, BF16 3): the 8 tiles of palette 1, each 16
# rows of 64 bytes, as 2 x 2 C tiles of 16 x 16 f32 (the AMX_MR x AMX_NR register tile), two A
# tiles of 16 rows x 32 bf16 and two B tiles of 16 K-pairs x 16 columns. K goes through the tiles
# in blocks of AMX_KB (one A tile row): each slice's depth in the panels is padded to whole blocks.
AMX_MR, AMX_NR, AMX_KB = 32, 32, 32
BF16 = 2  # bytes of a bf16


def gemm_bf16_path(m: Machine) -> str:
    """The instruction path of a blocked bf16 GEMM (matmul, im2col conv) on machine m: "amx_bf16"
    (tdpbf16ps on tiles, f32 accumulation) where it has AMX-BF16 besides AVX512_BF16 (whose
    vcvtne2ps2bf16 the packing rounds with, and which every CPU with AMX-BF16 has), else bf16_path's."""
    path = bf16_path(m)
    return "amx_bf16" if path == "avx512_bf16" and m.amx_bf16 else path


def bf16_texts(path: str) -> dict[str, str]:
    """What the uop schedule says of a GEMM's operands and micro-kernel on an instruction path."""
    if path == "avx512_bf16":
        return {"a": "converted to bf16 K-pairs (vcvtne2ps2bf16, round to nearest even)",
                "b": "bf16 K-pairs [kc/2][nr][2]", "op": "vdpbf16ps (bf16 K-pairs, f32 accumulation)"}
    if path == "fallback":
        return {"a": "rounded to bf16 (held as f32)", "b": "bf16 [kc][nr]",
                "op": "FMA on bf16 B widened to f32 by a shift (no AVX512_BF16)"}
    if path == "amx_bf16":
        return {"a": f"converted to bf16 rows of whole {AMX_KB}-element K blocks (16 x {AMX_KB} A tiles)",
                "b": "bf16 K-pairs [kc/2][nr][2] (16 K-pairs x 16 columns a B tile)",
                "op": "tdpbf16ps on 2 x 2 C tiles of 16 x 16 f32 (AMX-BF16)"}
    return {"a": "", "b": "", "op": "FMA"}


# A bf16 GEMM's deepest K slice (vdpbf16ps): twice f32's cap (machine.gemm_blocking's 512), the same
# bytes of A per row, as far as the A micro-panel fits half of L1. A multiply-add per K-pair does
# twice f32's work per instruction, so a slice as deep as f32's would pay twice as often for its
# pass over C: on one thread 1024^3 ran 10-13% faster in one slice of 1024 than in f32's four of
# 256 (and than in two of 512), 128 x 768 x 3072 in three slices of 1024 than in four of 768 or
# two of 1536, 128 x 3072 x 768 and 256 x 3072 x 768 in one slice than in three of 256
# (`benchmarks/bench_gemm.py --precision bf16`; benchmarks/RESULTS.md, 2026-12-02)
BF16_KC = 1024


def gemm_tiles(M: int, N: int, K: int, m: Machine, even_kc: bool = False, a_bytes: int = F32) -> dict[str, int]:
    """MR, NR, KC, MC, NC of one M x N x K GEMM on machine m (machine.gemm_blocking's rules).

    The register tile narrows for few columns (machine.register_tile). A K up to half again
    KC is done in one slice, a deeper one in equal slices: every slice but the last costs a pass
    over C, a thin last slice would be almost all cost. Should the A micro-panel MR x KC then
    not fit half of L1 (`gemm_checks`), K is cut into more slices. No block is larger than the
    problem needs (smaller packing buffers). One slice of K = 768 (KC 512 on a 48 KiB L1, so NC
    128) measured slightly faster than two of 384 (NC 320), one thread, B prepacked
    (`benchmarks/bench_gemm.py --peers --only 128x768x768,256x3072x768 --threads 1`).
    `even_kc`: K slices of whole K-pairs (a bf16 GEMM's: only the last slice may be odd).
    `a_bytes`: the bytes of an element of the packed A, BF16 on the vdpbf16ps path (whose K slices
    are deeper, as BF16_KC says), F32 elsewhere (the bf16 fallback holds A rounded, as f32).
    """
    mr, nr = register_tile(m.simd_floats, N)
    if a_bytes == BF16:
        kc = min(BF16_KC, (m.l1 // 2) // (mr * BF16) // 8 * 8)
    else:
        kc = gemm_blocking(m, mr, nr)[2]
    slices = 1 if K <= kc * 3 // 2 else cdiv(K, kc)
    kc = cdiv(K, slices)
    while mr * kc * a_bytes > m.l1 // 2 and kc > 8:
        slices += 1
        kc = cdiv(K, slices)
    if even_kc and kc < K and kc % 2:
        kc += 1
    mc, nc, kc, mr, nr = gemm_blocking(m, mr, nr, kc)
    return {"mr": mr, "nr": nr, "kc": min(kc, K), "mc": min(mc, cdiv(M, mr) * mr), "nc": min(nc, cdiv(N, nr) * nr)}


def amx_tiles(M: int, N: int, K: int, m: Machine) -> dict[str, int]:
    """MR, NR, KC, MC, NC of one M x N x K GEMM on AMX tiles (gemm_bf16_path "amx_bf16").

    The register tile is the tiles' own, AMX_MR x AMX_NR. K is one slice as deep as the B panel
    allows (amx_kc_top): the C tiles then stay in the tile registers over all of K and reach C once,
    through the epilogue, instead of once per slice as partial sums read back and added. The A
    micro-panel (MR x KC bf16) no longer fits L1 at such depths; each tile load of it serves two
    tdpbf16ps, so reading it from L2 costs less than C's round trips did (`python
    benchmarks/bench_gemm.py --precision bf16`, its 1024^3 and BERT rows, against slices deep
    enough for L1). A deeper K is cut into equal slices of whole AMX_KB blocks (only the last may
    end in part of one, padded by zeros in the panels); so is the K of a GEMM of few rows (at most
    AMX_WHOLE_M) whose A block would not hold them all at that depth. NC makes the B panel (KC x
    NC bf16) half of L2. Every B micro-panel sweeps all of the A block (gemm.c's JR_OUTER), so MC makes the A
    block (MC x KC bf16) 1 / AMX_A_L2_SHARE of L2."""
    top = amx_kc_top(m)
    kc = K if K <= top else cdiv(cdiv(K, cdiv(K, top)), AMX_KB) * AMX_KB
    rows, share = cdiv(M, AMX_MR) * AMX_MR, m.l2 // AMX_A_L2_SHARE
    if rows <= AMX_WHOLE_M and rows * cdiv(kc, AMX_KB) * AMX_KB * BF16 > share:
        deepest = max(AMX_KB, share // (rows * BF16) // AMX_KB * AMX_KB)  # (an A block of all the rows)
        kc = cdiv(cdiv(K, cdiv(K, deepest)), AMX_KB) * AMX_KB
    depth = cdiv(kc, AMX_KB) * AMX_KB  # (of the panels)
    nc = max(AMX_NR, (m.l2 // 2) // (depth * BF16) // AMX_NR * AMX_NR)
    mc = max(AMX_MR, (m.l2 // AMX_A_L2_SHARE) // (depth * BF16) // AMX_MR * AMX_MR)
    return {"mr": AMX_MR, "nr": AMX_NR, "kc": kc, "mc": min(mc, cdiv(M, AMX_MR) * AMX_MR),
            "nc": min(nc, cdiv(N, AMX_NR) * AMX_NR)}


# The share of L2 an AMX GEMM's A block fills (amx_tiles' MC): the A block is read again for every
# B micro-panel, beside the micro-panel and the C tiles' lines; a quarter was the fastest of 1/8 to
# 2 L2s (`python benchmarks/bench_gemm.py --precision bf16`, its 1024^3 row; the figures in
# benchmarks/RESULTS.md, 2026-12-04).
AMX_A_L2_SHARE = 4

# The most rows of a GEMM on AMX tiles whose K is cut into slices shallow enough for an A block
# (1 / AMX_A_L2_SHARE of L2) to hold them all, where one slice of all of K would hold only part:
# every B panel is then read once a call, not once per block of rows. BERT-base's FFN2 (128 x 3072
# x 768 + layer norm) in two slices of 1536 and one block of 128 rows, rather than one slice and two
# blocks of 64, made the model faster on one thread, warm or after another model's call, and
# level on two (`python benchmarks/bench_models.py --precision bf16 --model bert-base`; the figures
# in benchmarks/RESULTS.md, 2026-12-04). Larger M is not measured.
AMX_WHOLE_M = 4 * AMX_MR

# The fewest B micro-panels (of AMX_NR columns) an AMX B panel holds at the deepest K slice: a
# panel that is the slice's depth x AMX_MIN_PANELS x AMX_NR bf16 fills half of L2.
AMX_MIN_PANELS = 4


def amx_kc_top(m: Machine) -> int:
    """The deepest K slice of an AMX GEMM on machine m, in whole AMX_KB blocks: the depth at which a
    B panel of AMX_MIN_PANELS micro-panels fills half of L2 (4096 with a 2 MiB L2)."""
    return max(AMX_KB, (m.l2 // 2) // (AMX_MIN_PANELS * AMX_NR * BF16) // AMX_KB * AMX_KB)


def blocking(t: dict[str, int]) -> tuple[int, int, int, int, int]:
    """emit_gemm's `blocking` (MC, NC, KC, MR, NR) of the tiles gemm_tiles gives."""
    return t["mc"], t["nc"], t["kc"], t["mr"], t["nr"]


def gemm_checks(t: dict[str, int], m: Machine, eb: int = F32) -> list[tuple[str, bool]]:
    """The cache constraints the blocking targets (machine.gemm_blocking), each (text, holds), for
    packed elements of eb bytes."""
    a_micro, b_panel, a_block = (t["mr"] * t["kc"] * eb, t["kc"] * t["nc"] * eb, t["mc"] * t["kc"] * eb)
    return [(f"A micro-panel mr x kc = {a_micro} B <= L1/2 {m.l1 // 2} B (stays in L1 while B streams)",
             a_micro <= m.l1 // 2),
            (f"B panel kc x nc = {b_panel} B <= L2/2 {m.l2 // 2} B", b_panel <= m.l2 // 2),
            (f"A block mc x kc = {a_block} B <= 2 L2 {2 * m.l2} B (held in L3)", a_block <= 2 * m.l2)]


def direct(M: int, N: int, b_transposed: bool, mr: int, nr: int) -> bool:
    """Whether the micro-kernel reads B where it is (row stride ldb) instead of packed panels.

    With few rows, packing B costs about as much as the products: every B element is read from
    memory and written to the panel for only ceil(M / MR) uses, and the packing and the
    micro-kernel run one after the other; read in place, the B stream from memory overlaps the
    FMAs. Measured on one thread (relu(x @ w + b), `benchmarks/bench_gemm.py --peers --threads 1`),
    in place gains most at 8 rows and less with each doubling, to even at 512: so up to 32 MR
    tiles. A transposed B (N x K) is
    always packed: its k-major rows are what the packing makes. A last panel narrower than NR
    is packed either way (zero padded).
    Only with panels of at least DIRECT_MIN_NR columns, or B one panel wide: a narrower panel
    read in place takes one cache line from each of kc rows of B a whole row apart, which map
    to a few L1 sets (a row of 768 or 3072 floats is a multiple of 1 KiB), so they evict one
    another. AVX2's 6x16 tile (one thread) was slower in place at 32 x 3072 x 768 and 8 x 3072 x
    768, even at 128 x 768 x 768 (`benchmarks/bench_gemm.py --machine avx2`)."""
    return not b_transposed and cdiv(M, mr) <= DIRECT_MAX_TILES and (nr >= DIRECT_MIN_NR or N <= nr)


def direct_a(a_transposed: bool) -> bool:
    """Whether the micro-kernel reads A where it is (MR rows at the row stride, each element
    broadcast from its row, as MLAS's kernels do) instead of MR-row panels packed per K slice.
    Packing A is a strided transposition that the FMAs wait for: it cost a few percent of
    128 x 768 x 768 and 256 x 768 x 3072 (one thread, B prepacked:
    `benchmarks/bench_gemm.py --peers --only 128x768x768,256x768x3072 --threads 1`).
    A given transposed (K x M) is packed: its MR rows of one k are what the panel holds."""
    return not a_transposed


SKINNY_MAX_M = 32  # rows up to which a GEMM over a bound B takes the skinny path (`skinny`)
# ... except on AMX tiles from this many rows (`amx_few_rows`)
AMX_FEW_ROWS_MIN = 8
# Rows up to which such a GEMM on AMX tiles runs its column panels on the claim-based pool (gemm.c
# POOL; past them, the blocked GEMM's OpenMP region). Where the pool's worker has no core when a
# call starts (other runtimes' or OpenMP's threads spinning there), the caller runs every range
# itself: 1024^3 and 256 x 768 x 3072 on two threads, each call beside another kernel's, ran on
# the pool no faster than on one thread, and took half the time in the region; BERT-base's
# 128-row GEMMs ran alike either way (`python benchmarks/bench_gemm.py --precision bf16
# --threads 1,2`, `python benchmarks/bench_models.py --precision bf16 --model bert-base`;
# benchmarks/RESULTS.md, 2026-12-04).
AMX_POOL_MAX_M = SKINNY_MAX_M
SKINNY_PF = 1024  # its software prefetch distance in floats, 4 KiB ahead of the FMAs (see `skinny`)
# Below this many multiply-adds a skinny GEMM runs on the calling thread. Waking a pool worker
# and sharing a few panels cost more than they save there: GPT-2's test GEMMs (32 x 192 x 64,
# 393K multiply-adds) were slower on 2 threads than on 1; the MLP's (8 x 1024 x 784, 6.4M) gain
# (benchmarks/bench_models.py --model gpt2 --model mlp).
SKINNY_PARALLEL_MIN = 1 << 21
# ... unless its packed B is this many bytes or more: then it streams from memory (a decode step's
# weights, read once a step, are far past the last-level cache), the time is that of the stream,
# and two cores keep twice the cache misses in flight. A 768 x 768 weight of a GPT-2-small
# decode step (2.4 MB f32, 1.2 MB bf16; 590K multiply-adds at one row) streams for many times
# as long as the pool's workers, held by the run function between kernels, take to start a job
# (`benchmarks/bench_skinny.py` measures both: its fixed cost of a call over two panels).
SKINNY_PARALLEL_BYTES = 1 << 20


def skinny_parallel(M: int, N: int, K: int, element_bytes: int) -> bool:
    """Whether a skinny GEMM may share its panels among the pool's threads: enough multiply-adds
    (SKINNY_PARALLEL_MIN), or a packed B long enough to stream from memory (SKINNY_PARALLEL_BYTES)."""
    return M * N * K >= SKINNY_PARALLEL_MIN or K * N * element_bytes >= SKINNY_PARALLEL_BYTES


SKINNY_PACK_MIN = 8192  # floats of A from which the pool's threads pack it (`skinny_pack_parts`)
SKINNY_PACK_K = 256  # ... in parts of at least this many k (at most SKINNY_PACK_PARTS a group)
SKINNY_PACK_PARTS = 4


def skinny_pack_parts(M: int, K: int, parallel: bool) -> int:
    """How csrc_templates/gemm_skinny.c packs A: 0 on the calling thread, else as chunks of the
    claim-based pool, in this many parts of K per group of MR rows.

    Every panel reads all of A, so A is packed in full before the first panel starts, and packed
    by the caller alone it is the part of the call that does not scale: on 2 threads in BERT-base
    at sequence 32, the first panel began about a tenth into a 32 x 768 x 768 or a 32 x 3072 x 768
    call (A, written by both threads' panels of the kernel before, half in the other core's cache;
    `benchmarks/bench_models.py --model bert-base`). Split below SKINNY_PACK_MIN floats, the parts would cost
    more in claims than they save."""
    if not parallel or M * K < SKINNY_PACK_MIN:
        return 0
    return max(1, min(SKINNY_PACK_PARTS, K // SKINNY_PACK_K))


# From this many panels a parallel skinny GEMM gives each thread one contiguous run of them
# (`skinny_runs`); with fewer, one panel a thread is already all a run could be.
SKINNY_RUNS_MIN_PANELS = 4


def skinny_runs(parallel: bool, panels: int) -> bool:
    """Whether a skinny GEMM's threads each stream one contiguous run of its panels (thread t of T
    the panels [t P / T, (t + 1) P / T), in order, then the others' left over one at a time from
    the back of their runs: common_pool.h, eqf_runs_claim) instead of claiming the next panel in
    turn. Claimed in turn, two threads' panels alternate: each thread's read of B jumps by a
    panel (K x NR elements) after every panel, and the hardware prefetcher, the only one on a CPU
    whose Machine.prefetch is off, begins each panel's stream from cold; in runs each thread's
    read is one sequential stream, as STREAM's static split is, while a worker that another
    process keeps off its core still holds the call up by one panel at most
    (`benchmarks/bench_skinny.py --threads 2 --split runs --split turns`)."""
    return parallel and panels >= SKINNY_RUNS_MIN_PANELS


def skinny(M: int, N: int, K: int, m: Machine) -> bool:
    """Whether a GEMM of M x N x K whose B is bound (prepacked) runs csrc_templates/gemm_skinny.c.

    With few rows the GEMM is the stream of B: each element is used M times only, and at the
    bandwidth of L3 or memory, blocking and packing are overhead.
    The skinny kernel reads B as one sequential stream of full-K panels, keeps all of a group's
    rows in registers over all of K and stores C once, through the epilogue. Measured on one
    thread, B prepacked in L3, skinny against blocked (`benchmarks/bench_gemm.py --small`): the
    skinny kernel wins most at 1 to 16 rows, less at 32 and 64 (from 16 rows on both run near
    the FMA peak). So up to SKINNY_MAX_M rows, and only while a group's B panel
    (K x NR) stays in L2 for the groups after the first.
    Software prefetch 4 KiB ahead (SKINNY_PF) pays where the stream alone sets the pace, up to
    4 rows; with 8 and 16 rows, at the FMA peak, it is even (`benchmarks/bench_gemm.py --small`).
    On some CPUs the same prefetch costs time at one row, so it is per CPU (Machine.prefetch).
    """
    mr, nr = skinny_tile(m.simd_floats, M)
    return M <= SKINNY_MAX_M and (cdiv(M, mr) == 1 or K * nr * F32 <= m.l2)


def amx_few_rows(plan: KernelPlan, M: int) -> bool:
    """Whether a few-rows GEMM over a bound B planned on AMX tiles stays on the blocked AMX GEMM (its
    B panels prepacked in bf16) rather than taking the skinny kernel: from AMX_FEW_ROWS_MIN rows.
    A tile's 16 x 16 x 32 multiply-adds take 16 cycles however few of its rows are real, so the
    tiles keep up with the stream of B where the skinny kernel, with no AMX path and a slow
    vdpbf16ps on such a CPU, multiplies with the FMA: at 8 rows it was faster on every shape
    measured (784-4096 x 768-4096, one and two threads), at 1-4 rows slower on one thread
    (`python benchmarks/bench_models.py --precision bf16 --model mlp`, the kernels by
    eqfuse.runtime.profile; the shapes' table in benchmarks/RESULTS.md, 2026-12-04).
    EQFUSE_AMX_FEW_ROWS=0|1 forces either."""
    force = os.environ.get("EQFUSE_AMX_FEW_ROWS", "").strip()
    if plan.precision_path != "amx_bf16" or force == "0":
        return False
    return force == "1" or M >= AMX_FEW_ROWS_MIN


def skinny_tiles(M: int, N: int, m: Machine, path: str = "f32") -> dict[str, int]:
    """MR, NR (machine.skinny_tile; no wider than N in whole vectors, for a few columns), the
    groups of MR rows and the prefetch distance (0: none, on a CPU whose Machine.prefetch is off),
    for the precision path (`path`: "f32" or bf16's).

    The bf16 fallback's stream is prefetched on every CPU: it widens its panels before the FMAs,
    so its loop has more instructions per line of the stream, the out-of-order window runs fewer
    lines ahead, and the software prefetch pays even where the f32 stream goes without it
    (`benchmarks/bench_decode_profile.py --precision f32 --precision bf16`; benchmarks/RESULTS.md,
    "The bf16 fallback's stream prefetched")."""
    mr, nr = skinny_tile(m.simd_floats, M)
    nr = min(nr, cdiv(N, m.simd_floats) * m.simd_floats)
    pf = SKINNY_PF if m.prefetch or path == "fallback" else 0
    return {"mr": mr, "nr": nr, "groups": cdiv(M, mr), "pf": pf}


def few_rows_plan(plan: KernelPlan, capacity: int, m: Machine) -> None:
    """For a blocked f32 GEMM whose rows are a dim taken at run time, leading (runtime_dim), and
    whose B is prepacked in one K slice: the most rows T (up to SKINNY_MAX_M and the capacity) for
    which the few-rows kernel would be chosen (`skinny`) with the blocked kernel's NR, so that its
    panels are the blocked ones (both [panel][k][NR] when KC >= K), in one group of rows (B
    streamed once: T rows cost what fewer do, and the kernel computes all T); a call of at most T
    rows on one thread then runs it (detail.few_rows), as a compile at that length would.
    The blocked kernel at 7 rows streamed B 1.14x as long (`benchmarks/bench_sequence.py --model
    bert-base --lengths 7`, with eqfuse.runtime.profile)."""
    d, t = plan.detail, plan.tiles
    if (d.path != "blocked" or d.prepack is None or plan.precision_path != "f32" or d.a_transposed
            or d.gemm.mode != "fold" or d.gemm.batch != 1 or t["kc"] < d.K
            or (plan.out_strides is not None and plan.out_strides[-1] != 1)):
        return
    rows = [r for r in range(1, min(SKINNY_MAX_M, capacity) + 1)
            if skinny(r, d.N, d.K, m) and skinny_tiles(r, d.N, m)["nr"] == t["nr"] and skinny_tiles(r, d.N, m)["groups"] == 1]
    if not rows:
        return
    T = max(rows)
    st = skinny_tiles(T, d.N, m)
    par = skinny_parallel(T, d.N, d.K, F32)
    plan.detail = replace(d, few_rows=T, few=(st["mr"], st["pf"], par, skinny_pack_parts(T, d.K, par),
                                              skinny_runs(par, cdiv(d.N, st["nr"]))))


def plan_skinny(plan: KernelPlan, m: Machine) -> None:
    """Replan a matmul GEMM over a bound B (detail.prepack set, the "fold" mode) for the
    skinny path: its tiles, the thread rule and the uop schedule of csrc_templates/gemm_skinny.c."""
    d = plan.detail
    M, N, K = d.gemm.M, d.N, d.K
    if plan.precision_path == "amx_bf16":  # (few rows: a group of at most 16 would fill an A tile in part)
        if bf16_pays(m):
            plan.precision_path = bf16_path(m)
            plan.precision_note = "few rows: the memory-bound few-rows GEMM, on vdpbf16ps (AMX tiles: the blocked GEMM)"
        else:  # (vdpbf16ps slow: decided below, as on such a CPU without AMX)
            plan.precision, plan.precision_path = "f32", "f32"
    if plan.wanted_precision == "bf16" and plan.precision == "f32" and not bf16_pays(m) and not narrow_f32(N, m):
        # weights past L2 come from L3 or memory each call: that stream is its time, and bf16
        # halves it, so bf16 on the fallback path too (where vdpbf16ps multiplies no faster than
        # the FMA, its widening at the FMA's rate beats vdpbf16ps); weights within L2 are read
        # faster than their FMAs run, and the widening would only add work
        # (benchmarks/bench_bf16_fallback.py; `python benchmarks/bench_models.py --precision bf16
        # --model mlp` on a CPU whose vdpbf16ps is slow)
        if K * N * F32 > m.l2:
            plan.precision, plan.precision_path = "bf16", "fallback"
            plan.precision_note = "" if bf16_path(m) == "fallback" else (
                f"few rows: the memory-bound few-rows GEMM; {SLOW_BF16_DOT}: its bf16 weights widened to f32 by a "
                "shift and multiplied by the FMA (the fallback path)")
        else:
            plan.precision_note = (f"{why_not_bf16(m)}: the few-rows GEMM's weights "
                                   f"({K * N * F32} B in f32) fit L2 ({m.l2} B), read faster than their FMAs run, so "
                                   "bf16 weights would only add their widening; it computes in f32 "
                                   "(docs/precision.md, \"Without a bf16 multiply\")")
    t = plan.tiles = skinny_tiles(M, N, m, plan.precision_path if plan.precision == "bf16" else "f32")
    mr, nr, groups = t["mr"], t["nr"], t["groups"]
    eb = 2 if plan.precision == "bf16" else F32  # (bytes of a packed element: bf16 halves)
    par = skinny_parallel(M, N, K, eb)  # (the pool's own rule: a weight streamed from memory shares well)
    plan.detail = d = replace(d, path="skinny", direct_b=False, direct_a=False, parallel=par,
                              pack_parts=skinny_pack_parts(M, K, par), runs=skinny_runs(par, cdiv(N, nr)))
    texts = bf16_texts(plan.precision_path)
    plan.cache_check = (f"A packed [{groups * mr} x {K}] = {groups * mr * K * eb} B, read by every panel; "
                        f"B panel K x nr = {K * nr * eb} B streamed once per group"
                        + (f" (<= L2 {m.l2} B for the later groups)" if groups > 1 else ""))
    panels, parts = cdiv(N, nr), d.pack_parts
    plan.threads = (f"one thread, no parallel region ({M * N * K} multiply-adds < {SKINNY_PARALLEL_MIN}, "
                    f"a packed B of {K * N * eb} B < {SKINNY_PARALLEL_BYTES}: plan_gemm.skinny_parallel)"
                    if not d.parallel else
                    (f"A packed by the threads of the claim-based pool in {groups} x {parts} parts, then " if parts else "")
                    + (f"the {panels} {nr}-column panels in one contiguous run per thread of the claim-based pool, "
                       "claimed in order, then the others' left over one at a time from the back of their runs "
                       "(common_pool.h, eqf_runs_claim: plan_gemm.skinny_runs)" if d.runs else
                       f"the {panels} {nr}-column panels claimed one at a time by the threads of the claim-based pool")
                    + " (common_pool.h: the caller waits only for claimed panels)"
                    + (", then the rows for the row epilogue, claimed the same way" if d.row_op else ""))
    body, a = plan.body, plan.shape.anchor
    mm = body.nodes[a]
    skip = {a} | set(mm.args) | ({mm.args[1]} if body.nodes[mm.args[1]].op == "transpose" else set())
    if d.row_op is not None:
        skip |= not_ancestors(body, body.nodes[plan.shape.parts.row].args[0])
    epi = ops_text(body, skip=skip)
    calls = panels * groups
    plan.uops = [UOp(0, "Load", f"pack A [{M} x {K}] into {groups} group(s) of {mr} rows, k-major"
                     + (f", {texts['a']}" if plan.precision == "bf16" else ""), 1),
                 UOp(0, "Loop", f"panels over N={N} step nr={nr}", panels),
                 UOp(1, "Loop", f"row groups over M={M} step mr={mr}", calls),
                 UOp(2, "Load", f"B panel [{K} x {nr}] streamed from the panels packed once (params=)"
                     + (f" as {texts['b'].replace('kc', 'K')}" if plan.precision == "bf16" else ""), calls),
                 UOp(2, "Exec", f"micro-kernel {mr} x {nr} x {K} {texts['op']}, per {mr}-row group x {nr}-column panel",
                     calls),
                 UOp(2, "Store", f"C tile {mr} x {nr} through the epilogue ({epi or 'none'})", calls)]
    if d.row_op is not None:
        plan.uops.append(UOp(0, "Exec", f"{d.row_op} over each row of C [{N}] once every panel is done", 1))


def thread_rule(M: int, N: int, batch: int, mr: int, nr: int, rows_only: bool, par: bool = True,
                K: int = 0) -> str:
    """How the C (csrc_templates/gemm.c, `_split`) shares one call among its threads."""
    if not par:
        return (f"one thread, no parallel region ({batch * M * N * K} multiply-adds < "
                f"{GEMM_PARALLEL_MIN_FMAS}, plan_gemm.GEMM_PARALLEL_MIN_FMAS)")
    by_batch = f"whole batches per thread when 1 < threads <= {batch}; else " if batch > 1 else ""
    cols = not rows_only and (2 * M <= N or (M <= N and M <= 64 * mr))
    by_cols = f"whole {nr}-column panels per thread when 1 < threads <= {cdiv(N, nr)}; else " if cols else ""
    why = " (a row epilogue needs whole rows)" if rows_only else ""
    return f"{by_batch}{by_cols}whole {mr}-row tiles per thread, packing each B panel together{why}"


def matrix_layout(shape, strides) -> tuple[bool, int] | None:
    """(given transposed, leading dimension) of a matrix (the last two axes of `shape`) read at
    `strides`: rows in memory (unit column stride, ld the row stride) or columns in memory (a
    transposed matrix, ld the column stride); None when neither axis has unit stride."""
    (R, C), (sr, sc) = shape[-2:], strides[-2:]
    if C == 1 or sc == 1:
        return False, sr if R > 1 else C
    if R == 1 or sr == 1:
        return True, sc if C > 1 else R
    return None


def _flat_stride(shape, strides) -> int | None:
    """The one stride s with strides[k] == s * prod(shape[k+1:]) on every axis of size > 1 (the
    axes walk one row index evenly); 0 when every axis has size 1; None when there is none."""
    s, inner = None, 1
    for d, st in zip(reversed(shape), reversed(strides)):
        if d > 1:
            if st % inner or (s is not None and st != s * inner):
                return None
            s = st // inner if s is None else s
        inner *= d
    return 0 if s is None else s


def c_layout(plan: KernelPlan, strides) -> tuple[int, int, int] | None:
    """(ldc, column stride, batch stride of C) when a matmul's GEMM can store its result at these
    element strides: rows at ldc, columns at unit stride (ldc >= N) or at their own stride (a
    transposed C: an NHWC result written through the permute to NCHW, ConvNeXt's Linear whose
    residual add joined it, rules add_through_nchw_*; one image, whose pixels are the rows); the
    "fold" mode's rows of every batch one after the other at ldc, the "batch" mode's batches at
    one stride. None otherwise (the "loop" mode, whose wrapper offsets C by whole matrices, writes
    contiguous only; a row epilogue, which walks rows of C in memory, and the skinny path write
    unit columns)."""
    out = tuple(plan.out_shape)
    nb, (M, N) = len(out) - 2, out[-2:]
    mode = plan.detail.gemm.mode
    csc = strides[-1] if N > 1 else 1
    if csc != 1 and (plan.kind != Kind.CONTRACTION or plan.detail.path == "skinny"):
        return None
    if mode == "fold":
        ldc, sc = _flat_stride(out[:-1], strides[:-1]), 0
    elif mode == "batch":
        ldc, sc = (strides[-2] if M > 1 else N), _flat_stride(out[:nb], strides[:nb])
    else:
        return None
    if ldc is None or sc is None:
        return None
    if csc != 1:
        return (ldc or 1, csc, sc) if ldc != csc else None
    ldc = ldc or N  # (one row: any row stride)
    return (ldc, 1, sc) if ldc >= N else None


def pixels_as_rows(O: int, P: int) -> bool:
    """Whether a conv2d with O output channels and P = OH x OW output pixels per image runs as
    the GEMM C^T = col^T . W^T (P x O per image) rather than C = W . col (O x P). The columns are
    the micro-kernel's vector lanes: with fewer pixels than an NR-wide panel most lanes would be
    padding (a 2 x 2 or 4 x 4 map in a ResNet's last stages), and the weights, read as B, are
    packed once when bound. Measured, one thread, 3x3 conv + relu of 2 images as C = W . col,
    eqfuse was several times slower than onnxruntime at 128 channels at 2 x 2 and 64 at 4 x 4
    (`benchmarks/bench_conv.py --set resnet18 --threads 1`, rows "l4 128 3x3 @2", "l3 64 3x3 @4")."""
    return P < O


def conv_c_layout(plan: KernelPlan, strides) -> tuple[int, int, int] | None:
    """(ldc, column stride, batch stride) of a conv2d's C (O x OH*OW per image) stored at these
    element strides of its N x O x OH x OW result: the output pixels of a channel at one stride
    (a transposed C, as a ViT's patch embedding flattened to tokens wants it), else None."""
    N, O = plan.out_shape[:2]
    csc = _flat_stride(plan.out_shape[2:], strides[2:])
    if not csc:
        return None
    return (strides[1] if O > 1 else 1), csc, (strides[0] if N > 1 else 0)


def _operand(body, x: int, base: dict, batch) -> tuple[int, bool, int, tuple[int, ...]]:
    """(the input read, given transposed, leading dimension, batch strides over `batch`) of a
    matmul operand: an input, or a swap of an input's last two axes, read at the input's strides
    (contiguous, or a view's: eqfuse.backend.views)."""
    src, st = view_strides(body, x, base)
    shape = body.nodes[x].type.shape
    transposed, ld = matrix_layout(shape, st)
    nb = len(batch)
    own = shape[:-2]
    bst = (0,) * (nb - len(own)) + tuple(0 if d == 1 else s for d, s in zip(own, st[:-2]))
    return src, transposed, ld, bst


def _matmul_gemm(plan: KernelPlan, M: int) -> tuple[GemmCalls, bool, bool]:
    """(how a (batched) matmul maps onto GEMM calls, A given transposed, B given transposed):
    "fold" (B shared by every batch, or one batch: one GEMM over all rows), "batch" (one call, a
    stride per operand) or "loop" (the wrapper calls the GEMM once per batch). An operand is read
    in place at its strides: rows or columns in memory at any leading dimension, any batch strides."""
    body, mm = plan.body, plan.body.nodes[plan.shape.anchor]
    A, B = mm.args
    out = tuple(plan.out_shape)
    nb, batch = len(out) - 2, out[:-2]
    base = plan.base_strides()
    Asrc, at, lda, ast = _operand(body, A, base, batch)
    Bsrc, bt, ldb, bst = _operand(body, B, base, batch)
    cst = contiguous(out)[:nb]
    nbatch = size(batch)
    # rows of A follow one another across batches (so B shared by all folds them into one GEMM)
    # only when A is not given transposed
    acont = not at and list(ast) == list(contiguous(batch + (M, lda))[:nb])
    ops = {"a_src": Asrc, "b_src": Bsrc, "a_strides": tuple(ast), "b_strides": tuple(bst), "lda": lda, "ldb": ldb}
    if nbatch == 1 or (all(s == 0 for s in bst) and acont):
        return GemmCalls("fold", nbatch * M, 1, 1, (0, 0, 0), **ops), at, bt
    jg = joint_groups(batch, [ast, bst, cst])
    if len(jg) <= 1:
        g0 = jg[0][-1] if jg else 0
        strides = (ast[g0], bst[g0], cst[g0]) if jg else (0, 0, 0)
        return GemmCalls("batch", M, nbatch, 1, strides, **ops), at, bt
    return GemmCalls("loop", M, 1, nbatch, (0, 0, 0), **ops), at, bt


def implicit_im2col(path: str, pixels_as_rows: bool, geo: ConvGeometry) -> bool:
    """Whether a conv2d's GEMM packs B's panels from the image itself (csrc_templates/im2col_b.c)
    instead of building the column matrix: on AMX tiles (path "amx_bf16"), channels as rows (B the
    column matrix), and a column matrix to build (not `_reads_x_as_columns`). The matrix holds
    each input element KH x KW / (SH x SW) times in f32, written once and read again to pack it to
    bf16: at ResNet's 3x3 convs that traffic was most of the conv's time, the tiles' products a
    small part (`python benchmarks/bench_models.py --precision bf16 --model resnet_stages`)."""
    return path == "amx_bf16" and not pixels_as_rows and not _reads_x_as_columns(geo)


def _reads_x_as_columns(geo: ConvGeometry) -> bool:
    """A 1x1 conv of stride 1, unpadded and undilated: x itself is the column matrix (no im2col)."""
    return (geo.KH, geo.KW) == (1, 1) and geo.stride == (1, 1) and geo.padding == (0, 0) and geo.dilation == (1, 1)


def plan_contraction(plan: KernelPlan, m: Machine) -> None:
    body, a = plan.body, plan.shape.anchor
    mm = body.nodes[a]
    assert mm.type.shape == plan.out_shape, "classify splits an epilogue that broadcasts (check_no_broadcast)"
    if mm.op == "conv2d":
        geo = conv_geometry(plan, a)
        N, C, KH, KW, OH, OW = geo.N, geo.C, geo.KH, geo.KW, geo.OH, geo.OW
        O = mm.type.shape[1]
        P, K, batch = OH * OW, C * KH * KW, N
        swap = pixels_as_rows(O, P)
        if swap:  # C^T = col^T . W^T: A the column matrix given transposed, B the weights (N x K)
            M, Nn, at, bt, g = P, O, True, True, GemmCalls("conv", P, N, 1, (K * P, 0, O * P))
        else:  # C = W . col
            M, Nn, at, bt, g = O, P, False, False, GemmCalls("conv", O, N, 1, (0, K * P, O * P))
        plan.flops = 2 * N * O * OH * OW * K + pointwise_flops(body)
    else:
        ashape = body.nodes[mm.args[0]].type.shape  # (the transpose's shape when A is read through one)
        M, K, Nn = ashape[-2], ashape[-1], mm.type.shape[-1]
        batch = size(mm.type.shape[:-2])
        g, at, bt = _matmul_gemm(plan, M)
        plan.flops = 2 * batch * M * Nn * K + pointwise_flops(body)
    gM = g.M
    narrow = narrow_f32(Nn, m) if mm.op != "conv2d" and plan.wanted_precision == "bf16" else ""
    if narrow:
        computes_f32(plan, narrow)
        bf16 = False
    else:
        bf16 = computes_as_wanted(plan, m, gemm_bf16_path(m))  # (a few-rows GEMM: plan_skinny decides again)
    path = plan.precision_path
    texts = bf16_texts(path)
    amx = path == "amx_bf16"
    a_bytes = BF16 if path == "avx512_bf16" else F32  # (the packed A's elements)
    t = plan.tiles = amx_tiles(gM, Nn, K, m) if amx else gemm_tiles(gM, Nn, K, m, even_kc=bf16, a_bytes=a_bytes)
    mr, nr, kc, mc, nc = t["mr"], t["nr"], t["kc"], t["mc"], t["nc"]
    plan.cache_check = "; ".join(f"{text}: {'ok' if ok else 'NO'}"
                                 for text, ok in gemm_checks(t, m, BF16 if amx else a_bytes))
    row = _plan_row_epilogue(plan, m, Nn) if plan.kind == Kind.CONTRACTION_ROW else None
    par = parallel(gM, Nn, K, g.batch)  # per GEMM call: each opens its own region
    # (bf16: A and B are converted while packed, never read in place)
    plan.detail = GemmDetail(M, Nn, K, batch, at, bt, g, direct_b=not bf16 and direct(gM, Nn, bt, mr, nr),
                             split="rows" if row is not None else "auto", parallel=par,
                             row_op=body.nodes[row].op if row is not None else None,
                             pixels_as_rows=mm.op == "conv2d" and at, direct_a=not bf16 and direct_a(at),
                             im2col=mm.op == "conv2d" and not _reads_x_as_columns(geo) and not implicit_im2col(path, at, geo),
                             implicit=mm.op == "conv2d" and implicit_im2col(path, at, geo))
    plan.threads = thread_rule(gM, Nn, g.batch, mr, nr, rows_only=row is not None, par=par, K=K)
    skip = {a} | set(mm.args) | ({mm.args[1]} if body.nodes[mm.args[1]].op == "transpose" else set())
    if row is not None:
        skip |= not_ancestors(body, body.nodes[row].args[0])
    epi = ops_text(body, skip=skip)
    nb = g.batch * g.outer
    npc, nch, njc, tiles = cdiv(K, kc), cdiv(gM, mc), cdiv(Nn, nc), cdiv(gM, mr) * cdiv(Nn, nr)
    u = plan.uops
    if plan.kind == Kind.CONV2D:
        u.append(UOp(0, "Exec", f"none: B's panels packed from the image (implicit im2col {K} x {Nn})"
                     if plan.detail.implicit else f"im2col {K} x {Nn} per image (none for a 1x1 conv of stride 1)",
                     g.batch))
    b_load = ("B read in place" + (f", its last {Nn % nr} columns packed" if Nn % nr else "")) if plan.detail.direct_b \
        else f"pack B panel [{min(kc, K)} x {min(nc, Nn)}]" + (f" as {texts['b']}" if bf16 else "")
    u += [UOp(0, "Loop", f"{nb} GEMM(s) of {gM} x {Nn} x {K} x pc over K step kc={kc}", nb * npc),
          UOp(1, "Loop", f"row chunks over M={gM} step mc={mc} (one thread)", nb * npc * nch),
          UOp(2, "Load", f"pack A block [{min(mc, gM)} x {min(kc, K)}]" + (" from A given transposed" if at else "")
              + f", {texts['a']}" if bf16 else
              f"pack A block [{min(mc, gM)} x {min(kc, K)}] from A given transposed" if at else
              f"A block [{min(mc, gM)} x {min(kc, K)}] read in place, {mr} rows at a time", nb * npc * nch),
          UOp(2, "Loop", f"jc over N={Nn} step nc={nc}", nb * npc * nch * njc),
          UOp(3, "Load", b_load, nb * npc * nch * njc),
          UOp(3, "Exec", f"micro-kernel {mr} x {nr} x {min(kc, K)} {texts['op']}, per {mr}-row tile x {nr}-column panel",
              nb * npc * tiles),
          UOp(3, "Store", f"C tile {mr} x {nr}: partial sums, through the epilogue ({epi or 'none'}) "
                          "on the last kc step", nb * npc * tiles)]
    if row is not None:
        rn = body.nodes[row]
        post = ops_text(body, skip=not_ancestors(body, body.outputs[0]) | body.ancestors(row))
        what = f"{rn.op} over each finished row of C [{Nn}], then ({post or 'none'}), stored in place"
        if Nn <= nc:  # whole rows in one NC block: each MR-row tile as soon as it is finished
            u.append(UOp(3, "Exec", f"on the last kc step, per {mr}-row tile in L1: {what}", nb * cdiv(gM, mr)))
        else:
            u.append(UOp(2, "Exec", f"after the last kc step of a chunk of rows, in L2: {what}", nb * nch))



def _plan_row_epilogue(plan: KernelPlan, m: Machine, N: int) -> int:
    """The row op of a GEMM with a row epilogue (kernels.ROW_EPILOGUE_OPS over the last axis).
    Whether this backend takes it was decided by classify on the same machine
    (ir.kernels._check_row_epilogue): planning only asserts it."""
    body = plan.body
    row = plan.shape.parts.row
    rn = body.nodes[row]
    assert body.nodes[plan.shape.anchor].op == "matmul" and tuple(rn.type.shape) == plan.out_shape
    assert row_epilogue_fits(N, len(rn.args) - 1, m.l1), "classify splits a row that does not fit L1"
    plan.flops += OPS[rn.op].flops * size(plan.out_shape)
    plan.cache_check += f"; row epilogue: a row of C {N * F32} B (+ parameters) <= L1 {m.l1} B: ok"
    return row
