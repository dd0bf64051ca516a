"""The blocked channel layout between convs: which tensors a compiled graph stores as
[N][C / VL][H][W][VL], VL floats per vector (the machine's), decided once every kernel is planned.

A direct conv (conv_direct.c) reads its input a pixel's channel block at a time and computes a
register tile of pixels x channel vectors: in the blocked layout its input copy is a row copy
and its store a vector store, where NCHW costs a gather and a transposition. A conv on AMX tiles
(conv_amx.c) computes pixel-major tiles, a pixel's 32 channels a row: in the blocked layout its
output is VL channels a store and its input's bf16 copy a conversion of VL channels at a time,
where NCHW costs a transposition each way. `block_between_convs` stores so every tensor whose
producer can write the layout and whose every reader can read it, and that is neither a graph
output nor written into another tensor's storage.
- Producers: direct convs (channels in the lanes), convs on AMX tiles (and the max pool one
  computes: conv_amx.pool_into_amx_conv) but those that write the next conv's bf16 copy
  (conv_amx.copy_between_amx_convs), and max / avg pooling.
- Readers: a direct conv's input x, and a conv's on AMX tiles but a folded one's; an operand of
  either's epilogue of the conv's own shape (a residual add: read at the output element's
  blocked offset, `blk`); pooling's input; and a 1x1 conv planned as im2col + GEMM, which is
  planned again as a direct conv (its input then needs no conversion; MLAS runs its NCHWc 1x1
  convs the same way).
The graph's inputs and outputs, and every tensor any other kernel reads, stay NCHW: the layout
changes only inside. The values are the same in either layout: only where they are changes.
"""

from __future__ import annotations

import os
from dataclasses import replace

from eqfuse.backend.kinds.contraction.conv import ConvDirectDetail, mark_bound, plan_conv_direct
from eqfuse.backend.kinds.contraction.conv_amx import ConvAmxDetail
from eqfuse.backend.plan import KernelPlan
from eqfuse.ir.graph import Graph
from eqfuse.ir.kernels import K
from eqfuse.machine import Machine

POOL_OPS = ("max_pool2d", "avg_pool2d")


def _is_pool(q: KernelPlan) -> bool:
    return q.kind == K.INDEX and getattr(q.detail, "op", None) in POOL_OPS


def _conv_input(q: KernelPlan, x: int) -> bool:
    """Whether body input x is the kernel's conv2d input and read by nothing else in it."""
    body = q.body
    return body.nodes[q.shape.anchor].args[0] == x and sum(a == x for n in body.nodes for a in n.args) == 1


def _direct_1x1(q: KernelPlan) -> bool:
    """An im2col conv that the direct kernel can run instead: a 1x1 window, no views, its own
    storage (the direct kernel writes NCHW contiguous or blocks)."""
    if q.kind != K.CONV2D or isinstance(q.detail, ConvDirectDetail) or q.in_strides or q.into is not None \
            or q.out_strides is not None or q.shape.parts is not None:  # (parts: a depthwise prologue)
        return False
    cv = q.body.nodes[q.shape.anchor]
    if cv.attr.get("group", 1) != 1 or q.precision_path == "amx_bf16":
        return False  # (a grouped conv: conv_grouped; on AMX tiles: the GEMM, use_direct)
    return tuple(q.body.nodes[cv.args[1]].type.shape[2:]) == (1, 1) and tuple(cv.type.shape) == tuple(q.out_shape)


def reads_blocked(q: KernelPlan, k: int, vl: int) -> str | None:
    """How q can read its argument k in blocks of vl channels: "x" (a direct conv's input),
    "operand" (an operand of a direct conv's epilogue, of the output's shape), "pool" (pooling's
    input), "replan" (the input of a 1x1 conv to plan again as direct); None: it cannot."""
    body = q.body
    x = body.inputs[k]
    shape = tuple(body.nodes[x].type.shape)
    if len(shape) != 4 or shape[1] % vl or body.nodes[x].type.dtype != "f32" or k in q.in_strides:
        return None
    d = q.detail
    if _is_pool(q):
        return "pool"
    if isinstance(d, ConvDirectDetail):
        if d.pixels or d.vl != vl:
            return None
        cv = body.nodes[q.shape.anchor]
        if _conv_input(q, x):
            return "x" if d.cb == vl else None
        if x in cv.args or shape != tuple(q.out_shape) or d.O % vl:
            return None
        return "operand"
    if isinstance(d, ConvAmxDetail):  # (its copy's rows from blocks; its epilogue's operands at blk)
        if not _amx_blocks():
            return None
        if _conv_input(q, x):
            return "x" if not d.fold and not d.in_copy else None
        cv = body.nodes[q.shape.anchor]
        return "operand" if x not in cv.args and shape == tuple(q.out_shape) and d.O % vl == 0 else None
    if _direct_1x1(q) and _conv_input(q, x):
        return "replan"
    return None


def _amx_blocks() -> bool:
    """Whether convs on AMX tiles take part (EQFUSE_CONV_AMX_BLOCKED=0 keeps their tensors NCHW,
    to measure both)."""
    return os.environ.get("EQFUSE_CONV_AMX_BLOCKED", "").strip() != "0"


def _writes_blocked(p: KernelPlan, vl: int) -> bool:
    d = p.detail
    if isinstance(d, ConvDirectDetail):
        return not d.pixels and d.vl == vl and d.O % vl == 0
    if isinstance(d, ConvAmxDetail):  # (a pixel's channels VL to a store; with its pool, the pool's)
        return _amx_blocks() and not d.next_copy and p.out_shape[1] % vl == 0 and d.O % vl == 0
    # a pool writes blocks only from blocks: from NCHW, each tap of a pixel's VL channels is a
    # gather of VL planes (a ResNet-18 stem's 3x3/2 pool of 2 x 16 x 32 x 32 was several times
    # slower than the NCHW pool and the next conv's own copy into blocks)
    return _is_pool(p) and p.out_shape[1] % vl == 0 and p.body.nodes[p.shape.anchor].type.dtype == "f32" \
        and p.detail.in_blocked


def _replan_direct(q: KernelPlan, m: Machine) -> None:
    """Plan the im2col 1x1 conv q again as a direct conv (its bound weights blocked once)."""
    old = q.prepack
    q.tiles, q.detail, q.uops = {}, None, []
    assert plan_conv_direct(q, m, force=True)
    if old is not None:
        mark_bound(q, {q.body.inputs[old.arg]})


def block_between_convs(kg: Graph, plans: list[KernelPlan], m: Machine) -> None:
    """Store in blocks of VL channels every tensor whose producer can write them and whose
    readers can all read them (see the module's docstring); a 1x1 conv among the readers is
    planned again as a direct conv. Each plan's detail records which of its tensors are blocked:
    in_blocked / out_blocked, and for a direct conv `blocked_args`, the epilogue operands."""
    vl = m.simd_floats
    readers: dict[int, list[tuple[KernelPlan, int]]] = {}
    for q in plans:
        for k, a in enumerate(q.args):
            readers.setdefault(a, []).append((q, k))
    changed = True
    while changed:  # (a 1x1 conv planned again as direct can then write blocks itself)
        changed = False
        for p in plans:
            if getattr(p.detail, "out_blocked", False) or not _writes_blocked(p, vl) or p.node in kg.outputs \
                    or p.into is not None or p.out_strides is not None:
                continue
            rs = readers.get(p.node, [])
            how = [reads_blocked(q, k, vl) for q, k in rs]
            if not rs or None in how:
                continue
            changed = True
            _mark_out(p, vl)
            for (q, k), h in zip(rs, how):
                if h == "replan":
                    _replan_direct(q, m)
                    h = "x"
                _mark_in(q, k, h, vl)


def _mark_out(p: KernelPlan, vl: int) -> None:
    p.detail = replace(p.detail, out_blocked=True, **({"vl": vl, "pool_s2": False} if _is_pool(p) else
                                                      {"vl": vl} if isinstance(p.detail, ConvAmxDetail) else {}))
    p.uops = [replace(u, what=f"{u.what}, into blocks of {vl} channels (read so by the next kernels)")
              if u.op == "Store" else u for u in p.uops]


def _mark_in(q: KernelPlan, k: int, how: str, vl: int) -> None:
    if how == "operand":
        q.detail = replace(q.detail, blocked_args=tuple(sorted(set(q.detail.blocked_args) | {k})),
                           **({"vl": vl} if isinstance(q.detail, ConvAmxDetail) else {}))
        return
    # read in place along output rows (the padded copy cost a few percent of a 3x3 conv at 56 x 56,
    # 64 channels); EQFUSE_CONV_INPLACE=0 keeps the copy (to measure both with benchmarks/bench_conv.py)
    if how == "pool":  # (the blocked pooling has no stride-2 path of its own)
        q.detail = replace(q.detail, in_blocked=True, vl=vl, pool_s2=False)
        return
    if isinstance(q.detail, ConvAmxDetail):
        q.detail = replace(q.detail, in_blocked=True, vl=vl)
        q.uops = [replace(u, what=u.what.replace("input to a pixel-major bf16 copy", "input, in blocks already, to "
                                                 "a pixel-major bf16 copy (a pixel's channels, VL at a time)"))
                  if u.op == "Load" else u for u in q.uops]
        return
    # (bf16: never in place, the copy rounds the input to bf16)
    in_place = q.detail.rows and q.precision != "bf16" and os.environ.get("EQFUSE_CONV_INPLACE", "1") != "0"
    q.detail = replace(q.detail, in_blocked=True, in_place=in_place)
    what = ("input, in blocks already, read in place (a tile's window copied, zero padded, at the image's left "
            "and right edges)" if in_place else "input, in blocks already, to a zero-padded copy (a row copy)"
            + (", rounded to bf16" if q.precision == "bf16" else ""))
    q.uops = [replace(u, what=what) if u.what.startswith("input to a zero-padded copy") else u for u in q.uops]
