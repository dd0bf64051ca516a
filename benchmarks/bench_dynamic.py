"""A new batch size: eqfuse's buckets against a compile per batch size, and onnxruntime.

    python benchmarks/bench_dynamic.py [--models mlp encoder resnet18 ...] [--first 8]
                                       [--sizes 1 3 13 32] [--repeat 30] [--threads 1]

Every compile here is cold: the kernel cache is an empty temporary directory. For each model,
compiled once with its batch dim first bound to --first (the default buckets: powers of two up to
it, eqfuse.runtime.buckets), and once per batch size with buckets off (`buckets={}`: the C is
compiled again for each new size, as before buckets), the table gives per batch size:
- "first call": the first call at that size, in ms (with buckets off it includes the C compile);
- the median of --repeat further calls, interleaved, and the spread (interquartile range as % of
  the median), and the ratio per-size compile / buckets (below 1: the chunks cost time);
- onnxruntime's first call and median at that size (ORT_ENABLE_ALL, the same thread count), for
  the models exported to ONNX with a dynamic batch axis.

Models: "mlp" (examples/mlp.g, weights bound), "encoder" (examples/transformer.g: one BERT-like
layer, sequence 128), and the exports with a dynamic batch axis of tests/model_exports.py
("mlp784": the MLP 784-1024-1024-10, "resnet18", and the transformers where the importer takes a
dynamic batch: "bert", "gpt2", "vit", "mixer").
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ["EQFUSE_CACHE_DIR"] = tempfile.mkdtemp(prefix="eqfuse-bench-dynamic-")  # every compile cold
atexit.register(shutil.rmtree, os.environ["EQFUSE_CACHE_DIR"], True)  # (its kernels go when the run ends)

import eqfuse
from eqfuse.frontend.load import load

EXPORTS = {"mlp784": "mlp", "resnet18": "resnet18", "bert": "bert", "gpt2": "gpt2", "vit": "vit", "mixer": "mixer"}


def g_model(name: str, rng):
    """(source, params, a function n -> the call's arrays) of a .g example."""
    src = (ROOT / "examples" / ("mlp.g" if name == "mlp" else "transformer.g")).read_text()
    g = load(src)[0]
    params = {n: (rng.standard_normal(t.shape) * 0.05).astype(np.float32) for n, t in g.params[1:]}
    rest = g.params[0][1].shape[1:]
    return src, params, lambda n: {g.params[0][0]: rng.standard_normal((n, *rest)).astype(np.float32)}, None


def onnx_model(name: str, rng, tmp: Path):
    """(path, None, feeds of batch n, an onnxruntime session) of an export with a dynamic batch axis."""
    import contextlib
    import io
    import warnings

    import model_exports as me
    import onnxruntime as ort
    import torch

    model, names = me.torch_model(EXPORTS[name])
    feeds0 = me.inputs(EXPORTS[name])
    path = tmp / f"{name}.onnx"
    dyn = {n: {0: "batch"} for n in names} | {"y": {0: "batch"}}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(torch.from_numpy(v) for v in feeds0.values()), str(path), input_names=list(names),
                          output_names=["y"], opset_version=17, dynamo=False, dynamic_axes=dyn)

    def feeds(n):
        out = {}
        for k, v in feeds0.items():
            reps = -(-n // v.shape[0])
            out[k] = np.concatenate([v] * reps)[:n].copy()
            if v.dtype == np.float32:
                out[k] = rng.standard_normal(out[k].shape).astype(np.float32)
        return out
    return str(path), None, feeds, ort


def timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def iqr(ts) -> float:
    q = statistics.quantiles(ts, n=4)
    return 100 * (q[2] - q[0]) / statistics.median(ts)


def bench(name: str, args, tmp: Path) -> None:
    rng = np.random.default_rng(0)
    src, params, feeds, ort = (g_model if name in ("mlp", "encoder") else
                               lambda n, r: onnx_model(n, r, tmp))(name, rng)
    opts = {"params": params, "threads": args.threads}
    t0 = time.perf_counter()
    buck = eqfuse.compile(src, **opts)
    first = feeds(args.first)
    buck(**first)
    t_b = time.perf_counter() - t0
    t0 = time.perf_counter()
    per = eqfuse.compile(src, buckets={}, **opts)
    per(**first)
    t_p = time.perf_counter() - t0
    sess = None
    if ort is not None:
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    b = next(iter(buck.default.buckets.values()), None)
    why = buck.report.get("batch_dims", {})
    print(f"\n## {name}: " + (f"batch dim first bound to {args.first}; buckets {b.sizes}" if b else
                              f"no batch dim ({why}): compiled per batch size either way"))
    print(f"compile + first call, cold: buckets {t_b:.2f} s, one size {t_p:.2f} s")
    print("| batch | first call: buckets | one compile per size | onnxruntime | median ms: buckets (spread) "
          "| per size (spread) | per size / buckets | onnxruntime (spread) |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.sizes:
        x = feeds(n)
        fb = timed(lambda x=x: buck(**x))
        fp = timed(lambda x=x: per(**x))
        fo = timed(lambda x=x: sess.run(None, x)) if sess else None
        np.testing.assert_allclose(buck(**x), per(**x), rtol=1e-3, atol=1e-3)
        runs = {"b": lambda x=x: buck(**x), "p": lambda x=x: per(**x)}
        if sess:
            runs["o"] = lambda x=x: sess.run(None, x)
        ts = {k: [] for k in runs}
        for _ in range(args.repeat):
            for k, f in runs.items():
                ts[k].append(timed(f) * 1e3)
        med = {k: statistics.median(v) for k, v in ts.items()}
        ort_cells = (f"{fo * 1e3:.2f} ms", f"{med['o']:.3f} ({iqr(ts['o']):.0f}%)") if sess else ("-", "-")
        print(f"| {n} | {fb * 1e3:.2f} ms | {fp:.2f} s | {ort_cells[0]} | {med['b']:.3f} ({iqr(ts['b']):.0f}%) "
              f"| {med['p']:.3f} ({iqr(ts['p']):.0f}%) | {med['p'] / med['b']:.2f} | {ort_cells[1]} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["mlp", "encoder", "mlp784", "resnet18"])
    ap.add_argument("--first", type=int, default=8)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 3, 13, 32])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import platform

    print(f"# {platform.processor() or platform.machine()}, {args.threads} thread(s), {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            bench(name, args, Path(tmp))


if __name__ == "__main__":
    main()
