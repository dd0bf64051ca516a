"""Kernel shapes: what one fused kernel body can be, the one lowerability decision.

`classify(body, machine)` says whether a fused kernel body is lowered as one kernel and of
which kind. The frontend asks it for hand-written kernel blocks (without a machine), extraction
for every candidate kernel, `eqfuse opt --explain` for why a fusion was not taken, and the
backend's `lower` for the kind that plans and emits it. Each entry of `SHAPES` is one kind's
`match`: None when the body is not that kind (another may be), its typed `KernelShape` when it
is, `Unsupported` with the reason when it is that kind's shape but cannot be lowered, or `Split`
when the backend lowers it only as separate single-op kernels (on `machine`, when given).
Planning and C emission (eqfuse.backend) never refuse a body that `classify` accepted.

This module is below the frontend and the optimizer: it knows shapes and the machine model,
not how a kernel is planned or written.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum

from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.ops import OPS, pair, symmetric_pads
from eqfuse.ir.ops_quant import RANGE_SCALARS
from eqfuse.machine import Machine

F32 = 4  # bytes per element

class K(StrEnum):
    """The kinds of kernel plans: the one definition (eqfuse.backend.kinds holds the class that
    matches, plans and emits each; a plan's name ends with its kind's value)."""

    POINTWISE = "pointwise"
    CONTRACTION = "contraction"  # a matmul GEMM with a pointwise epilogue
    CONTRACTION_ROW = "contraction_row"  # a matmul GEMM whose finished rows go through a row op
    CONV2D = "conv2d"  # a conv2d GEMM (im2col) with a pointwise epilogue
    ROW = "row"
    REDUCE = "reduce"
    ATTENTION = "attention"
    ATTENTION_GRAD = "attention_grad"  # attention_dq / dk / dv, the probabilities recomputed
    LAYOUT = "layout"  # a copy
    VIEW = "view"  # a layout op read in place: no code (eqfuse.backend.views)
    INDEX = "index"


GEMM_KINDS = (K.CONTRACTION, K.CONTRACTION_ROW, K.CONV2D)


class Unsupported(Exception):
    """The body is not a kernel shape the backend lowers; the message says why."""


class Split(Unsupported):
    """A kernel shape that this backend lowers only as separate single-op kernels (its epilogue
    broadcasts the main op's result, a row does not fit the cache, ...). A hand-written kernel
    block of this kind is split silently; extraction never chooses one."""


@dataclass(frozen=True)
class AttentionParts:
    """The body nodes of an attention kernel. q, kt and v are kernel inputs or views of inputs
    (kinds.base.view_source), kt being k^T as the scores matmul reads it; mask is the mask input
    or None; result is the attention value with its epilogue, before any output transposes."""

    q: int
    kt: int
    v: int
    qk: int  # the scores matmul q @ k^T
    sm: int  # the softmax
    mask: int | None
    result: int


@dataclass(frozen=True)
class RowEpilogue:
    """The row op of a contraction_row kernel: the GEMM's finished rows go through it."""

    row: int


@dataclass(frozen=True)
class ConvPrologue:
    """The depthwise conv of a conv2d kernel whose 1x1 conv reads it (an inverted residual:
    eqfuse.backend.kinds.contraction.conv_dwpw): `dw` is the depthwise conv2d over kernel inputs,
    `value` the node the 1x1 conv reads (the depthwise conv through pointwise ops, its
    activation). With the inverted residual's expand 1x1 conv fused too (rule fuse_pw_dw): `ex`
    is that 1x1 conv over kernel inputs and `xv` the value the depthwise conv reads (the expand
    conv through pointwise ops, its bias and activation); else both None."""

    dw: int
    value: int
    ex: int | None = None
    xv: int | None = None


@dataclass(frozen=True)
class ConvNorm:
    """The depthwise conv and the layernorm of a matmul kernel that reads them (ConvNeXt's block:
    eqfuse.backend.kinds.contraction.conv_dwln): `dw` is the depthwise conv2d over kernel inputs,
    `tr` the transpose of its output to NHWC, `ln` the layernorm over the channels that the
    matmul (the kernel's anchor, its weights a kernel input) reads."""

    dw: int
    tr: int
    ln: int


# the most bytes of one output row of a fused depthwise conv, over all its channels: the kernel
# keeps a band of its rows (at least one) in a buffer on the thread's stack
DW_ROW_BYTES_MAX = 1 << 17
# A depthwise conv joins its 1x1 conv while its output of one image fits this share of L1: there
# the call and the round trip of the depthwise output through memory that the fused kernel saves
# outweigh what it loses against the separate depthwise kernel (which transposes its input in
# registers; the fused one copies it element by element). Measured per block of the zoo's tiny
# MobileNetV2 (`python benchmarks/bench_dwpw.py --profile`): ahead up to 8 KB per
# image (48 channels at 4 x 4, 8 at 16 x 16), behind from 12 KB (48 channels at 8 x 8)
DW_FUSE_L1_SHARE = 4
# The expand 1x1 conv before the depthwise conv joins the fused kernel while the depthwise conv's
# input and output of an image (the expanded tensor, which the fused kernel then never writes)
# fit this share of L1 (then DW_FUSE_L1_SHARE does not apply: the whole block saves two round
# trips through memory, not one), and only while the input image holds DW_EXPAND_MIN_PIXEL_VECTORS
# vectors of pixels (below). With the share at 1 the whole block is ahead of the expand kernel + the fused depthwise and 1x1 kernel,
# and of three kernels, from 3 KB to 24 KB (96 channels at 8 x 8) and a 32 KB stride-2 input
# (`python benchmarks/bench_dwpw.py --blocks`); 36 KB (144 channels at 8 x 8) stays three
DW_EXPAND_L1_SHARE = 1
# The expand conv joins the fused kernel only while its input image holds at least this many
# vectors of pixels: the kernel computes the expand conv as vectors over runs of pixels, and over
# the 2 x 2 and 1 x 1 images of MobileNetV2's last stages a run fills a quarter of a vector or
# less. There the whole block as one kernel is behind the expand conv as a GEMM kernel of its own
# + the fused depthwise and 1x1 kernel, at 96 and 144 channels of 2 x 2 and 240 of 1 x 1
# (`python benchmarks/bench_dwpw.py --profile`: its build "whole" lifts this rule;
# benchmarks/RESULTS.md, 2026-11-28 late evening)
DW_EXPAND_MIN_PIXEL_VECTORS = 1
# A depthwise conv joins the layernorm over its channels and the Linear C -> F after it (ConvNeXt's
# block: rules fuse_dw_ln_mm*, eqfuse.backend.kinds.contraction.conv_dwln) while its image holds
# at least this many vectors of pixels. Measured with `python benchmarks/bench_dwpw.py --convnext`
# (benchmarks/RESULTS.md): from 7 x 7 and 8 x 8 images up (16 to 768 channels) the fused kernel is
# within about a tenth of the three kernels' time either way, and ahead at 768 channels of 7 x 7
# (the three kernels' matmul of 49 rows is the slow one); at 4 x 4 (32 channels, the zoo's tiny ConvNeXt's second stage) it is
# behind: its depthwise sums and register tiles run mostly over padding
DWLN_MIN_PIXEL_VECTORS = 2


@dataclass(frozen=True)
class KernelShape:
    """What `match` found: the kind, the anchor (the body node of the matmul/conv2d, the row or
    reduce op, attention's last matmul, the layout or index op) and the kind's typed parts."""

    kind: K
    anchor: int | None = None
    parts: AttentionParts | RowEpilogue | ConvPrologue | ConvNorm | None = None


def op_kind(n: Node) -> str:
    """The kind of a body node as kernels see it: input, const, kernel, or the op's kind in the
    op table (a channel op such as batchnorm is pointwise for kernels)."""
    if n.op in ("input", "const", "kernel"):
        return n.op
    k = OPS[n.op].kind
    return "pointwise" if k == "channel" else k


@dataclass(frozen=True)
class Facts:
    """What every kind's match reads: the non-pointwise ops (`heavy`), each op's kind, the
    kernel inputs and the output."""

    heavy: list[int]
    kinds: dict[int, str]
    inputs: set[int]
    out: int

    @staticmethod
    def of(body: Graph) -> Facts:
        ops = [(i, n) for i, n in enumerate(body.nodes) if n.op not in ("input", "const")]
        if not ops:
            raise Unsupported("the kernel computes nothing")
        # (a scale or zero point of a range's two floats is a scalar expression: range_scalar)
        kinds = {i: "pointwise" if range_scalar(body, i) else op_kind(n) for i, n in ops}
        if "kernel" in kinds.values():
            raise Unsupported("kernel blocks cannot be nested")
        heavy = [i for i, k in kinds.items() if k != "pointwise"]
        return Facts(heavy, kinds, set(body.inputs), body.outputs[0])

    def single(self, *op_kinds: str) -> int | None:
        """The one non-pointwise op when there is exactly one and its kind is among op_kinds."""
        if len(self.heavy) == 1 and self.kinds[self.heavy[0]] in op_kinds:
            return self.heavy[0]
        return None


def range_scalar(body: Graph, i: int) -> bool:
    """Whether node i is dynamic_scale or dynamic_zero_point of a kernel input of two floats (the
    range [lo, hi] dynamic_range writes, as the ONNX importer writes DynamicQuantizeLinear): a C
    expression of those two floats (eqf_range_scale, eqf_range_zero_point), computed by the
    kernel that reads it like a pointwise op, not a kernel of its own (cexpr.Exprs; qgemm's
    quantize_a)."""
    n = body.nodes[i]
    return (n.op in RANGE_SCALARS and body.nodes[n.args[0]].op == "input"
            and tuple(body.nodes[n.args[0]].type.shape) == (2,) and body.nodes[n.args[0]].type.dtype == "f32")


def dynamic_qparams(body: Graph, anchor: int, inputs: set[int]) -> tuple[int, ...]:
    """(scale, zp) when node `anchor` is a matmul_integer (or conv_integer) whose A is
    quantize_linear(x, dynamic_scale(r), dynamic_zero_point(r)) of a kernel input r (the two
    floats of dynamic_range: range_scalar) and whose a_zp is that zero point: the GEMM computes
    both from r itself before it quantizes x (rule kernel_matmul_integer_dqa; qgemm), so that
    they are no kernels of their own. () otherwise. (The GEMM's zero point too, when it is
    another node than the quantize's.)"""
    mm = body.nodes[anchor]
    if mm.op not in ("matmul_integer", "conv_integer"):
        return ()
    q = body.nodes[mm.args[0]]
    if q.op != "quantize_linear":
        return ()
    x, scale, zp = q.args
    s, z, gz = body.nodes[scale], body.nodes[zp], body.nodes[mm.args[2]]
    if s.op != "dynamic_scale" or {z.op, gz.op} != {"dynamic_zero_point"} or not s.args == z.args == gz.args:
        return ()
    # (the GEMM's zero point is the quantize's node, or the same op of the same r written twice;
    # an epilogue may read the scale too, as an expression of r: cexpr.Exprs)
    if not range_scalar(body, scale):
        return ()
    return tuple(dict.fromkeys((scale, zp, mm.args[2])))


def quantized_out(body: Graph) -> bool:
    """Whether the kernel's result is a quantize_linear whose scale and zero point are one value
    each (a QDQ model's requantized conv or matmul, a QLinearAdd's requantization): its kernel
    then quantizes rows of floats at once (the templates' QOUT, common_simd.h eqf_quantize_row)."""
    last = body.nodes[body.outputs[0]]
    return last.op == "quantize_linear" and all(math.prod(body.nodes[x].type.shape) == 1 for x in last.args[1:])


def quantized_a(body: Graph, anchor: int, inputs: set[int]) -> int | None:
    """The f32 x of a matmul_integer (or conv_integer) whose A (x) is quantize_linear(x, scale, zp)
    of kernel inputs (the scale may be a literal), scale and zp scalars, zp the GEMM's own a_zp, and read by nothing else: the
    integer GEMM quantizes x itself (rules kernel_matmul_integer_qa, kernel_conv_integer_qa;
    qgemm's quantize_a)."""
    mm = body.nodes[anchor]
    if mm.op not in ("matmul_integer", "conv_integer"):
        return None
    q = body.nodes[mm.args[0]]
    if q.op != "quantize_linear" or body.users()[mm.args[0]] != 1:
        return None
    x, scale, zp = q.args
    computed = set(dynamic_qparams(body, anchor, inputs))
    literal = {scale} if body.nodes[scale].op == "const" else set()  # (a QDQ model's: matmul_dequantized_qa)
    if not {x, scale, zp} <= inputs | computed | literal or (zp != mm.args[2] and not computed) or body.nodes[scale].type.rank != 0:
        return None
    if body.nodes[x].type.dtype != "f32" or body.nodes[scale].type.dtype != "f32" or body.nodes[zp].type.rank != 0:
        return None
    return x


def swaps_last_two(n: Node) -> bool:
    if n.op != "transpose" or n.type.rank < 2:
        return False
    perm = n.attr["perm"] or tuple(reversed(range(n.type.rank)))
    r = n.type.rank
    return tuple(perm) == tuple(range(r - 2)) + (r - 1, r - 2)


def check_epilogue(body: Graph, anchor: int, out: int) -> None:
    """Every op after the anchor must be pointwise and lie on the way to the output."""
    if anchor not in body.ancestors(out):
        raise Unsupported("the kernel's result does not depend on its main op")


def check_no_broadcast(body: Graph, anchor: int, result: int, what: str) -> None:
    """The epilogue runs over the main op's index space: it must not broadcast its result."""
    if tuple(body.nodes[anchor].type.shape) != tuple(body.nodes[result].type.shape):
        raise Split(f"its epilogue would broadcast the {what} result to a larger shape")


def check_computable(body: Graph, root: int, stops: set[int], forbid: set[int] = frozenset()) -> None:
    """The values an emitter computes element by element for `root` (cexpr.Exprs, starting
    again at the `stops` it is given) are pointwise ops over inputs and constants, none of them
    in `forbid` (values of another index space)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        i = stack.pop()
        if i in seen or i in stops:
            continue
        seen.add(i)
        if i in forbid:
            raise Split("the epilogue reads a value of the prologue's index space")
        n = body.nodes[i]
        if n.op in ("input", "const"):
            continue
        if op_kind(n) != "pointwise":
            raise Split(f"{n.op} cannot be computed inside this kernel's loop")
        stack.extend(n.args)


def view_source(body: Graph, i: int) -> int | None:
    """The kernel input that node i reads in place through layout ops, or None.

    A view is an input under reshapes and transposes, the reshapes first (a reshape of a
    contiguous buffer is free; a transpose only permutes strides), e.g. the head split
    transpose(reshape(x, shape=[-1, S, H, D]), perm=[0, 2, 1, 3]).
    """
    n = body.nodes[i]
    if n.op == "input":
        return i
    if n.op == "transpose":
        return view_source(body, n.args[0])
    if n.op == "reshape":
        src = n.args[0]
        return view_source(body, src) if body.nodes[src].op in ("input", "reshape") else None
    return None


def computed_ancestors(body: Graph, i: int) -> set[int]:
    """The computed nodes (not inputs or constants) that node i depends on, i included."""
    return {j for j in body.ancestors(i) if body.nodes[j].op not in ("input", "const")}


def row_epilogue_fits(N: int, nparams: int, l1: int) -> bool:
    """Whether a GEMM's row epilogue handles rows of N: the row op walks a row of C in passes,
    which must stay in L1 next to its nparams parameter vectors (extraction asks this too, so
    that the optimizer does not choose a kernel that the backend would split)."""
    return N * F32 * (1 + nparams) <= l1


ROW_EPILOGUE_OPS = ("softmax", "layernorm", "rmsnorm")


def _match_gemm(body: Graph, facts: Facts) -> KernelShape | None:
    """One matmul or conv2d over kernel inputs, or one matmul whose operands are inputs read
    through a swap of their last two axes (x @ transpose(w), transpose(x) @ w, ...: the GEMM
    packs them so), its result flowing through pointwise ops."""
    heavy, inputs = facts.heavy, facts.inputs
    a = facts.single("contraction") or integer_bt(body, facts)
    if a is not None:
        n = body.nodes[a]
        check_epilogue(body, a, facts.out)
        computed = set(dynamic_qparams(body, a, inputs))  # (the zero point, computed from A's range)
        if integer_bt(body, facts) is not None:  # (B read transposed)
            computed.add(n.args[1])
        if not all(x in inputs | computed or (i == 0 and quantized_a(body, a, inputs) is not None)
                   for i, x in enumerate(n.args)):
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


def integer_bt(body: Graph, facts: Facts) -> int | None:
    """The matmul_integer whose B is transpose(b) of a 2-D kernel input b, read by it only, when
    those two are the body's only heavy ops: the integer GEMM packs B from b's [N, K] rows (a QDQ
    Gemm's transB weight, rule gemm_dequantized; qgemm's b_transposed)."""
    if len(facts.heavy) != 2:
        return None
    mm = next((i for i in facts.heavy if body.nodes[i].op == "matmul_integer"), None)
    if mm is None:
        return None
    t = body.nodes[mm].args[1]
    tn = body.nodes[t]
    if set(facts.heavy) != {mm, t} or not swaps_last_two(tn) or tn.type.rank != 2 or tn.args[0] not in facts.inputs:
        return None
    return mm if body.users()[t] == 1 else None


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
        if not ps or ps[-1] != N or math.prod(ps) != N:
            raise Split(f"the parameters of {rn.op} must be vectors of the row's length {N}")
    if machine is not None and not row_epilogue_fits(N, len(rn.args) - 1, machine.l1):
        raise Split("a row of the GEMM's row epilogue does not fit the L1 cache")


def output_tail(body: Graph, out: int) -> int:
    """The node below the transposes and reshapes that write a kernel's result in another
    layout (the head merge reshape(transpose(a, perm=[0, 2, 1, 3]))); out itself if none."""
    seen_transpose = False
    while body.nodes[out].op in ("transpose", "reshape"):
        n = body.nodes[out]
        if n.op == "reshape" and seen_transpose:
            break  # a reshape below a transpose is not a strided write
        seen_transpose |= n.op == "transpose"
        out = n.args[0]
    return out


def _pointwise_over_inputs(body: Graph, i: int) -> bool:
    return all(op_kind(body.nodes[j]) in ("pointwise", "input", "const") for j in body.ancestors(i))


def match_attention(body: Graph) -> KernelShape | None:
    """softmax(q @ k^T * scale [+ mask]) @ v, with pointwise ops allowed around the scores.

    q, k^T and v are kernel inputs read in place, possibly through layout views (view_source),
    and the result may be written through transposes (the head merge).
    """
    nodes = body.nodes
    result = output_tail(body, body.outputs[0])
    pv = next((i for i in body.ancestors(result)
               if nodes[i].op == "matmul" and nodes[nodes[i].args[0]].op == "softmax"), None)
    if pv is None:
        return None
    sm, v = nodes[pv].args
    smn = nodes[sm]
    if view_source(body, v) is None or smn.attr["axis"] % smn.type.rank != smn.type.rank - 1:
        return None
    # Walk the score expression down to the q @ k^T matmul; only pointwise ops with one
    # score-dependent operand on the way (scale, mask, bias).
    cur = smn.args[0]
    mask = None
    while nodes[cur].op != "matmul":
        n = nodes[cur]
        if op_kind(n) != "pointwise":
            return None
        # the operand that leads to the scores; the others are computed per score element from
        # kernel inputs alone (a scale, a mask input, where(mask, 0, -inf) of a bool mask)
        dep = [a for a in n.args if any(nodes[j].op == "matmul" for j in body.ancestors(a))]
        other = [a for a in n.args if a not in dep]
        if len(dep) != 1 or not all(_pointwise_over_inputs(body, o) for o in other):
            return None
        for o in other:
            if nodes[o].op == "input" and nodes[o].type.rank >= 2:
                mask = o
        cur = dep[0]
    qk = cur
    q, kt = nodes[qk].args
    if view_source(body, q) is None or view_source(body, kt) is None:
        return None
    views = body.ancestors(q) | body.ancestors(kt) | body.ancestors(v)
    tail = body.ancestors(body.outputs[0]) - body.ancestors(result)
    heavy = {i for i, n in enumerate(nodes) if op_kind(n) not in ("pointwise", "input", "const")}
    if heavy - {pv, sm, qk} - views - tail:
        return None
    return KernelShape(K.ATTENTION, pv, AttentionParts(q, kt, v, qk, sm, mask, result))


def trailing(body: Graph, a: int) -> bool:
    """Whether op a is a row op, or a reduction over the trailing axes of its input."""
    n = body.nodes[a]
    if OPS[n.op].kind != "reduce":
        return True
    rank = body.nodes[n.args[0]].type.rank
    axes = n.attr["axis"]
    axes = tuple(range(rank)) if axes is None else tuple(sorted(x % rank for x in axes))
    return axes == tuple(range(rank - len(axes), rank))


def match_single(body: Graph, facts: Facts, row: bool) -> int | None:
    """The row op or reduction of a row kernel (row=True) or of a reduce kernel (row=False)."""
    a = facts.single("row", "reduce")
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


ROW_OPS = ("softmax", "layernorm", "rmsnorm", "softmax_grad", "layernorm_grad")  # the rest are reductions


# The index ops that have a kernel (eqfuse.backend.kinds.index.BUILDERS has one builder each).
INDEX_KERNEL_OPS = frozenset({"range", "gather", "scatter_add", "gather_elements", "cumsum", "argmax", "topk", "tril",
                              "triu", "pad", "max_pool2d", "avg_pool2d", "pool2d_grad", "scatter_elements_add",
                              "dynamic_scale", "dynamic_zero_point", "dynamic_range"})


def _match_pointwise(body: Graph, facts: Facts, machine: Machine | None) -> KernelShape | None:
    return KernelShape(K.POINTWISE) if not facts.heavy else None


def _whole_kernel(body: Graph, facts: Facts, op_kind_: str, what: str) -> int | None:
    """The one op of kind op_kind_ when it is the whole kernel over kernel inputs."""
    a = facts.single(op_kind_)
    if a is None:
        return None
    n = body.nodes[a]
    if a != facts.out or not all(x in facts.inputs for x in n.args):
        raise Unsupported(f"{what} ({n.op}) must be the whole kernel, over kernel inputs")
    return a


def _match_layout(body: Graph, facts: Facts, machine: Machine | None) -> KernelShape | None:
    a = _whole_kernel(body, facts, "layout", "a layout op")
    return None if a is None else KernelShape(K.LAYOUT, a)


def _match_index(body: Graph, facts: Facts, machine: Machine | None) -> KernelShape | None:
    a = _whole_kernel(body, facts, "index", "an index op")
    if a is None:
        return None
    if body.nodes[a].op not in INDEX_KERNEL_OPS:
        raise Unsupported(f"the index op {body.nodes[a].op} has no kernel")
    return KernelShape(K.INDEX, a)


def _is_depthwise(body: Graph, i: int) -> bool:
    n = body.nodes[i]
    if n.op != "conv2d" or len(n.type.shape) != 4:
        return False
    C, O = body.nodes[n.args[0]].type.shape[1], n.type.shape[1]
    return n.attr.get("group", 1) == C == O and body.nodes[n.args[1]].type.shape[1] == 1


def _is_pointwise_conv(n: Node, body: Graph) -> bool:
    w = body.nodes[n.args[1]].type.shape
    return (n.op == "conv2d" and n.attr.get("group", 1) == 1 and tuple(w[2:]) == (1, 1)
            and pair(n.attr["stride"]) == (1, 1) and pair(n.attr["padding"]) == (0, 0))


def _match_dw_pw(body: Graph, facts: Facts, machine: Machine | None) -> KernelShape | None:
    """A 1x1 conv2d (stride 1, no padding, one group) over pointwise ops of a depthwise conv2d of
    kernel inputs, the 1x1 conv's weights and bias kernel inputs, its result flowing through
    pointwise ops: MobileNetV2's depthwise conv + batchnorm + ReLU6, then its projection +
    batchnorm (+ the residual add), as one kernel (rule fuse_dw_pw). The depthwise conv may read
    a 1x1 conv of kernel inputs through pointwise ops instead (the expand conv + batchnorm +
    ReLU6: the whole inverted residual, rule fuse_pw_dw)."""
    heavy = facts.heavy
    if len(heavy) not in (2, 3) or not all(body.nodes[i].op == "conv2d" for i in heavy):
        return None
    dw = next((i for i in heavy if _is_depthwise(body, i)), None)
    if dw is None:
        return None
    pw = next((i for i in heavy if i != dw and dw in body.ancestors(body.nodes[i].args[0])), None)
    ex = next((i for i in heavy if i not in (dw, pw)), None)
    if pw is None or not _is_pointwise_conv(body.nodes[pw], body):
        return None
    pn, dn = body.nodes[pw], body.nodes[dw]
    value = pn.args[0]
    if any(dw in body.ancestors(a) for a in pn.args[1:]):
        return None
    xv = None
    if ex is not None:
        xn = body.nodes[ex]
        xv = dn.args[0]
        if not _is_pointwise_conv(xn, body) or ex not in body.ancestors(xv) or \
                any(ex in body.ancestors(a) for a in dn.args[1:]):
            return None
        if not all(x in facts.inputs for x in xn.args) or not all(x in facts.inputs for x in dn.args[1:]):
            raise Unsupported("the weights and biases of a fused inverted residual must be kernel inputs")
        check_computable(body, xv, {ex})
        if tuple(body.nodes[xv].type.shape) != tuple(xn.type.shape):
            raise Split("the expand conv's activation broadcasts its result")
    elif not all(x in facts.inputs for x in dn.args):
        raise Unsupported("the weights and biases of a fused depthwise and 1x1 conv must be kernel inputs")
    if not all(x in facts.inputs for x in pn.args[1:]):
        raise Unsupported("the weights and biases of a fused depthwise and 1x1 conv must be kernel inputs")
    # the prologue (the depthwise conv's activation) is pointwise over the depthwise conv's
    # values and per-channel or scalar inputs; nothing after the 1x1 conv reads it
    check_computable(body, value, {dw})
    if tuple(body.nodes[value].type.shape) != tuple(dn.type.shape):
        raise Split("the depthwise conv's activation broadcasts its result")
    users = body.users()
    if any(users[j] != 1 for j in computed_ancestors(body, value)):
        raise Split("a value of the depthwise conv is read twice")
    check_epilogue(body, pw, facts.out)
    check_computable(body, facts.out, {pw}, forbid=computed_ancestors(body, value))
    _, C, OH, OW = dn.type.shape
    if ex is None and machine is not None and C * OH * OW * F32 > machine.l1 // DW_FUSE_L1_SHARE:
        raise Split(f"the depthwise conv's output of an image ({C} x {OH} x {OW}) is larger than L1 / "
                    f"{DW_FUSE_L1_SHARE}: the separate depthwise and 1x1 kernels are faster")
    _, _, H, W = body.nodes[dn.args[0]].type.shape
    if ex is not None and machine is not None and C * max(H * W, OH * OW) * F32 > machine.l1 // DW_EXPAND_L1_SHARE:
        raise Split(f"the depthwise conv's input or output of an image ({C} x {H} x {W}, {C} x {OH} x {OW}) is "
                    f"larger than L1 / {DW_EXPAND_L1_SHARE}: the expand conv as its own kernel is faster")
    if ex is not None and machine is not None and H * W < DW_EXPAND_MIN_PIXEL_VECTORS * machine.simd_floats:
        raise Split(f"the expand conv's image ({H} x {W}) is less than a vector of pixels: the expand conv as "
                    f"its own kernel is faster")
    if C * OW * F32 > DW_ROW_BYTES_MAX or (ex is not None and C * W * F32 > DW_ROW_BYTES_MAX):
        raise Split(f"a row of the depthwise conv's output or input ({C} channels x {max(OW, W)} pixels) is "
                    f"larger than {DW_ROW_BYTES_MAX} bytes")
    return KernelShape(K.CONV2D, pw, ConvPrologue(dw, value, ex, xv))


def _match_dw_ln(body: Graph, facts: Facts, machine: Machine | None) -> KernelShape | None:
    """A matmul over a layernorm (over the last axis) of the NHWC transpose of a depthwise
    conv2d of kernel inputs, the matmul's weights a kernel input matrix and its result flowing
    through pointwise ops: ConvNeXt's depthwise 7x7 conv, permute, LayerNorm and first Linear
    (+ its bias and GELU) as one kernel (rules fuse_dw_ln_mm*)."""
    heavy = facts.heavy
    if len(heavy) != 4 or sorted(body.nodes[i].op for i in heavy) != ["conv2d", "layernorm", "matmul", "transpose"]:
        return None
    mm, ln, tr, dw = (next(i for i in heavy if body.nodes[i].op == o) for o in ("matmul", "layernorm", "transpose", "conv2d"))
    mn, lnn, trn, dn = body.nodes[mm], body.nodes[ln], body.nodes[tr], body.nodes[dw]
    if not _is_depthwise(body, dw) or trn.args[0] != dw or lnn.args[0] != tr or mn.args[0] != ln:
        return None
    if tuple(trn.attr["perm"]) != (0, 2, 3, 1) or lnn.attr["axis"] % 4 != 3:
        return None
    if not all(x in facts.inputs for x in dn.args + lnn.args[1:] + mn.args[1:]):
        raise Unsupported("the weights and biases of a fused depthwise conv, layernorm and matmul must be kernel inputs")
    C = dn.type.shape[1]
    if tuple(body.nodes[mn.args[1]].type.shape)[:1] != (C,) or body.nodes[mn.args[1]].type.rank != 2 or \
            any(tuple(body.nodes[a].type.shape) != (C,) for a in lnn.args[1:]):
        return None
    users = body.users()
    if any(users[j] != 1 for j in (dw, tr, ln)):
        raise Split("a value of the depthwise conv or its layernorm is read twice")
    check_epilogue(body, mm, facts.out)
    check_computable(body, facts.out, {mm}, forbid={dw, tr, ln})
    _, _, OH, OW = dn.type.shape
    if C * OW * F32 > DW_ROW_BYTES_MAX:
        raise Split(f"a row of the depthwise conv's output ({C} channels x {OW} pixels) is larger than "
                    f"{DW_ROW_BYTES_MAX} bytes")
    if machine is not None and OH * OW < DWLN_MIN_PIXEL_VECTORS * machine.simd_floats:
        raise Split(f"the depthwise conv's image ({OH} x {OW}) is less than {DWLN_MIN_PIXEL_VECTORS} vectors of "
                    f"pixels: the separate depthwise, layernorm and matmul kernels are faster")
    return KernelShape(K.CONV2D, mm, ConvNorm(dw, tr, ln))


def _match_contraction(body: Graph, facts: Facts, machine: Machine | None) -> KernelShape | None:
    dtype = body.nodes[facts.out].type.dtype
    integer = [i for i in facts.heavy if body.nodes[i].op in ("matmul_integer", "conv_integer")]
    if integer and (len(facts.heavy) != 1 + (integer_bt(body, facts) is not None) or dtype not in ("f32", "i32", "u8", "i8")):
        # the integer GEMM (u8 x s8, csrc_templates/gemm_u8s8.c) takes a pointwise epilogue only,
        # and stores f32 (dequantized), its exact int32 sums or u8 / i8 (requantized: QLinearMatMul)
        what = body.nodes[integer[0]].op
        raise Unsupported(f"a {what} kernel is the integer GEMM with a pointwise epilogue, writing f32, i32, "
                          f"u8 or i8, not {dtype}" if dtype not in ("f32", "i32", "u8", "i8") else
                          f"a {what} kernel takes a pointwise epilogue only")
    if dtype != "f32" and not integer and any(facts.kinds[i] == "contraction" for i in facts.heavy):
        # the GEMM and conv templates store floats: a mask computed from a product (`x @ w > 0`,
        # as a relu's gradient reads) is a pointwise kernel of its own
        raise Unsupported(f"a matmul or conv2d kernel writes f32, not {dtype}")
    shape = _match_gemm(body, facts) or _match_dw_pw(body, facts, machine) or _match_dw_ln(body, facts, machine)
    if shape is not None:
        check_no_broadcast(body, shape.anchor, facts.out, shape.kind)
        return shape
    shape = _match_contraction_row(body, facts)
    if shape is not None:
        check_no_broadcast(body, shape.anchor, facts.out, K.CONTRACTION_ROW)
        _check_row_epilogue(body, shape, facts.out, machine)
    return shape


# The row ops whose template can store a quantized result (u8 / i8): a block of EQF_ROW_BLOCK(L)
# rows is computed in scratch rows of f32 on the thread's stack, and a last pass quantizes the
# block into the output (the plan's quantize_out, and quantize_flat: one loop over the block)
QUANTIZE_ROW_OPS = ("softmax", "layernorm", "rmsnorm")
# the most bytes of those scratch rows: a block of several rows is at most 8 rows of 64 (2 KB),
# so the bound is a single long row's, kept well inside a thread's stack (past it, the rule fusing
# the quantize is not taken: the quantize is a kernel of its own)
QUANTIZE_ROW_SCRATCH_MAX = 1 << 16


def quantized_row(body: Graph, a: int, out: int) -> bool:
    """Whether the row kernel of row op `a` stores a quantize_linear of its result (u8 / i8: its
    output node is that quantize; rules epilogue_*_quantize): its template then holds the row in
    scratch rows (quantize_out). Unsupported when the output is not f32 otherwise, or the scratch
    would not fit."""
    n, o = body.nodes[a], body.nodes[out]
    if o.type.dtype == "f32":
        return False
    if n.op not in QUANTIZE_ROW_OPS or o.op != "quantize_linear" or body.nodes[o.args[0]].type.dtype != "f32":
        raise Unsupported(f"a {n.op} kernel writes f32, or u8 / i8 through a quantize_linear of its "
                          f"softmax, layernorm or rmsnorm result; not {o.type.dtype}")
    shape = tuple(body.nodes[n.args[0]].type.shape)
    axis = n.attr["axis"] % len(shape) if n.op != "rmsnorm" else len(shape) - 1
    row = shape[axis:] if n.op != "softmax" else shape[axis:axis + 1]
    if not all(isinstance(d, int) for d in row):
        return True  # symbolic (extraction before dims are bound): decided once they are
    L = math.prod(row)
    if L * F32 > QUANTIZE_ROW_SCRATCH_MAX:
        raise Split(f"a quantized {n.op} row of {L} floats does not fit the kernel's scratch row "
                    f"({QUANTIZE_ROW_SCRATCH_MAX} bytes)")
    return True


def _match_row(body: Graph, facts: Facts, machine: Machine | None) -> KernelShape | None:
    a = match_single(body, facts, row=True)
    if a is None:
        return None
    if body.nodes[a].op not in ROW_OPS:
        check_reduce_epilogue(body, a, facts.out)
    else:
        quantized_row(body, a, facts.out)
    return KernelShape(K.ROW, a)


def _match_reduce(body: Graph, facts: Facts, machine: Machine | None) -> KernelShape | None:
    a = match_single(body, facts, row=False)
    if a is None:
        return None
    check_reduce_epilogue(body, a, facts.out)
    return KernelShape(K.REDUCE, a)


def _match_attention(body: Graph, facts: Facts, machine: Machine | None) -> KernelShape | None:
    shape = match_attention(body)
    if shape is None:
        return None
    p = shape.parts
    check_no_broadcast(body, shape.anchor, p.result, K.ATTENTION)
    check_computable(body, body.nodes[p.sm].args[0], {p.qk})  # the score expression
    check_computable(body, p.result, {shape.anchor}, {p.qk, p.sm})  # the epilogue
    return shape


def _match_attention_grad(body: Graph, facts: Facts, machine: Machine | None) -> KernelShape | None:
    a = _whole_kernel(body, facts, "attention_grad", "an attention gradient")
    return None if a is None else KernelShape(K.ATTENTION_GRAD, a)


@dataclass(frozen=True)
class Shape:
    """One kind's kernel shape: the plan kinds it gives, its description for error messages,
    and its match."""

    kinds: tuple[K, ...]
    supported: str
    match: Callable[[Graph, Facts, Machine | None], KernelShape | None]


# The order in which the shapes are asked: the shapes are disjoint, the order only decides
# which reason a body that no shape takes gets.
SHAPES: tuple[Shape, ...] = (
    Shape((K.POINTWISE,), "pointwise (a tree of pointwise ops over tensors and scalar constants)",
          _match_pointwise),
    Shape((K.LAYOUT, K.VIEW), "layout (one transpose, reshape, slice or concat of kernel inputs)", _match_layout),
    Shape((K.INDEX,), "index (one gather, gather_elements, scatter_add, scatter_elements_add, cumsum, argmax, topk, "
          "tril, triu, pad, pooling or pooling-gradient op over kernel inputs)", _match_index),
    Shape((K.CONTRACTION, K.CONV2D, K.CONTRACTION_ROW),
          "contraction with epilogue (one matmul or conv2d over kernel inputs, a matmul's operands possibly "
          "read through a swap of their last two axes, its result flowing through pointwise ops); "
          "contraction with row epilogue (one matmul whose result flows through pointwise ops into a "
          "softmax, layernorm or rmsnorm over its last axis, then pointwise ops)", _match_contraction),
    Shape((K.ROW,), "row-wise (one softmax, layernorm, rmsnorm, softmax_grad, layernorm_grad or sum/mean/max "
          "over the trailing axes, with a pointwise prologue and epilogue)", _match_row),
    Shape((K.REDUCE,), "reduction (one sum/mean/max over any axes, with a pointwise prologue and epilogue)",
          _match_reduce),
    Shape((K.ATTENTION,), "attention (softmax(q @ transpose(k) * scale [+ mask]) @ v, q, k and v possibly "
          "read through transposes and reshapes of kernel inputs, the result possibly written through "
          "transposes)", _match_attention),
    Shape((K.ATTENTION_GRAD,), "attention gradient (one attention_dq, attention_dk or attention_dv over "
          "kernel inputs)", _match_attention_grad),
)

_ORDER = (K.POINTWISE, K.CONTRACTION, K.ROW, K.REDUCE, K.ATTENTION, K.ATTENTION_GRAD, K.LAYOUT, K.INDEX)
SUPPORTED = "; ".join(next(s.supported for s in SHAPES if k in s.kinds) for k in _ORDER)


@dataclass(frozen=True)
class Peeled:
    """A GEMM kernel between transposes (rules add_through_nchw_*: ConvNeXt's residual add after
    its NHWC Linear and layer scale, moved before the permute back to NCHW): `body` is the GEMM
    and its epilogue; `sources[k]` says what its input k is, (the index of the outer body's input,
    the perm that input is read through, or None); `out_perm` is the transpose its result is
    written through. The backend lowers the transposes as layout ops around the GEMM kernel, a view
    that the epilogue reads at strides and a copy that the GEMM writes in place
    (eqfuse.backend.views, eqfuse.backend.stores)."""

    body: Graph
    sources: tuple[tuple[int, tuple[int, ...] | None], ...]
    out_perm: tuple[int, ...]


def peel_transposes(body: Graph) -> Peeled | None:
    """The GEMM kernel inside `body` when body is transpose(e) of a matmul's pointwise epilogue e
    whose other operands may be inputs read through transposes (only by pointwise ops); None
    otherwise."""
    out = body.outputs[0]
    on = body.nodes[out]
    if on.op != "transpose" or body.nodes[on.args[0]].op in ("input", "const"):
        return None
    users: dict[int, list[int]] = {}
    for i, n in enumerate(body.nodes):
        for a in n.args:
            users.setdefault(a, []).append(i)
    peeled = {i for i, n in enumerate(body.nodes)
              if n.op == "transpose" and i != out and body.nodes[n.args[0]].op == "input"
              and all(op_kind(body.nodes[u]) == "pointwise" for u in users.get(i, []))}
    inner = Graph(body.name)
    ids: dict[int, int] = {}
    sources: list[tuple[int, tuple[int, ...] | None]] = []
    for i, n in enumerate(body.nodes):
        if i == out:
            continue
        if n.op == "input" and any(u not in peeled for u in users.get(i, [])):
            ids[i] = inner.add(n)
            inner.inputs.append(ids[i])
            sources.append((body.inputs.index(i), None))
        elif n.op == "input":
            continue
        elif i in peeled:
            ids[i] = inner.add(Node("input", type=n.type, name=body.nodes[n.args[0]].name))
            inner.inputs.append(ids[i])
            sources.append((body.inputs.index(n.args[0]), _perm(n)))
        else:
            ids[i] = inner.add(replace(n, args=tuple(ids[a] for a in n.args)))
    inner.outputs = [ids[on.args[0]]]
    try:
        shape = _match_gemm(inner, Facts.of(inner))
    except Unsupported:
        return None
    if shape is None or inner.nodes[shape.anchor].op != "matmul":
        return None
    return Peeled(inner, tuple(sources), _perm(on))


def _perm(n: Node) -> tuple[int, ...]:
    """A transpose's perm (none given: the axes reversed)."""
    return tuple(n.attr["perm"] or reversed(range(n.type.rank)))


def uneven_pads_conv(body: Graph, shape: KernelShape) -> int | None:
    """The conv2d of a kernel that may be padded unevenly ([top, left, bottom, right], rule
    kernel_conv2d_pad_same), the one decision the planners follow: the depthwise conv of a fused
    depthwise and 1x1 conv (conv_dwpw: its band copy zero-fills whatever a tap reads outside the
    image), or a grouped conv as its own kernel (conv_grouped, every path: the padded plane, band
    and tile copies fill only the image's rows and columns and zero the rest, sized by the output's
    rows and columns), so only the top and left padding are constants. None: every conv of the
    kernel must be padded evenly (a dense conv's im2col and direct kernels; a depthwise conv
    fused with its layernorm)."""
    if isinstance(shape.parts, ConvPrologue):
        return shape.parts.dw
    a = body.nodes[shape.anchor] if shape.kind == K.CONV2D and shape.parts is None else None
    if a is not None and a.op == "conv2d" and a.attr.get("group", 1) != 1:
        return shape.anchor
    return None


def _check_uneven_pads(body: Graph, shape: KernelShape) -> None:
    """Unsupported when a conv2d other than uneven_pads_conv's is padded unevenly: the other
    kernels keep the pad op before the conv (extraction takes that form)."""
    allowed = uneven_pads_conv(body, shape)
    for i, n in enumerate(body.nodes):
        if n.op == "conv2d" and i != allowed and symmetric_pads(n.attr["padding"]) is None:
            raise Unsupported(f"conv2d padding {list(n.attr['padding'])} (uneven) is lowered only by a grouped "
                              "or depthwise conv kernel; write the pad op before the conv")


def classify(body: Graph, machine: Machine | None = None) -> KernelShape:
    """The kernel shape of a kernel body; Unsupported with the reason when no kind lowers it,
    Split when its kind lowers it only as separate kernels (on `machine`, when given: the
    planner's caches). A GEMM between transposes (peel_transposes) is the GEMM's."""
    peeled = peel_transposes(body)
    if peeled is not None:
        return classify(peeled.body, machine)
    facts = Facts.of(body)
    for shape in SHAPES:
        found = shape.match(body, facts, machine)
        if found is not None:
            _check_uneven_pads(body, found)
            return found
    names = ", ".join(body.nodes[i].op for i in facts.heavy)
    raise Unsupported(f"the kernel mixes {names}; it must have at most one non-pointwise op")
