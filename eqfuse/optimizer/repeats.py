"""Repeated layers are optimized once: a model's identical blocks share one optimized block.

A transformer's or a ResNet stage's layers are the same subgraph again and again, with other
weights. The e-graphs, the candidates and the extraction each cost time in proportion to the
graph, so a 12-layer BERT paid twelve times for what one layer decides. Here the graph is cut
into pieces, identical pieces are optimized once and the result is copied for each of them:

1. `find`: the nodes that compute (not parameters, not constants), in the graph's order, are a
   sequence of (op, attributes, type) signatures. The longest run of a period of at least
   MIN_BLOCK nodes, repeated at least twice, gives the blocks; where a block starts (its phase
   in the period) is chosen so that the tensors crossing each cut are few and stored anyway:
   each is read by a contraction (a matmul or a conv, through views), which reads its operands
   from memory, or is a contraction's result read twice or more (`_stored`), so no kernel is
   lost by cutting there. The nodes before, between and after the
   blocks are pieces too.
2. Each piece is keyed by its exact structure: its nodes in order (op, attributes, type and
   where each argument comes from: a node of the piece, the k-th tensor read from outside, or a
   constant's value) and which of its nodes the rest reads. Pieces of equal key are one class.
3. `Pieces.distinct` puts one piece of each class side by side into one graph (names prefixed,
   nothing shared but constants), which the
   optimizer runs once: one recognition e-graph, one fusion e-graph, one extraction.
4. `Pieces.expand` splits the optimized graph by piece and writes each class's optimized piece
   once per piece of the class, its inputs bound to that piece's tensors and its names to that
   piece's names.

No kernel joins two pieces, which is where this can cost: a cut is only made where each
crossing tensor is read by a contraction, and `benchmarks/bench_opt.py` and
`benchmarks/kernel_counts.py` print the kernel counts it must not raise.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.ops import OPS, OpKind
from eqfuse.ir.printer import graph_text

MIN_BLOCK = 12  # nodes: a shorter period is not worth a cut (and small graphs stay whole)
MAX_BLOCK = 2000  # nodes: the longest period looked for (each costs a pass over the graph)
WORK = 4_000_000  # signatures compared at most, over all periods (a long graph: fewer periods tried)
SOURCES = ("input", "const")
VIEWS = ("reshape", "transpose", "squeeze", "unsqueeze", "flatten")


@dataclass
class Piece:
    nodes: list[int]  # the graph's node ids computed in this piece, in order
    live_in: list[int]  # the tensors (not constants) it reads from outside, in order of first use
    live_out: list[int]  # its nodes that later pieces or the graph's outputs read
    key: tuple
    copies: int = 0  # its first nodes are copies of shared pointwise nodes of an earlier piece


@dataclass
class Pieces:
    graph: Graph  # the graph cut
    pieces: list[Piece]  # in the graph's order
    cls: list[int]  # piece -> its class (the index of the first piece of equal key)
    block: int  # the period, in nodes
    copies: int  # the pieces of the largest class

    @property
    def reps(self) -> list[int]:
        """One piece per class: the first."""
        return [i for i, c in enumerate(self.cls) if c == i]

    def note(self) -> str:
        return (f"{len(self.pieces)} pieces in {len(self.reps)} classes, optimized once per class "
                f"({self.copies} copies of a {self.block}-node block)")

    def distinct(self) -> tuple[Graph, list[Graph]]:
        """One piece of each class side by side in one graph, and each of them as its own graph."""
        parts = [self._piece_graph(self.pieces[i]) for i in self.reps]
        return side_by_side("repeats", parts), parts

    def _piece_graph(self, p: Piece) -> Graph:
        g = self.graph
        sub = Graph(g.name)
        local: dict[int, int] = {}
        for k, t in enumerate(p.live_in):
            n = g.nodes[t]
            local[t] = sub.add(Node("input", type=n.type, name=n.name if n.name else f"__in{k}", pos=n.pos))
            sub.inputs.append(local[t])
        names = {g.nodes[t].name for t in p.live_in}
        for k, i in enumerate(p.nodes):
            n = g.nodes[i]
            for a in n.args:
                if a not in local:  # a constant, read where it is used
                    local[a] = sub.add(g.nodes[a])
            name = n.name if n.name not in names and k >= p.copies else None
            local[i] = sub.add(replace(n, args=tuple(local[a] for a in n.args), name=name))
        sub.outputs = [local[o] for o in p.live_out]
        return sub

    def expand(self, out: Graph, parts: list[Graph], ids: dict[int, list[int]] | None = None) -> Graph:
        """The whole optimized graph from `out`, the optimized side-by-side graph of `distinct()`
        (`parts`: its pieces as distinct() gave them). `ids`, when given, gets out's node id ->
        the result's node ids (one per piece of its class)."""
        g = self.graph
        res = Graph(g.name, pos=g.pos)
        at: dict[int, int] = {}  # the graph's node id -> the result's
        for i in g.inputs:
            at[i] = res.add(g.nodes[i])
            res.inputs.append(at[i])
        opt: dict[int, tuple[Graph, dict[int, int]]] = {}  # class -> (its optimized piece, piece id -> out id)
        first = 0
        for k, r in enumerate(self.reps):
            back: dict[int, int] = {}
            n_out = len(parts[k].outputs)
            part = split_part(out, k, out.outputs[first:first + n_out], parts[k], back)
            first += n_out
            opt[r] = (part, {v: u for u, v in back.items()})
        for idx, (p, c) in enumerate(zip(self.pieces, self.cls)):
            part, to_out = opt[c]
            rename = self._names(self.pieces[c], p) if idx != c else {}
            local: dict[int, int] = {}
            for j, t in zip(part.inputs, p.live_in):
                local[j] = at[t]
            for j, n in enumerate(part.nodes):
                if n.op == "input":
                    continue
                name = n.name if idx == c else rename.get(n.name) if n.name is not None else None
                body = n.body if n.body is None or idx == c else _renamed(n.body, rename)
                local[j] = res.add(replace(n, args=tuple(local[a] for a in n.args), name=name, body=body))
                if ids is not None and j in to_out:
                    ids.setdefault(to_out[j], []).append(local[j])
            for j, t in zip(part.outputs, p.live_out):
                at[t] = local[j]
        for o in g.outputs:
            if o not in at:  # a constant returned as it is
                at[o] = res.add(g.nodes[o])
        res.outputs = [at[o] for o in g.outputs]
        return res

    def _names(self, rep: Piece, p: Piece) -> dict[str, str | None]:
        """The representative piece's names -> this piece's, node by node."""
        g = self.graph
        m: dict[str, str | None] = {}
        for a, b in zip(rep.live_in + rep.nodes, p.live_in + p.nodes):
            if g.nodes[a].name is not None:
                m[g.nodes[a].name] = g.nodes[b].name
        return m


def _renamed(body: Graph, rename: dict[str, str | None]) -> Graph:
    nodes = [replace(n, name=rename.get(n.name, n.name)) if n.name is not None else n for n in body.nodes]
    return Graph(body.name, nodes, list(body.inputs), list(body.outputs), body.pos)


def enabled() -> bool:
    """EQFUSE_REPEATS=0 turns the pieces off: every graph is optimized whole (to measure what the
    pieces save, or to compare their result with the whole graph's)."""
    import os

    return os.environ.get("EQFUSE_REPEATS", "") != "0"


def find(g: Graph) -> Pieces | None:
    """The graph cut into pieces with its repeated blocks, or None when no block repeats."""
    order = [i for i, n in enumerate(g.nodes) if n.op not in SOURCES]
    n = len(order)
    if n < 2 * MIN_BLOCK:
        return None
    codes: dict[tuple, int] = {}
    sig = np.array([codes.setdefault(_sig(g.nodes[i]), len(codes)) for i in order], dtype=np.int64)
    best = None  # (coverage, -period, run start, run length)
    for period in range(MIN_BLOCK, min(n // 2, MAX_BLOCK, WORK // n) + 1):
        eq = np.concatenate(([0], (sig[:-period] == sig[period:]).astype(np.int8), [0]))
        edges = np.flatnonzero(np.diff(eq))
        if not len(edges):
            continue
        lengths = edges[1::2] - edges[::2]
        j = int(np.argmax(lengths))
        run = int(lengths[j])
        if run < period:
            continue
        cover = (run // period + 1) * period
        if best is None or (cover, -period) > best[:2]:
            best = (cover, -period, int(edges[2 * j]), run)
    if best is None:
        return None
    _, neg, start, run = best
    period, end = -neg, best[2] + best[3] + (-neg)  # positions [start, end) repeat with the period
    pos = {i: k for k, i in enumerate(order)}
    last = [k for k in range(n)]  # position -> the last position that reads it
    is_out = set(g.outputs)
    readers: dict[int, list[int]] = {}
    for k, i in enumerate(order):
        for a in g.nodes[i].args:
            if a in pos:
                last[pos[a]] = max(last[pos[a]], k)
                readers.setdefault(a, []).append(i)
    for o in g.outputs:
        if o in pos:
            last[pos[o]] = n
    # cut before position c: cross[c] tensors made before it and read at or after it
    made = np.arange(n)
    upto = np.asarray(last)
    live = upto > made
    steps = np.zeros(n + 2, dtype=np.int64)
    np.add.at(steps, made[live] + 1, 1)
    np.add.at(steps, upto[live] + 1, -1)
    cross = np.cumsum(steps)[:n + 1]
    # the tensors no contraction reads and the graph does not return: (made at, last read at)
    loose = [k for k in np.flatnonzero(live) if order[k] not in is_out and not _stored(g, order[k], readers)]
    lk, le = made[loose], upto[loose]
    choice = None
    for phase in range(start, start + period):
        copies = (end - phase) // period
        if copies < 2:
            continue
        cuts = [phase + j * period for j in range(copies + 1)]
        bad = _outer_cuts_dropped(cuts, n, lk, le)
        if len(cuts) < 3:  # fewer than two blocks left
            continue
        inner = np.array([c for c in cuts if 0 < c < n])
        score = (bad, int(cross[inner].max()), 1 - len(cuts), phase)
        if choice is None or score < choice[0]:
            choice = (score, cuts)
    if choice is None or choice[0][0] > 0:
        return None  # every phase cuts a tensor some kernel might have fused on
    cuts = choice[1]
    inner = [c for c in cuts if 0 < c < n]
    # what every block reads alike and no contraction stores (a mask's pointwise ops) each piece
    # computes again, as fusion into each reader would have: a copy of it goes into the piece
    shared = [order[k] for k, e in zip(lk, le) if k < inner[0] and e >= inner[-1]]
    copied: set[int] = set()
    while shared:
        i = shared.pop()
        if i not in copied and g.nodes[i].op in OPS and OPS[g.nodes[i].op].kind == OpKind.POINTWISE \
                and i not in is_out and not _stored(g, i, readers):
            copied.add(i)
            shared.extend(a for a in g.nodes[i].args if a in pos)
    bounds = sorted({0, *cuts, n})
    pieces = []
    for a, b in zip(bounds, bounds[1:]):
        pieces.append(_piece(g, order[a:b], copied))
    read = set(g.outputs).union(*(p.live_in for p in pieces))  # what the pieces read of each other
    for p in pieces:
        p.live_out = [i for i in p.nodes[p.copies:] if i in read]
        p.key += (tuple(p.nodes.index(i) for i in p.live_out),)
    cls: list[int] = []
    first: dict[tuple, int] = {}
    for k, p in enumerate(pieces):
        cls.append(first.setdefault(p.key, k))
    copies = max(cls.count(c) for c in set(cls))
    if copies < 2:
        return None
    return Pieces(g, pieces, cls, period, copies)


def _outer_cuts_dropped(cuts: list[int], n: int, lk, le) -> int:
    """Drop the first and last of `cuts` (block boundaries, in place) while a loose tensor (made
    at lk, last read at le) crosses them: the first block then goes with what comes before it,
    the last with what comes after (a pre-norm model's embeddings, read by the first layer's
    layernorm and residual add). The loose tensors the cuts left still cross."""
    while True:
        inner = [c for c in cuts if 0 < c < n]
        if not inner:
            return 0
        # a loose tensor cut is one a kernel of the next piece might have fused, unless every
        # block reads it (made before the first cut, read after the last: a mask, shared alike)
        free = ~((lk < inner[0]) & (le >= inner[-1]))
        at = [int(np.count_nonzero((lk < c) & (le >= c) & free)) for c in inner]
        if len(cuts) >= 3 and at[0] and cuts[0] == inner[0]:
            cuts.pop(0)
        elif len(cuts) >= 3 and at[-1] and cuts[-1] == inner[-1]:
            cuts.pop()
        else:
            return sum(at)


def _sig(n: Node) -> tuple:
    body = graph_text(n.body) if n.body is not None else None
    return (n.op, n.attrs, n.type, len(n.args), body)


def _stored(g: Graph, i: int, readers: dict[int, list[int]]) -> bool:
    """Whether node i is stored whatever the kernels around it: some reader, through views, is a
    contraction (which reads its operands from memory); or it is a contraction's result, through
    pointwise ops (an epilogue) and views, read by two ops or more (each would compute the contraction
    again: a pre-norm layer's residual stream, read by a layernorm and an add)."""
    stack, seen = [i], set()
    while stack:
        j = stack.pop()
        for r in readers.get(j, ()):
            op = g.nodes[r].op
            if op in OPS and OPS[op].kind == OpKind.CONTRACTION and r not in seen:
                return True
            if op in VIEWS and r not in seen:
                seen.add(r)
                stack.append(r)
    return len(readers.get(i, ())) >= 2 and _epilogue_of_contraction(g, i)


def _epilogue_of_contraction(g: Graph, i: int) -> bool:
    stack, seen = [i], set()
    while stack:
        j = stack.pop()
        n = g.nodes[j]
        if n.op in OPS and OPS[n.op].kind == OpKind.CONTRACTION:
            return True
        if j not in seen and (j == i or n.op in VIEWS or n.op in OPS and OPS[n.op].kind == OpKind.POINTWISE):
            seen.add(j)
            stack.extend(n.args)
    return False


def _piece(g: Graph, nodes: list[int], copied: set[int]) -> Piece:
    """The piece of `nodes`, those of `copied` it reads from outside first (their copies); its
    live_out and the key's last part are the caller's, who knows what the others read."""
    own = set(nodes)
    need: set[int] = set()
    stack = [a for i in nodes for a in g.nodes[i].args if a in copied and a not in own]
    while stack:
        a = stack.pop()
        if a not in need:
            need.add(a)
            stack.extend(b for b in g.nodes[a].args if b in copied and b not in own)
    nodes = sorted(need) + nodes
    inside = {i: k for k, i in enumerate(nodes)}
    live_in: dict[int, int] = {}
    rows = []
    for i in nodes:
        n = g.nodes[i]
        args = []
        for a in n.args:
            if a in inside:
                args.append(("n", inside[a]))
            elif g.nodes[a].op == "const":
                args.append(("c", g.nodes[a].attrs, g.nodes[a].type))
            else:
                args.append(("i", live_in.setdefault(a, len(live_in))))
        rows.append((_sig(n), tuple(args)))
    key = (tuple(rows), tuple(g.nodes[t].type for t in live_in))
    return Piece(nodes, list(live_in), [], key, len(need))


# ---------------------------------------------------------------- graphs side by side


def prefix(k: int) -> str:
    return f"__b{k}__"


def side_by_side(name: str, gs: list[Graph]) -> Graph:
    """The graphs as one, names prefixed by their index (so nothing is shared but constants);
    parameters and outputs in order, graph by graph."""
    u = Graph(name)
    for k, g in enumerate(gs):
        base = len(u.nodes)
        p = prefix(k)
        for n in g.nodes:
            u.nodes.append(replace(n, args=tuple(a + base for a in n.args), name=None if n.name is None else p + n.name))
        u.inputs += [i + base for i in g.inputs]
        u.outputs += [o + base for o in g.outputs]
    return u


def split_part(g: Graph, k: int, outputs: list[int], orig: Graph, ids: dict[int, int] | None = None) -> Graph:
    """Graph k's part of g, an optimized side_by_side graph (`outputs`: its outputs' ids in g;
    `orig`: graph k as it went in). `ids`, when given, gets g's node id -> the part's."""
    p = prefix(k)

    def name(s):
        return s[len(p):] if s is not None and s.startswith(p) else s

    live, stack = set(), list(outputs)
    while stack:
        j = stack.pop()
        if j not in live:
            live.add(j)
            stack.extend(g.nodes[j].args)
    by_name = {g.nodes[i].name: i for i in g.inputs}
    keep = [by_name[p + orig.nodes[i].name] for i in orig.inputs]
    keep += [i for i in range(len(g.nodes)) if i in live and i not in set(keep)]
    keep.sort(key=lambda i: (g.nodes[i].op != "input", i))
    new = {old: j for j, old in enumerate(keep)}
    if ids is not None:
        ids.update(new)
    nodes = []
    for i in keep:
        n = g.nodes[i]
        body = n.body
        if body is not None:
            body = Graph(body.name, [replace(b, name=name(b.name)) for b in body.nodes], list(body.inputs),
                         list(body.outputs), body.pos)
        nodes.append(replace(n, args=tuple(new[a] for a in n.args), name=name(n.name), body=body))
    inputs = [new[by_name[p + orig.nodes[i].name]] for i in orig.inputs]
    return Graph(orig.name, nodes, inputs, [new[o] for o in outputs], orig.pos)
