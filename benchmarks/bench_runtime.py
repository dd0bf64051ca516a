"""Per-call overhead of a compiled graph: chains of n tiny kernels, one call each.

    python benchmarks/bench_runtime.py [--repeat N] [--threads T]

A chain of n pointwise ops on 16 floats, compiled with fuse=False (every op its own kernel), so
the kernels' own work is a few ns and the time is the runtime's: argument checks in Python, the
call(s) into C and the kernel calls. Prints the median µs per graph call for each n and the
least-squares fit: µs per call (intercept) + µs per kernel (slope).
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

import eqfuse
from eqfuse.cli.bench import median_time


def chain(n: int) -> str:
    ops = [f"    y{i + 1} = y{i} * 1.0001 + 0.5" for i in range(n)]
    return "graph chain(x: f32[16]) {\n    y0 = x\n" + "\n".join(ops) + f"\n    return y{n}\n}}\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    x = np.ones(16, np.float32)
    ns, ts = [], []
    print(f"{'kernels':>8} {'us/call':>9}")
    for n in (1, 4, 16, 32, 64):
        mod = eqfuse.compile(chain(n), fuse=False, threads=args.threads)
        k = len([q for q in mod.kernels if q.kind != "view"])
        t = 1e6 * median_time(lambda: mod(x), args.repeat, warmup=50)
        ns.append(k)
        ts.append(t)
        print(f"{k:>8} {t:>9.2f}")
    slope, icpt = statistics.linear_regression(ns, ts)
    print(f"fit: {icpt:.2f} us per call + {slope:.3f} us per kernel")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
