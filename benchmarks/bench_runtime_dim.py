"""A sequence length at run time: one compile at a capacity against padding and a compile per length.

    python benchmarks/bench_runtime_dim.py [--width 768] [--heads 12] [--capacity 128]
                                           [--lengths 8 20 50 100 128] [--repeat 30] [--threads 1]

One post-norm encoder layer written in .g, its sequence S a named dim (BERT-base's sizes by
default: width 768, 12 heads, an MLP of 4 x 768), random weights. Per length n:
- "run-time": compiled once at S = --capacity with live="S" (eqfuse.backend.runtime_dim), called
  with the capacity's buffers and S_length = n;
- "buckets=": `eqfuse.compile(src, buckets={"S": [capacity]})`, which takes S at run time the same
  way, called with arrays of n rows (its copies into the capacity's buffers included);
- "padded": what padding to buckets runs: the layer compiled at S = n's bucket (the power of two
  at or above n, at least 16), called with n rows and zeros up to it;
- "per length": the layer compiled at S = n, the floor.
Calls interleaved (benchmarks/timing.py); median ms and the interquartile range as % of the median,
each at GFLOP/s (the layer's multiply-adds at n, x2) and as a fraction of this core's f32 FMA peak
(measured first, bench_gemm.measure_peaks).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import eqfuse  # noqa: E402
from bench_gemm import measure_peaks  # noqa: E402
from model_exports import encoder_g  # noqa: E402
from timing import alternate  # noqa: E402


def flops(n: int, width: int, ff: int) -> float:
    """The layer's FLOPs at S = n: its GEMMs and the attention's two products."""
    return 2.0 * n * (4 * width * width + 2 * width * ff) + 2.0 * 2 * n * n * width


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--capacity", type=int, default=128)
    ap.add_argument("--lengths", type=int, nargs="+", default=[8, 20, 50, 100, 128])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    w, cap, ff = args.width, args.capacity, 4 * args.width
    if any(n > cap for n in args.lengths):
        ap.error("every --lengths value must be at most --capacity")
    src = encoder_g(w, args.heads, ff)
    rng = np.random.default_rng(0)
    weights = {n: (rng.standard_normal(t.shape) * 0.05).astype(np.float32)
               for n, t in eqfuse.reference(src).default.params if "S" not in t.shape}
    peak = measure_peaks(args.threads)["f32"]
    runtime = eqfuse.compile(src, dims={"S": cap}, live="S", threads=args.threads)
    buckets = eqfuse.compile(src, buckets={"S": [cap]}, threads=args.threads)
    fixed: dict[int, object] = {}

    def at(n: int):
        if n not in fixed:
            fixed[n] = eqfuse.compile(src, dims={"S": n}, threads=args.threads)
        return fixed[n]

    print(f"encoder layer: width {w}, {args.heads} heads, MLP {ff}; capacity {cap}; {args.threads} thread(s); "
          f"f32 FMA peak {peak:.0f} GFLOP/s")
    print(f"{'S':>5} {'run':<11} {'ms':>8} {'iqr%':>5} {'GFLOP/s':>8} {'of peak':>8} {'/ per length':>12}")
    for n in args.lengths:
        x = rng.standard_normal((n, w)).astype(np.float32)
        xc = np.zeros((cap, w), np.float32)
        xc[:n] = x
        b = max(16, 1 << (n - 1).bit_length())
        xb = np.zeros((b, w), np.float32)
        xb[:n] = x
        length = np.array([n])
        runs = {"run-time": lambda: runtime(x=xc, S_length=length, **weights),
                "buckets=": lambda: buckets(x=x, **weights),
                f"padded {b}": lambda: at(b)(x=xb, **weights),
                "per length": lambda: at(n)(x=x, **weights)}
        for r in runs.values():
            r()
        times = alternate(runs, args.repeat, args.threads)
        floor = statistics.median(times["per length"])
        for k, ts in times.items():
            med = statistics.median(ts)
            q = np.percentile(ts, [25, 75])
            gf = flops(n, w, ff) / med / 1e9
            print(f"{n:>5} {k:<11} {med * 1e3:8.3f} {100 * (q[1] - q[0]) / med:5.0f} {gf:8.1f} "
                  f"{gf / peak:8.0%} {med / floor:12.2f}")


if __name__ == "__main__":
    main()
