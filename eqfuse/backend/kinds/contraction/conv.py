"""Convolutions: the direct conv (csrc_templates/conv_direct.c) and Winograd F(2x2, 3x3) (conv_winograd.c). Planning and emit.

A conv2d as a direct convolution (csrc_templates/conv_direct.c): planning and emit.

The im2col path (plan_gemm, emit_gemm.emit_conv2d) writes a column matrix of C x KH x KW rows
per output pixel and runs the packed GEMM over it. The direct kernel reads the input where it
is, in a zero-padded copy blocked by input channels (one pixel's CB channels in one cache line),
and the weights as output-channel blocks of OBW = V vectors, prepacked once when bound by
params=. Its register tile is RW output pixels (consecutive across rows and images, so the
2 x 2 maps of a ResNet's last stage fill a tile) by OBW channels; the epilogue (bias,
batchnorm, relu, a residual add: any pointwise ops) is applied to each tile as it is stored.

`plan_conv_direct` decides by `use_direct` (a cost rule) and, when direct, is the conv's
whole plan; otherwise the caller plans the im2col GEMM. A 3x3 stride-1 conv that Winograd
F(2x2, 3x3) can run (eqfuse.backend.kinds.contraction.conv.use_winograd) gets that plan instead, in the
same detail (`winograd` = its tiles per block), so the blocked layout applies to it too. Once every kernel is planned,
`block_between_convs` (eqfuse.backend.kinds.contraction.blocked) keeps the blocked channel layout
([N][C / VL][H][W][VL]) on the tensors that pass between convs and pooling (as inputs or
residual operands) and nowhere else: the graph's inputs and outputs, and every tensor another
kind of kernel reads, stay NCHW; the kernels here read and write either (in_blocked, out_blocked,
blocked_args). EQFUSE_CONV=direct|im2col forces a path,
EQFUSE_CONV_TILE=V,RW,ROWS a register tile (both to measure the alternatives).

3x3 stride-1 convs by Winograd F(2x2, 3x3) (csrc_templates/conv_winograd.c): planning and emit.

A direct conv makes 9 multiply-adds per output pixel, input channel and output channel; F(2x2,
3x3) makes 16 per 2x2 pixels (2.25x fewer), at the price of two transforms made of adds (the
input's 4x4 windows, the 2x2 outputs) and of weights transformed once (U = G g G^T, 16 values
per 3x3 filter, packed like any bound weights). The multiply-adds become 16 GEMMs per block of
tiles, run with the direct conv's register tile (RW rows x V vectors of output channels). On the
ResNet convs that dominate a model's time (64-512 channels, 3x3, stride 1) the GEMMs are the work,
and a 64-channel conv at 56 x 56 takes about half the direct kernel's time (benchmarks/bench_conv.py).
onnxruntime's MLAS runs these convs directly (NCHWc); oneDNN and NNPACK have Winograd kernels.

The plan is a ConvDirectDetail with `winograd` = TB, the tiles per block: the blocked layout
(eqfuse.backend.kinds.contraction.conv) treats it as a direct conv: its input and output may be in blocks
of VL channels, and its epilogue reads operands in blocks at `blk`. EQFUSE_CONV_WINOGRAD=0 turns
it off (to measure the direct kernel), =1 takes it for every conv it can run.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace

from eqfuse.backend.cexpr import kernel_params, param_job, render
from eqfuse.backend.kinds.base import REGIONS
from eqfuse.backend.kinds.contraction.conv_geometry import ConvGeometry, conv_geometry
from eqfuse.backend.kinds.contraction.emit_gemm import BF16_PATHS, c_type, gemm_epilogue
from eqfuse.backend.kinds.contraction.plan_gemm import (
    Prepack,
    bf16_path,
    bf16_pays,
    cdiv,
    computes_as_wanted,
    gemm_bf16_path,
    parallel,
    pixels_as_rows,
)
from eqfuse.backend.plan import KernelPlan, UOp, ops_text, pointwise_flops
from eqfuse.ir.kernels import F32
from eqfuse.ir.ops import pair
from eqfuse.machine import Machine


@dataclass(frozen=True)
class ConvDirectDetail(ConvGeometry):
    """The plan of a direct conv2d: the constants of csrc_templates/conv_direct.c (never dilated)."""

    O: int
    cb: int  # input channels per block of the padded input copy
    vl: int  # floats per vector
    v: int  # vectors per output-channel block (OBW = v x vl channels)
    rw: int  # output pixels per register tile
    rows: bool  # a tile's pixels are in one output row (else any RW consecutive pixels)
    parallel: bool  # the kernel opens a parallel region (plan_gemm.parallel's rule)
    prepack: Prepack | None = None  # the weights bound by params=, blocked once (`mark_bound`)
    # the input is (the output will be) in blocks of VL channels, [N][C / VL][H][W][VL], between two
    # direct convs (`block_between_convs`)
    in_blocked: bool = False
    out_blocked: bool = False
    # pixels in the vector lanes (csrc_templates/conv_pixels.c), (RO, RPH, RPW): RO output channels
    # x RPH rows x RPW vectors of pixels; None: channels in the lanes (conv_direct.c)
    pixels: tuple[int, int, int] | None = None
    pixels_as_rows: bool = False  # (an im2col GEMM's orientation: never here)
    blocked_args: tuple[int, ...] = ()  # body inputs of the epilogue read in blocks of VL channels
    in_place: bool = False  # the input in blocks read where it is, no padded copy (conv._mark_in)
    winograd: int = 0  # tiles per block of a Winograd F(2x2, 3x3) conv (contraction/conv.py), 0: direct
    o_inner: bool = False  # pixels in the lanes: the channel tiles innermost (conv_pixels.c's OINNER)
    row_align: bool = False  # pixels in the lanes: each column phase of the padded copy whole vectors (ALIGN)
    region_chunks: int = 64  # equal ranges of the tiles' loop on the claim-based pool (`region_chunks`)

    @property
    def obw(self) -> int:
        return self.v * self.vl

    # the decisions derived from the fields above, printed by `eqfuse lower` with them
    DERIVED = ("algorithm", "reorder", "epi_blocked")

    @property
    def epi_blocked(self) -> bool:
        """The template's EPI_BLOCKED: the epilogue reads some operands in blocks of VL channels."""
        return bool(self.blocked_args)

    @property
    def algorithm(self) -> str:
        """The template: winograd (conv_winograd.c), pixels in the lanes (conv_pixels.c) or
        channels in the lanes (conv_direct.c)."""
        return "winograd" if self.winograd else "pixels" if self.pixels else "channels"

    @property
    def regions(self) -> bool:
        """Whether the parallel loops are eqf_region ranges (common_pool.h), which the call runs as
        OpenMP's static split or on the claim-based pool (eqfuse.runtime.load.region_mode): every
        template's (Winograd, channels or pixels in the lanes); the run function holds the pool's
        workers over the kernel when they run on the pool (eqfuse.runtime.program.hold_pool)."""
        return True

    @property
    def reorder(self) -> bool:
        """The template's REORDER: an NCHW output stored in blocks, then reordered (the
        channels-in-the-lanes and Winograd templates; never with pixels in the lanes)."""
        if self.pixels:
            return False
        return winograd_reorders(self) if self.winograd else reorders(self)



def register_tiles(simd_floats: int, rows: bool) -> list[tuple[int, int]]:
    """The (V, RW) register tiles a machine offers: RW x V accumulators, V weight vectors and
    one broadcast fit its vector registers (32 with AVX-512, 16 below). A tile of pixels from
    anywhere (not `rows`) holds a pointer per pixel: at most 8, to stay in the 16 general
    registers; a tile along one output row needs one pointer: up to 12 pixels (16 measured
    slower on a 7x7 stem: `benchmarks/bench_conv.py --set resnet18`, row "stem 3->16 7x7/2 @64")."""
    regs = 32 if simd_floats >= 16 else 16
    return [(v, rw) for v in (1, 2, 3, 4) for rw in range(2, 13 if rows else 9) if rw * v + v + 1 <= regs]


def tile_cost(shape: tuple[int, int, int, int, int, int], m: Machine, v: int, rw: int, rows: bool) -> float:
    """Cycles of a whole conv with this tile, as a model. shape = (N, OH, OW, O, steps, taps), taps
    being input-channel blocks x kernel rows, steps CB x KW. A tile takes, per tap, `steps` of
    max(FMAs / 2 (two FMA ports), 5 (each accumulator's chain: an FMA's latency and the
    broadcast's; 8 accumulators measured slower than 12 on a 7x7 stem), loads / 2.5 (weight
    vectors and broadcasts), its weight vectors' stream) plus its pointer work (one pointer along a row, one per pixel otherwise),
    then its store (about a cycle per 8 outputs). A channel block's first tile streams its
    weights from L3 (~3 cycles per 64 B), the others from L2 unless the block's weights exceed
    half of it. Padding lanes and pixels count as work. Measured, 3x3 convs: 128 channels at
    2 x 2, two images, 8 pixels x 2 vectors beat 4 x 4 (the weight stream of a block read by one
    tile); `benchmarks/bench_conv.py --set resnet18` times the stem and "l4 128 3x3 @2"."""
    N, OH, OW, O, cb, taps = shape
    vl = m.simd_floats
    per_block = N * OH * cdiv(OW, rw) if rows else cdiv(N * OH * OW, rw)

    def tile(wc: float) -> float:
        step = max(rw * v / 2, 5, (rw + v) / 2.5, wc * v * vl / 16)
        return taps * (cb * step + (1 if rows else rw / 2)) + rw * v * vl / 8
    rest = tile(3 if taps * cb * v * vl * 4 > m.l2 // 2 else 0.5)
    return cdiv(O, v * vl) * (tile(3) + (per_block - 1) * rest)


def choose_tile(m: Machine, shape: tuple[int, int, int, int, int, int]) -> tuple[int, int, bool]:
    """(V, RW, rows) of least `tile_cost`; ties go to the wider channel block, more pixels, rows."""
    cands = [(v, rw, rows) for rows in (True, False) for v, rw in register_tiles(m.simd_floats, rows)]
    return min(cands, key=lambda t: (tile_cost(shape, m, *t), -t[0], -t[1], not t[2]))


def pixel_tiles(simd_floats: int, one_d: bool = False) -> list[tuple[int, int, int]]:
    """(RO, RPH, RPW) tiles of the pixel-vector kernel: RO x RPH x RPW accumulators, the RPH x RPW
    input vectors and one broadcast weight fit the vector registers. A 1-D conv's long rows
    (`one_d`) may also take rows of 4 or 6 vectors."""
    regs = 32 if simd_floats >= 16 else 16
    return [(ro, rph, rpw) for ro in (2, 4, 6, 8, 12, 16) for rph in (1, 2, 3, 4)
            for rpw in ((1, 2, 3, 4, 6) if one_d and rph == 1 else (1, 2, 3))
            if ro * rph * rpw + rph * rpw + 1 <= regs]


def choose_pixel_tile(m: Machine, N: int, OH: int, OW: int, O: int, one_d: bool = False) -> tuple[int, int, int]:
    """The pixel-vector tile of least work (padding pixels and channels included) per load of
    its inner step (RPH x RPW vectors, RO broadcasts for RO x RPH x RPW FMAs), at least 5
    cycles a step (an FMA's latency); ties go to fewer rows, then (`one_d`) to fewer loads per FMA
    (whisper conv1, RO x RPW of 6 x 4 against 12 x 2: `benchmarks/bench_conv.py --set whisper`),
    then to more channels."""
    vl = m.simd_floats

    def cost(t):
        ro, rph, rpw = t
        tiles = cdiv(O, ro) * N * cdiv(OH, rph) * cdiv(OW, rpw * vl)
        return tiles * max(ro * rph * rpw / 2, 5, (ro + rph * rpw) / 1.5), rph, (ro + rph * rpw) / (ro * rph * rpw) if one_d else 0, -ro
    return min(pixel_tiles(vl, one_d), key=cost)


def one_d_pixels(m: Machine, N: int, C: int, H: int, KH: int, KW: int, OH: int, OW: int, O: int,
                 SW: int) -> tuple[int, int, int] | None:
    """The pixel tile of a 1-D conv (one input row, one kernel row: conv1d) that puts its pixels in
    the vector lanes (conv_pixels.c) whatever its channel count, or None: when its rows hold at
    least 4 vectors of pixels and a tile's input window (C rows of RPW x VL x SW + KW floats) and
    its channel tile's weights fit L1, so that the channel tiles, run innermost, read the window
    from L1. A tile row is then the output's NCHW row (no reorder pass) and its input a window of
    the padded row read where it is: the GEMM of overlapping windows without an im2col copy.
    Measured with their GELU (`benchmarks/bench_conv.py --set whisper`, figures in
    benchmarks/RESULTS.md): Whisper's conv1 (80 -> 384 channels, 3000 frames; a 21 KB window) 6%
    less time than channels in the lanes; its conv2 (384 channels, stride 2; a 200 KB window)
    even to 5% more, so it keeps channels in the lanes."""
    vl = m.simd_floats
    if not (H == 1 and KH == 1 and OH == 1 and OW >= 4 * vl):
        return None
    t = choose_pixel_tile(m, N, OH, OW, O, one_d=True)
    ro, _, rpw = t
    window = C * (rpw * vl * SW + KW) * F32
    return t if window + C * KW * ro * F32 <= m.l1 else None


def o_inner(N: int, C: int, KH: int, KW: int, OH: int, OW: int, O: int, SH: int, SW: int, vl: int,
            pixels: tuple[int, int, int], row_align: bool = False) -> bool:
    """conv_pixels.c's OINNER: the channel tiles innermost when the input streamed once per channel
    tile (channel tiles outermost) is more than the weights streamed once per pixel tile (the
    input window of a pixel tile, held in cache while every channel tile reads it). Whisper's conv2
    (384 -> 384, stride 2, 3000 frames) with its pixel tile forced (EQFUSE_CONV_PIXELS=6,1,4):
    4.6 MB of input x 64 channel tiles against 1.8 MB of weights x 24 pixel tiles, 19% less time
    inner (`benchmarks/bench_conv.py --set whisper`)."""
    ro, rph, rpw = pixels
    tw = rpw * vl
    nto, nth, ntw = cdiv(O, ro), cdiv(OH, rph), cdiv(OW, tw)
    hp, wq = (nth * rph - 1) * SH + KH, ntw * tw + (KW - 1) // SW + 1
    wq = cdiv(wq, vl) * vl if row_align else wq
    return nto * N * C * hp * SW * wq > N * nth * ntw * C * KH * KW * nto * ro


def region_chunks(macs: int) -> int:
    """The equal ranges the tiles' loop of a direct conv is cut into on the claim-based pool
    (common_pool.h, eqf_region_n): 256 when each then holds at least 2^19 multiply-adds, else
    common_pool.h's 64. The two threads claim ranges from opposite ends, and the one that runs out
    first waits for the other's last range: half a range on average, 1/128 of the loop with 64.
    Whisper's conv2 (384 channels, stride 2, 3000 frames) at 2 threads is faster with 256 than
    with 64 (`benchmarks/bench_conv.py --set whisper --threads 2`, its figures in
    benchmarks/RESULTS.md); a range of fewer multiply-adds would pay its
    claim (an atomic on a shared line) more than it saves."""
    return 256 if macs >= 256 << 19 else 64


def use_direct(KH: int, KW: int, SH: int, SW: int, amx: bool = False) -> bool:
    """Whether the direct kernel runs a conv rather than im2col + GEMM: never when the GEMM is on
    AMX tiles (`amx`: a bf16 conv on a CPU with AMX-BF16, whose im2col GEMM packs its panels from
    the image, plan_gemm.implicit_im2col, where the direct conv has only vdpbf16ps); else when its windows overlap
    (a stride smaller than the window). im2col's column matrix holds each input element
    KH x KW / (SH x SW) times; with windows that do not overlap (1x1 convs, a ViT's or a
    Mixer's patch embedding) it is the input itself (stride 1), a part of it, or a permutation
    of it, no more than the direct kernel's padded copy, and the GEMM can store its result
    transposed into a token concat (plan_gemm.conv_c_layout). `benchmarks/bench_conv.py` measures
    the choice (figures in benchmarks/RESULTS.md). EQFUSE_CONV=direct|im2col forces either."""
    force = os.environ.get("EQFUSE_CONV", "").strip().lower()
    if force in ("direct", "im2col"):
        return force == "direct"
    return not amx and (SH < KH or SW < KW)


def plan_conv_direct(plan: KernelPlan, m: Machine, force: bool = False) -> bool:
    """Plan plan's conv2d as a direct conv when `use_direct` says so or `force` (True); else plan
    nothing."""
    body, a = plan.body, plan.shape.anchor
    cv = body.nodes[a]
    g = conv_geometry(plan, a)
    N, C, H, KH, KW, OH, OW, (sh, sw) = g.N, g.C, g.H, g.KH, g.KW, g.OH, g.OW, g.stride
    O = cv.type.shape[1]
    if tuple(cv.type.shape) != tuple(plan.out_shape) or plan.in_strides:
        return False  # (an epilogue that broadcasts, inputs read through views: im2col's rules)
    if g.dilation != (1, 1) or cv.attr.get("group", 1) != 1:
        return False  # (a dilated conv: im2col, which spaces the taps; grouped: conv_grouped)
    NP, K = N * OH * OW, C * KH * KW
    # (AMX tiles where the im2col GEMM's B would be packed from the image, plan_gemm.implicit_im2col:
    # not with fewer pixels than channels, whose GEMM reads a column matrix as rows)
    amx = plan.wanted_precision == "bf16" and gemm_bf16_path(m) == "amx_bf16" and bf16_pays(m, "amx_bf16") \
        and not pixels_as_rows(O, OH * OW)
    if not force and not use_direct(KH, KW, sh, sw, amx):
        return False
    vl = m.simd_floats
    bf16 = computes_as_wanted(plan, m, bf16_path(m))
    cb = min(C, vl)
    # (bf16: an instruction step multiplies a K-pair, so a tap row is half as many steps, rounded up)
    v, rw, rows = choose_tile(m, (N, OH, OW, O, cdiv(cb * KW, 2) if bf16 else cb * KW, cdiv(C, cb) * KH))
    # one vector of output channels: each FMA would need its own broadcast input value; with
    # the pixels in the lanes, RO broadcast weights serve RPH x RPW vectors of pixels
    # (a 1-D conv's long rows: `one_d_pixels`)
    one_d = one_d_pixels(m, N, C, H, KH, KW, OH, OW, O, sw)
    pixels = (one_d or choose_pixel_tile(m, N, OH, OW, O)) if (v == 1 and 2 * OW >= vl or one_d) and \
        os.environ.get("EQFUSE_CONV_PIXELS", "1") != "0" else None
    if "," in os.environ.get("EQFUSE_CONV_PIXELS", ""):  # "RO,RPH,RPW": a pixel tile forced, to measure others
        pixels = tuple(int(t) for t in os.environ["EQFUSE_CONV_PIXELS"].split(","))
    if bf16:  # (conv_pixels.c has no bf16 path: channels in the lanes, which do)
        pixels = None
    if os.environ.get("EQFUSE_CONV_TILE"):  # "V,RW,ROWS": a tile forced, to measure others
        v, rw, rows = (int(t) for t in os.environ["EQFUSE_CONV_TILE"].split(","))
        if (v, rw) not in register_tiles(vl, bool(rows)):
            raise ValueError(f"EQFUSE_CONV_TILE={v},{rw},{rows} is not a register tile of this machine")
        rows = bool(rows)
    par = parallel(NP, O, K, 1)
    d = ConvDirectDetail(**asdict(g), O=O, cb=cb, vl=vl, v=v, rw=rw, rows=rows, parallel=par, pixels=pixels,
                         region_chunks=region_chunks(NP * O * K))
    if pixels:  # (a 1-D conv's long rows: aligned at the cost of under a vector each, `one_d_pixels`)
        d = replace(d, o_inner=o_inner(N, C, KH, KW, OH, OW, O, sh, sw, vl, pixels, bool(one_d)),
                    row_align=bool(one_d))
    plan.detail = d
    plan.tiles = {"cb": cb, "obw": d.obw, "rw": rw, "rows": int(rows)}  # (constants of the C)
    if pixels:
        plan.tiles = dict(zip(("ro", "rph", "rpw"), pixels))
    plan.flops = 2 * NP * O * K + pointwise_flops(body)
    path = plan.precision_path
    if use_winograd(d, vl):
        plan_winograd(plan, m, d)
        return True
    ncb, nob = cdiv(C, cb), cdiv(O, d.obw)
    nt = N * OH * cdiv(OW, rw) if rows else cdiv(NP, rw)
    hp, wp = (OH - 1) * sh + KH, (OW - 1) * sw + KW
    regs = rw * v + v + 1
    eb = 2 if bf16 else F32  # (bytes of a blocked weight: bf16 halves)
    plan.cache_check = (f"registers: {rw} x {v} accumulators + {v} weights + 1 broadcast = {regs} vectors; "
                        f"one tap's weights {cb} x {d.obw} x {eb} = {cb * d.obw * eb} B, "
                        f"a channel block's {ncb * KH * KW * cb * d.obw * eb} B <= L2 {m.l2} B: "
                        f"{'ok' if ncb * KH * KW * cb * d.obw * eb <= m.l2 else 'NO'}")
    plan.threads = (f"the input copy's rows, then the {nob} channel blocks x {nt} pixel tiles (channel blocks "
                    f"outermost), {REGIONS}"
                    if par else f"one thread, no parallel region ({NP * O * K} multiply-adds < 2^18)")
    epi = ops_text(body, skip={a} | set(cv.args))
    op = {"avx512_bf16": "vdpbf16ps K-pair steps", "fallback": "K-pair steps (bf16 widened, FMA)"}.get(path,
                                                                                                    "FMA steps")
    plan.uops += [
        UOp(0, "Exec", "weights to blocks [NOB][NCB][KH][KW][CB][OBW] (once when bound by params=)"
                       + (", bf16 K-pairs [NOB][NCB][KH][KW x CB / 2, rounded up][OBW][2]" if bf16 else ""), 1),
        UOp(0, "Load", f"input to a zero-padded copy [N][{ncb}][{hp}][{wp}][{cb}]"
                       + (", rounded to bf16" if bf16 else ""), N * ncb * hp),
        UOp(0, "Loop", f"{nob} channel blocks of {d.obw} x {nt} tiles of {rw} pixels"
                       f"{' along an output row' if rows else ''}", nob * nt),
        UOp(1, "Exec", f"{rw} x {d.obw} register tile over {ncb} x {KH} taps of "
                       + (f"{KW * cb // 2} {op}" + (" + 1 FMA step" if KW * cb % 2 else "") if bf16 else f"{KW * cb} {op}"),
            nob * nt * ncb * KH),
        UOp(1, "Store", f"tile through the epilogue ({epi or 'none'}) into NCHW", nob * nt)]
    if pixels:
        _pixel_plan(plan, m, epi)
    return True


def _pixel_plan(plan: KernelPlan, m: Machine, epi: str) -> None:
    """The cache check, thread rule and uops of a pixel-vector conv (conv_pixels.c)."""
    d = plan.detail
    ro, rph, rpw = d.pixels
    tw = rpw * d.vl
    nt = cdiv(d.O, ro) * d.N * cdiv(d.OH, rph) * cdiv(d.OW, tw)
    hp = (cdiv(d.OH, rph) * rph - 1) * d.stride[0] + d.KH
    wq = cdiv(d.OW, tw) * tw + (d.KW - 1) // d.stride[1] + 1
    wq = cdiv(wq, d.vl) * d.vl if d.row_align else wq  # (whole vectors)
    regs = ro * rph * rpw + rph * rpw + 1
    plan.cache_check = (f"registers: {ro} x {rph} x {rpw} accumulators + {rph * rpw} pixel vectors + 1 broadcast = "
                        f"{regs} vectors <= {32 if m.simd_floats >= 16 else 16}: ok")
    if d.parallel:
        order = "channel tiles innermost" if d.o_inner else "channel tiles outermost"
        plan.threads = (f"the padded copy's rows, then the {nt} tiles ({ro} channels x {rph} rows x {tw} pixels, "
                        f"{order}), {REGIONS}")
    plan.uops = [
        UOp(0, "Exec", "weights to [NTO][C][KH][KW][RO] (once when bound by params=)", 1),
        UOp(0, "Load", f"input to a zero-padded copy, rows split by column phase [N][{d.C}][{hp}][{d.stride[1]}][{wq}]",
            d.N * d.C * hp),
        UOp(0, "Loop", f"{nt} tiles of {ro} output channels x {rph} rows x {tw} pixels"
                       f"{', channel tiles innermost' if d.o_inner else ''}", nt),
        UOp(1, "Exec", f"{rph * rpw} pixel vectors x {ro} broadcast weights per input channel and tap",
            nt * d.C * d.KH * d.KW),
        UOp(1, "Store", f"tile through the epilogue ({epi or 'none'}) into NCHW, a channel's pixels together", nt)]


def mark_bound(plan: KernelPlan, bound: set[int]) -> None:
    """detail.prepack when the weights are a body input bound by params= and read by nothing
    else in the kernel: the runtime then blocks them once (`NAME_prepack`)."""
    body = plan.body
    w = body.nodes[plan.shape.anchor].args[1]
    if w not in bound or len([n for n in body.nodes if w in n.args]) != 1:
        return
    plan.detail = replace(plan.detail, prepack=Prepack(body.inputs.index(w), f"{plan.name}_prepack",
                                                       f"{plan.name}_prepack_floats"))
    plan.uops = [replace(u, what="weights blocked once when bound (params=), read in place")
                 if u.what.startswith(("weights to blocks", "weights to [NTO]", "weights to B tiles")) else u for u in plan.uops]


def edge_tiles(d: ConvDirectDetail) -> tuple[int, int]:
    """(EL, ER) of a ROWS tiling read in place: the tile columns tr < EL have windows crossing the
    image's left edge, those from ER on its right edge (or a short tile's past the row end); the
    columns between read the image in place."""
    tr_n, step, wl = cdiv(d.OW, d.rw), d.rw * d.stride[1], (d.rw - 1) * d.stride[1] + d.KW
    el = min(tr_n, cdiv(d.padding[1], step))
    er = next((t for t in range(el, tr_n) if t * step - d.padding[1] + wl > d.W), tr_n)
    return el, er


def reorders(d: ConvDirectDetail) -> bool:
    """Whether an NCHW output is stored in blocks first and reordered after (conv_direct.c's
    REORDER): tiles along rows, whole blocks of VL channels, rows at least VL pixels wide."""
    return (d.rows and not d.out_blocked and d.O % d.vl == 0 and d.OW >= d.vl and d.vl in (4, 8, 16)
            and os.environ.get("EQFUSE_CONV_REORDER", "1") != "0")


def transpose_c(vl: int, vf: str) -> str:
    """C lines transposing m[VL] (VL vectors of VL floats) in place with two-input shuffles:
    log2(VL) stages; at block size h, rows i and i + h exchange blocks of h lanes."""
    lines, h = [], vl // 2
    while h >= 1:
        lo = [(kb % 2) * vl + (kb // 2) * 2 * h + w for kb in range(vl // h) for w in range(h)]
        hi = [x + h for x in lo]
        lines.append(f"            {{ const vi lo = {{{', '.join(map(str, lo))}}}, hi = {{{', '.join(map(str, hi))}}};")
        for i in range(vl):
            if i & h == 0:
                lines.append(f"              const {vf} a{i} = m[{i}], b{i} = m[{i + h}];")
                lines.append(f"              m[{i}] = __builtin_shuffle(a{i}, b{i}, lo); m[{i + h}] = __builtin_shuffle(a{i}, b{i}, hi);")
        lines.append("            }")
        h //= 2
    return "\n".join(lines)


def reorder_fn(name: str, vl: int) -> str:
    """The C of NAME_reorder (csrc_templates/conv_reorder.c): blocks of VL channels to NCHW."""
    return render("conv_reorder.c", NAME=name, VL=vl, TRANSPOSE=transpose_c(vl, f"{name}_vf"))


def epilogue_c(plan: KernelPlan) -> tuple[str, str]:
    """(the epilogue's C expression of `acc`, the declarations of the operands it reads) of a
    direct or Winograd conv: acc is the conv's sum at output element (b, i, j), j = oh x OW + ow;
    operands in blocks of VL channels (detail.blocked_args) are read at `blk`."""
    body, a, d = plan.body, plan.shape.anchor, plan.detail
    cv = body.nodes[a]
    _, ptrs = kernel_params(plan)
    groups = [("b", [0], False), ("i", [1], False), ("j", [2, 3], False)]
    bias = f"eqf_e{body.inputs.index(cv.args[2])}" if len(cv.args) == 3 else None
    preset = {a: f"(acc + {bias}[i])" if bias else "acc"}
    for k in d.blocked_args:  # read at the output element's offset in blocks (`blk`, conv_direct.c)
        preset[body.inputs[k]] = f"eqf_e{k}[blk]"
    expr, extras = gemm_epilogue(plan, groups, preset)
    if bias and cv.args[2] not in dict(extras):
        extras.append((cv.args[2], bias))
    return expr, "\n".join(f"    const {c_type(body, i)}* restrict {name} = {ptrs[i]};" for i, name in extras)


def emit_conv_direct(plan: KernelPlan) -> str:
    if plan.detail.winograd:
        return emit_conv_winograd(plan)
    body, a = plan.body, plan.shape.anchor
    cv, d = body.nodes[a], plan.detail
    params, ptrs = kernel_params(plan)
    expr, decls = epilogue_c(plan)
    if d.pixels:
        ro, rph, rpw = d.pixels
        return render("conv_pixels.c", NAME=plan.name, PARAMS=params, EXTRAS=decls, X=ptrs[cv.args[0]],
                      WEIGHTS=ptrs[cv.args[1]], PREPACKED=int(d.prepack is not None), PARALLEL=int(d.parallel),
                      EPILOGUE=expr, O=d.O, **d.shape_c("DH", "DW"), VL=d.vl, RO=ro, RPH=rph,
                      RPW=rpw, OINNER=int(d.o_inner), ALIGN=int(d.row_align), CHUNKS=d.region_chunks,
                      **param_job(params))
    el, er = edge_tiles(d)
    return render("conv_direct.c", NAME=plan.name, PARAMS=params, EXTRAS=decls, X=ptrs[cv.args[0]],
                  WEIGHTS=ptrs[cv.args[1]], PREPACKED=int(d.prepack is not None), PARALLEL=int(d.parallel),
                  EPILOGUE=expr, O=d.O, **d.shape_c("DH", "DW"), CB=d.cb, VL=d.vl, V=d.v, OBW=d.obw,
                  RW=d.rw, ROWS=int(d.rows), CHUNKS=d.region_chunks, IN_BLOCKED=int(d.in_blocked), OUT_BLOCKED=int(d.out_blocked),
                  INPLACE=int(d.in_place), EDGE_L=el, EDGE_R=er, REORDER=int(d.reorder), BF16=BF16_PATHS[plan.precision_path],
                  REORDER_FN=reorder_fn(plan.name, d.vl) if d.reorder else "",
                  EPI_BLOCKED=int(d.epi_blocked), EPILOGUE_NCHW="acc" if d.blocked_args else expr,
                  **param_job(params))


def can_run(d, vl: int) -> bool:
    """Whether the kernel runs this conv: 3x3, stride 1, whole vectors of input and output channels."""
    return (d.KH, d.KW) == (3, 3) and d.stride == (1, 1) and d.C % vl == 0 and d.O % vl == 0


def use_winograd(d, vl: int) -> bool:
    """Whether a 3x3 stride-1 conv runs as Winograd: the kernel can run it and the output is at
    least 8 x 8 pixels (a smaller map wastes a larger share of its 2 x 2 tiles and its transforms
    weigh more against the GEMMs). EQFUSE_CONV_WINOGRAD=0|1 forces either where it can run."""
    if not can_run(d, vl):
        return False
    force = os.environ.get("EQFUSE_CONV_WINOGRAD", "").strip()
    if force in ("0", "1"):
        return force == "1"
    return d.OH >= 8 and d.OW >= 8


def gemm_tile(m: Machine, C: int, O: int) -> tuple[int, int]:
    """(V, RW) of the GEMMs' register tile: RW x V accumulators, V weight vectors and a broadcast
    in the vector registers, V x VL dividing O; the fewest cycles per C steps by the direct
    conv's model of a step (two FMA ports, 5 cycles of an FMA's chain, 2.5 loads a cycle) plus
    the tile's stores."""
    vl, regs = m.simd_floats, 32 if m.simd_floats >= 16 else 16
    cands = [(v, rw) for v in (1, 2, 3, 4) for rw in range(2, 15)
             if rw * v + v + 1 <= regs and O % (v * vl) == 0]

    def cost(t):
        v, rw = t
        step = max(rw * v / 2, 5, (rw + v) / 2.5)
        return (O // (v * vl)) * (C * step + rw * v + 10) / rw, -v
    return min(cands, key=cost)


def tiles_per_block(m: Machine, C: int, O: int, rw: int) -> int:
    """TB: a thread's Vb and Mb (TB x (16 x (C + O) + 32) floats) in half of L2, a multiple of RW, at most 64."""
    tb = min(64, m.l2 // 2 // (F32 * (16 * (C + O) + 32)))
    return max(rw, tb // rw * rw)


def plan_winograd(plan: KernelPlan, m: Machine, d) -> None:
    """Plan the direct conv's detail d as Winograd F(2x2, 3x3) (use_winograd said so)."""
    v, rw = gemm_tile(m, d.C, d.O)
    if os.environ.get("EQFUSE_WINOGRAD_TILE"):  # "V,RW": a GEMM tile forced, to measure others
        v, rw = (int(t) for t in os.environ["EQFUSE_WINOGRAD_TILE"].split(","))
    tb = tiles_per_block(m, d.C, d.O, rw)
    d = replace(d, cb=d.vl, v=v, rw=rw, rows=False, pixels=None, winograd=tb)
    plan.detail = d
    plan.tiles = {"obw": d.obw, "rw": rw, "tb": tb}  # (constants of the C)
    th, tw = cdiv(d.OH, 2), cdiv(d.OW, 2)
    t = d.N * th * tw  # (plan.flops stays the conv's own count: 2 x 9 x C per output element)
    nb = cdiv(t, tb)
    regs, scratch = rw * v + v + 1, tb * (16 * (d.C + d.O) + 32) * F32
    bf16 = plan.precision == "bf16"
    plan.cache_check = (f"registers: {rw} x {v} accumulators + {v} weights + 1 broadcast = {regs} vectors; "
                        f"a thread's transformed tiles {tb} x (16 x ({d.C} + {d.O}) + 32) x {F32} = {scratch} B "
                        f"<= L2 / 2 {m.l2 // 2} B: {'ok' if scratch <= m.l2 // 2 else 'NO (one register tile of rows)'}")
    plan.threads = (f"the input's rows, the {nb} blocks of {tb} tiles of 2 x 2 pixels and the reorder's rows, "
                    f"{REGIONS}" if d.parallel else "one thread, no parallel region")
    epi = ops_text(plan.body, skip={plan.shape.anchor} | set(plan.body.nodes[plan.shape.anchor].args))
    plan.uops = [
        UOp(0, "Exec", "weights to blocks, Winograd-transformed: U = G g G^T, [16][O / OBW][C][OBW] "
                       "(once when bound by params=)" + (", bf16 K-pairs [16][O / OBW][C / 2][OBW][2]" if bf16 else ""),
            1),
        UOp(0, "Loop", f"{nb} blocks of {tb} tiles of 2 x 2 output pixels", nb),
        UOp(1, "Load", f"input windows 4 x 4 x {d.vl} channels, B^T d B into [16][{tb}][{d.C}]"
                       + (" (f32), rounded to bf16 as stored" if bf16 else ""),
            t * (d.C // d.vl)),
        UOp(1, "Exec", f"16 GEMMs {tb} x {d.C} x {d.O}: {rw} x {d.obw} register tiles over "
                       + (f"{d.C // 2} K-pair steps ({'vdpbf16ps' if plan.precision_path == 'avx512_bf16' else 'bf16 widened, FMA'}"
                          ", f32 accumulation)" if bf16 else f"{d.C} steps"),
            16 * (d.O // d.obw) * t // rw),
        UOp(1, "Store", f"A^T m A per tile and {d.vl} output channels through the epilogue ({epi or 'none'})"
                        " into NCHW", t * (d.O // d.vl))]


def winograd_reorders(d) -> bool:
    """Whether an NCHW output is stored in blocks, then reordered (conv_reorder.c): whole rows of VL pixels."""
    return not d.out_blocked and d.OW >= d.vl and d.vl in (4, 8, 16)


def emit_conv_winograd(plan: KernelPlan) -> str:
    d, cv = plan.detail, plan.body.nodes[plan.shape.anchor]
    params, ptrs = kernel_params(plan)
    expr, decls = epilogue_c(plan)
    ro = d.reorder
    return render("conv_winograd.c", NAME=plan.name, PARAMS=params, EXTRAS=decls, X=ptrs[cv.args[0]],
                  WEIGHTS=ptrs[cv.args[1]], PREPACKED=int(d.prepack is not None), PARALLEL=int(d.parallel),
                  EPILOGUE=expr, N=d.N, C=d.C, H=d.H, W=d.W, O=d.O, OH=d.OH, OW=d.OW, PH=d.padding[0],
                  PW=d.padding[1], VL=d.vl, V=d.v, OBW=d.obw, RW=d.rw, TB=d.winograd, IN_BLOCKED=int(d.in_blocked),
                  BF16=BF16_PATHS[plan.precision_path],
                  OUT_BLOCKED=int(d.out_blocked), REORDER=int(ro), REORDER_FN=reorder_fn(plan.name, d.vl) if ro else "",
                  **param_job(params))


def _blocked_layout(name: str, H, W, OH, OW) -> list[str]:
    """The macros a blocked pooling reads its operands through, chosen by the template's #defines
    of the plan's in_blocked, out_blocked and vl (NAME_IN_BLOCKED, ...): a pixel's VL channels are
    VL consecutive floats (blocked) or VL planes apart (NCHW); nb = n x C / VL + the channel block."""
    vl = f"{name}_VL"
    return [f"#if {name}_IN_BLOCKED",
            f"#define {name}_ROW(nb, h) (((nb) * {H} + (h)) * {W}L * {vl})",
            f"#define {name}_PX {vl}",
            f"#define {name}_LANE(l) (l)",
            "#else",
            f"#define {name}_ROW(nb, h) ((nb) * {vl} * {H * W}L + (h) * {W}L)",
            f"#define {name}_PX 1",
            f"#define {name}_LANE(l) ((l) * {H * W}L)",
            "#endif",
            f"#if {name}_OUT_BLOCKED",
            f"#define {name}_DST(nb, oh, ow, l) ((((nb) * {OH} + (oh)) * {OW}L + (ow)) * {vl} + (l))",
            "#else",
            f"#define {name}_DST(nb, oh, ow, l) (((nb) * {vl} + (l)) * {OH * OW}L + (oh) * {OW}L + (ow))",
            "#endif"]


def _undef(name: str) -> list[str]:
    return [f"#undef {name}_{m}" for m in ("ROW", "PX", "LANE", "DST")]


def pool_blocked(an, x: str, xs, out, name: str) -> list[str]:
    """C lines of a max or avg pooling over VL channels at a time, the input and the output each
    NCHW or in blocks of VL channels (kernel `name`'s NAME_IN_BLOCKED, NAME_OUT_BLOCKED and
    NAME_VL, its plan's choices, which the C reads): one vector per output pixel, the window's
    in-bounds taps (max_pool2d keeps a NaN, as the NCHW loop does)."""
    N, C, H, W = xs[0]
    OH, OW = out[2], out[3]
    (kh, kw), (sh, sw), (ph, pw) = (pair(an.attr["kernel_size"]), pair(an.attr["stride"] or an.attr["kernel_size"]),
                                    pair(an.attr["padding"]))
    is_max = an.op == "max_pool2d"
    if is_max and kh * kw <= 25 and ph < kh and pw < kw:
        return _max_pool_taps(x, (N, C, H, W), (OH, OW), (kh, kw), (sh, sw), (ph, pw), name)
    vl = f"{name}_VL"
    val = "a[l] = ((v > a[l]) | (v != v)) ? v : a[l];" if is_max else "a[l] += v;"
    if is_max:
        fin = "a[l]"
    elif an.attr["count_include_pad"]:
        fin = f"a[l] / {kh * kw}.0f"
    else:
        fin = "a[l] / cnt"
    return [*_blocked_layout(name, H, W, OH, OW),
            f"#pragma omp parallel for if ({name}_PARALLEL)",
            f"for (long t = 0; t < {N * C}L / {vl} * {OH}; t++) {{",
            f"    const long nb = t / {OH}, oh = t % {OH};",
            f"    for (long ow = 0; ow < {OW}; ow++) {{",
            f"        float a[{vl}];{'' if is_max else ' float cnt = 0.0f;'}",
            f"        for (long l = 0; l < {vl}; l++) a[l] = {'-INFINITY' if is_max else '0.0f'};",
            f"        for (long dh = 0; dh < {kh}; dh++) {{",
            f"            const long h = oh * {sh} - {ph} + dh;",
            f"            if (h < 0 || h >= {H}) continue;",
            f"            for (long dw = 0; dw < {kw}; dw++) {{",
            f"                const long w = ow * {sw} - {pw} + dw;",
            f"                if (w < 0 || w >= {W}) continue;",
            f"                const float* restrict s = {x} + {name}_ROW(nb, h) + w * {name}_PX;",
            *([] if is_max else ["                cnt += 1.0f;"]),
            "#pragma omp simd",
            f"                for (long l = 0; l < {vl}; l++) {{",
            f"                    const float v = s[{name}_LANE(l)];",
            f"                    {val}",
            "                }",
            "            }",
            "        }",
            "#pragma omp simd",
            f"        for (long l = 0; l < {vl}; l++)",
            f"            out[{name}_DST(nb, oh, ow, l)] = {fin};",
            "    }",
            "}",
            *_undef(name)]


def _max_pool_taps(x: str, xs, os_, k, st, pad, name: str) -> list[str]:
    """max_pool2d over VL channels at a time, the window's taps unrolled: one vector loop per output
    pixel (lanes: channels) with a max per tap and no bounds branches: a tap outside the image
    reads the nearest row / column inside instead, which is in the same window (the padding is
    smaller than the window), and max is idempotent. A NaN anywhere in the window makes the output
    NaN (numpy's maximum; x86's max would drop it): its flag is the or of the taps' v != v. The
    generic loop (`pool_blocked`) kept a vector of maxima in memory and branched on every tap's
    bounds: twice the time on a ResNet stem's 3x3/2 pool of 64 x 112 x 112 (one thread, its input in
    cache; `benchmarks/bench_models.py --model resnet_stages`)."""
    N, C, H, W = xs
    OH, OW = os_
    (kh, kw), (sh, sw), (ph, pw) = k, st, pad
    vl = f"{name}_VL"
    clamp = lambda v, n: f"{v} < 0 ? 0 : {v} > {n - 1} ? {n - 1} : {v}"
    lines = [*_blocked_layout(name, H, W, OH, OW),
             f"#pragma omp parallel for if ({name}_PARALLEL)",
             f"for (long t = 0; t < {N * C}L / {vl} * {OH}; t++) {{",
             f"    const long nb = t / {OH}, oh = t % {OH};"]
    for dh in range(kh):
        lines += [f"    const long h{dh} = oh * {sh} - {ph} + {dh};",
                  f"    const float* restrict r{dh} = {x} + {name}_ROW(nb, {clamp(f'h{dh}', H)});"]
    # the next output row's new input rows into the cache along this row (blocked input): the
    # ResNet stem's output comes from L3 in the model, where this is faster, though slower with
    # the input in L2 (the prefetches' load slots): benchmarks/bench_models.py --model resnet_stages
    ahead = list(range(max(0, kh - sh), kh))
    if ahead:
        lines += [f"#if {name}_IN_BLOCKED",
                  *(f"    const float* p{dh} = {x} + {name}_ROW(nb, {clamp(f'h{dh} + {sh}', H)});" for dh in ahead),
                  "#endif"]
    lines += [f"    for (long ow = 0; ow < {OW}; ow++) {{"]
    for dw in range(kw):
        lines += [f"        const long w{dw} = ow * {sw} - {pw} + {dw}, c{dw} = ({clamp(f'w{dw}', W)}) * {name}_PX;"]
    if ahead:  # the cache lines of the next sw pixels of the rows the next output row adds
        lines += [f"#if {name}_IN_BLOCKED",
                  *(f"        for (long q = 0; q < ({sw} * {vl} / 16 > 1 ? {sw} * {vl} / 16 : 1); q++) __builtin_prefetch(p{dh} + c{kw - 1} + q * 16);"
                    for dh in ahead),
                  "#endif"]
    lines += ["#pragma omp simd", f"        for (long l = 0; l < {vl}; l++) {{"]
    taps = [(dh, dw) for dh in range(kh) for dw in range(kw)]
    for i, (dh, dw) in enumerate(taps):
        v = f"r{dh}[c{dw} + {name}_LANE(l)]"
        if i == 0:
            lines += [f"            float a = {v};", "            int u = a != a;"]
        else:
            lines += [f"            const float v{i} = {v};",
                      f"            a = v{i} > a ? v{i} : a;",
                      f"            u |= v{i} != v{i};"]
    lines += [f"            out[{name}_DST(nb, oh, ow, l)] = u ? NAN : a;", "        }", "    }", "}", *_undef(name)]
    return lines
