"""The row kind: one softmax, layernorm or rmsnorm, their gradients (softmax_grad,
layernorm_grad), or a sum/mean/max over the trailing axes, with a pointwise prologue and
epilogue; each row is walked in passes while it is in cache (csrc_templates/row_softmax.c,
row_layernorm.c, row_rmsnorm.c, row_grad.c, row_reduce.c)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from itertools import count

from eqfuse.backend.cexpr import I1, I2, Exprs, Space, kernel_params, param_job, render
from eqfuse.backend.indexing import contiguous, offset
from eqfuse.backend.kinds.base import (
    PARALLEL_MIN,
    Kind,
    input_names,
    parallel_rule,
    vectors,
)
from eqfuse.backend.kinds.reduce import NAN_TRACK, REDUCE
from eqfuse.backend.plan import (
    KernelPlan,
    UOp,
    not_ancestors,
    ops_text,
    pointwise_flops,
    size,
)
from eqfuse.ir.kernels import F32, ROW_OPS, K, computed_ancestors, quantized_row
from eqfuse.ir.ops import OPS, flit, reduce_axes

REGION_OPS = ("layernorm", "rmsnorm", "softmax")  # the templates whose loop over rows is eqf_region's (RowDetail.regions)
ALONG_AXIS = ("softmax", "softmax_grad")  # rows along one axis (strided when not the last), not trailing axes


@dataclass(frozen=True)
class RowDetail:
    op: str
    rows: int
    L: int  # elements of a row
    axis0: int  # the input's first row axis (softmax: its one axis, rows strided when not the last)
    parallel: bool  # the `if` of the loop over rows
    vl: int = 16  # floats in a vector of the machine
    lanes: int = 0  # a layernorm's rows in the lanes, this many a block (row_layernorm_lanes.c), else 0
    quantize_out: bool = False  # the result is quantized (u8 / i8): the rows are computed in scratch rows (QUANTIZE_OUT)
    quantize_flat: bool = False  # a block's quantized rows are one loop over the block (QUANTIZE_FLAT, quantize_flat())
    sum_apart: bool = False  # a norm's first pass only stores the row, eqf_row_sum sums it (SUM_APART, sum_apart())

    @property
    def regions(self) -> bool:
        """Whether the loop over rows is eqf_region ranges (common_pool.h; row_layernorm.c,
        row_rmsnorm.c, row_softmax.c): OpenMP's static split when every core is free, else the
        claim-based pool, which the run function holds over the kernel (eqfuse.runtime.program.
        hold_pool), so that a call whose GEMMs run on the pool (a decode step's, a quantized
        model's) wakes no OpenMP team between them. The other row templates open OpenMP regions."""
        return self.op in REGION_OPS and not self.lanes


# A layernorm reads its rows across the lanes (row_layernorm_lanes.c: a block of rows at a time, the
# rows' elements loaded as vectors of consecutive rows, no horizontal sums) when its row axis is
# strided and at least a vector of consecutive rows lie at stride 1: the channels-first layernorm
# of ConvNeXt (the layernorm over the channels of an NCHW tensor's NHWC view, the channels at the
# image's stride), which one row at a time gathers each row element by element. The block's tile
# (a row's L values x `lanes` rows) is kept within LANES_TILE_BYTES, in L2: read three times, it
# need not fit L1. `python benchmarks/bench_dwpw.py --layernorm` (benchmarks/RESULTS.md
# 2026-11-28 late evening (2)): at 1 thread the graph (+ the permute back) is 1.4-2.1x faster than
# the rows one at a time at the zoo's tiny ConvNeXt's sizes and 2-5x at ConvNeXt-T's; a 64 KB tile
# is ahead of a 16 KB one from 96 channels of 56 x 56 up (and takes 384 and 768 channels at all)
LANES_TILE_BYTES = 65536


def lanes_run(plan: KernelPlan) -> int:
    """The number of consecutive rows of a layernorm's input at stride 1 (the trailing row dims
    that are contiguous in memory) when its row axis is strided, else 0."""
    an = plan.body.nodes[plan.shape.anchor]
    if an.op != "layernorm" or an.args[0] not in plan.body.inputs:
        return 0
    xshape = tuple(plan.body.nodes[an.args[0]].type.shape)
    k = plan.body.inputs.index(an.args[0])
    st = plan.in_strides.get(k)
    axis0 = plan.detail.axis0
    if st is None or axis0 != len(xshape) - 1 or xshape[axis0] == 1 or st[axis0] == 1:
        return 0
    run, e = 1, 1
    for d in range(axis0 - 1, -1, -1):
        if xshape[d] != 1 and st[d] != e:
            break
        run *= xshape[d]
        e *= xshape[d]
    return run


def lanes_block(plan: KernelPlan) -> int:
    """Rows a block of row_layernorm_lanes.c, or 0 when the rows go one at a time: where the run
    of consecutive rows is at least a vector and a vector of rows' tile fits LANES_TILE_BYTES (and
    the result is f32: the lanes template has no quantized store)."""
    d, run = plan.detail, lanes_run(plan)
    if d.quantize_out or run < d.vl or d.L * d.vl * F32 > LANES_TILE_BYTES:
        return 0
    return min(run, LANES_TILE_BYTES // (d.L * F32) // d.vl * d.vl)


def sum_apart(body, a: int) -> bool:
    """Whether a layernorm's or rmsnorm's first pass only stores the row and eqf_row_sum
    (common_simd.h) sums it, four vectors and a tree, rather than the pass summing it: where the
    prologue reads a tensor of bytes (u8 / i8: a DequantizeLinear's), gcc's vectors in that pass
    hold 64 lanes, which a reduction in the loop adds one after another at each row's end. On f32
    prologues (16 lanes) the pass's own sum is kept. `python benchmarks/bench_quantized_rows.py`."""
    n = body.nodes[a]
    if n.op not in ("layernorm", "rmsnorm"):
        return False
    up = body.ancestors(n.args[0])
    return any(body.nodes[i].type.dtype in ("u8", "i8") and size(body.nodes[i].type.shape) > 1
               for i in body.inputs if i in up)


def quantize_flat(plan: KernelPlan) -> bool:
    """Whether a quantized row kernel quantizes a block of rows in one loop over the block (the
    templates' QUANTIZE_FLAT) rather than row by row: where the block's rows are consecutive in the
    output (the output contiguous, a softmax along its last axis) and the epilogue is the quantize
    of the row op's result by a scalar scale and zero point, which reads no row or column. A loop
    over one row of u8 is vectorized at the u8's width, so a short row's floats take part vectors
    (a row of 16: 4 floats a vector, `python benchmarks/bench_quantized_rows.py`)."""
    d, body = plan.detail, plan.body
    if not d.quantize_out:
        return False
    a, q = plan.shape.anchor, body.nodes[body.outputs[0]]
    if q.args[0] != a or any(size(body.nodes[i].type.shape) != 1 for i in q.args[1:]):
        return False
    xshape = tuple(body.nodes[body.nodes[a].args[0]].type.shape)
    if d.op in ALONG_AXIS and size(xshape[d.axis0 + 1:]) != 1:
        return False
    cs = plan.out_strides or contiguous(xshape)
    return all(cs[k] == size(xshape[k + 1:]) for k in range(len(xshape)) if xshape[k] > 1)


def next_row(decls: list[str], pro_text: str, params: str, rows: int, ahead: str = "1") -> str:
    """The templates' `next` (prefetched while row r computes): row r + ahead of the first f32 input
    the prologue reads as whole contiguous rows (`in<k>[off<m> + j]`), else NULL."""
    for ptr, off in re.findall(r"\b(in\d+)\[(off\d+) \+ j\]", pro_text):
        decl = next((d for d in decls if f"const long {off} = " in d), None)
        if decl is not None and f"const float* restrict {ptr}" in params:
            nxt = re.sub(r"\(r\)|\br\b", f"(r + {ahead})", decl.split(" = ", 1)[1].rstrip(";"))
            return f"(r + {ahead} < {rows} ? {ptr} + {nxt} : NULL)"
    return "NULL"


class Row(Kind):
    kinds = (K.ROW,)
    writes_strided = True  # softmax, layernorm, rmsnorm (writes_through)

    def writes_through(self, plan: KernelPlan, strides) -> bool:
        """A softmax writes its rows at any strides; a layernorm or rmsnorm writes each row of L
        contiguous (its template walks y[j]), the rows anywhere; a row reduction not at all."""
        an = plan.body.nodes[plan.shape.anchor]
        if an.op == "softmax" or lanes_block(plan):  # (the lanes template writes element by element)
            return True
        if an.op not in ("layernorm", "rmsnorm"):  # (the gradients write their own rows)
            return False
        xshape = tuple(plan.body.nodes[an.args[0]].type.shape)
        return all(strides[k] == size(xshape[k + 1:]) for k in range(plan.detail.axis0, len(xshape)) if xshape[k] > 1)


    def plan(self, plan: KernelPlan, c) -> None:
        body, a = plan.body, plan.shape.anchor
        an = body.nodes[a]
        xshape = tuple(body.nodes[an.args[0]].type.shape)
        if an.op in ("softmax", "layernorm", "softmax_grad", "layernorm_grad"):
            axis0 = an.attr["axis"] % len(xshape)  # rows run along this axis (strided when not the last)
        elif an.op == "rmsnorm":
            axis0 = len(xshape) - 1
        else:  # sum / mean / max over trailing axes
            axes = reduce_axes(an.attr, len(xshape))
            axis0 = min(axes) if axes else len(xshape)
        rows, L = size(xshape[:axis0]), size(xshape[axis0:])
        if an.op in ALONG_AXIS:
            rows, L = size(xshape) // xshape[axis0], xshape[axis0]
        par = rows > 1 and rows * L >= PARALLEL_MIN // 4
        qout = an.op in ROW_OPS and quantized_row(body, a, body.outputs[0])
        plan.detail = RowDetail(an.op, rows, L, axis0, par, c.simd_floats, quantize_out=qout,
                                sum_apart=sum_apart(body, a))
        plan.threads = parallel_rule(par, f"{rows} rows x {L}", PARALLEL_MIN // 4, f"the {rows} rows")
        plan.flops = OPS[an.op].flops * size(xshape) + pointwise_flops(body, skip={a})
        row_bytes = L * F32 * (len(body.inputs) + 1)
        plan.cache_check = (f"row working set {row_bytes} B <= L2 {c.l2} B: "
                            f"{'ok' if row_bytes <= c.l2 else 'no (streams from L3)'}")
        passes = {"softmax": 3, "layernorm": 3, "rmsnorm": 2, "softmax_grad": 2, "layernorm_grad": 4}.get(an.op, 1)
        pro = ops_text(body, skip=not_ancestors(body, an.args[0]))
        u = plan.uops
        u.append(UOp(0, "Loop", f"r over {rows} rows (parallel)", rows))
        for nm, i in zip(input_names(plan), body.inputs):
            u.append(UOp(1, "Load", f"{nm} row [{L}]" if size(body.nodes[i].type.shape) > 1 else f"{nm} scalar", rows))
        u.append(UOp(1, "Exec", f"prologue ({pro or 'none'}) + {an.op} in {passes} passes over the row in cache "
                                f"({vectors(L, c.simd_floats)} vectors each)", rows))
        u.append(UOp(1, "Store", f"out row [{L if an.op in ROW_OPS else 1}] after the epilogue"
                                 + (" (quantized from f32 scratch rows, a block of rows at a time)" if qout else ""), rows))

    def after_views(self, plan: KernelPlan, m) -> None:
        if quantize_flat(plan):  # (the output's strides are known now)
            plan.detail = replace(plan.detail, quantize_flat=True)
        b = lanes_block(plan)
        if b:
            d = plan.detail
            plan.detail = replace(d, lanes=b)
            plan.uops[-2] = UOp(1, "Exec", f"layernorm of blocks of {b} rows in the lanes (the row axis strided, "
                                           f"{lanes_run(plan)} rows at stride 1): sums, mean, deviations as vectors "
                                           f"over a tile of {d.L} x {b}", d.rows)

    def emit(self, plan: KernelPlan) -> str:
        body, a = plan.body, plan.shape.anchor
        an = body.nodes[a]
        xshape = tuple(body.nodes[an.args[0]].type.shape)
        d = plan.detail
        axis0, rows, L = d.axis0, d.rows, d.L
        if an.op in ALONG_AXIS:
            col_dims = [axis0]
            row_dims = [k for k in range(len(xshape)) if k != axis0]
        else:
            col_dims = list(range(axis0, len(xshape)))
            row_dims = list(range(axis0))
        params, ptrs = kernel_params(plan)
        ids = count()
        if d.lanes:
            return self._emit_lanes(plan, params, ptrs, ids)
        r = "r"  # (the row r's offsets are of the physical row this variable gives)
        if plan.live is not None and plan.live.what == "dim":  # (eqfuse.backend.runtime_dim) the rows at
            params += ", long live"  # the dim's first `live` positions: the first rows when it leads them,
            rows = f"(live * {rows // plan.live.rows})"  # else each outer row's first live x A of C x A
            ax, C = plan.live.axis, plan.live.rows
            A = size([xshape[k] for k in row_dims if k > ax])
            if any(xshape[k] > 1 for k in row_dims if k < ax):
                r = f"(r / (live * {A}) * {C * A} + r % (live * {A}))"
        space = Space(xshape, [(r, row_dims, True), ("j", col_dims, False)], I1, ids)
        pro = Exprs(body, space, ptrs, {}, I2, strides=plan.base_strides())
        x = pro.value(an.args[0])
        a1 = pro.value(an.args[1]) if an.op in ("softmax_grad", "layernorm_grad") else ""
        common = {"NAME": plan.name, "PARAMS": params, "ROWS": rows, "L": L,
                  "PARALLEL": int(d.parallel), "PRO_BODY": pro.text(), "X": x}
        if an.op in ROW_OPS:
            epi = Exprs(body, space, ptrs, {a: "v"}, I2, strides=plan.base_strides())
            e = epi.value(body.outputs[0])
            cs = plan.out_strides or contiguous(xshape)  # a softmax may write through strides
            common.update(OFFSETS="\n".join(space.decls), EPI_BODY=epi.text(), EPI=e, R0=0)
            ybase = offset(r, [xshape[k] for k in row_dims], [cs[k] for k in row_dims])
            if an.op in ("softmax_grad", "layernorm_grad"):
                grad = an.op == "layernorm_grad"
                return render("row_grad.c", OP=an.op, MODE=int(grad), A1=a1, YBASE=ybase, YS=cs[axis0] if not grad else 1,
                              GAMMA_J=f"{ptrs[an.args[2]]}[j]" if grad else "1.0f",
                              EPS=flit(an.attr["eps"]) if grad else "0.0f", **common)
            ahead = f"EQF_ROW_BLOCK({L})" if an.op == "softmax" else "1"  # softmax: the next block's row
            common["QUANTIZE_OUT"], common["QUANTIZE_FLAT"] = int(d.quantize_out), int(d.quantize_flat)
            common["QUANTIZE_BLOCK"] = quantize_block(common, ybase, cs[axis0] if an.op == "softmax" else 1) \
                if d.quantize_out else ""
            common["NEXT"] = next_row(space.decls, common["PRO_BODY"], params, rows, ahead)
            if an.op == "softmax":
                return render("row_softmax.c",
                              YBASE=offset(r, [xshape[k] for k in row_dims], [cs[k] for k in row_dims]),
                              YS=cs[axis0], ZERO_NAN=int(an.attr["zero_nan"]),
                              **with_rows_head(common, f"EQF_ROW_BLOCK({L})"))
            g = ptrs[an.args[1]]
            extra = {"GAMMA": g, "EPS": flit(an.attr["eps"]), "SUM_APART": int(d.sum_apart),
                     "YBASE": offset(r, [xshape[k] for k in row_dims], [cs[k] for k in row_dims])}
            if an.op == "layernorm":
                extra["BETA"] = ptrs[an.args[2]]
            return render(f"row_{an.op}.c", **with_rows_head(common, f"{plan.name}_RB"), **extra)
        # sum / mean / max over trailing axes: one value per row
        espace = Space(plan.out_shape, [(r, list(range(len(plan.out_shape))), True)], I1, ids)
        epi = Exprs(body, espace, ptrs, {a: "v"}, I1, forbid=computed_ancestors(body, an.args[0]),
                    strides=plan.base_strides())
        e = epi.value(body.outputs[0])
        red = REDUCE[an.op]
        return render("row_reduce.c", OP=an.op, OUT_ROW=r, OFFSETS="\n".join(space.decls), EPI_OFFSETS="\n".join(espace.decls),
                      EPI_BODY=epi.text(), EPI=e, INIT=red[0], RED=red[1], COMBINE=red[2],
                      NAN_TRACK=NAN_TRACK.get(an.op, ""),
                      SCALE=flit(1.0 / L) if an.op == "mean" else "1.0f", **common)

    def _emit_lanes(self, plan: KernelPlan, params: str, ptrs, ids) -> str:
        """row_layernorm_lanes.c: the rows r = (outer row q, run row p), p in the lanes."""
        body, d = plan.body, plan.detail
        an = body.nodes[plan.shape.anchor]
        xshape = tuple(body.nodes[an.args[0]].type.shape)
        run = lanes_run(plan)
        split, n = d.axis0, 1
        while n < run:  # the trailing row dims that make up the run
            split -= 1
            n *= xshape[split]
        outer, tail, cols = list(range(split)), list(range(split, d.axis0)), [d.axis0]
        space = Space(xshape, [("q", outer, True), ("p", tail, False), ("j", cols, False)], I1, ids)
        pro = Exprs(body, space, ptrs, {}, I2, strides=plan.base_strides())
        x = pro.value(an.args[0])
        epi = Exprs(body, space, ptrs, {plan.shape.anchor: "v"}, I2, strides=plan.base_strides())
        e = epi.value(body.outputs[0])
        cs = plan.out_strides or contiguous(xshape)
        yoff = " + ".join(t for t in (offset("q", [xshape[k] for k in outer], [cs[k] for k in outer]),
                                      offset("p", [xshape[k] for k in tail], [cs[k] for k in tail]),
                                      offset("j", [xshape[k] for k in cols], [cs[k] for k in cols])) if t != "0")
        return render("row_layernorm_lanes.c", NAME=plan.name, PARAMS=params, ROWS=d.rows, L=d.L,
                      OUTER=d.rows // run, RUN=run, BLOCK=d.lanes, NB=-(-run // d.lanes), PARALLEL=int(d.parallel),
                      OFFSETS="\n".join(space.decls), PRO_BODY=pro.text(), X=x, EPI_BODY=epi.text(), EPI=e,
                      YOFF=yoff or "0", GAMMA=ptrs[an.args[1]], BETA=ptrs[an.args[2]], EPS=flit(an.attr["eps"]))


def with_rows_head(common: dict, step: str) -> dict:
    """The softmax, layernorm and rmsnorm templates' values: `common` with ROWS_HEAD, row_blocks.c,
    the head of their loop over blocks of `step` rows (`eqf_first`, `eqf_end`: the rows it runs),
    in place of the signature and first row it takes: the blocks as an eqf_region loop, or, in a
    GEMM's row epilogue (PARALLEL -1), the rows the GEMM's thread has finished."""
    keys = ("NAME", "PARAMS", "ROWS", "R0")
    head = render("row_blocks.c", STEP=step, **{k: common[k] for k in keys}, **param_job(common["PARAMS"])).rstrip("\n")
    return {**{k: v for k, v in common.items() if k not in ("PARAMS", "R0")}, "ROWS_HEAD": head}


def quantize_block(common: dict, ybase: str, ys) -> str:
    """row_quantize_block.c, the last pass of a quantized row kernel (the plan's quantize_out) that
    the softmax, layernorm and rmsnorm templates share: the block's f32 scratch rows quantized into
    the output, in one loop over the block (quantize_flat) or row by row, row r at ybase, its
    elements ys apart."""
    keys = ("NAME", "L", "EPI_BODY", "EPI", "OFFSETS")
    return render("row_quantize_block.c", YBASE=ybase, YS=ys, **{k: common[k] for k in keys}).rstrip("\n")
