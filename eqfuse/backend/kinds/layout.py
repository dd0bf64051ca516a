"""The layout kind: one transpose, reshape, slice or concat of kernel inputs. A reshape (squeeze,
unsqueeze, flatten) is a view of its input, planned as kind VIEW; eqfuse.backend.views makes
other layout ops views where their readers can read them in place, and makes a copy of a view
that cannot be one. A copy walks the output in blocks (csrc_templates/layout.c, copy_block.c)."""

from __future__ import annotations

from dataclasses import dataclass

from eqfuse.backend.cexpr import kernel_params, render
from eqfuse.backend.indexing import (
    coalesce,
    contiguous,
    joint_groups,
    offset,
    reshape_strides,
)
from eqfuse.backend.kinds.base import PARALLEL_MIN, Kind, parallel_rule
from eqfuse.backend.plan import KernelPlan, UOp, size
from eqfuse.ir.kernels import K

RESHAPES = ("reshape", "squeeze", "unsqueeze", "flatten")  # views of a contiguous buffer


@dataclass(frozen=True)
class LayoutDetail:
    op: str
    parallel: tuple[bool, ...]  # the `if` of each copy block's loop (concat: one block per input)

    DERIVED = ("block_parallel",)  # printed by `eqfuse lower`

    @property
    def block_parallel(self) -> str:
        """`parallel` as printed: each copy block's flag, in order, joined by "/" (copy_block.c's
        PARALLEL, block k declared as NAME_copy<k>_PARALLEL)."""
        return "/".join(str(int(p)) for p in self.parallel)


class Layout(Kind):
    kinds = (K.LAYOUT, K.VIEW)
    writes_strided = True  # every copy block walks its destination with strides


    def plan(self, plan: KernelPlan, c) -> None:
        body, a = plan.body, plan.shape.anchor
        an = body.nodes[a]
        total = size(plan.out_shape)
        blocks = [size(body.nodes[x].type.shape) for x in an.args] if an.op == "concat" else [total]
        plan.detail = LayoutDetail(an.op, tuple(n >= PARALLEL_MIN for n in blocks))
        plan.threads = parallel_rule(all(plan.detail.parallel), f"{min(blocks)} elements per copy block",
                                     PARALLEL_MIN, "the rows of each copy block")
        if any(plan.detail.parallel) and not all(plan.detail.parallel):
            plan.threads = (f"the rows of each copy block of >= {PARALLEL_MIN} elements split evenly among the "
                            "threads; the smaller blocks on one thread")
        if an.op in RESHAPES:
            plan.kind = K.VIEW
            plan.bytes = 0
            plan.uops = [UOp(0, "Exec", f"reshape {list(body.nodes[an.args[0]].type.shape)} -> {list(plan.out_shape)}: "
                                        "zero-copy view of a contiguous buffer", 1)]
            plan.cache_check = "no data moved"
            return
        inner = plan.out_shape[-1] if plan.out_shape else 1
        plan.cache_check = "streaming copy"
        u = plan.uops
        u.append(UOp(0, "Loop", f"{total // max(inner, 1)} output rows of {inner} (parallel)", total // max(inner, 1)))
        u.append(UOp(1, "Load", f"{an.op} source row [{inner}] (strided gather)", total // max(inner, 1)))
        u.append(UOp(1, "Store", f"out row [{inner}]", total // max(inner, 1)))

    def writes_through(self, plan: KernelPlan, strides) -> bool:
        op = plan.body.nodes[plan.shape.anchor].op
        if op in RESHAPES:  # it walks the source's shape: the output's strides must reshape to it
            src = plan.body.nodes[plan.body.inputs[0]].type.shape
            return reshape_strides(plan.out_shape, strides, src) is not None
        return True

    def emit(self, plan: KernelPlan) -> str:
        body, a = plan.body, plan.shape.anchor
        an = body.nodes[a]
        params, ptrs = kernel_params(plan)
        out = tuple(plan.out_shape)
        blocks = []
        parallel = iter(enumerate(plan.detail.parallel))

        def block(src: str, src_strides_in_out_space, dst_base: str, dst_space, dst_strides, base_src="0", bf16=False):
            # walk `dst_space` (a shape); inner loop over its last non-1 group
            sets = [src_strides_in_out_space, dst_strides]
            groups = joint_groups(dst_space, sets) or [[]]
            dim = None  # a dim taken at run time (eqfuse.backend.runtime_dim): its axis, a loop of its own
            bound = "live"  # (its run-time value: a chunk step's appended rows are `live_new`)
            if plan.live is not None and plan.live.what == "dim":
                dim = next(a for a, n in enumerate(dst_space) if n == plan.live.rows)
            elif plan.live is not None and plan.live.new_length >= 0:  # (an append's new rows, their axis)
                dim, bound = plan.live.axis, "live_new"
            if dim is not None:
                groups = [part for g in groups for part in
                          ([g[:g.index(dim)], [dim], g[g.index(dim) + 1:]] if dim in g else [g]) if part]
            inner_dims, outer_dims = groups[-1], [d for g in groups[:-1] for d in g]
            inner = size([dst_space[d] for d in inner_dims])
            outer = size(dst_space) // inner
            so = offset("o", [dst_space[d] for d in outer_dims], [src_strides_in_out_space[d] for d in outer_dims])
            do = offset("o", [dst_space[d] for d in outer_dims], [dst_strides[d] for d in outer_dims])
            ssi = coalesce([dst_space[d] for d in inner_dims], [src_strides_in_out_space[d] for d in inner_dims])[1]
            dsi = coalesce([dst_space[d] for d in inner_dims], [dst_strides[d] for d in inner_dims])[1]
            decl = (f"        const long src_off = {base_src} + {so};\n"
                    f"        const long dst_off = {dst_base} + {do};\n        (void)o;")
            if dim is not None and inner_dims == [dim]:  # the inner loop is the dim: its first live positions
                inner = bound
            elif dim is not None:  # an outer row past the dim's first live positions is skipped
                after = size([dst_space[d] for d in outer_dims[outer_dims.index(dim) + 1:]])
                decl += f"\n        if (o / {after} % {dst_space[dim]} >= {bound})\n            continue;"
            k, par = next(parallel)
            blocks.append(render("copy_block.c", NAME=f"{plan.name}_copy{k}", PARALLEL=int(par), OUTER=outer,
                                 OFFSETS=decl, INNER=inner, DST="((uint16_t*)out)" if bf16 else "out",
                                 CVT="eqf_bf16" if bf16 else "", DST_STRIDE=dsi[0] if dsi else 0,
                                 SRC=src, SRC_STRIDE=ssi[0] if ssi else 0))

        def strides(x):  # the input's strides: contiguous, or those of the view it is read through
            k = body.inputs.index(x)
            return plan.in_strides.get(k) or contiguous(body.nodes[x].type.shape)

        ocs = plan.out_strides or contiguous(out)  # where the result goes (eqfuse.backend.views)
        if an.op == "transpose":
            x = an.args[0]
            xs = body.nodes[x].type.shape
            perm = an.attr["perm"] or tuple(reversed(range(len(xs))))
            cs = strides(x)
            block(ptrs[x], [cs[p] for p in perm], "0", out, ocs)
        elif an.op in RESHAPES:  # copies only a view it cannot be a view of: walk the source in order
            x = an.args[0]
            xs = body.nodes[x].type.shape
            dst = contiguous(xs) if plan.out_strides is None else _reshape_dst(xs, out, ocs)
            block(ptrs[x], list(strides(x)), "0", xs, dst)
        elif an.op == "slice":
            x = an.args[0]
            xs = body.nodes[x].type.shape
            ax = an.attr["axis"] % len(xs)
            start = range(xs[ax])[an.attr["start"]:an.attr["stop"]].start
            cs = list(strides(x))
            src = list(cs)
            src[ax] *= an.attr["step"]
            block(ptrs[x], src, "0", out, ocs, base_src=str(start * cs[ax]))
        else:  # concat: each operand read through its strides (a view of another buffer, or contiguous)
            assert an.op == "concat", an.op
            ax = an.attr["axis"] % len(out)
            pos = 0
            # an append (eqfuse.backend.live): the operands after the past go at the live length
            append = plan.live is not None and plan.live.what == "append"
            at = (lambda pos: f"(live + {pos - (plan.live.rows - plan.live.new)}) * {ocs[ax]}") if append \
                else (lambda pos: str(pos * ocs[ax]))
            for k, x in enumerate(an.args):
                xs = body.nodes[x].type.shape
                if k in plan.unread:  # written in place by its own kernel (eqfuse.backend.stores)
                    next(parallel)
                else:
                    # (into a bf16 KV cache: the new rows rounded to nearest even, eqfuse.backend.live)
                    block(ptrs[x], list(strides(x)), at(pos), xs, list(ocs), bf16=bool(plan.live and plan.live.bf16))
                pos += xs[ax]
        if plan.live:
            params += plan.live.params
        return render("layout.c", NAME=plan.name, OP=an.op, SPACE=list(out), PARAMS=params, BLOCKS="\n".join(blocks))


def _reshape_dst(xs, out, ocs) -> list[int]:
    """The strides over the source's shape `xs` at which a reshape copy writes an output of shape
    `out` laid out at strides `ocs` (eqfuse.backend.views gives a reshape copy only strides its
    source's shape has, writes_through)."""
    st = reshape_strides(out, ocs, xs)
    assert st is not None, "views gave a reshape copy strides its source shape does not have"
    return list(st)
