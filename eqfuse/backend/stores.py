"""Layout copies written in place: the concats and transposes whose operands' producers write
the copy's storage directly, so that the copy has no code.

A layout copy C (a concat, a transpose, or a reshape that eqfuse.backend.views had to copy)
moves every element of its operands to one place in its storage. The places are computed
exactly, on index arrays: the op table's numpy op of C applied to `arange` over its operands
gives, for each element of C, which operand element it holds; inverted, it gives each operand
element's element offset in C's storage (`destinations`). An operand can be written there by the
kernel that computes it (its *writer*) when:

- the operand is a kernel's result, or a view of the whole of one (eqfuse.backend.views: GPT-2's
  reshape chains, ViT's flatten + transpose of the patch convolution), and that result and every
  view on the way are read by nothing else, once, and are not graph outputs;
- the writer's positions in C's storage are affine (one offset, one stride per axis of its
  result): the operand's places composed with the view's index map;
- they are contiguous, or the writer's kind writes through strides (`Kind.writes_strided`,
  `Kind.writes_through`: pointwise kernels, layout copies and softmax rows; a matmul's GEMM at a
  row, column and batch stride (plan_gemm.c_layout), a conv2d's GEMM; other rows write rows of
  their own length).

The writer then gets `into = (C, offset)` and `out_strides` (None when contiguous), and C becomes
a view plan with `view` None that owns the storage (eqfuse.runtime.program.plan_memory gives it
memory from its first writer's step on). A concat some of whose operands cannot be written in
place stays one copy kernel that copies only those (through any strides they are read by) into
its storage, which the others' kernels have written before. A concat along an inner axis (ViT's
cls token before the patches, concat([cls[B, 1, D], x[B, N, D]], axis=1)) is written by its
writers at the concat's row strides: in ViT's TorchScript export the cls token's kernel writes its
rows, and the concat copies the patches (the convolution is a GEMM); a transpose copy of a
pointwise result is the pointwise kernel writing through the transposed strides.
"""

from __future__ import annotations

import math

import numpy as np

from eqfuse.backend.kinds import KIND
from eqfuse.backend.kinds.layout import RESHAPES
from eqfuse.backend.plan import KernelPlan, UOp
from eqfuse.backend.views import MAX_ELEMENTS, affine, is_contiguous
from eqfuse.ir.graph import Graph
from eqfuse.ir.kernels import K
from eqfuse.ir.ops import OPS
from eqfuse.ir.shapes import NUMPY_DTYPE

STORE_OPS = ("concat", "transpose") + RESHAPES  # copies that move every operand element once


def destinations(c: KernelPlan) -> list[np.ndarray] | None:
    """Per arg of layout copy c: the element offset in c's storage of each of its elements (an
    index array of the arg's shape); None when some element is not copied exactly once."""
    body, an = c.body, c.body.nodes[c.shape.anchor]
    if an.op not in STORE_OPS or len(set(an.args)) != len(an.args) or tuple(an.args) != tuple(body.inputs):
        return None
    sizes = [math.prod(body.nodes[x].type.shape) for x in an.args]
    total = sum(sizes)
    if total != math.prod(c.out_shape) or total > MAX_ELEMENTS:
        return None
    starts = np.cumsum([0] + sizes)
    srcs = [np.arange(s, s + n, dtype=np.int64).reshape(body.nodes[x].type.shape)
            for s, n, x in zip(starts, sizes, an.args)]
    held = np.asarray(OPS[an.op].numpy(srcs, an.attr)).reshape(-1)  # element of c -> operand element
    dest = np.full(total, -1, dtype=np.int64)
    dest[held] = np.arange(total, dtype=np.int64)
    if (dest < 0).any():
        return None
    return [dest[s:s + n].reshape(body.nodes[x].type.shape) for s, n, x in zip(starts, sizes, an.args)]


def _writer(kg: Graph, by_node: dict[int, KernelPlan], reads: dict[int, int], outputs: set[int],
            c: KernelPlan, a: int, dest: np.ndarray) -> tuple[KernelPlan, int, tuple | None] | None:
    """(the kernel computing arg a, its element offset in c's storage, its strides there or None
    when contiguous), when it can write there (see the module's docstring); else None."""
    p = by_node.get(a)
    root, grid = a, dest
    if p is not None and p.kind == K.VIEW and p.view is not None:
        root, off, strides = p.view
        n = a
        while n != root:  # every view between the result and c is read once, by the next one
            q = by_node.get(n)
            if q is None or q.kind != K.VIEW or q.view is None or reads.get(n) != 1 or n in outputs:
                return None
            n = q.args[0]
        size = math.prod(kg.nodes[root].type.shape)
        if dest.size != size:  # a view of part of the result (a slice): the rest has no place
            return None
        pos = np.full(dest.shape, off, dtype=np.int64)
        for k, (d, s) in enumerate(zip(dest.shape, strides)):
            pos = pos + (np.arange(d, dtype=np.int64) * s).reshape([d if j == k else 1 for j in range(dest.ndim)])
        flat = np.full(size, -1, dtype=np.int64)
        flat[pos.reshape(-1)] = dest.reshape(-1)
        if (flat < 0).any():
            return None
        grid = flat.reshape(kg.nodes[root].type.shape)
    w = by_node.get(root)
    if (w is None or w is c or w.kind == K.VIEW or w.into is not None or reads.get(root) != 1
            or root in outputs):
        return None
    m = affine(grid)
    if m is None:
        return None
    off, strides = m
    if is_contiguous(w.out_shape, strides):
        return w, off, None
    return (w, off, strides) if KIND[w.kind].writes_through(w, strides) else None


def place_stores(kg: Graph, plans: list[KernelPlan]) -> None:
    """Make the layout copies whose operands can all be written in place storage with no code,
    and the concats some of whose operands can be copies of the others only (see the module's
    docstring). Runs after eqfuse.backend.views.place_views."""
    by_node = {p.node: p for p in plans}
    reads: dict[int, int] = {}
    for p in plans:
        for a in p.args:
            reads[a] = reads.get(a, 0) + 1
    outputs = set(kg.outputs)
    targets: set[int] = set()  # copies written in place: their storage is no other copy's
    for c in plans:
        if c.kind != K.LAYOUT or c.into is not None or c.live is not None:  # (an append: backend.live)
            continue
        dests = destinations(c)
        if dests is None:
            continue
        writers = [_writer(kg, by_node, reads, outputs, c, a, d) for a, d in zip(c.args, dests)]
        writers = [None if w is not None and w[0].node in targets else w for w in writers]
        if all(w is None for w in writers):
            continue
        targets.add(c.node)
        for w, off, strides in filter(None, writers):
            w.into, w.out_strides = (c.node, off), strides
        op = c.body.nodes[c.shape.anchor].op
        if any(w is None for w in writers):
            _copy_the_rest(kg, c, writers)
            continue
        c.kind = K.VIEW
        c.name = c.name.rsplit("_", 1)[0] + "_view"
        c.view = None
        c.in_strides = {}
        c.bytes = 0
        c.threads = ""
        c.cache_check = "no data moved"
        c.uops = [UOp(0, "Exec", f"{op}: written in place by the kernels of "
                                 f"{', '.join(f't{w.node}' for w, _, _ in writers)}; no code", 1)]


def store_uop(w: KernelPlan) -> UOp:
    """The line of a writer's schedule that says where its result goes (lower adds it last)."""
    at = f" at strides {list(w.out_strides)}" if w.out_strides else ""
    return UOp(0, "Store", f"result written in place into t{w.into[0]} at element offset {w.into[1]}{at}", 1)


def _copy_the_rest(kg: Graph, c: KernelPlan, writers: list) -> None:
    """Concat c stays a copy of the operands that no writer writes in place (plan.unread: the others)."""
    written = frozenset(k for k, w in enumerate(writers) if w is not None)
    c.unread = written
    rest = [a for k, a in enumerate(c.args) if k not in written]
    moved = sum(math.prod(kg.nodes[a].type.shape) for a in rest)
    c.bytes = 2 * moved * np.dtype(NUMPY_DTYPE[kg.nodes[c.node].type.dtype]).itemsize
    c.uops = c.uops + [UOp(0, "Exec", f"only {', '.join(f't{a}' for a in rest)} copied ({moved} elements); "
                                      f"{', '.join(f't{w.node}' for w, _, _ in filter(None, writers))} "
                                      "written in place by their kernels", 1)]
