"""The decode step over a KV cache in place (live="past") at two capacities and the same live
lengths: its time should not depend on the capacity reserved.

    flock /tmp/eqfuse-bench.lock python benchmarks/bench_live_capacity.py --threads 1
        [--batch 1] [--capacity 256 --capacity 2048] [--live 16 --live 250] [--calls 40] [--precision bf16]
        [--model llama]

The GPT-2-small-sized export of benchmarks/bench_generate.py (12 layers, 768 wide, 12 heads,
random weights), or with `--model llama` a Llama-style export of the same size with grouped-query
attention (12 query heads over 4 key/value heads: the decode attention reads each cache head for
3 query heads, no repeat kernel), its decode step compiled once per capacity
(eqfuse.generation's step, sharing the weights), the caches random. At each live length the
capacities' steps are called in turn, `--calls` times each (so the machine's load falls on both
alike): the median and the fastest call in ms, then one profile (eqfuse.runtime.profile, 10 calls) for the median attention kernel per
layer and the pointwise and index kernels' total (the mask's cast; the embedding gathers). The
attention's K/V stream: the bytes of one layer's live key and value rows (f32, or bf16 under
`--precision bf16`: the cache is bf16) over its time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--capacity", type=int, action="append")
    ap.add_argument("--live", type=int, action="append")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--precision", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--model", default="gpt2", choices=["gpt2", "llama"])
    a = ap.parse_args()
    caps, lives = a.capacity or [256, 2048], a.live or [16, 250]
    if max(lives) > min(caps):
        ap.error("every --live must fit every --capacity")
    os.environ["EQFUSE_NUM_THREADS"] = str(a.threads)
    import decoder_exports as de

    import eqfuse
    from eqfuse.runtime.profile import profile

    if a.model == "gpt2":
        path, kvh = de.export_decoder("gpt2", "torchscript", 12, 768, 12, 1024, vocab=50257), 12
    else:
        path, kvh = de.export_decoder("llama", "torchscript", 12, 768, 12, 1024, vocab=32000, ff=2048, kv_heads=4), 4
    mod = eqfuse.compile(path, threads=a.threads, precision=a.precision)
    rng = np.random.default_rng(0)
    b = a.batch
    steps, feeds = {}, {}
    for c in caps:
        steps[c] = mod.default.live_module({"batch": b, "sequence": 1, "past": c, "total": c + 1}, "past")
        f = {"input_ids": np.zeros((b, 1), np.int64), "attention_mask": np.zeros((b, c + 1), np.int64),
             "position_ids": np.zeros((b, 1), np.int64), "past_length": np.array([0])}
        for i in range(12):
            for kv in ("key", "value"):
                f[f"past_key_values_{i}_{kv}"] = rng.standard_normal((b, kvh, c + 1, 64), dtype=np.float32)
        feeds[c] = f
    name = "GPT-2-small" if a.model == "gpt2" else "Llama-style (GQA, 12 query heads over 4)"
    copies = sum(k.decisions.get("live", "").startswith("repeat") for k in steps[caps[0]].kernels)
    print(f"{name} decode step ({copies} kernels copying the live rows of a cache for the query heads), {a.precision}, batch {b}, {a.threads} thread(s), "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"  {'live':>4} {'capacity':>8} {'median ms':>9} {'min ms':>7} {'attention us/layer':>18} "
          f"{'K/V GB/s':>8} {'pointwise us':>12} {'index us':>8}")
    for n in lives:
        times: dict[int, list[float]] = {c: [] for c in caps}
        for c in caps:
            f = feeds[c]
            f["attention_mask"][:] = 0
            f["attention_mask"][:, :n + 1] = 1  # the live rows and the new token's
            f["position_ids"][:] = n
            f["past_length"][0] = n
            outs = steps[c](**f)
            # the presents are the caches the step holds (bf16 under precision="bf16": the f32
            # arrays rounded once, here), fed back as the past, as eqfuse.generate does
            f.update(zip([k for k in f if k.startswith("past_key_values")], outs[1:]))
        for _ in range(a.calls):
            for c in caps:
                t = time.perf_counter()
                steps[c](**feeds[c])
                times[c].append(time.perf_counter() - t)
        for c in caps:
            rows = profile(steps[c], repeat=10, **feeds[c])["kernels"]
            att = statistics.median(us for _, k, us, _ in rows if k == "attention")
            pw = sum(us for _, k, us, _ in rows if k == "pointwise")
            ix = sum(us for _, k, us, _ in rows if k == "index")
            elem = f["past_key_values_0_key"].itemsize  # (2: a bf16 cache)
            kv = 2 * b * kvh * (n + 1) * 64 * elem  # one layer's live keys and values, the new row's too
            print(f"  {n:>4} {c:>8} {1e3 * statistics.median(times[c]):9.2f} {1e3 * min(times[c]):7.2f} "
                  f"{att:18.0f} {kv / att / 1e3:8.1f} {pw:12.1f} {ix:8.1f}", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
