"""A batch dimension taken at run time: one compile, any batch size.

A named dim that is *separable* (eqfuse.ir.separable: every sample along it is computed on its
own, the dim leading every tensor that holds it) does not need the C compiled again for each of
its values. The graph is compiled once for a small set of bucket sizes of that dim -- all in one
C module, one compiler run -- and a call with batch n runs the compiled graph on chunks of its
batch:

- chunks of the largest bucket, as many as fit;
- the remainder as a sum of smaller buckets, or padded up to one bucket (its rows repeat the
  chunk's first sample, so every padded input is a valid one), whichever is cheaper by each
  bucket's time: measured at the first call (each bucket run twice on its samples), or by
  the time model (`estimate`: each kernel's bytes and FLOPs at this machine's measured bandwidth
  and FLOP/s) where the speeds are pinned. Few rows of a memory-bound model (the weights are
  streamed once per chunk) pad; large batches of a compute-bound one split.

Inputs holding the dim are read in place (a chunk of a contiguous array is contiguous), and
each chunk writes its rows of the outputs in place (`Runner(..., into=)`); only a padded chunk
copies. A call whose batch is a bucket size is one C call, as without buckets.

The bucket sizes: `eqfuse.compile(..., buckets={"B": [1, 8, 32]})`, or by default the first
binding's value rounded up to a power of two and the powers of four below it (`default_sizes`).
`buckets={}` compiles each binding on its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from eqfuse.ir.graph import Graph
from eqfuse.ir.kernels import K
from eqfuse.runtime.program import bf16_bits

CALL_S = 5e-6  # the run function's Python side per call (benchmarks/bench_runtime.py)
# The speeds the schedule assumes; None: this machine's, measured (eqfuse.machine).
# The test suite pins them (tests/conftest.py), so that no schedule depends on the host's load.
PINNED_SPEEDS: dict | None = None
LONG_RUN_S = 0.05  # a bucket whose first timed run takes this long is not run a second time


def default_sizes(first: int) -> list[int]:
    """Bucket sizes for a batch dim first bound to `first`: that value rounded up to a power of
    two, and the powers of four below it (8 -> 1, 2, 8; 256 -> 1, 4, 16, 64, 256). Each size is
    compiled, so their count is what the first call pays; a batch between two of them pads to the
    upper one (at most 4x the work when compute-bound) or runs as smaller chunks."""
    top = 1 << max(first - 1, 0).bit_length()
    sizes, b = {1, top}, top
    while b > 1:
        b //= 4
        sizes.add(max(b, 1))
    return sorted(sizes)


def estimate(compiled) -> float:
    """Seconds per call of one compiled bucket by the time model: each kernel's bytes at the
    measured bandwidth or its FLOPs at the measured FLOP/s, whichever is longer."""
    from eqfuse.machine import perf

    m = PINNED_SPEEDS or perf()
    ks = [p for p in compiled.plans if p.kind != K.VIEW]
    return CALL_S + sum(max(p.bytes / m["bandwidth"], p.flops / m["flops"]) + m["overhead"] for p in ks)


@dataclass(frozen=True)
class Chunk:
    start: int  # first sample of the batch
    count: int  # samples of the batch it computes
    bucket: int  # the compiled size it runs at (> count: padded)


class Bucketed:
    """One graph compiled for several sizes of its batch dim; called like Compiled.run."""

    def __init__(self, dim: str, graph: Graph, compiled: dict[int, object], cost: dict[int, float] | None = None):
        self.dim = dim
        self.sizes = sorted(compiled)
        self.compiled = compiled
        # `cost`: the estimates made when an artifact was saved (the time model reads this
        # machine's measured speeds, which may cost a measurement)
        self.cost = dict(cost) if cost is not None else {b: estimate(c) for b, c in compiled.items()}
        self._memo: dict[int, tuple[float, tuple[tuple[int, int], ...]]] = {}
        self._warm = False
        # which inputs and outputs hold the dim (as their axis 0), in the optimized graph's order
        self.in_batch = [dim in t.shape for _, t in graph.params]
        self.out_batch = [dim in t.shape for t in graph.result_types]

    @property
    def largest(self):
        return self.compiled[self.sizes[-1]]

    def schedule(self, n: int) -> list[Chunk]:
        """The chunks a batch of n runs as (see the module's docstring)."""
        top = self.sizes[-1]
        chunks = [Chunk(s, top, top) for s in range(0, n - n % top, top)]
        start = n - n % top
        for count, bucket in self._rest(n % top)[1]:
            chunks.append(Chunk(start, count, bucket))
            start += count
        return chunks

    def _rest(self, r: int) -> tuple[float, tuple[tuple[int, int], ...]]:
        """(estimated seconds, ((count, bucket), ...)) of the cheapest way to run r samples
        (r < the largest bucket, so at most that many entries are remembered)."""
        if r == 0:
            return 0.0, ()
        if r in self._memo:
            return self._memo[r]
        up = min(b for b in self.sizes if b >= r)
        best = (self.cost[up], ((r, up),))
        down = max((b for b in self.sizes if b <= r), default=None)  # (None: r is below every bucket)
        if down is not None:
            t, rest = self._rest(r - down)
            if self.cost[down] + t < best[0]:
                best = (self.cost[down] + t, ((down, down),) + rest)
        self._memo[r] = best
        return best

    def _inputs(self, arrays, lo: int, hi: int, size: int) -> list:
        """The inputs of a chunk of `size` samples: samples lo..hi of the batch inputs, padded
        with copies of sample lo (in place when nothing is padded)."""
        if hi - lo == size:
            return [a[lo:hi] if b else a for a, b in zip(arrays, self.in_batch)]
        return [np.concatenate([a[lo:hi], np.repeat(a[lo:lo + 1], size - (hi - lo), axis=0)]) if b else a
                for a, b in zip(arrays, self.in_batch)]

    def _measure(self, arrays, n: int, threads: int | None) -> None:
        """Time each bucket on this call's samples (the better of two runs, one when it is long) and
        schedule by those times from now on: the time model misjudges small graphs, whose time is
        mostly per-kernel overhead (BERT's batch of 3 at buckets 1, 2, 8: padded to 8 took half again
        as long as 2 + 1). Tests pin the speeds instead (PINNED_SPEEDS), so that schedules are reproducible."""
        arrays = [np.ascontiguousarray(a) if b else a for a, b in zip(arrays, self.in_batch)]
        for size, c in self.compiled.items():
            ins = self._inputs(arrays, 0, min(size, n), size)
            ts: list[float] = []
            while not ts or (len(ts) < 2 and ts[0] < LONG_RUN_S):  # (a long run is timed once)
                t0 = time.perf_counter()
                c.run(ins, threads)
                ts.append(time.perf_counter() - t0)
            self.cost[size] = min(ts)
        self._memo.clear()

    def run(self, arrays: list[np.ndarray], n: int, threads: int | None) -> list[np.ndarray]:
        if not self._warm:  # the first call: every bucket's weights packed and arena made now
            for c in self.compiled.values():
                c.runner.warm(arrays)
            if PINNED_SPEEDS is None:
                self._measure(arrays, n, threads)
            self._warm = True
        whole = self.compiled.get(n)
        if whole is not None:  # a bucket size: one call, as without buckets
            return whole.run(arrays, threads)
        chunks = self.schedule(n)
        arrays = [np.ascontiguousarray(a) if b else a for a, b in zip(arrays, self.in_batch)]
        for k in self.largest.runner.bf16_slots:  # an f32 past for a bf16 KV cache: rounded once, here
            if arrays[k].dtype != np.uint16:
                arrays[k] = bf16_bits(arrays[k])
        shapes = self.largest.runner.out_shapes
        # a KV cache's present is the input buffer itself (eqfuse.backend.live's append): a whole
        # chunk appends into its rows of the caller's buffer in place, a padded one into its copy
        # of them, whose rows are copied back; the buffer is returned, as one call returns it
        alias = {k: at for k, (where, at) in self.largest.runner.mem.copies.items() if where == "alias"}
        outs: list = [np.empty((n,) + tuple(s[1:]), dtype=dt) if b and k not in alias else None
                      for k, ((s, dt), b) in enumerate(zip(shapes, self.out_batch))]
        for c in chunks:
            lo, hi, whole = c.start, c.start + c.count, c.count == c.bucket
            ins = self._inputs(arrays, lo, hi, c.bucket)  # padded: the chunk's first sample repeated
            into = [o[lo:hi] if (o is not None and b and whole) else None for o, b in zip(outs, self.out_batch)]
            got = self.compiled[c.bucket].run(ins, threads, into)
            for k, g in enumerate(got):
                if k in alias:
                    if not whole:
                        arrays[alias[k]][lo:hi] = g[:c.count]
                elif not self.out_batch[k]:  # holds no batch: the same for every chunk
                    outs[k] = g
                elif g is not into[k]:  # padded, or an output the runner copies (an input returned)
                    outs[k][lo:hi] = g[:c.count]
        for k, at in alias.items():
            outs[k] = arrays[at]
        return outs


__all__ = ["Bucketed", "Chunk", "default_sizes", "estimate"]
