"""Single convs (conv2d + batchnorm + relu, weights bound): eqfuse's direct and im2col paths and
onnxruntime, alternating in one process (call by call at 1 thread, in blocks after the
others' threads sleep at more: benchmarks/timing.py).

    python benchmarks/bench_conv.py [--repeat N] [--threads T ...] [--set resnet18|resnet56|all] [--precision f32|bf16]
    python benchmarks/bench_conv.py --set mobilenet|convnext|regnet|regnet_widths|multiplier|whisper|grouped
        [--repeat N] [--threads T ...] [--precision f32|bf16] [--cpu-time]

The shapes: every conv of the narrow ResNet-18 of tests/model_exports.py at 64x64 images, batch 2
("resnet18"), and the convs of torchvision's ResNet-18: its stem at 224x224, then at 56x56 and
below, batch 1 ("resnet56"). eqfuse compiles each conv with EQFUSE_CONV=direct (EQFUSE_CONV_WINOGRAD=0), as
Winograd F(2x2, 3x3) where it can run (3x3, stride 1: EQFUSE_CONV_WINOGRAD=1), with
EQFUSE_CONV=im2col (eqfuse.backend.kinds.contraction.conv, conv_winograd), and with none (the planner's
choice, "auto"); onnxruntime runs
a Conv -> BatchNormalization -> Relu model (ORT_ENABLE_ALL fuses it into one NCHWc conv) on the
same thread count. Each row: median microseconds per call and ORT / eqfuse-auto. `--precision bf16`
compiles eqfuse's paths in bf16 (docs/precision.md; onnxruntime stays f32), and the outputs are
then compared at bf16's scale (max|difference| / max|output| <= 3e-2) rather than f32's; the
column "f32 auto" is the planner's choice in f32, interleaved with the rest.

The grouped sets (`grouped` is all six): MobileNetV2's depthwise 3x3 convs (+ batchnorm +
ReLU6) at 112, 56, 28 and 14 pixels, ConvNeXt-T's depthwise 7x7 convs (+ bias), RegNetX-400MF's
grouped 3x3 convs (16 channels per group, + batchnorm + ReLU6), the group widths of larger RegNets
(24: X-1.6GF, 48: X-3.2GF, 56: Y-8GF, 120: X-8GF; "regnet_widths": all but 48 are not whole
vectors of AVX-512's 16 lanes), depthwise convs with a channel
multiplier of 2 and groups of 4 and 8 channels ("multiplier"), and Whisper-tiny's
encoder convs (conv1d k=3 over 3000 frames, + bias + GELU), batch 1, weights bound; eqfuse's
planner's choice against onnxruntime and OpenVINO's CPU plugin (INFERENCE_PRECISION_HINT f32; the
column is "-" without openvino) on the same thread count. The path column names the plan: a
grouped conv's pixels or channels in the lanes (conv_grouped.use_channels). With `--precision bf16`
eqfuse runs in bf16 (and, interleaved, in f32: the column "eqfuse f32 us") and OpenVINO in its
default precision (bf16 on a CPU with AVX512_BF16), each with its error max|difference| /
max|f32 output| against onnxruntime's f32 output; the path column adds each conv's precision and
instruction path (report["precision"]). `--cpu-time` (one thread) times the grouped sets' calls by
the process's CPU time (benchmarks/timing.py): on a shared machine the time slices that other
processes take are then not counted, where wall-clock medians of every runtime move with the load.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from timing import alternate  # benchmarks/timing.py

import eqfuse
from eqfuse.cli.bench import blas_threads

# name: (N, C, H, O, k, stride, padding)
RESNET18 = {
    "stem 3->16 7x7/2 @64": (2, 3, 64, 16, 7, 2, 3),
    "l1 16 3x3 @16": (2, 16, 16, 16, 3, 1, 1),
    "l2 16->32 3x3/2 @16": (2, 16, 16, 32, 3, 2, 1),
    "l2 32 3x3 @8": (2, 32, 8, 32, 3, 1, 1),
    "l2 down 1x1/2 @16": (2, 16, 16, 32, 1, 2, 0),
    "l3 32->64 3x3/2 @8": (2, 32, 8, 64, 3, 2, 1),
    "l3 64 3x3 @4": (2, 64, 4, 64, 3, 1, 1),
    "l4 64->128 3x3/2 @4": (2, 64, 4, 128, 3, 2, 1),
    "l4 128 3x3 @2": (2, 128, 2, 128, 3, 1, 1),
}
RESNET56 = {
    "stem 3->64 7x7/2 @224": (1, 3, 224, 64, 7, 2, 3),
    "64 3x3 @56": (1, 64, 56, 64, 3, 1, 1),
    "64->128 3x3/2 @56": (1, 64, 56, 128, 3, 2, 1),
    "128 3x3 @28": (1, 128, 28, 128, 3, 1, 1),
    "256 3x3 @14": (1, 256, 14, 256, 3, 1, 1),
    "512 3x3 @7": (1, 512, 7, 512, 3, 1, 1),
    "down 64->128 1x1/2 @56": (1, 64, 56, 128, 1, 2, 0),
}


def _arrays(N, C, H, O, k):
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    return {"x": f(N, C, H, H), "w": f(O, C, k, k) * 0.1, "m": f(O) * 0.1, "v": np.abs(f(O)) + 0.5, "g": f(O), "be": f(O)}


def _eqfuse(shape, xs, path, precision="f32"):
    N, C, H, O, k, s, p = shape
    src = f"""
graph c(x: f32[{N}, {C}, {H}, {H}], w: f32[{O}, {C}, {k}, {k}], m: f32[{O}], v: f32[{O}], g: f32[{O}],
        be: f32[{O}]) -> f32[{N}, {O}, {(H + 2 * p - k) // s + 1}, {(H + 2 * p - k) // s + 1}] {{
  return relu(batchnorm(conv2d(x, w, stride={s}, padding={p}), m, v, g, be, eps=0.00001))
}}
"""
    env = {"auto": {}, "direct": {"EQFUSE_CONV": "direct", "EQFUSE_CONV_WINOGRAD": "0"},
           "winograd": {"EQFUSE_CONV": "direct", "EQFUSE_CONV_WINOGRAD": "1"}, "im2col": {"EQFUSE_CONV": "im2col"}}[path]
    old = {k: os.environ.pop(k, None) for k in ("EQFUSE_CONV", "EQFUSE_CONV_WINOGRAD")}
    os.environ.update(env)
    try:
        mod = eqfuse.compile(src, params={n: a for n, a in xs.items() if n != "x"}, precision=precision)
    finally:
        for k, v in old.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v
    (fn,) = mod.functions.values()
    return fn


def _ort(shape, xs, threads):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    N, C, H, _O, k, s, p = shape
    inits = [numpy_helper.from_array(xs[n], n) for n in ("w", "g", "be", "m", "v")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4),
             helper.make_node("BatchNormalization", ["c", "g", "be", "m", "v"], ["bn"], epsilon=1e-5),
             helper.make_node("Relu", ["bn"], ["y"])]
    g = helper.make_graph(nodes, "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, C, H, H])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, {"x": xs["x"]})[0]


# name: (op, N, C, L, O, k, stride, padding, group, epilogue); L the image's side (conv1d: its length)
GROUPED = {
    "mobilenet": {
        "mbv2 dw 32 3x3 @112": ("conv2d", 1, 32, 112, 32, 3, 1, 1, 32, "bn_relu6"),
        "mbv2 dw 96 3x3/2 @112": ("conv2d", 1, 96, 112, 96, 3, 2, 1, 96, "bn_relu6"),
        "mbv2 dw 144 3x3 @56": ("conv2d", 1, 144, 56, 144, 3, 1, 1, 144, "bn_relu6"),
        "mbv2 dw 192 3x3 @28": ("conv2d", 1, 192, 28, 192, 3, 1, 1, 192, "bn_relu6"),
        "mbv2 dw 384 3x3 @14": ("conv2d", 1, 384, 14, 384, 3, 1, 1, 384, "bn_relu6"),
        "mbv2 dw 576 3x3 @14": ("conv2d", 1, 576, 14, 576, 3, 1, 1, 576, "bn_relu6"),
    },
    "convnext": {
        "convnext dw 96 7x7 @56": ("conv2d", 1, 96, 56, 96, 7, 1, 3, 96, "bias"),
        "convnext dw 192 7x7 @28": ("conv2d", 1, 192, 28, 192, 7, 1, 3, 192, "bias"),
        "convnext dw 384 7x7 @14": ("conv2d", 1, 384, 14, 384, 7, 1, 3, 384, "bias"),
        "convnext dw 768 7x7 @7": ("conv2d", 1, 768, 7, 768, 7, 1, 3, 768, "bias"),
    },
    "regnet": {  # RegNetX-400MF's grouped 3x3 convs, group width 16
        "regnet g16 64 3x3 @28": ("conv2d", 1, 64, 28, 64, 3, 1, 1, 4, "bn_relu6"),
        "regnet g16 160 3x3 @14": ("conv2d", 1, 160, 14, 160, 3, 1, 1, 10, "bn_relu6"),
        "regnet g16 400 3x3 @7": ("conv2d", 1, 400, 7, 400, 3, 1, 1, 25, "bn_relu6"),
    },
    "regnet_widths": {  # larger RegNets' group widths: RegNetX-1.6GF (24), X-3.2GF (48), Y-8GF (56), X-8GF (120)
        "regnet g24 72 3x3 @56": ("conv2d", 1, 72, 56, 72, 3, 1, 1, 3, "bn_relu6"),
        "regnet g24 168 3x3 @28": ("conv2d", 1, 168, 28, 168, 3, 1, 1, 7, "bn_relu6"),
        "regnet g24 408 3x3 @14": ("conv2d", 1, 408, 14, 408, 3, 1, 1, 17, "bn_relu6"),
        "regnet g48 192 3x3 @28": ("conv2d", 1, 192, 28, 192, 3, 1, 1, 4, "bn_relu6"),
        "regnet g56 448 3x3 @28": ("conv2d", 1, 448, 28, 448, 3, 1, 1, 8, "bn_relu6"),
        "regnet g120 720 3x3 @14": ("conv2d", 1, 720, 14, 720, 3, 1, 1, 6, "bn_relu6"),
    },
    # depthwise convs with a channel multiplier (out = 2 x in channels) and groups of 4 and 8
    # channels (fewer than a vector): channels in the lanes, each lane reading its group's inputs
    "multiplier": {
        "dw x2 32->64 3x3 @56": ("conv2d", 1, 32, 56, 64, 3, 1, 1, 32, "bn_relu6"),
        "dw x2 64->128 3x3/2 @56": ("conv2d", 1, 64, 56, 128, 3, 2, 1, 64, "bn_relu6"),
        "dw x2 96->192 7x7 @28": ("conv2d", 1, 96, 28, 192, 7, 1, 3, 96, "bias"),
        "g4 128 3x3 @28": ("conv2d", 1, 128, 28, 128, 3, 1, 1, 32, "bn_relu6"),
        "g8 256 3x3 @14": ("conv2d", 1, 256, 14, 256, 3, 1, 1, 32, "bn_relu6"),
    },
    "whisper": {
        "whisper conv1 80->384 k3 @3000": ("conv1d", 1, 80, 3000, 384, 3, 1, 1, 1, "bias_gelu"),
        "whisper conv2 384 k3/2 @3000": ("conv1d", 1, 384, 3000, 384, 3, 2, 1, 1, "bias_gelu"),
    },
}


def _grouped_arrays(op, N, C, L, O, k, g):
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    sp = (L, L) if op == "conv2d" else (L,)
    return {"x": f(N, C, *sp), "w": f(O, C // g, *(k,) * len(sp)) * 0.1, "b": f(O) * 0.1, "m": f(O) * 0.1,
            "v": np.abs(f(O)) + 0.5, "ga": f(O), "be": f(O)}


def _grouped_eqfuse(shape, xs, precision="f32"):
    op, N, C, L, O, k, s, p, g, epi = shape
    out = (L + 2 * p - k) // s + 1
    sp, osp = ((L, L), (out, out)) if op == "conv2d" else ((L,), (out,))
    dims = lambda t: ", ".join(map(str, t))
    conv = f"{op}(x, w, b, stride={s}, padding={p}, group={g})"
    body = {"bn_relu6": f"clip(batchnorm({conv}, m, v, ga, be, eps=0.00001), min=0.0, max=6.0)",
            "bias": conv, "bias_gelu": f"gelu({conv})"}[epi]
    names = ["w", "b"] + (["m", "v", "ga", "be"] if epi == "bn_relu6" else [])
    ps = ", ".join(f"{n}: f32[{dims(xs[n].shape)}]" for n in names)
    src = f"graph c(x: f32[{N}, {C}, {dims(sp)}], {ps}) -> f32[{N}, {O}, {dims(osp)}] {{\n  return {body}\n}}\n"
    mod = eqfuse.compile(src, params={n: xs[n] for n in names}, precision=precision)
    (fn,) = mod.functions.values()
    return fn


def _grouped_model(shape, xs):
    """The conv and its epilogue as an ONNX model (bytes)."""
    from onnx import TensorProto, helper, numpy_helper

    op, N, C, L, O, k, s, p, g, epi = shape
    nd = 2 if op == "conv2d" else 1
    inits = [numpy_helper.from_array(xs[n], n) for n in ("w", "b") + (("ga", "be", "m", "v") if epi == "bn_relu6" else ())]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k] * nd, strides=[s] * nd,
                              pads=[p] * 2 * nd, group=g)]
    if epi == "bn_relu6":
        inits += [numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
        nodes += [helper.make_node("BatchNormalization", ["c", "ga", "be", "m", "v"], ["bn"], epsilon=1e-5),
                  helper.make_node("Clip", ["bn", "lo", "hi"], ["y"])]
    elif epi == "bias_gelu":
        nodes += [helper.make_node("Gelu", ["c"], ["y"])]
    else:
        nodes += [helper.make_node("Identity", ["c"], ["y"])]
    gr = helper.make_graph(nodes, "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs["x"].shape))],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(gr, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()


def _grouped_ort(shape, xs, threads):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(_grouped_model(shape, xs), so, providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, {"x": xs["x"]})[0]


def _grouped_openvino(shape, xs, threads, hint="f32"):
    """OpenVINO's CPU plugin in f32 (INFERENCE_PRECISION_HINT f32; hint None: its default
    precision) on `threads` threads; None if openvino is not installed."""
    try:
        import openvino as ov
    except ImportError:
        return None
    core = ov.Core()
    model = core.read_model(_grouped_model(shape, xs), b"")
    config = {"INFERENCE_NUM_THREADS": threads} | ({"INFERENCE_PRECISION_HINT": hint} if hint else {})
    req = core.compile_model(model, "CPU", config).create_infer_request()

    def run():
        req.infer({"x": xs["x"]})
        return req.get_output_tensor(0).data
    return run


def main_grouped(sets: list[str], repeat: int, threads: list[int], precision: str = "f32",
                 cpu_time: bool = False) -> int:
    bf = precision == "bf16"
    print(f"{'conv (batch 1)':<34}{'thr':>4}{'eqfuse us':>11}" + (f"{'eqfuse f32 us':>15}" if bf else "")
          + f"{'ORT us':>9}{'OV us' if not bf else 'OV dflt us':>11}{'ORT/eqfuse':>12}{'OV/eqfuse':>11}"
          + (f"{'err eqfuse':>12}{'err OV':>10}" if bf else f"{'GB/s eqfuse':>13}") + "  path")
    for th in threads:
        for name, shape in {k: v for s in sets for k, v in GROUPED[s].items()}.items():
            op, N, C, L, O, k, s, p, g, epi = shape
            xs = _grouped_arrays(op, N, C, L, O, k, g)
            fn = _grouped_eqfuse(shape, xs, precision)
            fn.threads = th
            runs = {"eqfuse": functools.partial(fn, x=xs["x"])}
            if bf:  # (eqfuse in f32 too, interleaved with the rest)
                f32 = _grouped_eqfuse(shape, xs)
                f32.threads = th
                runs["f32"] = functools.partial(f32, x=xs["x"])
            runs["ort"] = _grouped_ort(shape, xs, th)
            ov = _grouped_openvino(shape, xs, th, None if bf else "f32")
            if ov is not None:
                runs["ov"] = ov
            want = runs["ort"]()
            err = {}
            for key, run in runs.items():
                if bf and key in ("eqfuse", "ov"):  # (bf16's scale: max|difference| / max|f32 output|)
                    err[key] = float(np.max(np.abs(np.asarray(run()) - want)) / np.max(np.abs(want)))
                    assert err[key] <= 3e-2, (name, key, err[key])
                else:
                    np.testing.assert_allclose(np.asarray(run()), want, rtol=1e-3, atol=1e-3, err_msg=f"{name} {key}")
            times = alternate(runs, repeat, th, cpu_time=cpu_time)
            med = {key: statistics.median(v) * 1e6 for key, v in times.items()}
            moved = 4 * (xs["x"].size + want.size)  # bytes in and out (the floor of a memory-bound conv)
            plan = next(q for q in fn.last.plans if q.kind == "conv2d")
            d = plan.detail
            path = type(d).__name__ + (" channels" if getattr(d, "channels", False) else
                                       " pixels" if hasattr(d, "channels") else "")
            path += f" {d.algorithm}" if hasattr(d, "algorithm") else ""  # (a direct conv's template)
            if bf:
                path += f" {plan.precision} ({plan.precision_path})"
            ovt = f"{med['ov']:>11.1f}" if "ov" in med else f"{'-':>11}"
            ovr = f"{med['ov'] / med['eqfuse']:>11.2f}" if "ov" in med else f"{'-':>11}"
            tail = (f"{err['eqfuse']:>12.1e}" + (f"{err['ov']:>10.1e}" if "ov" in err else f"{'-':>10}") if bf
                    else f"{moved / med['eqfuse'] / 1e3:>13.2f}")
            print(f"{name:<34}{th:>4}{med['eqfuse']:>11.1f}" + (f"{med['f32']:>15.1f}" if bf else "")
                  + f"{med['ort']:>9.1f}{ovt}{med['ort'] / med['eqfuse']:>12.2f}{ovr}{tail}  {path}", flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--threads", type=int, action="append")
    ap.add_argument("--set", default="all",
                    choices=("resnet18", "resnet56", "all", *GROUPED, "grouped"))
    ap.add_argument("--precision", choices=("f32", "bf16"), default="f32",
                    help="eqfuse's precision (onnxruntime stays f32)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="the grouped sets at one thread: time calls by the process's CPU time (on a shared "
                         "machine the time slices other processes take are then not counted)")
    args = ap.parse_args(argv)
    if args.cpu_time and (args.threads or [1]) != [1]:
        ap.error("--cpu-time counts every thread of the process: --threads 1 only")
    blas_threads(1)
    if args.set in GROUPED or args.set == "grouped":
        return main_grouped(list(GROUPED) if args.set == "grouped" else [args.set], args.repeat, args.threads or [1],
                            args.precision, args.cpu_time)
    shapes = {**(RESNET18 if args.set in ("resnet18", "all") else {}),
              **(RESNET56 if args.set in ("resnet56", "all") else {})}
    bf = args.precision == "bf16"
    print(f"{'conv (N=batch)':<26}{'thr':>4}{'direct us':>11}{'winograd us':>13}{'im2col us':>11}{'auto us':>9}"
          + (f"{'f32 auto us':>13}" if bf else "") + f"{'ORT us':>9}{'ORT/auto':>10}  auto path")
    for th in args.threads or [1]:
        for name, shape in shapes.items():
            xs = _arrays(*shape[:5])
            wino = shape[4] == 3 and shape[5] == 1  # (3x3, stride 1: eqfuse.backend.kinds.contraction.conv.can_run)
            fns = {path: _eqfuse(shape, xs, path, args.precision) for path in ("direct", "winograd", "im2col", "auto")
                   if path != "winograd" or wino}
            if bf:  # (the planner's choice in f32 too, interleaved with the rest)
                fns["f32"] = _eqfuse(shape, xs, "auto")
            runs = {}
            for path, fn in fns.items():
                fn.threads = th
                runs[path] = functools.partial(fn, x=xs["x"])
            runs["ort"] = _ort(shape, xs, th)
            want = runs["ort"]()
            for k, run in runs.items():
                if args.precision == "bf16":  # (bf16's scale: max|difference| / max|f32 output|)
                    err = np.max(np.abs(np.asarray(run()) - want)) / np.max(np.abs(want))
                    assert err <= 3e-2, (k, err)
                else:
                    np.testing.assert_allclose(np.asarray(run()), want, rtol=1e-3, atol=1e-3, err_msg=k)
            times = alternate(runs, args.repeat, th)
            med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
            auto = next(p.detail for p in fns["auto"].last.plans if p.kind == "conv2d")
            path = "im2col" if type(auto).__name__ != "ConvDirectDetail" else "winograd" if auto.winograd else "direct"
            wg = f"{med['winograd']:>13.1f}" if "winograd" in med else f"{'-':>13}"
            print(f"{name:<26}{th:>4}{med['direct']:>11.1f}{wg}{med['im2col']:>11.1f}{med['auto']:>9.1f}"
                  + (f"{med['f32']:>13.1f}" if bf else "") + f"{med['ort']:>9.1f}{med['ort'] / med['auto']:>10.2f}  {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
