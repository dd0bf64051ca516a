"""Stage `lower`: fused graph -> kernel plans, as data.

A plan says how one kernel runs: its kind (the kernel shape of SPEC 1), the index spaces and
loop nest, the tile sizes chosen from this machine's caches (and checked against them), the
tile-level micro-op schedule (Load / Exec / Store with counts, printed by `eqfuse lower --uops`)
and its bytes moved and FLOPs. `emit` turns plans into C; nothing here writes C.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import EqfuseError
from .graph import Graph, Node
from .kernels import SUPPORTED, KernelShape, Unsupported, classify
from .ops import OPS, reduce_axes

F32 = 4  # bytes per element


class Split(Exception):
    """A body classify accepts but this backend lowers only as separate single-op kernels."""


@dataclass(frozen=True)
class UOp:
    depth: int  # nesting level in the printed schedule
    op: str  # Loop | Load | Exec | Store
    what: str
    count: int = 1  # how many times it runs in one call


@dataclass
class KernelPlan:
    name: str
    kind: str  # pointwise | contraction | conv2d | row | reduce | attention | layout | view
    node: int  # the kernel node at the graph's top level
    args: tuple[int, ...]  # top-level node ids read, one per body input
    body: Graph
    shape: KernelShape
    out_shape: tuple[int, ...]
    tiles: dict[str, int] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)
    uops: list[UOp] = field(default_factory=list)
    bytes: int = 0
    flops: int = 0
    cache_check: str = ""


# ------------------------------------------------------------------ the machine


@dataclass(frozen=True)
class Caches:
    l1: int
    l2: int
    l3: int
    simd: int  # float lanes per vector
    cores: int


def machine_caches() -> Caches:
    """This machine's caches, read from the system by eqfuse.machine (EQFUSE_L1/L2/L3 override)."""
    from . import machine

    m = machine.machine()
    return Caches(m.l1, m.l2, m.l3, m.simd_floats, m.cores)


# ------------------------------------------------------------------ graph -> kernels only


def _single_op_kernel(out: Graph, ids: dict[int, int], n: Node) -> int:
    """Add op n (its args given as ids of nodes already in `out`) as a one-op kernel of `out`."""
    body = Graph("kernel")
    args: list[int] = []
    body_args = []
    seen: dict[int, int] = {}
    for a in (ids[x] for x in n.args):
        an = out.nodes[a]
        if an.op == "const":
            body_args.append(body.add(Node("const", attrs=an.attrs, type=an.type)))
        elif a not in seen:
            seen[a] = body.add(Node("input", type=an.type, name=an.name or f"t{a}"))
            body.inputs.append(seen[a])
            args.append(a)
            body_args.append(seen[a])
        else:
            body_args.append(seen[a])
    body.outputs = [body.add(Node(n.op, tuple(body_args), n.attrs, n.type, pos=n.pos))]
    return out.add(Node("kernel", tuple(args), (), n.type, name=n.name, pos=n.pos, body=body))


def kernelize(g: Graph, fuse: bool = True, split: frozenset[int] = frozenset()) -> Graph:
    """The graph with only input/const/kernel nodes at top level.

    Kernel blocks stay (unless fuse=False or their id is in `split`: then their bodies are
    inlined); every other op becomes a kernel of its own.
    """
    out = Graph(g.name, pos=g.pos)
    mapping: dict[int, int] = {}
    for i, n in enumerate(g.nodes):
        if n.op in ("input", "const"):
            mapping[i] = out.add(n)
        elif n.op == "kernel" and fuse and i not in split:
            mapping[i] = out.add(replace(n, args=tuple(mapping[a] for a in n.args)))
        elif n.op == "kernel":
            inner = {bi: mapping[a] for bi, a in zip(n.body.inputs, n.args)}
            for bi, bn in enumerate(n.body.nodes):
                if bn.op == "const":
                    inner[bi] = out.add(bn)
                elif bn.op != "input":
                    inner[bi] = _single_op_kernel(out, inner, bn)
            mapping[i] = inner[n.body.outputs[0]]
        else:
            mapping[i] = _single_op_kernel(out, mapping, n)
    out.inputs = [mapping[i] for i in g.inputs]
    out.outputs = [mapping[o] for o in g.outputs]
    return out


# ------------------------------------------------------------------ planning


def _size(shape) -> int:
    return math.prod(shape) if shape else 1


def _reads(plan_body: Graph) -> int:
    return sum(_size(plan_body.nodes[i].type.shape) for i in plan_body.inputs)


def _pointwise_flops(body: Graph, skip: set[int] = frozenset()) -> int:
    total = 0
    for i, n in enumerate(body.nodes):
        if n.op in ("input", "const") or i in skip or n.op not in OPS:
            continue
        op = OPS[n.op]
        if op.kind in ("pointwise", "channel"):
            total += op.flops * _size(n.type.shape)
    return total


def _vec(n: int, simd: int) -> int:
    return max(1, -(-n // simd))


def plan_kernel(g: Graph, node_id: int, name: str, caches: Caches) -> KernelPlan:
    n = g.nodes[node_id]
    body = n.body
    for _, _, bn in body.walk():
        if not bn.type.concrete:
            raise EqfuseError(f"kernel {name} has unbound dimensions ({bn.type}); bind them with dims=", n.pos)
    try:
        ks = classify(body)
    except Unsupported as why:
        raise EqfuseError(f"this kernel block cannot be lowered: {why}", n.pos,
                          f"supported kernel shapes: {SUPPORTED}") from None
    out_shape = tuple(body.nodes[body.outputs[0]].type.shape)
    plan = KernelPlan(name, ks.kind, node_id, tuple(n.args), body, ks, out_shape)
    plan.bytes = F32 * (_reads(body) + _size(out_shape))
    {"pointwise": _plan_pointwise, "contraction": _plan_contraction, "contraction_row": _plan_contraction,
     "row": _plan_row,
     "reduce": _plan_reduce, "attention": _plan_attention, "layout": _plan_layout,
     "index": _plan_index}[ks.kind](plan, caches)
    return plan


def _ins(plan: KernelPlan) -> list[str]:
    return [plan.body.nodes[i].name or f"in{k}" for k, i in enumerate(plan.body.inputs)]


def _ops_text(body: Graph, skip=()) -> str:
    names = [n.op for i, n in enumerate(body.nodes) if n.op not in ("input", "const") and i not in skip]
    return ", ".join(names)


# Elements per tile of a streaming pointwise kernel: a multiple of 16 (tiles start on 64-byte
# lines of the output); nothing of it is kept in cache, it only amortizes the per-tile set-up.
STREAM_TILE = 4096
STREAM_MIN_INNER = 64  # streaming needs whole output lines: inner loops shorter than this store normally


def _inner_extent(plan: KernelPlan) -> int:
    """Elements of the pointwise kernel's inner loop: the innermost dims every operand walks
    with one stride (as emit_pointwise groups them)."""
    from .indexing import bstrides, contiguous, joint_groups, leaf_views

    shape = plan.out_shape
    sets = [bstrides(v, shape) for v in leaf_views(plan.body, plan.body.outputs[0])] + [contiguous(shape)]
    groups = joint_groups(shape, sets)
    return _size([shape[d] for d in groups[-1]]) if groups else 1


def _plan_pointwise(plan: KernelPlan, c: Caches) -> None:
    total = _size(plan.out_shape)
    streams = len(plan.body.inputs) + 1
    # Outputs beyond this core count's share of the last-level cache bypass it (non-temporal
    # stores). The L3 the system reports may be the whole socket's (480 MiB on some shared
    # hosts), so the share is capped at 8 L2s per core.
    stream_bytes = min(c.l3 // 2, 8 * c.l2 * c.cores)
    inner = _inner_extent(plan)
    f32_out = plan.body.nodes[plan.body.outputs[0]].type.dtype == "f32"  # streamed lines are 16 floats
    stream = f32_out and total * F32 >= stream_bytes and inner >= STREAM_MIN_INNER
    if stream:
        # Each whole output line is computed in registers and streamed out (4 input/output
        # streams overlapped; the earlier 1024-element L1 buffer copied out afterwards ran
        # ~15-20% slower on 16M elements here).
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
    plan.tiles = {"tile": tile, "stream_bytes": stream_bytes, "stream": int(stream)}
    plan.flops = _pointwise_flops(plan.body)
    ntiles = -(-total // tile)
    ops = _ops_text(plan.body)
    plan.uops = [UOp(0, "Loop", f"t over {ntiles} tiles of {min(tile, total)} elements (parallel)", ntiles)]
    for nm, i in zip(_ins(plan), plan.body.inputs):
        plan.uops.append(UOp(1, "Load", f"{nm} tile [{min(tile, total)}] (broadcast {list(plan.body.nodes[i].type.shape)})", ntiles))
    plan.uops.append(UOp(1, "Exec", f"{ops} on {_vec(min(tile, total), c.simd)} vectors", ntiles))
    plan.uops.append(UOp(1, "Store", f"out tile [{min(tile, total)}]" + (" (non-temporal)" if stream else ""), ntiles))


def _gemm_blocking(M: int, N: int, K: int, c: Caches) -> dict[str, int]:
    """BLIS blocking from eqfuse.machine, each block no larger than the problem needs."""
    from . import machine
    from .gemm import MR, NR

    mc, nc, kc, mr, nr = machine.gemm_blocking(mr=MR, nr=NR)
    up = lambda x, q: -(-x // q) * q  # noqa: E731
    return {"mc": min(mc, up(M, mr)), "nc": min(nc, up(N, nr)), "kc": min(kc, K), "mr": mr, "nr": nr}


def _plan_contraction(plan: KernelPlan, c: Caches) -> None:
    from .gemm import direct as gemm_direct

    body, a = plan.body, plan.shape.anchor
    mm = body.nodes[a]
    if mm.type.shape != plan.out_shape:
        raise Split("the epilogue broadcasts the contraction's result to a larger shape")
    if mm.op == "conv2d":
        plan.kind = "conv2d"
        x, w = (body.nodes[i].type.shape for i in mm.args[:2])
        N, C, H, W = x
        O, _, KH, KW = w
        _, _, OH, OW = mm.type.shape
        M, Nn, K, batch = O, OH * OW, C * KH * KW, N
        plan.detail = {"M": M, "N": Nn, "K": K, "batch": batch}
        plan.flops = 2 * N * O * OH * OW * K + _pointwise_flops(body)
    else:
        A, B = mm.args
        anode, bnode = body.nodes[A], body.nodes[B]
        transposed, a_transposed = bnode.op == "transpose", anode.op == "transpose"
        ashape = anode.type.shape  # (the transpose's shape when A is read through one)
        bshape = body.nodes[bnode.args[0]].type.shape if transposed else bnode.type.shape
        M, K = ashape[-2], ashape[-1]
        Nn = bshape[-2] if transposed else bshape[-1]
        batch = _size(mm.type.shape[:-2])
        plan.detail = {"M": M, "N": Nn, "K": K, "batch": batch, "b_transposed": transposed,
                       "a_transposed": a_transposed}
        if batch > 1 and _size(bshape[:-2]) == 1 and tuple(ashape[:-2]) == tuple(mm.type.shape[:-2]) \
                and not a_transposed:
            M, batch = M * batch, 1  # B shared by every batch: one GEMM over all rows (see emit)
        plan.detail["gemm"] = {"M": M, "batch": batch}
        plan.flops = 2 * batch * M * Nn * K + _pointwise_flops(body)
    blk = _gemm_blocking(M, Nn, K, c)
    plan.tiles = blk
    mc, nc, kc = blk.get("mc", 0), blk.get("nc", 0), blk.get("kc", 0)
    mr, nr = blk.get("mr", 1), blk.get("nr", 1)
    a_blk, b_pan = mc * kc * F32, kc * nc * F32
    ok = a_blk <= c.l2 and kr_fits(kc, nr, c)
    plan.cache_check = (f"A block mc x kc = {a_blk} B <= L2 {c.l2} B; B micro-panel kc x nr = {kc * nr * F32} B "
                        f"<= L1 {c.l1} B; B panel kc x nc = {b_pan} B <= L3 {c.l3} B: {'ok' if ok else 'NO'}")
    epi = _ops_text(body, skip={a} | set(mm.args) | ({mm.args[1]} if plan.detail.get("b_transposed") else set()))
    nb, njc, npc = batch, -(-Nn // max(nc, 1)), -(-K // max(kc, 1))
    nic = -(-M // max(mc, 1))
    nmr, nnr = -(-min(mc, M) // max(mr, 1)), -(-min(nc, Nn) // max(nr, 1))
    u = plan.uops
    if plan.kind == "conv2d":
        u.append(UOp(0, "Exec", f"im2col {K} x {Nn} per image", nb))
    # Threads (decided in the C at run time, csrc_templates/gemm.c `_split`): whole batches when
    # there are at least as many as threads; else columns (NR panels, no barriers) when every
    # thread gets a panel and M <= N / 2, or M <= N and M <= 64 MR; else rows (MR tiles).
    direct = gemm_direct(M, bool(plan.detail.get("b_transposed")), mr)
    split = "columns" if Nn > nr and (2 * M <= Nn or (M <= Nn and M <= 64 * mr)) else "rows"
    row = _plan_row_epilogue(plan, c, Nn) if plan.kind == "contraction_row" else None
    if row is not None:
        split = "rows"  # a row epilogue needs whole rows in one thread (emit_gemm forces it too)
        epi = _ops_text(body, skip=(set(range(len(body.nodes))) - body.ancestors(body.nodes[row].args[0]))
                        | {a} | set(mm.args) | ({mm.args[1]} if plan.detail.get("b_transposed") else set()))
    u += [UOp(0, "Loop", f"batch {nb} x jc over N={Nn} step nc={nc} x pc over K={K} step kc={kc}", nb * njc * npc),
          UOp(1, "Load", ("B read in place" + (f", its last {Nn % nr} columns packed" if Nn % nr else ""))
              if direct else f"pack B panel [{min(kc, K)} x {min(nc, Nn)}]", nb * njc * npc),
          UOp(1, "Loop", f"ic over M={M} step mc={mc} (parallel: batches, else {split})", nb * njc * npc * nic),
          UOp(2, "Load", f"pack A block [{min(mc, M)} x {min(kc, K)}]"
                         f"{' from A given transposed' if plan.detail.get('a_transposed') else ''}",
              nb * njc * npc * nic),
          UOp(2, "Exec", f"micro-kernel {mr} x {nr} x {min(kc, K)} FMA", nb * njc * npc * nic * nmr * nnr),
          UOp(2, "Store", f"C tile {mr} x {nr} with epilogue ({epi or 'none'}) on the last kc step",
              nb * njc * nic * nmr * nnr)]
    if row is not None:
        rn = body.nodes[row]
        post = _ops_text(body, skip=_not_ancestors(body, body.outputs[0]) | body.ancestors(row))
        what = f"{rn.op} over each finished row of C [{Nn}], then ({post or 'none'}), stored in place"
        if Nn <= nc:  # whole rows in one NC block: each MR-row tile as soon as it is finished
            u.append(UOp(2, "Exec", f"on the last kc step, per {mr}-row tile in L1: {what}", nb * nic * nmr))
        else:
            u.append(UOp(1, "Exec", f"after the last kc step of a chunk of rows, in L2: {what}", nb * nic))


def row_epilogue_fits(N: int, nparams: int, l1: int) -> bool:
    """Whether a GEMM's row epilogue handles rows of N: the row op walks a row of C in passes,
    which must stay in L1 next to its nparams parameter vectors (extraction asks this too, so
    that the optimizer does not choose a kernel that the backend would split)."""
    return N * F32 * (1 + nparams) <= l1


def _plan_row_epilogue(plan: KernelPlan, c: Caches, N: int) -> int:
    """Checks for a GEMM with a row epilogue (kernels.ROW_EPILOGUE_OPS over the last axis);
    Split (two kernels: GEMM + epilogue, row op) when this backend does not do it."""
    body = plan.body
    row = plan.shape.parts[0]
    rn = body.nodes[row]
    if plan.kind != "contraction_row" or body.nodes[plan.shape.anchor].op != "matmul":
        raise Split("a row epilogue needs a matmul")
    if tuple(rn.type.shape) != plan.out_shape:
        raise Split("the epilogue broadcasts the row op's result to a larger shape")
    if not row_epilogue_fits(N, len(rn.args) - 1, c.l1):
        raise Split(f"a row of {N} (with the row op's parameters) does not fit L1 {c.l1} B")
    for p in rn.args[1:]:
        ps = tuple(body.nodes[p].type.shape)
        if not ps or ps[-1] != N or _size(ps) != N:
            raise Split(f"the parameters of {rn.op} must be vectors of the row's length {N}")
    plan.detail["row_op"] = rn.op
    plan.flops += OPS[rn.op].flops * _size(plan.out_shape)
    plan.cache_check += (f"; row epilogue: a row of C {N * F32} B (+ parameters) <= L1 {c.l1} B: ok")
    return row


def kr_fits(kc: int, nr: int, c: Caches) -> bool:
    return kc * nr * F32 <= c.l1


def _row_split(xshape: tuple[int, ...], axis0: int) -> tuple[int, int]:
    return _size(xshape[:axis0]), _size(xshape[axis0:])


def _plan_row(plan: KernelPlan, c: Caches) -> None:
    body, a = plan.body, plan.shape.anchor
    an = body.nodes[a]
    xshape = tuple(body.nodes[an.args[0]].type.shape)
    if tuple(an.type.shape) != plan.out_shape:
        raise Split("the epilogue broadcasts the row op's result to a larger shape")
    if an.op == "softmax":
        axis0 = an.attr["axis"] % len(xshape)  # rows run along this axis (strided when not the last)
    elif an.op == "layernorm":
        axis0 = an.attr["axis"] % len(xshape)
    elif an.op == "rmsnorm":
        axis0 = len(xshape) - 1
    else:  # sum / mean / max over trailing axes
        axes = reduce_axes(an.attr, len(xshape))
        axis0 = min(axes) if axes else len(xshape)
    rows, L = _row_split(xshape, axis0)
    if an.op == "softmax":
        rows, L = _size(xshape) // xshape[axis0], xshape[axis0]
    plan.detail = {"rows": rows, "L": L, "axis0": axis0, "op": an.op}
    plan.flops = OPS[an.op].flops * _size(xshape) + _pointwise_flops(body, skip={a})
    row_bytes = L * F32 * (len(body.inputs) + 1)
    plan.cache_check = f"row working set {row_bytes} B <= L2 {c.l2} B: {'ok' if row_bytes <= c.l2 else 'no (streams from L3)'}"
    passes = {"softmax": 3, "layernorm": 3, "rmsnorm": 2}.get(an.op, 1)
    pro = _ops_text(body, skip=_not_ancestors(body, an.args[0]))
    u = plan.uops
    u.append(UOp(0, "Loop", f"r over {rows} rows (parallel)", rows))
    for nm, i in zip(_ins(plan), body.inputs):
        u.append(UOp(1, "Load", f"{nm} row [{L}]" if _size(body.nodes[i].type.shape) > 1 else f"{nm} scalar", rows))
    u.append(UOp(1, "Exec", f"prologue ({pro or 'none'}) + {an.op} in {passes} passes over the row in cache "
                            f"({_vec(L, c.simd)} vectors each)", rows))
    u.append(UOp(1, "Store", f"out row [{L if an.op in ('softmax', 'layernorm', 'rmsnorm') else 1}] after the epilogue", rows))


def _not_ancestors(body: Graph, i: int) -> set[int]:
    return set(range(len(body.nodes))) - body.ancestors(i)


def _plan_reduce(plan: KernelPlan, c: Caches) -> None:
    body, a = plan.body, plan.shape.anchor
    an = body.nodes[a]
    if tuple(an.type.shape) != plan.out_shape:
        raise Split("the epilogue broadcasts the reduction's result to a larger shape")
    # The epilogue runs over the output's index space: it cannot read a value computed in the
    # prologue (x / sum(x) is a row kernel's shape, or two kernels)
    prologue = {j for j in body.ancestors(an.args[0]) if body.nodes[j].op not in ("input", "const")}
    epilogue = body.ancestors(body.outputs[0]) - body.ancestors(a)
    if any(arg in prologue for j in epilogue for arg in body.nodes[j].args):
        raise Split("the epilogue reads a value of the prologue's index space")
    xshape = tuple(body.nodes[an.args[0]].type.shape)
    axes = reduce_axes(an.attr, len(xshape))
    plan.detail = {"axes": axes, "op": an.op}
    plan.flops = _size(xshape) + _pointwise_flops(body, skip={a})
    out_bytes = _size(plan.out_shape) * F32
    plan.cache_check = f"accumulators {out_bytes} B (the output) vs L2 {c.l2} B: {'ok' if out_bytes <= c.l2 else 'streams'}"
    u = plan.uops
    u.append(UOp(0, "Exec", f"init {_size(plan.out_shape)} accumulators", 1))
    u.append(UOp(0, "Loop", f"walk {list(xshape)} in memory order, kept axes split over threads", 1))
    u.append(UOp(1, "Load", f"input element vectors [{xshape[-1] if xshape else 1}]", _size(xshape[:-1])))
    u.append(UOp(1, "Exec", f"prologue + {an.op} into accumulators over axes {list(axes)}", _size(xshape[:-1])))
    u.append(UOp(0, "Store", f"out [{_size(plan.out_shape)}] after the epilogue", 1))


def _plan_attention(plan: KernelPlan, c: Caches) -> None:
    body = plan.body
    q, kt, v, qk, sm, mask, result = plan.shape.parts
    qs, kts, vs = (body.nodes[i].type.shape for i in (q, kt, v))
    pv = body.nodes[plan.shape.anchor]
    if tuple(pv.type.shape) != tuple(body.nodes[result].type.shape):
        raise Split("the epilogue broadcasts the attention result to a larger shape")
    Sq, D = qs[-2], qs[-1]
    Sk = kts[-1]
    Dv = vs[-1]
    batch = _size(pv.type.shape[:-2])
    # A key tile of 64 is four 16-lane vectors (the micro-kernels' width). The query block is
    # the largest whose q block, score tile and accumulators share L1 with the key tile, when
    # the key tile takes at most half of L1; a larger one (head size 128: 32 KiB) streams from
    # L2 row by row, each row used by 4 query rows x 64 keys of FMAs, and is left out of the
    # count (counted, it forced blocks of 4 queries: every key tile read again per 4 rows).
    bk = 64 if D * 64 * F32 <= c.l2 // 4 else 16
    kt_l1 = D * bk * F32 if D * bk * F32 <= c.l1 // 2 else 0
    bq = 32
    while bq > 4 and (bq * D + bq * bk + bq * Dv) * F32 + kt_l1 > c.l1:
        bq //= 2
    ws = (bq * D + bq * bk + bq * Dv) * F32 + kt_l1
    plan.tiles = {"bq": bq, "bk": bk}
    plan.detail = {"batch": batch, "Sq": Sq, "Sk": Sk, "D": D, "Dv": Dv}
    plan.flops = batch * (2 * Sq * Sk * D + 2 * Sq * Sk * Dv + 6 * Sq * Sk)
    held = "q block, k tile, score tile, accumulators" if kt_l1 else \
        f"q block, score tile, accumulators; the {D * bk * F32} B k tile streams from L2"
    plan.cache_check = (f"tile working set ({held}) {ws} B <= L1 {c.l1} B: "
                        f"{'ok' if ws <= c.l1 else 'NO'}; largest buffer {bq} x {bk} scores, never {Sq} x {Sk}")
    nqb, nkt = -(-Sq // bq), -(-Sk // bk)

    def via(i):  # q, k^T and v may be read in place through transposes / reshapes
        return "" if body.nodes[i].op == "input" else " (strided, through its layout view)"

    out_via = "" if result == body.outputs[0] else " (strided, through the output transpose)"
    u = plan.uops
    u += [UOp(0, "Loop", f"batch {batch} x query blocks of {bq} (parallel)", batch * nqb),
          UOp(1, "Load", f"q block [{bq} x {D}]{via(q)}", batch * nqb),
          UOp(1, "Loop", f"key tiles of {bk} over {Sk}", batch * nqb * nkt),
          UOp(2, "Load", f"k^T tile [{D} x {bk}] of the per-head padded copy of k^T{via(kt)}", batch * nqb * nkt),
          UOp(2, "Exec", f"scores {bq} x {bk} = q k^T ({bq * bk * D} FMA) + score ops"
                         f"{' + mask' if mask is not None else ''}", batch * nqb * nkt),
          UOp(2, "Exec", "online softmax in base 2: row max, lazy rescale (only when the max rises "
                         "by more than 2^8), exp2", batch * nqb * nkt),
          UOp(2, "Load", f"v tile [{bk} x {Dv}]{via(v)}", batch * nqb * nkt),
          UOp(2, "Exec", f"acc [{bq} x {Dv}] += p v ({bq * bk * Dv} FMA)", batch * nqb * nkt),
          UOp(1, "Store", f"out block [{bq} x {Dv}] / row sums, epilogue{out_via}", batch * nqb)]


def _plan_index(plan: KernelPlan, c: Caches) -> None:
    from .emit_index import plan_index

    plan_index(plan, c)


def _plan_layout(plan: KernelPlan, c: Caches) -> None:
    body, a = plan.body, plan.shape.anchor
    an = body.nodes[a]
    plan.detail = {"op": an.op}
    if an.op in ("reshape", "squeeze", "unsqueeze", "flatten"):
        plan.kind = "view"
        plan.bytes = 0
        plan.uops = [UOp(0, "Exec", f"reshape {list(body.nodes[an.args[0]].type.shape)} -> {list(plan.out_shape)}: "
                                    "zero-copy view of a contiguous buffer", 1)]
        plan.cache_check = "no data moved"
        return
    total = _size(plan.out_shape)
    inner = plan.out_shape[-1] if plan.out_shape else 1
    plan.cache_check = "streaming copy"
    u = plan.uops
    u.append(UOp(0, "Loop", f"{total // max(inner, 1)} output rows of {inner} (parallel)", total // max(inner, 1)))
    u.append(UOp(1, "Load", f"{an.op} source row [{inner}] (strided gather)", total // max(inner, 1)))
    u.append(UOp(1, "Store", f"out row [{inner}]", total // max(inner, 1)))


# ------------------------------------------------------------------ the whole graph


def lower_graph(g: Graph, fuse: bool = True, params: frozenset[str] = frozenset()) -> tuple[Graph, list[KernelPlan]]:
    """(the kernelized graph, one plan per kernel) for a graph with concrete shapes. `params`
    names the inputs bound by params=: a GEMM whose B is one of them is marked b_bound (emit
    then prepacks it, when B is one matrix shared by every batch)."""
    caches = machine_caches()
    split: set[int] = set()
    while True:
        kg = kernelize(g, fuse=fuse, split=frozenset(split))
        plans: list[KernelPlan] = []
        retry = False
        count = 0
        for i, n in enumerate(kg.nodes):
            if n.op != "kernel":
                continue
            try:
                plan = plan_kernel(kg, i, "", caches)
            except Split:
                orig = _origin(g, kg, i)
                if orig is None or orig in split:
                    raise
                split.add(orig)
                retry = True
                break
            plan.name = f"eqf_{g.name}_k{count}_{plan.kind}"
            count += 1
            _mark_bound_b(plan, kg, params)
            plans.append(plan)
        if not retry:
            return kg, plans


def _mark_bound_b(plan: KernelPlan, kg: Graph, params: frozenset[str]) -> None:
    """detail["b_bound"] for a matmul GEMM whose B (or the matrix its transpose reads) is a kernel
    input bound by params=, read by nothing else in the kernel, and one matrix for every batch."""
    if plan.kind not in ("contraction", "contraction_row") or not params or plan.detail["gemm"]["batch"] != 1:
        return  # (a GEMM batch > 1 here: B differs between batches)
    body = plan.body
    mm = body.nodes[plan.shape.anchor]
    b = mm.args[1]
    src = body.nodes[b].args[0] if plan.detail.get("b_transposed") else b
    if body.nodes[src].op != "input":
        return
    readers = [n for n in body.nodes if src in n.args]
    arg = plan.args[body.inputs.index(src)]
    if len(readers) == 1 and kg.nodes[arg].op == "input" and kg.nodes[arg].name in params:
        plan.detail["b_bound"] = True
        plan.uops = [replace(u, what="B panels packed once when bound (params=), read in place")
                     if u.op == "Load" and ("pack B panel" in u.what or u.what.startswith("B read in place")) else u
                     for u in plan.uops]  # the tile schedule says so


def _origin(g: Graph, kg: Graph, i: int) -> int | None:
    """The kernel node of g that became node i of kg (kernels keep their order and body)."""
    body = kg.nodes[i].body
    for j, n in enumerate(g.nodes):
        if n.op == "kernel" and n.body is body:
            return j
    return None


def format_uops(plans: list[KernelPlan]) -> str:
    lines = []
    for p in plans:
        lines.append(f"{p.name}: {p.kind} -> {list(p.out_shape)}  bytes {p.bytes}  flops {p.flops}")
        if p.tiles:
            lines.append("  tiles: " + ", ".join(f"{k}={v}" for k, v in p.tiles.items()))
        if p.cache_check:
            lines.append(f"  cache: {p.cache_check}")
        for u in p.uops:
            lines.append(f"  {'  ' * u.depth}{u.op:<5} {u.what}  x{u.count}")
    lines.append(f"total: {sum(u.count for p in plans for u in p.uops)} uops (the x counts above, summed)")
    return "\n".join(lines)
