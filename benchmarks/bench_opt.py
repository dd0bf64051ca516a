"""Optimizer speed and results: `python benchmarks/bench_opt.py [--repeat N] [--layers 12]`.

BERT comes twice: with layernorm, gelu and softmax ops, and in primitive form (those spelled out
as the TorchScript ONNX exporter writes them; `make_bert.py --primitive`).

Prints one table row per model (medians over N runs in one process, after one warm-up run):
kernels and MB moved unfused -> greedy extraction -> final extraction, e-graph size, iterations,
stop reason, extraction method (greedy, ilp, ilp by regions: the cheapest wins, greedy on ties),
what the ILP did, and optimize seconds (saturation + extraction + rescoring, as in the report).

`--many`: files of many small graphs instead, through `optimize_graphs` (what `eqfuse opt` and
`eqfuse.optimize` run on a file): 19 MLPs and an attention graph, 500 different graphs
`relu(x * y + 1.0)` (each its own length), and 500 copies of one (each its own name); medians
of N runs in one process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["EQFUSE_NO_CACHE"] = "1"  # every run optimizes: the optimized-graph cache would serve the repeats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from make_bert import bert_text  # noqa: E402

from eqfuse.frontend.load import load  # noqa: E402
from eqfuse.optimizer.optimize import optimize_graph, optimize_graphs  # noqa: E402


def models(layers: int):
    for p in sorted((ROOT / "examples").glob("*.g")):
        yield p.stem, load(p)[0], {d: 8 for d in load(p)[0].dims()}
    yield f"bert-base x{layers}", load(bert_text(layers))[0], {"B": 8}
    yield f"bert-base x{layers}, primitive form", load(bert_text(layers, primitive=True))[0], {"B": 8}


def many_files():
    mlps = [f"graph mlp{i}(x: f32[B, {8 + i}], w: f32[{8 + i}, 16], b: f32[16]) -> f32[B, 16] {{\n"
            f"    return relu(x @ w + b)\n}}\n" for i in range(19)]
    attn = ("graph attn(q: f32[S, 8], k: f32[S, 8], v: f32[S, 8]) -> f32[S, 8] {\n"
            "    return softmax(q @ transpose(k) * 0.35) @ v\n}\n")
    yield "19 MLPs and an attention graph", "".join(mlps[:7]) + attn + "".join(mlps[7:])
    yield "500 different small graphs", "".join(
        f"graph g{i}(x: f32[{8 + i}], y: f32[{8 + i}]) -> f32[{8 + i}] {{\n    return relu(x * y + 1.0)\n}}\n"
        for i in range(500))
    yield "500 copies of one small graph", "".join(
        f"graph g{i}(x: f32[8], y: f32[8]) -> f32[8] {{\n    return relu(x * y + 1.0)\n}}\n" for i in range(500))


def many(repeat: int, cost: str) -> None:
    print(f"| file | graphs | optimized | seconds (median of {repeat}) |")
    print("|---|---|---|---|")
    for name, text in many_files():
        gs = load(text)
        optimize_graphs(gs[:5], cost=cost)  # warm-up
        runs, out = [], None
        for _ in range(repeat):
            t = time.perf_counter()
            out = optimize_graphs(gs, cost=cost)
            runs.append(time.perf_counter() - t)
        optimized = sum("same_as" not in r.report for r in out)
        print(f"| {name} | {len(gs)} | {optimized} | {statistics.median(runs):.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--cost", default="memory")
    ap.add_argument("--many", action="store_true", help="files of many small graphs (optimize_graphs)")
    a = ap.parse_args()
    if a.many:
        return many(a.repeat, a.cost)
    head = (f"| model | kernels (unfused -> greedy -> final) | MB moved (unfused -> greedy -> final) | e-graph nodes "
            f"| recognition e-graph nodes | iters | stop | extraction | ILP | optimize s (median of {a.repeat}) |")
    print(head)
    print("|" + "---|" * 10)
    for name, g, dims in models(a.layers):
        optimize_graph(g, cost=a.cost, dims=dims)  # warm-up: imports, machine measurement
        runs = [optimize_graph(g, cost=a.cost, dims=dims) for _ in range(a.repeat)]
        r = runs[-1].report
        t = statistics.median(x.report["optimize_seconds"] for x in runs)
        print(f"| {name} | {r['kernels_before']} -> {r['kernels_greedy']} -> {r['kernels_after']} | "
              f"{r['bytes_before'] / 1e6:.1f} -> {r['bytes_greedy'] / 1e6:.1f} -> {r['bytes_after'] / 1e6:.1f} | "
              f"{r['egraph_nodes']} | {r['recognition']['egraph_nodes']} | {r['iterations']} | {r['stop_reason']} | {r['extraction']} | {r['ilp']} | "
              f"{t:.3f} |")

if __name__ == "__main__":
    main()
