"""RSS of a process whose short-lived Python threads each call a compiled MLP a few times.

Every round starts `--threads` threads, one after another in batches of `--batch`; each thread
makes `--calls` calls and exits. Per-thread memory (the graph's arena, the kernels' scratch
buffers of the thread and of its OpenMP workers) must be freed at thread exit, so the RSS after
each round stays flat after the first.

    python benchmarks/bench_thread_rss.py --rounds 4 --threads 300 --calls 3
"""

from __future__ import annotations

import argparse
import os
import threading

import numpy as np

import eqfuse

MLP = """graph mlp(x: f32[B, 784], w1: f32[784, 1024], b1: f32[1024],
          w2: f32[1024, 10], b2: f32[10]) -> f32[B, 10] {
    h = relu(x @ w1 + b1)
    return h @ w2 + b2
}
"""


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=300)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8, help="threads alive at once")
    ap.add_argument("--rows", type=int, default=64, help="B, the MLP's batch")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.rows, 784), dtype=np.float32)
    w1 = rng.standard_normal((784, 1024), dtype=np.float32) * 0.03
    b1 = rng.standard_normal(1024, dtype=np.float32)
    w2 = rng.standard_normal((1024, 10), dtype=np.float32) * 0.03
    b2 = rng.standard_normal(10, dtype=np.float32)
    mod = eqfuse.compile(MLP, dims={"B": a.rows})
    want = eqfuse.reference(MLP)(x, w1, b1, w2, b2)
    errors = []

    def work():
        for _ in range(a.calls):
            y = mod(x, w1, b1, w2, b2)
            if not np.allclose(y, want, rtol=1e-4, atol=1e-4):
                errors.append("wrong result")

    print(f"start: {rss_mb():.1f} MB")
    for r in range(a.rounds):
        for i in range(0, a.threads, a.batch):
            ts = [threading.Thread(target=work) for _ in range(min(a.batch, a.threads - i))]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
        print(f"round {r + 1}: {rss_mb():.1f} MB")
    if errors:
        raise SystemExit(f"{len(errors)} wrong results")


if __name__ == "__main__":
    main()
