"""Grouped convolutions (group > 1: depthwise and grouped), csrc_templates/conv_grouped.c:
planning and emit.

Output channel o reads only the C / group input channels of its group, so a grouped conv is
`group` small convolutions side by side. The one im2col GEMM of a dense conv does not fit them
(the GEMM's epilogue indexes its rows as the output channels of one matrix), and the per-group
GEMMs of a depthwise conv (one output channel over KH x KW taps) would be 1-row GEMMs. The
kernel here computes one output plane (image, channel) at a time: per input channel of the
group, a zero-padded copy of the input plane (so no tap needs a bounds check), then each output
pixel's sum over the taps in a register, the taps unrolled and a row's pixels in the vector
lanes. A depthwise conv (one input channel per group, any channel multiplier) is memory bound:
the input plane is read from memory once, each output element written twice (the sums, then the
fused epilogue in place: bias, batchnorm, activation, residual). The same kernel runs any
stride, padding and dilation, the padding uneven too ([top, left, bottom, right]: TF's "same"
padding of a stride-2 conv, rule kernel_conv2d_pad_same): only the top and left padding are
constants, the copies zero whatever a tap reads past the bottom or right edge.

The channels path (`channels`, chosen by `use_channels`) puts VL output channels in the vector
lanes instead. A task is a block of VL channels over a band of output rows. A depthwise conv
transposes the band's input rows into a zero-padded tile [rows][columns][VL] (VL x VL transposes
in registers) and computes register tiles of RW output pixels of a row: RW accumulators, each tap
a weight vector of VL channels times an input vector (a kernel row's weights in registers, each
input vector loaded once per kernel row). The output tile is transposed back into the NCHW
planes through the epilogue. The lanes are full whatever the image width, and
a tap is one multiply-add per VL outputs; the price is the two transposes, which a large kernel
(7 x 7: 49 multiply-adds per output) hides and a 3 x 3 one over wide rows does not
(benchmarks/bench_conv.py --set grouped). onnxruntime's MLAS runs depthwise convs in its NCHWc
layout the same way, reordering NCHW in and out. A grouped conv whose groups hold at least a
vector of output channels (a RegNet's 16-120 per group) runs the same tasks over blocks of VL
output channels of one group: the band's rows of the group's CG input planes are copied as they
are (no transpose; once for the group's blocks, which follow each other) and each input pixel,
broadcast, multiplies a tap's weights of the VL output channels (a direct conv per group). A group
that is not whole vectors (24 per group at VL = 16) has ceil(OG / VL) blocks, the last one masked:
its lanes past the group multiply zero weights and are not stored. The weights are prepacked
[blocks][CG][KH x KW][VL] when bound. Under precision="bf16" these grouped convs multiply bf16
K-pairs of a group's input channels (multiplies_bf16); a depthwise conv stays f32 (f32_note). EQFUSE_CONV_GROUPED=pixels|channels forces either path where it can run,
EQFUSE_GROUPED_TILE=RW,BAND a tile and EQFUSE_GROUPED_PREFETCH=0|1 the prefetch, to measure the
others.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace

from eqfuse.backend.cexpr import kernel_params, param_job, render
from eqfuse.backend.kinds.base import REGIONS
from eqfuse.backend.kinds.contraction.conv_geometry import ConvGeometry, conv_geometry
from eqfuse.backend.kinds.contraction.emit_gemm import BF16_PATHS
from eqfuse.backend.kinds.contraction.plan_gemm import (
    Prepack,
    bf16_pays,
    bf16_path,
    cdiv,
    f32_reason,
    parallel,
)
from eqfuse.backend.plan import KernelPlan, UOp, computes_f32, ops_text, pointwise_flops
from eqfuse.ir.kernels import F32
from eqfuse.machine import Machine


@dataclass(frozen=True)
class ConvGroupedDetail(ConvGeometry):
    """The plan of a grouped conv2d: the constants of csrc_templates/conv_grouped.c. Its padding
    may be uneven: the copies (the padded plane, band and tile) zero whatever a tap reads past the
    image's bottom or right edge, on every path (ConvGeometry.padding)."""

    O: int
    group: int
    parallel: bool
    # VL channels in the vector lanes (a depthwise conv, `use_channels`); else a row's pixels
    channels: bool = False
    vl: int = 1  # floats per vector (channels)
    rw: int = 1  # output pixels of a row per register tile (channels)
    band: int = 1  # output rows per task (channels)
    prefetch: bool = False  # the next task's image rows prefetched while a task computes (channels)
    blocked_args: tuple[int, ...] = ()  # (the conv epilogue's interface: none read in blocks here)
    # channels: the weights bound by params=, in blocks [C / VL][KH x KW][VL] made once (conv.mark_bound);
    # pixels: always None (the weights are read as they are, OIHW)
    prepack: Prepack | None = None

    # the decisions derived from the fields above, printed by `eqfuse lower` with them
    DERIVED = ("grouped",)

    @property
    def grouped(self) -> bool:
        """Groups of at least a vector of output channels, not a depthwise conv: the channels
        path's GROUPED (the group's input planes copied as they are, each input pixel broadcast;
        a group of OG channels that are not whole vectors takes ceil(OG / VL) blocks, the last
        masked). Else the channels path's lanes are VL output channels of any groups, each input
        tile's lane the input channel its output channel reads (a depthwise conv, a channel
        multiplier, groups smaller than a vector)."""
        return (self.cg != 1 or self.og != 1) and self.og >= self.vl

    @property
    def regions(self) -> bool:
        """Whether the parallel loop is an eqf_region range (common_pool.h), which the call runs as
        OpenMP's static split or on the claim-based pool (eqfuse.runtime.load.call_threads): both
        paths' (the channels path's tasks, the pixels path's output planes)."""
        return True

    @property
    def blocks(self) -> int:
        """The tasks' blocks of VL output channels: per group (GROUPED), else over all O."""
        return self.group * cdiv(self.og, self.vl) if self.grouped else cdiv(self.O, self.vl)

    @property
    def cg(self) -> int:
        return self.C // self.group

    @property
    def og(self) -> int:
        return self.O // self.group


def is_grouped(cv) -> bool:
    """Whether a conv2d node runs here: more than one group."""
    return cv.attr.get("group", 1) != 1


def use_channels(d: ConvGroupedDetail) -> bool:
    """Whether a grouped conv puts channels in the lanes: always when each group has at least a
    vector of output channels (a RegNet's 16-120 per group, whole vectors or not: 24 per group are
    a vector and a masked half; the per-plane kernel re-copies the group's input planes for every
    output channel) or fewer than a vector with more than one input channel
    (the per-plane kernel copies each input plane once per output channel of its group); a
    depthwise conv (one input channel per group, any channel multiplier) with a kernel of more
    than 3 x 3 taps (the multiply-adds hide the transposes), a stride (pixels in the lanes would
    read strided columns) or an output row narrower than two vectors (most lanes of its last
    vector empty). A 3 x 3 stride-1 depthwise conv over wide rows is bound by memory either way
    and keeps its pixels in the lanes, which reads the input once without transposing it
    (benchmarks/bench_conv.py --set mobilenet). EQFUSE_CONV_GROUPED=pixels|channels forces either
    where it can run."""
    force = os.environ.get("EQFUSE_CONV_GROUPED", "").strip().lower()
    if force in ("pixels", "channels"):
        return force == "channels"
    if d.cg != 1 or d.grouped:
        return True  # (whole vectors of output channels per group, or fewer than a vector: see above)
    return d.KH * d.KW > 9 or d.stride != (1, 1) or d.OW < 2 * d.vl


# The cost of a block of half-width vectors against one of full width, in a grouped conv's
# channels path: it computes half the lanes in fewer than half the time of a full one, since the
# same broadcasts and loop feed twice the instructions (`benchmarks/bench_conv.py --set
# regnet_widths`: the g48 row, whole vectors at both widths, ran 1.2x longer at 8 lanes than at 16)
HALF_BLOCK_COST = 0.6


def lanes(og: int, cg: int, m: Machine) -> int:
    """VL of a grouped conv: the machine's vector width, or half of it for groups of at least a
    vector of output channels whose blocks cost less at half width (HALF_BLOCK_COST): 24 per group
    at 16 lanes are two blocks, a quarter of their lanes masked, or three of 8 lanes (1.8 against 2);
    56 and 120 keep 16 lanes (4 against 4.2, 8 against 9). The same in bf16 (vdpbf16ps has a ymm
    form on 8 lanes, as its zmm one on 16). Not where the half is narrower than 8.
    EQFUSE_GROUPED_VL forces one."""
    if os.environ.get("EQFUSE_GROUPED_VL"):
        return int(os.environ["EQFUSE_GROUPED_VL"])
    vl, half = m.simd_floats, m.simd_floats // 2
    if half < 8 or og < vl or (cg == 1 and og == 1):
        return vl
    return half if HALF_BLOCK_COST * cdiv(og, half) < cdiv(og, vl) else vl


def channel_tiles(d: ConvGroupedDetail, m: Machine) -> tuple[int, int]:
    """(RW, BAND) of the channels path. RW: the register tile's pixels, from 4 up to the
    accumulators the vector registers leave (KW for a kernel row's weights, one for an input; at
    most 14), the one
    that wastes the fewest computed columns (the last tile of a row computes past its end), the
    largest on a tie. BAND: all the output rows, cut into bands when the (image, channel block)
    tasks are fewer than 4 per core, and so that a band's input tile fits half of L2."""
    if os.environ.get("EQFUSE_GROUPED_TILE"):  # "RW,BAND": a tile forced, to measure others
        rw, band = (int(t) for t in os.environ["EQFUSE_GROUPED_TILE"].split(","))
        return rw, min(band, d.OH)
    regs = 32 if m.simd_floats >= 16 else 16  # (AVX-512's 32 registers at either width)
    rw = min(range(4, max(4, min(regs - d.KW - 1, 14)) + 1), key=lambda r: (cdiv(d.OW, r) * r, -r))
    tw = cdiv(d.OW, rw) * rw
    bwp = d.in_cols(tw)
    per_row = bwp * d.cg * (1 if d.grouped else d.vl) * F32
    tasks = d.N * cdiv(d.O, d.vl)
    band = cdiv(d.OH, min(d.OH, cdiv(4 * m.cores, tasks)))
    fit = ((m.l2 // 2) // per_row - (d.KH - 1) * d.dilation[0] - 1) // d.stride[0] + 1
    return rw, max(1, min(band, fit))


def prefetches(d: ConvGroupedDetail) -> bool:
    """Whether a task prefetches the next one's image rows: with more than 3 x 3 taps, where
    a task's multiply-adds take long enough to hide the loads (a 3 x 3 conv is bound by memory:
    nothing to overlap). EQFUSE_GROUPED_PREFETCH=0|1 forces it."""
    force = os.environ.get("EQFUSE_GROUPED_PREFETCH", "").strip()
    if d.cg != 1 or d.og != 1:
        return False  # (the prefetch follows a depthwise task's VL input planes)
    return force == "1" if force in ("0", "1") else d.KH * d.KW > 9


def multiplies_bf16(d: ConvGroupedDetail) -> bool:
    """Whether a grouped conv multiplies in bf16 under precision="bf16": the channels path's GROUPED
    convs of at least two input channels per group (K-pairs of a group's input channels). A
    depthwise conv (one input channel per group) stays f32: one multiply-add per tap of each
    output, its time is its f32 input's and output's traffic (docs/precision.md, "Depthwise and
    grouped convolutions")."""
    return d.channels and d.grouped and d.cg >= 2


def f32_note(d: ConvGroupedDetail) -> str:
    """report["precision"]'s note of a grouped conv that computes in f32 under precision="bf16"."""
    if d.cg == 1:
        return ("a depthwise conv runs in f32 under bf16: one multiply-add per tap of each output, its time is "
                "its f32 input's and output's traffic and its transposes, not the multiplies "
                "(docs/precision.md, \"Depthwise and grouped convolutions\")")
    return ("a grouped conv of fewer output channels per group than a vector runs in f32 under bf16: "
            "no bf16 path for this kernel")


def plan_conv_grouped(plan: KernelPlan, m: Machine) -> None:
    body, a = plan.body, plan.shape.anchor
    cv = body.nodes[a]
    g = conv_geometry(plan, a)
    N, C, H, W, KH, KW, OH, OW = g.N, g.C, g.H, g.W, g.KH, g.KW, g.OH, g.OW
    O, CG = body.nodes[cv.args[1]].type.shape[:2]
    group = cv.attr["group"]
    macs = N * O * OH * OW * CG * KH * KW
    # (the multiply-adds of a depthwise conv are few per byte: its parallel rule counts the
    # elements it reads and writes too)
    par = parallel(N * O, OH * OW, CG * KH * KW, 1) or N * (C * H * W + O * OH * OW) >= (1 << 17)
    d = ConvGroupedDetail(**asdict(g), O=O, group=group, parallel=par, vl=lanes(O // group, CG, m))
    if use_channels(d):
        rw, band = channel_tiles(d, m)
        d = replace(d, channels=True, rw=rw, band=band,
                    prefetch=prefetches(d))
        plan.detail = d
        if plan.wanted_precision == "bf16" and multiplies_bf16(d) and bf16_pays(m):
            plan.precision, plan.precision_path, plan.precision_note = "bf16", bf16_path(m), ""
        else:
            computes_f32(plan, f32_note(d) if not multiplies_bf16(d) else f32_reason(m))
        return _plan_channels(plan, body, a, cv, d, m, macs)
    computes_f32(plan, f32_note(d))
    d = replace(d, vl=1)
    plan.detail = d
    plan.tiles = {"plane": OH * OW}
    plan.flops = 2 * macs + pointwise_flops(body)
    hp, wp = d.in_rows(OH), d.in_cols(OW)
    plane = (hp * wp + OH * OW) * F32
    plan.cache_check = (f"a padded input plane {hp} x {wp} and an output plane {OH} x {OW}: {plane} B <= L2 {m.l2} B: "
                        f"{'ok' if plane <= m.l2 else 'NO'}")
    plan.threads = (f"the {N * O} output planes (image, channel), {REGIONS}" if par
                    else "one thread, no parallel region")
    epi = ops_text(body, skip={a} | set(cv.args))
    plan.uops = [UOp(0, "Loop", f"{N * O} output planes (image, channel), {group} groups of {CG} input channels",
                     N * O),
                 UOp(1, "Load", f"input plane to a zero-padded copy [{hp}][{wp}]", N * O * CG),
                 UOp(1, "Exec", f"{OH} rows of {OW} pixels, each a sum over {KH} x {KW} taps in a register, "
                                "added to the plane's partial sums", N * O * CG * OH),
                 UOp(1, "Store", f"plane through the epilogue ({epi or 'none'}) in place, NCHW", N * O)]


def _plan_channels(plan: KernelPlan, body, a: int, cv, d: ConvGroupedDetail, m: Machine, macs: int) -> None:
    plan.tiles = {"rw": d.rw, "band": d.band}
    plan.flops = 2 * macs + pointwise_flops(body)
    tw = cdiv(d.OW, d.rw) * d.rw
    bhp, bwp = d.in_rows(d.band), d.in_cols(tw)
    grouped = d.grouped
    tile = (bhp * bwp * d.cg * (1 if grouped else d.vl) + d.band * tw * d.vl) * F32
    lanes = d.cg if grouped else f"{d.cg} x {d.vl}"
    plan.cache_check = (f"a band's input tile {bhp} x {bwp} x {lanes} and output tile {d.band} x {tw} x {d.vl}: "
                        f"{tile} B <= L2 {m.l2} B: {'ok' if tile <= m.l2 else 'NO'}")
    nt = d.N * d.blocks * cdiv(d.OH, d.band)
    plan.threads = (f"the {nt} tasks (image, block of {d.vl} channels, band of {d.band} output rows), {REGIONS}"
                    if d.parallel else "one thread, no parallel region")
    epi = ops_text(body, skip={a} | set(cv.args))
    bf16 = plan.precision == "bf16"
    load = (f"the band's rows of the group's {d.cg} input planes copied into zero-padded planes [{d.cg}][{bhp}][{bwp}]"
            + (f", as bf16 K-pairs of planes [{cdiv(d.cg, 2)}][{bhp}][{bwp}][2]" if bf16 else "")
            + (", once for the group's blocks" if d.og > d.vl else "")
            if grouped else f"the band's input rows transposed {d.vl} x {d.vl} into zero-padded tiles "
                            f"[{d.cg}][{bhp}][{bwp}][{d.vl}], lane l the input channel output channel l reads")
    masked = f", each group's last block masked ({d.og % d.vl} of {d.vl})" if grouped and d.og % d.vl else ""
    mul = ("vdpbf16ps" if plan.precision_path == "avx512_bf16" else "bf16 widened, FMA") if bf16 else "FMA"
    wts = (f"[{d.blocks}][{cdiv(d.cg, 2)}][{d.KH * d.KW}][{d.vl}][2] bf16 K-pairs" if bf16
           else f"[{d.blocks}][{d.cg}][{d.KH * d.KW}][{d.vl}]")
    plan.uops = [UOp(0, "Load", f"weights to blocks {wts}{masked}", 1),
                 UOp(0, "Loop", f"{nt} tasks (image, block of {d.vl} channels, band of {d.band} output rows)", nt),
                 UOp(1, "Load", load, nt * bhp),
                 UOp(1, "Exec", f"register tiles of {d.rw} pixels x {d.vl} channels, {d.cg} x {d.KH} x {d.KW} "
                                f"taps, a weight vector each ({mul})", nt * d.band * (tw // d.rw)),
                 UOp(1, "Store", f"the output tile transposed into the NCHW planes through the epilogue "
                                 f"({epi or 'none'})", nt)]


def emit_conv_grouped(plan: KernelPlan) -> str:
    body, a, d = plan.body, plan.shape.anchor, plan.detail
    cv = body.nodes[a]
    params, ptrs = kernel_params(plan)
    from eqfuse.backend.kinds.contraction.conv import epilogue_c, transpose_c

    expr, decls = epilogue_c(plan)
    return render("conv_grouped.c", NAME=plan.name, CHANNELS=int(d.channels), VL=d.vl,
                  PREPACKED=int(d.prepack is not None), PREFETCH=int(d.prefetch), BF16=BF16_PATHS[plan.precision_path],
                  GROUPED=int(d.grouped), RW=d.rw, BAND=d.band,
                  TRANSPOSE=transpose_c(d.vl, f"{plan.name}_vf") if d.channels else "", PARAMS=params, EXTRAS=decls, X=ptrs[cv.args[0]],
                  WEIGHTS=ptrs[cv.args[1]], EPILOGUE=expr, PARALLEL=int(d.parallel), PLANE=plan.tiles.get("plane", 0),
                  O=d.O, G=d.group, CG=d.cg, OG=d.og, **d.shape_c(), **param_job(params))
