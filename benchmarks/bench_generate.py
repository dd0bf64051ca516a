"""Generation with a KV cache: eqfuse.generate's prefill and decode against onnxruntime.

    python benchmarks/bench_generate.py [--layers 2] [--width 256] [--heads 4] [--prompt 128]
                                        [--new 128] [--batch 1] [--threads 1]

A GPT-2 LM with random weights (tests/decoder_exports.py, TorchScript export with past key
values, 512 positions), through eqfuse.generate's Decoder, greedy tokens: eqfuse's decode step
over the cache in place with its length a run-time value (live=, docs/generation.md), and, on the
same feeds, eqfuse and onnxruntime at a fixed capacity (the rows past the live length masked:
every step attends over the whole capacity). Prints tokens per second of the prefill and of the
decode, and the median time per token at tokens 1-8 and at the last 8. The first generation
compiles (the prefill and the decode steps) and is not timed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def run(decoder, ids: np.ndarray, new: int) -> tuple[float, list[float]]:
    """(prefill seconds, seconds of each decode step) of one greedy generation."""
    t = time.perf_counter()
    logits = decoder.prefill(ids)
    prefill = time.perf_counter() - t
    steps = []
    for _ in range(new - 1):
        tok = logits.argmax(-1)[:, None].astype(np.int64)
        t = time.perf_counter()
        logits = decoder.step(tok)
        steps.append(time.perf_counter() - t)
    return prefill, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    os.environ["EQFUSE_NUM_THREADS"] = str(a.threads)

    import decoder_exports as de
    import onnxruntime as ort

    import eqfuse
    from eqfuse.frontend.onnx_inputs import input_shapes
    from eqfuse.generation import Decoder, capacity_for, onnx_signature, step_maker

    path = de.export_gpt2("torchscript", layers=a.layers, width=a.width, heads=a.heads, positions=512)
    sig = onnx_signature(path)
    cap = capacity_for(a.prompt + a.new - 1)
    mod = eqfuse.compile(path, threads=a.threads)
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    onnx_name = {p: o for o, p, _ in input_shapes(str(path))}
    live = step_maker(mod, sig)
    ours = lambda f: mod(**f)  # noqa: E731
    peers = {"eqfuse": (ours, live), "eqfuse masked": (ours, None),
             "onnxruntime": (lambda f: sess.run(None, {onnx_name[k]: v for k, v in f.items()}), None)}
    ids = np.random.default_rng(0).integers(0, de.VOCAB, (a.batch, a.prompt)).astype(np.int64)
    t = time.perf_counter()
    run(Decoder(sig, ours, cap, live), ids, 2)  # compiles the prefill and the decode step
    run(Decoder(sig, ours, cap), ids, 2)  # and the decode binding at the capacity
    print(f"GPT-2 {a.layers} layers x {a.width}, batch {a.batch}, prompt {a.prompt}, {a.new} new tokens, "
          f"cache capacity {cap}, {a.threads} thread(s); eqfuse's compile {time.perf_counter() - t:.1f} s")
    print(f"{'':12} {'prefill tok/s':>14} {'decode tok/s':>13} {'ms/token 1-8':>13} {'ms/token last 8':>16}")
    for name, (fn, step) in peers.items():
        prefill, steps = run(Decoder(sig, fn, cap, step), ids, a.new)
        print(f"{name:12} {a.batch * a.prompt / prefill:14.0f} {a.batch * len(steps) / sum(steps):13.0f} "
              f"{1e3 * statistics.median(steps[:8]):13.3f} {1e3 * statistics.median(steps[-8:]):16.3f}")


if __name__ == "__main__":
    main()
