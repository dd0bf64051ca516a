"""Where bf16 weights pay on a CPU without a bf16 multiply: the few-rows GEMM on the fallback path
(bf16 weights widened in the registers, f32 FMA) against f32, by the size of its weights.

    python benchmarks/bench_bf16_fallback.py [--rows 4] [--layers 8] [--repeat 200]

A chain of --layers GEMMs of --rows rows over bound d x d weights (each its own), for d from 128
(64 KiB of f32 weights) to 1024 (4 MiB), compiled in f32 and in bf16 with every kernel on the
fallback (Machine.bf16_fallback_all pinned), calls interleaved on one thread; the median time of
each and their ratio. It measures the rule of plan_gemm.bf16_pays and plan_skinny: on such a CPU
the few-rows GEMM multiplies bf16 only over weights past L2, which come from L3 or memory at every
call. Each bf16 result is first compared with the f32 one, loosely (5% of its largest value per
layer: bf16 rounds each weight by up to 2^-8), so that a wrong kernel is not timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import eqfuse  # noqa: E402
from eqfuse import machine  # noqa: E402
from timing import alternate  # noqa: E402


def chain(rows: int, d: int, layers: int) -> str:
    params = ", ".join(f"w{i}: f32[{d}, {d}]" for i in range(layers))
    body = "".join(f"  h{i} = h{i - 1} @ w{i}\n" if i else f"  h0 = x @ w0\n" for i in range(layers))
    return f"graph g(x: f32[{rows}, {d}], {params}) -> f32[{rows}, {d}] {{\n{body}  return h{layers - 1}\n}}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args(argv)
    m = machine.machine()
    print(f"L2 {m.l2 >> 10} KiB; {args.layers} GEMMs of {args.rows} rows, 1 thread, median us of {args.repeat} calls")
    print(f"{'d':>6}{'weights KiB':>13}{'f32 us':>10}{'bf16 us':>10}{'bf16/f32':>10}  bf16 path")
    for d in (128, 256, 362, 512, 724, 1024):
        rng = np.random.default_rng(d)
        ws = {f"w{i}": (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32) for i in range(args.layers)}
        x = rng.standard_normal((args.rows, d)).astype(np.float32)
        with machine.pinned(dataclasses.replace(m, bf16_fallback_all=True)):
            mods = {p: eqfuse.compile(chain(args.rows, d, args.layers), params=ws, precision=p, threads=1)
                    for p in ("f32", "bf16")}
            ys = {p: np.asarray(mod(x), np.float64) for p, mod in mods.items()}
        paths = sorted({e["path"] for e in mods["bf16"].report["precision"].values()})
        # bf16 weights move each layer's result by at most 2^-8 of |x| |w| (relative): a loose check
        err = np.abs(ys["bf16"] - ys["f32"]).max() / np.abs(ys["f32"]).max()
        if not err < 0.05 * args.layers:
            raise SystemExit(f"d={d}: bf16 differs from f32 by {err:.3g} of its largest value")
        t = alternate({p: (lambda mod=mod: mod(x)) for p, mod in mods.items()}, args.repeat, 1)
        med = {p: statistics.median(v) * 1e6 for p, v in t.items()}
        print(f"{d:>6}{d * d * 4 >> 10:>13}{med['f32']:>10.1f}{med['bf16']:>10.1f}{med['bf16'] / med['f32']:>10.2f}  "
              f"{', '.join(paths)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
