"""GEMM with a fused bias+ReLU epilogue against numpy, at 1 and 2 threads.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_gemm.py [--repeat N] [--threads 1,2]

(Those two variables, when set, slow numpy's OpenBLAS; unset them for this command only.)

Each thread count runs in its own subprocess: OpenBLAS reads OPENBLAS_NUM_THREADS once, at
import, so without threadpoolctl the only reliable way to pin numpy's threads is to set the
variable before numpy is imported. eqfuse's threads are set through the module's
eqf_set_threads. Columns are GFLOP/s (2*M*N*K / median seconds); the ratio compares the fused
eqfuse kernel with numpy's bare `a @ b`, the target being >= 0.9.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SHAPES = [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 512)]  # (M, N, K)


def measure(threads: int, repeat: int) -> list[dict]:
    """Runs inside the per-thread-count subprocess."""
    import statistics
    import time

    import numpy as np

    try:  # threadpoolctl, when present, is the authoritative way to pin BLAS threads
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads)
    except ImportError:
        pass  # OPENBLAS_NUM_THREADS was set by the parent before numpy was imported
    from eqfuse.backend.cbuild import COMMON_C, COMMON_CDEF, build, template
    from eqfuse.backend.gemm import emit_gemm

    def median(fn) -> float:
        # OpenBLAS's and OpenMP's worker threads spin for a while after a call; on two cores the
        # next library's threads would run against them. Let them fall asleep first.
        time.sleep(0.3)
        for _ in range(2):
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
        src, cdef = emit_gemm("bench_gemm", M=M, N=N, K=K, lda=K, ldb=N, ldc=N,
                              epilogue="fmaxf(acc + bias[j], 0.0f)",
                              extra_params=", const float* restrict bias", extra_args_cdef=", const float* bias")
        built = build(template("common.h") + COMMON_C + src, COMMON_CDEF + "\n" + cdef, "bench_gemm")
        ffi, lib = built.ffi, built.lib
        lib.eqf_set_threads(threads)
        pa, pb, pc, pbias = (ffi.cast("float*", ffi.from_buffer(x)) for x in (a, b, c, bias))
        lib.bench_gemm(pa, pb, pc, pbias)
        want = np.maximum(a.astype(np.float64) @ b + bias, 0)
        err = float(np.abs(c - want).max() / np.abs(want).max())
        flops = 2.0 * M * N * K
        rows.append({
            "shape": f"{M}x{N}x{K}", "threads": threads, "rel_err": err,
            "np_matmul": flops / median(lambda: a @ b) / 1e9,
            "np_fused": flops / median(lambda: np.maximum(a @ b + bias, np.float32(0))) / 1e9,
            "eqfuse": flops / median(lambda: lib.bench_gemm(pa, pb, pc, pbias)) / 1e9,
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.repeat)))
        return
    rows = []
    for t in (int(x) for x in args.threads.split(",")):
        env = {**os.environ, "OPENBLAS_NUM_THREADS": str(t), "OMP_NUM_THREADS": str(t)}
        out = subprocess.run([sys.executable, __file__, "--child", str(t), "--repeat", str(args.repeat)],
                             env=env, capture_output=True, text=True)
        if out.returncode:
            sys.exit(out.stderr)
        rows += json.loads(out.stdout.strip().splitlines()[-1])
    print("GFLOP/s, median of %d runs; eqfuse = one kernel, GEMM + bias + ReLU fused" % args.repeat)
    head = f"{'M x N x K':>16} {'thr':>3} {'np a@b':>8} {'np fused':>9} {'eqfuse':>8} {'eqfuse/np a@b':>14}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['shape']:>16} {r['threads']:>3} {r['np_matmul']:8.1f} {r['np_fused']:9.1f} "
              f"{r['eqfuse']:8.1f} {r['eqfuse'] / r['np_matmul']:14.2f}")
    worst = max(r["rel_err"] for r in rows)
    print(f"max relative error vs float64: {worst:.1e}")


if __name__ == "__main__":
    main()
