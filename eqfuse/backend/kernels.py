"""Which fused kernel bodies the C backend can lower: the kernel shapes of SPEC section 1.

The optimizer asks `classify` whether a candidate kernel is legal; the backend asks it how to
lower one; the graph builder asks it to refuse a hand-written kernel block it cannot lower.
"""

from __future__ import annotations

from dataclasses import dataclass

from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.ops import OPS

SUPPORTED = (
    "pointwise (a tree of pointwise ops over tensors and scalar constants); "
    "contraction with epilogue (one matmul or conv2d over kernel inputs, a matmul's operands possibly "
    "read through a swap of their last two axes, its result flowing through pointwise ops); contraction with row epilogue (one matmul whose result flows through pointwise ops "
    "into a softmax, layernorm or rmsnorm over its last axis, then pointwise ops); row-wise (one softmax, "
    "layernorm, rmsnorm or sum/mean/max over the trailing axes, "
    "with a pointwise prologue and epilogue); reduction (one sum/mean/max over any axes, with a "
    "pointwise prologue and epilogue); attention (softmax(q @ transpose(k) * scale [+ mask]) @ v, "
    "q, k and v possibly read through transposes and reshapes of kernel inputs, the result possibly "
    "written through transposes); layout (one transpose, reshape, slice or concat of kernel inputs); "
    "index (one gather, gather_elements, scatter_add, cumsum, argmax, tril, triu, pad or pooling op over kernel inputs)"
)


class Unsupported(Exception):
    """The body is not a kernel shape the backend lowers; the message says why."""


@dataclass(frozen=True)
class KernelShape:
    kind: str  # pointwise | contraction | contraction_row | row | reduce | attention | layout
    anchor: int | None = None  # the body node of the matmul/conv2d, row/reduce op, or attention's last matmul
    # contraction_row: (the row op,); anchor is the matmul
    # attention: body node ids (q, k^T, v, scores matmul, softmax, mask input or None, result),
    # q, k^T and v being inputs or views of inputs (view_source), result the value before any
    # output transposes (see _attention)
    parts: tuple = ()


def _kind(n: Node) -> str:
    if n.op in ("input", "const"):
        return n.op
    if n.op == "kernel":
        return "kernel"
    k = OPS[n.op].kind
    return "pointwise" if k == "channel" else k


def _swaps_last_two(n: Node) -> bool:
    if n.op != "transpose" or n.type.rank < 2:
        return False
    perm = n.attr["perm"] or tuple(reversed(range(n.type.rank)))
    r = n.type.rank
    return tuple(perm) == tuple(range(r - 2)) + (r - 1, r - 2)


def classify(body: Graph) -> KernelShape:
    """The kernel shape of a kernel body, or Unsupported with the reason."""
    ops = [(i, n) for i, n in enumerate(body.nodes) if n.op not in ("input", "const")]
    if not ops:
        raise Unsupported("the kernel computes nothing")
    kinds = {i: _kind(n) for i, n in ops}
    if "kernel" in kinds.values():
        raise Unsupported("kernel blocks cannot be nested")
    heavy = [i for i, k in kinds.items() if k != "pointwise"]
    out = body.outputs[0]
    if not heavy:
        return KernelShape("pointwise")

    if body.nodes[out].type.dtype != "f32" and any(kinds[i] == "contraction" for i in heavy):
        # the GEMM and conv templates store floats: a mask computed from a product (`x @ w > 0`,
        # as a relu's gradient reads) is a pointwise kernel of its own
        raise Unsupported(f"a matmul or conv2d kernel writes f32, not {body.nodes[out].type.dtype}")
    inputs = set(body.inputs)
    if len(heavy) == 1:
        a = heavy[0]
        n = body.nodes[a]
        k = kinds[a]
        if k in ("layout", "index"):
            if a != out or not all(x in inputs for x in n.args):
                raise Unsupported(f"a {k} op ({n.op}) must be the whole kernel, over kernel inputs")
            return KernelShape(k, a)
        _check_epilogue(body, a, out)
        if k == "contraction":
            if not all(x in inputs for x in n.args):
                raise Unsupported(f"the operands of {n.op} must be kernel inputs (tensors in memory), "
                                  "not values computed inside the kernel")
            return KernelShape("contraction", a)
        if k in ("row", "reduction"):
            for x in n.args[1:]:
                if x not in inputs:
                    raise Unsupported(f"the parameters of {n.op} must be kernel inputs")
            return KernelShape("row" if k == "row" or _trailing(body, a) else "reduce", a)
    # Contraction whose operands are inputs read through a swap of their last two axes:
    # x @ transpose(w), transpose(x) @ w, transpose(x) @ transpose(w) (the GEMM packs them so).
    mms = [i for i in heavy if body.nodes[i].op == "matmul"]
    if len(mms) == 1 and len(heavy) in (2, 3):
        m = mms[0]
        mn, users = body.nodes[m], body.users()
        swaps = set(heavy) - {m}

        def operand_ok(x: int) -> bool:
            if x in inputs:
                return True
            xn = body.nodes[x]
            return x in swaps and _swaps_last_two(xn) and xn.args[0] in inputs and users[x] == 1

        if swaps <= set(mn.args) and all(operand_ok(x) for x in mn.args):
            _check_epilogue(body, m, out)
            return KernelShape("contraction", m)
    crow = _contraction_row(body, heavy, inputs)
    if crow is not None:
        return crow
    att = _attention(body)
    if att is not None:
        return att
    names = ", ".join(body.nodes[i].op for i in heavy)
    raise Unsupported(f"the kernel mixes {names}; it must have at most one non-pointwise op")


ROW_EPILOGUE_OPS = ("softmax", "layernorm", "rmsnorm")


def _contraction_row(body: Graph, heavy: list[int], inputs: set[int]) -> KernelShape | None:
    """rowop(pointwise(A @ B), params...) followed by pointwise ops: a GEMM whose finished rows
    of C go through a softmax, layernorm or rmsnorm over the last axis (the GEMM's N) before the
    store. A and B are kernel inputs (B possibly under a swap of its last two axes), the row op's
    parameters are kernel inputs, and the ops after the row op read only it, each other, kernel
    inputs and constants (the pre-row-op values are gone by then: C holds the row op's input)."""
    nodes = body.nodes
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
        if len(rest) != 1 or b != t or not _swaps_last_two(nodes[t]) or nodes[t].args[0] not in inputs \
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
    out = body.outputs[0]
    after = {i for i in body.ancestors(out) if r in body.ancestors(i)}
    if r not in after:
        return None
    for i in after - {r}:
        for x in nodes[i].args:
            if x not in after and nodes[x].op not in ("input", "const"):
                return None
    return KernelShape("contraction_row", m, parts=(r,))


def _trailing(body: Graph, a: int) -> bool:
    n = body.nodes[a]
    if OPS[n.op].kind != "reduction":
        return True
    rank = body.nodes[n.args[0]].type.rank
    axes = n.attr["axis"]
    axes = tuple(range(rank)) if axes is None else tuple(sorted(x % rank for x in axes))
    return axes == tuple(range(rank - len(axes), rank))


def _check_epilogue(body: Graph, anchor: int, out: int) -> None:
    """Every op after the anchor must be pointwise and lie on the way to the output."""
    if anchor not in body.ancestors(out):
        raise Unsupported("the kernel's result does not depend on its main op")


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


def _output_tail(body: Graph, out: int) -> int:
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
    return all(_kind(body.nodes[j]) in ("pointwise", "input", "const") for j in body.ancestors(i))


def _attention(body: Graph) -> KernelShape | None:
    """softmax(q @ k^T * scale [+ mask]) @ v, with pointwise ops allowed around the scores.

    q, k^T and v are kernel inputs read in place, possibly through layout views (view_source),
    and the result may be written through transposes (the head merge). parts holds the body
    ids (q, kT, v, scores matmul, softmax, mask or None, result) where kT is k^T as the scores
    matmul reads it and result is the attention value (with its epilogue) before the output
    transposes.
    """
    nodes = body.nodes
    result = _output_tail(body, body.outputs[0])
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
        if _kind(n) != "pointwise":
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
    heavy = {i for i, n in enumerate(nodes) if _kind(n) not in ("pointwise", "input", "const")}
    if heavy - {pv, sm, qk} - views - tail:
        return None
    return KernelShape("attention", pv, parts=(q, kt, v, qk, sm, mask, result))
