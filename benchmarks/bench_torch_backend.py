"""torch.compile with backend="eqfuse" against inductor (torch.compile's default) and eager.

    python benchmarks/bench_torch_backend.py [--repeat N] [--model NAME ...]

Models: an MLP, ResNet-18 and BERT/GPT-2 (tests/model_exports.py: small configs, random weights)
and nn.TransformerEncoderLayer, inference under torch.no_grad(). Each model is compiled once
per backend and the outputs are checked against eager (rtol 1e-4, atol 1e-5). For 1 and 2
threads (torch.set_num_threads; eqfuse follows torch's count), calls of eager, inductor and
eqfuse alternate, one of each per round; each row gives the medians, the spread (interquartile
range as % of the median) and inductor / eqfuse.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import model_exports as me  # noqa: E402

from eqfuse import torch_backend  # noqa: E402

MODELS = ("mlp", "resnet18", "bert", "gpt2", "encoder")


def build(name: str):
    """(model, args, kwargs) for one benchmark row."""
    torch.manual_seed(0)
    if name == "mlp":
        m = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 10))
        return m.eval(), (torch.randn(64, 256),), {}
    if name == "encoder":
        m = torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True)
        return m.eval(), (torch.randn(4, 64, 256),), {}
    if name == "resnet18":
        m, _ = me._resnet18()
        return m, tuple(torch.from_numpy(v) for v in me.inputs(name).values()), {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m, _ = me._hf(name)
    return m, (), {k: torch.from_numpy(v) for k, v in me.inputs(name).items()}


def _iqr(ts: list[float]) -> float:
    q = statistics.quantiles(ts, n=4)
    return 100 * (q[2] - q[0]) / statistics.median(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--model", action="append", choices=MODELS)
    args = ap.parse_args(argv)
    torch_backend.register()
    warnings.simplefilter("ignore", torch_backend.FallbackWarning)
    print(f"{'model':<10}{'thr':>4}{'eager ms':>10}{'iqr%':>6}{'inductor ms':>13}{'iqr%':>6}"
          f"{'eqfuse ms':>11}{'iqr%':>6}{'ind/eqf':>9}{'compile s ind/eqf':>19}")
    for name in args.model or MODELS:
        model, pos, kw = build(name)
        runs, compile_s = {"eager": model}, {}
        with torch.no_grad():
            want = model(*pos, **kw)
            for backend in ("inductor", "eqfuse"):
                torch._dynamo.reset()
                fn = torch.compile(model, backend=backend)
                t = time.perf_counter()
                got = fn(*pos, **kw)
                compile_s[backend] = time.perf_counter() - t
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
                runs[backend] = fn
            for th in (1, 2):
                torch.set_num_threads(th)
                times: dict[str, list[float]] = {k: [] for k in runs}
                for k, fn in runs.items():  # warm up at this thread count
                    fn(*pos, **kw)
                for _ in range(args.repeat):
                    for k, fn in runs.items():
                        t = time.perf_counter()
                        fn(*pos, **kw)
                        times[k].append(time.perf_counter() - t)
                med = {k: statistics.median(v) for k, v in times.items()}
                print(f"{name:<10}{th:>4}" + "".join(f"{med[k] * 1e3:>{w}.3f}{_iqr(times[k]):>6.0f}"
                                                     for k, w in (("eager", 10), ("inductor", 13), ("eqfuse", 11)))
                      + f"{med['inductor'] / med['eqfuse']:>9.2f}"
                      + f"{compile_s['inductor']:>11.1f}/{compile_s['eqfuse']:.1f}", flush=True)
    print("ind/eqf > 1: eqfuse is faster than inductor. Inputs: MLP 64x256; ResNet-18 2x3x64x64; BERT and "
          "GPT-2 batch 2, sequence 16; encoder layer 4x64x256. Compile time: the first call (a warm kernel cache for eqfuse).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
