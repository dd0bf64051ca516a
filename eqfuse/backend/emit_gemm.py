"""Stage `emit` for the GEMM kinds: matmul and conv2d with fused epilogues (and row epilogues).

The GEMM itself is csrc_templates/gemm.c (eqfuse.backend.gemm fills it), with the tiles and decisions
of the plan (eqfuse.backend.lower_gemm); this module writes the epilogue expressions, the row epilogue
function and the wrappers (matmul.c, conv2d.c) that call the GEMM.
"""

from __future__ import annotations

from itertools import count

from eqfuse.backend.cexpr import I1, I2, Exprs, Space, flit, render
from eqfuse.backend.cexpr import kernel_params as _params
from eqfuse.backend.gemm import emit_gemm
from eqfuse.backend.gemm_skinny import emit_gemm_skinny
from eqfuse.backend.indexing import bstrides, offset
from eqfuse.backend.lower_gemm import c_layout, conv_c_layout, skinny_pack_parts
from eqfuse.backend.plan import KernelPlan, size
from eqfuse.ir.graph import Graph
from eqfuse.ir.kernels import computed_ancestors as _ancestors
from eqfuse.ir.shapes import C_TYPE


def _ct(body: Graph, i: int) -> str:
    """The C element type of body value i (an epilogue may read masks and integers)."""
    return C_TYPE[body.nodes[i].type.dtype]


def _eptrs(body: Graph) -> dict[int, str]:
    return {i: f"eqf_e{k}" for k, i in enumerate(body.inputs)}  # names unlikely to meet the GEMM's own


def _epilogue(plan: KernelPlan, groups, preset: dict[int, str], root: int | None = None):
    """The GEMM epilogue expression (the value of `root`, by default the body's output) and the
    tensors it reads (extra parameters e<k>)."""
    body = plan.body
    eptrs = _eptrs(body)
    space = Space(plan.out_shape, groups, "", count())
    ex = Exprs(body, space, eptrs, preset, "", prefix="eqf_v", strides=plan.base_strides())
    expr = ex.expression(body.outputs[0] if root is None else root)
    return expr, [(i, eptrs[i]) for i in body.inputs if f"{eptrs[i]}[" in expr]


def _row_epilogue(plan: KernelPlan, groups, fname: str, pre_extras):
    """(C of `void fname(long b, long r0, long r1, float* out, extras...)`, the extras (input,
    name) that it and the GEMM epilogue read, the call the GEMM makes on the rows [eqf_r0,
    eqf_r1) of C it has just finished). The function is a row template (row_layernorm.c, row_rmsnorm.c,
    row_softmax.c) whose input row is the row of C itself (the GEMM epilogue stored the row op's
    input there); `groups` are the GEMM epilogue's index groups, "i" (the GEMM's row) becoming
    the template's row r."""
    body = plan.body
    row = plan.shape.parts.row
    rn = body.nodes[row]
    out = tuple(plan.out_shape)
    N = out[-1]
    eptrs = _eptrs(body)
    rgroups = [("r" if v == "i" else v, dims, v != "j") for v, dims, _ in groups]
    space = Space(out, rgroups, I1, count())
    epi = Exprs(body, space, eptrs, {row: "v"}, I2, forbid=_ancestors(body, rn.args[0]), prefix="eqf_v",
                strides=plan.base_strides())
    e = epi.value(body.outputs[0])
    text = "\n".join(space.decls) + epi.text() + e
    used = {i for i, _ in pre_extras} | {i for i in body.inputs if f"{eptrs[i]}[" in text} | set(rn.args[1:])
    extras = [(i, eptrs[i]) for i in body.inputs if i in used]
    params = ", ".join(["long b", "long r0", "long r1", "float* restrict out"]
                       + [f"const {_ct(body, i)}* restrict {pn}" for i, pn in extras])
    # called by one GEMM thread on rows it owns: no parallel region of its own
    common = {"NAME": fname, "PARAMS": params, "R0": "r0", "ROWS": "r1", "L": N, "ROW_LOOP_PRAGMA": "",
              "PRO_BODY": "", "X": "y[j]", "OFFSETS": "\n".join(space.decls + [f"{I1}(void)b;"]),
              "EPI_BODY": epi.text(), "EPI": e, "NEXT": "NULL"}  # the row is C's, in cache: no prefetch
    if rn.op == "softmax":
        src = render("row_softmax.c", YBASE=f"r * {N}L", YS=1, ZERO_NAN=int(rn.attr["zero_nan"]), **common)
    else:
        extra = {"GAMMA": eptrs[rn.args[1]], "EPS": flit(rn.attr["eps"]), "YBASE": f"r * {N}L"}
        if rn.op == "layernorm":
            extra["BETA"] = eptrs[rn.args[2]]
        src = render(f"row_{rn.op}.c", **common, **extra)
    call = f"{fname}(b, eqf_r0, eqf_r1, C{''.join(', ' + pn for _, pn in extras)});"
    return src, extras, call


def _gemm_args(plan: KernelPlan, extras) -> dict:
    """emit_gemm's arguments that come from the plan: its tiles and decisions."""
    t, d = plan.tiles, plan.detail
    return {"blocking": (t["mc"], t["nc"], t["kc"], t["mr"], t["nr"]), "split": d.split, "direct_b": d.direct_b,
            "parallel": d.parallel, "extras": [(_ct(plan.body, i), pn) for i, pn in extras]}


def emit_contraction(plan: KernelPlan) -> str:
    body, a = plan.body, plan.shape.anchor
    params, ptrs = _params(plan)
    out = tuple(plan.out_shape)
    nb = len(out) - 2
    d = plan.detail
    M, N, K, bt, at = d.M, d.N, d.K, d.b_transposed, d.a_transposed
    g = d.gemm  # how the matmul maps onto GEMM calls (lower_gemm._matmul_gemm)
    mode, Asrc, Bsrc, ast, bst = g.mode, g.a_src, g.b_src, g.a_strides, g.b_strides
    batch = out[:-2]
    nbatch = size(batch)
    if mode == "fold":  # B shared by every batch: one GEMM with M' = batch * M
        groups = [("i", list(range(nb)) + [nb], False), ("j", [nb + 1], False)]
    elif mode == "batch":
        groups = [("b", list(range(nb)), False), ("i", [nb], False), ("j", [nb + 1], False)]
    else:
        groups = [("i", [nb], False), ("j", [nb + 1], False)]
    row_call = ""
    if plan.kind == "contraction_row":
        expr, extras = _epilogue(plan, groups, {a: "acc"}, root=body.nodes[plan.shape.parts.row].args[0])
        row_src, extras, row_call = _row_epilogue(plan, groups, f"{plan.name}_rowop", extras)
    else:
        expr, extras = _epilogue(plan, groups, {a: "acc"})
    if mode == "loop":  # the wrapper offsets every pointer for batch g; the epilogue sees one matrix
        eparts = []
        for i, pn in extras:
            st = bstrides(body.nodes[i].type.shape, out)
            eparts.append(f"{ptrs[i]} + ({offset('g', list(batch), st[:nb])})")
        aoff = f"{ptrs[Asrc]} + ({offset('g', list(batch), ast)})"
        boff_ = f"{ptrs[Bsrc]} + ({offset('g', list(batch), bst)})"
        coff = f"out + (g * {M * N})"
    else:
        eparts = [ptrs[i] for i, _ in extras]
        aoff, boff_, coff = ptrs[Asrc], ptrs[Bsrc], "out"
    gname = f"{plan.name}_gemm"
    # A B bound by params= (lower marks it only when it is one matrix for every batch, the
    # "fold" mode) is packed once: the kernel's B argument is then the panels of {gname}_prepack,
    # which the runtime makes on the first call (plan.detail.prepack tells it how).
    prepacked = d.prepack is not None
    assert not prepacked or (mode == "fold" and d.prepack.fn == f"{gname}_prepack")
    sa, sb, sc = g.strides
    ldc = N
    if plan.out_strides is not None:  # C written in place into a layout's storage (eqfuse.backend.stores)
        ldc, sc = c_layout(plan, plan.out_strides)
    if d.path == "skinny":  # few rows over a bound B: the memory-bound kernel (lower_gemm.skinny)
        assert prepacked and g.batch == 1 and sc == 0
        t = plan.tiles
        src, _ = emit_gemm_skinny(gname, M=g.M, N=N, K=K, lda=g.lda, ldb=g.ldb, ldc=ldc, mr=t["mr"], nr=t["nr"],
                                  pf=t["pf"], b_transposed=bt, a_transposed=at, epilogue=expr,
                                  extras=[(_ct(plan.body, i), pn) for i, pn in extras], row_epilogue=row_call,
                                  parallel=d.parallel, pack_parts=skinny_pack_parts(g.M, K, d.parallel))
    else:
        src, _ = emit_gemm(gname, M=g.M, N=N, K=K, batch=g.batch, a_batch_stride=sa, b_batch_stride=sb,
                           c_batch_stride=sc, lda=g.lda, ldb=g.ldb, ldc=ldc, b_transposed=bt,
                           a_transposed=at, epilogue=expr, prepacked_b=prepacked, row_epilogue=row_call,
                           **_gemm_args(plan, extras))
    shapes = f"{mode} batch={nbatch} M={M} N={N} K={K}" + (" (A transposed)" if at else "") + \
        (" (B transposed)" if bt else "")
    if row_call:
        shapes += f", then {d.row_op} over each finished row of C"
    wrapper = render("matmul.c", NAME=plan.name, SHAPES=shapes, GEMM=gname, PARAMS=params, OUTER=g.outer,
                     OFFSETS="        (void)g;", ARGS=", ".join([aoff, boff_, coff] + eparts))
    return (row_src + "\n" if row_call else "") + src + "\n" + wrapper


def emit_conv2d(plan: KernelPlan) -> str:
    body, a = plan.body, plan.shape.anchor
    cv = body.nodes[a]
    params, ptrs = _params(plan)
    (N, C, H, W) = body.nodes[cv.args[0]].type.shape
    (O, _, KH, KW) = body.nodes[cv.args[1]].type.shape
    (_, _, OH, OW) = plan.out_shape
    sh, sw = _pair(cv.attr["stride"])
    ph, pw = _pair(cv.attr["padding"])
    direct = KH == 1 and KW == 1 and sh == 1 and sw == 1 and ph == 0 and pw == 0
    d = plan.detail
    swap = d.pixels_as_rows  # the GEMM's rows are pixels, its columns channels (lower_gemm.pixels_as_rows)
    ch, px = ("j", "i") if swap else ("i", "j")
    groups = [("b", [0], False), (ch, [1], False), (px, [2, 3], False)]
    # the conv's own bias belongs to the anchor value: acc + bias[channel]
    anchor = f"(acc + eqf_e{plan.body.inputs.index(cv.args[2])}[{ch}])" if len(cv.args) == 3 else "acc"
    expr, extras = _epilogue(plan, groups, {a: anchor})
    if len(cv.args) == 3 and cv.args[2] not in dict(extras):
        extras.append((cv.args[2], f"eqf_e{plan.body.inputs.index(cv.args[2])}"))
        extras.sort(key=lambda t: plan.body.inputs.index(t[0]))
    K, P = C * KH * KW, OH * OW
    gname = f"{plan.name}_gemm"
    g = d.gemm
    ldc, csc, sc = P, 1, O * P  # C = out: channels x pixels per image
    if plan.out_strides is not None:  # C written in place into a layout's storage (eqfuse.backend.stores)
        ldc, csc, sc = conv_c_layout(plan, plan.out_strides)
    if swap:  # C^T = col^T . W^T: pixels x channels, stored transposed into out
        assert (g.M, g.batch, g.strides) == (P, N, (K * P, 0, O * P)), "the plan's GEMM is this conv's"
        assert d.prepack is None or d.prepack.fn == f"{gname}_prepack"
        src, _ = emit_gemm(gname, M=P, N=O, K=K, batch=N, a_batch_stride=K * P, b_batch_stride=0, c_batch_stride=sc,
                           lda=P, ldb=K, ldc=csc, csc=ldc, a_transposed=True, b_transposed=True, epilogue=expr,
                           prepacked_b=d.prepack is not None, **_gemm_args(plan, extras))
        args = ["col", ptrs[cv.args[1]], "out"] + [ptrs[i] for i, _ in extras]
    else:
        assert (g.M, g.batch, g.strides) == (O, N, (0, K * P, O * P)), "the plan's GEMM is this conv's"
        src, _ = emit_gemm(gname, M=O, N=P, K=K, batch=N, a_batch_stride=0, b_batch_stride=K * P, c_batch_stride=sc,
                           lda=K, ldb=P, ldc=ldc, csc=csc, b_transposed=False, epilogue=expr,
                           **_gemm_args(plan, extras))
        args = [ptrs[cv.args[1]], "col", "out"] + [ptrs[i] for i, _ in extras]
    wrapper = render("conv2d.c", NAME=plan.name, PARAMS=params, X=ptrs[cv.args[0]],
                     N=N, C=C, H=H, W=W, O=O, KH=KH, KW=KW, OH=OH, OW=OW, SH=sh, SW=sw, PH=ph, PW=pw,
                     DIRECT=int(direct), GEMM=gname, ARGS=", ".join(args), PARALLEL=int(plan.detail.parallel))
    return src + "\n" + wrapper


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


