"""The optimized-graph cache (eqfuse/optimizer/graph_cache.py): a graph optimized again comes from
it without an e-graph; anything the result depends on (rules, cost model, dims) makes a new entry;
EQFUSE_NO_CACHE / --no-cache turn it off; a damaged entry is not trusted; `eqfuse cache`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import one_graph

from eqfuse.optimizer import graph_cache
from eqfuse.optimizer import optimize as O

SRC = """graph g(x: f32[8, 16], w: f32[16, 8], b: f32[8]) -> f32[8, 8] {
    return relu(x @ w + b)
}"""


@pytest.fixture
def runs(monkeypatch, tmp_path):
    """The cache on, in a fresh directory; the list gets one item per optimizer run (e-graphs)."""
    monkeypatch.setattr(graph_cache, "ENABLED", True)
    monkeypatch.setenv("EQFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("EQFUSE_NO_CACHE", raising=False)
    calls = []
    real = O._optimize_graph

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(O, "_optimize_graph", counted)
    return calls


def entries(tmp_path):
    d = tmp_path / "cache" / "graphs"
    # (the optimized graphs' entries; beside them their pickles and memos, eqfuse.optimizer.graph_cache)
    return sorted(f for f in d.iterdir() if f.suffix == ".json") if d.is_dir() else []


@pytest.mark.heavy  # (the fast tier's time)
def test_a_repeated_compile_skips_the_e_graph(runs, tmp_path):
    import eqfuse

    x, w, b = (np.random.default_rng(0).standard_normal(s).astype(np.float32) for s in ((8, 16), (16, 8), (8,)))
    first = eqfuse.compile(SRC)
    assert len(runs) == 1 and len(entries(tmp_path)) == 1
    again = eqfuse.compile(SRC)
    assert len(runs) == 1  # the second compile optimized nothing
    assert again.report["graph_cache"] == "hit" and first.report["graph_cache"] == "miss"
    assert again.report["kernels_after"] == first.report["kernels_after"]
    np.testing.assert_allclose(again.g(x, w, b), first.g(x, w, b), rtol=1e-6)
    np.testing.assert_allclose(again.g(x, w, b), np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-5)


def test_what_the_result_depends_on_is_in_the_key(runs, tmp_path):
    g = one_graph(SRC)
    base = O.optimize_graph(g)
    assert O.optimize_graph(g).report["graph_cache"] == "hit" and len(runs) == 1
    assert O.optimize_graph(g, cost="launches").report["graph_cache"] == "miss"  # another cost model
    assert O.optimize_graph(g, disable=["fuse_relu"]).report["graph_cache"] == "miss"  # a rule disabled
    from eqfuse.machine import MODELS

    assert O.optimize_graph(g, machine=MODELS["zen4"]).report["graph_cache"] == "miss"  # the planner's machine
    assert O.optimize_graph(g, machine=MODELS["zen4"]).report["graph_cache"] == "hit"
    rw = tmp_path / "mine.rw"
    rw.write_text("rule my_relu: relu(relu(?x)) => relu(?x)\n")
    assert O.optimize_graph(g, rules=[str(rw)]).report["graph_cache"] == "miss"  # a user rule file
    assert O.optimize_graph(g, rules=[str(rw)]).report["graph_cache"] == "hit"
    rw.write_text("rule my_relu: relu(relu(relu(?x))) => relu(?x)\n")  # the same file, changed
    assert O.optimize_graph(g, rules=[str(rw)]).report["graph_cache"] == "miss"
    assert len(runs) == 6 and len(entries(tmp_path)) == 6
    assert base.report["graph_cache"] == "miss"


def test_no_cache_neither_reads_nor_writes(runs, tmp_path, monkeypatch):
    g = one_graph(SRC)
    monkeypatch.setenv("EQFUSE_NO_CACHE", "1")
    assert O.optimize_graph(g).report["graph_cache"] == "off"
    assert O.optimize_graph(g).report["graph_cache"] == "off"
    assert len(runs) == 2 and entries(tmp_path) == []


def test_a_damaged_entry_is_not_trusted(runs, tmp_path):
    g = one_graph(SRC)
    O.optimize_graph(g)
    (entry,) = entries(tmp_path)
    data = entry.read_bytes()
    entry.write_bytes(data.replace(b"kernel", b"kernal", 1))  # the payload no longer matches its digest
    r = O.optimize_graph(g)
    assert r.report["graph_cache"] == "miss" and len(runs) == 2
    assert O.optimize_graph(g).report["graph_cache"] == "hit"  # written again, whole


def test_cli_no_cache_and_cache_info_clear(runs, tmp_path, capsys):
    from eqfuse.cli.main import main

    model = tmp_path / "m.g"
    model.write_text(SRC)
    assert main(["opt", str(model), "--report", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["graph_cache"] == "miss"
    assert main(["opt", str(model), "--report", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["graph_cache"] == "hit"
    try:
        assert main(["opt", str(model), "--report", "json", "--no-cache"]) == 0
        assert json.loads(capsys.readouterr().out)["graph_cache"] == "off"
    finally:
        import os

        os.environ.pop("EQFUSE_NO_CACHE", None)  # what --no-cache set for the rest of its process
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert "optimized graphs: 1 entry" in out and str(tmp_path / "cache") in out
    assert main(["cache", "clear"]) == 0
    assert "1 optimized graphs" in capsys.readouterr().out
    assert list((tmp_path / "cache" / "graphs").iterdir()) == []  # the pickles and memos too
    assert main(["cache", "info"]) == 0
    assert "optimized graphs: 0 entries" in capsys.readouterr().out


def test_a_warm_compile_neither_optimizes_nor_lowers_the_unfused_graph(runs, monkeypatch):
    """Both caches warm (issue 32): the compile reads the fused graph back (its pickle, no parse)
    and its unfused kernel count (a memo), so it lowers only the fused graph it builds."""
    import eqfuse
    from eqfuse import pipeline
    from eqfuse.frontend import load as frontend_load

    first = eqfuse.compile(SRC)
    lowered, parsed = [], []
    real_lower, real_load = pipeline.lower, frontend_load.load
    monkeypatch.setattr(pipeline, "lower", lambda g, d, fuse=True, *a, **kw: (lowered.append(fuse),
                                                                             real_lower(g, d, fuse, *a, **kw))[1])
    monkeypatch.setattr(frontend_load, "load", lambda src, *a, **kw: (parsed.append(src != SRC),
                                                                     real_load(src, *a, **kw))[1])
    again = eqfuse.compile(SRC)
    assert again.report["graph_cache"] == "hit" and len(runs) == 1
    assert lowered == [True] and parsed == [False]  # the model's own text parsed, no fused graph's
    for k in ("kernels_before", "views_before", "kernels_after", "views_after", "kernels_counted"):
        assert again.report[k] == first.report[k]
