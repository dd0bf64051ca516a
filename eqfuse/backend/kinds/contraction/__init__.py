"""The GEMM kinds: a matmul or conv2d with a fused pointwise epilogue (contraction, conv2d), and
a matmul whose finished rows go through a softmax, layernorm or rmsnorm (contraction_row).

The planning is eqfuse.backend.kinds.contraction.plan_gemm (`gemm_tiles` chooses the blocking), the C
eqfuse.backend.kinds.contraction.emit_gemm (epilogues, wrappers) around eqfuse.backend.kinds.contraction.emit_gemm (csrc_templates/gemm.c).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from eqfuse.backend.kinds.base import Kind
from eqfuse.backend.kinds.contraction import (
    conv,
    conv_amx,
    conv_dwln,
    conv_dwpw,
    conv_grouped,
    emit_gemm,
    qgemm,
)
from eqfuse.backend.kinds.contraction.plan_gemm import (
    AMX_POOL_MAX_M,
    Prepack,
    amx_few_rows,
    c_layout,
    conv_c_layout,
    plan_contraction,
    plan_skinny,
    skinny,
)
from eqfuse.backend.plan import KernelPlan
from eqfuse.ir.kernels import GEMM_KINDS, K
from eqfuse.machine import Machine


class Contraction(Kind):
    kinds = (K.CONTRACTION, K.CONV2D, K.CONTRACTION_ROW)
    writes_strided = True  # a matmul's GEMM only (writes_through)

    def plan(self, plan: KernelPlan, m: Machine) -> None:
        if plan.kind == K.CONV2D and conv_dwln.is_fused(plan):
            return conv_dwln.plan_conv_dwln(plan, m)  # (a depthwise conv, its layernorm and matmul)
        if plan.kind == K.CONV2D and conv_dwpw.is_fused(plan):
            return conv_dwpw.plan_conv_dwpw(plan, m)  # (a depthwise conv and its 1x1 conv)
        if plan.kind == K.CONV2D and conv_grouped.is_grouped(plan.body.nodes[plan.shape.anchor]):
            return conv_grouped.plan_conv_grouped(plan, m)  # (depthwise and grouped convs)
        if plan.kind == K.CONV2D and conv_amx.plan_conv_amx(plan, m):
            return  # (on AMX tiles, read from the input: conv_amx.use_amx_direct)
        if plan.kind == K.CONV2D and conv.plan_conv_direct(plan, m):
            return  # a direct conv (conv.use_direct), else im2col + GEMM
        if qgemm.is_integer(plan):
            return qgemm.plan_qgemm(plan, m)  # (matmul_integer: the u8 x s8 GEMM)
        plan_contraction(plan, m)

    def writes_through(self, plan: KernelPlan, strides) -> bool:
        """A matmul's GEMM stores C at a row stride and a batch stride (plan_gemm.c_layout), a
        conv2d's at a row, column and image stride (plan_gemm.conv_c_layout); not a row
        epilogue (the row templates walk rows of N)."""
        if isinstance(plan.detail, (conv.ConvDirectDetail, conv_grouped.ConvGroupedDetail, qgemm.QGemmDetail,
                                    conv_dwpw.ConvDwPwDetail, conv_dwln.ConvDwLnDetail, conv_amx.ConvAmxDetail)):
            return False  # (writes NCHW contiguous, conv_dwln NHWC; the integer GEMM writes C contiguous)
        if plan.kind == K.CONV2D:
            return conv_c_layout(plan, strides) is not None
        return plan.kind == K.CONTRACTION and c_layout(plan, strides) is not None

    def after_views(self, plan: KernelPlan, m: Machine) -> None:
        if plan.in_strides and plan.kind != K.CONV2D:  # A or B read through a view: planned again
            plan.tiles, plan.detail, plan.uops = {}, None, []
            self.plan(plan, m)

    def emit(self, plan: KernelPlan) -> str:
        if isinstance(plan.detail, qgemm.QGemmDetail):
            return qgemm.emit_qgemm(plan)
        if isinstance(plan.detail, conv_grouped.ConvGroupedDetail):
            return conv_grouped.emit_conv_grouped(plan)
        if isinstance(plan.detail, conv_dwpw.ConvDwPwDetail):
            return conv_dwpw.emit_conv_dwpw(plan)
        if isinstance(plan.detail, conv_dwln.ConvDwLnDetail):
            return conv_dwln.emit_conv_dwln(plan)
        if isinstance(plan.detail, conv.ConvDirectDetail):
            return conv.emit_conv_direct(plan)
        if isinstance(plan.detail, conv_amx.ConvAmxDetail):
            return conv_amx.emit_conv_amx(plan)
        if plan.kind == K.CONV2D:
            return emit_gemm.emit_conv2d(plan)
        return emit_gemm.emit_contraction(plan)


def mark_bound_b(plan: KernelPlan, bound: set[int], m: Machine, values: Mapping[int, np.ndarray] | None = None,
                 run_time_rows: int | None = None) -> None:
    """detail.prepack for a matmul GEMM whose B (or the matrix its transpose reads) is one of
    the body inputs `bound` by params=, read by nothing else in the kernel, and one matrix for
    every batch (emit then reads B as panels the runtime packs once). A matmul with few rows
    then takes the memory-bound skinny path (plan_gemm.skinny, planned by plan_skinny). `values`
    (body input -> its bound array, where known) lets an integer GEMM choose its path by its
    weights' range (qgemm.mark_bound). A GEMM whose rows are `run_time_rows` (the capacity of a dim
    taken at run time, eqfuse.backend.runtime_dim) stays on the blocked path, which takes them."""
    d = plan.detail
    if isinstance(d, conv_grouped.ConvGroupedDetail) and not d.channels or \
            isinstance(d, conv_dwpw.ConvDwPwDetail) and not d.olanes:
        return  # (reads the weights as they are)
    if isinstance(d, qgemm.QGemmDetail):
        return qgemm.mark_bound(plan, bound, m, values)
    if isinstance(d, (conv.ConvDirectDetail, conv_grouped.ConvGroupedDetail, conv_dwpw.ConvDwPwDetail,
                      conv_dwln.ConvDwLnDetail, conv_amx.ConvAmxDetail)):
        return conv.mark_bound(plan, bound)
    if plan.kind not in GEMM_KINDS or not (d.gemm.mode == "fold" or d.pixels_as_rows):
        return  # (otherwise B differs between batches, or is a conv's column matrix)
    body = plan.body
    b = body.nodes[plan.shape.anchor].args[1]
    src = body.nodes[b].args[0] if body.nodes[b].op == "transpose" else b
    if src not in bound or len([n for n in body.nodes if src in n.args]) != 1:
        return
    gname = f"{plan.name}_gemm"  # (emit_gemm's name for it)
    plan.detail = replace(plan.detail, direct_b=False,
                          prepack=Prepack(body.inputs.index(src), f"{gname}_prepack", f"{gname}_prepack_floats"))
    packed = "B panels packed once when bound (params=)" + (", in bf16" if plan.precision == "bf16" else "")
    plan.uops = [replace(u, what=f"{packed}, read in place")
                 if u.op == "Load" and ("pack B panel" in u.what or u.what.startswith("B read in place")) else u
                 for u in plan.uops]  # the tile schedule says so
    d = plan.detail
    unit_columns = plan.out_strides is None or plan.out_shape[-1] == 1 or plan.out_strides[-1] == 1
    # (a few rows on AMX tiles, plan_gemm.amx_few_rows: where its panels can run on the claim-based pool)
    tiles = plan.kind == K.CONTRACTION and d.gemm.mode == "fold" and d.gemm.batch == 1 and run_time_rows is None \
        and amx_few_rows(plan, d.gemm.M)
    if plan.kind != K.CONV2D and d.gemm.mode == "fold" and skinny(d.gemm.M, d.N, d.K, m) and unit_columns \
            and not tiles and (run_time_rows is None or plan.out_shape[-2] != run_time_rows):
        plan_skinny(plan, m)
    elif tiles and d.parallel and d.gemm.M <= AMX_POOL_MAX_M:  # (more rows: the blocked GEMM's region)
        plan.detail = replace(d, pool=True)
        plan.threads = ("the column panels in ranges claimed one at a time by the claim-based pool's threads "
                        "(common_pool.h, eqf_region: the caller waits for no thread that has not started)")
