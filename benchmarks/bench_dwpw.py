"""The inverted residual fused (rule fuse_dw_pw: a depthwise conv and its 1x1 conv as one kernel,
backend/kinds/contraction/conv_dwpw.py; rule fuse_pw_dw: its expand 1x1 conv too) against the same
model without it, on the model zoo's tiny MobileNetV2 (tests/zoo_models.py: 32x32 images, batch 2,
TorchScript export).

    python benchmarks/bench_dwpw.py [--threads N] [--repeat N] [--profile] [--blocks]
    python benchmarks/bench_dwpw.py --convnext [--block] [--threads N] [--repeat N]
    python benchmarks/bench_dwpw.py --layernorm [--threads N] [--repeat N]

Four builds of the one export: fused (eqfuse's default), whole (the expand conv joins at every
image size: ir.kernels.DW_EXPAND_MIN_PIXEL_VECTORS at 0, so the 2 x 2 and 1 x 1 blocks are one
kernel too), dwpw (the fuse_pw_dw rules disabled: the expand conv a kernel of its own) and unfused (the fuse_dw_pw and fuse_pw_dw rules disabled: the
depthwise and 1x1 convs as separate kernels). Their calls alternate, 50 calls a sample; the table
gives each one's kernels, its largest difference from the unfused output, and the median and
minimum microseconds a call. --profile adds each build's kernels with their times inside the call
(eqfuse.runtime.profile), in the order they run, with the shapes of the convs: the kernels a
fused one replaces are the expand kernel (expand=1), the depthwise kernel and the 1x1 kernel.
--blocks times single inverted residuals (expand 1x1 + ReLU6, depthwise 3x3 + ReLU6, project 1x1,
the residual add at stride 1; batch 1) of growing expanded tensors instead, fused with the expand
conv and without it (the fuse_pw_dw rules disabled), each with its expanded tensor's bytes per
image and the kernel count: what ir.kernels.DW_EXPAND_L1_SHARE is set from.
--convnext times ConvNeXt's block up to its first Linear (rules fuse_dw_ln_mm*: depthwise 7x7
conv + bias, permute to NHWC, LayerNorm, Linear C -> 4C + bias, GELU; an ONNX model, batch 1
unless said) at ConvNeXt-T's four stages and at smaller widths: eqfuse fused (one kernel,
backend/kinds/contraction/conv_dwln.py), eqfuse unfused (the fuse_dw_ln_mm rules disabled: the
depthwise, layernorm and matmul kernels), onnxruntime and OpenVINO's CPU plugin in f32
(INFERENCE_PRECISION_HINT f32; "-" without openvino), calls interleaved (benchmarks/timing.py),
median wall microseconds; the last column is unfused / fused in the process's CPU time per call
(the best of three medians), which the other processes of a shared machine move less; where the
cost rule refuses the fused kernel (kernels 3/3) that column is marked * and times the fused
kernel all the same (compiled with the rule off): what ir.kernels.DWLN_MIN_PIXEL_VECTORS is set
from.
--convnext --block times ConvNeXt's whole block instead (then the second Linear 4C -> C + bias,
the layer scale, the permute back to NCHW and the residual add): fused has the opt-in rules of
eqfuse/optimizer/rules/extra/nchw_residual.rw (the residual add in the GEMM, which writes NCHW at a
column stride), unfused is eqfuse's default (the residual add a kernel of its own after the GEMM).
--layernorm times ConvNeXt's channels-first LayerNorm (its stem's and downsampling layers'; the
layernorm over the channels of an NCHW tensor's NHWC view, permuted back) at the zoo's tiny
ConvNeXt's and ConvNeXt-T's sizes: the rows in the lanes (row_layernorm_lanes.c, the permute back
written in place) with a tile of at most 16 KB and of at most 64 KB (the default) (eqfuse.backend.kinds.row.LANES_TILE_BYTES),
against the rows one at a time (LANES_TILE_BYTES at 0: each row's channels gathered, then the
permute back as a copy kernel); the best of three medians, microseconds a call of the graph.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import zoo_models as zm  # noqa: E402

import eqfuse  # noqa: E402
import eqfuse.runtime.profile as prof  # noqa: E402

CONVNEXT_RULES = ("fuse_dw_ln_mm_gelu", "fuse_dw_ln_mm_bias", "fuse_dw_ln_mm_gelu_r", "fuse_dw_ln_mm_bias_r")
NCHW_RESIDUAL = Path(eqfuse.__file__).parent / "optimizer" / "rules" / "extra" / "nchw_residual.rw"
# (batch, channels, image side): the zoo's tiny ConvNeXt's two stages, smaller widths, ConvNeXt-T's
# four stages at 224 x 224
CONVNEXT = [(2, 16, 8), (2, 32, 4), (1, 64, 4), (1, 48, 16), (1, 64, 16), (1, 96, 56), (1, 128, 14), (1, 192, 28),
            (1, 256, 14), (1, 384, 14), (1, 768, 7)]
EXPAND = ("fuse_pw_dw", "fuse_pw_dw_nobias", "fuse_pw_dw_clip", "fuse_pw_pad_dw_clip")
FUSE = ("fuse_dw_pw", "fuse_dw_pw_res", "fuse_dw_pw_res_r", "fuse_dw_pw_nobias") + EXPAND
SHOWN = ("C", "O", "H", "OH", "OW", "M", "N", "K", "group", "olanes", "flat", "expand", "CI", "band", "ro")


# (input channels, expanded channels, image side, stride)
BLOCKS = [(8, 48, 4, 1), (16, 96, 4, 1), (8, 48, 8, 2), (16, 32, 8, 1), (8, 48, 16, 2), (16, 64, 8, 1),
          (16, 32, 16, 2), (16, 96, 8, 1), (16, 64, 16, 2), (24, 144, 8, 1)]


def _time(fn, arrays, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        for _ in range(5):
            fn(*arrays)
        t = time.perf_counter()
        for _ in range(50):
            fn(*arrays)
        samples.append((time.perf_counter() - t) / 50 * 1e6)
    return statistics.median(samples)


def blocks(threads: int, repeat: int) -> None:
    print(f"inverted residuals, batch 1, {threads} thread(s); expanded = the expand conv's output bytes per image")
    print(f"{'CI':>4s} {'C':>4s} {'side':>4s} {'s':>2s} {'expanded B':>10s} {'kernels':>7s} {'fused us':>9s} "
          f"{'dwpw us':>8s}")
    for ci, c, h, st in BLOCKS:
        res = "x + " if st == 1 else ""
        src = (f"graph blk(x: f32[1, {ci}, {h}, {h}], we: f32[{c}, {ci}, 1, 1], be: f32[{c}], wd: f32[{c}, 1, 3, 3], "
               f"bd: f32[{c}], wp: f32[{ci}, {c}, 1, 1], bp: f32[{ci}]) {{\n"
               f"    e = clip(conv2d(x, we, be), min=0.0, max=6.0)\n"
               f"    d = clip(conv2d(e, wd, bd, stride={st}, padding=1, group={c}), min=0.0, max=6.0)\n"
               f"    return {res}conv2d(d, wp, bp)\n}}\n")
        rng = np.random.default_rng(0)
        shapes = [(1, ci, h, h), (c, ci, 1, 1), (c,), (c, 1, 3, 3), (c,), (ci, c, 1, 1), (ci,)]
        arrays = [(rng.standard_normal(sh) / 4).astype(np.float32) for sh in shapes]
        fused = eqfuse.compile(src, threads=threads)
        dwpw = eqfuse.compile(src, threads=threads, disable=EXPAND)
        np.testing.assert_allclose(fused(*arrays), dwpw(*arrays), rtol=1e-4, atol=1e-5)
        tf, td = _time(fused, arrays, repeat), _time(dwpw, arrays, repeat)
        print(f"{ci:4d} {c:4d} {h:4d} {st:2d} {c * h * h * 4:10d} {len(fused.kernels):3d}/{len(dwpw.kernels):<3d} "
              f"{tf:9.2f} {td:8.2f}")


def _convnext_model(n: int, c: int, h: int, rng, whole: bool = False) -> tuple[bytes, np.ndarray]:
    """The ONNX model of ConvNeXt's block up to its GELU (as the TorchScript exporter writes it:
    GELU as Erf), or `whole` with its second Linear, layer scale and residual, and an input."""
    from onnx import TensorProto, helper, numpy_helper

    f = 4 * c
    arrays = {"wd": rng.standard_normal((c, 1, 7, 7)) / 7, "bd": rng.standard_normal(c) / 4,
              "g": 1 + rng.standard_normal(c) / 4, "be": rng.standard_normal(c) / 4,
              "w1": rng.standard_normal((c, f)) / np.sqrt(c), "b1": rng.standard_normal(f) / 4,
              "s2": np.array(np.sqrt(2)), "one": np.array(1.0), "half": np.array(0.5)}
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in arrays.items()]
    nodes = [helper.make_node("Conv", ["x", "wd", "bd"], ["d"], group=c, kernel_shape=[7, 7], pads=[3] * 4),
             helper.make_node("Transpose", ["d"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["t", "g", "be"], ["ln"], axis=-1, epsilon=1e-6),
             helper.make_node("MatMul", ["ln", "w1"], ["mm"]), helper.make_node("Add", ["mm", "b1"], ["a"]),
             helper.make_node("Div", ["a", "s2"], ["q"]), helper.make_node("Erf", ["q"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["a", "e1"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y" if not whole else "h"])]
    if whole:
        more = {"w2": rng.standard_normal((f, c)) / np.sqrt(f), "b2": rng.standard_normal(c) / 4,
                "ls": rng.standard_normal(c) / 4}
        inits += [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in more.items()]
        nodes += [helper.make_node("MatMul", ["h", "w2"], ["m2"]), helper.make_node("Add", ["m2", "b2"], ["a2"]),
                  helper.make_node("Mul", ["a2", "ls"], ["s"]),
                  helper.make_node("Transpose", ["s"], ["sn"], perm=[0, 3, 1, 2]),
                  helper.make_node("Add", ["x", "sn"], ["y"])]
    g = helper.make_graph(nodes, "convnext", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, h])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString(), rng.standard_normal((n, c, h, h)).astype(np.float32)


def _forced(path: str, threads: int, rule: str = "DWLN_MIN_PIXEL_VECTORS"):
    """The model compiled with the fused kernel where the cost rule `rule` refuses it (that
    constant of ir.kernels at 0, the optimized-graph cache off)."""
    import os

    import eqfuse.ir.kernels as ik

    old, was = getattr(ik, rule), os.environ.get("EQFUSE_NO_CACHE")
    setattr(ik, rule, 0)
    os.environ["EQFUSE_NO_CACHE"] = "1"
    try:
        return eqfuse.compile(path, threads=threads)
    finally:
        setattr(ik, rule, old)
        if was is None:
            del os.environ["EQFUSE_NO_CACHE"]
        else:
            os.environ["EQFUSE_NO_CACHE"] = was


def _cpu_us(run, repeat: int) -> float:
    """The median CPU seconds of the process (all its threads) per call, in microseconds, over
    `repeat` samples of a few calls: less moved than the wall time by the other processes of a
    shared machine, which take the cores away but do not count here."""
    samples = []
    for _ in range(repeat):
        t, n = time.process_time(), 0
        while n < 3 or time.process_time() - t < 2e-3:
            run()
            n += 1
        samples.append((time.process_time() - t) / n * 1e6)
    return statistics.median(samples)


def convnext(threads: int, repeat: int, whole: bool = False) -> None:
    import tempfile

    import onnxruntime as ort
    from timing import alternate  # benchmarks/timing.py

    print(f"ConvNeXt's dwconv 7x7 + permute + LayerNorm + Linear C->4C + GELU"
          f"{' + Linear 4C->C + layer scale + permute + residual add' if whole else ''}, {threads} thread(s); "
          f"tile = a row of the depthwise output, C x W x 4 bytes")
    print(f"{'N':>2s} {'C':>4s} {'side':>4s} {'tile B':>7s} {'kernels':>7s} {'fused us':>9s} {'unfused us':>10s} "
          f"{'ORT us':>9s} {'OV us':>9s} {'unf/fused':>9s} {'ORT/fused':>9s} {'OV/fused':>8s} {'cpu unf/fu':>11s}")
    for n, c, h in CONVNEXT:
        model, x = _convnext_model(n, c, h, np.random.default_rng(c), whole)
        with tempfile.NamedTemporaryFile(suffix=".onnx") as fh:
            fh.write(model)
            fh.flush()
            if whole:
                fused = eqfuse.compile(fh.name, threads=threads, rules=[str(NCHW_RESIDUAL)])
                unfused = eqfuse.compile(fh.name, threads=threads)
            else:
                fused = eqfuse.compile(fh.name, threads=threads)
                unfused = eqfuse.compile(fh.name, threads=threads, disable=CONVNEXT_RULES)
            refused = len(fused.kernels) == len(unfused.kernels) and not whole
            if refused:  # (the cost rule keeps three kernels: the fused kernel as it would run, for the last column)
                forced = _forced(fh.name, threads)
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        runs = {"fused": lambda: fused(x), "unfused": lambda: unfused(x), "ort": lambda: sess.run(None, {"x": x})[0]}
        try:
            import openvino as ov

            core = ov.Core()
            req = core.compile_model(core.read_model(model, b""), "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                                      "INFERENCE_PRECISION_HINT": "f32"}
                                     ).create_infer_request()

            def ovrun():
                req.infer({"x": x})
                return req.get_output_tensor(0).data
            runs["ov"] = ovrun
        except ImportError:
            pass
        want = runs["ort"]()
        for k, run in runs.items():
            np.testing.assert_allclose(np.asarray(run()), want, rtol=1e-3, atol=1e-4, err_msg=f"{c}@{h} {k}")
        kinds = len([k for k in fused.kernels if k.kind != "view"]), len([k for k in unfused.kernels if k.kind != "view"])
        med = {k: statistics.median(v) * 1e6 for k, v in alternate(runs, repeat, threads).items()}
        cruns = {"fused": (lambda: forced(x)) if refused else runs["fused"], "unfused": runs["unfused"]}
        cpu = {k: _cpu_us(cruns[k], repeat) for k in cruns}
        for _ in range(2):  # (the best of three medians, the builds interleaved)
            for k in cpu:
                cpu[k] = min(cpu[k], _cpu_us(cruns[k], repeat))
        ovt, ovr = (f"{med['ov']:9.1f}", f"{med['ov'] / med['fused']:8.2f}") if "ov" in med else (f"{'-':>9s}", f"{'-':>8s}")
        print(f"{n:2d} {c:4d} {h:4d} {c * h * 4:7d} {kinds[0]:3d}/{kinds[1]:<3d} {med['fused']:9.1f} "
              f"{med['unfused']:10.1f} {med['ort']:9.1f} {ovt} {med['unfused'] / med['fused']:9.2f} "
              f"{med['ort'] / med['fused']:9.2f} {ovr} {cpu['unfused'] / cpu['fused']:10.2f}{'*' if refused else ' '}",
              flush=True)


# (batch, channels, image side): the zoo's tiny ConvNeXt's stem, ConvNeXt-T's stem and downsamplings
LAYERNORMS = [(2, 16, 8), (2, 32, 4), (1, 96, 56), (1, 192, 28), (1, 384, 14), (1, 768, 7)]


def layernorm(threads: int, repeat: int) -> None:
    import eqfuse.backend.kinds.row as row

    print(f"channels-first layernorm (+ the permute back), {threads} thread(s); lanes = rows a block per tile size")
    print(f"{'N':>2s} {'C':>4s} {'side':>4s} {'lanes':>9s} {'rows us':>9s} {'16K us':>9s} {'64K us':>9s} "
          f"{'rows/16K':>8s} {'rows/64K':>8s}")
    old = row.LANES_TILE_BYTES
    for n, c, h in LAYERNORMS:
        src = (f"graph g(x: f32[{n}, {c}, {h}, {h}], ga: f32[{c}], be: f32[{c}]) {{\n    return transpose(layernorm("
               f"transpose(x, perm=[0, 2, 3, 1]), ga, be, eps=1e-6), perm=[0, 3, 1, 2])\n}}\n")
        rng = np.random.default_rng(c)
        a = [rng.standard_normal((n, c, h, h)).astype(np.float32), rng.standard_normal(c).astype(np.float32),
             rng.standard_normal(c).astype(np.float32)]
        mods, lanes = {}, []
        try:
            for k, tb in (("rows", 0), ("16K", 16384), ("64K", 65536)):
                row.LANES_TILE_BYTES = tb
                mods[k] = eqfuse.compile(src, threads=threads)
                lanes += [k_.decisions["lanes"] for k_ in mods[k].kernels if k_.kind == "row"]
        finally:
            row.LANES_TILE_BYTES = old
        for k in mods:
            np.testing.assert_allclose(mods[k](*a), mods["rows"](*a), rtol=1e-4, atol=1e-5)
        best = {k: min(_time(m, a, repeat) for _ in range(3)) for k, m in mods.items()}
        print(f"{n:2d} {c:4d} {h:4d} {'/'.join(map(str, lanes[1:])):>9s} {best['rows']:9.1f} {best['16K']:9.1f} "
              f"{best['64K']:9.1f} {best['rows'] / best['16K']:8.2f} {best['rows'] / best['64K']:8.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=30, help="samples per build")
    ap.add_argument("--profile", action="store_true", help="each build's kernels and their times")
    ap.add_argument("--blocks", action="store_true", help="single inverted residuals of growing sizes")
    ap.add_argument("--convnext", action="store_true", help="ConvNeXt's block up to its first Linear, fused or not")
    ap.add_argument("--block", action="store_true", help="with --convnext: the whole block, its residual add fused or not")
    ap.add_argument("--layernorm", action="store_true", help="ConvNeXt's channels-first LayerNorm, rows in the lanes or not")
    a = ap.parse_args()
    if a.layernorm:
        return layernorm(a.threads, a.repeat)
    if a.convnext:
        return convnext(a.threads, a.repeat, a.block)
    if a.blocks:
        return blocks(a.threads, a.repeat)
    path = str(zm.export("mobilenet-v2", "torchscript"))
    arrays = list(zm.inputs("mobilenet-v2").values())
    mods = {"fused": eqfuse.compile(path, threads=a.threads),
            "whole": _forced(path, a.threads, "DW_EXPAND_MIN_PIXEL_VECTORS"),
            "dwpw": eqfuse.compile(path, threads=a.threads, disable=EXPAND),
            "unfused": eqfuse.compile(path, threads=a.threads, disable=FUSE)}
    ref = mods["unfused"](*arrays)
    times: dict[str, list[float]] = {k: [] for k in mods}
    for _ in range(a.repeat):
        for k, m in mods.items():
            for _ in range(5):
                m(*arrays)
            t = time.perf_counter()
            for _ in range(50):
                m(*arrays)
            times[k].append((time.perf_counter() - t) / 50 * 1e6)
    print(f"MobileNetV2 (zoo), {a.threads} thread(s)")
    print(f"{'build':14s} {'kernels':>7s} {'max diff':>9s} {'median us':>10s} {'min us':>8s}")
    for k, m in mods.items():
        diff = float(np.abs(m(*arrays) - ref).max())
        print(f"{k:14s} {m.report['kernels_after']:7d} {diff:9.2e} {statistics.median(times[k]):10.1f} "
              f"{min(times[k]):8.1f}")
    if a.profile:
        for k in mods:
            r = prof.profile(mods[k], *arrays, repeat=1000)
            print(f"\n{k}: kernels {sum(x[2] for x in r['kernels']):.1f} us of a {r['call_us']:.1f} us call")
            for (name, _, us, _), kk in zip(r["kernels"], mods[k].kernels):
                d = kk.decisions
                print(f"  {name.rsplit('_', 2)[-2]:5s} {kk.kind:9s} {us:7.2f}  "
                      + " ".join(f"{f}={d[f]}" for f in SHOWN if f in d))


if __name__ == "__main__":
    main()
