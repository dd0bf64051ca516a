"""GEMM with a fused bias+ReLU epilogue against numpy, per vector width, and one transformer layer.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE taskset -c 1 \\
        python benchmarks/bench_gemm.py [--machine host,avx2,portable] [--threads 1] [--repeat N]

(Those two variables, when set, slow numpy's OpenBLAS; unset them for this command only.)

`--machine` pins the machine model the planner and the compiler see (eqfuse.backend.machine):
"host" is this CPU; "avx2" is MODELS["avx2"] (8-float vectors, built for x86-64-v3, so on an
AVX-512 host the AVX2 code paths really run); "portable" is 4-float vectors built for x86-64-v2
(SSE4.2, no AVX). numpy's matmul is the same OpenBLAS in every row (it picks its own kernels).

Each (machine, thread count) runs in its own subprocess: OpenBLAS reads OPENBLAS_NUM_THREADS
once, at import. Columns are GFLOP/s (2*M*N*K / median seconds; "prepacked B" reads B from panels packed once,
as for a weight bound by params=) and, for the transformer layer
(examples/transformer.g, B=1, eqfuse.compile with its weights bound), the median ms of a call.
Every result is checked against float64 numpy first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SHAPES = [(128, 768, 768), (32, 3072, 768), (1024, 1024, 1024)]  # (M, N, K)
MODEL = Path(__file__).resolve().parent.parent / "examples" / "transformer.g"


def pin(name: str) -> None:
    from dataclasses import replace

    from eqfuse.backend.machine import MODELS, host_machine, pin

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
    import statistics
    import time

    import numpy as np

    try:  # threadpoolctl, when present, is the authoritative way to pin BLAS threads
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads)
    except ImportError:
        pass  # OPENBLAS_NUM_THREADS was set by the parent before numpy was imported
    pin(mname)
    import eqfuse
    from eqfuse.backend.cbuild import COMMON_C, COMMON_CDEF, build, template
    from eqfuse.backend.gemm import emit_gemm
    from eqfuse.backend.lower_gemm import gemm_tiles, parallel
    from eqfuse.backend.machine import machine

    def median(fn) -> float:
        # OpenBLAS's and OpenMP's worker threads spin for a while after a call; on two cores the
        # next library's threads would run against them. Let them fall asleep first.
        time.sleep(0.3)
        for _ in range(3):
            fn()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

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
        srcs = [emit_gemm(name, M=M, N=N, K=K, lda=K, ldb=N, ldc=N, epilogue="fmaxf(acc + bias[j], 0.0f)",
                          extras=[("float", "bias")], parallel=parallel(M, N, K, 1), prepacked_b=pre)
                for name, pre in (("bench_gemm", False), ("bench_pre", True))]
        built = build(template("common.h") + COMMON_C + "\n".join(s for s, _ in srcs),
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
                     "np": flops / median(lambda: a @ b) / 1e9,
                     "eqfuse": flops / median(lambda: lib.bench_gemm(pa, pb, pc, pbias)) / 1e9,
                     "prepacked": flops / median(lambda: lib.bench_pre(pa, pp, pc, pbias)) / 1e9})
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", default="1")
    ap.add_argument("--machine", default="host,avx2,portable", help="comma-separated: host, avx2, portable")
    ap.add_argument("--no-layer", action="store_true", help="skip the transformer layer")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
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
                                 text=True)
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
