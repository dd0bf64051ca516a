"""A quantized row op as one row kernel (plan quantize_out) against the row kernel and the
quantize kernel apart, one kernel's time alone.

    flock /tmp/eqfuse-bench.lock python benchmarks/bench_quantized_rows.py [--threads 1] [--repeat 500] [--profiles 5]

Each case is the graph quantize_static writes around a row op: x = dequantize_linear(a, s, z),
the row op, quantize_linear(., s2, z) (one zero point for both, as in a quantized BERT). It is
compiled twice: with the rules epilogue_*_quantize (one row kernel storing u8) and without them
(a row kernel storing f32, then a pointwise quantize kernel). Each column is the sum of the
kernels' times in eqfuse.runtime.profile, the best of `profiles` profiles of `repeat` calls (us per
call). The two builds' integers are checked equal first.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

import eqfuse
from eqfuse.runtime.profile import profile

QUANTIZE_RULES = ["epilogue_softmax_quantize", "epilogue_layernorm_quantize", "epilogue_rmsnorm_quantize"]
EXPR = {"layernorm": "layernorm(x, g, b, eps=1e-5)", "softmax": "softmax(x, axis=-1)",
        "rmsnorm": "rmsnorm(x, g, eps=1e-5)"}
# (op, shape, what it is): the tiny quantized BERT of bench_models.py --quantized static --model bert
# (batch 2, sequence 16, hidden 64, 4 heads) and BERT-base's (sequence 128, hidden 768, 12 heads)
CASES = [("layernorm", (32, 64), "tiny BERT"), ("softmax", (2, 4, 16, 16), "tiny BERT"),
         ("rmsnorm", (32, 64), "short rows"),
         ("layernorm", (128, 768), "BERT-base"), ("softmax", (12, 128, 128), "BERT-base")]


def source(op: str, shape: tuple[int, ...]) -> str:
    sh, L = ", ".join(map(str, shape)), shape[-1]
    return (f"graph q(a: u8[{sh}], z: u8, g: f32[{L}], b: f32[{L}]) {{\n"
            f"    x = dequantize_linear(a, 0.05, z)\n"
            f"    return quantize_linear({EXPR[op]}, 0.02, z)\n}}\n")


def kernels_us(mod, feeds, repeat: int, profiles: int) -> tuple[float, int]:
    best = min(sum(r[2] for r in profile(mod, repeat=repeat, **feeds)["kernels"]) for _ in range(profiles))
    return best, len(mod.kernels)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=500)
    ap.add_argument("--profiles", type=int, default=5)
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    rng = np.random.default_rng(0)
    print("| row op [shape] | fused us | separate us | separate / fused |\n|---|---|---|---|")
    for op, shape, what in CASES:
        src = source(op, shape)
        feeds = {"a": rng.integers(0, 256, shape, dtype=np.uint8), "z": np.array(128, np.uint8),
                 "g": rng.standard_normal(shape[-1]).astype(np.float32),
                 "b": rng.standard_normal(shape[-1]).astype(np.float32)}
        fused = eqfuse.compile(src, threads=args.threads)
        separate = eqfuse.compile(src, threads=args.threads, disable=QUANTIZE_RULES)
        np.testing.assert_array_equal(fused(**feeds), separate(**feeds))
        tf, nf = kernels_us(fused, feeds, args.repeat, args.profiles)
        ts, ns = kernels_us(separate, feeds, args.repeat, args.profiles)
        print(f"| {op} {list(shape)} ({what}) | {tf:.2f} ({nf} kernel) | {ts:.2f} ({ns} kernels) | {ts / tf:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
