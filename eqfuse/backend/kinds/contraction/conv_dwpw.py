"""A depthwise conv2d and the 1x1 conv2d that reads it, as one kernel (csrc_templates/conv_dwpw.c):
MobileNetV2's inverted residual, its depthwise 3x3 + batchnorm + ReLU6 then its projection 1x1 +
batchnorm (+ the residual add). The optimizer's rule fuse_dw_pw proposes the kernel,
eqfuse.ir.kernels classifies it (ConvPrologue: the depthwise conv and the value the 1x1 conv reads)
and the cost model chooses it over the two kernels.

A task is an image's band of BAND output rows. The depthwise conv of every channel over the band
goes, through its prologue (the activation), into a tile [C][BAND x OW] on the thread's stack,
which stays in cache; the 1x1 conv is then a GEMM over that tile: register tiles of RO output
channels x VL pixels, each channel of the tile a vector of pixels times a broadcast weight, and
the stores go through the epilogue (the 1x1 conv's bias, the residual add). The depthwise conv's
output is never written to memory, and the two kernels' calls are one. The band is all the rows
when the tile fits half of L2 and the tasks are enough for the cores, else fewer rows.

EXPAND (rule fuse_pw_dw, ConvPrologue.ex): the depthwise conv reads the inverted residual's expand
1x1 conv (+ its bias and activation, a second prologue) of the kernel's input, and a task first
computes that conv for the input rows its band reads (the halo rows again in the next band) into
a buffer on its stack: the whole block is one kernel and the expanded tensor is never written.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace

from eqfuse.backend.cexpr import kernel_params, render
from eqfuse.backend.kinds.contraction.conv import epilogue_c
from eqfuse.backend.kinds.contraction.conv_geometry import ConvGeometry, conv_geometry
from eqfuse.backend.kinds.contraction.emit_gemm import c_type, gemm_epilogue
from eqfuse.backend.kinds.contraction.plan_gemm import PARALLEL_MIN_FMAS, Prepack, cdiv
from eqfuse.backend.plan import KernelPlan, UOp, computes_f32, ops_text, pointwise_flops
from eqfuse.ir.kernels import F32, ConvPrologue
from eqfuse.machine import Machine


@dataclass(frozen=True)
class ConvDwPwDetail(ConvGeometry):
    """The plan of a fused depthwise + 1x1 conv: the constants of csrc_templates/conv_dwpw.c. Its
    geometry is the depthwise conv's (of C channels); O is the 1x1 conv's output channels."""

    O: int
    parallel: bool
    vl: int  # pixels per vector of the 1x1 conv's register tile
    ro: int  # the 1x1 conv's register tile: its output channels (pixels in the lanes), else its pixels
    band: int  # output rows per task
    # the depthwise sums as vectors over the band's zero-padded rows taken as one run (a tap is one
    # shifted load for every pixel, whatever the image's width; a stride computes the positions
    # between the outputs too), else pixel by pixel (uses_flat)
    flat: bool = False
    # the 1x1 conv's output channels in the vector lanes, its weights transposed (olanes_cheaper),
    # else a band's pixels in the lanes
    olanes: bool = False
    blocked_args: tuple[int, ...] = ()  # (the conv epilogue's interface: none read in blocks here)
    # olanes: the 1x1 conv's weights bound by params=, transposed [C][O] once (conv.mark_bound)
    prepack: Prepack | None = None
    # the expand 1x1 conv of CI input channels computed per band (ConvPrologue.ex), else the
    # depthwise conv reads its input from memory
    expand: bool = False
    CI: int = 0


def is_fused(plan: KernelPlan) -> bool:
    """Whether a conv2d plan is a depthwise conv with its 1x1 conv (ir.kernels.ConvPrologue)."""
    return isinstance(plan.shape.parts, ConvPrologue)


def band_rows(g: ConvGeometry, par: bool, m: Machine, CI: int = 0) -> int:
    """BAND: all the output rows, cut into bands when the kernel runs in parallel and the images
    are fewer than 4 tasks per core (then each band at least two rows), and so that the tile
    [C][BAND x OW] and the padded input rows fit half of L2 (stack_bytes)."""
    band = max(cdiv(g.OH, min(g.OH, max(1, cdiv(4 * m.cores, g.N)))), min(g.OH, 2)) if par else g.OH
    fit = max(b for b in range(1, g.OH + 1) if b == 1 or stack_bytes(g, b, m.simd_floats, CI) <= m.l2 // 2)
    return max(1, min(band, fit))


def stack_bytes(g: ConvGeometry, band: int, vl: int, CI: int = 0) -> int:
    """The bytes of a task's buffers on the stack (csrc_templates/conv_dwpw.c), the larger of its
    two layouts: the tile [C][BP] and the padded input rows [C][BHP x WP + VL + KW DW]; or
    (OLANES) the transposed input [BHP x WP][CP], the weights [KH x KW][CP] and the tile [BP][CP];
    with the expand conv's input and output rows [CI + C][BHP x W in whole vectors + VL] (EXPAND:
    CI its input channels, else 0)."""
    C = g.C
    bp, cp = cdiv(band * g.OW, vl) * vl, cdiv(C, vl) * vl
    bhp, wp = g.in_rows(band), g.in_cols(g.OW)
    return (max(C * (bp + bhp * wp + vl + g.KW * g.dilation[1]) + bhp * wp + vl, (bhp * wp + g.KH * g.KW + bp) * cp)
            + ((C + CI) * (cdiv(bhp * g.W, vl) + 1) * vl if CI else 0)) * F32


def uses_flat(g: ConvGeometry, band: int, vl: int) -> bool:
    """FLAT: the sums of a band's padded rows as one run of vectors when the run is at least two
    vectors; a shorter one (a 2 x 2 or 1 x 1 image) computes mostly positions that no output
    reads, and its pixels one by one cost less. (conv_dwln's FLAT too.)"""
    return ((band - 1) * g.stride[0] + 1) * g.in_cols(g.OW) >= 2 * vl


def olanes_cheaper(O: int, P: int, vl: int, ro: int) -> bool:
    """Whether the 1x1 conv of a band of P pixels costs fewer vector multiply-adds with its
    output channels in the lanes (tiles of ro pixels x vl channels) than with the pixels in the
    lanes (ro channels x vl pixels): a small image's band, fewer pixels than a vector, wastes
    most lanes of the second."""
    force = os.environ.get("EQFUSE_DWPW", "").strip().lower()
    if force in ("pixels", "channels"):
        return force == "channels"
    rp = min(ro, P)
    return cdiv(O, vl) * cdiv(P, rp) * rp < cdiv(O, ro) * cdiv(P, vl) * ro


def plan_conv_dwpw(plan: KernelPlan, m: Machine) -> None:
    body, parts = plan.body, plan.shape.parts
    g = conv_geometry(plan, parts.dw)
    N, C, H, W, KH, KW, OH, OW = g.N, g.C, g.H, g.W, g.KH, g.KW, g.OH, g.OW
    O = body.nodes[plan.shape.anchor].type.shape[1]
    ex = body.nodes[parts.ex] if parts.ex is not None else None
    CI = body.nodes[ex.args[0]].type.shape[1] if ex is not None else 0
    macs = N * C * OH * OW * (KH * KW + O) + N * C * H * W * CI
    band = band_rows(g, macs >= PARALLEL_MIN_FMAS, m, CI)
    tasks = N * cdiv(OH, band)
    regs = 32 if m.simd_floats >= 16 else 16
    ro = min(O, regs // 4)  # (the accumulators, a pixel vector and the broadcast weights)
    d = ConvDwPwDetail(**asdict(g), O=O, parallel=macs >= PARALLEL_MIN_FMAS and tasks > 1, vl=m.simd_floats,
                       ro=ro, band=band, flat=uses_flat(g, band, m.simd_floats),
                       olanes=olanes_cheaper(O, band * OW, m.simd_floats, ro), expand=ex is not None, CI=CI)
    if d.olanes:  # (a tile of at most the band's pixels; the depthwise sums with channels in the lanes)
        d = replace(d, ro=min(ro, band * OW), flat=False)
        ro = d.ro
    plan.detail = d
    computes_f32(plan, "a fused depthwise and 1x1 conv runs in f32: no bf16 path for this kernel")
    plan.tiles = {"band": band, "ro": ro}
    plan.flops = 2 * macs + pointwise_flops(body)
    bp = cdiv(band * OW, d.vl) * d.vl
    tile = stack_bytes(d, band, d.vl, CI)
    plan.cache_check = (f"a band's depthwise tile {C} x {bp} (band {band} x {OW} pixels, whole vectors) and padded "
                        f"input rows: {tile} B <= L2/2 {m.l2 // 2} B: {'ok' if tile <= m.l2 // 2 else 'NO'}")
    plan.threads = (f"the {tasks} tasks (image, band of {band} output rows) split evenly" if d.parallel
                    else "one thread, no parallel region")
    pro = ops_text(body, skip=set(range(len(body.nodes))) - (body.ancestors(parts.value) - body.ancestors(parts.dw)))
    epi = ops_text(body, skip=body.ancestors(plan.shape.anchor))
    bhp = d.in_rows(band)
    xpro = ops_text(body, skip=set(range(len(body.nodes))) - (body.ancestors(parts.xv) - body.ancestors(parts.ex))) \
        if d.expand else ""
    plan.uops = [UOp(0, "Loop", f"{tasks} tasks (image, band of {band} output rows)", tasks)]
    plan.uops += [UOp(1, "Exec", f"the expand 1x1 conv of {CI} channels to {C} over the band's (up to {bhp}) input "
                                 f"rows (vectors over the run of rows, register tiles of 4 channels), through its prologue "
                                 f"({xpro or 'none'}), into the rows [{C}][{bhp} x {W}]",
                      tasks * cdiv(C, 4) * cdiv(bhp * W, d.vl))] if d.expand else []
    plan.uops += [UOp(1, "Exec", f"the depthwise {KH} x {KW} conv of the {C} channels over the band, through its "
                                f"prologue ({pro or 'none'}), into the tile [{C}][{bp}]", tasks * C),
                 UOp(1, "Exec", f"the 1x1 conv: register tiles of {ro} pixels x {d.vl} output channels over the "
                                f"{C} channels of the tile (FMA, broadcast pixels, weights transposed [{C}][{O}])",
                     tasks * cdiv(O, d.vl) * cdiv(band * OW, ro)) if d.olanes else
                 UOp(1, "Exec", f"the 1x1 conv: register tiles of {ro} output channels x {d.vl} pixels over the "
                                f"{C} channels of the tile (FMA, broadcast weights)", tasks * cdiv(O, ro) * cdiv(band * OW, d.vl)),
                 UOp(1, "Store", f"the band's {O} output planes through the epilogue ({epi or 'none'}), NCHW",
                     tasks)]


def prologue_c(plan: KernelPlan) -> tuple[str, list[tuple[int, str]]]:
    """(the prologue's C expression of `acc`, the depthwise conv's sum at element (b, i, j) of its
    output, i its channel and j = oh x OW + ow; the inputs it reads)."""
    parts = plan.shape.parts
    return _conv_sum_c(plan, parts.dw, parts.value)


def expand_prologue_c(plan: KernelPlan) -> tuple[str, list[tuple[int, str]]]:
    """(the expand conv's prologue, its C expression of `acc`, the expand conv's sum at element
    (b, i, j) of its output, i its channel and j = ih x W + iw; the inputs it reads), or ("0", [])
    without the expand conv."""
    parts = plan.shape.parts
    return ("0", []) if parts.ex is None else _conv_sum_c(plan, parts.ex, parts.xv)


def _conv_sum_c(plan: KernelPlan, conv: int, root: int) -> tuple[str, list[tuple[int, str]]]:
    """The C expression of `acc`, the sum of the conv at body node `conv` at element (b, i, j) of
    its output (+ its bias), through the pointwise ops up to `root`; the inputs it reads."""
    body = plan.body
    n = body.nodes[conv]
    bias = f"eqf_e{body.inputs.index(n.args[2])}" if len(n.args) == 3 else None
    groups = [("b", [0], False), ("i", [1], False), ("j", [2, 3], False)]
    expr, extras = gemm_epilogue(plan, groups, {conv: f"(acc + {bias}[i])" if bias else "acc"},
                                 root=root, shape=tuple(n.type.shape))
    if bias and n.args[2] not in dict(extras):
        extras.append((n.args[2], bias))
    return expr, extras


def emit_conv_dwpw(plan: KernelPlan) -> str:
    body, d, parts = plan.body, plan.detail, plan.shape.parts
    pw, dw = body.nodes[plan.shape.anchor], body.nodes[parts.dw]
    params, ptrs = kernel_params(plan)
    epi, decls = epilogue_c(plan)
    pro, pextras = prologue_c(plan)
    xpro, xextras = expand_prologue_c(plan)
    have = set(decls.split("\n")) if decls else set()
    more = [f"    const {c_type(body, i)}* restrict {name} = {ptrs[i]};" for i, name in pextras + xextras]
    decls = "\n".join([x for x in decls.split("\n") if x] + list(dict.fromkeys(x for x in more if x not in have)))
    xn = body.nodes[parts.ex] if d.expand else None
    return render("conv_dwpw.c", NAME=plan.name, PARAMS=params, EXTRAS=decls,
                  X=ptrs[xn.args[0]] if xn is not None else ptrs[dw.args[0]],
                  WE=ptrs[xn.args[1]] if xn is not None else "0", EXPAND=int(d.expand), CI=d.CI, EXPROLOGUE=xpro,
                  WD=ptrs[dw.args[1]], WP=ptrs[pw.args[1]], PROLOGUE=pro, EPILOGUE=epi,
                  PARALLEL=int(d.parallel), FLAT=int(d.flat), OLANES=int(d.olanes),
                  PREPACKED=int(d.prepack is not None), VL=d.vl, RO=d.ro, BAND=d.band, O=d.O, **d.shape_c())
