"""Real exported models: eqfuse against onnxruntime, side by side in one process.

    python benchmarks/bench_models.py [--repeat N] [--model NAME ...] [--exporter torchscript|dynamo]
                                      [--torch [--autotune]] [--no-spin] [--quantized dynamic|dynamic-conv|static|qoperator]
                                      [--compile-only]
    python benchmarks/bench_models.py --precision f32|bf16 [--repeat N] [--model NAME ...]

BERT, GPT-2 and ViT (transformers, small configs, random weights), ResNet-18, MLP-Mixer, the MLP
784-1024-1024-10, BERT-base geometry and ResNet-18's stem + layer1 + layer2 at full width on a
224x224 image ("resnet_stages") (tests/model_exports.py, BENCH_MODELS), exported to ONNX. For 1 and 2 threads, calls of eqfuse and of
onnxruntime (ORT_ENABLE_ALL, that many intra-op threads) alternate (call by call at 1 thread, in
blocks after the others' threads sleep at 2: benchmarks/timing.py); each row gives both medians,
the spread (interquartile range as % of the median) and the ratio. The outputs are checked
against each other first. `--torch` adds the torch module the export came from, eager and under
torch.compile (default mode), in the same interleaving. The compile line of each model gives
eqfuse.compile's time (with the kernel cache as it is: `EQFUSE_CACHE_DIR` pointing to an empty
directory gives the cold time), onnxruntime's session creation and torch.compile's first call.
`--compile-only` prints that line alone, eqfuse's time split into compile() and the first call
(which packs the weights, or builds a model with named dims), onnxruntime's session creation and
its first run apart, with eqfuse's optimize seconds and whether the optimized-graph cache served
them: run it twice, and the second run, in a fresh process after its imports, has the caches warm
(compiled kernels, optimized graphs, imported models and their packed weights: docs/performance.md).

`--quantized dynamic` runs each export as onnxruntime.quantization.quantize_dynamic writes it (MatMul
weights int8, activations quantized to u8 per call: DynamicQuantizeLinear -> MatMulInteger -> Cast ->
Mul), eqfuse, onnxruntime and OpenVINO (its default precision) on the same quantized file, and adds each one's error against the f32
model's output (onnxruntime on the f32 export): max|difference| / max|f32 output|. The outputs are
then not asserted equal: onnxruntime's deployed run fuses the dequantization into its integer
kernels and rounds the scales in another order (tests/test_quantized.py checks eqfuse against its
literal run, node by node). In every `--quantized` mode the weights are quantized as
`--reduce-range` says (bench_gemm.ort_reduce_range): by default (auto) with reduce_range=True,
7-bit weights, on a CPU without VNNI, onnxruntime's own recipe there (its vpmaddubsw GEMM
saturates with 8-bit weights; eqfuse's integer GEMMs take the avx2_maddubs path with either); the
header line says which, and the quantized file's name ends in -rr.
`--quantized static` and `--quantized qoperator` run each export as quantize_static writes it (u8
activations, i8 weights, calibrated on four inputs of the model), in the QDQ and the QOperator
format (QLinearConv, QGemm and onnxruntime's com.microsoft QLinearAdd, QLinearGlobalAveragePool,
..., with per-channel weights); OpenVINO is left out where it cannot read the file.
`--quantized dynamic-conv` quantizes the convs too (op_types MatMul and
Conv: DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul -> Add per conv), for the integer conv
of a CNN (resnet18, resnet_stages); OpenVINO's column is left out when it cannot load the file.


`--precision f32|bf16` (docs/precision.md) compares precisions instead: eqfuse in that precision
(and in f32, when it is bf16), OpenVINO in f32 (INFERENCE_PRECISION_HINT f32) and OpenVINO in its
default precision (bf16 on a CPU with AVX512_BF16 or AMX), alternating in one process at 1
and 2 threads as above. Each row gives medians, spreads (interquartile range as % of the median), OpenVINO
default's time over eqfuse's, and each one's error against the f32 reference (onnxruntime f32):
max|difference| / max|reference|. The `bf16 kernels` column counts eqfuse's kernels that multiply
in bf16 against all of them (mod.report["precision"]). `--error-seeds N` adds, per model, eqfuse's
and OpenVINO default's errors over N inputs (seeds 0..N-1): the median, the range, and on how
many eqfuse's is the smaller.
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
from bench_gemm import ort_reduce_range  # noqa: E402  (benchmarks/bench_gemm.py)
from timing import alternate  # noqa: E402  (benchmarks/timing.py)

import eqfuse  # noqa: E402
from eqfuse.cli.bench import blas_threads  # noqa: E402


def _iqr(ts: list[float]) -> float:
    q = statistics.quantiles(ts, n=4)
    return 100 * (q[2] - q[0]) / statistics.median(ts)


def _torch_runs(name: str, feeds: dict, compile_s: dict, autotune: bool) -> dict:
    """torch eager and torch.compile (default mode; with `autotune` also mode="max-autotune"
    with freezing, whose GEMMs are MKL's packed ones) on the module the export came from."""
    import torch

    model, names = me.torch_model(name)
    args = [torch.from_numpy(feeds[n]) for n in names]

    def call(f):
        def run():
            with torch.no_grad():
                out = f(*args)
            return getattr(out, "last_hidden_state", out).numpy()
        return run
    runs = {"torch": call(model), "torch.compile": call(torch.compile(model))}
    if autotune:
        import torch._inductor.config as inductor

        inductor.freezing = True
        runs["max-autotune"] = call(torch.compile(model, mode="max-autotune"))
    for k in list(runs)[1:]:
        t0 = time.perf_counter()
        runs[k]()
        compile_s[k] = time.perf_counter() - t0
    return runs


def quantized_dynamic(path: Path, convs: bool = False, reduce_range: bool = False) -> Path:
    """The export as quantize_dynamic writes it (int8 MatMul weights; with convs, Conv weights too:
    ConvInteger; with reduce_range, 7-bit weights), made once beside it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = path.with_name(path.stem + ("-qdynconv" if convs else "-qdynamic") + ("-rr" if reduce_range else "") + ".onnx")
    if not out.exists():
        tmp = out.with_suffix(".tmp.onnx")
        quantize_dynamic(str(path), str(tmp), weight_type=QuantType.QInt8, reduce_range=reduce_range,
                         op_types_to_quantize=["MatMul", "Conv"] if convs else ["MatMul"])
        tmp.replace(out)
    return out


def quantized_static(path: Path, name: str, fmt: str, reduce_range: bool = False) -> Path:
    """The export as quantize_static writes it, made once beside it: u8 activations, i8 weights,
    calibrated on four inputs of the model (seeds 100..103); `fmt` "static" is the QDQ format,
    "qoperator" the QOperator format (QLinearConv, QGemm, QLinearAdd, ... per-channel weights)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([me.inputs(name, 100 + k) for k in range(4)])

        def get_next(self):
            return next(self.batches, None)

    out = path.with_name(path.stem + f"-q{fmt}" + ("-rr" if reduce_range else "") + ".onnx")
    if not out.exists():
        tmp = out.with_suffix(".tmp.onnx")
        quantize_static(str(path), str(tmp), Reader(), per_channel=fmt == "qoperator",
                        quant_format=QuantFormat.QOperator if fmt == "qoperator" else QuantFormat.QDQ,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, reduce_range=reduce_range)
        tmp.replace(out)
    return out


def _rel_err(got, ref) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - ref)) / np.max(np.abs(ref)))

def _openvino(path: str, threads: int, hint: str | None):
    """A run of the ONNX model at `path` in OpenVINO on the CPU (INFERENCE_PRECISION_HINT `hint`,
    None: its default), and the precision it chose."""
    import openvino as ov

    cfg = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    if hint:
        cfg["INFERENCE_PRECISION_HINT"] = hint
    compiled = ov.Core().compile_model(path, "CPU", cfg)
    got = str(compiled.get_property("INFERENCE_PRECISION_HINT")).lower()
    req = compiled.create_infer_request()

    def run(feeds):
        req.infer(feeds)
        return np.array(req.get_output_tensor(0).data)
    return run, ("bf16" if "bf" in got else "f32" if "32" in got else got)


def _first(out):
    return np.asarray(out[0] if isinstance(out, (tuple, list)) else out)


def precision_main(args) -> int:
    """--precision: eqfuse in args.precision (and f32) against OpenVINO f32 and default."""
    import onnxruntime as ort

    p = args.precision
    precs = list(dict.fromkeys((p, "f32")))
    print(f"{'model':<14}{'bf16 kernels':>13}{'thr':>4}"
          + "".join(f"{'eqf ' + q + ' ms':>13}{'iqr%':>5}" for q in precs)
          + f"{'OV f32 ms':>11}{'iqr%':>5}{'OV dflt ms':>11}{'iqr%':>5}{'dflt/eqf':>9}"
          + "".join(f"{'err eqf ' + q:>13}" for q in precs) + f"{'err OV f32':>11}{'err OV dflt':>12}")
    for name in args.model or me.BENCH_MODELS:
        path = str(me.export(name, args.exporter))
        feeds = me.inputs(name)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        ref = np.asarray(ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0],
                         dtype=np.float64)
        fns, mods = {}, {}
        for q in precs:
            mods[q] = eqfuse.compile(path, precision=q)
            fns[q] = mods[q].default
            fns[q](**feeds)  # (a graph with named dims compiles at its first call)
        entries = mods[p].report["precision"]
        nbf = sum(e["precision"] == "bf16" for e in entries.values())
        for th in (1, 2):
            runs = {}
            for q in precs:
                fns[q].threads = th
                runs[f"eqfuse {q}"] = lambda f=fns[q]: _first(f(**feeds))
            ov32, _ = _openvino(path, th, "f32")
            ovd, chose = _openvino(path, th, None)
            runs["OV f32"], runs["OV default"] = (lambda: ov32(feeds)), (lambda: ovd(feeds))
            err = {k: float(np.max(np.abs(np.asarray(run(), np.float64) - ref)) / np.max(np.abs(ref)))
                   for k, run in runs.items()}
            times = alternate(runs, args.repeat, th)
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"{name:<14}{f'{nbf}/{len(entries)}':>13}{th:>4}"
                  + "".join(f"{med[f'eqfuse {q}'] * 1e3:>13.3f}{_iqr(times[f'eqfuse {q}']):>5.0f}" for q in precs)
                  + f"{med['OV f32'] * 1e3:>11.3f}{_iqr(times['OV f32']):>5.0f}"
                  + f"{med['OV default'] * 1e3:>11.3f}{_iqr(times['OV default']):>5.0f}"
                  + f"{med['OV default'] / med[f'eqfuse {p}']:>9.2f}"
                  + "".join(f"{err[f'eqfuse {q}']:>13.1e}" for q in precs)
                  + f"{err['OV f32']:>11.1e}{err['OV default']:>12.1e}  (OV default: {chose})", flush=True)
        if args.error_seeds:  # the errors over several inputs: one input's is one draw of a random variable
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            es, eo = [], []
            for seed in range(args.error_seeds):
                fs = me.inputs(name, seed)
                r = np.asarray(sess.run(None, fs)[0], np.float64)
                es.append(_rel_err(_first(fns[p](**fs)), r))
                eo.append(_rel_err(ovd(fs), r))
            print(f"{name:<14} errors over inputs 0..{args.error_seeds - 1}: eqfuse {p} median {np.median(es):.1e} "
                  f"({min(es):.1e}-{max(es):.1e}), OV default median {np.median(eo):.1e} ({min(eo):.1e}-{max(eo):.1e}); "
                  f"eqfuse's the smaller on {sum(a < b for a, b in zip(es, eo))} of {len(es)}", flush=True)
    print(f"dflt/eqf > 1: eqfuse {p} is faster than OpenVINO's default precision. Errors: max|difference| / "
          "max|onnxruntime f32 output|. Inputs as without --precision.")
    return 0


def main(argv=None) -> int:
    import onnxruntime as ort

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--model", action="append", choices=me.BENCH_MODELS)
    ap.add_argument("--exporter", default="dynamo", choices=me.EXPORTERS)
    ap.add_argument("--torch", action="store_true", help="add torch eager and torch.compile columns")
    ap.add_argument("--no-spin", action="store_true",
                    help="onnxruntime's threads sleep after a run (session.intra_op.allow_spinning=0): spinning, "
                         "they hold the second core between calls, and eqfuse, which runs on the free cores only "
                         "(eqfuse/runtime/load.py), then runs its 2-thread calls on one")
    ap.add_argument("--compile-only", action="store_true",
                    help="only the compile line: eqfuse.compile and its first call against onnxruntime's session creation")
    ap.add_argument("--precision", choices=["f32", "bf16"],
                    help="eqfuse in this precision against OpenVINO f32 and default instead (see above)")
    ap.add_argument("--error-seeds", type=int, default=0,
                    help="with --precision, also each one's error over this many inputs (seeds 0..N-1)")
    ap.add_argument("--autotune", action="store_true",
                    help="with --torch, add torch.compile(mode='max-autotune') with freezing (minutes to compile)")
    ap.add_argument("--quantized", choices=["dynamic", "dynamic-conv", "static", "qoperator"],
                    help="run the exports as onnxruntime's quantize_dynamic (dynamic; dynamic-conv: the convs too) or "
                         "quantize_static (static: QDQ, qoperator: QOperator) writes them, and add each one's error against "
                         "the f32 model")
    ap.add_argument("--reduce-range", choices=["auto", "on", "off"], default="auto",
                    help="--quantized: 7-bit weights (auto: on a CPU without VNNI; see above)")
    args = ap.parse_args(argv)
    blas_threads(1)
    if args.precision:
        return precision_main(args)
    head = f"{'model':<10}{'kernels':>8}{'thr':>4}{'eqfuse ms':>11}{'iqr%':>6}{'ORT ms':>9}{'iqr%':>6}{'ORT/eqfuse':>11}"
    if args.quantized:
        head += f"{'OV ms':>9}{'iqr%':>6}{'OV/eqfuse':>10}{'eqfuse err':>12}{'ORT err':>10}{'OV err':>10}"
    if args.torch:
        head += f"{'eager ms':>10}{'compile ms':>12}{'compile/eqfuse':>15}"
    if args.torch and args.autotune:
        head += f"{'autotune ms':>12}{'autotune/eqfuse':>16}"
    rr = bool(args.quantized) and ort_reduce_range(args.reduce_range)
    if args.quantized:
        print(f"quantized {args.quantized}: weights {'7-bit (reduce_range=True)' if rr else '8-bit'}")
    print(head)
    for name in args.model or me.BENCH_MODELS:
        path = str(me.export(name, args.exporter))
        feeds = me.inputs(name)
        ref = None
        if args.quantized:  # the f32 model's output, then the quantized file in its place
            ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0].astype(np.float64)
            path = str(quantized_dynamic(Path(path), convs=args.quantized == "dynamic-conv", reduce_range=rr)
                       if args.quantized in ("dynamic", "dynamic-conv") else
                       quantized_static(Path(path), name, args.quantized, rr))
        t0 = time.perf_counter()
        mod = eqfuse.compile(path)
        t1 = time.perf_counter()
        fn = mod.default
        fn(**feeds)  # (a graph with named dims compiles at its first call)
        compile_s = {"eqfuse": time.perf_counter() - t0}
        if args.compile_only:
            first = compile_s["eqfuse"] - (t1 - t0)
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            t0 = time.perf_counter()
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            compile_s["onnxruntime"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            sess.run(None, feeds)
            ort_first = time.perf_counter() - t0
            rep = mod.report
            # eqfuse's time is compile() and the first call (which packs the weights, and builds a
            # graph with named dims); onnxruntime's is the session's creation, its first run apart
            print(f"{name} ({args.exporter}): compile s: eqfuse {compile_s['eqfuse']:.2f} (compile "
                  f"{compile_s['eqfuse'] - first:.2f} + first call {first:.2f}), onnxruntime "
                  f"{compile_s['onnxruntime']:.2f} (+ first run {ort_first:.2f})"
                  + f"; eqfuse's optimize {rep.get('optimize_seconds', 0):.2f} s (optimized-graph cache: "
                  f"{rep.get('graph_cache')})", flush=True)
            continue
        runs = {"eqfuse": lambda: fn(**feeds)}
        if args.torch:
            runs.update(_torch_runs(name, feeds, compile_s, args.autotune))
        for th in (1, 2):
            fn.threads = th
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            so.intra_op_num_threads, so.inter_op_num_threads = th, 1
            if args.no_spin:
                so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            t0 = time.perf_counter()
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            compile_s["onnxruntime"] = time.perf_counter() - t0
            runs["onnxruntime"] = lambda: sess.run(None, feeds)[0]
            if args.quantized:  # OpenVINO on the same quantized file, in its default precision
                try:
                    ov_run, _ = _openvino(path, th, None)
                    runs["openvino"] = lambda: ov_run(feeds)
                except Exception as e:  # (its ONNX frontend lacks onnxruntime's com.microsoft ops)
                    print(f"  OpenVINO cannot run {Path(path).name}: {str(e).splitlines()[0][:120]}", flush=True)
            want = runs["onnxruntime"]()
            errs = {}
            for k, run in runs.items():
                if ref is not None:
                    errs[k] = _rel_err(run(), ref)
                else:
                    np.testing.assert_allclose(np.asarray(run()), want, rtol=1e-4, atol=1e-4, err_msg=k)
            if args.torch:
                import torch
                torch.set_num_threads(th)
            times = alternate(runs, args.repeat, th)
            med = {k: statistics.median(v) for k, v in times.items()}
            nk = len([k for k in fn.last.kernels if k.kind != "view"])
            line = (f"{name:<10}{nk:>8}{th:>4}{med['eqfuse'] * 1e3:>11.3f}{_iqr(times['eqfuse']):>6.0f}"
                    f"{med['onnxruntime'] * 1e3:>9.3f}{_iqr(times['onnxruntime']):>6.0f}"
                    f"{med['onnxruntime'] / med['eqfuse']:>11.2f}")
            if ref is not None and "openvino" in med:
                line += (f"{med['openvino'] * 1e3:>9.3f}{_iqr(times['openvino']):>6.0f}{med['openvino'] / med['eqfuse']:>10.2f}"
                         f"{errs['eqfuse']:>12.2e}{errs['onnxruntime']:>10.2e}{errs['openvino']:>10.2e}")
            elif ref is not None:
                line += f"{'-':>9}{'-':>6}{'-':>10}{errs['eqfuse']:>12.2e}{errs['onnxruntime']:>10.2e}{'-':>10}"
            if args.torch:
                line += (f"{med['torch'] * 1e3:>10.3f}{med['torch.compile'] * 1e3:>12.3f}"
                         f"{med['torch.compile'] / med['eqfuse']:>15.2f}")
            if "max-autotune" in med:
                line += f"{med['max-autotune'] * 1e3:>12.3f}{med['max-autotune'] / med['eqfuse']:>16.2f}"
            print(line, flush=True)
        print("  compile s: " + ", ".join(f"{k} {v:.2f}" for k, v in compile_s.items()), flush=True)
    print("ORT/eqfuse > 1: eqfuse is faster. Inputs: batch 2 (sequence 16 for BERT/GPT-2, 32x32 images "
          "for ViT and the Mixer, 64x64 for ResNet-18); the MLP at batch 8; BERT-base batch 1, sequence 128; "
          "resnet_stages batch 1, 224x224.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
