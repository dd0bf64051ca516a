"""A named dim taken at run time by the loops (compile's live= on a dim that no KV cache holds).

The graph is compiled with the dim bound to a capacity C (dims=), with one more input,
`<dim>_length` (i64[1]), its value n at run time (eqfuse.ir.live.length_graph). Every buffer keeps
its extent C along the dim; each kernel that loops over the dim loops over its first n positions
only, so a call at any n <= C runs the compiled C: no compiler, no plan per value, no work on the
positions past n. What such a call computes at positions < n is the graph at dim = n exactly; the
positions past n of every result hold anything.

The dim's axes are found by their extent: `eqfuse.pipeline.check_capacity` has made sure that C is
no fixed extent of the graph, so an axis of extent C is the dim's. `mark_dim` marks each kernel
that reads or writes the dim (`LiveBound("dim")`, axis = the dim's first axis of its result), or
refuses the graph (RuntimeDimRefused, naming the kernel) where the plan cannot take the bound.
The dim may lead a kernel's result (the axes before it of extent 1: its positions are the first
rows of each buffer) or follow a batch (`[B, S, ...]`: each batch's first rows). Kernels that can:

- a pointwise kernel (the dim at any axis): its inner loop to n when the dim is its last axis,
  else its outer rows past the dim's first n positions skipped; the dim at several axes (a mask
  over queries and keys): the first bounded so, the others computed whole;
- a row kernel (softmax, layernorm, rmsnorm or a reduction over the last axis, not the dim): its
  rows at the dim's first n positions (behind a batch: row r stands for row r / (n A) x C A +
  r % (n A) of C A per batch, A the rows per position);
- a GEMM (the blocked kernel) whose rows are the dim: its first n rows (in bf16, n rounded up to
  whole MR-row tiles); one over the rows of several batches (B shared) computes each batch's
  first n rows, one after another (`_rows_behind_batches`); its columns and depth not the dim.
  Its rows a dim at run time, a GEMM is planned on the blocked path (kinds.contraction.
  mark_bound_b), and a call of few rows on one thread runs the few-rows kernel over its panels
  where they are the same (plan_gemm.few_rows_plan);
- a layout copy (a transpose, a reshape it cannot view, a slice or a concat along another axis)
  whose source and result hold the dim at as many axes: its rows of the dim to n (at several
  axes, a relative-position bias over queries and keys: the first so, the others copied whole);
- an attention whose queries are the dim (and whose keys are, or are a fixed length): its query
  blocks to n, its keys to n when they are the dim;
- a gather or gather_elements whose indices have the dim: the indices at the first n positions
  of each of its axes (no index past the length, which may hold anything, is read); a table's
  positions past it are copied as they are; a forward cumsum along the dim: its first n prefix
  sums (positions counted from a mask).

Anything else (a reduction over the dim, a GEMM that contracts it, another index op) is refused: the
module then pads the dim to buckets (eqfuse.runtime.padded), as before. A kernel over the dim's
positions of several batches flattened into one axis (k x C: GPT-2's [batch x sequence, width])
does not see the dim and computes every position: past each batch's live ones it reads what the
bounded kernels left there, harmless for arithmetic but not for an index, so such a gather is
refused too.
"""

from __future__ import annotations

from dataclasses import replace

from eqfuse.backend.kinds.contraction.plan_gemm import few_rows_plan
from eqfuse.backend.plan import KernelPlan, LiveBound
from eqfuse.errors import RuntimeDimRefused
from eqfuse.ir.graph import Graph
from eqfuse.ir.kernels import K
from eqfuse.machine import Machine

LAYOUT_OPS = ("transpose", "reshape", "flatten", "squeeze", "unsqueeze")  # copies that walk one space


def _axes(shape, capacity: int) -> list[int]:
    return [a for a, d in enumerate(shape) if d == capacity]


def _leading(shape, axis: int) -> bool:
    return all(d == 1 for d in shape[:axis])


def mark_dim(kg: Graph, plans: list[KernelPlan], length: str, capacity: int, m: Machine) -> None:
    """Mark each kernel over the dim of extent `capacity` with its run-time bound, read from the
    graph input named `length` (module docstring); raise RuntimeDimRefused for one that cannot
    take it."""
    at = next(i for i in kg.inputs if kg.nodes[i].name == length)
    for p in plans:
        if p.kind == K.VIEW:
            continue
        if p.live is not None:  # (a chunk step's: the dim is the new rows beside a KV cache)
            _beside_cache(p, capacity, at)
            continue
        outs = _axes(p.out_shape, capacity)
        reads = any(_axes(kg.nodes[a].type.shape, capacity) for a in p.args)
        if not outs and not reads:
            if p.kind == K.INDEX and any(d > capacity and d % capacity == 0 for d in p.out_shape):
                # (the rows of several batches flattened, k x C: computed whole, its indices at
                # the rows past each batch's live ones would be what a bounded kernel left there)
                raise RuntimeDimRefused(f"live=: kernel {p.name} (index) gathers over {list(p.out_shape)}, the "
                                        f"dim's {capacity} positions of several batches flattened, so it cannot "
                                        f"skip the positions past the dim's value")
            continue
        if not outs and _picks_row(kg, p):
            continue  # (a row given at run time: eqfuse.ir.live.pick_row's, the caller's live row)
        if not reads and p.kind == K.INDEX and p.body.nodes[p.shape.anchor].op == "range":
            continue  # (positions counted along the dim: every one computed, as at the capacity)
        why = _refusal(p, outs, capacity)
        if why:
            ops = ", ".join(sorted({n.op for n in p.body.nodes if n.op != "input"}))
            raise RuntimeDimRefused(f"live=: kernel {p.name} ({p.kind}: {ops}) {why}, so it cannot loop over the "
                                    f"dim's first positions only")
        if p.kind in (K.CONTRACTION, K.CONTRACTION_ROW) and not _leading(p.out_shape, outs[0]):
            _rows_behind_batches(p, capacity)
        elif p.kind in (K.CONTRACTION, K.CONTRACTION_ROW):
            few_rows_plan(p, capacity, m)  # (few rows on one thread: the few-rows kernel, as a compile would)
        p.live = LiveBound("dim", capacity, 0, axis=outs[0], length=at)


def _beside_cache(p: KernelPlan, capacity: int, at: int) -> None:
    """A kernel over a KV cache (eqfuse.backend.live) in a step whose new rows are the dim (a
    prompt's chunk, eqfuse.generate): each takes the live new rows n at run time
    (LiveBound.new_length): an append writes n rows, an attention over the cache has n query
    rows and live + n keys, a grouped-query repeat copies live + n rows, a mask over the keys
    computes live + n of each row (its rows along the dim, if any, all of them)."""
    b = p.live
    queries = p.kind != K.ATTENTION or (p.detail.Sq == capacity and not p.detail.decode)
    if b.what not in ("append", "keys", "repeat", "rows") or b.new != capacity or not queries:
        raise RuntimeDimRefused(f"live=: kernel {p.name} ({p.kind}) is bounded by a KV cache ({b}) and reads "
                                f"the new rows, a dim at run time, otherwise than as its appended rows or queries")
    p.live = replace(b, new_length=at)


def _picks_row(kg: Graph, p: KernelPlan) -> bool:
    """Whether p is a gather of one row given by a graph input (eqfuse.ir.live.pick_row: the
    caller gives a live row), its result without the dim."""
    if p.kind != K.INDEX:
        return False
    an = p.body.nodes[p.shape.anchor]
    if an.op != "gather" or len(an.args) < 2:
        return False
    k = p.body.inputs.index(an.args[1]) if an.args[1] in p.body.inputs else -1
    return k >= 0 and p.args[k] in kg.inputs


def _refusal(p: KernelPlan, outs: list[int], capacity: int) -> str | None:
    """Why kernel p cannot take the bound (None: it can), `outs` the dim's axes of its result."""
    if not outs:
        return "reads the dim but its result has no axis of it (a reduction over the dim)"
    axis = outs[0]
    shape = p.out_shape
    if p.kind == K.POINTWISE:  # (at several axes: the first bounded, the others computed whole)
        return "is already bounded by a KV cache" if p.live is not None else None
    if p.kind == K.INDEX:
        an = p.body.nodes[p.shape.anchor]
        data, idx = ([p.body.nodes[a].type.shape for a in an.args] + [(), ()])[:2]
        if an.op == "cumsum":  # (positions from a mask: prefix sums over the dim's first positions)
            if an.attr["axis"] % len(shape) != axis or an.attr["reverse"] or len(outs) > 1:
                return "is a cumsum other than forward along the dim"
            return None
        if an.op not in ("gather", "gather_elements") or p.detail.in_blocked or p.detail.out_blocked:
            return f"is a {an.op} kernel"
        return None  # (each index at a position past the length skipped, on every axis of the dim; a
        # table's positions past it, copied or read by an index at a live position, hold anything)
    if p.kind == K.LAYOUT:  # (at several axes: the first bounded, the others copied whole)
        an = p.body.nodes[p.shape.anchor]
        if an.op in ("slice", "concat") and all(an.attr["axis"] % len(shape) != a for a in outs) and p.live is None:
            return None  # (along another axis: each block walks the dim as a transpose does)
        if an.op not in LAYOUT_OPS:
            return f"is a {an.op} copy along the dim" if an.op in ("slice", "concat") else f"is a {an.op} copy"
        src = p.body.nodes[p.body.inputs[0]].type.shape
        if len(_axes(src, capacity)) != len(outs):
            return "reads the dim at other axes than it writes"
        return None
    if len(outs) > 1:
        return f"has the dim at {len(outs)} axes of its result"
    if p.kind == K.ATTENTION:
        d = p.detail
        if p.live is not None or d.decode or d.Sq != capacity or d.Dv == capacity or d.D == capacity:
            return "has its queries at other than the dim"
        return None
    if p.kind == K.ROW:  # (behind other axes: each outer row's first positions, row_kinds' remap)
        if axis >= p.detail.axis0:  # (the row's own axes: axis0 on, or axis0 alone along an axis)
            return "takes its rows along the dim"
        if getattr(p.detail, "lanes", False):
            return "keeps its rows in the vector lanes"
        if getattr(p.detail, "quantize_flat", False) and not _leading(shape, axis):
            return "quantizes a block of rows in one loop, behind other axes"
        return None
    if p.kind in (K.CONTRACTION, K.CONTRACTION_ROW):
        d = p.detail
        if axis != len(shape) - 2 or capacity in (d.N, d.K):
            return "contracts the dim or has it as its columns"
        if d.path != "blocked" or d.gemm.batch != 1 or d.gemm.outer != 1:
            return f"is a {d.path} GEMM of {d.gemm.batch * d.gemm.outer} batches"
        return None
    if not _leading(shape, axis):
        return f"has the dim at axis {axis} of its result {list(shape)} behind axes longer than 1"
    return "is of a kind that takes no run-time bound"


def _rows_behind_batches(p: KernelPlan, capacity: int) -> None:
    """A GEMM planned as one over the rows of all its batches (the "fold" mode: B shared, A's
    batches one after another) whose rows are the dim behind the batch: the same GEMM over each
    batch's first n rows, one after another (detail.live_stride: gemm.c's AROW maps them, A packed),
    so that B's panels serve every batch's rows at once; with a row epilogue, A given transposed or
    on AMX tiles, a batch of GEMMs at B's stride 0 instead, each over its batch's first n rows."""
    d = p.detail
    if p.kind == K.CONTRACTION and not d.a_transposed and p.precision_path != "amx_bf16":
        p.detail = replace(d, live_stride=capacity, direct_a=False)
        p.uops = [replace(u, what=u.what.replace(" read in place", ", packed: rows of each batch's first n"))
                  if u.op == "Load" and u.what.startswith("A block") else u for u in p.uops]
        return
    g = d.gemm
    rows = d.M * g.lda  # (A's batches follow one another: "fold")
    p.detail = replace(d, gemm=replace(g, mode="batch", M=d.M, batch=g.M // d.M, strides=(rows, 0, d.M * d.N)))
