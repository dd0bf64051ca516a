"""The pointwise kind: a tree of pointwise ops over tensors and scalar constants, one loop over
the output (csrc_templates/pointwise.c), tiled for L1 or streamed past the caches. Its result may
be written through strides (plan.out_strides: into a layout copy's storage, eqfuse.backend.views);
such a result is never streamed."""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import count

from eqfuse.backend.cexpr import (
    I1,
    I2,
    Exprs,
    Space,
    ctypes_of,
    has_fast_form,
    kernel_params,
    param_job,
    render,
)
from eqfuse.backend.indexing import (
    coalesce,
    contiguous,
    joint_groups,
    leaf_strides,
    offset,
)
from eqfuse.backend.kinds.base import (
    PARALLEL_MIN,
    Kind,
    input_names,
    parallel_rule,
    vectors,
)
from eqfuse.backend.live import emit_repeat
from eqfuse.backend.plan import KernelPlan, UOp, ops_text, pointwise_flops, size
from eqfuse.errors import EqfuseError
from eqfuse.ir.kernels import F32, K, quantized_out

# Elements per tile of a streaming pointwise kernel: a multiple of 16 (tiles start on 64-byte
# lines of the output); nothing of it is kept in cache, it only amortizes the per-tile set-up.
STREAM_TILE = 4096
STREAM_MIN_INNER = 64  # streaming needs whole output lines: inner loops shorter than this store normally


@dataclass(frozen=True)
class PointwiseDetail:
    inner: int  # elements of the inner loop (the innermost dims every operand walks with one stride)
    stream_bytes: int  # outputs of at least this many bytes are streamed (non-temporal stores)
    parallel: bool  # the tiles are shared by the threads (eqf_region's `parallel`)
    two_pass: bool  # an op has a fast form (sin, cos): each run computed with it, again exactly if a guard failed
    run: int  # elements per run of the two passes (4 vectors: a run that fails costs little); the tile without
    # the result a quantize_linear of one scale and one zero point (ir.kernels.quantized_out) into a
    # contiguous output, not streamed, without fast forms: blocks of floats quantized at once (QOUT)
    qout: bool = False
    # the tiles are eqf_region ranges: OpenMP's static split when every core is free, else the
    # claim-based pool, held by the run function over the kernel (eqfuse.runtime.program.hold_pool)
    regions = True


def inner_groups(plan: KernelPlan) -> list[list[int]]:
    """The output's dims grouped into loops every operand walks with one stride each."""
    shape = plan.out_shape
    sets = leaf_strides(plan.body, plan.body.outputs[0], shape, plan.base_strides()) + [out_strides(plan)]
    groups = joint_groups(shape, sets)
    if plan.live is not None and plan.live.what == "rows" and len(groups[-1]) > 1:  # (eqfuse.backend.live) its last axis, bounded at
        groups[-1:] = [groups[-1][:-1], groups[-1][-1:]]  # run time, is the inner loop by itself
    if plan.live is not None and plan.live.what == "dim":  # (eqfuse.backend.runtime_dim) a run-time dim
        ax = plan.live.axis  # is a loop of its own
        groups = [part for g in groups for part in
                  ([g[:g.index(ax)], [ax], g[g.index(ax) + 1:]] if ax in g else [g]) if part]
    return groups


def out_strides(plan: KernelPlan) -> tuple[int, ...]:
    return plan.out_strides or contiguous(plan.out_shape)


class Pointwise(Kind):
    kinds = (K.POINTWISE,)
    writes_strided = True


    def plan(self, plan: KernelPlan, c) -> None:
        total = size(plan.out_shape)
        streams = len(plan.body.inputs) + 1
        # Outputs beyond this core count's share of the last-level cache bypass it (non-temporal
        # stores). The L3 the system reports may be the whole socket's (480 MiB on some shared
        # hosts), so the share is capped at 8 L2s per core.
        stream_bytes = min(c.l3 // 2, 8 * c.l2 * c.cores)
        groups = inner_groups(plan)
        inner = size([plan.out_shape[d] for d in groups[-1]]) if groups else 1
        f32_out = plan.body.nodes[plan.body.outputs[0]].type.dtype == "f32"  # streamed lines are 16 floats
        # streamed lines are whole 64-byte lines of a contiguous row of the output
        stream = f32_out and not plan.out_strides and total * F32 >= stream_bytes and inner >= STREAM_MIN_INNER
        if stream:
            # Each whole output line is computed in registers and streamed out (4 input/output
            # streams overlapped; the earlier 1024-element L1 buffer copied out afterwards was
            # slower on 16M elements: benchmarks/bench_stream.py).
            tile = min(STREAM_TILE, -(-inner // 16) * 16)
            plan.cache_check = (f"output {total * F32} B >= {stream_bytes} B (min(L3/2, 8 L2 x cores)): "
                                f"non-temporal stores, one 64 B line at a time")
        else:
            # Each tile of the inner dim streams through L1: `streams` arrays of `tile` floats, half of L1.
            tile = 1 << max(8, min(14, int(math.log2(max(1, c.l1 // 2 // (F32 * streams))))))
            ws = tile * F32 * streams
            plan.cache_check = f"tile working set {ws} B <= L1 {c.l1} B: {'ok' if ws <= c.l1 else 'NO'}"
            if ws > c.l1:
                raise EqfuseError(f"pointwise tile of {tile} does not fit L1")
        if not stream:
            tile = min(tile, inner)  # a tile never spans two rows of the inner loop
        plan.tiles = {"tile": tile, "stream": int(stream)}
        par = total >= PARALLEL_MIN
        two = has_fast_form(plan.body)
        qout = quantized_out(plan.body) and not plan.out_strides and not stream and not two and plan.live is None
        plan.detail = PointwiseDetail(inner, stream_bytes, par, two, 4 * c.simd_floats if two else tile, qout)
        plan.flops = pointwise_flops(plan.body)
        # the C walks outer rows x tiles of each row; streaming tiles start on the output's 64-byte
        # lines, so a row has up to 15 more elements to cover
        ntiles = total // max(inner, 1) * -(-(inner + 15 * int(stream)) // tile)
        plan.threads = parallel_rule(par, f"{total} elements", PARALLEL_MIN,
                                     f"the {ntiles} tiles ({'guided' if stream else 'static'} schedule)")
        ops = ops_text(plan.body)
        plan.uops = [UOp(0, "Loop", f"t over {ntiles} tiles of {tile} elements (parallel)", ntiles)]
        for nm, i in zip(input_names(plan), plan.body.inputs):
            plan.uops.append(UOp(1, "Load", f"{nm} tile [{tile}] (broadcast {list(plan.body.nodes[i].type.shape)})",
                                 ntiles))
        plan.uops.append(UOp(1, "Exec", f"{ops} on {vectors(tile, c.simd_floats)} vectors", ntiles))
        plan.uops.append(UOp(1, "Store", f"out tile [{tile}]" + (" (non-temporal)" if stream else ""), ntiles))

    def after_views(self, plan: KernelPlan, caches) -> None:
        # reading or writing views, it walks other strides; bounded at the live keys, its last
        # axis is its inner loop, and a run-time dim a loop of its own (inner_groups): its loops again
        if plan.in_strides or plan.out_strides or (plan.live is not None and plan.live.what in ("rows", "dim")):
            plan.tiles, plan.uops = {}, []
            self.plan(plan, caches)

    def emit(self, plan: KernelPlan) -> str:
        if plan.live is not None and plan.live.what == "repeat":  # a KV cache's repeat for the query heads (eqfuse.backend.live)
            return emit_repeat(plan)
        body, root = plan.body, plan.body.outputs[0]
        shape = plan.out_shape
        groups = inner_groups(plan)
        inner_dims = groups[-1] if groups else []
        outer_dims = [d for g in groups[:-1] for d in g]
        inner = size([shape[d] for d in inner_dims])
        outer = size(shape) // inner
        stream, tile = plan.tiles["stream"], plan.tiles["tile"]
        assert inner == plan.detail.inner, "plan and emit see the same inner loop"
        params, ptrs = kernel_params(plan)
        space = Space(shape, [("o", outer_dims, True), ("j", inner_dims, False)], I1, count())
        ex = Exprs(body, space, ptrs, {}, I2, strides=plan.base_strides())
        qx = qscale = qzp = res = "0"
        if plan.detail.qout:  # (QOUT: the quantize_linear's x per element; its scale and zero point once)
            last = body.nodes[root]
            qx = ex.value(last.args[0])
            qscale, qzp = (Exprs(body, space, ptrs, {}, I2, strides=plan.base_strides()).expression(a) for a in last.args[1:])
        else:
            res = ex.value(root)
        # the fast pass (TWO_PASS), empty under `#if 0` without it
        fx = Exprs(body, space, ptrs, {}, I2, strides=plan.base_strides(), fast=True)
        fres = fx.value(root) if plan.detail.two_pass else "0"
        dst_base, dst_j = "o * inner", "j"  # a contiguous output: rows of `inner` elements
        if plan.out_strides:  # the inner loop walks the output with one stride (inner_groups)
            ost = plan.out_strides
            dst_base = offset("o", [shape[d] for d in outer_dims], [ost[d] for d in outer_dims])
            dst_base = "o" if dst_base == "0" else dst_base  # one outer row: o is 0 (and used)
            si = coalesce([shape[d] for d in inner_dims], [ost[d] for d in inner_dims])[1]
            dst_j = f"j * {si[0]}" if si and si[0] != 1 else "j"
        # Streaming tiles start on the output's 64-byte lines: up to 15 more elements per row to cover.
        ntiles = -(-(inner + 15 * stream) // tile)
        if plan.live is not None and plan.live.what == "rows":  # (eqfuse.backend.live) the row's live elements
            params += plan.live.params
            dst_base = f"o * {inner}" if not plan.out_strides else dst_base  # (the row's length, not its bound)
            inner = plan.live.end
        elif plan.live is not None and plan.live.what == "dim":  # (eqfuse.backend.runtime_dim) the dim's
            params += ", long live"  # first `live` positions: the inner loop, the first outer rows,
            ax = plan.live.axis  # or outer rows skipped
            if inner_dims == [ax]:
                dst_base = f"o * {inner}" if not plan.out_strides else dst_base
                inner = "live"
                ntiles = f"((live + {15 * stream + tile - 1}) / {tile})"
            elif all(shape[d] == 1 for d in range(ax)):
                outer = f"(live * {outer // plan.live.rows})"
            else:
                after = size([shape[d] for d in outer_dims[outer_dims.index(ax) + 1:]])
                space.decls.append(f"{I2}if (o / {after} % {shape[ax]} >= live)\n{I2}    continue;")
        return render("pointwise.c", NAME=plan.name, SPACE=list(shape), PARAMS=params, INNER=inner, TILE=tile,
                      OTYPE=ctypes_of(plan)[1], DST_BASE=dst_base, DST_J=dst_j,
                      STREAM=stream, NTILES=ntiles, OUTER=outer, **param_job(params),
                      PARALLEL=int(plan.detail.parallel), TWO_PASS=int(plan.detail.two_pass), RUN=plan.detail.run,
                      OFFSETS="\n".join(space.decls), BODY=ex.text(), RESULT=res,
                      QOUT=int(plan.detail.qout), QX=qx, QSCALE=qscale, QZP=qzp,
                      LINE_BODY="\n".join("    " + ln for ln in ex.text().splitlines()),
                      FAST_BODY=fx.text(), FAST_RESULT=fres, GUARD=fx.guard(),
                      FAST_LINE_BODY="\n".join("    " + ln for ln in fx.text().splitlines()))
