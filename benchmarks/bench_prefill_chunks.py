"""A prompt's prefill in chunks over the KV cache in place (eqfuse.generation's chunk step,
docs/generation.md "Prompt lengths") against one prefill of the whole prompt.

    flock /tmp/eqfuse-bench.lock python benchmarks/bench_prefill_chunks.py [--threads 1]
        [--prompt 128] [--chunk 16 --chunk 32 --chunk 128] [--repeat 5] [--model gpt2|llama]
    flock /tmp/eqfuse-bench.lock python benchmarks/bench_prefill_chunks.py --prompts 7,20,50,100,128,200,300
        [--threads 1] [--repeat 7] [--model gpt2|llama]

`--prompts`: prompts of those lengths through the chunk step generate compiles now, its rows a
dim at run time (`runtime`: one step of RUNTIME_CHUNK rows, each chunk computing its live rows
only), against the chunk step compiled at the prompt's bucket as generate did before (`bucket`:
the power of two at or above the prompt, 16 to 256, the prompt padded to it; one compile per
bucket) and onnxruntime on the same file prefilling the whole prompt (an empty past). The three
interleaved (benchmarks/timing.py: call by call at one thread, in blocks after onnxruntime's
threads sleep at two), each prompt `--repeat` times; the median ms and the interquartile range in
% of it, and the run-time step's time against the others'.

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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import alternate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--chunk", type=int, action="append")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--model", default="gpt2", choices=["gpt2", "llama"])
    ap.add_argument("--prompts", help="comma-separated prompt lengths: run-time rows against buckets and onnxruntime")
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
    if a.prompts:
        lengths(a, path, mod, [int(n) for n in a.prompts.split(",")])
        return
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


def lengths(a, path, mod, prompts: list[int]) -> None:
    """The `--prompts` table (module docstring)."""
    import onnxruntime as ort

    from eqfuse.generation import CHUNK_MAX, PREFILL_MIN, Decoder, chunk_plan, module_signature, step_maker

    sig = module_signature(mod)
    cap = 1024
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = a.threads, 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    kv = {i.name: i.shape for i in sess.get_inputs() if "past" in i.name}

    def ort_prefill(ids):
        b, s = ids.shape
        feeds = {"input_ids": ids, "attention_mask": np.ones((b, s), np.int64),
                 "position_ids": np.tile(np.arange(s), (b, 1))}
        feeds.update({n: np.zeros((b, shape[1], 0, shape[3]), np.float32) for n, shape in kv.items()})
        return sess.run(None, {n: feeds[n] for n in names})[0][:, -1]

    rt_rows = chunk_plan(mod, sig, 1, 1, cap)
    print(f"{a.model} prefill, batch 1, {a.threads} thread(s), cache of {cap} rows, run-time chunk step of "
          f"{rt_rows} rows, load average {os.getloadavg()[0]:.1f}")
    print("| prompt | runtime ms (iqr) | bucket | bucket ms (iqr) | onnxruntime ms (iqr) | runtime / bucket "
          "| runtime / onnxruntime | max rel |dlogit| |")
    print("|---|---|---|---|---|---|---|---|")
    for s in prompts:
        ids = np.random.default_rng(s).integers(0, 1000, (1, s)).astype(np.int64)
        bucket = min(max(PREFILL_MIN, 1 << max(s - 1, 0).bit_length()), CHUNK_MAX)
        rt, ct = Decoder(sig, None, cap, step_maker(mod, sig)), Decoder(sig, None, cap, step_maker(mod, sig))
        runs = {"runtime": lambda: rt.prefill_chunks(ids, rt_rows, runtime=True),
                "bucket": lambda: ct.prefill_chunks(ids, bucket), "ort": lambda: ort_prefill(ids)}
        first = {k: f() for k, f in runs.items()}  # (compiles the buckets' steps; warms every peer)
        times = alternate(runs, a.repeat, a.threads)  # (at 2 threads in blocks, onnxruntime's pool asleep)
        med = {k: statistics.median(v) for k, v in times.items()}

        def cell(k):
            q = statistics.quantiles(times[k], n=4) if len(times[k]) > 1 else [med[k]] * 3
            return f"{med[k] * 1e3:.2f} ({100 * (q[2] - q[0]) / med[k]:.0f}%)"
        err = float(np.abs(first["runtime"] - first["ort"]).max() / np.abs(first["ort"]).max())
        print(f"| {s} | {cell('runtime')} | {bucket} | {cell('bucket')} | {cell('ort')} "
              f"| {med['runtime'] / med['bucket']:.2f} | {med['runtime'] / med['ort']:.2f} | {err:.1e} |")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
