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
stride, padding and dilation.
"""

from __future__ import annotations

from dataclasses import dataclass

from eqfuse.backend.cexpr import kernel_params, render
from eqfuse.backend.kinds.contraction.plan_gemm import parallel
from eqfuse.backend.plan import KernelPlan, UOp, computes_f32, ops_text, pointwise_flops
from eqfuse.ir.kernels import F32
from eqfuse.ir.ops import pair
from eqfuse.machine import Machine


@dataclass(frozen=True)
class ConvGroupedDetail:
    """The plan of a grouped conv2d: the constants of csrc_templates/conv_grouped.c."""

    N: int
    C: int
    H: int
    W: int
    O: int
    group: int
    KH: int
    KW: int
    OH: int
    OW: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    parallel: bool
    blocked_args: tuple[int, ...] = ()  # (the conv epilogue's interface: none read in blocks here)
    prepack = None  # (the weights are read as they are, OIHW)

    @property
    def cg(self) -> int:
        return self.C // self.group

    @property
    def og(self) -> int:
        return self.O // self.group


def is_grouped(cv) -> bool:
    """Whether a conv2d node runs here: more than one group."""
    return cv.attr.get("group", 1) != 1


def plan_conv_grouped(plan: KernelPlan, m: Machine) -> None:
    computes_f32(plan, "a depthwise or grouped conv runs in f32 under bf16: no bf16 path for this kernel")
    body, a = plan.body, plan.shape.anchor
    cv = body.nodes[a]
    (N, C, H, W), (O, CG, KH, KW) = (tuple(body.nodes[i].type.shape) for i in cv.args[:2])
    _, _, OH, OW = cv.type.shape
    g = cv.attr["group"]
    macs = N * O * OH * OW * CG * KH * KW
    # (the multiply-adds of a depthwise conv are few per byte: its parallel rule counts the
    # elements it reads and writes too)
    par = parallel(N * O, OH * OW, CG * KH * KW, 1) or N * (C * H * W + O * OH * OW) >= (1 << 17)
    d = ConvGroupedDetail(N, C, H, W, O, g, KH, KW, OH, OW, pair(cv.attr["stride"]), pair(cv.attr["padding"]),
                          pair(cv.attr["dilation"]), par)
    plan.detail = d
    plan.tiles = {"plane": OH * OW}
    plan.flops = 2 * macs + pointwise_flops(body)
    hp, wp = (OH - 1) * d.stride[0] + (KH - 1) * d.dilation[0] + 1, (OW - 1) * d.stride[1] + (KW - 1) * d.dilation[1] + 1
    plane = (hp * wp + OH * OW) * F32
    plan.cache_check = (f"a padded input plane {hp} x {wp} and an output plane {OH} x {OW}: {plane} B <= L2 {m.l2} B: "
                        f"{'ok' if plane <= m.l2 else 'NO'}")
    plan.threads = (f"the {N * O} output planes (image, channel) split evenly" if par
                    else "one thread, no parallel region")
    epi = ops_text(body, skip={a} | set(cv.args))
    plan.uops = [UOp(0, "Loop", f"{N * O} output planes (image, channel), {g} groups of {CG} input channels",
                     N * O),
                 UOp(1, "Load", f"input plane to a zero-padded copy [{hp}][{wp}]", N * O * CG),
                 UOp(1, "Exec", f"{OH} rows of {OW} pixels, each a sum over {KH} x {KW} taps in a register, "
                                "added to the plane's partial sums", N * O * CG * OH),
                 UOp(1, "Store", f"plane through the epilogue ({epi or 'none'}) in place, NCHW", N * O)]


def emit_conv_grouped(plan: KernelPlan) -> str:
    from eqfuse.backend.kinds.contraction.conv import epilogue_c

    body, a, d = plan.body, plan.shape.anchor, plan.detail
    cv = body.nodes[a]
    params, ptrs = kernel_params(plan)
    expr, decls = epilogue_c(plan)
    return render("conv_grouped.c", NAME=plan.name, PARAMS=params, EXTRAS=decls, X=ptrs[cv.args[0]],
                  WEIGHTS=ptrs[cv.args[1]], EPILOGUE=expr, PARALLEL=int(d.parallel), PLANE=plan.tiles["plane"], N=d.N, C=d.C, H=d.H, W=d.W,
                  O=d.O, G=d.group, CG=d.cg, OG=d.og, KH=d.KH, KW=d.KW, OH=d.OH, OW=d.OW, SH=d.stride[0],
                  SW=d.stride[1], PH=d.padding[0], PW=d.padding[1], DH=d.dilation[0], DW=d.dilation[1])
