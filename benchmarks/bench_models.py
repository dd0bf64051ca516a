"""Real exported models: eqfuse against onnxruntime, side by side in one process.

    python benchmarks/bench_models.py [--repeat N] [--model NAME ...] [--exporter torchscript|dynamo]

BERT, GPT-2 and ViT (transformers, small configs, random weights), ResNet-18 and MLP-Mixer
(tests/model_exports.py), exported to ONNX. For 1 and 2 threads, calls of eqfuse and of
onnxruntime (ORT_ENABLE_ALL, that many intra-op threads) alternate; each row gives both medians,
the spread (interquartile range as % of the median) and the ratio. The outputs are checked
against each other first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import model_exports as me  # noqa: E402

import eqfuse  # noqa: E402
from eqfuse.cli.bench import blas_threads  # noqa: E402


def _iqr(ts: list[float]) -> float:
    q = statistics.quantiles(ts, n=4)
    return 100 * (q[2] - q[0]) / statistics.median(ts)


def main(argv=None) -> int:
    import onnxruntime as ort

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--model", action="append", choices=me.MODELS)
    ap.add_argument("--exporter", default="dynamo", choices=me.EXPORTERS)
    args = ap.parse_args(argv)
    blas_threads(1)
    print(f"{'model':<10}{'kernels':>8}{'thr':>4}{'eqfuse ms':>11}{'iqr%':>6}{'ORT ms':>9}{'iqr%':>6}{'ORT/eqfuse':>11}")
    for name in args.model or me.MODELS:
        path = str(me.export(name, args.exporter))
        feeds = me.inputs(name)
        mod = eqfuse.compile(path)
        fn = mod.default
        for th in (1, 2):
            fn.threads = th
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            so.intra_op_num_threads, so.inter_op_num_threads = th, 1
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            np.testing.assert_allclose(fn(**feeds), sess.run(None, feeds)[0], rtol=1e-4, atol=1e-5)
            te, to = [], []
            for _ in range(args.repeat):
                t = time.perf_counter()
                fn(**feeds)
                te.append(time.perf_counter() - t)
                t = time.perf_counter()
                sess.run(None, feeds)
                to.append(time.perf_counter() - t)
            me_, mo = statistics.median(te), statistics.median(to)
            nk = len([k for k in fn.last.kernels if k.kind != "view"])
            print(f"{name:<10}{nk:>8}{th:>4}{me_ * 1e3:>11.3f}{_iqr(te):>6.0f}{mo * 1e3:>9.3f}{_iqr(to):>6.0f}"
                  f"{mo / me_:>11.2f}", flush=True)
    print("ORT/eqfuse > 1: eqfuse is faster. Inputs: batch 2 (sequence 16 for BERT/GPT-2, 32x32 images "
          "for ViT and the Mixer, 64x64 for ResNet-18).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
