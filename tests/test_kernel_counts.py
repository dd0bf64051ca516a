"""One kernel count (docs/optimizing.md, "Kernel counts"): the kernels that run, views apart, in
`eqfuse opt`, `eqfuse bench`, `eqfuse lower`, mod.report and eqfuse.optimize."""

import json
import re

import numpy as np
import pytest
from helpers import ROOT

import eqfuse
from eqfuse.cli.main import main
from eqfuse.frontend.load import load
from eqfuse.ir.kernels import K
from eqfuse.ir.reference import evaluate
from eqfuse.optimizer.optimize import optimize_graph

# a gpt2-style block: one fused QKV projection whose q, k and v are slices of one tensor,
# reshaped into heads (views the compiled module reads in place)
GPT2_BLOCK = """
graph block(x: f32[2, 16, 64], g1: f32[64], be1: f32[64], wqkv: f32[64, 192], bqkv: f32[192],
            wo: f32[64, 64], bo: f32[64], g2: f32[64], be2: f32[64],
            w1: f32[64, 256], b1: f32[256], w2: f32[256, 64], b2: f32[64]) -> f32[2, 16, 64] {
    h = layernorm(x, g1, be1)
    qkv = h @ wqkv + bqkv
    q = transpose(reshape(slice(qkv, axis=-1, start=0, stop=64), shape=[2, 16, 4, 16]), perm=[0, 2, 1, 3])
    k = transpose(reshape(slice(qkv, axis=-1, start=64, stop=128), shape=[2, 16, 4, 16]), perm=[0, 2, 1, 3])
    v = transpose(reshape(slice(qkv, axis=-1, start=128, stop=192), shape=[2, 16, 4, 16]), perm=[0, 2, 1, 3])
    a = softmax(q @ transpose(k, perm=[0, 1, 3, 2]) * 0.25, axis=-1) @ v
    o = reshape(transpose(a, perm=[0, 2, 1, 3]), shape=[2, 16, 64])
    r = x + (o @ wo + bo)
    f = gelu(layernorm(r, g2, be2) @ w1 + b1) @ w2 + b2
    return r + f
}
"""


def cli(capsys, *args) -> str:
    assert main([str(a) for a in args]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return out


def block(tmp_path):
    path = tmp_path / "block.g"
    path.write_text(GPT2_BLOCK)
    return path


def running(kernels) -> tuple[int, int]:
    views = sum(k.kind == K.VIEW for k in kernels)
    return len(kernels) - views, views


@pytest.mark.heavy  # (a few seconds: the whole suite runs it, the fast tier not)
def test_the_opt_report_counts_views_apart_as_the_compiled_module_runs(capsys, tmp_path):
    path = block(tmp_path)
    r = json.loads(cli(capsys, "opt", path, "--report", "json"))
    mod = eqfuse.compile(path)
    ran, views = running(mod.kernels)
    assert (r["kernels_after"], r["views_after"]) == (ran, views) == (7, 7)
    assert r["kernels_counted"] == "lowered"
    # mod.report: the same counts
    assert (mod.report["kernels_after"], mod.report["views_after"]) == (ran, views)
    assert mod.report["kernels_before"] == r["kernels_before"]
    # the optimizer's own count takes some views for kernels: the report no longer shows it
    assert optimize_graph(load(path)[0]).report["kernels_after"] > ran
    text = cli(capsys, "opt", path)
    assert f"kernels:    {r['kernels_before']} -> 7 (+7 views)" in text


def test_opt_prints_views_as_ops_outside_kernel_blocks_and_the_text_parses_back(capsys, tmp_path):
    path, out = block(tmp_path), tmp_path / "fused.g"
    r = json.loads(cli(capsys, "opt", path, "-o", out, "--report", "json"))
    text = out.read_text()
    assert r["graph"] == text  # --report json's graph is the text printed
    # a kernel block per kernel that runs; the views (slices and head splits of the fused QKV
    # projection, the head merge) are ops outside any block
    assert text.count("kernel {") == r["kernels_after"] == 7
    outside = [ln for ln in text.splitlines() if re.match(r" +\w+ = (reshape|slice|transpose)\(", ln)]
    assert len(outside) == 4 and sum(ln.count("(") for ln in outside) == r["views_after"] == 7
    (fused,) = load(text)  # parses back, as the same function
    rng = np.random.default_rng(0)
    args = [rng.standard_normal([int(d) for d in t.shape]).astype(np.float32) for _, t in fused.params]
    np.testing.assert_allclose(evaluate(fused, args)[0], evaluate(load(path)[0], args)[0], rtol=1e-5, atol=1e-5)
    again = json.loads(cli(capsys, "opt", out, "--report", "json"))  # and optimizes to the same kernels
    assert (again["kernels_after"], again["views_after"]) == (7, 7)


def test_eqfuse_optimize_counts_the_kernels_opt_counts(capsys, tmp_path):
    # every dim bound by the graph's own shapes: the lowered count, views apart, as `eqfuse opt`
    # gives it (7 kernels and 7 views: the test above), not the optimizer's (which takes views for kernels)
    r = eqfuse.optimize(block(tmp_path)).report
    assert (r["kernels_after"], r["views_after"], r["kernels_counted"]) == (7, 7, "lowered")
    # a dim unbound: the optimizer's count, and the report says so; bound by dims=, the lowered one
    mlp = ROOT / "examples" / "mlp.g"
    free = eqfuse.optimize(mlp).report
    assert free["kernels_counted"] == "optimizer" and "views_after" not in free
    bound = eqfuse.optimize(mlp, dims={"B": 4}).report
    cli_b = json.loads(cli(capsys, "opt", mlp, "--dim", "B=4", "--report", "json"))
    assert bound["kernels_counted"] == "lowered"
    assert (bound["kernels_before"], bound["kernels_after"], bound["views_after"]) == \
        (cli_b["kernels_before"], cli_b["kernels_after"], cli_b["views_after"])


@pytest.mark.heavy  # (three commands over one graph)
def test_opt_bench_and_lower_count_the_same_kernels(capsys, tmp_path):
    path = block(tmp_path)
    r = json.loads(cli(capsys, "opt", path, "--report", "json"))
    lowered = cli(capsys, "lower", path)
    assert f"# graph block: {r['kernels_after']} kernels" in lowered
    bench = cli(capsys, "bench", path, "--repeat", "1", "--threads", "1", "--peers", "numpy")
    assert f"eqfuse unfused ({r['kernels_before']} kernels)" in bench
    assert f"eqfuse fused ({r['kernels_after']} kernels)" in bench


@pytest.mark.heavy  # (three commands over one graph)
def test_with_a_dim_unbound_the_count_is_the_optimizers_and_says_so(capsys):
    path = ROOT / "examples" / "transformer.g"
    r = json.loads(cli(capsys, "opt", path, "--report", "json"))
    assert r["kernels_counted"] == "optimizer" and "views_after" not in r
    assert "views not counted" in cli(capsys, "opt", path)
    bound = json.loads(cli(capsys, "opt", path, "--dim", "B=2", "--report", "json"))
    assert bound["kernels_counted"] == "lowered"
    mod = eqfuse.compile(path, dims={"B": 2})
    assert (bound["kernels_after"], bound["views_after"]) == running(mod.kernels)
    assert re.search(rf"kernels: +{bound['kernels_before']} -> {bound['kernels_after']} "
                     rf"\(\+{bound['views_after']} views\)", cli(capsys, "opt", path, "--dim", "B=2"))
