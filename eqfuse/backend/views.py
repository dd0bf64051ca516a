"""Layout ops in place: the slices, transposes and reshapes that no kernel has to copy.

After lowering, every kernel that is one reshape, transpose or slice of one tensor is a
candidate view. Its elements are elements of one buffer in memory, its root (a graph input, a
constant or a kernel's result), at element offsets composed along the chain of layout ops from
that root. The composition is computed exactly by numpy, with the op table's own numpy semantics:
the chain's ops are applied to a one-byte-per-element buffer over the root's shape (allocated,
never written), and a view numpy makes of it gives the offset and strides in elements. Where a
reshape in the chain cannot be a view (numpy copies), the chain goes on from an index array (the
offset of every element in the root), so that a later op may still make it affine. No index array
is built over a weight that is only transposed or sliced.

A view is an *affine* index map (one offset plus one stride per axis). A candidate is read in
place when its map is affine and every kernel reading it can take that map:
- every kernel reads a contiguous view (the contiguous strides at any offset): a pointer;
- a pointwise kernel reads any operand through any strides, attention reads q, k^T and v
  through any strides (its head split and k^T transposes are strides already), a GEMM reads A
  and B as rows or columns in memory at any leading dimension and batch strides (and its
  epilogue's operands at any strides), the fused depthwise conv + layernorm + matmul its matmul's
  weights at any strides (torch's Linear weight, transposed), and a layout copy (a concat too)
  reads any affine view;
- a graph output must be its root's whole buffer.
A candidate read by a kernel that cannot take its map stays a kernel (a strided copy). A
candidate read only by other candidates need not be affine at all: GPT-2's k^T is
transpose -> reshape -> transpose -> reshape of a slice of the fused QKV projection, with a
non-affine reshape in the middle, and the whole chain is one view.

The plans record it: a view plan gets kind "view" and `view = (root, offset, strides)`; a plan
reading a non-contiguous view gets the view's strides in `in_strides[k]` (arg k), and the runtime
passes the root's pointer plus the offset (eqfuse.runtime.program).

A layout copy that stays one (a concat, or a view op some reader cannot take) may still be
written in place by the kernels that produce its operands: eqfuse.backend.stores.
"""

from __future__ import annotations

import math

import numpy as np

from eqfuse.backend.indexing import contiguous, view_strides
from eqfuse.backend.kinds.contraction.plan_gemm import matrix_layout
from eqfuse.backend.plan import KernelPlan, UOp
from eqfuse.ir.graph import Graph
from eqfuse.ir.kernels import ConvNorm, K
from eqfuse.ir.ops import OPS, OpKind
from eqfuse.ir.shapes import NUMPY_DTYPE

VIEW_OPS = ("reshape", "transpose", "slice")
MAX_ELEMENTS = 1 << 22  # index arrays above this size are not composed (the op stays a copy)


def affine(idx: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
    """(offset, strides) when idx[i] = offset + sum(i_k * strides_k) for every index i; else None."""
    if idx.size == 0:
        return None
    off = int(idx.flat[0])
    strides = []
    expect = np.full(idx.shape, off, dtype=np.int64)
    for k, n in enumerate(idx.shape):
        if n == 1:
            strides.append(0)
            continue
        at = [0] * idx.ndim
        at[k] = 1
        s = int(idx[tuple(at)]) - off
        strides.append(s)
        shape = [1] * idx.ndim
        shape[k] = n
        expect = expect + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    if not np.array_equal(expect, idx):
        return None
    return off, tuple(strides)


def is_contiguous(shape, strides) -> bool:
    return all(s == c for n, s, c in zip(shape, strides, contiguous(shape)) if n != 1)


def _single_view_op(p: KernelPlan) -> bool:
    if p.kind not in (K.LAYOUT, K.VIEW) or len(p.args) != 1:
        return False
    return p.body.nodes[p.shape.anchor].op in VIEW_OPS


def _accepts(p: KernelPlan, k: int, strides) -> bool:
    """Whether kernel p can read its arg k through (non-contiguous) `strides`."""
    if p.kind in (K.LAYOUT, K.VIEW):  # a copy (a reshape read here is one forced to copy)
        return True
    if p.kind == K.ATTENTION:
        return _attention_reads(p, p.body.inputs[k], strides)
    if p.kind == K.ATTENTION_GRAD:  # every operand read element by element at its strides
        return True
    if p.kind == K.CONTRACTION and p.body.nodes[p.shape.anchor].op in ("matmul_integer", "conv_integer") \
            and p.body.inputs[k] in p.body.ancestors(p.shape.anchor):
        return False  # (the integer GEMM reads its operands, and the x it quantizes or im2cols, contiguous)
    if p.kind in (K.CONTRACTION, K.CONTRACTION_ROW) and _gemm_operand(p, p.body.inputs[k]) is not None:
        x = _gemm_operand(p, p.body.inputs[k])
        st = view_strides(p.body, x, {p.body.inputs[k]: strides})[1]
        readers = [n for n in p.body.nodes if p.body.inputs[k] in n.args]
        return st is not None and len(readers) == 1 and matrix_layout(p.body.nodes[x].type.shape, st) is not None
    if p.kind == K.CONV2D and isinstance(p.shape.parts, ConvNorm):
        # the fused depthwise conv + layernorm + matmul packs its matmul's weights element by
        # element (conv_dwln.c's WM_AT): any 2-D strides, the weights read by the matmul alone
        w = p.body.nodes[p.shape.anchor].args[1]
        return p.body.inputs[k] == w and len(strides) == 2 and \
            sum(w in n.args for n in p.body.nodes) == 1
    if p.kind in (K.POINTWISE, K.ROW, K.REDUCE, K.CONTRACTION, K.CONTRACTION_ROW):
        # an operand of the pointwise ops around the main op, or a row op's or reduction's input:
        # read element by element at an index (not a GEMM operand, a row op's parameter or a
        # channel op's parameter, which are read as the contiguous vectors they are)
        i = p.body.inputs[k]
        anchor = p.body.nodes[p.shape.anchor] if p.shape.anchor is not None else None
        for n in p.body.nodes:
            if i not in n.args:
                continue
            if n is anchor and p.kind in (K.ROW, K.REDUCE) and i not in n.args[1:]:
                continue
            if n.op not in OPS or OPS[n.op].kind != OpKind.POINTWISE:
                return False
        return True
    return False


def _gemm_operand(p: KernelPlan, i: int) -> int | None:
    """The matmul operand (body node) that reads body input i, directly or through a swap of its
    last two axes; None when i is not a matmul operand."""
    mm = p.body.nodes[p.shape.anchor]
    if mm.op != "matmul":
        return None
    for x in mm.args:
        n = p.body.nodes[x]
        if x == i or (n.op == "transpose" and n.args[0] == i):
            return x
    return None


def _attention_reads(p: KernelPlan, i: int, strides) -> bool:
    """Attention reads body input i through strides when i is read only as (a view of) q, k^T
    or v and those views stay affine over the strides."""
    body = p.body
    q, kt, v = p.shape.parts.q, p.shape.parts.kt, p.shape.parts.v
    chains = body.ancestors(q) | body.ancestors(kt) | body.ancestors(v)
    if any(i in n.args and j not in chains and j not in (p.shape.parts.qk, p.shape.anchor)
           for j, n in enumerate(body.nodes)):
        return False
    for x in (q, kt, v):
        if i in body.ancestors(x) and view_strides(body, x, {i: strides})[1] is None:
            return False
    return True


def place_views(kg: Graph, plans: list[KernelPlan]) -> None:
    """Turn layout kernels into views where every reader can take them (see the docstring)."""
    cands = {p.node: p for p in plans if _single_view_op(p)}
    if not cands:
        return
    forced: set[int] = set()
    while True:
        idx, maps = _compose(kg, plans, cands, forced)
        need: set[int] = set()
        for p in plans:  # every kernel that stays one reads its args at their maps
            if p.node in idx:
                continue
            for k, a in enumerate(p.args):
                if a not in idx:
                    continue
                m = maps[a]
                shape = kg.nodes[a].type.shape
                if m is None or not (is_contiguous(shape, m[1]) or _accepts(p, k, m[1])):
                    need.add(a)
        for o in kg.outputs:
            if o in idx:
                root = idx[o][0]
                m = maps[o]
                whole = math.prod(kg.nodes[o].type.shape) == math.prod(kg.nodes[root].type.shape)
                if m is None or m[0] != 0 or not whole or not is_contiguous(kg.nodes[o].type.shape, m[1]):
                    need.add(o)
        if not need:
            break
        forced |= need
    for n in forced:
        p = cands[n]
        if p.kind == K.VIEW:  # a reshape that is not a view of what it reads: a copy
            p.kind = K.LAYOUT
            p.name = p.name.rsplit("_", 1)[0] + "_layout"
            p.bytes = 2 * math.prod(p.out_shape) * np.dtype(NUMPY_DTYPE[p.body.nodes[p.body.outputs[0]].type.dtype]).itemsize
            p.cache_check = "streaming copy"
            p.uops = [UOp(0, "Loop", f"the {math.prod(p.out_shape)} elements in order, read through the source's "
                                     "strides (a reshape of a view that has none)", 1)]
    for n, (root, _) in idx.items():
        p = cands[n]
        off, strides = maps[n] if maps[n] is not None else (0, contiguous(kg.nodes[n].type.shape))
        p.kind = K.VIEW
        p.name = p.name.rsplit("_", 1)[0] + "_view"
        p.view = (root, off, strides)
        p.bytes = 0
        p.cache_check = "no data moved"
        op = p.body.nodes[p.shape.anchor].op
        p.uops = [UOp(0, "Exec", f"{op}: a view of t{root} at element offset {off}, strides {list(strides)}; no code", 1)]
    for p in plans:
        if p.kind == K.VIEW:
            continue
        for k, a in enumerate(p.args):
            if a in idx and maps[a] is not None and not is_contiguous(kg.nodes[a].type.shape, maps[a][1]):
                p.in_strides[k] = maps[a][1]


def _compose(kg: Graph, plans: list[KernelPlan], cands: dict[int, KernelPlan], forced: set[int]):
    """(node -> (root, index map), node -> affine map or None) for every candidate not forced to
    be a kernel. An index map is a numpy
    view of a one-byte-per-element buffer over the root (never written, so never touched: its
    offset and strides are the view's, no index array is built), or an index array once a
    reshape in the chain cannot be a view (numpy copies; then the index values are composed)."""
    idx: dict[int, tuple[int, np.ndarray]] = {}
    bufs: dict[int, np.ndarray] = {}  # root -> its byte buffer
    for p in plans:
        if p.node not in cands or p.node in forced:
            continue
        a = p.args[0]
        shape = kg.nodes[a].type.shape
        if math.prod(shape) > MAX_ELEMENTS:
            forced.add(p.node)
            continue
        if a in idx:
            root, base = idx[a]
        else:
            root = a
            if root not in bufs:
                bufs[root] = np.empty(math.prod(shape), dtype=np.uint8)
            base = bufs[root].reshape(shape)
        n = p.body.nodes[p.shape.anchor]
        out = OPS[n.op].numpy([base], n.attr)
        if base.dtype == np.uint8 and not np.may_share_memory(out, bufs[root]):
            # a reshape numpy could not make a view: compose the index values instead
            out = OPS[n.op].numpy([_index_array(base, bufs[root])], n.attr)
        idx[p.node] = (root, out if out.dtype == np.uint8 else np.ascontiguousarray(out))
    return idx, {n: index_map(a, bufs[root]) for n, (root, a) in idx.items()}


def _index_array(view: np.ndarray, buf: np.ndarray) -> np.ndarray:
    """The element offsets into `buf` of every element of `view` (a view of it), as an array."""
    off, strides = _view_map(view, buf)
    out = np.full(view.shape, off, dtype=np.int64)
    for k, (n, s) in enumerate(zip(view.shape, strides)):
        shape = [1] * view.ndim
        shape[k] = n
        out = out + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    return out


def _view_map(view: np.ndarray, buf: np.ndarray) -> tuple[int, tuple[int, ...]]:
    """(offset, strides) in elements of a view of a one-byte buffer (stride 0 along size-1 dims,
    as `affine` gives them)."""
    off = view.__array_interface__["data"][0] - buf.__array_interface__["data"][0]
    return off, tuple(0 if n == 1 else s for n, s in zip(view.shape, view.strides))


def index_map(a: np.ndarray, buf: np.ndarray | None) -> tuple[int, tuple[int, ...]] | None:
    """affine() of a candidate's map: a view's offset and strides, or an index array checked."""
    if a.size == 0:
        return None
    if a.dtype == np.uint8:
        return _view_map(a, buf)
    return affine(a)
