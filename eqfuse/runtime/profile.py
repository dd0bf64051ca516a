"""Where a compiled graph's time goes: each kernel's wall time inside the graph's one C call.

    rows = eqfuse.runtime.profile.profile(mod.encoder, *arrays, repeat=50)
    print(eqfuse.runtime.profile.table(rows))

The run function of every compiled graph (eqfuse.runtime.program.emit_run) can time its kernels
with clock_gettime around each call; `profile` turns that on for `repeat` calls and returns
(kernel name, kind, mean microseconds per call, share of the kernels' total) per kernel, in the
order they run. The rest of a call (Python, argument checks, the one cffi call) is the difference
between the call's time and the kernels' total, which `table` prints too.
"""

from __future__ import annotations

import time

import numpy as np

from eqfuse.runtime.program import run_name


def profile(fn, *arrays, repeat: int = 20, **keywords) -> dict:
    """Profile `fn` (a compiled graph: `mod` of one graph or `mod.<graph>`) on these arrays."""
    fn = fn if hasattr(fn, "compiled") else fn.default  # a Module: its first graph
    fn(*arrays, **keywords)  # compiled for these arrays' dims, and warm
    c = fn.last
    sizes = fn.bucket_sizes_of_last()
    if sizes and fn.last_batch not in sizes:  # the call ran as chunks of several run functions
        from eqfuse.errors import ArgumentError

        raise ArgumentError(f"profile: a batch of {fn.last_batch} ({fn.batch_dim}) runs in chunks of the "
                            f"compiled sizes {', '.join(map(str, sizes))}; profile at one of them")
    runner = c.runner
    if runner.fn is None:
        return {"kernels": [], "call_us": 0.0}
    name = run_name(c.kgraph.name)
    on, times = getattr(c.lib, f"{name}_profile"), getattr(c.lib, f"{name}_times")
    ns = np.zeros(max(len(runner.kernels), 1), dtype=np.float64)
    on(1)
    try:
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn(*arrays, **keywords)
        call = (time.perf_counter() - t0) / repeat
        times(c.ffi.cast("double *", ns.ctypes.data))
    finally:
        on(0)
    total = float(ns[:len(runner.kernels)].sum()) or 1.0
    rows = [(p.name, str(p.kind), float(ns[k]) / repeat / 1e3, float(ns[k]) / total)
            for k, p in enumerate(runner.kernels)]
    return {"kernels": rows, "call_us": call * 1e6}


def table(result: dict, top: int | None = None) -> str:
    """The profile as text: the kernels by time, then the call's total and what is outside them."""
    rows = sorted(result["kernels"], key=lambda r: -r[2])[:top]
    width = max([len(r[0]) for r in rows] + [6])
    lines = [f"{'kernel':<{width}}  {'kind':<15} {'us':>9} {'share':>6}"]
    lines += [f"{n:<{width}}  {k:<15} {us:>9.1f} {sh:>6.1%}" for n, k, us, sh in rows]
    inside = sum(r[2] for r in result["kernels"])
    lines.append(f"kernels {inside:.1f} us of a {result['call_us']:.1f} us call "
                 f"({result['call_us'] - inside:.1f} us outside the kernels)")
    return "\n".join(lines)
