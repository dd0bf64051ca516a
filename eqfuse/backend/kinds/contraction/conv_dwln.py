"""A depthwise conv2d, the layernorm over its channels (read as NHWC) and the matmul that reads
it, as one kernel (csrc_templates/conv_dwln.c): ConvNeXt's block up to its first Linear, its
depthwise 7x7 conv (+ bias), permute to NHWC, LayerNorm and Linear C -> F (+ bias + GELU). The
optimizer's rules fuse_dw_ln_mm* propose the kernel, eqfuse.ir.kernels classifies it (ConvNorm)
and the cost model chooses it over the separate kernels.

A task is an image's band of BAND output rows. The depthwise conv of every channel over the band
goes into a tile [C][BAND x OW] on the thread's stack; each pixel's layernorm is then a pass over
a column of the tile (vectors of pixels), and the matmul a GEMM over the normalized tile, the
output channels in the vector lanes (the weights [C][F] packed into panels, read as they are or
through a transposed view) and RO pixels a register
tile, its stores through the epilogue into the NHWC output. The two permutes are the tile's
layout; the depthwise conv's and the layernorm's outputs never reach memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from eqfuse.backend.cexpr import kernel_params, render
from eqfuse.backend.kinds.contraction.conv_dwpw import uses_flat
from eqfuse.backend.kinds.contraction.conv_geometry import ConvGeometry, conv_geometry
from eqfuse.backend.kinds.contraction.emit_gemm import c_type, gemm_epilogue
from eqfuse.backend.kinds.contraction.plan_gemm import PARALLEL_MIN_FMAS, Prepack, cdiv
from eqfuse.backend.plan import KernelPlan, UOp, computes_f32, ops_text, pointwise_flops
from eqfuse.ir.kernels import F32, ConvNorm
from eqfuse.machine import Machine


@dataclass(frozen=True)
class ConvDwLnDetail(ConvGeometry):
    """The plan of a fused depthwise conv + layernorm + matmul: the constants of
    csrc_templates/conv_dwln.c. Its geometry is the depthwise conv's (of C channels); F is the
    matmul's output channels."""

    F: int
    eps: float
    parallel: bool
    vl: int  # the output channels per vector of the matmul's register tile
    ro: int  # the matmul's register tile: its pixels
    nv: int  # ... and its vectors of output channels
    band: int  # output rows per task
    # the depthwise sums as vectors over the band's zero-padded rows taken as one run, else pixel by
    # pixel (conv_dwpw.uses_flat)
    flat: bool = False
    # the matmul's weights bound by params=, packed once into panels [F / (nv vl)][C][nv vl]
    # (conv.mark_bound), else packed per call
    prepack: Prepack | None = None


def is_fused(plan: KernelPlan) -> bool:
    """Whether a conv2d plan is a depthwise conv, layernorm and matmul (ir.kernels.ConvNorm)."""
    return isinstance(plan.shape.parts, ConvNorm)


def stack_bytes(g: ConvGeometry, band: int, vl: int) -> int:
    """The bytes of a task's buffers on the stack (csrc_templates/conv_dwln.c): the tile [C][BP],
    two channels' padded input rows and the sums over them."""
    bp = cdiv(band * g.OW, vl) * vl
    return (2 * g.C * bp + 3 * (g.in_rows(band) * g.in_cols(g.OW) + vl + g.KW * g.dilation[1])) * F32


def band_rows(g: ConvGeometry, par: bool, m: Machine) -> int:
    """BAND: all the output rows, cut into one band per core when the kernel runs in parallel and
    the images are fewer than the cores, and so that the tile and the padded input rows fit half
    of L2. Bands as large as that: a band's depthwise conv recomputes nothing but copies its
    KH - 1 halo rows again, and its matmul reads the weights once."""
    band = cdiv(g.OH, min(g.OH, max(1, cdiv(m.cores, g.N)))) if par else g.OH
    fit = max(b for b in range(1, g.OH + 1) if b == 1 or stack_bytes(g, b, m.simd_floats) <= m.l2 // 2)
    return max(1, min(band, fit))


def plan_conv_dwln(plan: KernelPlan, m: Machine) -> None:
    body, parts = plan.body, plan.shape.parts
    mm, ln = body.nodes[plan.shape.anchor], body.nodes[parts.ln]
    g = conv_geometry(plan, parts.dw)
    N, C, KH, KW, OH, OW = g.N, g.C, g.KH, g.KW, g.OH, g.OW
    F = body.nodes[mm.args[1]].type.shape[1]
    macs = N * OH * OW * C * (KH * KW + F)
    regs = 32 if m.simd_floats >= 16 else 16
    # two vectors of output channels by 8 pixels (4 with 16 registers): the pixels of a panel
    # divide a vector (the layernorm stores its vectors of pixels into the panels); three or four
    # vectors were no faster (benchmarks/RESULTS.md, 2026-11-28 evening)
    nv, ro = 2, min(m.simd_floats, 8 if regs == 32 else 4)  # (the accumulators, the weight vectors and a broadcast pixel)
    band = band_rows(g, macs >= PARALLEL_MIN_FMAS, m)
    tasks = N * cdiv(OH, band)
    d = ConvDwLnDetail(**asdict(g), F=F, eps=float(ln.attr["eps"]), parallel=macs >= PARALLEL_MIN_FMAS and tasks > 1,
                       vl=m.simd_floats, ro=ro, nv=nv, band=band, flat=uses_flat(g, band, m.simd_floats))
    plan.detail = d
    computes_f32(plan, "a fused depthwise conv, layernorm and matmul runs in f32: no bf16 path for this kernel")
    plan.tiles = {"band": band, "ro": ro, "nv": nv}
    plan.flops = 2 * macs + 8 * N * OH * OW * C + pointwise_flops(body, skip={parts.ln})
    tile = stack_bytes(d, band, d.vl)
    bp = cdiv(band * OW, d.vl) * d.vl
    plan.cache_check = (f"a band's tile {C} x {bp} (band {band} x {OW} pixels, whole vectors, a register tile past) "
                        f"and two channels' padded input rows: {tile} B <= L2/2 {m.l2 // 2} B: "
                        f"{'ok' if tile <= m.l2 // 2 else 'NO'}")
    plan.threads = (f"the {tasks} tasks (image, band of {band} output rows) split evenly" if d.parallel
                    else "one thread, no parallel region")
    epi = ops_text(body, skip=body.ancestors(plan.shape.anchor))
    plan.uops = [UOp(0, "Loop", f"{tasks} tasks (image, band of {band} output rows)", tasks),
                 UOp(1, "Exec", f"the depthwise {KH} x {KW} conv of the {C} channels over the band "
                                f"({'vectors over the run of padded rows' if d.flat else 'pixel by pixel'}), "
                                f"+ its bias, into the tile [{C}][{bp}]", tasks * C),
                 UOp(1, "Exec", f"the layernorm of each pixel over the {C} channels of its tile column "
                                f"(vectors of {d.vl} pixels; mean, then variance), in place", tasks * cdiv(band * OW, d.vl)),
                 UOp(1, "Exec", f"the matmul {C} -> {F}: register tiles of {ro} pixels x {nv} x {d.vl} output "
                                f"channels over the {C} channels of the tile (FMA, broadcast pixels, weights [{C}][{F}] "
                                f"in panels [{cdiv(F, nv * d.vl)}][{C}][{nv * d.vl}], packed per call or once when bound)", tasks * cdiv(F, nv * d.vl) * cdiv(band * OW, ro)),
                 UOp(1, "Store", f"the band's pixels through the epilogue ({epi or 'none'}), NHWC", tasks)]


def emit_conv_dwln(plan: KernelPlan) -> str:
    body, d, parts = plan.body, plan.detail, plan.shape.parts
    mm, dw, ln = body.nodes[plan.shape.anchor], body.nodes[parts.dw], body.nodes[parts.ln]
    params, ptrs = kernel_params(plan)
    groups = [("b", [0], False), ("j", [1, 2], False), ("i", [3], False)]
    epi, extras = gemm_epilogue(plan, groups, {plan.shape.anchor: "acc"})
    decls = "\n".join(f"    const {c_type(body, i)}* restrict {name} = {ptrs[i]};" for i, name in extras)
    bias = len(dw.args) == 3
    # the weights' element strides: [C][F] as they are, or the view they are read through
    # (eqfuse.backend.views: torch's Linear weight [F][C] transposed)
    wc, wf = plan.base_strides().get(mm.args[1], (d.F, 1))
    wm_at = f"wm[c * {wc}L + (f0 + l) * {wf}L]"
    return render("conv_dwln.c", NAME=plan.name, PARAMS=params, EXTRAS=decls, X=ptrs[dw.args[0]],
                  WD=ptrs[dw.args[1]], BD=ptrs[dw.args[2]] if bias else "0", BIAS=int(bias),
                  LG=ptrs[ln.args[1]], LB=ptrs[ln.args[2]], WM=ptrs[mm.args[1]], WM_AT=wm_at, PREPACKED=int(d.prepack is not None), EPS=f"{d.eps!r}f",
                  EPILOGUE=epi, PARALLEL=int(d.parallel), FLAT=int(d.flat), VL=d.vl, RO=d.ro, NV=d.nv,
                  BAND=d.band, F=d.F, **d.shape_c())
