"""The reduce kind: one sum/mean/max/min/prod over any axes, with a pointwise prologue over the
input's index space and a pointwise epilogue over the output's (csrc_templates/reduce.c, its
loop nest written here for the axes). Reductions over the trailing axes are row kernels."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count

from eqfuse.backend.cexpr import (
    I1,
    Exprs,
    Space,
    computed_ancestors,
    flit,
    kernel_params,
    render,
)
from eqfuse.backend.indexing import contiguous
from eqfuse.backend.kinds.base import (
    PARALLEL_MIN,
    Facts,
    Kind,
    check_computable,
    check_epilogue,
    check_no_broadcast,
    parallel_rule,
)
from eqfuse.backend.plan import (
    F32,
    K,
    KernelPlan,
    KernelShape,
    Unsupported,
    UOp,
    pointwise_flops,
    size,
)
from eqfuse.ir.graph import Graph
from eqfuse.ir.ops import OPS, reduce_axes

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


def trailing(body: Graph, a: int) -> bool:
    """Whether op a is a row op, or a reduction over the trailing axes of its input."""
    n = body.nodes[a]
    if OPS[n.op].kind != "reduction":
        return True
    rank = body.nodes[n.args[0]].type.rank
    axes = n.attr["axis"]
    axes = tuple(range(rank)) if axes is None else tuple(sorted(x % rank for x in axes))
    return axes == tuple(range(rank - len(axes), rank))


def match_single(body: Graph, facts: Facts, row: bool) -> int | None:
    """The row op or reduction of a row kernel (row=True) or of a reduce kernel (row=False)."""
    a = facts.single("row", "reduction")
    if a is None or trailing(body, a) != row:
        return None
    check_epilogue(body, a, facts.out)
    n = body.nodes[a]
    for x in n.args[1:]:
        if x not in facts.inputs:
            raise Unsupported(f"the parameters of {n.op} must be kernel inputs")
    check_no_broadcast(body, a, facts.out, K.ROW if row else K.REDUCE)
    return a


def check_reduce_epilogue(body: Graph, a: int, out: int) -> None:
    """The epilogue of a reduction runs over the output's index space: it cannot read a value
    computed in the prologue (x / sum(x) is a row kernel's shape, or two kernels)."""
    check_computable(body, out, {a}, computed_ancestors(body, body.nodes[a].args[0]))


@dataclass(frozen=True)
class ReduceDetail:
    op: str
    axes: tuple[int, ...]
    parallel: bool  # the `if` of the parallel region (the kept axes split over threads)


class Reduce(Kind):
    kinds = (K.REDUCE,)
    supported = "reduction (one sum/mean/max over any axes, with a pointwise prologue and epilogue)"

    def match(self, body, facts, machine=None):
        a = match_single(body, facts, row=False)
        if a is None:
            return None
        check_reduce_epilogue(body, a, facts.out)
        return KernelShape(K.REDUCE, a)

    def plan(self, plan: KernelPlan, c) -> None:
        body, a = plan.body, plan.shape.anchor
        an = body.nodes[a]
        xshape = tuple(body.nodes[an.args[0]].type.shape)
        axes = reduce_axes(an.attr, len(xshape))
        kept = [d for d in range(len(xshape)) if xshape[d] != 1 and d not in axes]
        par = bool(kept) and size(xshape) >= PARALLEL_MIN
        plan.detail = ReduceDetail(an.op, axes, par)
        plan.threads = parallel_rule(par, f"{size(xshape)} input elements", PARALLEL_MIN,
                                     f"the kept axis {kept[0]}'s {xshape[kept[0]]} indices" if kept else "")
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
        an = body.nodes[a]
        xshape = tuple(body.nodes[an.args[0]].type.shape)
        axes = set(plan.detail.axes)
        params, ptrs = kernel_params(plan)
        dims = [d for d in range(len(xshape)) if xshape[d] != 1]
        kept = [d for d in dims if d not in axes]
        # the output's strides along the input's dims (0 along reduced ones)
        ocs = contiguous(tuple(1 if d in axes else n for d, n in enumerate(xshape)))
        ost = [0 if d in axes else ocs[d] for d in range(len(xshape))]
        depth = 2 + len(dims)
        ind = " " * (4 * depth)
        ids = count()
        space = Space(xshape, [(f"i{d}", [d], False) for d in dims], ind + "    ", ids)
        pro = Exprs(body, space, ptrs, {}, ind + "    ", strides=plan.base_strides())
        x = pro.value(an.args[0])
        init, _, combine, combine_nan = REDUCE[an.op]
        outoff = " + ".join(f"i{d}" if ost[d] == 1 else f"i{d} * {ost[d]}" for d in kept) or "0"
        lines = []
        for k, d in enumerate(dims):
            pad = " " * (4 * (2 + k))
            last = k == len(dims) - 1
            if kept and d == kept[0]:
                lines.append(f"{pad}#pragma omp for schedule(static) nowait")
            elif last and d not in axes:
                lines.append(f"{pad}#pragma omp simd")
            if last and d in axes:
                lines.append(f"{pad}float a = out[{outoff}];")
                lines.append(f"{pad}int nan = a != a;")
                lines.append(f"{pad}#pragma omp simd reduction({REDUCE[an.op][1]}:a) reduction(|:nan)")
            lines.append(f"{pad}for (long i{d} = 0; i{d} < {xshape[d]}; i{d}++) {{")
        inner = " " * (4 * depth)
        body_lines = [pro.text()] if pro.stmts else []
        body_lines.append(f"{inner}const float x = {x};")
        if dims and dims[-1] in axes:
            body_lines.append(f"{inner}a = {combine};")
            if an.op in NAN_TRACK:
                body_lines.append(f"{inner}{NAN_TRACK[an.op]}")
        else:
            body_lines.append(f"{inner}{{ const float a = out[{outoff}]; out[{outoff}] = {combine_nan}; }}")
        lines += body_lines
        for k in reversed(range(len(dims))):
            pad = " " * (4 * (2 + k))
            lines.append(f"{pad}}}")
            if k == len(dims) - 1 and dims[-1] in axes:
                lines.append(f"{pad}out[{outoff}] = nan ? NAN : a;")
        if not dims:  # a reduction of a single element
            lines = [f"        {{ const float x = {x}; const float a = out[0]; out[0] = {combine_nan}; }}"]
            lines[0:0] = [pro.text()] if pro.stmts else []
        espace = Space(plan.out_shape, [("o", list(range(len(plan.out_shape))), True)], I1, ids)
        epi = Exprs(body, espace, ptrs, {a: "v"}, I1, forbid=computed_ancestors(body, an.args[0]),
                    strides=plan.base_strides())
        e = epi.value(body.outputs[0])
        count_red = size([xshape[d] for d in axes])
        return render("reduce.c", NAME=plan.name, OP=an.op, AXES=sorted(axes), SPACE=list(xshape),
                      OUT_SPACE=list(plan.out_shape), PARAMS=params, OUT_SIZE=size(plan.out_shape), INIT=init,
                      PARALLEL=int(plan.detail.parallel), NEST="\n".join(lines),
                      SCALE=flit(1.0 / count_red) if an.op == "mean" else "1.0f",
                      EPI_OFFSETS="\n".join(espace.decls), EPI_BODY=epi.text(), EPI=e)
