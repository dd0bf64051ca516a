"""Stage `emit`: kernel plans -> C source, from the skeletons in csrc_templates/.

Templates hold the loop nests; the op table supplies each pointwise op's C expression; this
module computes index expressions (numpy broadcasting as strides) and fills the placeholders.
Generated names are deterministic: eqf_<graph>_k<counter>_<kind>, values v<node id>.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import count
from typing import Iterator

from eqfuse.backend.indexing import (  # noqa: F401
    bstrides,
    coalesce,
    contiguous,
    joint_groups,
    leaf_strides,
    leaf_views,
    offset,
    result_strides,
    view_strides,
)
from eqfuse.backend.lower import KernelPlan, Split
from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.ops import OPS, reduce_axes
from eqfuse.ir.shapes import C_TYPE, INT_DTYPES

PARALLEL_MIN = 1 << 15  # elements below which a kernel runs on one thread


def flit(v: float) -> str:
    v = float(v)
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    return f"({float.__repr__(v)}f)" if v < 0 else f"{float.__repr__(v)}f"


class Space:
    """An index space (a shape) walked by C loop variables, each over a set of its dims.

    Hoisted variables are fixed in an enclosing loop: their part of each offset is declared
    once (in `decls`, as off<k>); the others are computed where the element is read.
    `ids` numbers those declarations: one counter per kernel, shared by all of the kernel's
    spaces, because templates put the declarations of several spaces (a row reduction's
    prologue and epilogue, attention's scores and output) in one C scope.
    """

    def __init__(self, shape, groups: list[tuple[str, list[int], bool]], indent: str, ids: Iterator[int]):
        self.shape = tuple(shape)
        self.groups = groups
        self.indent = indent
        self.decls: list[str] = []
        self._names: dict[tuple, str] = {}
        self._ids = ids

    def access(self, ptr: str, view, strides=None) -> str:
        st = bstrides(view, self.shape, strides)
        parts = []
        hoisted = []
        for var, dims, hoist in self.groups:
            off = offset(var, [self.shape[d] for d in dims], [st[d] for d in dims])
            if off == "0":
                continue
            (hoisted if hoist else parts).append(off)
        if hoisted:
            key = (ptr, tuple(hoisted))
            if key not in self._names:
                name = f"off{next(self._ids)}"
                self._names[key] = name
                self.decls.append(f"{self.indent}const long {name} = {' + '.join(hoisted)};")
            parts.insert(0, self._names[key])
        return f"{ptr}[{' + '.join(parts) or '0'}]"


CHANNEL_C = {  # ops of kind "channel": parameters broadcast along axis 1
    "batchnorm": lambda a: "(({0} - {1}) / sqrtf({2} + " + flit(a["eps"]) + ") * {3} + {4})",
}


class Exprs:
    """Statements computing body values at one element of a Space (one `const float` per node)."""

    def __init__(self, body: Graph, space: Space, ptrs: dict[int, str], preset: dict[int, str],
                 indent: str, forbid: set[int] = frozenset(), prefix: str = "v", strides: dict | None = None):
        self.body, self.space, self.ptrs, self.preset = body, space, ptrs, preset
        self.strides = strides or {}  # body input -> the strides of the view it is read through
        self.prefix = prefix
        self.indent, self.forbid = indent, forbid
        self.stmts: list[str] = []
        self.memo: dict[tuple, str] = {}

    def value(self, i: int, chan: int | None = None) -> str:
        if i in self.preset:
            return self.preset[i]
        key = (i, chan)
        if key in self.memo:
            return self.memo[key]
        if i in self.forbid:
            raise Split("the epilogue reads a value of the prologue's index space")
        n = self.body.nodes[i]
        if n.op == "const":
            return flit(n.value)  # the one literal form: C's conversions give it each use's type
        var = f"{self.prefix}{i}" + (f"_c{chan}" if chan is not None else "")
        if n.op == "input":
            view = tuple(n.type.shape)
            if chan is not None and len(view) == 1:
                view = view + (1,) * (chan - 2)
            expr = self.space.access(self.ptrs[i], view, self.strides.get(i) if chan is None else None)
        else:
            op = OPS[n.op]
            if op.kind == "channel":
                xr = self.body.nodes[n.args[0]].type.rank
                args = [self.value(n.args[0], chan)] + [self.value(a, xr) for a in n.args[1:]]
                expr = CHANNEL_C[n.op](n.attr).format(*args)
            elif op.kind == "pointwise":
                expr = op.c_expr(n.attr).format(*(self._operand(n, a, chan) for a in n.args))
            else:
                raise Split(f"{n.op} cannot be computed inside this kernel's loop")
        self.stmts.append(f"{self.indent}const {C_TYPE[n.type.dtype]} {var} = {expr};")
        self.memo[key] = var
        return var

    def _operand(self, n: Node, a: int, chan: int | None) -> str:
        """Operand a of op n: a literal next to integer operands is written as an integer (so
        that `ids + 1` is integer arithmetic in C, exact beyond 2^24)."""
        an = self.body.nodes[a]
        if an.op == "const" and float(an.value).is_integer() and abs(an.value) < 2 ** 62:
            others = [self.body.nodes[b].type.dtype for b in n.args if self.body.nodes[b].op != "const"]
            if others and all(d in INT_DTYPES or d == "bool" for d in others):
                return f"((int64_t){int(an.value)})"
        return self.value(a, chan)

    def text(self) -> str:
        return "\n".join(self.stmts)

    def expression(self, i: int) -> str:
        """One C expression (a GNU statement expression when statements are needed)."""
        v = self.value(i)
        if not self.stmts:
            return v
        return "({ " + " ".join(s.strip() for s in self.stmts) + f" {v}; }})"


# ------------------------------------------------------------------ rendering


def render(template: str, **values) -> str:
    from eqfuse.backend.cbuild import render as cb_render

    return cb_render(template, **{k: str(v) for k, v in values.items()})


def ctypes_of(plan: KernelPlan) -> tuple[list[str], str]:
    """The C element types of the kernel's inputs and of its output."""
    body = plan.body
    return [C_TYPE[body.nodes[i].type.dtype] for i in body.inputs], C_TYPE[body.nodes[body.outputs[0]].type.dtype]


def _params(plan: KernelPlan) -> tuple[str, dict[int, str]]:
    ptrs = {i: f"in{k}" for k, i in enumerate(plan.body.inputs)}
    ins, out = ctypes_of(plan)
    ps = [f"const {t}* restrict in{k}" for k, t in enumerate(ins)] + [f"{out}* restrict out"]
    return ", ".join(ps), ptrs


def prototype(plan: KernelPlan) -> str:
    """The kernel's cdef (and its B prepacking functions when it has them; call after emitting)."""
    ins, out = ctypes_of(plan)
    ps = [f"const {t}* in{k}" for k, t in enumerate(ins)] + [f"{out}* out"]
    ret = "long" if plan.kind == "index" else "void"  # index kernels count bad indices
    cdef = f"{ret} {plan.name}({', '.join(ps)});"
    pre = plan.detail.get("prepack")
    if pre:
        cdef += f"\nlong {pre['floats']}(void);\nvoid {pre['fn']}(const float* B, float* P);"
    return cdef


def _size(shape) -> int:
    return math.prod(shape) if shape else 1


I1, I2, I3, I4 = " " * 8, " " * 12, " " * 16, " " * 20


def emit_pointwise(plan: KernelPlan) -> str:
    body, root = plan.body, plan.body.outputs[0]
    shape = plan.out_shape
    sets = leaf_strides(body, root, shape, plan.base_strides()) + [contiguous(shape)]
    groups = joint_groups(shape, sets)
    inner_dims = groups[-1] if groups else []
    outer_dims = [d for g in groups[:-1] for d in g]
    inner = _size([shape[d] for d in inner_dims])
    outer = _size(shape) // inner
    stream, tile = plan.tiles["stream"], plan.tiles["tile"]
    assert inner == plan.detail["inner"], "lower and emit see the same inner loop"
    params, ptrs = _params(plan)
    space = Space(shape, [("o", outer_dims, True), ("j", inner_dims, False)], I1, count())
    ex = Exprs(body, space, ptrs, {}, I2, strides=plan.base_strides())
    res = ex.value(root)
    # Streaming tiles start on the output's 64-byte lines: up to 15 more elements per row to cover.
    ntiles = -(-(inner + 15 * stream) // tile)
    return render("pointwise.c", NAME=plan.name, SPACE=list(shape), PARAMS=params, INNER=inner, TILE=tile,
                  OTYPE=ctypes_of(plan)[1],
                  STREAM=stream, SCHEDULE="guided" if stream else "static", NTILES=ntiles, OUTER=outer,
                  PARALLEL=int(_size(shape) >= PARALLEL_MIN),
                  OFFSETS="\n".join(space.decls), BODY=ex.text(), RESULT=res,
                  LINE_BODY="\n".join("    " + ln for ln in ex.text().splitlines()))


def row_loop_pragma(parallel: int) -> str:
    """The row templates' loop over rows: split over threads (when `parallel`), or plain."""
    return f"    #pragma omp parallel for schedule(static) if ({parallel})"


def emit_row(plan: KernelPlan) -> str:
    body, a = plan.body, plan.shape.anchor
    an = body.nodes[a]
    xshape = tuple(body.nodes[an.args[0]].type.shape)
    axis0, rows, L = plan.detail["axis0"], plan.detail["rows"], plan.detail["L"]
    if an.op == "softmax":
        col_dims = [axis0]
        row_dims = [d for d in range(len(xshape)) if d != axis0]
    else:
        col_dims = list(range(axis0, len(xshape)))
        row_dims = list(range(axis0))
    params, ptrs = _params(plan)
    ids = count()
    space = Space(xshape, [("r", row_dims, True), ("j", col_dims, False)], I1, ids)
    pro = Exprs(body, space, ptrs, {}, I2, strides=plan.base_strides())
    x = pro.value(an.args[0])
    common = dict(NAME=plan.name, PARAMS=params, ROWS=rows, L=L,
                  ROW_LOOP_PRAGMA=row_loop_pragma(int(rows > 1 and rows * L >= PARALLEL_MIN // 4)),
                  PRO_BODY=pro.text(), X=x)
    if an.op in ("softmax", "layernorm", "rmsnorm"):
        epi = Exprs(body, space, ptrs, {a: "v"}, I2, strides=plan.base_strides())
        e = epi.value(body.outputs[0])
        cs = contiguous(xshape)
        common.update(OFFSETS="\n".join(space.decls), EPI_BODY=epi.text(), EPI=e, R0=0)
        if an.op == "softmax":
            return render("row_softmax.c", YBASE=offset("r", [xshape[d] for d in row_dims], [cs[d] for d in row_dims]),
                          YS=cs[axis0], ZERO_NAN=int(an.attr["zero_nan"]), **common)
        g = ptrs[an.args[1]]
        extra = {"GAMMA": g, "EPS": flit(an.attr["eps"])}
        if an.op == "layernorm":
            extra["BETA"] = ptrs[an.args[2]]
        return render(f"row_{an.op}.c", **common, **extra)
    # sum / mean / max over trailing axes: one value per row
    espace = Space(plan.out_shape, [("r", list(range(len(plan.out_shape))), True)], I1, ids)
    forbid = _ancestors(body, an.args[0])
    epi = Exprs(body, espace, ptrs, {a: "v"}, I1, forbid=forbid, strides=plan.base_strides())
    e = epi.value(body.outputs[0])
    red = _REDUCE[an.op]
    return render("row_reduce.c", OP=an.op, OFFSETS="\n".join(space.decls), EPI_OFFSETS="\n".join(espace.decls),
                  EPI_BODY=epi.text(), EPI=e, INIT=red[0], RED=red[1], COMBINE=red[2],
                  NAN_TRACK=_NAN_TRACK.get(an.op, ""),
                  SCALE=flit(1.0 / L) if an.op == "mean" else "1.0f", **common)


# init, omp reduction identifier, combine(a, x) inside an `omp simd reduction`, and combine(a, x)
# elsewhere. numpy's max propagates NaN; `x > a ? x : a` does not, but it is the form gcc
# vectorizes as a max reduction, so a simd reduction of max tracks NaN in a flag of its own
# (_NAN_TRACK) and the result becomes NaN at the end; elsewhere eqf_max propagates NaN itself.
_REDUCE = {
    "sum": ("0.0f", "+", "a + x", "a + x"),
    "mean": ("0.0f", "+", "a + x", "a + x"),
    "max": ("-INFINITY", "max", "(x > a ? x : a)", "eqf_max(x, a)"),
    "min": ("INFINITY", "min", "(x < a ? x : a)", "eqf_min(x, a)"),
    "prod": ("1.0f", "*", "a * x", "a * x"),
}
_NAN_TRACK = {"max": "nan |= x != x;", "min": "nan |= x != x;"}


def _ancestors(body: Graph, i: int) -> set[int]:
    """The computed nodes (not inputs or constants) that node i depends on, i included."""
    return {j for j in body.ancestors(i) if body.nodes[j].op not in ("input", "const")}


def emit_reduce(plan: KernelPlan) -> str:
    body, a = plan.body, plan.shape.anchor
    an = body.nodes[a]
    xshape = tuple(body.nodes[an.args[0]].type.shape)
    axes = set(reduce_axes(an.attr, len(xshape)))
    params, ptrs = _params(plan)
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
    init, _, combine, combine_nan = _REDUCE[an.op]
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
            lines.append(f"{pad}#pragma omp simd reduction({_REDUCE[an.op][1]}:a) reduction(|:nan)")
        lines.append(f"{pad}for (long i{d} = 0; i{d} < {xshape[d]}; i{d}++) {{")
    inner = " " * (4 * depth)
    body_lines = [pro.text()] if pro.stmts else []
    body_lines.append(f"{inner}const float x = {x};")
    if dims and dims[-1] in axes:
        body_lines.append(f"{inner}a = {combine};")
        if an.op in _NAN_TRACK:
            body_lines.append(f"{inner}{_NAN_TRACK[an.op]}")
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
    epi = Exprs(body, espace, ptrs, {a: "v"}, I1, forbid=_ancestors(body, an.args[0]), strides=plan.base_strides())
    e = epi.value(body.outputs[0])
    count_red = _size([xshape[d] for d in axes])
    return render("reduce.c", NAME=plan.name, OP=an.op, AXES=sorted(axes), SPACE=list(xshape),
                  OUT_SPACE=list(plan.out_shape), PARAMS=params, OUT_SIZE=_size(plan.out_shape), INIT=init,
                  PARALLEL=int(bool(kept) and _size(xshape) >= PARALLEL_MIN), NEST="\n".join(lines),
                  SCALE=flit(1.0 / count_red) if an.op == "mean" else "1.0f",
                  EPI_OFFSETS="\n".join(espace.decls), EPI_BODY=epi.text(), EPI=e)


def _score_scale(body: Graph, score: int, qk: int) -> float | None:
    """c when the attention score is q k^T * c, c * q k^T or q k^T / c with c a constant (1.0 for
    q k^T itself); None when it has other ops (masks, biases)."""
    if score == qk:
        return 1.0
    n = body.nodes[score]
    if n.op not in ("mul", "div") or len(n.args) != 2:
        return None
    a, b = (body.nodes[x] for x in n.args)
    if n.op == "mul" and a.op == "const" and n.args[1] == qk:
        return float(a.value)
    if n.args[0] == qk and b.op == "const":
        return float(b.value) if n.op == "mul" else 1.0 / float(b.value)
    return None


def emit_attention(plan: KernelPlan) -> str:
    """q, k^T and v are read in place through their views (strides), the result is written
    through its output transposes (strides); k^T is first copied per head into a padded tile."""
    body = plan.body
    q, kt, v, qk, sm, mask, result = plan.shape.parts
    pv = plan.shape.anchor
    res = tuple(body.nodes[result].type.shape)
    nb = len(res) - 2
    bdims = list(range(nb))
    d = plan.detail
    Sq, Sk, D, Dv = d["Sq"], d["Sk"], d["D"], d["Dv"]
    batch = res[:-2]
    params, ptrs = _params(plan)

    base = plan.base_strides()  # inputs read through views

    def strided(i, tail):  # (input pointer, strides over batch + tail) of the view node i
        src, st = view_strides(body, i, base)
        return ptrs[src], bstrides(body.nodes[i].type.shape, batch + tail, st)

    Q, qs = strided(q, (Sq, D))
    K, ks = strided(kt, (D, Sk))
    V, vs = strided(v, (Sk, Dv))
    os_ = result_strides(body, result)
    # k^T is transposed once per distinct head: the batch dims along which it does not broadcast
    kdims = [i for i in bdims if ks[i] != 0]
    kb_index = [0] * nb
    acc = 1
    for i in reversed(kdims):
        kb_index[i] = acc
        acc *= batch[i]
    ids = count()
    sspace = Space(batch + (Sq, Sk), [("b", bdims, True), ("i", [nb], False), ("j", [nb + 1], False)], I1, ids)
    sc = Exprs(body, sspace, ptrs, {qk: "acc_s"}, I4)
    # The softmax works in base 2. A score q k^T * c (or / c, or plain q k^T) is folded into the
    # q block as a factor c log2 e, and the score pass then only masks the keys past the end.
    scale = _score_scale(body, body.nodes[sm].args[0], qk)
    if scale is None:
        score, qscale, slog2e, score_ops = sc.value(body.nodes[sm].args[0]), "1.0f", "EQF_LOG2E", 1
    else:
        score, qscale, slog2e, score_ops = "acc_s", flit(scale * math.log2(math.e)), "1.0f", 0
    ospace = Space(res, [("b", bdims, True), ("i", [nb], False), ("e", [nb + 1], False)], I1, ids)
    epi = Exprs(body, ospace, ptrs, {pv: "v"}, I3, forbid={qk, sm})
    e = epi.value(result)
    bk, bq = plan.tiles["bk"], plan.tiles["bq"]
    vec = int(bk % 64 == 0 and bq % 4 == 0 and Dv % 16 == 0 and vs[nb + 1] == 1)
    return render("attention.c", NAME=plan.name, PARAMS=params, BATCH=_size(batch), SQ=Sq, SK=Sk, D=D, DV=Dv,
                  BQ=bq, BK=bk, SKP=-(-Sk // bk) * bk, VEC=vec, ZERO_NAN=int(body.nodes[sm].attr["zero_nan"]),
                  PARALLEL=int(plan.detail["parallel"]),
                  Q=Q, QOFF=offset("b", batch, qs[:nb]), QR=qs[nb], QC=qs[nb + 1],
                  K=K, KSRC=offset("kb", [batch[i] for i in kdims], [ks[i] for i in kdims]),
                  KBI=offset("b", batch, kb_index), KD=ks[nb], KJ=ks[nb + 1],
                  V=V, VOFF=offset("b", batch, vs[:nb]), VR=vs[nb], VC=vs[nb + 1],
                  OUT_OFF=offset("b", batch, os_[:nb]), OR=os_[nb], OC=os_[nb + 1],
                  OFFSETS="\n".join(sspace.decls + ospace.decls),
                  SCORE_BODY=sc.text(), SCORE=score, QSCALE=qscale, SCORE_LOG2E=slog2e, SCORE_OPS=score_ops,
                  EPI_BODY=epi.text(), EPI=e)


# ------------------------------------------------------------------ layout


def emit_layout(plan: KernelPlan) -> str:
    body, a = plan.body, plan.shape.anchor
    an = body.nodes[a]
    params, ptrs = _params(plan)
    out = tuple(plan.out_shape)
    blocks = []

    def block(src: str, src_shape, src_strides_in_out_space, dst_base: str, dst_space, dst_strides, base_src="0"):
        # walk `dst_space` (a shape); inner loop over its last non-1 group
        sets = [src_strides_in_out_space, dst_strides]
        groups = joint_groups(dst_space, sets) or [[]]
        inner_dims, outer_dims = groups[-1], [d for g in groups[:-1] for d in g]
        inner = _size([dst_space[d] for d in inner_dims])
        outer = _size(dst_space) // inner
        so = offset("o", [dst_space[d] for d in outer_dims], [src_strides_in_out_space[d] for d in outer_dims])
        do = offset("o", [dst_space[d] for d in outer_dims], [dst_strides[d] for d in outer_dims])
        ssi = coalesce([dst_space[d] for d in inner_dims], [src_strides_in_out_space[d] for d in inner_dims])[1]
        dsi = coalesce([dst_space[d] for d in inner_dims], [dst_strides[d] for d in inner_dims])[1]
        decl = (f"        const long src_off = {base_src} + {so};\n"
                f"        const long dst_off = {dst_base} + {do};\n        (void)o;")
        blocks.append(render("copy_block.c", PARALLEL=int(_size(dst_space) >= PARALLEL_MIN), OUTER=outer,
                             OFFSETS=decl, INNER=inner, DST="out", DST_STRIDE=dsi[0] if dsi else 0,
                             SRC=src, SRC_STRIDE=ssi[0] if ssi else 0))

    def strides(x):  # the input's strides: contiguous, or those of the view it is read through
        k = body.inputs.index(x)
        return plan.in_strides.get(k) or contiguous(body.nodes[x].type.shape)

    if an.op == "transpose":
        x = an.args[0]
        xs = body.nodes[x].type.shape
        perm = an.attr["perm"] or tuple(reversed(range(len(xs))))
        cs = strides(x)
        block(ptrs[x], xs, [cs[p] for p in perm], "0", out, contiguous(out))
    elif an.op == "reshape":  # a reshape copies only a view it cannot be a view of: walk the source in order
        x = an.args[0]
        xs = body.nodes[x].type.shape
        block(ptrs[x], xs, list(strides(x)), "0", xs, contiguous(xs))
    elif an.op == "slice":
        x = an.args[0]
        xs = body.nodes[x].type.shape
        ax = an.attr["axis"] % len(xs)
        start = range(xs[ax])[an.attr["start"]:an.attr["stop"]].start
        cs = list(strides(x))
        src = list(cs)
        src[ax] *= an.attr["step"]
        block(ptrs[x], xs, src, "0", out, contiguous(out), base_src=str(start * cs[ax]))
    elif an.op == "concat":
        ax = an.attr["axis"] % len(out)
        ocs = contiguous(out)
        pos = 0
        for x in an.args:
            xs = body.nodes[x].type.shape
            block(ptrs[x], xs, list(contiguous(xs)), str(pos * ocs[ax]), xs, list(ocs))
            pos += xs[ax]
    else:
        raise Split(f"layout op {an.op} has no copy kernel")
    return render("layout.c", NAME=plan.name, OP=an.op, SPACE=list(out), PARAMS=params, BLOCKS="\n".join(blocks))


from eqfuse.backend import emit_gemm  # noqa: E402  (it imports from this module)
from eqfuse.backend.emit_index import emit_index  # noqa: E402  (it imports from this module lazily)

EMITTERS = {"pointwise": emit_pointwise, "row": emit_row, "reduce": emit_reduce, "attention": emit_attention,
            "contraction": lambda p: emit_gemm.emit_contraction(p), "contraction_row": lambda p: emit_gemm.emit_contraction(p),
            "conv2d": lambda p: emit_gemm.emit_conv2d(p),
            "layout": emit_layout, "index": emit_index}


@dataclass
class Emitted:
    source: str  # the whole translation unit
    cdef: str
    kernel_sources: dict[str, str]  # plan name -> its C


def emit_kernel(plan: KernelPlan) -> str:
    return EMITTERS[plan.kind](plan)


def emit_graph(plans: list[KernelPlan]) -> Emitted:
    from eqfuse.backend.cbuild import COMMON_C, COMMON_CDEF, HEADER_C, HEADER_CDEF, template

    header = template("common.h")
    parts, cdefs, per = [COMMON_C, header, HEADER_C], [COMMON_CDEF, HEADER_CDEF], {}
    for p in plans:
        if p.kind == "view":
            continue
        c = emit_kernel(p)
        per[p.name] = c
        parts.append(c)
        cdefs.append(prototype(p))
    return Emitted("\n".join(parts), "\n".join(cdefs), per)
