"""A prompt's prefill in chunks over the KV cache in place (eqfuse.generation's chunk step,
docs/generation.md "Prompt lengths") against one prefill of the whole prompt.

    flock /tmp/eqfuse-bench.lock python benchmarks/bench_prefill_chunks.py [--threads 1]
        [--prompt 128] [--chunk 16 --chunk 32 --chunk 128] [--repeat 5] [--model gpt2|llama]

The GPT-2-small-sized export of benchmarks/bench_generate.py (12 layers, 768 wide, 1024 positions,
random weights) or its Llama-style one (12 query heads over 4), batch 1. Each chunk length's step
is compiled once over the cache at the model's positions (1024 rows; Decoder.prefill_chunks), and
the whole prompt's prefill at past = 1 (Decoder.prefill, the older scheme) once; then the median
and fastest of `--repeat` prefills in ms and prompt tokens/s, and the largest difference of the
last position's logits from the whole prompt's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--chunk", type=int, action="append")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--model", default="gpt2", choices=["gpt2", "llama"])
    a = ap.parse_args()
    os.environ["EQFUSE_NUM_THREADS"] = str(a.threads)
    import decoder_exports as de

    import eqfuse
    from eqfuse.generation import Decoder, module_signature, step_maker

    if a.model == "gpt2":
        path = de.export_decoder("gpt2", "torchscript", 12, 768, 12, 1024, vocab=50257)
    else:
        path = de.export_decoder("llama", "torchscript", 12, 768, 12, 1024, vocab=32000, ff=2048, kv_heads=4)
    mod = eqfuse.compile(path, threads=a.threads)
    sig = module_signature(mod)
    cap = 1024
    ids = np.random.default_rng(0).integers(0, 1000, (1, a.prompt)).astype(np.int64)
    print(f"{a.model} prefill of {a.prompt} tokens, batch 1, {a.threads} thread(s), cache of {cap} rows, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"  {'how':>24} {'median ms':>10} {'min ms':>8} {'tokens/s':>9} {'max |dlogit|':>13}")
    whole = Decoder(sig, lambda f: mod(**f), cap)
    ref = whole.prefill(ids, a.prompt)
    times = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        whole.prefill(ids, a.prompt)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(f"  {'whole prompt (past = 1)':>24} {med * 1e3:>10.1f} {min(times) * 1e3:>8.1f} {a.prompt / med:>9.0f} "
          f"{0.0:>13.2e}")
    for n in a.chunk or [16, 32, 128]:
        dec = Decoder(sig, None, cap, step_maker(mod, sig))
        got = dec.prefill_chunks(ids, n)  # (compiles the chunk step and the decode step)
        times = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            dec.prefill_chunks(ids, n)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        print(f"  {f'chunks of {n}':>24} {med * 1e3:>10.1f} {min(times) * 1e3:>8.1f} {a.prompt / med:>9.0f} "
              f"{float(np.abs(got - ref).max()):>13.2e}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
