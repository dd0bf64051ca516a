"""relu(transpose(x) @ w + b): A packed from its transpose (one kernel) against the transpose
copied first by a layout kernel (the rules kernel_matmul_at* disabled), interleaved in one process.

    python benchmarks/bench_transposed_a.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import eqfuse
from eqfuse.cli.bench import blas_threads


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=21)
    args = ap.parse_args(argv)
    blas_threads(1)
    rng = np.random.default_rng(0)
    print(f"{'M x K x N':<18}{'threads':>8}{'copy + GEMM ms':>16}{'A in place ms':>15}{'ratio':>8}")
    for M, K, N in ((1024, 1024, 1024), (256, 768, 3072)):
        src = (f"graph f(x: f32[{K}, {M}], w: f32[{K}, {N}], b: f32[{N}]) -> f32[{M}, {N}] "
               "{ return relu(transpose(x) @ w + b) }")
        x, w = rng.standard_normal((K, M)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
        b = rng.standard_normal(N).astype(np.float32)
        new = eqfuse.compile(src)
        old = eqfuse.compile(src, disable=["kernel_matmul_at", "kernel_matmul_at_2d"])
        assert len(new.kernels) == 1 and len(old.kernels) == 2
        np.testing.assert_allclose(new(x, w, b), old(x, w, b), rtol=1e-4, atol=1e-3)
        for th in (1, 2):
            new.f.threads = old.f.threads = th
            t_old, t_new = [], []
            for _ in range(args.repeat):
                t = time.perf_counter()
                old(x, w, b)
                t_old.append(time.perf_counter() - t)
                t = time.perf_counter()
                new(x, w, b)
                t_new.append(time.perf_counter() - t)
            a, c = statistics.median(t_old), statistics.median(t_new)
            print(f"{f'{M} x {K} x {N}':<18}{th:>8}{a * 1e3:>16.2f}{c * 1e3:>15.2f}{a / c:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
