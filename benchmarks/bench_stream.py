"""How close relu(a*b+c) on 16M floats is to this machine's memory bandwidth (issue 4's ceiling).

    python benchmarks/bench_stream.py [--repeat N] [--threads T ...]

Times, interleaved in one process on the same arrays (numpy's usual 64-byte-misaligned ones):
numpy op by op (issue 4's baseline), numpy reusing one preallocated buffer (out=: no page
faults, for scale), the eqfuse kernel, a hand-written AVX2 kernel with non-temporal stores (the
best code for it, but relu as max: not NaN-propagating), the same loop with ordinary stores,
and a read-only pass over the three inputs (a bound: no kernel can beat reading its inputs).
GB/s counts the bytes a kernel must move: 3 reads + 1 write = 256 MiB (read-only: 192 MiB).
The last column is numpy's time over the row's: read-only's is the ratio's ceiling.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import eqfuse
from eqfuse.backend.cbuild import COMMON_C, COMMON_CDEF, build
from eqfuse.cli.bench import blas_threads

F32 = np.float32
N = 1 << 24

C_SOURCE = COMMON_C + r"""
#include <immintrin.h>
#include <stdint.h>
void hand_nt(const float* restrict a, const float* restrict b, const float* restrict c, float* restrict o, long n)
{
    long h = (long)(((64 - ((uintptr_t)o & 63)) & 63) / 4);
    if (h > n) h = n;
    for (long i = 0; i < h; i++) { float v = a[i] * b[i] + c[i]; o[i] = v > 0 ? v : 0; }
    const long n8 = (n - h) / 8;
    #pragma omp parallel
    {
    #pragma omp for schedule(static) nowait
    for (long q = 0; q < n8; q++) {
        const long i = h + q * 8;
        __m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), _mm256_loadu_ps(c + i));
        _mm256_stream_ps(o + i, _mm256_max_ps(v, _mm256_setzero_ps()));
    }
    _mm_sfence();
    }
    for (long i = h + n8 * 8; i < n; i++) { float v = a[i] * b[i] + c[i]; o[i] = v > 0 ? v : 0; }
}
void plain(const float* restrict a, const float* restrict b, const float* restrict c, float* restrict o, long n)
{
    #pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; i++) { float v = a[i] * b[i] + c[i]; o[i] = v > 0 ? v : 0; }
}
float read3(const float* restrict a, const float* restrict b, const float* restrict c, long n)
{
    float s = 0;
    #pragma omp parallel for simd reduction(+:s) schedule(static)
    for (long i = 0; i < n; i++) s += a[i] + b[i] + c[i];
    return s;
}
"""
C_DEF = COMMON_CDEF + """
void hand_nt(const float* a, const float* b, const float* c, float* o, long n);
void plain(const float* a, const float* b, const float* c, float* o, long n);
float read3(const float* a, const float* b, const float* c, long n);
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=21)
    ap.add_argument("--threads", type=int, action="append")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(N).astype(F32) for _ in range(3))
    src = f"graph pw(a: f32[{N}], b: f32[{N}], c: f32[{N}]) -> f32[{N}] {{ return kernel {{ relu(a * b + c) }} }}"
    fn = eqfuse.compile(src, verify=False).default
    built = build(C_SOURCE, C_DEF, "bench_stream", extra_flags=("-mavx2", "-mfma"))
    lib, ffi = built.lib, built.ffi
    p = lambda x: ffi.cast("float *", x.ctypes.data)  # noqa: E731
    o_hand, o_plain, tmp = np.empty(N, F32), np.empty(N, F32), np.empty(N, F32)

    def np_out():  # numpy without allocations (each fresh 64 MiB array costs page faults)
        np.multiply(a, b, out=tmp)
        np.add(tmp, c, out=tmp)
        return np.maximum(tmp, F32(0), out=tmp)
    rows = [
        ("numpy np.maximum(a * b + c, 0)", None, lambda: np.maximum(a * b + c, F32(0))),
        ("numpy, out= into one buffer", None, np_out),
        ("eqfuse kernel", 256, lambda: fn(a, b, c)),
        ("hand-written AVX2, non-temporal", 256, lambda: lib.hand_nt(p(a), p(b), p(c), p(o_hand), N)),
        ("same loop, ordinary stores", 256, lambda: lib.plain(p(a), p(b), p(c), p(o_plain), N)),
        ("read a, b, c only (bound)", 192, lambda: lib.read3(p(a), p(b), p(c), N)),
    ]
    want = np.maximum(a * b + c, F32(0))
    lib.hand_nt(p(a), p(b), p(c), p(o_hand), N)
    lib.plain(p(a), p(b), p(c), p(o_plain), N)
    for got in (fn(a, b, c), o_hand, o_plain, np_out()):
        assert np.allclose(got, want, rtol=1e-6, atol=1e-6)
    blas_threads(1)
    print(f"{'kernel':<34}{'thr':>4}{'ms':>9}{'GB/s':>8}{'numpy/this':>12}")
    for t in args.threads or [1, 2]:
        fn.threads = t
        lib.eqf_set_threads(t)
        times: list[list[float]] = [[] for _ in rows]
        for _, _, f in rows:
            f()
        for _ in range(args.repeat):
            for k, (_, _, f) in enumerate(rows):
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
        med = [statistics.median(ts) for ts in times]
        for (name, mib, _), m in zip(rows, med):
            bw = f"{mib * 1.048576 / m / 1e3:8.1f}" if mib else f"{'':>8}"
            print(f"{name:<34}{t:>4}{m * 1e3:>9.2f}{bw}{med[0] / m:>11.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
