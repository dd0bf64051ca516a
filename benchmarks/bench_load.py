"""Calls under load: `python benchmarks/bench_load.py [--repeat 200] [--rounds 3] [--no-spin]`.

The MLP 784-1024-1024-10 at batch 8 (one ONNX model, random weights) run by eqfuse and by
onnxruntime (ORT_ENABLE_ALL, the same thread count), interleaved in one process, on 1 and 2
threads, on a quiet machine and with another process spinning on a core alongside. Quiet and
busy alternate --rounds times (a shared VM drifts from minute to minute), the samples pooled per
row. Median ms, the spread (IQR as % of the median), and the busy rows' ratio to the quiet ones.
With --no-spin onnxruntime's threads sleep after a run (session.intra_op.allow_spinning=0); by
default they spin, and hold a core during eqfuse's next call: a load of their own beside the
busy process.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import eqfuse


def mlp_onnx(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    dims = [784, 1024, 1024, 10]
    inits, nodes, x = [], [], "x"
    for i in range(3):
        w = (rng.standard_normal((dims[i], dims[i + 1])) / np.sqrt(dims[i])).astype(np.float32)
        b = (0.1 * rng.standard_normal(dims[i + 1])).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        x = f"a{i}"
        if i < 2:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"]))
            x = f"r{i}"
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 784])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [8, 10])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def stats(ts: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(ts, n=4)
    med = statistics.median(ts)
    return med * 1e3, 100 * (q[2] - q[0]) / med


def session(ort, path: Path, threads: int, no_spin: bool):
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if no_spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200, help="interleaved pairs of calls per row and round")
    ap.add_argument("--rounds", type=int, default=3,
                    help="quiet and busy alternate this many times (a shared VM drifts; every row sees each phase)")
    ap.add_argument("--no-spin", action="store_true", help="onnxruntime's threads sleep after a run")
    args = ap.parse_args()
    import onnxruntime as ort

    path = Path(tempfile.mkdtemp()) / "mlp.onnx"
    mlp_onnx(path)
    x = np.random.default_rng(1).standard_normal((8, 784)).astype(np.float32)
    runs = {t: (eqfuse.compile(str(path), threads=t), session(ort, path, t, args.no_spin)) for t in (1, 2)}
    for mod, sess in runs.values():
        np.testing.assert_allclose(mod(x), sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
    times = {(busy, t, who): [] for busy in (False, True) for t in (1, 2) for who in ("eqfuse", "ort")}
    for _ in range(args.rounds):
        for busy in (False, True):
            proc = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
            try:
                time.sleep(0.5 if busy else 0.1)
                for threads, (mod, sess) in runs.items():
                    te, to = times[busy, threads, "eqfuse"], times[busy, threads, "ort"]
                    for _ in range(args.repeat):  # interleaved
                        t0 = time.perf_counter()
                        mod(x)
                        t1 = time.perf_counter()
                        sess.run(None, {"x": x})
                        t2 = time.perf_counter()
                        te.append(t1 - t0)
                        to.append(t2 - t1)
            finally:
                if proc is not None:
                    proc.kill()
                    proc.wait()
    print("load       thr  eqfuse ms  iqr%   ORT ms  iqr%  ORT/eqfuse  busy/quiet: eqfuse  ORT")
    for (busy, threads, who), ts in times.items():
        if who != "eqfuse":
            continue
        (me, ie), (mo, io) = stats(ts), stats(times[busy, threads, "ort"])
        line = f"{'busy' if busy else 'quiet':<10} {threads:>3} {me:>10.3f} {ie:>5.0f} {mo:>8.3f} {io:>5.0f} {mo / me:>11.2f}"
        if busy:
            qe, qo = stats(times[False, threads, "eqfuse"])[0], stats(times[False, threads, "ort"])[0]
            line += f" {me / qe:>19.2f} {mo / qo:>4.2f}"
        print(line)
    print(f"{args.rounds} rounds of quiet then busy, {args.repeat} interleaved pairs of calls per row and round; "
          "busy: one other process spinning on a core alongside (python -c 'while True: pass')"
          + ("; onnxruntime's threads do not spin (--no-spin)" if args.no_spin else "") + ".")


if __name__ == "__main__":
    main()
