"""The integer GEMM of quantized models: matmul_integer (ONNX MatMulInteger, and quantize_dynamic's
DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul [-> Add] [-> activation]) as one u8 x s8 GEMM
with its dequantization, bias and activation as a pointwise epilogue on the exact int32 sums
(csrc_templates/gemm_u8s8.c).

`int8_path` is the one place the instruction path is chosen (the plan's `precision_path`, printed
by `eqfuse lower`, listed by report["precision"]); `int8_tile` the register tile per path. B is
packed in 4-byte K-groups with its column sums (once, when bound by params=: plan.detail.prepack).
Bound weights take "avx2_maddubs" on a CPU without VNNI (`mark_bound` plans again with them):
vpmaddubsw, exact because the few pairs of weights whose int16 sum could saturate are reduced when
packed and their remainders added to the tiles after (`pair_corrections`); their values are known
when the plan is made, and the plan is what runs.
An A that is quantize_linear(x, scale, zp) of an f32 x (DynamicQuantizeLinear's y, joined by the rule
kernel_matmul_integer_qa) is quantized by the kernel into its own A buffer (plan.detail.quantize_a).
When that scale and zero point are dynamic_scale(r) and dynamic_zero_point(r) of dynamic_range's two
floats r (rule kernel_matmul_integer_dqa), the kernel computes them from r before the GEMM.
conv_integer (ConvInteger, QLinearConv) is the same GEMM per image and group, pixels x output
channels: the kernel writes the im2col of x into its A buffer (plan.detail.im2col; a padded tap is
x's zero point) and stores C transposed, NCHW; the weights, [O, C/group x KH x KW], are its B.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from eqfuse.backend.cexpr import kernel_params, range_scalar_c, render
from eqfuse.backend.kinds.contraction.conv_geometry import ConvGeometry, conv_geometry
from eqfuse.backend.kinds.contraction.emit_gemm import c_type, gemm_epilogue
from eqfuse.backend.kinds.contraction.plan_gemm import PARALLEL_MIN_FMAS, Prepack, cdiv
from eqfuse.backend.plan import KernelPlan, UOp, ops_text, pointwise_flops, size
from eqfuse.ir.kernels import dynamic_qparams, quantized_a, quantized_out
from eqfuse.ir.ops import flit
from eqfuse.ir.shapes import C_TYPE
from eqfuse.machine import Machine

# cexpr.range_scalar_c's call on an epilogue's extra parameter (its two floats)
RANGE_CALL = re.compile(r"eqf_range_(scale|zero_point)\((\w+)\[0\], \2\[1\]\)")

# The template's PATH for each instruction path (csrc_templates/gemm_u8s8.c)
INT8_PATHS = {"amx_int8": 5, "avx512_vnni": 3, "avx_vnni": 2, "avx2_maddubs": 4, "fallback": 1, "fallback_scalar": 0}

# vpmaddubsw sums the u8 x s8 products of two adjacent bytes (k even and k + 1 of a column) into
# int16 with saturation: with A's bytes up to 255, a pair of weights of one sign whose magnitudes
# sum to more than PAIR_MAX can leave int16 (255 x 128 = 32640 < 2^15 <= 255 x 129); of opposite
# signs, or summing to at most PAIR_MAX, it cannot. onnxruntime's reduce_range=True weights (7 bits,
# [-64, 64]) never reach it.
PAIR_MAX = 128
# At most this share of a GEMM's weight pairs corrected (each a scalar multiply-add per row of A)
# on the avx2_maddubs path; past it the exact vpmaddwd fallback. At 1/256 the corrections cost
# about half of what the fallback loses, at 1/128 nearly all of it; weights quantized from a
# layer's (a bell-shaped spread, the largest at +-127) have about one pair in a thousand to correct
# (`benchmarks/bench_gemm.py --int8 --pairs`, benchmarks/RESULTS.md).
CORRECTED_PAIRS_MAX = 1 / 256


# A matmul of at least this many rows takes the AMX-INT8 tiles (amx_fits). A row tile is 32 rows,
# computed whole however few of them exist: at 16 rows the tiles were as fast as vpdpbusd on
# BERT-base's FFN shapes and faster on 768 x 768, at 8 slower on the FFN shapes (each call's
# dynamically quantized linear layer, both paths interleaved; benchmarks/RESULTS.md, 2026-12-04)
AMX_INT8_MIN_ROWS = 16
# ... and at least this many multiply-adds a call: below it the tiles' fixed costs (A through the
# buffer, K padded to whole tiles, and a tile unit that had been idle) outweighed their speed. At
# 128 x 256 x 256 (2^23) the tiles were faster, at 64 x 256 x 256 and smaller slower, and a small
# quantized ViT's attention products (17 x 17 x 16) four times slower (quantized linear layers
# interleaved with the vpdpbusd path; `benchmarks/bench_models.py --quantized static --model vit`;
# benchmarks/RESULTS.md, 2026-12-04)
AMX_INT8_MIN_MACS = 1 << 23


def amx_fits(conv: bool, rows: int, macs: int) -> bool:
    """Whether an integer GEMM can take the AMX-INT8 path: a matmul (a conv's A is read in place
    from its padded copy of x, or its im2col, with no room for a tile's rows past the pixels) of at
    least AMX_INT8_MIN_ROWS rows and AMX_INT8_MIN_MACS multiply-adds a call."""
    return not conv and rows >= AMX_INT8_MIN_ROWS and macs >= AMX_INT8_MIN_MACS


def int8_path(m: Machine, weights_bound: bool = False, amx: bool = False) -> str:
    """The instruction path of the integer GEMM on machine m: "amx_int8" (tdpbusd on tiles) where
    the CPU has AMX-INT8, the kernels are built for AVX-512 and the GEMM fits them (`amx`:
    amx_fits); else "avx512_vnni" (vpdpbusd on zmm)
    where the CPU has AVX512_VNNI and the kernels are built for AVX-512; else "avx_vnni" (the VEX
    vpdpbusd on ymm) where it has AVX-VNNI; else on AVX2 "avx2_maddubs" when the weights are bound
    and their values known (`weights_bound`: vpmaddubsw + vpmaddwd by ones, exact with the pairs
    pair_corrections finds reduced and corrected), "fallback" for any weights (u8 and s8 widened
    to int16, vpmaddwd: exact, where vpmaddubsw would saturate), or "fallback_scalar" below AVX2
    (plain C). All compute the same exact int32 sums."""
    if amx and m.amx_int8 and m.simd_floats >= 16:
        return "amx_int8"
    if m.avx512_vnni and m.simd_floats >= 16:
        return "avx512_vnni"
    if m.avx_vnni and m.simd_floats >= 8:
        return "avx_vnni"
    if m.simd_floats < 8:
        return "fallback_scalar"
    return "avx2_maddubs" if weights_bound else "fallback"


def packed_weights(w: np.ndarray, d: QGemmDetail) -> np.ndarray:
    """The bound weights w as the kernel packs them (`_pack` in csrc_templates/gemm_u8s8.c), one
    column per output column: [K in the panels, rounded up to whole K-groups of 4] x N, int16 of
    the s8 values (a u8 B read as b - 128; DIRECT_X: each kernel row padded with taps of weight 0
    to whole K-groups, or with `ch4` K reordered to (four channels, kernel row, tap, channel))."""
    v = w.astype(np.int16) - (128 if d.b_u8 else 0)
    mat = v.reshape(d.N, -1).T if d.im2col or d.b_transposed else v.reshape(d.K, d.N)
    if d.direct_x and d.ch4:  # (K in the order (four channels, kernel row, tap, channel of the four))
        g = d.geometry
        mat = mat.reshape(-1, 4, g.KH, g.KW, d.N).transpose(0, 2, 3, 1, 4).reshape(-1, d.N)
    elif d.direct_x:
        kw = d.geometry.KW
        rows = mat.reshape(-1, kw, d.N)
        mat = np.concatenate([rows, np.zeros((rows.shape[0], cdiv(kw, 4) * 4 - kw, d.N), np.int16)], 1).reshape(-1, d.N)
    return np.concatenate([mat, np.zeros((-mat.shape[0] % 4, d.N), np.int16)])


def correction_room(packed: np.ndarray) -> int:
    """The most pairs of these packed weights the avx2_maddubs path corrects (CORRECTED_PAIRS_MAX of
    them): the list's room in the packed weights, a function of the shape only."""
    return int(CORRECTED_PAIRS_MAX * packed.size / 2)


def pair_corrections(packed: np.ndarray) -> int:
    """How many pairs of packed weights (k even and k + 1 of a column) vpmaddubsw could saturate
    on: of one sign, their magnitudes summing past PAIR_MAX. The kernel packs the larger of each
    such pair reduced to PAIR_MAX minus the smaller's magnitude, and adds A's byte times the
    remainder to the tile after the micro-kernel (one correction per pair)."""
    pairs = packed.astype(np.int32).reshape(-1, 2, packed.shape[1])
    a, b = pairs[:, 0], pairs[:, 1]
    return int(np.count_nonzero((a * b > 0) & (np.abs(a) + np.abs(b) > PAIR_MAX)))


def int8_tile(path: str, N: int) -> tuple[int, int]:
    """(MR, NR) of the integer micro-kernel: MR x NR/lanes int32 accumulators, NR/lanes vectors of
    B and the broadcast of A's four bytes, well inside the vector registers (32 zmm, 16 ymm): the
    accumulators are the source and destination of each vpdpbusd, and a tile near the register
    count (6 x 64 on zmm: 24 + 4 + 1 of 32) had gcc keep them on the stack, reloaded and stored
    around every K-group; 8 x 32 (16 + 2 + 1) stays in registers
    (`benchmarks/bench_gemm.py --int8 --tiles` measures the candidates). The fallback also holds
    B's even and odd int16 halves and A's two; avx2_maddubs a vector of ones and each product: 3 x 24
    was as fast as 4 x 16 and 2 x 32 with K in blocks, and faster than 4 x 16 with K = 768 in one
    block, which int8_kc then gave 4 x 16 alone (BERT-base's shapes, `--int8 --tiles`); of the two, the one
    that pads N less (N = 32 or 64: 4 x 16, none, where 3 x 24 computes 48 or 72 columns): small
    quantized ResNet-18, ViT and BERT exports ran faster so than with 3 x 24 for every N
    (`benchmarks/bench_models.py --quantized static`; benchmarks/RESULTS.md, "avx2_7bit tiles by
    padding"). A narrower NR for few columns (less padding). AMX-INT8: 2 x 2 C tiles of 16 x 16."""
    if path == "amx_int8":
        return (32, 32)
    if path == "avx512_vnni":
        return (16, 16) if N <= 16 else (8, 32)
    if path == "avx_vnni":  # 4 x 2 + 2 + 1 = 11 of 16 ymm
        return (8, 8) if N <= 8 else (4, 16)
    if path == "avx2_maddubs":  # 3 x 3 + 3 + 1 + ones + product = 15 of 16 ymm
        if N <= 8:
            return (6, 8)
        return min((3, 24), (4, 16), key=lambda t: cdiv(N, t[1]) * t[1])  # (a tie: 3 x 24, the first)
    return (6, 8) if N <= 8 else (4, 16)  # 4 x 2 + 2 x 2 + 2 (+ 2 products) = 16 ymm


# Chunks per call the threads share: panels, or panels x row blocks when there are fewer. With 8
# rather than 4 a quantized ResNet's convs of 64 and 128 output channels (2 and 4 panels) took 8%
# less time at 2 threads, as a thread that the shared machine slows holds up the call's end by a
# smaller chunk, and the same at one thread (`benchmarks/bench_models.py --quantized static --model
# resnet_stages`, its kernels through eqfuse.runtime.profile; benchmarks/RESULTS.md)
CHUNKS_MIN = 8


# The share of L1 an integer GEMM's block of a B panel may fill (int8_kc). All of it, rather than
# the half it had: on one thread BERT-base's three shapes ran 1-5% faster in one block of all K
# than in blocks of half of L1, and the quantized models 1.3-2.3% faster at one thread, 6-8% at
# two (BERT-base's FFN down in three blocks rather than six, the 64-channel 3 x 3 convs in one
# rather than two), with deeper blocks still within their spread of that
# (`benchmarks/bench_gemm.py --int8 --tiles`, `benchmarks/bench_models.py --quantized dynamic
# --model bert-base`; benchmarks/RESULTS.md, 2026-12-02)
INT8_KC_L1 = 1.0


def int8_row_block(M: int, panels: int, mr: int, parallel: bool) -> int:
    """Rows per chunk of the threads' work (tile "mb"): all M when the panels alone are
    CHUNKS_MIN or more (each chunk one panel over every row, as B's panel block stays in L1 while
    every row tile passes over it); else M split into row blocks (a whole number of MR-row tiles)
    so that panels x blocks reach CHUNKS_MIN: a conv of 16 or 32 output channels is one panel,
    which one thread would otherwise compute alone while the others wait."""
    if not parallel or panels >= CHUNKS_MIN:
        return M
    return min(M, cdiv(cdiv(M, cdiv(CHUNKS_MIN, panels)), mr) * mr)


def group_bytes(path: str) -> int:
    """The bytes of one K-group (four values of K) of one column of a packed B panel: four s8,
    or four int16 on the fallback path, which widens B when it packs it."""
    return 8 if path == "fallback" else 4


def int8_kc(K: int, nr: int, m: Machine, path: str = "") -> int:
    """K per block of the integer GEMM (a multiple of 4): the block of a B panel, KC / 4 K-groups
    of NR columns (group_bytes each), within L1 (INT8_KC_L1 of it); K in equal blocks, K itself
    when it fits. Each block but the last costs a pass of the tiles' int32 sums through a buffer
    of all the chunk's rows, while the B block, at 16 multiply-adds of the tile per 128 bytes of
    it, streams from L2 fast enough should the A rows evict it."""
    groups = cdiv(K, 4)
    most = max(16, int(m.l1 * INT8_KC_L1) // (nr * group_bytes(path)))
    if path == "amx_int8":  # (whole tiles of 16 K-groups, K padded to them)
        return 64 * cdiv(cdiv(groups, 16), cdiv(groups, most))
    return 4 * cdiv(groups, cdiv(groups, most))


@dataclass(frozen=True)
class QGemmDetail:
    """The plan of an integer GEMM: what emit_qgemm writes."""

    M: int  # rows of one GEMM call (the batch folded in when B is one matrix)
    N: int
    K: int
    batch: int  # GEMM calls, one per batch of A (1 when folded)
    nbb: int  # B's matrices (1: one B for every batch)
    a_s8: bool  # A is s8 (read as u8 a ^ 0x80, its zero point + 128)
    b_u8: bool  # B is u8 (packed as s8 b ^ 0x80, its zero point - 128)
    bzp_per_col: bool  # b_zp is one per column
    parallel: bool  # the panels are shared by the pool's threads (PARALLEL_MIN_FMAS)
    # A is quantize_linear(x, scale, zp) of an f32 x: the kernel quantizes x into its A buffer (a
    # scratch of M x K bytes, reused by every batch) before the panels, so the u8 A is never a tensor
    quantize_a: bool
    prepack: Prepack | None = None  # B bound by params=, packed once (kinds.contraction.mark_bound_b)
    # conv_integer: A is the im2col of x, written by the kernel into its A buffer (M pixels x K
    # taps per image and group), B the weights read as N x K, C stored transposed (NCHW)
    im2col: bool = False
    groups: int = 1  # the conv's groups (calls are images x groups, B one matrix per group)
    # the conv's geometry (conv_geometry.conv_geometry): shapes, not choices
    geometry: ConvGeometry | None = None
    # B is transpose(b) of a kernel input b, [N, K] in memory (a QDQ Gemm's transB weight, rule
    # gemm_dequantized): packed from there, as a conv's weights are
    b_transposed: bool = False
    # the im2col by output row (IM2COL_ROWS, im2col_by_rows): per kernel row of x, its x row found once
    # and copied to each pixel of the output row, against pixel by pixel with every kernel row in turn
    im2col_rows: bool = False
    # no im2col: A read in place from a padded copy of x (DIRECT_X, direct_x()): 2 pixels by output
    # row, 1 virtual pixels (M counts them), 0 an im2col; mo the output's pixels per image
    direct_x: int = 0
    mo: int = 0
    # DIRECT_X 2's virtual pixels per output row: OW rounded up to whole MR-row tiles (direct_x())
    owv: int = 0
    # a requantized conv (u8 / i8 out, NCHW) on 8- or 16-row tiles stores each tile whose pixels
    # are consecutive channel by channel, its bytes transposed in registers (COLS8, store_cols8)
    cols8: bool = False
    # the epilogue ends in a quantize_linear of one scale and one zero point (ir.kernels.quantized_out): each
    # row of its floats quantized at once (QOUT, eqf_quantize_row)
    qout: bool = False
    # DIRECT_X's K-groups: four channels of one tap (the padded copy holds the channels in fours,
    # interleaved: channels_in_fours()), else four taps of one kernel row, padded with weight 0
    ch4: bool = False
    # a conv's images are the threads' chunks (by_image()): each image's A buffer made and its GEMM
    # run by the thread that claimed it, against every image's panels shared by the threads
    by_image: bool = False
    # avx2_maddubs: room for the weight pairs packed reduced, whose remainders the kernel adds to
    # its tiles (their list after the panels and column sums): 0 when there are none, else
    # correction_room(), from the shape alone, so that layers of one shape share their C
    corrections: int = 0
    # its panels are chunks of the claim-based pool (the run function keeps the pool's workers
    # ready across it: runtime.program.hold_pool)
    pool: ClassVar[bool] = True


def is_integer(plan: KernelPlan) -> bool:
    return plan.body.nodes[plan.shape.anchor].op in ("matmul_integer", "conv_integer")


def _conv_gemm(plan: KernelPlan, a: int) -> tuple:
    """(M, N, K, calls, nbb, geometry) of a conv_integer as GEMMs: per image and group, the
    OH x OW pixels (rows) by the O / group output channels (columns) over C / group x KH x KW taps."""
    cv = plan.body.nodes[a]
    geo = conv_geometry(plan, a)
    o, cg = plan.body.nodes[cv.args[1]].type.shape[:2]
    g = cv.attr["group"]
    return geo.OH * geo.OW, o // g, cg * geo.KH * geo.KW, geo.N * g, g, geo


IM2COL_ROW_BYTES = 4  # kernel rows of more bytes than this: the im2col by output row (im2col_by_rows)


def im2col_by_rows(kw: int) -> bool:
    """The order of a conv's im2col: by output row (each kernel row's x row found once, then copied
    to every pixel of the output row) for kernel rows of more than IM2COL_ROW_BYTES bytes (a 5 x 5,
    the 7 x 7 stem), pixel by pixel (every kernel row of a pixel in turn) for shorter rows, which
    are moved as one 4-byte word. By output row the 7 x 7 stem of the quantized ResNet-18 was
    faster, its 3 x 3 and 1 x 1 convs slower (`benchmarks/bench_models.py --quantized static
    --model resnet18` and its kernels' profile, benchmarks/RESULTS.md)."""
    return kw > IM2COL_ROW_BYTES


DIRECT_X_MIN_OW = 8  # output rows of at least this many pixels: no im2col (direct_x)


def channels_in_fours(channels: int) -> bool:
    """Whether DIRECT_X's K-groups are four channels of one tap (the padded copy of x holding its
    channels in fours, interleaved, pixel by pixel): a group's channels a multiple of 4. Then K in
    the panels is K itself; else each kernel row's taps are padded to a multiple of 4 with weights
    0, a third more multiply-adds for a 3 x 3 conv (a quantized 64-channel 3 x 3 conv at 56 x 56:
    benchmarks/RESULTS.md, "bf16 and int8 on a CPU with AVX512_BF16 and VNNI")."""
    return channels % 4 == 0


def direct_x(geo: ConvGeometry, mr: int, ch4: bool) -> tuple[int, int]:
    """(DIRECT_X, OWV): whether a conv reads A in place from a padded copy of x, without an im2col
    (the template's DIRECT_X), and how its rows are pixels:
    - 2, by output row, each row OWV virtual pixels, OW rounded up to a whole number of the tile's
      MR rows (OWV = OW when OW is a multiple of MR; the OWV - OW past a row's end are computed and
      not stored, their taps read from the next row or the buffer's slack), when no more than
      DIRECT_X_WASTE of a row's pixels are virtual;
    - 1, as virtual pixels q = oh WP + ow (stride 1, output rows of at least DIRECT_X_MIN_OW
      pixels: the WP - OW past each row's end are computed too), when OW is no multiple of MR;
    - 0, with an im2col.
    No dilation, and K-groups of four channels of a tap (`ch4`: any kernel), or kernel rows of 3, 4,
    7 or 8 taps (whole K-groups of four, a row of 3 or 7 padded with taps of weight 0). The im2col
    was half the time of the quantized ResNet-18's 3 x 3 convs and its 7 x 7 stem, and most of its
    strided and 1 x 1 convs' (`benchmarks/bench_models.py --quantized static --model resnet18` and
    `--model resnet_stages`, their kernels' profile: benchmarks/RESULTS.md)."""
    if geo.dilation != (1, 1) or not ch4 and geo.KW not in (3, 4, 7, 8):
        return 0, 0
    if geo.OW % mr == 0:
        return 2, geo.OW
    if geo.stride == (1, 1) and geo.OW >= DIRECT_X_MIN_OW:
        return 1, 0
    owv = cdiv(geo.OW, mr) * mr
    return (2, owv) if owv - geo.OW <= DIRECT_X_WASTE * owv else (0, 0)


DIRECT_X_WASTE = 0.2  # the most of DIRECT_X 2's virtual pixels per row computed and not stored (direct_x)


BY_IMAGE_MAX_BYTES = 1 << 22  # the A buffers of every image of a conv at most this: by_image


def by_image(images: int, groups: int, abytes: int, parallel: bool, cores: int) -> bool:
    """Whether the threads' chunks of a conv are its images, whole (the template's BY_IMAGE: each
    image's A buffer, an im2col or a padded copy of x, made by the thread that claimed the image,
    then its GEMM), against the panels' row blocks of each image in turn, shared by the threads.
    Shared, a conv of a small image (a quantized ResNet's 16 x 16, 8 x 8, 4 x 4, 2 x 2 planes)
    gained nothing from a second thread: every chunk read the A buffer the calling thread had made
    and wrote output lines beside the other thread's, so that each chunk took twice its time on
    one thread (the quantized ResNet-18 at batch 2: `benchmarks/bench_models.py --quantized static
    --model resnet18`, its kernels' profile, benchmarks/RESULTS.md). By image each thread reads and
    writes its own image's lines. On one thread the images run in turn in one A buffer, as without
    by_image. When the images are a multiple of the machine's cores (each
    thread the same number), of one group (the weights one matrix), their buffers within
    BY_IMAGE_MAX_BYTES."""
    return parallel and images >= cores > 1 and images % cores == 0 and groups == 1 and images * abytes <= BY_IMAGE_MAX_BYTES


def plan_qgemm(plan: KernelPlan, m: Machine, weights_bound: bool = False) -> None:
    """The plan of an integer GEMM; `weights_bound`: its B is bound and its values known (mark_bound)."""
    body, a = plan.body, plan.shape.anchor
    mm = body.nodes[a]
    at, bt, _, zt = (body.nodes[x].type for x in mm.args)
    qa = quantized_a(body, a, set(body.inputs)) is not None
    out = tuple(mm.type.shape)
    conv = mm.op == "conv_integer"
    if conv:
        M, N, K, batches, nbb, geo = _conv_gemm(plan, a)
        fold, gM, calls = nbb == 1, M, batches
        direct, owv = direct_x(geo, int8_tile(int8_path(m, weights_bound), N)[0], channels_in_fours(geo.C // nbb))
        amx = False
        if direct == 1:  # (the virtual pixels: each output row WP = W + 2 PW wide, the last OW)
            gM = (M // geo.OW - 1) * (geo.W + 2 * geo.padding[1]) + geo.OW
        elif direct == 2:  # (each output row OWV pixels)
            gM = geo.OH * owv
    else:
        M, K, N = at.shape[-2], at.shape[-1], bt.shape[-1]
        batches = size(out[:-2])
        nbb = size(bt.shape[:-2])
        fold = bt.rank == 2
        gM, calls = (batches * M, 1) if fold else (M, batches)
        direct, owv = 0, 0
        amx = amx_fits(False, gM, gM * N * K)
    path = int8_path(m, weights_bound, amx)
    plan.precision, plan.precision_path, plan.precision_note = "int8", path, ""
    mr, nr = int8_tile(path, N)
    ch4 = bool(direct) and channels_in_fours(geo.C // nbb)
    # K in the panels (direct_x: whole K-groups per kernel row, unless they are channels in fours)
    kp = (K if ch4 else geo.C // nbb * geo.KH * cdiv(geo.KW, 4) * 4) if direct else K
    kc = int8_kc(kp, nr, m, path) if path == "amx_int8" else min(int8_kc(kp, nr, m, path), kp)
    par = calls * gM * N * K >= PARALLEL_MIN_FMAS
    # (a conv's A buffer per image: the padded planes or the im2col's rows of whole K-groups, and x quantized)
    abytes = ((geo.C // nbb * (geo.H + 2 * geo.padding[0]) * (geo.W + 2 * geo.padding[1]) + 64 if direct else gM * cdiv(K, 4) * 4)
              + (geo.C // nbb * geo.H * geo.W if qa else 0)) if conv else 0
    whole = conv and by_image(calls, nbb, abytes, par, m.cores)
    # (by image, its chunks of mb rows run in turn on the thread that claimed the image, and on one
    # thread as without by_image)
    plan.tiles = {"mr": mr, "nr": nr, "kc": kc, "mb": int8_row_block(gM, cdiv(N, nr), mr, par)}
    plan.detail = QGemmDetail(gM, N, K, calls, nbb, at.dtype == "i8", bt.dtype == "u8", zt.rank == 1, par, qa,
                              im2col=conv, groups=nbb if conv else 1, geometry=geo if conv else None,
                              b_transposed=body.nodes[mm.args[1]].op == "transpose",
                              im2col_rows=conv and not direct and im2col_by_rows(geo.KW), direct_x=direct,
                              mo=M if conv else gM, by_image=whole, ch4=ch4, owv=owv,
                              cols8=conv and mr in (8, 16) and body.nodes[body.outputs[0]].type.dtype in ("u8", "i8"),
                              qout=quantized_out(body))
    plan.flops = 2 * batches * M * N * K + pointwise_flops(body)
    kg, panels = cdiv(K, 4), cdiv(N, nr)
    blocks = cdiv(K, kc)
    gb = group_bytes(path)
    block, room, panel = cdiv(kc, 4) * gb * nr, int(m.l1 * INT8_KC_L1), kg * gb * nr  # (int8_kc's budget)
    plan.cache_check = (f"B panel block kc x nr = {block} B <= L1 x {INT8_KC_L1:g} {room} B: "
                        f"{'ok' if block <= room else 'NO'} (the whole panel {panel} B <= L2/2: "
                        f"{'ok' if panel <= m.l2 // 2 else 'NO'}); partial sums M x nr x 4 = {gM * nr * 4} B"
                        + (" per thread between K blocks" if blocks > 1 else " (one K block: none)"))
    mb = plan.tiles["mb"]
    plan.threads = (f"the {calls} images, each claimed whole (its A buffer and its {panels} {nr}-column panels) by one of the "
                    "threads of the claim-based pool (common_pool.h)" if whole else
                    f"the {panels} {nr}-column panels" + (f" x {cdiv(gM, mb)} blocks of {mb} rows" if mb < gM else "")

                    + " claimed one at a time by the threads of the claim-based pool (common_pool.h)" if par else
                    f"one thread ({calls * gM * N * K} multiply-adds < {PARALLEL_MIN_FMAS}, plan_gemm.PARALLEL_MIN_FMAS)")
    op = {"amx_int8": "tdpbusd on 2 x 2 C tiles of 16 x 16 (u8 x s8 K-groups of 4, int32)",
          "avx512_vnni": "vpdpbusd zmm (u8 x s8 K-groups of 4, int32)",
          "avx_vnni": "vpdpbusd ymm, VEX (u8 x s8 K-groups of 4, int32)",
          "avx2_maddubs": "vpmaddubsw + vpmaddwd by ones (u8 x s8 K-groups of 4, int32; exact: pairs of weights that "
                          "could saturate reduced, their remainders added after)",
          "fallback": "vpmaddwd on u8 and s8 widened to int16 (exact)",
          "fallback_scalar": "int32 multiply-adds in C"}[path]
    epi = ops_text(body, skip={a} | set(mm.args))
    tiles = cdiv(gM, mr)
    quant = [UOp(1, "Load", f"quantize A [{gM} x {K}] f32 -> {at.dtype} (x / scale, round half to even, + zp, saturate) "
                 "into the kernel's A buffer" + (", row blocks shared by the pool's threads" if par else ""), calls)]
    if path == "amx_int8" and not qa:
        quant = [UOp(1, "Load", f"copy A [{gM} x {K}] {at.dtype} into the kernel's A buffer as u8 (the tiles' operand)"
                     + (", row blocks shared by the pool's threads" if par else ""), calls)]
    if conv:
        plane = f"the group's {geo.C // nbb} channels of x ({geo.H} x {geo.W})"
        quant = [UOp(1, "Load", f"quantize {plane} f32 -> {at.dtype} into the kernel's scratch", calls)][:qa] + \
            ([UOp(1, "Load", f"copy of x padded with its zero point, read in place as A [{gM} "
                  f"{'virtual ' if direct == 1 or owv != geo.OW else ''}pixels x {kp} taps: "
                  + ("K-groups of 4 channels of a tap, the copy's channels interleaved in fours]" if ch4 else
                     "kernel rows in K-groups of 4]"), calls)] if direct else
             [UOp(1, "Load", f"im2col of x into the kernel's A buffer [{gM} pixels x {K} taps], {at.dtype}, "
                  "padded with x's zero point" + (", row blocks shared by the pool's threads" if par else ""), calls)])
    plan.uops = [UOp(0, "Loop", f"{calls} GEMM(s) of {gM} x {N} x {K}, u8 x s8 -> int32"
                     + (f" (images x {nbb} groups)" if conv and nbb > 1 else ""), calls),
                 *(quant if qa or conv or path == "amx_int8" else []),
                 UOp(1, "Load", f"pack B [{K} x {N}] into {kg} K-groups x {nr}-column panels"
                     + (" (each K-group as its even and odd int16 vectors)" if path == "fallback" else "") + " + column sums "
                     + ("(once, when bound: params=)" if fold else "(per call)"), calls),
                 UOp(1, "Loop", f"panels over N={N} step nr={nr}", calls * panels),
                 UOp(2, "Loop", f"K blocks over K={K}" + (f" (padded to {cdiv(K, 64) * 64})" if path == "amx_int8" else "")
                     + f" step kc={kc}", calls * panels * blocks),
                 UOp(3, "Loop", f"row tiles over M={gM} step mr={mr}", calls * panels * blocks * tiles),
                 UOp(4, "Exec", f"micro-kernel {mr} x {nr} x {kc} {op}", calls * panels * blocks * tiles),
                 UOp(4, "Store", f"C tile {mr} x {nr} on the last K block: - a_zp colsum(B) (- b_zp rowsum(A)), "
                     f"then the epilogue ({epi or 'none'})" + (", stored transposed (NCHW)" if conv else ""),
                     calls * panels * tiles)]


def b_input(body, a: int) -> int:
    """The kernel input B is read from: B itself, or b of a B that is transpose(b) (b_transposed)."""
    b = body.nodes[a].args[1]
    return body.nodes[b].args[0] if body.nodes[b].op == "transpose" else b


def mark_bound(plan: KernelPlan, bound: set[int], m: Machine, values: Mapping[int, np.ndarray] | None = None) -> None:
    """detail.prepack when B (a rank-2 matrix, one for every batch; a conv's weights of one group)
    is bound by params= and read by nothing else in the kernel: the runtime packs it (and its column
    sums) once. When its values (`values`: body input -> the bound array) are known and that gives
    m another path (avx2_maddubs on a CPU without VNNI), the GEMM is planned again for it, with the
    number of weight pairs the kernel corrects (pair_corrections, at most CORRECTED_PAIRS_MAX of
    them; else the fallback stays): the weights packed are the ones counted, so the path cannot
    meet a pair it would saturate on."""
    body = plan.body
    b = b_input(body, plan.shape.anchor)
    one = plan.detail.groups == 1 if plan.detail.im2col else body.nodes[b].type.rank == 2
    if b not in bound or not one or len([n for n in body.nodes if b in n.args]) != 1:
        return
    w = (values or {}).get(b)
    if w is not None and int8_path(m, True, plan.precision_path == "amx_int8") != plan.precision_path:
        plan_qgemm(plan, m, weights_bound=True)
        packed = packed_weights(w, plan.detail)
        n = pair_corrections(packed)
        if n > correction_room(packed):
            plan_qgemm(plan, m)
        elif n:
            plan.detail = replace(plan.detail, corrections=correction_room(packed))
            calls, tiles, panels = plan.detail.batch, cdiv(plan.detail.M, plan.tiles["mr"]), cdiv(plan.detail.N, plan.tiles["nr"])
            at = next(i for i, u in enumerate(plan.uops) if u.what.startswith("micro-kernel")) + 1
            plan.uops.insert(at, UOp(4, "Exec", f"on the last K block, the {n} weight pairs vpmaddubsw could saturate on "
                                     "(packed reduced): A's byte x the remainder added to the tile, per pair of its panel",
                                     calls * panels * tiles))
    g = f"{plan.name}_gemm"
    plan.detail = replace(plan.detail, prepack=Prepack(body.inputs.index(b), f"{g}_prepack", f"{g}_prepack_floats"))
    plan.uops = [replace(u, what=u.what.replace("(once, when bound: params=)", "packed once when bound (params=)"))
                 for u in plan.uops]


def emit_qgemm(plan: KernelPlan) -> str:
    body, a = plan.body, plan.shape.anchor
    mm = body.nodes[a]
    params, ptrs = kernel_params(plan)
    d = plan.detail
    q = body.nodes[mm.args[0]]  # (quantize_linear(x, scale, zp) with quantize_a)
    a_in, a_scale = (q.args[0], ptrs.get(q.args[1])) if d.quantize_a else (mm.args[0], "NULL")
    out = tuple(plan.out_shape)
    nb = len(out) - 2
    if d.im2col:  # (C^T per image: pixels x channels, stored NCHW)
        groups = [("b", [0], False), ("j", [1], False), ("i", [2, 3], False)]
    elif d.batch == 1:
        groups = [("i", list(range(nb)) + [nb], False), ("j", [nb + 1], False)]
    else:
        groups = [("b", list(range(nb)), False), ("i", [nb], False), ("j", [nb + 1], False)]
    expr, read = gemm_epilogue(plan, groups, {a: "acc"})
    # an epilogue that ends in a quantize_linear of one scale and one zero point (a QDQ model's
    # conv or matmul): its floats, scale and zero point apart, the template quantizing each row
    # of floats at once (QOUT)
    qx = qscale = qzp = "0"
    if d.qout:
        last = body.nodes[body.outputs[0]]
        (qx, rx), (qscale, rs), (qzp, rz) = (gemm_epilogue(plan, groups, {a: "acc"}, root=x) for x in last.args)
        read = [r for r in read if r in rx + rs + rz]
        read += [r for r in rx + rs + rz if r not in read]
    extras = [(c_type(body, i), pn) for i, pn in read]
    # a scale of the range's two floats the epilogue reads (x_scale * w_scale of quantize_dynamic):
    # computed once per panel, before its loops, not per element (cexpr.range_scalar_c's calls)
    hoisted = {}
    for m in RANGE_CALL.finditer(expr + qx + qscale + qzp):
        hoisted.setdefault(m.group(0), f"eqf_rs{len(hoisted)}_{m.group(2)}")
    for call, var in hoisted.items():
        expr, qx, qscale, qzp = (e.replace(call, var) for e in (expr, qx, qscale, qzp))
    unpack = [f"const {'float' if 'scale' in c else 'uint8_t'} {v} = {c};" for c, v in hoisted.items()]
    gname = f"{plan.name}_gemm"
    geo = d.geometry or ConvGeometry(0, 0, 0, 0, 0, 0, 0, 0, (0, 0), (0, 0), (0, 0))  # (a matmul: no conv)
    ta, tb, tz, tw = (C_TYPE[body.nodes[x].type.dtype] for x in (a_in, *mm.args[1:]))
    # (EPILOGUE on one line: the template's EPI_ROW macro holds it)
    src = render("gemm_u8s8.c", NAME=gname, M=d.M, N=d.N, K=d.K, MR=plan.tiles["mr"], NR=plan.tiles["nr"],
                 KC=plan.tiles["kc"], MB=plan.tiles["mb"],
                 BATCH=d.batch, NBB=d.nbb, LDC=d.N, A_S8=int(d.a_s8), B_U8=int(d.b_u8), BZP_PER_COL=int(d.bzp_per_col),
                 PREPACKED_B=int(d.prepack is not None), QUANT_A=int(d.quantize_a), IM2COL=int(d.im2col), IM2COL_ROWS=int(d.im2col_rows), DIRECT_X=int(d.direct_x), OWV=d.owv, CH4=int(d.ch4),
                 COLS8=int(d.cols8), BY_IMAGE=int(d.by_image), MO=d.mo or d.M, B_TRANSPOSED=int(d.b_transposed),
                 G=d.groups, CI=geo.C, **geo.shape_c("N", "C", "OH"), PATH=INT8_PATHS[plan.precision_path], NCORR=d.corrections,
                 PARALLEL=int(d.parallel), EPILOGUE=" ".join(expr.split("\n")),
                 QOUT=int(d.qout), QX=" ".join(qx.split("\n")), QSCALE=" ".join(qscale.split("\n")),
                 QZP=" ".join(qzp.split("\n")), A_T=ta, B_T=tb, AZP_T=tz, BZP_T=tw,
                 OUT_T=C_TYPE[body.nodes[body.outputs[0]].type.dtype],
                 EXTRA_PARAMS="".join(f", const {t}* restrict {n}" for t, n in extras),
                 EXTRA_FIELDS=" ".join(f"const {t}* {n};" for t, n in extras),
                 EXTRA_UNPACK=" ".join([f"const {t}* restrict {n} = jb->{n}; (void){n};" for t, n in extras] + unpack),
                 EXTRA_INIT="".join(", " + n for _, n in extras))
    offsets = "        (void)g;"
    if d.quantize_a and body.nodes[q.args[1]].op == "const":  # a literal scale (a QDQ model's)
        a_scale = "&eqf_qa_scale"
        offsets += f"\n        const float eqf_qa_scale = {flit(body.nodes[q.args[1]].value)};"
    if dynamic_qparams(body, a, set(body.inputs)):  # scale and zero point from the range [lo, hi]
        r = ptrs[body.nodes[q.args[1]].args[0]]
        a_scale = "&eqf_dq_scale"
        ptrs = {**ptrs, mm.args[2]: "&eqf_dq_zp"}
        offsets += (f"\n        const float eqf_dq_scale = {range_scalar_c('dynamic_scale', r)};"
                    f"\n        const uint8_t eqf_dq_zp = {range_scalar_c('dynamic_zero_point', r)};")
    args = [ptrs[a_in], ptrs[b_input(body, a)]] + [ptrs[x] for x in mm.args[2:]] + [a_scale, "out"] + [ptrs[i] for i, _ in read]
    shapes = (f"integer batch={d.batch} M={d.M} N={d.N} K={d.K} ({plan.precision_path}"
              + (", A quantized from f32)" if d.quantize_a else ", A the im2col of x, C stored NCHW)" if d.im2col else ")"))
    wrapper = render("matmul.c", NAME=plan.name, SHAPES=shapes, GEMM=gname, PARAMS=params, OUTER=1,
                     OFFSETS=offsets, ARGS=", ".join(args))
    return src + "\n" + wrapper
