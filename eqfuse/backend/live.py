"""KV cache kernels with a run-time length (compile's live=; the graph rewrite is eqfuse.ir.live).

After the rewrite, a cache input is a buffer [.., C + S, ..] read through slice(buffer, 0:C) by
one concat with the S new rows, whose result (present) is a graph output; attentions read that
result as their keys and values. `mark_live` lowers, with L the live length at run time:

- the concat to an *append*: the new rows are written at rows L .. L + S - 1 of the buffer itself
  (the concat's result is the buffer's storage, eqfuse.runtime.program.plan_memory; the graph
  returns the buffer as present), and the past rows are not copied: the append moves S rows,
  whatever L;
- each attention over its result to L + S keys: its key loop bound is run-time, its tiles and
  strides (the buffer's) compile-time constants.

Any other kernel that reads the cache would read rows past L + S: lowering refuses it.
"""

from __future__ import annotations

from eqfuse.backend.plan import KernelPlan, LiveBound, UOp, size
from eqfuse.errors import EqfuseError
from eqfuse.ir.graph import Graph
from eqfuse.ir.kernels import F32, K


def _root(plans_by_node: dict[int, KernelPlan], n: int) -> int:
    """The node whose storage n is a view of (n itself when it is no view)."""
    p = plans_by_node.get(n)
    while p is not None and p.kind == K.VIEW and p.view is not None:
        n = p.view[0]
        p = plans_by_node.get(n)
    return n


def _body_source(body: Graph, i: int) -> int | None:
    """The body input that body node i reads through layout ops only (transposes, views)."""
    while body.nodes[i].op != "input":
        n = body.nodes[i]
        if len(n.args) != 1:
            return None
        i = n.args[0]
    return i


def mark_live(kg: Graph, plans: list[KernelPlan], length: str) -> None:
    """Set `live` on the appends and attentions of the caches (module docstring); raise when
    another kernel reads a cache."""
    if length not in [kg.nodes[i].name for i in kg.inputs]:
        return
    by_node = {p.node: p for p in plans}
    inputs = set(kg.inputs)
    appends: dict[int, LiveBound] = {}
    for p in plans:
        if p.kind != K.LAYOUT or len(p.args) < 2:
            continue
        an = p.body.nodes[p.shape.anchor]
        v = by_node.get(p.args[0])
        if an.op != "concat" or v is None or v.kind != K.VIEW or v.view is None:
            continue
        buf, off, _ = v.view
        ax = an.attr["axis"] % len(p.out_shape)
        sl = v.body.nodes[v.shape.anchor]
        if buf not in inputs or off != 0 or sl.op != "slice" or sl.attr["axis"] % len(p.out_shape) != ax \
                or tuple(kg.nodes[buf].type.shape) != tuple(p.out_shape):
            continue
        rows = p.out_shape[ax]
        p.live = appends[p.node] = LiveBound("append", rows, rows - kg.nodes[p.args[0]].type.shape[ax], buf)
        p.unread = frozenset({0})  # the past rows are the buffer's own
        new = size(p.out_shape) * p.live.new // rows
        p.bytes = 2 * F32 * new  # the new rows read and written
        p.cache_check = "streaming copy of the new rows only"
        lead = size(p.out_shape[:ax])
        p.uops = [UOp(0, "Loop", f"{lead} x {p.live.new} new rows (the past rows stay in place)", lead * p.live.new),
                  UOp(1, "Load", f"new row [{new // max(lead * p.live.new, 1)}]", lead * p.live.new),
                  UOp(1, "Store", "into the cache buffer at row live + k", lead * p.live.new)]
    if not appends:
        return
    caches = {a.buffer for a in appends.values()}
    for p in plans:
        if p.kind != K.ATTENTION:
            continue
        parts = p.shape.parts
        srcs = [_body_source(p.body, parts.kt), _body_source(p.body, parts.v)]
        roots = [_root(by_node, p.args[p.body.inputs.index(s)]) if s is not None else None for s in srcs]
        if all(r in appends for r in roots) and len({appends[r].rows for r in roots}) == 1:
            a = appends[roots[0]]
            if p.detail.Sk == a.rows:
                p.live = LiveBound("keys", a.rows, a.new)
    for p in plans:  # nothing else may read the caches: its rows past the live ones hold anything
        if p.kind == K.VIEW or p.live is not None:
            continue
        for k, arg in enumerate(p.args):
            r = _root(by_node, arg)
            if r in appends or r in caches:
                raise EqfuseError(f"live=: kernel {p.name} ({p.kind}) reads the KV cache "
                                  f"{kg.nodes[r].name or f't{r}'}; only the append and attention over it take "
                                  "the run-time length, so it would read rows past the live ones")
    for o in kg.outputs:
        r = _root(by_node, o)
        if r in caches and o not in appends:
            raise EqfuseError("live=: the graph returns a KV cache other than as the present of its append")
