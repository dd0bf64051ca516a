"""Lowering plans, emitted C (deterministic, warning-free at -Wall) and the backend commands."""

import shutil
import subprocess
from pathlib import Path

import pytest

from eqfuse.backend.cbuild import FLAGS
from eqfuse.backend.emit import emit_graph
from eqfuse.backend.indexing import bstrides, coalesce, offset
from eqfuse.backend.lower import format_uops
from eqfuse.cli.main import main
from eqfuse.frontend.load import load
from eqfuse.pipeline import lower

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

EVERY_KIND = """
graph every(x: f32[4, 6, 33], w: f32[33, 17], b: f32[17], g: f32[33], be: f32[33],
            q: f32[2, 40, 8], k: f32[2, 40, 8], v: f32[2, 40, 8],
            img: f32[1, 3, 8, 8], f: f32[4, 3, 3, 3]) {
    l = kernel { layernorm(x * 2, g, be) }
    m = kernel { relu(l @ w + b) }
    s = kernel { sum(x, axis=1) }
    a = kernel { softmax(q @ transpose(k, perm=[0, 2, 1]) * 0.35) @ v }
    c = kernel { relu(conv2d(img, f, padding=1)) }
    t = transpose(a, perm=[1, 0, 2])
    u = kernel { m * 2 + b }
    return u, s, t, c
}
"""


def plans_of(src, dims=None):
    g = load(src)[0]
    _, kg, plans = lower(g, dims or {})
    return kg, plans


def test_index_arithmetic():
    assert bstrides((33,), (7, 33)) == (0, 1)
    assert bstrides((7, 1), (7, 33)) == (1, 0)
    assert coalesce((2, 3, 4), (12, 4, 1)) == ([24], [1])
    assert offset("j", (2, 3, 4), (12, 4, 1)) == "j"
    assert offset("o", (5, 7), (0, 1)) == "o % 7"
    assert offset("o", (5, 7), (1, 0)) == "o / 7"


def test_plans_cover_every_kind_and_fit_caches():
    _, plans = plans_of(EVERY_KIND)
    kinds = [p.kind for p in plans]
    assert kinds == ["row", "contraction", "reduce", "attention", "conv2d", "layout", "pointwise"]
    for p in plans:
        assert "NO" not in p.cache_check, p.cache_check
        assert p.uops and p.bytes > 0 and p.flops >= 0
    att = plans[3]
    assert att.tiles["bk"] <= 64 and "never 40 x 40" in att.cache_check
    text = format_uops(plans)
    for word in ("Load", "Exec", "Store", "tiles:", "eqf_every_k3_attention"):
        assert word in text


@pytest.mark.heavy  # (the fast tier's time)
def test_emitted_c_is_deterministic_and_compiles_without_warnings(tmp_path):
    assert "-Wall" in FLAGS
    _, plans = plans_of(EVERY_KIND)
    e1 = emit_graph(plans)
    e2 = emit_graph(plans_of(EVERY_KIND)[1])
    assert e1.source == e2.source
    assert list(e1.kernel_sources) == [f"eqf_every_k{i}_{k}" for i, k in
                                       enumerate(["row", "contraction", "reduce", "attention", "conv2d",
                                                  "layout", "pointwise"])]
    cc = shutil.which("gcc") or shutil.which("cc")
    assert cc is not None, "eqfuse needs a C compiler (gcc or cc on PATH)"
    src = tmp_path / "every.c"
    src.write_text(e1.source)
    r = subprocess.run([cc, *FLAGS, "-c", str(src), "-o", str(tmp_path / "every.o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr, r.stderr


@pytest.mark.heavy  # (the fast tier's time)
def test_streaming_pointwise_c_compiles_without_warnings(monkeypatch):
    """The non-temporal pointwise path (outputs beyond the cache share), at -Wall and -Wextra."""
    from dataclasses import replace

    from eqfuse import machine
    from eqfuse.backend.cbuild import warnings_for

    small = replace(machine.machine(), l1=32 << 10, l2=256 << 10, l3=1 << 20, simd_floats=16, cores=2)
    monkeypatch.setattr(machine, "_PINNED", [small])
    _, plans = plans_of("graph big(x: f32[300, 1027], r: f32[1027], v: f32[140001], w: f32[140001]) {\n"
                        "    a = kernel { relu(x * r + 1) }\n    b = kernel { exp(v) - v }\n"
                        "    c = kernel { relu(v * w + w) }\n    return a, b, c\n}\n")
    assert [p.tiles["stream"] for p in plans] == [1, 1, 1]
    assert all("non-temporal" in p.cache_check for p in plans)
    src = emit_graph(plans).source
    # (one compile: the build's flags, -Wall among them, and -Wextra beside them)
    assert warnings_for(src, ("-Werror", "-Wextra", "-Wno-unused-parameter")) == ""


def test_cli_emit_writes_c(tmp_path, capsys):
    assert main(["emit", str(EXAMPLES / "mlp.g"), "--dim", "B=16", "-o", str(tmp_path / "c")]) == 0
    out = (tmp_path / "c" / "mlp.c").read_text()
    assert "eqf_mlp_k0_" in out and "#pragma omp" in out
    assert "mlp.c" in capsys.readouterr().out


def test_cli_lower_uops(capsys):
    assert main(["lower", str(EXAMPLES / "conv_bn_relu.g"), "--uops", "--dim", "N=2"]) == 0
    out = capsys.readouterr().out
    assert "conv2d" in out and "Load" in out and "Store" in out and "x" in out


def test_cli_needs_bound_dims(capsys):
    assert main(["lower", str(EXAMPLES / "mlp.g"), "--uops"]) == 2
    assert "--dim B=INT" in capsys.readouterr().err


# (the suite's budget: it times every graph of the model; test_onnx_models.py runs `eqfuse bench` by
# default)
@pytest.mark.extended
def test_cli_bench_prints_table(capsys):
    assert main(["bench", str(EXAMPLES / "elementwise.g"), "--dim", "N=4096", "--repeat", "2",
                 "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "numpy op by op" in out and "eqfuse fused (" in out and "eqfuse unfused" in out


@pytest.mark.heavy  # (the fast tier's time)
def test_cli_run_compiles_and_verifies(tmp_path, capsys):
    import numpy as np

    rng = np.random.default_rng(0)
    arrays = {"x": rng.standard_normal((3, 784)), "w1": rng.standard_normal((784, 1024)) * 0.05,
              "b1": rng.standard_normal(1024), "w2": rng.standard_normal((1024, 10)) * 0.05,
              "b2": rng.standard_normal(10)}
    np.savez(tmp_path / "in.npz", **{k: v.astype(np.float32) for k, v in arrays.items()})
    assert main(["run", str(EXAMPLES / "mlp.g"), "--inputs", str(tmp_path / "in.npz"), "--verify",
                 "-o", str(tmp_path / "out.npz")]) == 0
    captured = capsys.readouterr()
    assert "verified" in captured.err
    assert np.load(tmp_path / "out.npz")["out0"].shape == (3, 10)



@pytest.mark.heavy  # (the fast tier's time)
def test_bench_reports_the_spread_and_warns_when_it_is_wide(monkeypatch):
    from eqfuse.cli import bench

    monkeypatch.setattr(bench, "sample_times", lambda fn, repeat: [1.0, 1.0, 1.1, 1.0, 0.9])
    med, iqr = bench.spread(lambda: None, 5)
    assert med == 1.0 and 0 < iqr <= 20
    steady = bench.bench_model("graph g(x: f32[64]) -> f32[64] {\n    return relu(x) * 2\n}\n",
                               repeat=5, threads=(1,), peers=("numpy",))
    assert "%" in steady and "warning: spread" not in steady
    monkeypatch.setattr(bench, "sample_times", lambda fn, repeat: [1.0, 2.0, 3.0, 4.0, 5.0])
    noisy = bench.bench_model("graph g(x: f32[64]) -> f32[64] {\n    return relu(x) * 2\n}\n",
                              repeat=5, threads=(1,), peers=("numpy",))
    assert "warning: spread over 20%" in noisy and "eqfuse fused (1 kernels), threads=1: " in noisy
