"""A GEMM with a row epilogue against the two kernels it replaces (docs/backend.md, "Kernels").

    python benchmarks/bench_row_epilogue.py [--repeat N] [--threads T ...] [--m M --k K --n N]

Four hand-written kernel forms of layernorm(r + (x @ w + b), g, be), timed in one process,
interleaved call by call on the same arrays: the GEMM with its bias + residual epilogue alone,
the layernorm kernel alone, the two as separate kernels, and one kernel with the layernorm as the
GEMM's row epilogue. Prints a Markdown table of medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import eqfuse  # noqa: E402


def forms(M: int, K: int, N: int) -> dict[str, str]:
    head = (f"graph g(x: f32[{M}, {K}], w: f32[{K}, {N}], b: f32[{N}], r: f32[{M}, {N}], g1: f32[{N}], "
            f"be: f32[{N}]) -> f32[{M}, {N}] {{\n")
    return {
        "GEMM + bias + residual only": head + "    return kernel { r + (x @ w + b) }\n}",
        "layernorm kernel only": head + "    return kernel { layernorm(r + b, g1, be) }\n}",
        "two kernels": head + "    t = kernel { r + (x @ w + b) }\n    return kernel { layernorm(t, g1, be) }\n}",
        "one kernel, row epilogue": head + "    return kernel { layernorm(r + (x @ w + b), g1, be) }\n}",
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=300)
    ap.add_argument("--threads", type=int, action="append")
    ap.add_argument("--m", type=int, default=1024)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--n", type=int, default=256)
    a = ap.parse_args()
    M, K, N = a.m, a.k, a.n
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(M, K), (K, N), (N,), (M, N), (N,), (N,)]]
    srcs = forms(M, K, N)
    print(f"M {M}, K {K}, N {N}; medians of {a.repeat} interleaved calls\n")
    print("| threads | " + " | ".join(srcs) + " |")
    print("|---|" + "---|" * len(srcs))
    for th in a.threads or [1, 2]:
        mods = {k: eqfuse.compile(s, fuse="manual", threads=th) for k, s in srcs.items()}
        ref = eqfuse.reference(srcs["two kernels"])(*args)
        for k, m in mods.items():
            if "only" not in k:
                np.testing.assert_allclose(m(*args), ref, rtol=1e-4, atol=1e-5)
        ts: dict[str, list[float]] = {k: [] for k in mods}
        for _ in range(a.repeat):
            for k, m in mods.items():
                t0 = time.perf_counter()
                m(*args)
                ts[k].append(time.perf_counter() - t0)
        print(f"| {th} | " + " | ".join(f"{statistics.median(v) * 1e3:.3f} ms" for v in ts.values()) + " |")


if __name__ == "__main__":
    main()
