"""3x3 stride-1 convs by Winograd F(2x2, 3x3) (csrc_templates/conv_winograd.c): planning and emit.

A direct conv makes 9 multiply-adds per output pixel, input channel and output channel; F(2x2,
3x3) makes 16 per 2x2 pixels (2.25x fewer), at the price of two transforms made of adds (the
input's 4x4 windows, the 2x2 outputs) and of weights transformed once (U = G g G^T, 16 values
per 3x3 filter, packed like any bound weights). The multiply-adds become 16 GEMMs per block of
tiles, run with the direct conv's register tile (RW rows x V vectors of output channels). On the
ResNet convs that dominate a model's time (64-512 channels, 3x3, stride 1) the GEMMs are the work,
and a 64-channel conv at 56 x 56 takes about half the direct kernel's time (benchmarks/bench_conv.py).
onnxruntime's MLAS runs these convs directly (NCHWc); oneDNN and NNPACK have Winograd kernels.

The plan is a ConvDirectDetail with `winograd` = TB, the tiles per block: the blocked layout
(eqfuse.backend.conv_blocked) treats it as a direct conv: its input and output may be in blocks
of VL channels, and its epilogue reads operands in blocks at `blk`. EQFUSE_CONV_WINOGRAD=0 turns
it off (to measure the direct kernel), =1 takes it for every conv it can run.
"""

from __future__ import annotations

import os
from dataclasses import replace

from eqfuse.backend.cexpr import kernel_params, render
from eqfuse.backend.lower_gemm import cdiv
from eqfuse.backend.plan import KernelPlan, UOp, ops_text
from eqfuse.ir.kernels import F32
from eqfuse.machine import Machine


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
    regs, scratch = rw * v + v + 1, tb * (16 * (d.C + d.O) + 32) * F32
    plan.cache_check = (f"registers: {rw} x {v} accumulators + {v} weights + 1 broadcast = {regs} vectors; "
                        f"a thread's transformed tiles {tb} x (16 x ({d.C} + {d.O}) + 32) x {F32} = {scratch} B "
                        f"<= L2 / 2 {m.l2 // 2} B: {'ok' if scratch <= m.l2 // 2 else 'NO (one register tile of rows)'}")
    plan.threads = (f"the {t} tiles of 2 x 2 pixels split evenly, each thread its own run, in blocks of {tb}"
                    if d.parallel else "one thread, no parallel region")
    epi = ops_text(plan.body, skip={plan.shape.anchor} | set(plan.body.nodes[plan.shape.anchor].args))
    nb = cdiv(t, tb)
    plan.uops = [
        UOp(0, "Exec", "weights to blocks, Winograd-transformed: U = G g G^T, [16][O / OBW][C][OBW] "
                       "(once when bound by params=)", 1),
        UOp(0, "Loop", f"{nb} blocks of {tb} tiles of 2 x 2 output pixels", nb),
        UOp(1, "Load", f"input windows 4 x 4 x {d.vl} channels, B^T d B into [16][{tb}][{d.C}]",
            t * (d.C // d.vl)),
        UOp(1, "Exec", f"16 GEMMs {tb} x {d.C} x {d.O}: {rw} x {d.obw} register tiles over {d.C} steps",
            16 * (d.O // d.obw) * t // rw),
        UOp(1, "Store", f"A^T m A per tile and {d.vl} output channels through the epilogue ({epi or 'none'})"
                        " into NCHW", t * (d.O // d.vl))]


def reorders(d) -> bool:
    """Whether an NCHW output is stored in blocks, then reordered (conv_reorder.c): whole rows of VL pixels."""
    return not d.out_blocked and d.OW >= d.vl and d.vl in (4, 8, 16)


def emit_conv_winograd(plan: KernelPlan) -> str:
    from eqfuse.backend.conv_direct import epilogue_c, reorder_fn
    d, cv = plan.detail, plan.body.nodes[plan.shape.anchor]
    params, ptrs = kernel_params(plan)
    expr, decls = epilogue_c(plan)
    ro = reorders(d)
    return render("conv_winograd.c", NAME=plan.name, PARAMS=params, EXTRAS=decls, X=ptrs[cv.args[0]],
                  WEIGHTS=ptrs[cv.args[1]], PREPACKED=int(d.prepack is not None), PARALLEL=int(d.parallel),
                  EPILOGUE=expr, N=d.N, C=d.C, H=d.H, W=d.W, O=d.O, OH=d.OH, OW=d.OW, PH=d.padding[0],
                  PW=d.padding[1], VL=d.vl, V=d.v, OBW=d.obw, RW=d.rw, TB=d.winograd, IN_BLOCKED=int(d.in_blocked),
                  OUT_BLOCKED=int(d.out_blocked), REORDER=int(ro), REORDER_FN=reorder_fn(plan.name, d.vl) if ro else "")
