"""Attention shapes beyond bench_kernels' one: head sizes, a causal mask, a long sequence.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_attention.py [--repeat N] [--threads T]
    python benchmarks/bench_attention.py --precision bf16 [--repeat N] [--threads T]

softmax(q @ k^T / sqrt(D) [+ mask]) @ v against numpy op by op, medians over rounds alternating
the two (numpy's BLAS on the same thread count), with the tiles the kernel chose.

--precision bf16: the bf16 attention on the path its plan takes, against the same attention planned
without AMX (this machine's model with amx_bf16 off: f32 where vdpbf16ps is slow, else vdpbf16ps)
and, on a CPU with AMX, on AMX tiles at any key count (attention.AMX_MIN_KEYS set to 0 for that
compile), over short to long sequences with a padding mask, calls interleaved one by one (BERT's 12
heads of 64, a ViT's, tiny ones): the measurement behind attention.AMX_MIN_KEYS.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import numpy as np

import eqfuse
from eqfuse import machine
from eqfuse.backend.kinds import attention
from eqfuse.cli.bench import blas_threads, sample_times

F32 = np.float32
SHAPES = [(12, 512, 64, False), (12, 512, 64, True), (8, 512, 128, False), (24, 512, 32, False),
          (4, 2048, 64, False)]


# (heads, sequence, head size) of --precision bf16: a tiny ViT's heads, short sequences around one
# 64-key tile, BERT-base's 128, a ViT-base's 197, 512
BF16_SHAPES = [(4, 17, 16), (12, 17, 64), (12, 32, 64), (12, 50, 64), (12, 64, 32), (12, 64, 64), (12, 128, 64),
               (12, 197, 64), (12, 512, 64)]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return next((ln.partition(":")[2].strip() for ln in fh if ln.startswith("model name")), "this CPU")
    except OSError:
        return "this CPU"


def bf16_main(args) -> int:
    """The plan's bf16 path against the path without AMX, one attention per shape (a padding mask)."""
    rng = np.random.default_rng(0)
    print(f"# {_cpu_name()}, {args.threads} thread(s)")
    print(f"{'heads x seq x head size':<26}{'path':>10}{'us':>9}{'iqr%':>6}{'without AMX':>13}{'us':>9}{'iqr%':>6}"
          f"{'ratio':>8}{'AMX always':>12}{'us':>9}{'ratio':>8}")
    for H, S, D in BF16_SHAPES:
        src = (f"graph a(q: f32[1, {H}, {S}, {D}], k: f32[1, {H}, {S}, {D}], v: f32[1, {H}, {S}, {D}], "
               f"m: f32[1, 1, 1, {S}]) -> f32[1, {H}, {S}, {D}] {{\n  return softmax(q @ transpose(k, perm=[0, 1, 3, 2])"
               f" * {1 / np.sqrt(D)} + m, axis=-1) @ v\n}}\n")
        xs = [rng.standard_normal((1, H, S, D)).astype(F32) for _ in range(3)] + [np.zeros((1, 1, 1, S), F32)]
        fns, paths = [], []
        for model, least in ((machine.machine(), attention.AMX_MIN_KEYS),
                             (dataclasses.replace(machine.machine(), amx_bf16=False), attention.AMX_MIN_KEYS),
                             (machine.machine(), 0)):
            keep, attention.AMX_MIN_KEYS = attention.AMX_MIN_KEYS, least
            try:
                with machine.pinned(model):
                    fn = eqfuse.compile(src, precision="bf16").default
                    fn(*xs)
            finally:
                attention.AMX_MIN_KEYS = keep
            fn.threads = args.threads
            fns.append(fn)
            paths.append(next(p.precision_path for p in fn.last.plans if p.kind == "attention"))
        ts = [[], [], []]
        for _ in range(args.repeat * 10):  # (calls of tens of microseconds: many, interleaved)
            for i, fn in enumerate(fns):
                t = time.perf_counter()
                fn(*xs)
                ts[i].append(time.perf_counter() - t)
        med = [statistics.median(t) for t in ts]
        iqr = [100 * (np.percentile(t, 75) - np.percentile(t, 25)) / m for t, m in zip(ts, med)]
        print(f"{f'{H} x {S} x {D}':<26}{paths[0]:>10}{med[0] * 1e6:>9.1f}{iqr[0]:>6.0f}{paths[1]:>13}"
              f"{med[1] * 1e6:>9.1f}{iqr[1]:>6.0f}{med[1] / med[0]:>7.2f}x{paths[2]:>12}{med[2] * 1e6:>9.1f}"
              f"{med[2] / med[0]:>7.2f}x")
    print("ratio: the other path's time over the plan's (above 1: the plan's path is faster). Medians of "
          f"{args.repeat * 10} interleaved calls.")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=21)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precision", choices=("f32", "bf16"), default="f32")
    args = ap.parse_args(argv)
    if args.precision == "bf16":
        return bf16_main(args)
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
