"""A training step (forward + backward): `python benchmarks/bench_train.py [--repeat 30]`.

An MLP classifier (784-256-10, batch 64, softmax cross-entropy) and a transformer encoder layer
(batch 4, sequence 64, width 128, 4 heads, GELU MLP of 256, mean squared error), each a loss and
the gradients of every weight. eqfuse: `eqfuse.compile(src, grad=[...])`; torch eager:
`torch.autograd.grad`; torch.compile (default mode) of the same loss function, its backward
made by AOTAutograd. Calls interleaved in one process, 1 and 2 threads; median ms and the spread
(IQR % of the median). The gradients are checked against torch's first.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import statistics
import time

import numpy as np

import eqfuse

MLP = """graph mlp(x: f32[64, 784], onehot: f32[64, 10], w1: f32[784, 256], b1: f32[256], w2: f32[256, 10],
              b2: f32[10]) -> f32 {
    logits = relu(x @ w1 + b1) @ w2 + b2
    return -mean(sum(onehot * log(softmax(logits)), axis=-1))
}"""

B, S, D, H, F = 4, 64, 128, 4, 256


def _encoder(S: int) -> str:
    return f"""graph encoder(x: f32[{B}, {S}, {D}], wq: f32[{D}, {D}], wk: f32[{D}, {D}], wv: f32[{D}, {D}],
                       wo: f32[{D}, {D}], g1: f32[{D}], be1: f32[{D}], w1: f32[{D}, {F}], b1: f32[{F}],
                       w2: f32[{F}, {D}], b2: f32[{D}], target: f32[{B}, {S}, {D}]) -> f32 {{
        q = transpose(reshape(x @ wq, shape=[{B}, {S}, {H}, {D // H}]), perm=[0, 2, 1, 3])
        k = transpose(reshape(x @ wk, shape=[{B}, {S}, {H}, {D // H}]), perm=[0, 2, 1, 3])
        v = transpose(reshape(x @ wv, shape=[{B}, {S}, {H}, {D // H}]), perm=[0, 2, 1, 3])
        p = softmax(q @ transpose(k, perm=[0, 1, 3, 2]) * {(D // H) ** -0.5!r})
        o = reshape(transpose(p @ v, perm=[0, 2, 1, 3]), shape=[{B}, {S}, {D}])
        h1 = layernorm(x + o @ wo, g1, be1)
        y = h1 + gelu(h1 @ w1 + b1) @ w2 + b2
        return mean((y - target) * (y - target))
}}"""


ENCODER = _encoder(S)


def _torch_losses():
    import torch
    fn = torch.nn.functional

    def mlp(x, onehot, w1, b1, w2, b2):
        logits = torch.relu(x @ w1 + b1) @ w2 + b2
        return -(onehot * torch.log_softmax(logits, -1)).sum(-1).mean()

    def encoder(x, wq, wk, wv, wo, g1, be1, w1, b1, w2, b2, target):
        def heads(t):
            return t.reshape(B, S, H, D // H).permute(0, 2, 1, 3)
        q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
        p = torch.softmax(q @ k.transpose(-1, -2) * (D // H) ** -0.5, dim=-1)
        o = (p @ v).permute(0, 2, 1, 3).reshape(B, S, D)
        h1 = fn.layer_norm(x + o @ wo, (D,), g1, be1)
        y = h1 + fn.gelu(h1 @ w1 + b1) @ w2 + b2
        return ((y - target) ** 2).mean()
    return {"mlp": mlp, "encoder": encoder}


def _arrays(name: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    if name == "mlp":
        shapes = {"x": (64, 784), "w1": (784, 256), "b1": (256,), "w2": (256, 10), "b2": (10,)}
        a = {k: (rng.standard_normal(s) * (0.05 if k.startswith("w") else 1)).astype(np.float32) for k, s in shapes.items()}
        a["onehot"] = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 64)]
        return a
    shapes = {"x": (B, S, D), "wq": (D, D), "wk": (D, D), "wv": (D, D), "wo": (D, D), "g1": (D,), "be1": (D,),
              "w1": (D, F), "b1": (F,), "w2": (F, D), "b2": (D,), "target": (B, S, D)}
    a = {k: (rng.standard_normal(s) * (0.08 if k.startswith("w") else 1)).astype(np.float32) for k, s in shapes.items()}
    a["g1"] = 1 + 0.1 * a["g1"]
    return a


def _stats(ts):
    q = statistics.quantiles(ts, n=4)
    med = statistics.median(ts)
    return med * 1e3, 100 * (q[2] - q[0]) / med


def main() -> None:
    import torch

    global S

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--cost", nargs="+", default=["memory"], choices=("memory", "time"),
                    help="eqfuse's cost models, a column each (memory: attention's probabilities recomputed in "
                         "its gradients; time: stored where the time model finds that faster)")
    ap.add_argument("--seq", type=int, default=S, help="the encoder's sequence length")
    ap.add_argument("--models", nargs="+", default=["mlp", "encoder"], choices=("mlp", "encoder"))
    args = ap.parse_args()
    S = args.seq
    sources = {"mlp": MLP, "encoder": _encoder(S)}
    losses = _torch_losses()
    print(f"{'model':<9}{'thr':>4}" + "".join(f"{'eqfuse[' + c + '] ms':>20}{'iqr%':>6}" for c in args.cost)
          + f"{'eager ms':>10}{'iqr%':>6}{'compile ms':>12}{'iqr%':>6}{'compile/eqfuse':>16}")
    for name in args.models:
        src = sources[name]
        a = _arrays(name)
        data = ("x", "onehot", "target")
        wrt = [k for k in a if k not in data]
        names = list(inspect.signature(losses[name]).parameters)
        tensors = {k: torch.from_numpy(v.copy()).requires_grad_(k in wrt) for k, v in a.items()}
        order = [tensors[k] for k in names]
        params = [tensors[k] for k in wrt]
        compiled = torch.compile(losses[name])

        def eager():
            return torch.autograd.grad(losses[name](*order), params)

        def comp():
            return torch.autograd.grad(compiled(*order), params)
        for th in (1, 2):
            torch.set_num_threads(th)
            steps = {c: eqfuse.compile(src, grad=wrt, threads=th, cost=c) for c in args.cost}
            for step in steps.values():
                out = step(**a)
                for g, t in zip(out[1:], eager()):  # the gradients agree with torch's
                    np.testing.assert_allclose(g, t.numpy(), rtol=2e-3, atol=1e-5)
            comp()
            runs = {**{c: functools.partial(st, **a) for c, st in steps.items()}, "eager": eager, "compile": comp}
            times = {k: [] for k in runs}
            for _ in range(args.repeat):
                for k, run in runs.items():
                    t0 = time.perf_counter()
                    run()
                    times[k].append(time.perf_counter() - t0)
            ours = [_stats(times[c]) for c in args.cost]
            (g, gi), (c, ci) = (_stats(times[k]) for k in ("eager", "compile"))
            print(f"{name:<9}{th:>4}" + "".join(f"{e:>20.3f}{ei:>6.0f}" for e, ei in ours)
                  + f"{g:>10.3f}{gi:>6.0f}{c:>12.3f}{ci:>6.0f}{c / ours[0][0]:>16.2f}", flush=True)
    print(f"compile/eqfuse > 1: eqfuse's step (cost {args.cost[0]}) is faster than torch.compile's.")


if __name__ == "__main__":
    main()
