"""The backend's performance targets (issue 4), measured against numpy in one run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_kernels.py [--repeat N] [--rounds R] [--only TEXT]

(Those two variables, when set, slow numpy's OpenBLAS; unset them for this command only.)
Each row: median over repeats of numpy and of the compiled eqfuse kernel at the same thread
count (numpy's BLAS threads are set to match), their ratio, and the target. The repeats are split
into rounds alternating eqfuse and numpy, so both sides see the same spells of a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

import eqfuse
from eqfuse.cli.bench import blas_threads, sample_times

F32 = np.float32


def cases(rng):
    out = []

    n = 1024
    x, w, b = (rng.standard_normal(s).astype(F32) for s in ((n, n), (n, n), (n,)))
    src = f"graph gemm(x: f32[{n}, {n}], w: f32[{n}, {n}], b: f32[{n}]) -> f32[{n}, {n}] {{ return kernel {{ relu(x @ w + b) }} }}"
    out.append(("GEMM+bias+ReLU 1024^3 vs numpy bare x @ w", src, (x, w, b), lambda: x @ w, 0.9,
                lambda: np.maximum(x @ w + b, F32(0))))

    n = 1 << 24
    a, bb, c = (rng.standard_normal(n).astype(F32) for _ in range(3))
    src = f"graph pw(a: f32[{n}], b: f32[{n}], c: f32[{n}]) -> f32[{n}] {{ return kernel {{ relu(a * b + c) }} }}"
    out.append(("relu(a*b+c), 16M elements", src, (a, bb, c), lambda: np.maximum(a * bb + c, F32(0)), 3.0, None))

    xs = rng.standard_normal((4096, 768)).astype(F32)
    g, be = rng.standard_normal(768).astype(F32), rng.standard_normal(768).astype(F32)
    src = ("graph ln(x: f32[4096, 768], g: f32[768], b: f32[768]) -> f32[4096, 768] "
           "{ return kernel { layernorm(x, g, b) } }")

    def np_ln():
        mu = xs.mean(-1, keepdims=True)
        var = np.square(xs - mu).mean(-1, keepdims=True)
        return (xs - mu) / np.sqrt(var + F32(1e-5)) * g + be
    out.append(("layernorm 4096x768", src, (xs, g, be), np_ln, 3.0, None))

    q, k, v = (rng.standard_normal((12, 512, 64)).astype(F32) for _ in range(3))
    src = ("graph att(q: f32[12, 512, 64], k: f32[12, 512, 64], v: f32[12, 512, 64]) -> f32[12, 512, 64] "
           "{ return kernel { softmax(q @ transpose(k, perm=[0, 2, 1]) * 0.125) @ v } }")

    def np_att():
        s = q @ k.transpose(0, 2, 1) * F32(0.125)
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v
    out.append(("attention 12 heads x 512 x 64", src, (q, k, v), np_att, 2.0, None))

    # sin and cos of rotary angles (common.h's eqf_sinf / eqf_cosf, within 1 ulp); numpy's float32
    # sin and cos are SIMD loops of their own (SVML-style polynomials), so the target is loose:
    # the row tracks the vectorized path (libm's scalar sinf / cosf, before it, took 3x its time)
    n = 1 << 20
    ang = rng.uniform(-1e4, 1e4, n).astype(F32)
    src = f"graph sc(x: f32[{n}]) -> f32[{n}] {{ return kernel {{ sin(x) * cos(x) }} }}"
    out.append(("sin(x) * cos(x), 1M angles in [-1e4, 1e4]", src, (ang,), lambda: np.sin(ang) * np.cos(ang), 0.1,
                None))
    # the same with one angle in 4096 beyond 2^24: the pointwise kernel's two passes compute each
    # tile that holds one again with the table reduction (`eqfuse lower` prints the tile)
    mixed = ang.copy()
    mixed[::4096] = np.float32(3e7)
    out.append(("sin(x) * cos(x), 1M angles, 1 in 4096 beyond 2^24", src, (mixed,),
                lambda: np.sin(mixed) * np.cos(mixed), 0.1, None))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15, help="runs of each side per case and thread count")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of eqfuse and numpy the runs are split into")
    ap.add_argument("--threads", type=int, action="append")
    ap.add_argument("--only", help="the cases whose name contains this text")
    args = ap.parse_args(argv)
    threads = args.threads or [1, 2]
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if os.environ.get(var):
            print(f"warning: {var} is set; numpy may be slower than usual (unset it for this command)",
                  file=sys.stderr)
    rng = np.random.default_rng(0)
    rows = []
    for name, src, arrays, np_fn, target, want_fn in cases(rng):
        if args.only and args.only not in name:
            continue
        mod = eqfuse.compile(src, verify=False)
        fn = mod.default
        got = fn(*arrays)
        want = (want_fn or np_fn)()
        err = float(np.max(np.abs(got - want) / (1 + np.abs(want))))
        k = mod.kernels[0]
        note = ""
        if k.kind == "attention":
            note = f"largest score buffer {k.tiles['bq']}x{k.tiles['bk']}"
        for t in threads:
            # Rounds of eqfuse then numpy, the medians over all of each side's runs: a slow spell
            # of this shared machine then falls on both sides. eqfuse runs with numpy's BLAS
            # threads parked (their spin-wait would take a core).
            eq, npt = [], []
            per = max(1, -(-args.repeat // args.rounds))
            for _ in range(args.rounds):
                blas_threads(1)
                time.sleep(0.2)
                fn.threads = t
                eq += sample_times(lambda: fn(*arrays), per)
                blas_threads(t)
                npt += sample_times(np_fn, per)
            t_eq, t_np = statistics.median(eq), statistics.median(npt)
            rows.append((name, t, t_np, t_eq, t_np / t_eq, target, err, note))
    print(f"{'case':<44}{'thr':>4}{'numpy ms':>11}{'eqfuse ms':>11}{'ratio':>8}{'target':>8}  met  max rel err")
    for name, t, t_np, t_eq, r, target, err, note in rows:
        print(f"{name:<44}{t:>4}{t_np * 1e3:>11.2f}{t_eq * 1e3:>11.2f}{r:>7.2f}x{target:>7.1f}x  "
              f"{'yes' if r >= target else 'NO ':<4} {err:.1e}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
