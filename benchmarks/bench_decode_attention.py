"""The decode attention alone (one query row per head over a KV cache in place, live="P"):
grouped-query attention's g query heads over each key/value head, at several live lengths.

    flock /tmp/eqfuse-bench.lock python benchmarks/bench_decode_attention.py [--threads 1]
        [--heads 12] [--kv 4] [--kv 12] [--head-size 64] [--live 250 --live 1000 --live 4000]
        [--capacity 4096] [--calls 200] [--precision f32|bf16]

A one-layer decode step written in .g (the two appends and the attention, the keys and values
repeated for the query heads in the graph, which the attention reads through: the plan's
kv_group and kv_rows), batch 1, compiled once per key/value head count; at each live length the
median and the fastest of `--calls` calls in us, the median less that of a call at one key (the
call's fixed cost, some 18 us: the attention's time at these keys, near enough), and the
key/value bytes of the live rows over that difference (each row counted once, the bytes a step
must read at least).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def source(h: int, kv: int, d: int) -> str:
    g = h // kv
    rep = ("    rk = keys\n    rv = values\n" if g == 1 else
           f"    rk = reshape(expand(unsqueeze(keys, axis=2), shape=[1, 1, {g}, 1, 1]), shape=[1, {h}, -1, {d}])\n"
           f"    rv = reshape(expand(unsqueeze(values, axis=2), shape=[1, 1, {g}, 1, 1]), shape=[1, {h}, -1, {d}])\n")
    return (f"graph step(q: f32[1, {h}, 1, {d}], pk: f32[1, {kv}, P, {d}], pv: f32[1, {kv}, P, {d}], "
            f"k: f32[1, {kv}, 1, {d}], v: f32[1, {kv}, 1, {d}]) {{\n"
            "    keys = concat(pk, k, axis=2)\n    values = concat(pv, v, axis=2)\n" + rep +
            f"    a = softmax(q @ transpose(rk, perm=[0, 1, 3, 2]) * {d ** -0.5}, axis=-1) @ rv\n"
            "    return a, keys, values\n}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv", type=int, action="append")
    ap.add_argument("--head-size", type=int, default=64)
    ap.add_argument("--live", type=int, action="append")
    ap.add_argument("--capacity", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--precision", default="f32", choices=["f32", "bf16"])
    a = ap.parse_args()
    os.environ["EQFUSE_NUM_THREADS"] = str(a.threads)
    import eqfuse

    kvs, lives, d, cap = a.kv or [4, 12], a.live or [250, 1000, 4000], a.head_size, a.capacity
    if max(lives) > cap:
        ap.error("every --live must fit the --capacity")
    print(f"decode attention, {a.heads} query heads of {d}, batch 1, {a.threads} thread(s), {a.precision}, "
          f"capacity {cap}, load average {os.getloadavg()[0]:.1f}")
    print(f"  {'kv heads':>8} {'g':>3} {'kv_rows':>7} {'live':>6} {'median us':>10} {'min us':>8} {'less 1-key':>9} {'K/V GB/s':>9}")
    rng = np.random.default_rng(0)
    for kv in kvs:
        step = eqfuse.compile(source(a.heads, kv, d), dims={"P": cap}, live="P", threads=a.threads,
                              precision=a.precision)
        (att,) = [k for k in step.kernels if k.kind == "attention"]
        rows = att.decisions.get("kv_rows", 1)
        bufs = {n: rng.standard_normal((1, kv, cap + 1, d), dtype=np.float32) for n in ("pk", "pv")}
        if a.precision == "bf16":
            from eqfuse.runtime.program import bf16_bits
            bufs = {n: bf16_bits(b) for n, b in bufs.items()}
        x = {"q": rng.standard_normal((1, a.heads, 1, d), dtype=np.float32),
             "k": rng.standard_normal((1, kv, 1, d), dtype=np.float32),
             "v": rng.standard_normal((1, kv, 1, d), dtype=np.float32)}
        def timed(t: int) -> list[float]:
            live = np.array([t], np.int64)
            for _ in range(5):
                step(**x, **bufs, P_length=live)
            times = []
            for _ in range(a.calls):
                t0 = time.perf_counter()
                step(**x, **bufs, P_length=live)
                times.append(time.perf_counter() - t0)
            return times

        fixed = statistics.median(timed(0))
        for t in lives:
            times = timed(t)
            med = statistics.median(times)
            nbytes = 2 * kv * (t + 1) * d * (2 if a.precision == "bf16" else 4)
            print(f"  {kv:>8} {a.heads // kv:>3} {rows:>7} {t + 1:>6} {med * 1e6:>10.1f} {min(times) * 1e6:>8.1f} "
                  f"{(med - fixed) * 1e6:>9.1f} {nbytes / (med - fixed) / 1e9:>9.1f}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
