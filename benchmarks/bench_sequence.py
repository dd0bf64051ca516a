"""A new sequence length: eqfuse's sequence at run time, its padded buckets, a compile per length, and onnxruntime.

    python benchmarks/bench_sequence.py [--model bert-base] [--first 128] [--lengths 7 20 50 100 128]
                                        [--batch 1] [--repeat 20] [--threads 1]

The model (tests/model_exports.py: "bert", "gpt2" or "bert-base", random weights) is exported with
dynamic batch and sequence axes, as optimum exports it. Every compile is cold (the kernel cache is
an empty temporary directory).
- "run-time": `eqfuse.compile(path)` without dims=; its first call, at --first, compiles one module
  at a capacity (128, or --first's power of two above) whose loops take the sequence at run time
  (eqfuse.backend.runtime_dim), the batch on its buckets; it serves every length up to it.
- "padded": the same, with the run-time path refused (as where a kernel cannot take it): the first
  call checks that padding the sequence is exact and compiles every bucket (eqfuse.runtime.padded);
  later lengths pad.
- "per length": `eqfuse.compile(path, dims={"sequence": n})`, compiled for each length.
- onnxruntime (ORT_ENABLE_ALL, the same thread count) on the same dynamic export.
Per length: each one's first call, then --repeat calls interleaved (median ms and spread, the
interquartile range as % of the median); "/ per length" above 1 is the cost of one module for all.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import os
import shutil
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
# (its kernels, several GB for BERT-base's modules, and the export go when the run ends)
atexit.register(shutil.rmtree, os.environ["EQFUSE_CACHE_DIR"], True)

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
    atexit.register(shutil.rmtree, tmp, True)
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

    from eqfuse.runtime.padded import PaddedFunction

    def first(label: str, refuse: bool):
        rss0, real = rss_mb(), PaddedFunction._runtime
        if refuse:  # (the run-time path refused: the padded fallback)
            PaddedFunction._runtime = lambda self, named, values: False
        try:
            mod = eqfuse.compile(str(path), threads=args.threads)
            t = timed(lambda: mod(**feeds(args.batch, args.first, me.VOCAB)))
        finally:
            PaddedFunction._runtime = real
        print(f"## {label}: first call at sequence {args.first}, batch {args.batch} (cold): {t:.2f} s; the "
              f"process grew by {rss_mb() - rss0:.0f} MB; {mod.default!r}")
        return mod

    runtime = first("run-time", False)
    padded = first("padded", True)
    f = padded.default
    print("| sequence | padded bucket | first call: run-time | padded | compile + first call: per length "
          "| onnxruntime first call | median ms: run-time (spread) | padded (spread) | per length (spread) "
          "| onnxruntime (spread) | run-time / per length | padded / per length | run-time / onnxruntime |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in args.lengths:
        x = feeds(args.batch, n, me.VOCAB)
        fr = timed(lambda x=x: runtime(**x))
        fp = timed(lambda x=x: padded(**x))
        t0 = time.perf_counter()
        exact = eqfuse.compile(str(path), dims={"sequence": n}, threads=args.threads)
        exact(**x)
        fe = time.perf_counter() - t0
        fo = timed(lambda x=x: sess.run(None, x))
        want = sess.run(None, x)[0]
        runs = {"r": lambda x=x: runtime(**x), "p": lambda x=x: padded(**x), "e": lambda x=x: exact(**x),
                "o": lambda x=x: sess.run(None, x)}
        for k in "rpe":
            np.testing.assert_allclose(runs[k](), want, rtol=1e-3, atol=1e-3)
        ts = {k: [] for k in runs}
        for _ in range(args.repeat):
            for k, g in runs.items():
                ts[k].append(timed(g) * 1e3)
        med = {k: statistics.median(v) for k, v in ts.items()}
        bucket = next(s for s in f.sizes["sequence"] if s >= n) if f.padding.get("sequence") == "exact" else n
        print(f"| {n} | {bucket} | {fr * 1e3:.2f} ms | {fp * 1e3:.2f} ms | {fe:.2f} s | {fo * 1e3:.2f} ms | "
              + " | ".join(f"{med[k]:.3f} ({spread(ts[k])})" for k in "rpeo")
              + f" | {med['r'] / med['e']:.2f} | {med['p'] / med['e']:.2f} | {med['r'] / med['o']:.2f} |")

if __name__ == "__main__":
    main()
