"""A decode step's kernels at 1 and 2 threads: where the second thread's bandwidth goes.

    flock /tmp/eqfuse-bench.lock python benchmarks/bench_decode_profile.py [--model gpt2]
        [--precision f32 --precision bf16] [--threads 1 --threads 2] [--repeat 50] [--rounds 3]
        [--split runs --split turns]

The GPT-2-small-sized decode step of benchmarks/bench_generate.py (random weights, the TorchScript
export, prompt 128), compiled once per thread count and precision in this one process, profiled
per kernel (eqfuse.runtime.profile) at live length 128, the thread counts interleaved over
`--rounds` (each kernel's median over the rounds). Printed per precision and thread count: each
few-rows GEMM's microseconds and the GB/s its packed weights stream at (grouped by shape: the
12 layers' GEMMs of one shape summed), the decode attentions, the appends, every other kernel,
and the call's time outside the kernels (Python, the one cffi call); then STREAM triad at each
thread count (benchmarks/bench_generate.py's), read after the profiles.

`--split turns` compiles the step again with its skinny GEMMs' panels claimed in turn
(plan_gemm.skinny_runs answering no, as before the plan's `runs`), `--split runs` as planned
(the default); with both, each precision and thread count's two steps are profiled interleaved,
and the header gives the step's and the GEMMs' median and spread over the rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def group_of(p) -> tuple[str, int]:
    """(the row's label, the bytes a call streams: a skinny GEMM's panels, else 0)."""
    d = p.detail
    if getattr(d, "path", None) == "skinny":
        eb = 2 if p.precision == "bf16" else 4
        nr = p.tiles["nr"]
        return f"gemm {d.gemm.M}x{d.K}x{d.N}", d.K * (-(-d.N // nr) * nr) * eb
    kind = str(p.kind)
    if p.live and "attention" in kind:
        return "decode attention", 0
    if p.live:
        return f"live {kind}", 0
    return f"other {kind}", 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--precision", action="append")
    ap.add_argument("--threads", type=int, action="append")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--split", action="append", choices=["runs", "turns"])
    a = ap.parse_args()
    import warnings

    warnings.simplefilter("ignore")
    import bench_generate as bg
    import decoder_exports as de
    import transformers

    transformers.logging.set_verbosity_error()
    import eqfuse
    from eqfuse.backend.kinds.contraction import plan_gemm
    from eqfuse.generation import Decoder, capacity_for, onnx_signature, step_maker
    from eqfuse.runtime.profile import profile

    kind, layers, width, heads, sizes = bg.MODELS[a.model]
    positions = 1024 if kind == "gpt2" else 2048
    path = de.export_decoder(kind, "torchscript", layers, width, heads, positions, **sizes)
    sig = onnx_signature(path)
    cap = capacity_for(a.prompt + 128 - 1)
    ids = np.random.default_rng(0).integers(0, sizes["vocab"], (1, a.prompt)).astype(np.int64)
    steps = {}
    planned = plan_gemm.skinny_runs
    for precision, threads, split in [(p, t, x) for p in a.precision or ["f32", "bf16"] for t in a.threads or [1, 2]
                                      for x in a.split or ["runs"]]:
        plan_gemm.skinny_runs = planned if split == "runs" else (lambda parallel, panels: False)
        mod = eqfuse.compile(path, threads=threads, precision=precision)
        dec = Decoder(sig, lambda f, mod=mod: mod(**f), cap, step_maker(mod, sig))
        bg.greedy(dec.prefill, dec.step, ids, 2)
        dims = {sig.shapes[sig.ids][0]: 1, sig.shapes[sig.ids][1]: 1, sig.pasts[0][1][2]: cap,
                sig.shapes[sig.mask][1]: cap + 1}
        step = mod.default.live_module(dims, sig.pasts[0][1][2])
        feeds = {sig.ids: np.zeros((1, 1), np.int64), sig.mask: np.ones((1, cap + 1), np.int64),
                 sig.positions: np.full((1, 1), dec.length, np.int64), "past_length": np.array([dec.length])}
        feeds.update({n: c for (n, _), c in zip(sig.pasts, dec.cache)})
        steps[precision, threads, split] = (step, feeds)
    plan_gemm.skinny_runs = planned
    runs = defaultdict(list)
    for r in range(a.rounds):  # (interleaved: a change in the machine's bandwidth falls on every step)
        for key, (step, feeds) in steps.items():
            runs[key].append(profile(step, repeat=a.repeat, **feeds))
        print(f"round {r}: " + "  ".join(f"{p} {t}t {x} {runs[p, t, x][-1]['call_us']:.0f} us" for p, t, x in steps),
              flush=True)
    triad = {t: bg.triad_gbs(t) for t in sorted({t for _, t, _ in steps})}
    print(f"{a.model} decode step at live length {a.prompt + 1}, capacity {cap}; median of {a.rounds} rounds of "
          f"{a.repeat} calls; triad " + ", ".join(f"{t} thr {g:.1f} GB/s" for t, g in triad.items())
          + f"; load average {os.getloadavg()[0]:.1f}")
    for (precision, threads, split), results in runs.items():
        step = steps[precision, threads, split][0]
        plans = step.last.runner.kernels if hasattr(step, "last") else step.default.last.runner.kernels
        rows: dict[str, list] = {}
        for k, p in enumerate(plans):
            label, nbytes = group_of(p)
            us = statistics.median(r["kernels"][k][2] for r in results)
            r = rows.setdefault(label, [0, 0.0, 0])
            r[0] += 1
            r[1] += us
            r[2] += nbytes
        call = statistics.median(r["call_us"] for r in results)
        calls = [r["call_us"] for r in results]
        gemms = [sum(r["kernels"][k][2] for k, p in enumerate(plans) if group_of(p)[1]) for r in results]
        inside = sum(r[1] for r in rows.values())
        gemm_us = sum(r[1] for n, r in rows.items() if n.startswith("gemm"))
        gemm_b = sum(r[2] for n, r in rows.items() if n.startswith("gemm"))
        print(f"\n{precision}, {threads} thread(s), panels in {split}: call {call:.0f} us "
              f"({min(calls):.0f}-{max(calls):.0f}), skinny GEMMs {statistics.median(gemms):.0f} us "
              f"({min(gemms):.0f}-{max(gemms):.0f}) over the rounds")
        print(f"  medians: call {call:.0f} us, kernels {inside:.0f} us, outside "
              f"{call - inside:.0f} us; skinny GEMMs {gemm_us:.0f} us at {gemm_b / gemm_us / 1e3:.1f} GB/s "
              f"({gemm_b / gemm_us / 1e3 / triad[threads]:.0%} of triad); the step's stream {gemm_b / call / 1e3:.1f} GB/s")
        print(f"  {'kernels':<34} {'n':>3} {'us':>8} {'MB':>7} {'GB/s':>6}")
        for label, (n, us, nbytes) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
            bw = f"{nbytes / us / 1e3:6.1f}" if nbytes else ""
            print(f"  {label:<34} {n:>3} {us:8.1f} {nbytes / 1e6:7.1f} {bw}")


if __name__ == "__main__":
    main()
