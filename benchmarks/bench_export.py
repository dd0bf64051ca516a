"""One transformer layer (examples/transformer.g, B=1) on one thread: eqfuse.compile's Module
against the library `eqfuse export` writes, built by make for each target and called through ctypes.

    python benchmarks/bench_export.py [--repeat N] [--targets portable,x86-64-v3,native]

Medians of N calls after 5 warm-up calls; each row also prints its largest difference from the
numpy reference.
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

import eqfuse
from eqfuse.export import export
from eqfuse.frontend.load import load

MODEL = Path(__file__).resolve().parent.parent / "examples" / "transformer.g"


def median_ms(f, n: int) -> float:
    for _ in range(5):
        f()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--targets", default="portable,x86-64-v3,native")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    w = {n: (rng.standard_normal(t.shape) * (0.05 if len(t.shape) == 2 else 1)).astype(np.float32)
         for n, t in load(MODEL)[0].params if n != "x"}
    x = rng.standard_normal((1, 128, 256)).astype(np.float32)
    ref = eqfuse.reference(MODEL)(x, *w.values())
    mod = eqfuse.compile(MODEL, params=w, threads=1)
    print("| runs | ms | max abs error vs reference |\n|---|---|---|")
    print(f"| eqfuse.compile Module | {median_ms(lambda: mod(x), args.repeat):.3f} | {np.abs(mod(x) - ref).max():.2e} |")
    with tempfile.TemporaryDirectory() as tmp:
        for target in args.targets.split(","):
            out = Path(tmp) / target
            export(MODEL, out, weights=w, dims={"B": 1}, target=target, name="enc")
            subprocess.run(["make", "-s", "-C", str(out)], check=True, capture_output=True)
            lib = ctypes.CDLL(str(out / "libenc.so"))
            lib.enc_load.restype = ctypes.c_void_p
            lib.enc_set_threads(1)
            m = ctypes.c_void_p(lib.enc_load(str(out / "weights.bin").encode()))
            y = np.empty_like(ref)
            px, py = x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p)
            ms = median_ms(lambda: lib.enc_encoder(m, px, py), args.repeat)
            print(f"| exported, --target {target} | {ms:.3f} | {np.abs(y - ref).max():.2e} |")


if __name__ == "__main__":
    main()
