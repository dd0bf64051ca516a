"""The model zoo (tests/zoo_models.py: 25 Hugging Face families, tiny configs, random weights):
per family, eqfuse against onnxruntime and OpenVINO (f32) on the same ONNX export.

    python benchmarks/bench_zoo.py [--repeat N] [--family NAME ...] [--exporter torchscript|dynamo]
                                   [--spin] [--markdown]

One row per family: the kernels after fusion (views apart: a view is a zero-copy reshape, no
code), eqfuse.compile's time (with the kernel and graph caches as they are: `EQFUSE_CACHE_DIR`
pointing to an empty directory gives the cold time), then at 1 and 2 threads eqfuse's median time
and the ratios eqfuse / onnxruntime (ORT_ENABLE_ALL, that many intra-op threads) and
eqfuse / OpenVINO (CPU, INFERENCE_PRECISION_HINT f32, INFERENCE_NUM_THREADS that many):
below 1, eqfuse is faster. Calls of the three alternate (call by call at 1 thread, in blocks
after the others' threads sleep at 2: benchmarks/timing.py); a sample times `inner` calls in a row
(as many as take about 2 ms of eqfuse), and the spread column gives each one's interquartile
range as % of its median (eqfuse / ORT / OpenVINO). The outputs are checked against
onnxruntime's first (rtol 1e-4, atol 1e-4).

onnxruntime's threads sleep after a run unless --spin: spinning, they hold the second core between
calls, and eqfuse, which runs on the cores other processes leave free (eqfuse/runtime/load.py),
would then run its 2-thread calls on one.

A family whose export eqfuse cannot load has its row with eqfuse's message (the ONNX node, the op
and the attribute that stop it); one whose export fails (the dynamo exporter on T5 and Swin)
is measured on the other exporter's, and the row says so.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import zoo_models as zm  # noqa: E402
from timing import alternate  # noqa: E402  (benchmarks/timing.py)

import eqfuse  # noqa: E402
from eqfuse.cli.bench import blas_threads  # noqa: E402
from eqfuse.errors import EqfuseError  # noqa: E402


def _iqr(ts: list[float]) -> float:
    q = statistics.quantiles(ts, n=4)
    return 100 * (q[2] - q[0]) / statistics.median(ts)


def _export(family: str, exporter: str) -> tuple[str, str]:
    """(path, exporter used): the other exporter's export where the asked one fails."""
    try:
        return str(zm.export(family, exporter)), exporter
    except Exception:
        other = next(e for e in zm.EXPORTERS if e != exporter)
        return str(zm.export(family, other)), other


def _ort(path: str, threads: int, spin: bool):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(None, feeds)[0]


def _openvino(path: str, threads: int):
    """OpenVINO's CPU plugin in f32 (no bf16 or f16 inference precision) on `threads` threads;
    None if openvino is not installed."""
    try:
        import openvino as ov
    except ImportError:
        return None
    compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                     "INFERENCE_NUM_THREADS": threads})
    req = compiled.create_infer_request()

    def run(feeds):
        req.infer(feeds)
        return req.get_output_tensor(0).data
    return run


def _time(runs: dict, feeds: dict, repeat: int, threads: int) -> dict[str, list[float]]:
    """Per run, `repeat` samples of seconds per call (benchmarks/timing.py: interleaved at 1 thread,
    in blocks at 2)."""
    t = time.perf_counter()
    runs["eqfuse"](feeds)
    inner = max(1, min(1000, int(2e-3 / max(time.perf_counter() - t, 1e-7))))
    return alternate({k: (lambda r=run: r(feeds)) for k, run in runs.items()}, repeat, threads, inner)


def bench(family: str, exporter: str, repeat: int, spin: bool) -> dict:
    row = {"family": family, "group": zm.GROUPS[family]}
    try:
        path, row["exporter"] = _export(family, exporter)
    except Exception as e:  # both exporters fail
        row["error"] = f"no export: {str(e).splitlines()[0]}"
        return row
    feeds = zm.inputs(family)
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # onnx's reference evaluator, folding the exports' constants
            mod = eqfuse.compile(path)
        fn = mod.default
        fn(**feeds)  # (a graph with named dims compiles at its first call)
    except EqfuseError as e:
        row["error"] = str(e).splitlines()[0]
        return row
    row["compile_s"] = time.perf_counter() - t0
    kernels = fn.last.kernels
    row["kernels"] = sum(k.kind != "view" for k in kernels)
    row["views"] = sum(k.kind == "view" for k in kernels)
    for th in (1, 2):
        fn.threads = th
        runs = {"eqfuse": lambda f: fn(**f), "ort": _ort(path, th, spin)}
        ov = _openvino(path, th)
        if ov is not None:
            runs["openvino"] = ov
        want = runs["ort"](feeds)
        for k, run in runs.items():
            got = np.asarray(run(feeds))
            if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
                row.setdefault("mismatch", []).append(f"{k} at {th} thread(s): max |diff| "
                                                      f"{float(np.max(np.abs(got - want))):.2g}")
        times = _time(runs, feeds, repeat, th)
        med = {k: statistics.median(v) for k, v in times.items()}
        row[th] = {"eqfuse_ms": med["eqfuse"] * 1e3,
                   "ort": med["eqfuse"] / med["ort"],
                   "openvino": med["eqfuse"] / med["openvino"] if "openvino" in med else None,
                   "iqr": "/".join(f"{_iqr(times[k]):.0f}" for k in runs)}
    return row


def _cells(row: dict) -> list[str]:
    name = row["family"] + ("" if row.get("exporter", "") in ("", ARGS.exporter) else f" ({row['exporter']})")
    if "error" in row:
        return [name, row["group"], "cannot load: " + row["error"].replace("|", "\\|")]
    out = [name, row["group"], f"{row['kernels']} (+{row['views']})", f"{row['compile_s']:.1f}"]
    for th in (1, 2):
        r = row[th]
        ov = "-" if r["openvino"] is None else f"{r['openvino']:.2f}"
        out += [f"{r['eqfuse_ms']:.3f}", f"{r['ort']:.2f}", ov, r["iqr"]]
    if "mismatch" in row:
        out.append("MISMATCH " + "; ".join(row["mismatch"]))
    return out


HEAD = ["family", "group", "kernels (+views)", "compile s",
        "1 thr: eqfuse ms", "eqfuse/ORT", "eqfuse/OV", "iqr% e/ORT/OV",
        "2 thr: eqfuse ms", "eqfuse/ORT", "eqfuse/OV", "iqr% e/ORT/OV"]
ARGS = argparse.Namespace(exporter="torchscript")


def main(argv=None) -> int:
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=25, help="samples per run and thread count")
    ap.add_argument("--family", action="append", choices=zm.FAMILIES)
    ap.add_argument("--exporter", default="torchscript", choices=zm.EXPORTERS)
    ap.add_argument("--spin", action="store_true", help="let onnxruntime's threads spin between runs")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    ARGS = ap.parse_args(argv)
    blas_threads(1)
    if ARGS.markdown:
        print("| " + " | ".join(HEAD) + " |")
        print("|" + "---|" * len(HEAD))
    else:
        print("  ".join(HEAD))
    for family in ARGS.family or zm.FAMILIES:
        cells = _cells(bench(family, ARGS.exporter, ARGS.repeat, ARGS.spin))
        print(("| " + " | ".join(cells) + " |") if ARGS.markdown else "  ".join(cells), flush=True)
    print("eqfuse/ORT, eqfuse/OV < 1: eqfuse is faster. Inputs: batch 2; sequence 16 (the second sequence padded "
          "after 11 tokens); 32x32 images (MobileViT 64x64); Whisper 16 mel bins x 32 frames.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
