"""The reduce kind: one sum/mean/max/min/prod over any axes, with a pointwise prologue over the
input's index space and a pointwise epilogue over the output's (csrc_templates/reduce.c: a nest
of five loops, each over a run of kept or reduced axes, ReduceDetail.runs). Reductions over the
trailing axes are row kernels."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count

from eqfuse.backend.cexpr import I1, Exprs, Space, kernel_params, render
from eqfuse.backend.indexing import contiguous, offset
from eqfuse.backend.kinds.base import PARALLEL_MIN, Kind, parallel_rule
from eqfuse.backend.plan import KernelPlan, UOp, pointwise_flops, size
from eqfuse.ir.kernels import F32, K, computed_ancestors
from eqfuse.ir.ops import flit, reduce_axes

# init, omp reduction identifier, combine(a, x) inside an `omp simd reduction`, and combine(a, x)
# elsewhere. numpy's max propagates NaN; `x > a ? x : a` does not, but it is the form gcc
# vectorizes as a max reduction, so a simd reduction of max tracks NaN in a flag of its own
# (NAN_TRACK) and the result becomes NaN at the end; elsewhere eqf_max propagates NaN itself.
REDUCE = {
    "sum": ("0.0f", "+", "a + x", "a + x"),
    "mean": ("0.0f", "+", "a + x", "a + x"),
    "max": ("-INFINITY", "max", "(x > a ? x : a)", "eqf_max(x, a)"),
    "min": ("INFINITY", "min", "(x < a ? x : a)", "eqf_min(x, a)"),
    "prod": ("1.0f", "*", "a * x", "a * x"),
}
NAN_TRACK = {"max": "nan |= x != x;", "min": "nan |= x != x;"}



LOOPS = 5  # the loops of csrc_templates/reduce.c


@dataclass(frozen=True)
class ReduceDetail:
    op: str
    axes: tuple[int, ...]
    parallel: bool  # the `if` of the parallel region (the kept axes split over threads)
    # the template's loops g0..g4, outermost first: (input axes, reduced) for each run of adjacent
    # axes of size > 1 that are all kept (False) or all reduced (True); loops of 1 ((), False) in
    # front. With more runs than loops, g0 walks the outer ones together (reduced None: mixed).
    runs: tuple[tuple[tuple[int, ...], bool | None], ...] = ()

    # the decisions derived from the fields above, printed by `eqfuse lower` with them
    DERIVED = ("thread_loop", "acc")

    @property
    def thread_loop(self) -> int:
        """The template's THREAD_LOOP: the loop g<k> split over threads, the first over kept axes
        only (-1: none; a mixed g0 is walked by every thread)."""
        return next((k for k, (dims, red) in enumerate(self.runs) if dims and red is False), -1)

    @property
    def acc(self) -> bool:
        """The template's ACC: the innermost loop reduces, into a register (else it updates a
        vector of outputs)."""
        return bool(self.runs[-1][1])


def loop_runs(xshape, axes) -> tuple[tuple[tuple[int, ...], bool | None], ...]:
    """The loops of a reduction over `axes` of `xshape` (ReduceDetail.runs)."""
    runs: list[tuple[list[int], bool | None]] = []
    for d, n in enumerate(xshape):
        if n == 1:
            continue
        if runs and runs[-1][1] == (d in axes):
            runs[-1][0].append(d)
        else:
            runs.append(([d], d in axes))
    if len(runs) > LOOPS:  # (rank 6 and more): g0 walks the outer runs as one index
        outer = len(runs) - LOOPS + 1
        runs = [([d for ds, _ in runs[:outer] for d in ds], None)] + runs[outer:]
    return tuple([((), False)] * (LOOPS - len(runs)) + [(tuple(ds), red) for ds, red in runs])


class Reduce(Kind):
    kinds = (K.REDUCE,)

    def plan(self, plan: KernelPlan, c) -> None:
        body, a = plan.body, plan.shape.anchor
        an = body.nodes[a]
        xshape = tuple(body.nodes[an.args[0]].type.shape)
        axes = reduce_axes(an.attr, len(xshape))
        runs = loop_runs(xshape, axes)
        # threads split the first loop over kept axes only (a mixed g0 is walked by every thread)
        split = next((dims for dims, red in runs if dims and red is False), None)
        par = split is not None and size(xshape) >= PARALLEL_MIN
        plan.detail = ReduceDetail(an.op, axes, par, runs)
        plan.threads = parallel_rule(par, f"{size(xshape)} input elements", PARALLEL_MIN,
                                     f"the kept axes {list(split)}' {size([xshape[d] for d in split])} indices"
                                     if split else "")
        plan.flops = size(xshape) + pointwise_flops(body, skip={a})
        out_bytes = size(plan.out_shape) * F32
        plan.cache_check = f"accumulators {out_bytes} B (the output) vs L2 {c.l2} B: {'ok' if out_bytes <= c.l2 else 'streams'}"
        u = plan.uops
        u.append(UOp(0, "Exec", f"init {size(plan.out_shape)} accumulators", 1))
        u.append(UOp(0, "Loop", f"walk {list(xshape)} in memory order, kept axes split over threads", 1))
        u.append(UOp(1, "Load", f"input element vectors [{xshape[-1] if xshape else 1}]", size(xshape[:-1])))
        u.append(UOp(1, "Exec", f"prologue + {an.op} into accumulators over axes {list(axes)}", size(xshape[:-1])))
        u.append(UOp(0, "Store", f"out [{size(plan.out_shape)}] after the epilogue", 1))

    def emit(self, plan: KernelPlan) -> str:
        body, a = plan.body, plan.shape.anchor
        an, d = body.nodes[a], plan.detail
        xshape = tuple(body.nodes[an.args[0]].type.shape)
        params, ptrs = kernel_params(plan)
        # the output's strides along the input's axes (0 along reduced ones)
        ocs = contiguous(tuple(1 if k in d.axes else n for k, n in enumerate(xshape)))
        ocs = [0 if k in d.axes else s for k, s in enumerate(ocs)]
        ids = count()
        space = Space(xshape, [(f"g{k}", list(dims), False) for k, (dims, _) in enumerate(d.runs)], " " * 16, ids)
        pro = Exprs(body, space, ptrs, {}, " " * 16, strides=plan.base_strides())
        x = pro.value(an.args[0])
        outoff = " + ".join(o for k, (dims, red) in enumerate(d.runs) if dims and red is not True
                            for o in [offset(f"g{k}", [xshape[i] for i in dims], [ocs[i] for i in dims])]
                            if o != "0") or "0"
        init, omp_op, combine, combine_nan = REDUCE[an.op]
        espace = Space(plan.out_shape, [("o", list(range(len(plan.out_shape))), True)], I1, ids)
        epi = Exprs(body, espace, ptrs, {a: "v"}, I1, forbid=computed_ancestors(body, an.args[0]),
                    strides=plan.base_strides())
        e = epi.value(body.outputs[0])
        count_red = size([xshape[k] for k in d.axes])
        runs = ", ".join(f"g{k}: {({True: 'reduced', False: 'kept'}).get(red, 'kept and reduced')} axes {list(dims)}"
                         for k, (dims, red) in enumerate(d.runs) if dims) or "a single element"
        return render("reduce.c", NAME=plan.name, OP=an.op, AXES=sorted(d.axes), SPACE=list(xshape),
                      OUT_SPACE=list(plan.out_shape), PARAMS=params, OUT_SIZE=size(plan.out_shape), INIT=init,
                      PARALLEL=int(d.parallel), RUNS=runs, ACC=int(d.acc), THREAD_LOOP=d.thread_loop,
                      **{f"N{k}": size([xshape[i] for i in dims]) for k, (dims, _) in enumerate(d.runs)},
                      OUT_OFFSET=outoff, OMP_OP=omp_op, PRO_BODY=pro.text(), X=x, COMBINE=combine,
                      NAN_TRACK=NAN_TRACK.get(an.op, ""), COMBINE_NAN=combine_nan,
                      SCALE=flit(1.0 / count_red) if an.op == "mean" else "1.0f",
                      EPI_OFFSETS="\n".join(espace.decls), EPI_BODY=epi.text(), EPI=e)
