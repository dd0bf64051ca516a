"""Row kernels (softmax, layernorm, rmsnorm) against onnxruntime and torch, in one process.

    flock /tmp/eqfuse-bench.lock python benchmarks/bench_rows.py [--threads 1 2] [--repeat N] [--rounds R]

Each case is one kernel: eqfuse.compile of a one-kernel graph, a one-node ONNX model in
onnxruntime (ORT_ENABLE_ALL, that many intra-op threads) and torch eager (torch.set_num_threads).
The runs of each peer are split into rounds that alternate the peers, so that every peer sees the
same spells of a shared machine. Each row: median ms and interquartile range per peer, and
best peer / eqfuse (above 1: eqfuse is faster). The outputs are checked against numpy first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

import eqfuse
from eqfuse.cli.bench import blas_threads, sample_times

F32 = np.float32
EPS = {"layernorm": 1e-5, "rmsnorm": 1e-6}


def cases(rng):
    """(name, op, x shape): softmax over the last axis, layernorm and rmsnorm over 768."""
    return [("softmax 4096x1024", "softmax", (4096, 1024)),
            ("softmax 12x128x128 (scores)", "softmax", (12, 128, 128)),
            ("layernorm 4096x768", "layernorm", (4096, 768)),
            ("rmsnorm 4096x768", "rmsnorm", (4096, 768))]


def reference(op, x, g, b):
    x64 = x.astype(np.float64)
    if op == "softmax":
        e = np.exp(x64 - x64.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    if op == "layernorm":
        d = x64 - x64.mean(-1, keepdims=True)
        return d / np.sqrt((d * d).mean(-1, keepdims=True) + EPS[op]) * g + b
    return x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + EPS[op]) * g


def eqfuse_run(op, shape, threads):
    dims = ", ".join(map(str, shape))
    n = shape[-1]
    params, call = {"softmax": ("", "softmax(x)"), "layernorm": (f", g: f32[{n}], b: f32[{n}]", "layernorm(x, g, b)"),
                    "rmsnorm": (f", g: f32[{n}]", "rmsnorm(x, g)")}[op]
    src = f"graph rows(x: f32[{dims}]{params}) -> f32[{dims}] {{ return kernel {{ {call} }} }}"
    mod = eqfuse.compile(src, verify=False, threads=threads)
    return lambda x, g, b: mod(*(x, g, b)[: 1 + params.count(":")])


def ort_run(op, shape, threads):
    import onnxruntime as ort
    from onnx import TensorProto as T
    from onnx import helper as h

    n = shape[-1]
    ins = [h.make_tensor_value_info("x", T.FLOAT, shape)]
    if op != "softmax":
        ins.append(h.make_tensor_value_info("g", T.FLOAT, [n]))
    if op == "layernorm":
        ins.append(h.make_tensor_value_info("b", T.FLOAT, [n]))
    node = {"softmax": lambda: h.make_node("Softmax", ["x"], ["y"], axis=-1),
            "layernorm": lambda: h.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=EPS[op]),
            # onnxruntime's own (contrib, ONNX domain) fused rmsnorm
            "rmsnorm": lambda: h.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y"], axis=-1,
                                           epsilon=EPS[op])}[op]()
    graph = h.make_graph([node], "rows", ins, [h.make_tensor_value_info("y", T.FLOAT, shape)])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return lambda x, g, b: sess.run(None, dict(zip(names, (x, g, b))))[0]


def torch_run(op, shape, threads):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    n = shape[-1]
    fn = {"softmax": lambda x, g, b: torch.softmax(x, -1),
          "layernorm": lambda x, g, b: F.layer_norm(x, (n,), g, b, EPS[op]),
          "rmsnorm": lambda x, g, b: F.rms_norm(x, (n,), g, EPS[op])}[op]

    def run(x, g, b):
        with torch.no_grad():
            return fn(torch.from_numpy(x), torch.from_numpy(g), torch.from_numpy(b)).numpy()
    return run


PEERS = {"eqfuse": eqfuse_run, "onnxruntime": ort_run, "torch": torch_run}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=60, help="runs of each peer per case and thread count")
    ap.add_argument("--rounds", type=int, default=6, help="alternations of the peers the runs are split into")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    blas_threads(1)
    head = " | ".join(f"{p} ms (IQR)" for p in PEERS)
    print(f"| case | threads | {head} | best peer / eqfuse | max abs err |\n|---|---|" + "---|" * (len(PEERS) + 2))
    for name, op, shape in cases(rng):
        x = (rng.standard_normal(shape) * 3).astype(F32)
        g, b = (rng.standard_normal(shape[-1]).astype(F32) for _ in range(2))
        want = reference(op, x, g, b)
        for t in args.threads:
            runs = {p: make(op, shape, t) for p, make in PEERS.items()}
            err = max(float(np.max(np.abs(r(x, g, b) - want))) for r in runs.values())
            times: dict[str, list[float]] = {p: [] for p in runs}
            per = max(1, -(-args.repeat // args.rounds))
            for _ in range(args.rounds):
                for p, r in runs.items():
                    time.sleep(0.05)  # the last peer's spinning threads go to sleep
                    times[p] += sample_times(partial(r, x, g, b), per)
            cells, med = [], {}
            for p, ts in times.items():
                q = statistics.quantiles(ts, n=4)
                med[p] = statistics.median(ts)
                cells.append(f"{med[p] * 1e3:.3f} ({(q[2] - q[0]) * 1e3:.3f})")
            best = min(v for p, v in med.items() if p != "eqfuse")
            print(f"| {name} | {t} | " + " | ".join(cells) + f" | {best / med['eqfuse']:.2f} | {err:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
