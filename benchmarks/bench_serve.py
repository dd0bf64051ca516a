"""Serving from Python threads: `python benchmarks/bench_serve.py [--model mlp bert] [--rounds 7] [--seconds 0.4] [--call-threads 1]`.

One model (tests/model_exports.py: the MLP 784-1024-1024-10 at batch 8, the small BERT at 2 x 16,
exported to ONNX) is served by 1, 2 and 4 Python threads that call it back to back: eqfuse's
Module (compiled once, shared by the threads) and an onnxruntime session (ORT_ENABLE_ALL, one
session shared by the threads, as its docs allow), each call on --call-threads threads
(EQFUSE's threads=, onnxruntime's intra_op_num_threads). The threads start together at a barrier
and each makes the same number of calls (about --seconds of work at 1 thread); throughput is
the calls of all threads over the time until the last one ends. Runtimes and thread counts
alternate within each of --rounds rounds (a shared VM drifts); the table gives the median
calls/s over the rounds, the spread (IQR as % of the median), the scaling over 1 thread and the
ratio to onnxruntime. Both runtimes' outputs are checked against each other first. The C call
of both releases the GIL, so 2 threads on 2 cores can double the throughput.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import model_exports as me  # noqa: E402

import eqfuse  # noqa: E402


def stats(xs: list[float]) -> tuple[float, float]:
    """(median, IQR as % of the median)."""
    med = statistics.median(xs)
    if len(xs) < 2:
        return med, 0.0
    q = statistics.quantiles(xs, n=4)
    return med, 100 * (q[2] - q[0]) / med


def served(call, feeds: list[dict], calls: int) -> float:
    """Calls per second of len(feeds) threads, each making `calls` calls of call(feeds[k])."""
    n = len(feeds)
    start = threading.Barrier(n + 1)
    ends = [0.0] * n

    def work(k):
        f = feeds[k]
        start.wait()
        for _ in range(calls):
            call(f)
        ends[k] = time.perf_counter()
    ts = [threading.Thread(target=work, args=(k,)) for k in range(n)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return n * calls / (max(ends) - t0)


def runtimes(name: str, threads: int) -> dict:
    import onnxruntime as ort

    path = me.export(name, "torchscript")
    mod = eqfuse.compile(str(path), threads=threads)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feeds = me.inputs(name)
    np.testing.assert_allclose(mod(**feeds), sess.run(None, feeds)[0], rtol=1e-3, atol=1e-3)
    return {"eqfuse": lambda f: mod(**f), "onnxruntime": lambda f: sess.run(None, f)}, feeds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="+", default=["mlp", "bert"], choices=["mlp", "bert", "gpt2", "resnet18"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=0.4, help="work per thread and measurement, at 1 thread")
    ap.add_argument("--call-threads", type=int, default=1, help="threads of each call (both runtimes)")
    ap.add_argument("--callers", type=int, nargs="+", default=[1, 2, 4])
    args = ap.parse_args()
    load = [os.getloadavg()[0]]
    print(f"{'model':<6} {'runtime':<12} {'callers':>7} {'calls/s':>9} {'iqr%':>5} {'x 1 caller':>10} {'/ ORT':>6}")
    for name in args.model:
        runs, feeds = runtimes(name, args.call_threads)
        one = {}
        for who, call in runs.items():  # calls per thread: about --seconds at 1 thread
            for _ in range(5):
                call(feeds)
            t0 = time.perf_counter()
            for _ in range(20):
                call(feeds)
            one[who] = max(5, int(args.seconds / ((time.perf_counter() - t0) / 20)))
        rates = {(who, n): [] for who in runs for n in args.callers}
        for _ in range(args.rounds):
            for n in args.callers:
                for who, call in runs.items():
                    copies = [{k: v.copy() for k, v in feeds.items()} for _ in range(n)]
                    rates[who, n].append(served(call, copies, one[who]))
            load.append(os.getloadavg()[0])
        for who in runs:
            for n in args.callers:
                med, iqr = stats(rates[who, n])
                base = stats(rates[who, args.callers[0]])[0]
                ort_med = stats(rates["onnxruntime", n])[0]
                print(f"{name:<6} {who:<12} {n:>7} {med:>9.0f} {iqr:>5.0f} {med / base:>10.2f} {med / ort_med:>6.2f}")
    print(f"{args.rounds} rounds; each call on {args.call_threads} thread(s); one Module / one session shared by "
          f"the calling threads; load average (1 min) {min(load):.2f}-{max(load):.2f} over the run.")


if __name__ == "__main__":
    main()
