"""The direct conv on AMX-BF16 tiles (csrc_templates/conv_amx.c): planning and emit.

On a CPU with AMX-BF16 a bf16 conv is a GEMM of tiles. Packed as a GEMM's panels (the implicit
im2col, plan_gemm.implicit_im2col), each element of the column matrix is rounded, interleaved and
stored once per call, and then serves only the O multiply-adds of its column: at 64-128 output
channels the packing takes as long as the tiles' products. Here nothing is packed per call but a
copy of the input in bf16, pixel-major (a pixel's channels one row, NHWC), the pixels of each
stride phase flat over a padded width (conv_amx.c), so that an A tile of 16 output pixels x 32
channels is one tileloadd at the same offset for every tap, its rows whole cache lines. The
weights become B tiles once (tap-major K). The price is the flat pixels past each row's end (WQ -
OW of each WQ, and the rows past OH of each image), computed and dropped: `waste`, at most
MAX_WASTE.

Where a kernel row's KW x C products fit one K block, the copy's channels are the (kernel
column, input channel) pairs instead (`folds`): a 7 x 7 stem's 3 channels make 21 of a K block of
32, one offset per kernel row, where one K block per tap would be 29 zeros in 32. Where they fit
with the channels padded to an even count (`overlaps`: 7 x 4 = 28), the A tiles read that row of
products where the image has them: the copy is the padded image pixel-major (bf16, C2 channels),
an A tile's rows KW x C2 values long and SW x C2 values apart, overlapping (`overlap`; the tiles
configured so), and no pixel's window is copied KW times.

`use_amx_direct` takes a conv here when the plan asks for bf16 on the AMX path and the shapes
suit the tiles: no dilation or groups, the copy's channels padded to K blocks of 32 by at most
MAX_K_PAD (MAX_K_PAD_STRIDED at a stride), the waste bounded (MAX_WASTE), NCHW in and out, no views. It takes the convs of fewer
output pixels than channels too (a ResNet's last stages), which the im2col GEMM would run with
the column matrix as its rows and which ran as f32 direct convs. EQFUSE_CONV_AMX=0|1 forces
either where it can run.

`copy_between_amx_convs`: where such a conv's output is read by nothing but the next conv on this
kernel, as its input, the producer writes it as that conv's copy (bf16, pixel-major, zero
padded: `out_copy`, the copy's geometry `next_copy`) into the output's buffer, and the consumer
reads it there (`in_copy`): the consumer's copy and the producer's NCHW f32 stores go, the
results unchanged (the copy rounds to bf16 what the producer's epilogue gave, either way).
EQFUSE_CONV_AMX_CHAIN=0 keeps them apart. A ResNet's downsampling block reads its input twice,
in a 3x3 conv at stride 2 and a 1x1 conv at stride 2: the producer writes the 3x3 conv's copy,
and the 1x1 conv reads its pixels in that copy's phase plane (PH, PW) in place (`sibling`), the
plane's rows and columns its flat pixels (EQFUSE_CONV_AMX_SIBLING=0 keeps such a tensor apart).

The blocked channel layout between convs (contraction/blocked.py) takes these convs too, the
tensors the chain does not: a conv's output (or its pool's) in blocks of 16 channels, stored 16
channels a pixel at a time with no transposition; its input's copy converted from blocks 16
channels at a time; a residual operand read in blocks at `blk`. Where such a conv's output is
NCHW (the graph's output), it is written in blocks into scratch and reordered by a pass of its
own (`staged`), as a pixel's channels are what the epilogue then has. The values are the same:
only where they are stored changes.

`pool_into_amx_conv`: where such a conv's output is read by nothing but a max pool (a ResNet's
stem), the conv computes the pool (`pool`): the tiles' results go into a band of rows in the
thread's scratch, and each row, once whole, through the epilogue and, a pool column at a time,
into the maxima of the pool pixels whose windows hold it, kept pixel-major per block of 32
channels (each thread a range of pool rows, the conv's rows at its edges computed again), then
written to the pool's output; the
pool kernel goes, and the conv's output, the largest tensor of such a model, is never stored
whole nor read again. The max is exact: the same results. EQFUSE_CONV_AMX_POOL=0
keeps the pool apart.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace

from eqfuse.backend.cexpr import kernel_params, param_job, render
from eqfuse.backend.kinds.base import REGIONS
from eqfuse.backend.kinds.contraction.conv import epilogue_c, region_chunks
from eqfuse.backend.kinds.contraction.conv_geometry import ConvGeometry, conv_geometry
from eqfuse.backend.kinds.contraction.plan_gemm import Prepack, bf16_pays, cdiv, gemm_bf16_path, parallel
from eqfuse.backend.plan import KernelPlan, UOp, ops_text, pointwise_flops
from eqfuse.ir.graph import Graph
from eqfuse.ir.kernels import K
from eqfuse.ir.ops import pair
from eqfuse.machine import Machine

# The most flat pixels computed per output pixel kept (conv_amx.c): the 2 x 2 maps of two images
# under a 3x3 conv (4 x 4 flat each, 4.0) still ran here in half the time of the f32 direct conv
# they took before, and a 56 x 56 map (1.07) in two thirds of the implicit im2col GEMM's
# (`python benchmarks/bench_models.py --precision bf16 --model resnet_stages --model resnet18`,
# the kernels by eqfuse.runtime.profile; benchmarks/RESULTS.md, 2026-12-04).
MAX_WASTE = 4.0
# The most K computed per K of the conv (the copy's channels padded to whole blocks of 32), at
# stride 1 and at a stride (whose phase planes multiply the copy). Measured: a 16-channel 3x3
# conv (16 of 32) ran faster here than on the GEMM at stride 1 and slower at stride 2, a folded
# stem (21 of 32) faster at stride 2 (`python benchmarks/bench_models.py --precision bf16 --model
# resnet18`, the kernels by eqfuse.runtime.profile; benchmarks/RESULTS.md, 2026-12-04). Between
# those the bounds are a choice, not a measurement (a folded 3x3 conv of 3 channels, 9 of 32,
# stays on the GEMM).
MAX_K_PAD, MAX_K_PAD_STRIDED = 2.0, 1.6
# Items per group (conv_amx.c's G): their C tiles, 4 KiB each, kept between K slices beside the
# slice's B tiles (the weights) in L1. The groups and slices tried measured alike (EQFUSE_CONV_AMX_TILE, six
# settings at 28 x 28; benchmarks/RESULTS.md, 2026-12-04): these are the ones the caches suggest.
GROUP = 4
# The share of L1 a K slice's B tiles may take (`k_slice`). Between slices each item's C tiles go
# to memory and back; with half of L1 (9 of a 64-channel 3x3 conv's 18 K blocks a slice, 12 of a
# 128-channel one's 36) resnet_stages ran slower than with three quarters (18 a slice), one
# thread (`python benchmarks/bench_models.py --precision bf16 --model resnet_stages`, the kernels
# by eqfuse.runtime.profile, EQFUSE_CONV_AMX_TILE; benchmarks/RESULTS.md, 2026-12-04).
B_SLICE_L1 = 0.75
# The channel blocks (of 32) a conv needs to take the max pool after it (`pool_into_amx_conv`),
# whose output must also be larger than L2 for the stores it saves to pay. ResNet-18's stem (one block, within L2) ran slower with the pool in it, and on one
# thread at two; resnet_stages' (two blocks, past L2) faster (`python benchmarks/bench_models.py
# --precision bf16 --model resnet18 --model resnet_stages`, the kernels by eqfuse.runtime.profile;
# benchmarks/RESULTS.md, 2026-12-04).
POOL_MIN_BLOCKS = 2


@dataclass(frozen=True)
class ConvAmxDetail(ConvGeometry):
    """The plan of a conv on AMX tiles read from the input: the constants of csrc_templates/conv_amx.c."""

    O: int
    parallel: bool
    fold: bool = False  # the kernel's columns folded into the copy's channels (`folds`)
    overlap: bool = False  # folded, the A tiles' rows overlapping in a copy of the image (`overlaps`)
    kcb: int = 1  # K blocks of 32 per slice: the slice's B tiles in half of L1 (`k_slice`)
    group: int = GROUP  # items of a channel block that share each K slice's B tiles
    region_chunks: int = 64  # equal ranges of the tiles' loop on the claim-based pool (conv.region_chunks)
    prepack: Prepack | None = None  # the weights bound by params=, made into B tiles once (conv.mark_bound)
    # the blocked channel layout between convs ([N][C / VL][H][W][VL], contraction/blocked.py): the
    # input, the output (with `pool`, the pool's), the epilogue's operands (body inputs) in blocks
    in_blocked: bool = False
    out_blocked: bool = False
    blocked_args: tuple[int, ...] = ()
    vl: int = 16
    in_copy: bool = False  # the input is this conv's copy, its producer's out_copy
    # a 1x1 conv reading another conv's copy (`copy_between_amx_convs`): that copy's phase plane
    # holding its pixels, its rows and columns per image and its plane's pixels
    sibling: tuple[int, ...] = ()
    next_copy: tuple[int, ...] = ()  # the next conv's `copy_geometry`: the output written as its copy
    # the max pool computed here (`pool_into_amx_conv`): window, stride, padding (rows, columns
    # each), the pool's output rows and columns
    pool: tuple[int, ...] = ()

    DERIVED = ("kc", "kcp", "phases", "flat", "waste", "out_copy", "out_pool", "epi_blocked", "staged")

    @property
    def staged(self) -> bool:
        """The template's STAGED: an NCHW output written a pixel's channels at a time in blocks of
        VL (as `out_blocked`) into scratch, then reordered into NCHW by a pass of its own. Where
        the epilogue reads operands in blocks (its only way: the NCHW store transposes the tiles
        before the epilogue); EQFUSE_CONV_AMX_STAGED=1 stages every NCHW output, to measure it."""
        nchw = not (self.out_blocked or self.next_copy or self.pool)
        return nchw and (bool(self.blocked_args) or os.environ.get("EQFUSE_CONV_AMX_STAGED", "").strip() == "1")

    @property
    def epi_blocked(self) -> bool:
        """The template's EPI_BLOCKED: the epilogue reads some operands in blocks of VL channels."""
        return bool(self.blocked_args)

    @property
    def out_pool(self) -> bool:
        """The output is the max pool of the conv's (`pool`)."""
        return bool(self.pool)

    @property
    def out_copy(self) -> bool:
        """The output is written as the next conv's copy (`next_copy`)."""
        return bool(self.next_copy)

    @property
    def kc(self) -> int:
        """The copy's channels: C, or with `fold` KW x C (a kernel column and an input channel);
        with `overlap` an A tile row's K, KW x C2 (C padded to an even count)."""
        return self.KW * (self.C + self.C % 2) if self.overlap else self.KW * self.C if self.fold else self.C

    @property
    def kcp(self) -> int:
        """kc padded to whole K blocks of 32."""
        return cdiv(self.kc, 32) * 32

    @property
    def taps(self) -> int:
        """The offsets into the copy: KH x KW, or with `fold` KH (a kernel row each)."""
        return self.KH if self.fold else self.KH * self.KW

    @property
    def phases(self) -> tuple[int, int]:
        """(QH, QW): the stride's row and column phases some tap reads (fold: the copy's columns
        are each channel's own, one phase; overlap: the image itself, one plane)."""
        if self.overlap:
            return 1, 1
        return min(self.KH, self.stride[0]), 1 if self.fold else min(self.KW, self.stride[1])

    @property
    def flat(self) -> tuple[int, int]:
        """(HQ, WQ): a phase plane's rows and columns per image (overlap: the output's rows, its
        columns in whole tiles of 16, so that no tile's rows cross an output row)."""
        if self.overlap:
            return self.OH, cdiv(self.OW, 16) * 16
        if self.sibling:
            return self.sibling[1], self.sibling[2]
        return (self.OH + (self.KH - 1) // self.stride[0],
                self.OW if self.fold else self.OW + (self.KW - 1) // self.stride[1])

    @property
    def phase_pixels(self) -> int:
        """A phase plane's flat pixels (conv_amx.c's PHASE): the images', then the last pixel
        block's reach."""
        wq, (kh, kw), (sh, sw) = self.flat[1], (self.KH, self.KW), self.stride
        reach = (kh - 1) // sh * wq + (0 if self.fold else (kw - 1) // sw)
        return self.pixel_blocks * 32 + reach

    @property
    def copy_bf16s(self) -> int:
        """The copy's bf16 elements: the phase planes' pixels x kcp channels."""
        qh, qw = self.phases
        return qh * qw * self.phase_pixels * self.kcp

    @property
    def copy_geometry(self) -> tuple[int, ...]:
        """What a producer writing this conv's copy needs (conv_amx.c's Y constants): stride,
        padding, phases, a phase plane's rows and columns per image, its pixels, the channels."""
        (qh, qw), (hq, wq) = self.phases, self.flat
        return (*self.stride, *self.padding, qh, qw, hq, wq, self.phase_pixels, self.kcp)

    @property
    def waste(self) -> float:
        """Flat pixels computed (whole blocks of 32) per output pixel."""
        hq, wq = self.flat
        return round(self.pixel_blocks * 32 / (self.N * self.OH * self.OW), 3)

    @property
    def pixel_blocks(self) -> int:
        """The blocks of 32 flat pixels computed (conv_amx.c's NPB): the images', but the last
        image's rows past OH (the taps' reach below its last output row, no output pixel's)."""
        hq, wq = self.flat
        return cdiv(self.N * hq * wq - (hq - self.OH) * wq, 32)


def folds(C: int, KW: int) -> bool:
    """Whether the kernel's columns go into the copy's channels (conv_amx.c's FOLD): when a kernel
    row's KW x C products fit one K block of 32 (a 7 x 7 stem's 21), where one block per tap would
    be mostly zeros. Not beyond: the copy is KW times the input, and a 16-channel 3x3 conv ran
    slower folded (48 of 64) than not (16 of 32 per tap) (the MAX_K_PAD benchmark)."""
    return KW > 1 and KW * C <= 32


def overlaps(C: int, KW: int) -> bool:
    """Whether a folded conv's A tiles read overlapping rows of a copy of the image itself
    (conv_amx.c's OVERLAP): its pixels' channels padded to an even count C2, a kernel row's KW x C2
    values (the tile's row, KW x C2 x 2 bytes) fit a K block of 32, and the rows of a tile are SW
    pixels apart. The copy is the image's size, not KW times it; EQFUSE_CONV_AMX_OVERLAP=0 keeps
    the folded copy."""
    return KW * (C + C % 2) <= 32 and os.environ.get("EQFUSE_CONV_AMX_OVERLAP", "").strip() != "0"


def use_amx_direct(plan: KernelPlan, m: Machine) -> ConvAmxDetail | None:
    """The detail of plan's conv2d on this kernel (the module docstring's rule), or None."""
    if plan.wanted_precision != "bf16" or gemm_bf16_path(m) != "amx_bf16" or not bf16_pays(m, "amx_bf16"):
        return None
    force = os.environ.get("EQFUSE_CONV_AMX", "").strip()
    if force == "0":
        return None
    body, a = plan.body, plan.shape.anchor
    cv = body.nodes[a]
    if tuple(cv.type.shape) != tuple(plan.out_shape) or plan.in_strides or cv.attr.get("group", 1) != 1:
        return None  # (an epilogue that broadcasts, inputs read through views; grouped: conv_grouped)
    g = conv_geometry(plan, a)
    if g.dilation != (1, 1):
        return None
    O = cv.type.shape[1]
    macs = g.N * O * g.OH * g.OW * g.C * g.KH * g.KW
    d = ConvAmxDetail(**asdict(g), O=O, parallel=parallel(g.N * g.OH * g.OW, O, g.C * g.KH * g.KW, 1),
                      region_chunks=region_chunks(macs), fold=folds(g.C, g.KW))
    pad = MAX_K_PAD if g.stride == (1, 1) else MAX_K_PAD_STRIDED
    if force != "1" and (d.waste > MAX_WASTE or d.kcp > pad * d.kc):
        return None  # (the rules on the folded copy's geometry: K the kernel row's KW x C products)
    if d.fold and overlaps(g.C, g.KW) and replace(d, overlap=True).waste <= MAX_WASTE:
        d = replace(d, overlap=True)
    d = replace(d, kcb=k_slice(d.taps * d.kcp // 32, m))
    if os.environ.get("EQFUSE_CONV_AMX_TILE"):  # "KCB,G": a slice and group forced, to measure others
        kcb, group = (int(t) for t in os.environ["EQFUSE_CONV_AMX_TILE"].split(","))
        d = replace(d, kcb=max(1, kcb), group=max(1, group))
    return d


def k_slice(nkb: int, m: Machine) -> int:
    """K blocks per slice: a slice's B tiles (the weights of 32 output channels, 32 K x 32 bf16 =
    2 KiB a block) in three quarters of L1 (B_SLICE_L1), where each pixel block of a group reads
    them again; nkb blocks cut into equal slices (an uneven last slice ran far slower)."""
    top = max(1, int(m.l1 * B_SLICE_L1) // 2048)
    return cdiv(nkb, cdiv(nkb, top))


def plan_conv_amx(plan: KernelPlan, m: Machine) -> bool:
    """Plan plan's conv2d on this kernel when `use_amx_direct` takes it; else plan nothing."""
    d = use_amx_direct(plan, m)
    if d is None:
        return False
    body, a = plan.body, plan.shape.anchor
    cv = body.nodes[a]
    plan.detail = d
    plan.precision, plan.precision_path, plan.precision_note = "bf16", "amx_bf16", ""
    (qh, qw), (hq, wq) = d.phases, d.flat
    npb, nob, nkb = d.pixel_blocks, cdiv(d.O, 32), d.taps * d.kcp // 32
    plan.tiles = {"kcb": d.kcb, "g": d.group}  # (constants of the C)
    plan.flops = 2 * d.N * d.O * d.OH * d.OW * d.C * d.KH * d.KW + pointwise_flops(body)
    slice_b = 32 * d.kcb * 32 * 2
    plan.cache_check = (f"a K slice's B tiles {d.kcb * 32} x 32 bf16 = {slice_b} B (read by each pixel block of a "
                        f"group of {d.group}) <= {B_SLICE_L1} L1 {int(m.l1 * B_SLICE_L1)} B: "
                        f"{'ok' if slice_b <= m.l1 * B_SLICE_L1 else 'NO'}")
    plan.threads = (f"the copy's rows, then the {nob} channel blocks x {npb} pixel blocks (groups of {d.group} "
                    f"pixel blocks outermost, then channel blocks), {REGIONS}" if d.parallel else "one thread, no parallel region")
    epi = ops_text(body, skip={a} | set(cv.args))
    plan.uops = [
        UOp(0, "Exec", f"weights to B tiles [{2 * nob}][{nkb}][16][16][2] bf16, K tap-major in blocks of 32 "
                       + ("(kernel column, channel) pairs " if d.fold else "channels ") + "(once when bound by params=)", 1),
        UOp(0, "Load", f"input to a pixel-major bf16 copy [{d.N}][{d.in_rows(d.OH)}][{d.in_cols(wq)}][{d.C + d.C % 2}] of "
                       "the zero-padded image; a tile's rows overlap there, a kernel row's pixels' channels each"
            if d.overlap else
            f"input to a pixel-major bf16 copy [{qh}][{qw}][{d.N} x {hq} x {wq}][{d.kcp}], each stride "
            "phase's pixels flat, zero padded" + (", each kernel column's own (KW x C channels)" if d.fold else ""),
            d.N * d.in_rows(d.OH) if d.overlap else qh * qw * d.N * hq),
        UOp(0, "Loop", f"{nob} blocks of 32 output channels x {npb} blocks of 32 flat pixels "
                       f"({d.waste:.2f} computed per output pixel)", nob * npb),
        UOp(1, "Exec", f"2 x 2 C tiles over {nkb} K blocks: per block 2 A tiles loaded from the copy at the tap's "
                       "offset, 2 B tiles, 4 tdpbf16ps (AMX-BF16)", nob * npb * nkb),
        UOp(1, "Store", f"tile transposed, through the epilogue ({epi or 'none'}) into NCHW, the output pixels only",
            nob * npb)]
    return True


def copy_between_amx_convs(kg: Graph, plans: list[KernelPlan]) -> None:
    """Mark each conv on this kernel whose output only the next one reads, as its input, to write
    it as that conv's copy (the module's docstring), where the copy fits the output's f32 buffer.
    The copy's rows are whole bf16 rows of 32 channels: the producer's blocks of 32 outputs are
    the consumer's K blocks (kcp = 32 x the producer's channel blocks)."""
    if os.environ.get("EQFUSE_CONV_AMX_CHAIN", "").strip() == "0":
        return
    siblings = os.environ.get("EQFUSE_CONV_AMX_SIBLING", "").strip() != "0"
    readers: dict[int, list[tuple[KernelPlan, int]]] = {}
    for q in plans:
        for k, a in enumerate(q.args):
            readers.setdefault(a, []).append((q, k))
    for p in plans:
        d = p.detail
        if not isinstance(d, ConvAmxDetail) or d.next_copy or d.pool or p.node in kg.outputs or p.into is not None \
                or p.out_strides is not None or p.body.nodes[p.body.outputs[0]].type.dtype != "f32":
            continue
        rs = [(q, k) for q, k in readers.get(p.node, []) if _reads_as_input(q, k)]
        if not rs or len(rs) != len(readers.get(p.node, [])) or (len(rs) > 1 and not siblings):
            continue
        rs.sort(key=lambda r: r[0].detail.taps == 1)  # (the one whose copy they read first)
        (q, _), sibs = rs[0], [r for r, _ in rs[1:]]
        e = q.detail
        if e.copy_bf16s > 2 * d.N * d.O * d.OH * d.OW or not all(_reads_plane(e, r.detail) for r in sibs):
            continue
        p.detail = replace(d, next_copy=e.copy_geometry)
        q.detail = replace(e, in_copy=True)
        qw = e.phases[1]
        for r in sibs:  # (padded pixel (s oh + PH, s ow + PW): plane (PH, PW), row oh, column ow)
            hq, wq = e.flat
            r.detail = replace(r.detail, in_copy=True,
                               sibling=(e.padding[0] * qw + e.padding[1], hq, wq, e.phase_pixels))
            r.threads = r.threads.replace("the copy's rows, then ", "")
            r.uops = [replace(u, what=f"input: phase plane ({e.padding[0]}, {e.padding[1]}) of the copy the conv "
                              "before wrote for another conv (bf16, pixel-major), read in place")
                      if u.op == "Load" else u for u in r.uops]
        if d.parallel:
            p.threads = p.threads.replace("the copy's rows, then ", "the copy's rows, the next conv's copy's rows of zero "
                                          "padding, then ")
        q.threads = q.threads.replace("the copy's rows, then ", "")
        p.uops = [replace(u, what=f"tile through the epilogue ({u.what.split('(', 1)[1].split(')')[0]}) into the next "
                          "conv's copy: a pixel's 32 channels one bf16 row (its zero padding written first)")
                  if u.op == "Store" else u for u in p.uops]
        q.uops = [replace(u, what="input: the copy the conv before wrote (bf16, pixel-major, zero padded), read in "
                          "place") if u.op == "Load" else u for u in q.uops]


def _reads_as_input(q: KernelPlan, k: int) -> bool:
    """Whether q is a conv on this kernel that reads its argument k as its conv's input alone, and
    could read it as a copy (not folded, no copy of its own from another producer)."""
    e, x = q.detail, q.body.inputs[k]
    return isinstance(e, ConvAmxDetail) and not e.fold and not e.in_copy and k not in q.in_strides \
        and q.body.nodes[q.shape.anchor].args[0] == x and sum(a == x for n in q.body.nodes for a in n.args) == 1


def _reads_plane(e: ConvAmxDetail, r: ConvAmxDetail) -> bool:
    """Whether the 1x1 conv r reads its input pixels where one phase plane of e's copy holds them,
    in e's flat order: r's stride e's, no padding, e's padding below its stride (padded pixel
    (s oh + PH, s ow + PW) is plane (PH, PW)'s row oh, column ow), e's map, channels and K blocks."""
    return (r.KH, r.KW) == (1, 1) and r.stride == e.stride and r.padding == (0, 0) and e.padding[0] < e.stride[0] \
        and e.padding[1] < e.stride[1] and e.padding[0] < e.phases[0] and e.padding[1] < e.phases[1] \
        and (r.N, r.OH, r.OW, r.kcp) == (e.N, e.OH, e.OW, e.kcp) and not r.overlap


def pool_into_amx_conv(kg: Graph, plans: list[KernelPlan], m: Machine) -> None:
    """Fold each max pool (f32, NCHW, its kernel the pool alone) whose input is read by nothing
    else and written by a conv on this kernel into that conv (the module's docstring), where the
    conv's output is larger than L2 and has two channel blocks or more (POOL_MIN_BLOCKS): the
    conv's plan then writes the pool's node, and the pool's plan goes from `plans`."""
    if os.environ.get("EQFUSE_CONV_AMX_POOL", "").strip() == "0":
        return
    readers: dict[int, list[KernelPlan]] = {}
    for q in plans:
        for a in q.args:
            readers.setdefault(a, []).append(q)
    for p in list(plans):
        d = p.detail
        rs = readers.get(p.node, [])
        if not isinstance(d, ConvAmxDetail) or d.pool or d.next_copy or len(rs) != 1 or p.node in kg.outputs \
                or p.into is not None or p.out_strides is not None:
            continue
        if cdiv(d.O, 32) < POOL_MIN_BLOCKS or 4 * d.N * d.O * d.OH * d.OW <= m.l2:
            continue
        q = rs[0]
        e, body = q.detail, q.body
        an = body.nodes[q.shape.anchor] if q.kind == K.INDEX else None
        if an is None or an.op != "max_pool2d" or e.in_blocked or e.out_blocked or q.in_strides or q.into is not None \
                or q.out_strides is not None or list(body.outputs) != [q.shape.anchor] or tuple(an.args) != (body.inputs[0],) \
                or an.type.dtype != "f32" or tuple(q.args) != (p.node,):
            continue
        (kh, kw), (sh, sw), (ph, pw) = (pair(an.attr["kernel_size"]), pair(an.attr["stride"] or an.attr["kernel_size"]),
                                        pair(an.attr["padding"]))
        poh, pow_ = q.out_shape[2], q.out_shape[3]
        p.detail = replace(d, pool=(kh, kw, sh, sw, ph, pw, poh, pow_))
        p.node, p.out_shape = q.node, q.out_shape
        p.threads = (f"{'' if d.in_copy else 'the copy' + chr(39) + 's rows, then '}ranges of pool rows, one a thread, "
                     f"each with the conv's rows its windows read, {REGIONS}" if d.parallel else "one thread, no parallel region")
        p.uops = [replace(u, what=f"tile into a band of rows; each whole row through the epilogue "
                          f"({u.what.split('(', 1)[1].split(')')[0]}), then into the {kh}x{kw} max pool's maxima "
                          f"(stride {sh}x{sw}, padding {ph}x{pw}) of each pool pixel whose window holds the pixel, a "
                          "pool column at a time, pixel-major in the thread's scratch; after a channel block's last "
                          "tile, transposed into NCHW") if u.op == "Store" else u for u in p.uops]
        plans.remove(q)


def emit_conv_amx(plan: KernelPlan) -> str:
    body, a, d = plan.body, plan.shape.anchor, plan.detail
    cv = body.nodes[a]
    params, ptrs = kernel_params(plan)
    expr, decls = epilogue_c(plan)
    expr = " ".join(expr.split("\n"))
    pool = dict(zip(("PKH", "PKW", "PSH", "PSW", "PPH", "PPW", "POH", "POW"), d.pool or (0,) * 8))
    y = dict(zip(("YSH", "YSW", "YPH", "YPW", "YQH", "YQW", "YHQ", "YWQ", "YPHASE", "YKCP"), d.next_copy or (0,) * 10))
    sib = dict(zip(("SPLANE", "SHQ", "SWQ", "SPHASE"), d.sibling or (0,) * 4))
    return render("conv_amx.c", NAME=plan.name, PARAMS=params, EXTRAS=decls, X=ptrs[cv.args[0]],
                  WEIGHTS=ptrs[cv.args[1]], PREPACKED=int(d.prepack is not None), PARALLEL=int(d.parallel),
                  CHUNKS=d.region_chunks, KCB=d.kcb, G=d.group, FOLD=int(d.fold), OVERLAP=int(d.overlap), EPILOGUE=expr,
                  IN_BLOCKED=int(d.in_blocked),
                  OUT_BLOCKED=int(d.out_blocked), EPI_BLOCKED=int(d.epi_blocked), VL=d.vl, STAGED=int(d.staged),
                  O=d.O, KCP=d.kcp, IN_COPY=int(d.in_copy), OUT_COPY=int(d.out_copy), OUT_POOL=int(d.out_pool), **y, **pool, **sib,
                  SIBLING=int(bool(d.sibling)),
                  **d.shape_c("DH", "DW"), **param_job(params))
