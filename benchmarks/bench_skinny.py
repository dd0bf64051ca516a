"""The few-rows GEMM of a decode step alone, streaming its weights from memory, against STREAM
triad measured in the same process at the same thread count.

    flock /tmp/eqfuse-bench.lock python benchmarks/bench_skinny.py [--threads 1] [--threads 2]
        [--precision f32 --precision bf16] [--rows 1 --rows 4] [--repeat 7] [--pages huge|4k]
        [--split runs --split turns]

A decode step at batch 1 is a chain of GEMMs of 1 to 4 rows, each over a different weight, that
together read far more than the last-level cache holds: every weight comes from memory. This
benchmark builds the plan's skinny kernel (csrc_templates/gemm_skinny.c, its tiles and
prefetch from plan_gemm.skinny_tiles for this machine) for the shapes of GPT-2-small's layers
(K x N = 768 x 2304, 768 x 768, 768 x 3072, 3072 x 768) and of its lm head (768 x 50257, given
transposed), prepacks as many copies of each weight as make 256 MB, and times a C loop that
calls the kernel once per copy, in order (on the pool's threads where the plan's rule,
plan_gemm.skinny_parallel, shares it), holding the claim-based pool as the graph's run
function does (one call of the loop streams every copy once: nothing is in cache). The copies
are allocated as the runtime allocates panels (eqfuse.runtime.program.panel_floats: huge pages),
or with `--pages 4k` in 4 KiB pages as before it. `--split` says how the threads share the
panels: `runs`, one contiguous run per thread (plan_gemm.skinny_runs, the plan's from 4 panels
on), or `turns`, the next panel claimed in turn (before it); both: each shape's two kernels are
timed interleaved. Printed per shape: the weight stream's GB/s
(packed bytes over the median time of a loop, and over the best), the best's fraction of triad,
`read`: a plain read of the same copies (OpenMP, 8 sums), interleaved with the loop (the best,
as STREAM reports), what streaming them can reach; and the median time per call. Then the fixed
cost of a call: the same kernel over a weight of 64 x 128 (two panels, in L1), at the thread count.

Every kernel's result is checked first against float64 numpy: f32 to 1e-5 of the largest |y|,
bf16 against the exact product of the operands rounded to bf16 (so only the f32 accumulation's
error remains), to 1e-5 of the largest |y|.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

SHAPES = [(768, 2304, False), (768, 768, False), (768, 3072, False), (3072, 768, False), (768, 50257, True)]
STREAM_BYTES = 256 << 20

TRIAD_C = r"""
/* a plain read of the packs, in order: what streaming them can reach (each pack split in
 * halves between the threads, as STREAM splits its arrays; 8 sums, so the adds never wait) */
float read_all(float* const* P, long copies, long n)
{
    float t = 0;
    for (long c = 0; c < copies; c++) {
        #pragma omp parallel reduction(+:t)
        {
            const long nt = omp_get_num_threads(), id = omp_get_thread_num();
            const long i0 = n / 128 * id / nt * 128, i1 = id == nt - 1 ? n / 128 * 128 : n / 128 * (id + 1) / nt * 128;
            typedef float v16 __attribute__((vector_size(64), aligned(4)));
            v16 s[8] = {{0}};
            for (long i = i0; i < i1; i += 128)
                for (int j = 0; j < 8; j++)
                    s[j] += *(const v16*)(P[c] + i + 16 * j);
            for (int j = 0; j < 8; j++)
                for (int q = 0; q < 16; q++)
                    t += s[j][q];
        }
    }
    return t;
}

void triad(float* restrict a, const float* restrict b, const float* restrict c, float s, long n)
{
    #pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}
"""

LOOP_C = r"""
void loop_{name}(const float* A, float* const* P, float* C, long copies)
{{
    int held = 0;
    eqf_pool_hold(&held, 1);
    for (long c = 0; c < copies; c++)
        {name}(A, P[c], C);
    eqf_pool_hold(&held, 0);
}}
"""


def triad_gbs(lib, ffi, repeat: int) -> float:
    n = 32 << 20
    a, b, c = np.zeros(n, np.float32), np.ones(n, np.float32), np.full(n, 2, np.float32)
    p = lambda x: ffi.cast("float *", x.ctypes.data)  # noqa: E731
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        lib.triad(p(a), p(b), p(c), 3.0, n)
        best = min(best, time.perf_counter() - t)
    return 12 * n / best / 1e9  # (three float32 arrays: 12 bytes an element)


def measure(threads: int, precisions: list[str], rows: list[int], repeat: int, pages: str,
            splits: list[str]) -> None:
    from eqfuse.backend.cbuild import COMMON_C, COMMON_CDEF, build, header_c
    from eqfuse.backend.kinds.contraction.emit_gemm import emit_gemm_skinny
    from eqfuse.backend.kinds.contraction.plan_gemm import (
        bf16_path,
        skinny_parallel,
        skinny_runs,
        skinny_tiles,
    )
    from eqfuse.machine import machine
    from eqfuse.runtime.program import aligned_floats, panel_floats

    alloc = panel_floats if pages == "huge" else aligned_floats

    m = machine()
    rng = np.random.default_rng(0)
    cases = []
    code, cdef = [], []
    for prec in precisions:
        path = "f32" if prec == "f32" else bf16_path(m)
        for M in rows:
            for K, N, bt in SHAPES + [(64, 128, False)]:
                for split in splits:
                    t = skinny_tiles(M, N, m, path)  # (the plan's prefetch for this path too)
                    name = f"sk_{prec}_{M}_{K}_{N}_{split}"
                    par = threads > 1 and (K * N <= 1 << 13 or skinny_parallel(M, N, K, 4 if prec == "f32" else 2))
                    runs = split == "runs" and skinny_runs(par, -(-N // t["nr"]))
                    src, cd = emit_gemm_skinny(name, M=M, N=N, K=K, lda=K, ldb=K if bt else N, ldc=N, mr=t["mr"],
                                               nr=t["nr"], pf=t["pf"], b_transposed=bt, parallel=par, path=path,
                                               runs=runs)
                    code += [src, LOOP_C.format(name=name)]
                    cdef += [cd, f"void loop_{name}(const float* A, float* const* P, float* C, long copies);"]
                    cases.append((prec, M, K, N, bt, name, t, split))
    built = build(header_c() + COMMON_C + TRIAD_C + "\n".join(code),
                  COMMON_CDEF + "\nfloat read_all(float* const* P, long copies, long n);\nvoid triad(float* a, const float* b, const float* c, float s, long n);\n"
                  + "\n".join(cdef), "bench_skinny")
    lib, ffi = built.lib, built.ffi
    lib.eqf_set_threads(threads)
    triad = triad_gbs(lib, ffi, 15)
    load = os.getloadavg()[0]
    print(f"{threads} thread(s): triad {triad:.1f} GB/s (load average {load:.1f})")
    print(f"  {'precision':9} {'M':>2} {'K x N':>12} {'tile':>7} {'split':>5} {'GB/s':>6} {'best':>6} {'of triad':>8} "
          f"{'read':>6} {'us/call':>8}")
    ptr = lambda x: ffi.cast("float *", x.ctypes.data)  # noqa: E731
    groups: dict[tuple, list] = {}  # (the splits of one shape, timed interleaved)
    for case in cases:
        groups.setdefault(case[:5], []).append(case)
    for (prec, M, K, N, bt), same in groups.items():
        w = (rng.standard_normal((N, K) if bt else (K, N)) / np.sqrt(K)).astype(np.float32)
        x = rng.standard_normal((M, K), dtype=np.float32)
        timed = [prepare(lib, ffi, ptr, alloc, prec, M, K, N, bt, name, w, x) + (t, split)
                 for *_, name, t, split in same]
        small = K * N <= 1 << 13
        if small:  # the fixed cost: many calls over one weight in L1
            for packs, parr, loop, c, floats, copies, t, split in timed:
                calls = 20000
                ts, same_w = [], ffi.new("float*[]", [ptr(packs[0])] * 1000)
                for _ in range(repeat):
                    s = time.perf_counter()
                    for _ in range(calls // 1000):
                        loop(ptr(x), same_w, ptr(c), 1000)
                    ts.append((time.perf_counter() - s) / calls)
                print(f"  {prec:9} {M:2} {f'{K} x {N}':>12} {t['mr']}x{t['nr']:<4} {split:>5} {'':6} {'':6} {'':8} {'':6} "
                      f"{statistics.median(ts) * 1e6:8.2f}  (fixed cost of a call)")
            continue
        ts = [[] for _ in timed]
        rs = []
        for packs, parr, loop, c, floats, copies, t, split in timed:
            loop(ptr(x), parr, ptr(c), copies)
        for _ in range(repeat):  # interleaved: a disturbance hits every split and the read alike
            for k, (packs, parr, loop, c, floats, copies, t, split) in enumerate(timed):
                s = time.perf_counter()
                loop(ptr(x), parr, ptr(c), copies)
                ts[k].append(time.perf_counter() - s)
            s = time.perf_counter()
            lib.read_all(timed[0][1], timed[0][5], timed[0][4])
            rs.append(time.perf_counter() - s)
        for k, (packs, parr, loop, c, floats, copies, t, split) in enumerate(timed):
            gb = 4 * floats * copies / 1e9
            med, best, read = statistics.median(ts[k]), min(ts[k]), gb / min(rs)
            print(f"  {prec:9} {M:2} {f'{K} x {N}':>12} {t['mr']}x{t['nr']:<4} {split:>5} {gb / med:6.1f} {gb / best:6.1f} "
                  f"{gb / best / triad:8.0%} {read:6.1f} {med / copies * 1e6:8.1f}", flush=True)


def prepare(lib, ffi, ptr, alloc, prec, M, K, N, bt, name, w, x):
    """(packs, their pointer array, the loop, C, floats a pack, copies) of one kernel, its result checked."""
    floats = getattr(lib, f"{name}_prepack_floats")()
    copies = 1 if K * N <= 1 << 13 else max(2, STREAM_BYTES // (4 * floats))
    packs = [alloc(floats) for _ in range(copies)]
    for p in packs:
        getattr(lib, f"{name}_prepack")(ptr(w), ptr(p))
    c = np.empty((M, N), np.float32)
    getattr(lib, name)(ptr(x), ptr(packs[0]), ptr(c))
    wt = w.T if bt else w
    if prec == "f32":
        want, bound = x.astype(np.float64) @ wt.astype(np.float64), 1e-5
    else:  # the inputs rounded to bf16, f32 accumulation (docs/precision.md)
        r = lambda a: bf16_round(a).astype(np.float64)  # noqa: E731
        want, bound = r(x) @ r(wt), 1e-5
    err = float(np.abs(c - want).max() / np.abs(want).max())
    assert err < bound, f"{name}: relative error {err}"
    return packs, ffi.new("float*[]", [ptr(p) for p in packs]), getattr(lib, f"loop_{name}"), c, floats, copies


def bf16_round(a: np.ndarray) -> np.ndarray:
    """Round to nearest even bf16, as f32."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, action="append")
    ap.add_argument("--precision", action="append", choices=["f32", "bf16"])
    ap.add_argument("--rows", type=int, action="append")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--pages", choices=["huge", "4k"], default="huge")
    ap.add_argument("--split", action="append", choices=["runs", "turns"])
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    precisions, rows, splits = a.precision or ["f32", "bf16"], a.rows or [1, 4], a.split or ["runs"]
    if a.child:
        measure(a.child, precisions, rows, a.repeat, a.pages, splits)
        return
    for n in a.threads or [1, 2]:  # a child per thread count (the threads are set once)
        args = [sys.executable, __file__, "--child", str(n), "--repeat", str(a.repeat), "--pages", a.pages]
        args += [f"--precision={p}" for p in precisions] + [f"--rows={r}" for r in rows]
        args += [f"--split={x}" for x in splits]
        subprocess.run(args, check=True, env={**os.environ, "EQFUSE_NUM_THREADS": str(n)})


if __name__ == "__main__":
    main()
