"""Weights bound by params= (packed once) against the same weights passed at every call.

    python benchmarks/bench_prepack.py [--repeat N] [--batch B ...]

examples/mlp.g at several batch sizes, 1 and 2 threads: medians of interleaved calls of the two
compiled modules on the same arrays.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import eqfuse
from eqfuse.cli.bench import blas_threads

MLP = Path(__file__).resolve().parent.parent / "examples" / "mlp.g"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--batch", type=int, action="append")
    args = ap.parse_args(argv)
    blas_threads(1)
    rng = np.random.default_rng(0)
    w1, b1 = rng.standard_normal((784, 1024)).astype(np.float32) * 0.05, rng.standard_normal(1024).astype(np.float32)
    w2, b2 = rng.standard_normal((1024, 10)).astype(np.float32) * 0.05, rng.standard_normal(10).astype(np.float32)
    print(f"{'batch':>6}{'threads':>8}{'weights passed ms':>19}{'weights bound ms':>18}{'ratio':>8}")
    for B in args.batch or [8, 32, 64, 256, 1024]:
        x = rng.standard_normal((B, 784)).astype(np.float32)
        free = eqfuse.compile(str(MLP), dims={"B": B})
        bound = eqfuse.compile(str(MLP), dims={"B": B}, params={"w1": w1, "w2": w2})
        np.testing.assert_allclose(bound(x, b1, b2), free(x, w1, b1, w2, b2), rtol=1e-4, atol=1e-4)
        for th in (1, 2):
            free.mlp.threads = bound.mlp.threads = th
            calls = {"free": lambda: free(x, w1, b1, w2, b2), "bound": lambda: bound(x, b1, b2)}
            times = {k: [] for k in calls}
            for _ in range(args.repeat):
                for k, f in calls.items():
                    t = time.perf_counter()
                    f()
                    times[k].append(time.perf_counter() - t)
            a, b = statistics.median(times["free"]), statistics.median(times["bound"])
            print(f"{B:>6}{th:>8}{a * 1e3:>19.3f}{b * 1e3:>18.3f}{a / b:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
