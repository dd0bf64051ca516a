"""A new sequence length: eqfuse's padded buckets against a compile per length, and onnxruntime.

    python benchmarks/bench_sequence.py [--model bert-base] [--first 128] [--lengths 7 20 50 100 128]
                                        [--batch 1] [--repeat 20] [--threads 1]

The model (tests/model_exports.py: "bert", "gpt2" or "bert-base", random weights) is exported with
dynamic batch and sequence axes, as optimum exports it. Every compile is cold (the kernel cache is
an empty temporary directory).
- "padded": `eqfuse.compile(path)` without dims=; its first call, at --first, checks that padding
  the sequence is exact and compiles every bucket (eqfuse.runtime.padded); later lengths pad.
- "per length": `eqfuse.compile(path, dims={"sequence": n})`, compiled for each length.
- "run-time" (at --batch 1): `eqfuse.compile(path, dims={"batch": 1})`, the sequence taken at run
  time by the loops (eqfuse.backend.runtime_dim): its first call compiles one module at a capacity
  (128, or --first's power of two above) that serves every length up to it.
- onnxruntime (ORT_ENABLE_ALL, the same thread count) on the same dynamic export.
Per length: each one's first call, then --repeat calls interleaved (median ms and spread, the
interquartile range as % of the median); "padded / per length" above 1 is the padding's cost.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ["EQFUSE_CACHE_DIR"] = tempfile.mkdtemp(prefix="eqfuse-bench-sequence-")  # every compile cold

import eqfuse  # noqa: E402


def export(name: str, path: Path) -> None:
    import model_exports as me
    import torch

    model, names = me.torch_model(name)
    ids = torch.randint(0, me.VOCAB, (1, 16))
    axes = {n: {0: "batch", 1: "sequence"} for n in (*names, "y")}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids, torch.ones_like(ids)), str(path), input_names=list(names), output_names=["y"],
                          opset_version=17, dynamo=False, dynamic_axes=axes)


def feeds(b: int, n: int, vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(n)
    mask = np.ones((b, n), np.int64)
    mask[-1, n - n // 4:] = 0  # the last sequence ends in padding
    return {"input_ids": rng.integers(0, vocab, (b, n)).astype(np.int64), "attention_mask": mask}


def timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def rss_mb() -> float:
    """This process's resident memory (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/status") as fh:
            return int(fh.read().split("VmRSS:")[1].split()[0]) / 1024
    except (OSError, IndexError, ValueError):
        return 0.0


def spread(ts) -> str:
    q = statistics.quantiles(ts, n=4)
    return f"{100 * (q[2] - q[0]) / statistics.median(ts):.0f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bert-base", choices=["bert", "gpt2", "bert-base"])
    ap.add_argument("--first", type=int, default=128)
    ap.add_argument("--lengths", type=int, nargs="+", default=[7, 20, 50, 100, 128])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import platform

    import model_exports as me
    import onnxruntime as ort

    print(f"# {platform.processor() or platform.machine()}, {args.threads} thread(s), {os.cpu_count()} cores")
    tmp = Path(tempfile.mkdtemp(prefix="eqfuse-bench-sequence-model-"))
    path = tmp / f"{args.model}.onnx"
    export(args.model, path)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # onnxruntime's threads sleep after a run: spinning, they hold the second core for a while,
    # and the eqfuse call after it (which uses the cores other processes leave free,
    # eqfuse/runtime/load.py) then ran on one thread (the padded model 1.35-2.9x its own
    # compile at 2 threads, at the bucket's own length too)
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    rss0 = rss_mb()
    padded = eqfuse.compile(str(path), threads=args.threads)
    t_first = timed(lambda: padded(**feeds(args.batch, args.first, me.VOCAB)))
    f = padded.default
    print(f"## {args.model}, batch {args.batch}: first call at sequence {args.first} (check + compile every "
          f"bucket, cold): {t_first:.2f} s; the process grew by {rss_mb() - rss0:.0f} MB; {f!r}")
    runtime = None
    if args.batch == 1:
        rss0 = rss_mb()
        runtime = eqfuse.compile(str(path), dims={"batch": 1}, threads=args.threads)
        t_first = timed(lambda: runtime(**feeds(1, args.first, me.VOCAB)))
        print(f"## run-time: first call at sequence {args.first} (check + compile the capacity, cold): "
              f"{t_first:.2f} s; the process grew by {rss_mb() - rss0:.0f} MB; {runtime.default!r}")
    print("| sequence | bucket | first call: padded | compile + first call: per length | onnxruntime first call "
          "| median ms: padded (spread) | per length (spread) | onnxruntime (spread) | run-time (spread) "
          "| padded / per length | run-time / per length | run-time / onnxruntime |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in args.lengths:
        x = feeds(args.batch, n, me.VOCAB)
        fp = timed(lambda x=x: padded(**x))
        t0 = time.perf_counter()
        exact = eqfuse.compile(str(path), dims={"sequence": n}, threads=args.threads)
        exact(**x)
        fe = time.perf_counter() - t0
        fo = timed(lambda x=x: sess.run(None, x))
        want = sess.run(None, x)[0]
        np.testing.assert_allclose(padded(**x), want, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(exact(**x), want, rtol=1e-3, atol=1e-3)
        runs = {"p": lambda x=x: padded(**x), "e": lambda x=x: exact(**x), "o": lambda x=x: sess.run(None, x)}
        if runtime is not None:
            np.testing.assert_allclose(runtime(**x), want, rtol=1e-3, atol=1e-3)
            runs["r"] = lambda x=x: runtime(**x)
        ts = {k: [] for k in runs}
        for _ in range(args.repeat):
            for k, g in runs.items():
                ts[k].append(timed(g) * 1e3)
        med = {k: statistics.median(v) for k, v in ts.items()}
        bucket = next(s for s in f.sizes["sequence"] if s >= n) if f.padding.get("sequence") == "exact" else n
        r = (f"{med['r']:.3f} ({spread(ts['r'])})", f"{med['r'] / med['e']:.2f}", f"{med['r'] / med['o']:.2f}") \
            if "r" in med else ("", "", "")
        print(f"| {n} | {bucket} | {fp * 1e3:.2f} ms | {fe:.2f} s | {fo * 1e3:.2f} ms | {med['p']:.3f} ({spread(ts['p'])}) "
              f"| {med['e']:.3f} ({spread(ts['e'])}) | {med['o']:.3f} ({spread(ts['o'])}) | {r[0]} "
              f"| {med['p'] / med['e']:.2f} | {r[1]} | {r[2]} |")


if __name__ == "__main__":
    main()
