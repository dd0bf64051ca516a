"""Attention shapes beyond bench_kernels' one: head sizes, a causal mask, a long sequence.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_attention.py [--repeat N] [--threads T]

softmax(q @ k^T / sqrt(D) [+ mask]) @ v against numpy op by op, medians over rounds alternating
the two (numpy's BLAS on the same thread count), with the tiles the kernel chose.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

import eqfuse
from eqfuse.cli.bench import blas_threads, sample_times

F32 = np.float32
SHAPES = [(12, 512, 64, False), (12, 512, 64, True), (8, 512, 128, False), (24, 512, 32, False),
          (4, 2048, 64, False)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=21)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{'heads x seq x head size':<26}{'mask':>7}{'numpy ms':>10}{'eqfuse ms':>11}{'ratio':>8}  tiles")
    for H, S, D, causal in SHAPES:
        q, k, v = (rng.standard_normal((H, S, D)).astype(F32) for _ in range(3))
        m = np.where(np.arange(S)[None, :] > np.arange(S)[:, None], -np.inf, 0).astype(F32)
        sc = 1 / np.sqrt(D)
        sig = f"q: f32[{H}, {S}, {D}], k: f32[{H}, {S}, {D}], v: f32[{H}, {S}, {D}]"
        sig += f", m: f32[{S}, {S}]" if causal else ""
        body = f"softmax(q @ transpose(k, perm=[0, 2, 1]) * {sc}{' + m' if causal else ''}) @ v"
        mod = eqfuse.compile(f"graph att({sig}) -> f32[{H}, {S}, {D}] {{ return kernel {{ {body} }} }}")
        fn = mod.default
        fn.threads = args.threads
        xs = (q, k, v, m) if causal else (q, k, v)

        def np_att():
            s = q @ k.transpose(0, 2, 1) * F32(sc)
            if causal:
                s = s + m
            e = np.exp(s - s.max(-1, keepdims=True))
            return (e / e.sum(-1, keepdims=True)) @ v
        np.testing.assert_allclose(fn(*xs), np_att(), rtol=1e-4, atol=1e-5)
        eq, nt = [], []
        per = max(1, -(-args.repeat // 3))
        for _ in range(3):  # rounds: a slow spell of a shared machine falls on both sides
            blas_threads(1)
            eq += sample_times(lambda: fn(*xs), per)
            blas_threads(args.threads)
            nt += sample_times(np_att, per)
        te, tn = statistics.median(eq), statistics.median(nt)
        print(f"{f'{H} x {S} x {D}':<26}{'causal' if causal else '':>7}{tn * 1e3:>10.2f}{te * 1e3:>11.2f}"
              f"{tn / te:>7.2f}x  {mod.kernels[0].tiles}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
