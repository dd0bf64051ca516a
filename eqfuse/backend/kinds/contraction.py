"""The GEMM kinds: a matmul or conv2d with a fused pointwise epilogue (contraction, conv2d), and
a matmul whose finished rows go through a softmax, layernorm or rmsnorm (contraction_row).

The planning is eqfuse.backend.lower_gemm (`gemm_tiles` chooses the blocking), the C
eqfuse.backend.emit_gemm (epilogues, wrappers) around eqfuse.backend.gemm (csrc_templates/gemm.c).
"""

from __future__ import annotations

from dataclasses import replace

from eqfuse.backend import conv_direct, emit_gemm
from eqfuse.backend.kinds.base import (
    Facts,
    Kind,
    check_epilogue,
    check_no_broadcast,
    swaps_last_two,
)
from eqfuse.backend.lower_gemm import (
    Prepack,
    c_layout,
    conv_c_layout,
    plan_contraction,
    plan_skinny,
    row_epilogue_fits,
    skinny,
)
from eqfuse.backend.machine import Machine, machine
from eqfuse.backend.plan import (
    GEMM_KINDS,
    K,
    KernelPlan,
    KernelShape,
    RowEpilogue,
    Split,
    Unsupported,
    size,
)
from eqfuse.ir.graph import Graph

ROW_EPILOGUE_OPS = ("softmax", "layernorm", "rmsnorm")


def _match_gemm(body: Graph, facts: Facts) -> KernelShape | None:
    """One matmul or conv2d over kernel inputs, or one matmul whose operands are inputs read
    through a swap of their last two axes (x @ transpose(w), transpose(x) @ w, ...: the GEMM
    packs them so), its result flowing through pointwise ops."""
    heavy, inputs = facts.heavy, facts.inputs
    a = facts.single("contraction")
    if a is not None:
        n = body.nodes[a]
        check_epilogue(body, a, facts.out)
        if not all(x in inputs for x in n.args):
            raise Unsupported(f"the operands of {n.op} must be kernel inputs (tensors in memory), "
                              "not values computed inside the kernel")
        return KernelShape(K.CONV2D if n.op == "conv2d" else K.CONTRACTION, a)
    mms = [i for i in heavy if body.nodes[i].op == "matmul"]
    if len(mms) == 1 and len(heavy) in (2, 3):
        m = mms[0]
        mn, users = body.nodes[m], body.users()
        swaps = set(heavy) - {m}

        def operand_ok(x: int) -> bool:
            if x in inputs:
                return True
            xn = body.nodes[x]
            return x in swaps and swaps_last_two(xn) and xn.args[0] in inputs and users[x] == 1

        if swaps <= set(mn.args) and all(operand_ok(x) for x in mn.args):
            check_epilogue(body, m, facts.out)
            return KernelShape(K.CONTRACTION, m)
    return None


def _match_contraction_row(body: Graph, facts: Facts) -> KernelShape | None:
    """rowop(pointwise(A @ B), params...) followed by pointwise ops: a GEMM whose finished rows
    of C go through a softmax, layernorm or rmsnorm over the last axis (the GEMM's N) before the
    store. A and B are kernel inputs (B possibly under a swap of its last two axes), the row op's
    parameters are kernel inputs, and the ops after the row op read only it, each other, kernel
    inputs and constants (the pre-row-op values are gone by then: C holds the row op's input)."""
    nodes, heavy, inputs = body.nodes, facts.heavy, facts.inputs
    rows = [i for i in heavy if nodes[i].op in ROW_EPILOGUE_OPS]
    mms = [i for i in heavy if nodes[i].op == "matmul"]
    if len(rows) != 1 or len(mms) != 1:
        return None
    r, m = rows[0], mms[0]
    rest = set(heavy) - {r, m}
    rn, mn = nodes[r], nodes[m]
    a, b = mn.args
    if rest:  # only the transposed B operand: x @ transpose(w)
        t = next(iter(rest))
        if len(rest) != 1 or b != t or not swaps_last_two(nodes[t]) or nodes[t].args[0] not in inputs \
                or body.users()[t] != 1:
            return None
    elif b not in inputs:
        return None
    if a not in inputs or mn.type.rank < 2:
        return None
    rank = rn.type.rank
    if rn.op in ("softmax", "layernorm") and rn.attr["axis"] % rank != rank - 1:
        return None
    if any(x not in inputs for x in rn.args[1:]):
        return None
    pro = body.ancestors(rn.args[0])
    if m not in pro:
        return None
    out = facts.out
    after = {i for i in body.ancestors(out) if r in body.ancestors(i)}
    if r not in after:
        return None
    for i in after - {r}:
        for x in nodes[i].args:
            if x not in after and nodes[x].op not in ("input", "const"):
                return None
    return KernelShape(K.CONTRACTION_ROW, m, RowEpilogue(r))


def _check_row_epilogue(body: Graph, shape: KernelShape, out: int, machine: Machine | None) -> None:
    """What this backend's row epilogue handles: rows of C that are the output's rows, vector
    parameters of the row's length and (on `machine`) a row that stays in L1 with them."""
    rn = body.nodes[shape.parts.row]
    check_no_broadcast(body, shape.parts.row, out, K.CONTRACTION_ROW)
    N = rn.type.shape[-1]
    if not isinstance(N, int):
        return  # symbolic (extraction before dims are bound): decided once they are
    for p in rn.args[1:]:
        ps = tuple(body.nodes[p].type.shape)
        if not ps or ps[-1] != N or size(ps) != N:
            raise Split(f"the parameters of {rn.op} must be vectors of the row's length {N}")
    if machine is not None and not row_epilogue_fits(N, len(rn.args) - 1, machine.l1):
        raise Split("a row of the GEMM's row epilogue does not fit the L1 cache")


class Contraction(Kind):
    kinds = (K.CONTRACTION, K.CONV2D, K.CONTRACTION_ROW)
    writes_strided = True  # a matmul's GEMM only (writes_through)
    supported = ("contraction with epilogue (one matmul or conv2d over kernel inputs, a matmul's operands "
                 "possibly read through a swap of their last two axes, its result flowing through pointwise "
                 "ops); contraction with row epilogue (one matmul whose result flows through pointwise ops "
                 "into a softmax, layernorm or rmsnorm over its last axis, then pointwise ops)")

    def match(self, body, facts, machine=None):
        dtype = body.nodes[facts.out].type.dtype
        if dtype != "f32" and any(facts.kinds[i] == "contraction" for i in facts.heavy):
            # the GEMM and conv templates store floats: a mask computed from a product (`x @ w > 0`,
            # as a relu's gradient reads) is a pointwise kernel of its own
            raise Unsupported(f"a matmul or conv2d kernel writes f32, not {dtype}")
        shape = _match_gemm(body, facts)
        if shape is not None:
            check_no_broadcast(body, shape.anchor, facts.out, shape.kind)
            return shape
        shape = _match_contraction_row(body, facts)
        if shape is not None:
            check_no_broadcast(body, shape.anchor, facts.out, K.CONTRACTION_ROW)
            _check_row_epilogue(body, shape, facts.out, machine)
        return shape

    def plan(self, plan: KernelPlan, c) -> None:
        m = Machine(c.l1, c.l2, c.l3, c.simd, c.cores, c.prefetch)
        if plan.kind == K.CONV2D and conv_direct.plan_conv_direct(plan, m):
            return  # a direct conv (conv_direct.use_direct), else im2col + GEMM
        plan_contraction(plan, m)

    def writes_through(self, plan: KernelPlan, strides) -> bool:
        """A matmul's GEMM stores C at a row stride and a batch stride (lower_gemm.c_layout), a
        conv2d's at a row, column and image stride (lower_gemm.conv_c_layout); not a row
        epilogue (the row templates walk rows of N)."""
        if isinstance(plan.detail, conv_direct.ConvDirectDetail):
            return False  # (writes NCHW contiguous)
        if plan.kind == K.CONV2D:
            return conv_c_layout(plan, strides) is not None
        return plan.kind == K.CONTRACTION and c_layout(plan, strides) is not None

    def after_views(self, plan: KernelPlan, caches) -> None:
        if plan.in_strides and plan.kind != K.CONV2D:  # A or B read through a view: planned again
            plan.tiles, plan.detail, plan.uops = {}, None, []
            self.plan(plan, caches)

    def emit(self, plan: KernelPlan) -> str:
        if isinstance(plan.detail, conv_direct.ConvDirectDetail):
            return conv_direct.emit_conv_direct(plan)
        if plan.kind == K.CONV2D:
            return emit_gemm.emit_conv2d(plan)
        return emit_gemm.emit_contraction(plan)


def mark_bound_b(plan: KernelPlan, bound: set[int]) -> None:
    """detail.prepack for a matmul GEMM whose B (or the matrix its transpose reads) is one of
    the body inputs `bound` by params=, read by nothing else in the kernel, and one matrix for
    every batch (emit then reads B as panels the runtime packs once). A matmul with few rows
    then takes the memory-bound skinny path (lower_gemm.skinny, planned by plan_skinny)."""
    d = plan.detail
    if isinstance(d, conv_direct.ConvDirectDetail):
        return conv_direct.mark_bound(plan, bound)
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
    plan.uops = [replace(u, what="B panels packed once when bound (params=), read in place")
                 if u.op == "Load" and ("pack B panel" in u.what or u.what.startswith("B read in place")) else u
                 for u in plan.uops]  # the tile schedule says so
    d = plan.detail
    if plan.kind != K.CONV2D and d.gemm.mode == "fold" and skinny(d.gemm.M, d.N, d.K, machine()):
        plan_skinny(plan, machine())
