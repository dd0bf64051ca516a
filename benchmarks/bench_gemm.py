"""GEMM with a fused bias+ReLU epilogue against numpy, per vector width, and one transformer layer.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE taskset -c 1 \\
        python benchmarks/bench_gemm.py [--machine host,avx2,portable] [--threads 1] [--repeat N]

(Those two variables, when set, slow numpy's OpenBLAS; unset them for this command only.)

`--machine` pins the machine model the planner and the compiler see (eqfuse.machine):
"host" is this CPU; "avx2" is MODELS["avx2"] (8-float vectors, built for x86-64-v3, so on an
AVX-512 host the AVX2 code paths really run); "portable" is 4-float vectors built for x86-64-v2
(SSE4.2, no AVX). numpy's matmul is the same OpenBLAS in every row (it picks its own kernels:
with the two variables unset, its AVX-512 ones on an AVX-512 host, so the avx2 rows sit near 0.5x
numpy by construction: a ymm FMA does half a zmm one's work, and a Zen 5 core issues two of either
per cycle. Against OpenBLAS's own AVX2 kernels, OPENBLAS_CORETYPE=Haswell, they measured 0.95-0.99x).

Each (machine, thread count) runs in its own subprocess: OpenBLAS reads OPENBLAS_NUM_THREADS
once, at import. Columns are GFLOP/s (2*M*N*K / median seconds; "prepacked B" reads B from panels packed once,
as for a weight bound by params=) and, for the transformer layer
(examples/transformer.g, B=1, eqfuse.compile with its weights bound), the median ms of a call.
Every result is checked against float64 numpy first. The epilogue is the op table's relu,
`eqf_relu` (NaN-propagating, vectorized), as a compiled graph's GEMM has it: libm's `fmaxf`,
which this table once used, does not vectorize without -ffinite-math-only and cost 1024^3 a
seventh of its speed (prepacked, one Zen 5 thread: 222 against 258 GFLOP/s).

`--small` measures instead the few-rows shapes of batch 1-16 inference (M = 1, 8, 16 x K, N in
768-3072) on one thread, interleaved in one process: y = x @ W + b with W and b bound, as
eqfuse.compile runs it (the skinny path, csrc_templates/gemm_skinny.c; "kernel": its GEMM alone,
without the Module call), the blocked GEMM over the same prepacked W (csrc_templates/gemm.c,
the path before), onnxruntime (one MatMul+Add
node, W and b initializers, ORT_ENABLE_ALL, 1 intra-op thread) and numpy (x @ W + b). Columns:
median us of `--rounds` rounds (each the median of `--repeat` calls), the spread (max - min
over the rounds, % of the median), and the GB/s at which W streams (K x N x 4 bytes / time).

`--tiles` checks the derived per-CPU choices (eqfuse.machine) on this machine: the
blocked GEMM's register tile at 1024^3 and the skinny tile at 8 and 16 rows, each against its
neighbours, interleaved in one process on one thread (GFLOP/s, median of the rounds).

`--peers` compares eqfuse with the other libraries that pack a bound weight once, on the
transformer-inference shapes (M in 1, 8, 32, 128, 256; K x N in 768 x 768, 768 x 3072 with GELU,
3072 x 768), each y = act(x @ W + b) with W and b bound, at each `--threads` count (a child per
count): eqfuse (eqfuse.compile, the Module call), MKL's packed GEMM as torch's freezing runs it
(`torch.ops.mkl._mkl_reorder_linear_weight` once, then `_mkl_linear` and the activation in
place), oneDNN's linear with the activation fused (`torch.ops.mkldnn._linear_pointwise` over
`_reorder_linear_weight`'s packed weight), onnxruntime (MatMul+Add+act, ORT_ENABLE_ALL fuses
them; its threads not spinning) and numpy's bare x @ W (no bias, no activation). Interleaved:
each of `--rounds` rounds times every peer (median of `--repeat` calls); the table gives the
median ms over the rounds, the spread (max - min, % of the median) and eqfuse's GFLOP/s.

`--precision f32|bf16` (docs/precision.md) compares the precisions on y = relu(x @ W + b) with W
and b bound (PRECISION shapes), at each `--threads` count (a child per count), interleaved in one
process: eqfuse in f32 and in the precision asked (eqfuse.compile(..., precision=)), and OpenVINO
on the same ONNX model (MatMul + Add + Relu, W and b initializers) in f32
(INFERENCE_PRECISION_HINT f32) and in its default precision (bf16 on a CPU with AVX512_BF16 or
AMX; the table names what it chose). Columns: median ms over `--rounds` rounds (each the median
of `--repeat` calls), GFLOP/s, the fraction of the peak of the row's precision, and the error
max|y - y_ref| / max|y_ref| against the float64 result of the f32 inputs, measured the same way
for every row. The peaks are measured on these cores before the rows and after them (the best
of the two): the f32 one by a loop of independent
vfmadd231ps on zmm registers (16 lanes x 2 FLOPs each); the bf16 one is derived from it by the
machine's eqfuse.machine.bf16_dot_ratio (a vdpbf16ps does two multiply-adds per 32-bit lane: 2x
where it issues at the FMA's throughput, on AMD's cores; 0.5x on Intel's, where it measured one
every other cycle against two FMAs a cycle), and the loop of vdpbf16ps is measured beside it as a check. A row on AMX-BF16 tiles (the path `amx_bf16` in
report["precision"]) is given as a fraction of the AMX peak, derived as 16 times the f32 one
(eqfuse.machine.bf16_peak_ratio: tdpbf16ps's 512 multiply-adds per cycle over two 16-lane FMAs),
and a loop of tdpbf16ps on four C tiles is measured beside it as a check.

`--int8` (docs/precision.md) measures a dynamically quantized linear layer y = x @ W + b as
onnxruntime.quantization.quantize_dynamic writes it (W int8, x quantized to u8 per call:
DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul -> Add), on the INT8 shapes (BERT-base's
128 tokens), eqfuse (eqfuse.compile of the quantized file: the u8 x s8 GEMM with the dequantizing
epilogue, plus the activation's quantization) against onnxruntime on the same file
(ORT_ENABLE_ALL), interleaved in one process at each `--threads` count. Columns: median ms over
`--rounds` rounds (each the median of `--repeat` calls), the spread, eqfuse's GOP/s (2 M N K / time)
and each eqfuse row's instruction path (report["precision"]). The weights are quantized with
`--reduce-range` (ort_reduce_range): by default (auto) with reduce_range=True, 7-bit weights, on a
CPU without VNNI, onnxruntime's own recipe there, where its vpmaddubsw GEMM saturates with 8-bit
weights. eqfuse's bound weights take its avx2_maddubs path on such a CPU either way (exact: the
few pairs of 8-bit weights that could saturate corrected); the header says which weights.
`--int8 --pairs` measures what the avx2_maddubs path's corrected weight pairs cost (only on a
CPU without VNNI): one 128 x 768 x 768 integer GEMM with bound weights of 7 bits, and with a
growing share of its weight pairs past vpmaddubsw's int16 (qgemm.pair_corrections), each on that
path and the densest also on the vpmaddwd fallback, interleaved (qgemm.CORRECTED_PAIRS_MAX
replaced for the compile); every result checked against numpy's int64 product first.
With `--tiles`, eqfuse alone with each candidate register tile of the
integer GEMM instead (qgemm.int8_tile replaced for the compile), then the derived tile with K in
one block and in blocks of a quarter and an eighth of L1 (qgemm.int8_kc replaced), the derived
choices marked.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SHAPES = [(128, 768, 768), (32, 3072, 768), (1024, 1024, 1024)]  # (M, N, K)
SMALL = [(M, N, K) for M in (1, 8, 16) for K, N in ((768, 768), (768, 3072), (3072, 768), (1024, 1024))]
PEERS = [(M, N, K) for M in (1, 8, 32, 128, 256) for K, N in ((768, 768), (768, 3072), (3072, 768))]
MODEL = Path(__file__).resolve().parent.parent / "examples" / "transformer.g"
# (M, N, K) of --precision: a square GEMM, BERT's two FFN GEMMs (the second K-deep, its A, the
# activations, packed on every call) and a decode step's
PRECISION = [(1024, 1024, 1024), (256, 3072, 768), (128, 768, 3072), (8, 3072, 768)]
INT8 = [(128, 768, 768), (128, 3072, 768), (128, 768, 3072)]  # (M, N, K) of --int8

PEAK_C = r"""
#include <immintrin.h>
/* n steps of 12 independent accumulators of peak_lanes() floats: vfmadd231ps (2 FLOPs a lane) or,
 * with bf16, vdpbf16ps (4 a lane: two multiply-adds); zmm where the build targets AVX-512, else ymm */
#if defined(__AVX512F__)
typedef __m512 peak_v;
#define PEAK_SET1 _mm512_set1_ps
#define PEAK_FMA _mm512_fmadd_ps
#define PEAK_ADD _mm512_add_ps
#else
typedef __m256 peak_v;
#define PEAK_SET1 _mm256_set1_ps
#define PEAK_FMA _mm256_fmadd_ps
#define PEAK_ADD _mm256_add_ps
#endif
int peak_lanes(void) { return (int)(sizeof(peak_v) / sizeof(float)); }
float peak_loop(long n, int bf16)
{
    peak_v c[12];
    for (int r = 0; r < 12; r++)
        c[r] = PEAK_SET1((float)r);
    const peak_v a = PEAK_SET1(1.0f), b = PEAK_SET1(1e-8f);
    if (bf16) {
#if defined(__AVX512BF16__)
        const __m512bh ah = (__m512bh)_mm512_set1_epi32(0x3f803f80), bh = (__m512bh)_mm512_set1_epi32(0x32ab32ab);
        for (long i = 0; i < n; i++)
#pragma GCC unroll 12
            for (int r = 0; r < 12; r++)
                c[r] = _mm512_dpbf16_ps(c[r], ah, bh);
#else
        return -1.0f;
#endif
    } else {
        for (long i = 0; i < n; i++)
#pragma GCC unroll 12
            for (int r = 0; r < 12; r++)
                c[r] = PEAK_FMA(a, b, c[r]);
    }
    peak_v s = c[0];
    for (int r = 1; r < 12; r++)
        s = PEAK_ADD(s, c[r]);
    float lanes[sizeof(peak_v) / sizeof(float)];
    memcpy(lanes, &s, sizeof lanes);
    float t = 0.0f;
    for (int i = 0; i < peak_lanes(); i++)
        t += lanes[i];
    return t;
}

/* n steps of four tdpbf16ps on four independent C tiles (16 x 16 x 32 multiply-adds each), where
 * the kernels are built for AMX-BF16 (or emulate it); -1 elsewhere, or when the operating system
 * refuses the tile state (csrc_templates/common_amx.h) */
float peak_amx(long n)
{
#if (defined(__AMX_TILE__) && defined(__AMX_BF16__)) || defined(EQF_AMX_EMULATE)
    static uint16_t ones[16 * 32] __attribute__((aligned(64)));
    float out[16 * 16] __attribute__((aligned(64)));
    if (!eqf_amx_ready())
        return -1.0f;
    for (int i = 0; i < 16 * 32; i++)
        ones[i] = 0x2c00; /* bf16 2^-39: the sums stay far from overflow */
    eqf_amx_begin();
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    EQF_AMX_FENCE();
    _tile_loadd(4, ones, 64);
    _tile_loadd(5, ones, 64);
    _tile_loadd(6, ones, 64);
    _tile_loadd(7, ones, 64);
    for (long i = 0; i < n; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    return out[0];
#else
    (void)n;
    return -1.0f;
#endif
}
"""


def measure_peaks(threads: int) -> dict:
    """GFLOP/s of the f32 FMA and of vdpbf16ps on this machine, `threads` threads each running
    the loop (best of a few runs: the peak, not a typical speed)."""
    import itertools
    import time
    from concurrent.futures import ThreadPoolExecutor

    from eqfuse.backend.cbuild import COMMON_C, COMMON_CDEF, build, header_c
    from eqfuse.machine import bf16_peak_ratio, machine

    lib = build(header_c() + COMMON_C + PEAK_C,
                COMMON_CDEF + "\nint peak_lanes(void);\nfloat peak_loop(long n, int bf16);\nfloat peak_amx(long n);",
                "peak").lib
    n = 4_000_000  # (some 6 cycles a step: a few ms a run; many runs find the cores' quiet moments)
    out = {}
    lanes = lib.peak_lanes()
    loops = (("f32", lambda k: lib.peak_loop(k, 0), n, 12 * lanes * 2),
             ("bf16_vdpbf16ps", lambda k: lib.peak_loop(k, 1), n, 12 * lanes * 4),
             ("bf16_tdpbf16ps", lib.peak_amx, n // 8, 4 * 16 * 16 * 32 * 2))
    for name, loop, steps, per in loops:
        if loop(1) < 0:
            out[name] = float("nan")
            continue
        def timed(_, loop=loop, steps=steps):
            t0 = time.perf_counter()
            loop(steps)
            return t0, time.perf_counter()

        # Each run from the first thread's start to the last one's end, timed in the threads (a
        # thread that starts late lengthens its run, and the best runs are those where all ran
        # at once); 20 runs and at least half a second of them: a VM's host, taking a core for a
        # moment, once made every run of a shorter measurement one core's.
        best, began = 0.0, time.perf_counter()
        with ThreadPoolExecutor(threads) as ex:
            for run in itertools.count():
                if run >= 20 and time.perf_counter() - began > 0.5:
                    break
                spans = list(ex.map(timed, range(threads)))
                took = max(t1 for _, t1 in spans) - min(t0 for t0, _ in spans)
                best = max(best, threads * steps * per / took / 1e9)
        out[name] = best
    # (derived: two multiply-adds per lane per vdpbf16ps, at the machine's rate, eqfuse.machine.bf16_dot_ratio)
    out["bf16"] = bf16_peak_ratio(machine(), "avx512_bf16") * out["f32"]
    # (derived: tdpbf16ps's multiply-adds per cycle over the f32 FMA's, eqfuse.machine.bf16_peak_ratio)
    out["bf16_amx"] = bf16_peak_ratio(machine(), "amx_bf16") * out["f32"]
    return out


def onnx_gemm(path: Path, w, b) -> None:
    """y = relu(x @ w + b) as an ONNX model with w and b initializers."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    K, N = w.shape
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["z"]),
         helper.make_node("Relu", ["z"], ["y"])], "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", N])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def measure_precision(threads: int, precision: str, repeat: int, rounds: int) -> dict:
    import statistics
    import tempfile
    import time

    import numpy as np

    import eqfuse
    from eqfuse.machine import machine

    peaks = measure_peaks(threads)
    rows = []
    for M, N, K in PRECISION:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((M, K)).astype(np.float32)
        w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
        b = rng.standard_normal(N).astype(np.float32)
        ref = np.maximum(x.astype(np.float64) @ w.astype(np.float64) + b, 0)
        src = (f"graph g(x: f32[{M}, {K}], w: f32[{K}, {N}], b: f32[{N}]) -> f32[{M}, {N}] {{\n"
               f"  return relu(x @ w + b)\n}}")
        peers = {}
        for p in dict.fromkeys(("f32", precision)):
            mod = eqfuse.compile(src, params={"w": w, "b": b}, precision=p, threads=threads)
            paths = sorted({e["path"] for e in mod.report["precision"].values()})
            # (the peak of the path the GEMM runs: the fallback multiplies with f32 FMAs, and a
            # compute-bound GEMM on a CPU without a bf16 multiply computes in f32: plan_gemm.bf16_pays)
            peak = "bf16_amx" if "amx_bf16" in paths else "f32" if "fallback" in paths or paths == ["f32"] else p
            peers[f"eqfuse {p} ({', '.join(paths)})"] = (p, lambda m=mod: m(x), peak)
        try:
            import openvino as ov

            core = ov.Core()
            with tempfile.TemporaryDirectory() as d:
                onnx_gemm(Path(d) / "g.onnx", w, b)
                model = core.read_model(str(Path(d) / "g.onnx"))
                for hint in ("f32", None):
                    cfg = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
                    if hint:
                        cfg["INFERENCE_PRECISION_HINT"] = hint
                    compiled = core.compile_model(model, "CPU", cfg)
                    got = str(compiled.get_property("INFERENCE_PRECISION_HINT")).lower()
                    chose = "bf16" if "bf" in got else "f32" if "32" in got else got
                    req = compiled.create_infer_request()

                    def run(req=req):
                        req.infer({0: x})
                        return req.get_output_tensor(0).data

                    label = f"OpenVINO {'f32' if hint else 'default'} ({chose})"
                    prec = "bf16" if chose == "bf16" else "f32"
                    # (on a CPU with AMX-BF16 its bf16 runs on the tiles too: oneDNN's brgemm)
                    peers[label] = (prec, run, "bf16_amx" if prec == "bf16" and machine().amx_bf16 else prec)
        except ImportError:
            pass
        times: dict[str, list[float]] = {k: [] for k in peers}
        errs = {}
        for k, (_, fn, _) in peers.items():
            y = np.asarray(fn(), dtype=np.float64)
            errs[k] = float(np.max(np.abs(y - ref)) / np.max(np.abs(ref)))
        for _ in range(rounds):
            for k, (_, fn, _) in peers.items():
                ts = []
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t0)
                times[k].append(statistics.median(ts))
        for k, (p, _, peak) in peers.items():
            t = statistics.median(times[k])
            gf = 2 * M * N * K / t / 1e9
            rows.append({"shape": f"{M}x{N}x{K}", "threads": threads, "who": k, "ms": t * 1e3, "gflops": gf,
                         "precision": p, "peak_of": peak, "error": errs[k],
                         "spread": 100 * (max(times[k]) - min(times[k])) / t})
    # The peaks again after the rows, the best of the two kept (a peak is the best the cores do)
    after = measure_peaks(threads)
    peaks = {k: max(v, after[k]) if v == v else after[k] for k, v in peaks.items()}
    for r in rows:
        r["peak"] = r["gflops"] / peaks[r["peak_of"]]
    return {"peaks": peaks, "rows": rows}


def print_precision(results: list[dict], repeat: int, rounds: int) -> None:
    print(f"y = relu(x @ W + b), W and b bound; median of {rounds} rounds of {repeat} calls, interleaved")
    for res in results:
        pk = res["peaks"]
        t = res["rows"][0]["threads"]
        amx = any(r["peak_of"] == "bf16_amx" for r in res["rows"])
        print(f"\nthreads={t}: peaks measured here, f32 FMA {pk['f32']:.1f} GFLOP/s, bf16 {pk['bf16'] / pk['f32']:g}x = {pk['bf16']:.1f} "
              f"(a vdpbf16ps loop measured {pk['bf16_vdpbf16ps']:.1f})"
              + (f", AMX-BF16 {pk['bf16_amx'] / pk['f32']:.0f}x = {pk['bf16_amx']:.1f} "
                 f"(a tdpbf16ps loop measured {pk.get('bf16_tdpbf16ps', float('nan')):.1f})" if amx else ""))
        head = f"{'shape':>14} {'':<44} {'ms':>8} {'spread':>7} {'GFLOP/s':>8} {'of peak':>8} {'error':>9}"
        print(head)
        print("-" * len(head))
        for r in res["rows"]:
            print(f"{r['shape']:>14} {r['who']:<44} {r['ms']:8.3f} {r['spread']:6.0f}% {r['gflops']:8.1f} "
                  f"{100 * r['peak']:7.0f}% {r['error']:9.1e}")
    print("\nof peak: of the f32 FMA peak for an f32 row, of the bf16 peak (bf16_dot_ratio x) for a bf16 row (the f32 one for the fallback path, "
          "which multiplies with f32 FMAs), of the AMX-BF16 "
          "peak (tdpbf16ps: 512 multiply-adds per cycle, 16x the f32 FMA's two 16-lane FMAs; "
          "eqfuse.machine.bf16_peak_ratio) for a row on AMX tiles; error: max|y - y_ref| / max|y_ref|, y_ref the float64 result of the f32 inputs")


def pin(name: str) -> None:
    from dataclasses import replace

    from eqfuse.machine import MODELS, host_machine, pin

    if name == "avx2":
        pin("avx2")
    elif name == "portable":
        pin(replace(MODELS["avx2"], simd_floats=4), clamp=False)
    elif name != "host":
        sys.exit(f"--machine: host, avx2 or portable, not {name!r}")
    else:
        pin(host_machine())


def measure(mname: str, threads: int, repeat: int, layer: bool) -> list[dict]:
    """Runs inside the per-(machine, thread count) subprocess."""
    import time

    import numpy as np

    try:  # threadpoolctl, when present, is the authoritative way to pin BLAS threads
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads)
    except ImportError:
        pass  # OPENBLAS_NUM_THREADS was set by the parent before numpy was imported
    pin(mname)
    import eqfuse
    from eqfuse.backend.cbuild import COMMON_C, COMMON_CDEF, build, header_c
    from eqfuse.backend.kinds.contraction.emit_gemm import emit_gemm
    from eqfuse.backend.kinds.contraction.plan_gemm import (
        blocking,
        gemm_tiles,
        parallel,
    )
    from eqfuse.cli.bench import median_time
    from eqfuse.machine import machine

    def median(fn) -> float:
        # OpenBLAS's and OpenMP's worker threads spin for a while after a call; on two cores the
        # next library's threads would run against them. Let them fall asleep first.
        time.sleep(0.3)
        return median_time(fn, repeat, warmup=3)

    rows = []
    rng = np.random.default_rng(0)
    for M, N, K in SHAPES:
        a = rng.standard_normal((M, K), dtype=np.float32)
        b = rng.standard_normal((K, N), dtype=np.float32)
        bias = rng.standard_normal(N, dtype=np.float32)
        c = np.empty((M, N), np.float32)
        t = gemm_tiles(M, N, K, machine())
        # "bench_gemm" packs B in each call; "bench_pre" reads the panels bench_pre_prepack made
        # once, as a compiled graph does for a weight bound by params=
        srcs = [emit_gemm(name, M=M, N=N, K=K, lda=K, ldb=N, ldc=N, epilogue="eqf_relu(acc + bias[j])",
                          extras=[("float", "bias")], blocking=blocking(t), parallel=parallel(M, N, K, 1), prepacked_b=pre)
                for name, pre in (("bench_gemm", False), ("bench_pre", True))]
        built = build(header_c() + COMMON_C + "\n".join(s for s, _ in srcs),
                      COMMON_CDEF + "\n" + "\n".join(c for _, c in srcs), "bench_gemm")
        ffi, lib = built.ffi, built.lib
        lib.eqf_set_threads(threads)
        panels = np.empty(lib.bench_pre_prepack_floats(), np.float32)
        pa, pb, pc, pbias, pp = (ffi.cast("float*", ffi.from_buffer(x)) for x in (a, b, c, bias, panels))
        lib.bench_pre_prepack(pb, pp)
        want = np.maximum(a.astype(np.float64) @ b + bias, 0)
        for fn, arg in ((lib.bench_gemm, pb), (lib.bench_pre, pp)):
            c[:] = np.nan
            fn(pa, arg, pc, pbias)
            err = float(np.abs(c - want).max() / np.abs(want).max())
            assert err < 1e-4, f"{M}x{N}x{K}: relative error {err}"
        flops = 2.0 * M * N * K
        rows.append({"what": f"{M}x{N}x{K}", "machine": mname, "threads": threads,
                     "tile": f"{t['mr']}x{t['nr']} kc={t['kc']}",
                     "np": flops / median(lambda a=a, b=b: a @ b) / 1e9,
                     "eqfuse": flops / median(lambda f=lib.bench_gemm, args=(pa, pb, pc, pbias): f(*args)) / 1e9,
                     "prepacked": flops / median(lambda f=lib.bench_pre, args=(pa, pp, pc, pbias): f(*args)) / 1e9})
    if layer:
        from eqfuse.frontend.load import load

        w = {n: (rng.standard_normal(t.shape) * (0.05 if len(t.shape) == 2 else 1)).astype(np.float32)
             for n, t in load(MODEL)[0].params if n != "x"}
        x = rng.standard_normal((1, 128, 256)).astype(np.float32)
        ref = eqfuse.reference(MODEL)(x, *w.values())
        mod = eqfuse.compile(MODEL, params=w, threads=threads)
        err = float(np.abs(mod(x) - ref).max())
        assert err < 1e-3, f"transformer layer: max abs error {err}"
        rows.append({"what": "transformer layer", "machine": mname, "threads": threads,
                     "ms": median(lambda: mod(x)) * 1e3})
    return rows


def measure_small(repeat: int, rounds: int) -> list[dict]:
    """The `--small` table, in one process on one thread (run by main in a child, after
    OPENBLAS_NUM_THREADS=1 and OMP_NUM_THREADS=1)."""
    import statistics

    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    pin("host")
    import eqfuse
    from eqfuse.backend.cbuild import COMMON_C, COMMON_CDEF, build, header_c
    from eqfuse.backend.kinds.contraction.emit_gemm import emit_gemm, emit_gemm_skinny
    from eqfuse.backend.kinds.contraction.plan_gemm import (
        blocking,
        gemm_tiles,
        parallel,
    )
    from eqfuse.cli.bench import median_time
    from eqfuse.machine import machine

    def median(fn) -> float:
        return median_time(fn, repeat, warmup=3)

    rng = np.random.default_rng(0)
    rows = []
    for M, N, K in SMALL:
        x = rng.standard_normal((M, K), dtype=np.float32)
        w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
        b = rng.standard_normal(N, dtype=np.float32)
        want = x.astype(np.float64) @ w + b
        src = f"graph f(x: f32[{M}, {K}], w: f32[{K}, {N}], b: f32[{N}]) -> f32[{M}, {N}] {{ return x @ w + b }}"
        mod = eqfuse.compile(src, params={"w": w, "b": b}, threads=1)
        tiles = mod.kernels[0].tiles
        code, cdef = emit_gemm("blk", M=M, N=N, K=K, lda=K, ldb=N, ldc=N, epilogue="acc + bias[j]",
                               extras=[("float", "bias")], blocking=blocking(gemm_tiles(M, N, K, machine())),
                               parallel=parallel(M, N, K, 1), prepacked_b=True)
        # the plan's skinny kernel alone, without the Module call around it
        assert "groups" in tiles, f"{M}x{N}x{K} is not on the skinny path: {tiles}"
        scode, scdef = emit_gemm_skinny("sk", M=M, N=N, K=K, lda=K, ldb=N, ldc=N, mr=tiles["mr"], nr=tiles["nr"],
                                        pf=tiles["pf"], epilogue="acc + bias[j]", extras=[("float", "bias")],
                                        parallel=parallel(M, N, K, 1))
        built = build(header_c() + COMMON_C + code + scode, COMMON_CDEF + "\n" + cdef + "\n" + scdef,
                      "bench_small")
        ffi, lib = built.ffi, built.lib
        lib.eqf_set_threads(1)
        panels = np.empty(lib.blk_prepack_floats(), np.float32)
        spanels = np.empty(lib.sk_prepack_floats(), np.float32)
        c = np.empty((M, N), np.float32)
        px, pw, pc, pb, pp, ps = (ffi.cast("float*", ffi.from_buffer(a)) for a in (x, w, c, b, panels, spanels))
        lib.blk_prepack(pw, pp)
        lib.sk_prepack(pw, ps)
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])], "mm",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, N])],
            [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
        sess = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                                    .SerializeToString(), so, providers=["CPUExecutionProvider"])
        assert onnx is not None
        peers = {"eqfuse": lambda mod=mod, x=x: mod(x), "kernel": lambda f=lib.sk, a=(px, ps, pc, pb): f(*a),
                 "blocked": lambda f=lib.blk, a=(px, pp, pc, pb): f(*a),
                 "onnxruntime": lambda s=sess, x=x: s.run(None, {"x": x}), "numpy": lambda x=x, w=w, b=b: x @ w + b}
        lib.sk(px, ps, pc, pb)
        cs = c.copy()
        lib.blk(px, pp, pc, pb)
        for name, got in (("eqfuse", mod(x)), ("kernel", cs), ("blocked", c),
                          ("onnxruntime", sess.run(None, {"x": x})[0])):
            err = float(np.abs(got - want).max() / np.abs(want).max())
            assert err < 1e-4, f"{name} {M}x{N}x{K}: relative error {err}"
        times = {k: [] for k in peers}
        for _ in range(rounds):  # interleaved: a disturbance hits every peer alike
            for k, fn in peers.items():
                times[k].append(median(fn))
        row = {"what": f"{M}x{N}x{K}", "tile": f"{tiles['mr']}x{tiles['nr']}"}
        for k, ts in times.items():
            med = statistics.median(ts)
            row[k], row[k + "%"] = med * 1e6, (max(ts) - min(ts)) / med * 100
        rows.append(row)
    return rows


def measure_tiles(repeat: int, rounds: int) -> None:
    """The `--tiles` table (run in a child on one thread); prints it."""
    import statistics
    import time

    import numpy as np

    pin("host")
    from eqfuse.backend.cbuild import COMMON_C, COMMON_CDEF, build, header_c
    from eqfuse.backend.kinds.contraction.emit_gemm import emit_gemm, emit_gemm_skinny
    from eqfuse.backend.kinds.contraction.plan_gemm import gemm_blocking, gemm_tiles
    from eqfuse.machine import machine, skinny_tile

    m = machine()
    rng = np.random.default_rng(0)
    wide = [(6, 64), (7, 64), (8, 48), (9, 48), (12, 32)] if m.simd_floats >= 16 else \
        [(6, 16), (4, 24), (3, 24), (5, 16)] if m.simd_floats == 8 else [(6, 8), (4, 8), (3, 12)]
    wide = [t for t in wide if t[1] % m.simd_floats == 0]
    cases = []  # (M, N, K, label, emit)
    M = N = K = 1024
    t = gemm_tiles(M, N, K, m)
    for mr, nr in wide:
        mc, nc, kc, _, _ = gemm_blocking(m, mr, nr, t["kc"])
        cases.append((M, N, K, f"{mr}x{nr}" + (" (derived)" if (mr, nr) == (t["mr"], t["nr"]) else ""),
                      lambda nm, mr=mr, nr=nr, mc=mc, nc=nc, kc=kc, M=M, N=N, K=K: emit_gemm(
                          nm, M=M, N=N, K=K, lda=K, ldb=N, ldc=N, blocking=(mc, nc, kc, mr, nr), parallel=False,
                          prepacked_b=True)))
    for M, N, K in ((8, 3072, 768), (16, 768, 3072)):
        derived = skinny_tile(m.simd_floats, M)
        w = m.simd_floats
        for mr, nr in dict.fromkeys([derived, (M, w), (min(M, 8), 2 * w), (min(M, 6), 4 * w), (min(M, 4), 3 * w)]):
            cases.append((M, N, K, f"skinny {mr}x{nr}" + (" (derived)" if (mr, nr) == derived else ""),
                          lambda nm, M=M, N=N, K=K, mr=mr, nr=nr: emit_gemm_skinny(
                              nm, M=M, N=N, K=K, lda=K, ldb=N, ldc=N, mr=mr, nr=nr, parallel=False)))
    parts = [emit(f"t{i}") for i, (*_, emit) in enumerate(cases)]
    built = build(header_c() + COMMON_C + "\n".join(p for p, _ in parts),
                  COMMON_CDEF + "\n" + "\n".join(c for _, c in parts), "bench_tiles")
    ffi, lib = built.ffi, built.lib
    lib.eqf_set_threads(1)
    ptr = lambda a: ffi.cast("float*", ffi.from_buffer(a))
    runs, keep = [], []
    for i, (M, N, K, label, _) in enumerate(cases):
        a, b = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
        c, panels = np.empty((M, N), np.float32), np.empty(getattr(lib, f"t{i}_prepack_floats")(), np.float32)
        getattr(lib, f"t{i}_prepack")(ptr(b), ptr(panels))
        keep.append((a, b, c, panels))
        args = [ptr(a), ptr(panels), ptr(c)]
        fn = getattr(lib, f"t{i}")
        fn(*args)
        err = float(np.abs(c - a @ b).max())
        assert err < 1e-3 * np.sqrt(K), (label, err)
        runs.append((f"{M}x{N}x{K}", label, lambda fn=fn, args=args: fn(*args), 2.0 * M * N * K))
    times: dict[int, list[float]] = {i: [] for i in range(len(runs))}
    for _ in range(rounds):
        for i, (*_, fn, _) in enumerate(runs):
            for _ in range(2):
                fn()
            ts = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            times[i].append(statistics.median(ts))
    print(f"GFLOP/s, B prepacked, 1 thread, median of {rounds} interleaved rounds of {repeat} calls ({m})")
    for i, (shape, label, _, flops) in enumerate(runs):
        ts = times[i]
        med = statistics.median(ts)
        print(f"{shape:>15} {label:>22} {flops / med / 1e9:8.1f}  (spread {(max(ts) - min(ts)) / med * 100:3.0f}%)")


def ort_reduce_range(choice: str = "auto") -> bool:
    """Whether to quantize weights with reduce_range=True (7 bits): "on", "off", or "auto": on
    where the CPU has no VNNI (cpuinfo avx512_vnni, avx_vnni, amx_int8), where onnxruntime's u8 x s8
    GEMM (vpmaddubsw) saturates with 8-bit weights and onnxruntime advises 7-bit ones."""
    if choice != "auto":
        return choice == "on"
    from eqfuse.machine import cpu_flags

    return not {"avx512_vnni", "avx_vnni", "amx_int8"} & cpu_flags()


def _quantized_linear(d: Path, M: int, N: int, K: int, reduce_range: bool) -> Path:
    """y = x @ W + b (W, b initializers) as quantize_dynamic writes it."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])],
                          "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, N])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    f32, q = d / f"linear{M}x{N}x{K}.onnx", d / f"linear{M}x{N}x{K}-q.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(f32))
    quantize_dynamic(str(f32), str(q), weight_type=QuantType.QInt8, reduce_range=reduce_range)
    return q


def measure_int8(thread_counts: list[int], repeat: int, rounds: int, tiles: bool, reduce_range: bool) -> None:
    """The `--int8` table (or with `tiles` the tile candidates), in this process; prints it."""
    import statistics
    import tempfile
    import time

    import numpy as np
    import onnxruntime as ort

    import eqfuse
    from eqfuse.backend.kinds.contraction import qgemm
    from eqfuse.machine import machine

    m = machine()
    derived, derived_kc = qgemm.int8_tile, qgemm.int8_kc
    runs = []  # (shape, label, run, ops)
    with tempfile.TemporaryDirectory() as tmp:
        for M, N, K in INT8:
            # (the weights are bound: the path they take)
            path = qgemm.int8_path(m, weights_bound=True, amx=qgemm.amx_fits(False, M, M * N * K))
            cands = {"amx_int8": [(32, 32)], "avx512_vnni": [(8, 32), (6, 32), (16, 16), (6, 64), (4, 64)],
                     "avx_vnni": [(4, 16), (6, 16), (8, 8)],
                     "avx2_maddubs": [(4, 16), (5, 16), (6, 16), (3, 24), (2, 32), (6, 8), (8, 8)]}.get(path, [(4, 16), (6, 16), (6, 8)])
            q = _quantized_linear(Path(tmp), M, N, K, reduce_range)
            x = np.random.default_rng(1).standard_normal((M, K)).astype(np.float32)
            tile0 = derived(path, N)
            kc0 = derived_kc(K, tile0[1], m, path) if path == "amx_int8" else min(derived_kc(K, tile0[1], m, path), K)
            gb = qgemm.group_bytes(path)
            whole = 64 if path == "amx_int8" else 4  # (AMX: K blocks of whole tiles of 16 K-groups)
            blocks = [-(-K // whole) * whole] + [whole * (m.l1 // d // (gb * tile0[1]) // (whole // 4)) for d in (4, 8)]
            variants = [(t, None) for t in cands] + [(tile0, kc) for kc in blocks if kc != kc0] if tiles else \
                [(tile0, None)]
            for tile, kc in variants:
                qgemm.int8_tile = lambda p, n, tile=tile: tile
                qgemm.int8_kc = derived_kc if kc is None else (lambda k, nr, mm, p='', kc=kc: kc)
                mod = eqfuse.compile(str(q))
                fn = mod.default
                qgemm.int8_tile, qgemm.int8_kc = derived, derived_kc
                paths = sorted({v["path"] for v in mod.report["precision"].values() if v["precision"] == "int8"})
                label = f"eqfuse {'+'.join(paths)} {tile[0]}x{tile[1]} kc={kc or kc0}" + \
                    (" (derived)" if tile == tile0 and kc is None else "")
                runs.append((f"{M}x{N}x{K}", label, fn, x, 2.0 * M * N * K))
            if not tiles:
                runs.append((f"{M}x{N}x{K}", "onnxruntime", str(q), x, 2.0 * M * N * K))
        for th in thread_counts:
            calls = []
            for shape, label, fn, x, ops in runs:
                if isinstance(fn, str):
                    so = ort.SessionOptions()
                    so.intra_op_num_threads, so.inter_op_num_threads = th, 1
                    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
                    sess = ort.InferenceSession(fn, so, providers=["CPUExecutionProvider"])
                    calls.append((shape, label, lambda sess=sess, x=x: sess.run(None, {"x": x}), ops))
                else:
                    fn.threads = th
                    calls.append((shape, label, lambda fn=fn, x=x: fn(x), ops))
            times: dict[int, list[float]] = {i: [] for i in range(len(calls))}
            for _ in range(rounds):
                for i, (*_, call, _) in enumerate(calls):
                    call()
                    ts = []
                    for _ in range(repeat):
                        t0 = time.perf_counter()
                        call()
                        ts.append(time.perf_counter() - t0)
                    times[i].append(statistics.median(ts))
            print(f"quantize_dynamic linear y = x @ W + b, weights {'7-bit (reduce_range=True)' if reduce_range else '8-bit'}, "
                  f"{th} thread(s), median of {rounds} interleaved rounds of {repeat} calls ({m})")
            for i, (shape, label, _, ops) in enumerate(calls):
                ts = times[i]
                med = statistics.median(ts)
                print(f"{shape:>15} {label:>41} {med * 1e3:8.3f} ms  (spread {(max(ts) - min(ts)) / med * 100:3.0f}%)"
                      f"  {ops / med / 1e9:7.1f} GOP/s")


def measure_pairs(thread_counts: list[int], repeat: int, rounds: int) -> None:
    """The `--int8 --pairs` table, in this process; prints it."""
    import statistics
    import time

    import numpy as np

    import eqfuse
    from eqfuse.backend.kinds.contraction import qgemm
    from eqfuse.machine import machine

    m = machine()
    if qgemm.int8_path(m, weights_bound=True) != "avx2_maddubs":
        sys.exit(f"--pairs: this machine's integer GEMM takes {qgemm.int8_path(m, True)}, not avx2_maddubs ({m})")
    M, K, N = 128, 768, 768
    src = f"graph g(a: u8[{M}, {K}], w: i8[{K}, {N}], az: u8, wz: i8) {{ return matmul_integer(a, w, az, wz) }}"
    rng = np.random.default_rng(0)
    x = {"a": rng.integers(0, 256, (M, K)).astype(np.uint8), "az": np.asarray(3, np.uint8), "wz": np.asarray(0, np.int8)}
    base, pairs = rng.integers(-40, 41, (K, N)).astype(np.int8), K // 2 * N
    runs, limit = [], qgemm.CORRECTED_PAIRS_MAX
    try:
        for share in (0, 1 / 1024, 1 / 256, 1 / 128, 1 / 64):
            w = base.copy()
            k2, j = np.divmod(rng.choice(pairs, int(share * pairs), replace=False), N)
            w[2 * k2, j], w[2 * k2 + 1, j] = 120, 100  # (one sign, 220 > 128: each pair corrected)
            for cap in (1.0, 0.0) if share == 1 / 64 else (1.0,):
                qgemm.CORRECTED_PAIRS_MAX = cap
                fn = eqfuse.compile(src, params={"w": w}).default
                (p,) = [p for p in fn.last.plans if p.kind == "contraction"]
                assert np.array_equal(fn(**x).astype(np.int64), (x["a"].astype(np.int64) - 3) @ w.astype(np.int64))
                runs.append((f"{share * 100:5.2f}% of pairs", p.precision_path, p.detail.corrections, fn))
    finally:
        qgemm.CORRECTED_PAIRS_MAX = limit
    for th in thread_counts:
        times: dict[int, list[float]] = {i: [] for i in range(len(runs))}
        for _ in range(rounds):
            for i, (*_, fn) in enumerate(runs):
                fn.threads = th
                fn(**x)
                ts = []
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    fn(**x)
                    ts.append(time.perf_counter() - t0)
                times[i].append(statistics.median(ts))
        print(f"integer GEMM {M}x{N}x{K}, weight pairs past int16, {th} thread(s), median of {rounds} interleaved rounds "
              f"of {repeat} calls ({m}); CORRECTED_PAIRS_MAX = {limit:.4f} ({limit * 100:.2f}%)")
        for i, (what, path, n, _) in enumerate(runs):
            med = statistics.median(times[i])
            print(f"{what:>18} {path:>13} {n:6d} corrections {med * 1e3:8.3f} ms  (spread "
                  f"{(max(times[i]) - min(times[i])) / med * 100:3.0f}%)")


def measure_peers(threads: int, repeat: int, rounds: int, only: str = "") -> list[dict]:
    """The `--peers` table at one thread count, in a child (OMP/MKL/OpenBLAS threads set)."""
    import statistics
    import time

    import numpy as np
    import onnxruntime as ort
    import torch
    from onnx import TensorProto, helper, numpy_helper

    pin("host")
    import eqfuse
    from eqfuse.cli.bench import blas_threads, median_time
    from timing import settle

    torch.set_num_threads(threads)
    blas_threads(threads)
    rng = np.random.default_rng(0)
    rows = []
    for M, N, K in PEERS:
        if only and f"{M}x{N}x{K}" not in only.split(","):
            continue
        act = "gelu" if N > K else "relu"  # the FFN's up projection has the GELU
        x = rng.standard_normal((M, K), dtype=np.float32)
        w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
        b = rng.standard_normal(N, dtype=np.float32)
        h = x.astype(np.float64) @ w + b
        from scipy.special import erf
        want = 0.5 * h * (1 + erf(h / np.sqrt(2))) if act == "gelu" else np.maximum(h, 0)
        src = (f"graph f(x: f32[{M}, {K}], w: f32[{K}, {N}], b: f32[{N}]) -> f32[{M}, {N}] "
               f"{{ return {act}(x @ w + b) }}")
        mod = eqfuse.compile(src, params={"w": w, "b": b}, threads=threads)
        tx, tw, tb = torch.from_numpy(x), torch.from_numpy(np.ascontiguousarray(w.T)), torch.from_numpy(b)
        mkl_w = torch.ops.mkl._mkl_reorder_linear_weight(tw, M)
        dnn_w = torch.ops.mkldnn._reorder_linear_weight(tw, M)
        tact = torch.nn.functional.gelu if act == "gelu" else torch.relu_

        def mkl(x=tx, pw=mkl_w, w=tw, b=tb, M=M, f=tact):
            return f(torch.ops.mkl._mkl_linear(x, pw, w, b, M))

        def dnn(x=tx, pw=dnn_w, b=tb, a=act):
            return torch.ops.mkldnn._linear_pointwise(x, pw, b, a, [], "none" if a == "gelu" else "")

        nodes = [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["u"]),
                 helper.make_node("Gelu" if act == "gelu" else "Relu", ["u"], ["y"])]
        graph = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, N])],
                                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
                                    .SerializeToString(), so, providers=["CPUExecutionProvider"])
        peers = {"eqfuse": lambda mod=mod, x=x: mod(x), "mkl": mkl, "onednn": dnn,
                 "onnxruntime": lambda s=sess, x=x: s.run(None, {"x": x}), "numpy": lambda x=x, w=w: x @ w}
        with torch.no_grad():
            for k, fn in peers.items():
                if k != "numpy":
                    got = np.asarray(fn()[0] if k == "onnxruntime" else fn())
                    err = float(np.abs(got - want).max() / np.abs(want).max())
                    assert err < 1e-4, f"{k} {M}x{N}x{K}: relative error {err}"
            times = {k: [] for k in peers}
            for _ in range(rounds):
                for k, fn in peers.items():
                    time.sleep(0.05)  # let the last library's worker threads stop spinning
                    settle()  # (and wait for those that spin longer: OpenBLAS's, MKL's)
                    times[k].append(median_time(fn, repeat, warmup=2))
        row = {"what": f"{M}x{N}x{K}", "act": act, "threads": threads, "gflop": 2.0 * M * N * K / 1e9}
        for k, ts in times.items():
            med = statistics.median(ts)
            row[k], row[k + "%"] = med * 1e3, (max(ts) - min(ts)) / med * 100
        rows.append(row)
    return rows


def print_peers(rows: list[dict], repeat: int, rounds: int) -> None:
    names = ("eqfuse", "mkl", "onednn", "onnxruntime", "numpy")
    print(f"ms (spread % over {rounds} rounds of {repeat} calls), y = act(x @ W + b), W bound; numpy: bare x @ W")
    head = (f"{'M x N x K':>15} {'act':>4} {'thr':>3} " + " ".join(f"{n:>14}" for n in names)
            + f" {'GFLOP/s':>7} {'mkl/eqf':>7} {'ort/eqf':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['what']:>15} {r['act']:>4} {r['threads']:>3} "
              + " ".join(f"{r[n]:8.3f} ({r[n + '%']:3.0f}%)" for n in names)
              + f" {r['gflop'] / r['eqfuse'] * 1e3:7.1f} {r['mkl'] / r['eqfuse']:7.2f} "
                f"{r['onnxruntime'] / r['eqfuse']:7.2f}")


def print_small(rows: list[dict], repeat: int, rounds: int) -> None:
    print(f"us (spread % over {rounds} rounds of {repeat} calls; GB/s of W), 1 thread, y = x @ W + b, W bound")
    head = (f"{'M x N x K':>15} {'tile':>6} {'eqfuse':>14} {'GB/s':>5} {'kernel':>13} {'GB/s':>5} {'blocked':>13} "
            f"{'onnxruntime':>14} {'GB/s':>5} {'numpy':>14} {'ORT/eqf':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        _, N, K = map(int, r["what"].split("x"))
        gb = K * N * 4 / 1e3  # bytes / us / 1e3 = GB/s
        cell = lambda k, r=r: f"{r[k]:8.1f} ({r[k + '%']:3.0f}%)"
        print(f"{r['what']:>15} {r['tile']:>6} {cell('eqfuse'):>14} {gb / r['eqfuse']:5.1f} {cell('kernel'):>13} "
              f"{gb / r['kernel']:5.1f} {cell('blocked'):>13} "
              f"{cell('onnxruntime'):>14} {gb / r['onnxruntime']:5.1f} {cell('numpy'):>14} "
              f"{r['onnxruntime'] / r['eqfuse']:7.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", default="1")
    ap.add_argument("--machine", default="host,avx2,portable", help="comma-separated: host, avx2, portable")
    ap.add_argument("--no-layer", action="store_true", help="skip the transformer layer")
    ap.add_argument("--small", action="store_true", help="the few-rows table (see above) instead")
    ap.add_argument("--tiles", action="store_true", help="the derived tiles against their neighbours (see above)")
    ap.add_argument("--peers", action="store_true", help="MKL, oneDNN, onnxruntime, numpy (see above) instead")
    ap.add_argument("--rounds", type=int, default=5, help="--small, --tiles, --peers: interleaved rounds")
    ap.add_argument("--only", default="", help="--peers: these shapes only, MxNxK comma-separated (e.g. 256x3072x768)")
    ap.add_argument("--precision", choices=["f32", "bf16"],
                    help="eqfuse f32 and this precision against OpenVINO f32 and default (see above) instead")
    ap.add_argument("--int8", action="store_true",
                    help="a quantize_dynamic linear layer, eqfuse against onnxruntime (see above) instead")
    ap.add_argument("--reduce-range", choices=["auto", "on", "off"], default="auto",
                    help="--int8: quantize the weights to 7 bits (auto: on a CPU without VNNI; see above)")
    ap.add_argument("--pairs", action="store_true", help="--int8: what corrected weight pairs cost (see above)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.int8 and args.pairs:
        measure_pairs([int(t) for t in args.threads.split(",")], args.repeat, args.rounds)
        return
    if args.int8:
        measure_int8([int(t) for t in args.threads.split(",")], args.repeat, args.rounds, args.tiles,
                     ort_reduce_range(args.reduce_range))
        return
    if args.precision:
        if args.child:
            print(json.dumps(measure_precision(int(args.child), args.precision, args.repeat, args.rounds)))
            return
        results = []
        for t in args.threads.split(","):
            env = {**os.environ, "OPENBLAS_NUM_THREADS": t, "OMP_NUM_THREADS": t}
            cmd = [sys.executable, __file__, "--precision", args.precision, "--child", t, "--repeat",
                   str(args.repeat), "--rounds", str(args.rounds)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if out.returncode:
                sys.exit(out.stderr)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print_precision(results, args.repeat, args.rounds)
        return
    if args.tiles:
        if args.child:
            measure_tiles(args.repeat, args.rounds)
            return
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, __file__, "--tiles", "--child", "tiles", "--repeat", str(args.repeat),
               "--rounds", str(args.rounds)]
        sys.exit(subprocess.run(cmd, env=env, check=False).returncode)
    if args.peers:
        if args.child:
            print(json.dumps(measure_peers(int(args.child), args.repeat, args.rounds, args.only)))
            return
        rows = []
        for t in args.threads.split(","):
            env = {**os.environ, "OPENBLAS_NUM_THREADS": t, "OMP_NUM_THREADS": t, "MKL_NUM_THREADS": t}
            cmd = [sys.executable, __file__, "--peers", "--child", t, "--repeat", str(args.repeat),
                   "--rounds", str(args.rounds), "--only", args.only]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if out.returncode:
                sys.exit(out.stderr)
            rows += json.loads(out.stdout.strip().splitlines()[-1])
        print_peers(rows, args.repeat, args.rounds)
        return
    if args.small:
        if args.child:
            print(json.dumps(measure_small(args.repeat, args.rounds)))
            return
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, __file__, "--small", "--child", "small", "--repeat", str(args.repeat),
               "--rounds", str(args.rounds)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if out.returncode:
            sys.exit(out.stderr)
        print_small(json.loads(out.stdout.strip().splitlines()[-1]), args.repeat, args.rounds)
        return
    if args.child:
        mname, t = args.child.split(":")
        print(json.dumps(measure(mname, int(t), args.repeat, not args.no_layer)))
        return
    rows = []
    for mname in args.machine.split(","):
        for t in (int(x) for x in args.threads.split(",")):
            env = {**os.environ, "OPENBLAS_NUM_THREADS": str(t), "OMP_NUM_THREADS": str(t)}
            cmd = [sys.executable, __file__, "--child", f"{mname}:{t}", "--repeat", str(args.repeat)]
            out = subprocess.run(cmd + (["--no-layer"] if args.no_layer else []), env=env, capture_output=True,
                                 text=True, check=False)
            if out.returncode:
                sys.exit(out.stderr)
            rows += json.loads(out.stdout.strip().splitlines()[-1])
    print(f"GFLOP/s (ms for the layer), median of {args.repeat} runs; eqfuse = one kernel, GEMM + bias + ReLU")
    head = (f"{'shape':>18} {'machine':>9} {'thr':>3} {'tile':>16} {'np a@b':>8} {'eqfuse':>8} {'eqf/np':>7} "
            f"{'prepacked B':>12}")
    print(head)
    print("-" * len(head))
    for r in rows:
        if "ms" in r:
            print(f"{r['what']:>18} {r['machine']:>9} {r['threads']:>3} {'':>16} {'':>8} {r['ms']:7.2f}ms")
        else:
            print(f"{r['what']:>18} {r['machine']:>9} {r['threads']:>3} {r['tile']:>16} {r['np']:8.1f} "
                  f"{r['eqfuse']:8.1f} {r['eqfuse'] / r['np']:7.2f} {r['prepacked']:12.1f}")


if __name__ == "__main__":
    main()
