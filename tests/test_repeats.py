"""Repeated layers optimized once (eqfuse.optimizer.repeats): the same kernels as optimizing the
whole graph, the same values, each copy under its own layer's names."""

from __future__ import annotations

import sys

import pytest
from helpers import ROOT, assert_same_values, one_graph, rand_inputs, run

from eqfuse.ir.printer import graph_text
from eqfuse.optimizer import cost as C
from eqfuse.optimizer import repeats
from eqfuse.optimizer.optimize import optimize_graph

sys.path.insert(0, str(ROOT / "benchmarks"))
from make_bert import bert_text  # noqa: E402

DIMS = {"B": 2}


@pytest.fixture(scope="module")
def bert3():
    """A 3-layer primitive-form BERT: optimized by repeated pieces, and whole."""
    g = one_graph(bert_text(layers=3, hidden=32, heads=2, seq=8, ffn=64, primitive=True))
    by_pieces = optimize_graph(g, dims=DIMS)
    real = repeats.find
    repeats.find = lambda _g: None
    try:
        whole = optimize_graph(g, dims=DIMS)
    finally:
        repeats.find = real
    return g, by_pieces, whole


@pytest.mark.heavy  # (the 3-layer graph optimized whole too)
def test_each_layer_is_optimized_once_with_the_kernels_of_the_whole_graph(bert3):
    g, by_pieces, whole = bert3
    r = by_pieces.report
    assert r["repeats"] == "3 pieces in 1 classes, optimized once per class (3 copies of a 54-node block)"
    assert whole.report["repeats"] is None
    assert (r["kernels_after"], r["bytes_after"]) == (whole.report["kernels_after"], whole.report["bytes_after"])
    assert r["kernels_after"] == 3 * 7
    assert r["egraph_nodes"] < whole.report["egraph_nodes"] / 2  # one layer's e-graph, not three
    xs = rand_inputs(g, DIMS, seed=5)
    assert_same_values(run(by_pieces.graph, xs), run(g, xs))


@pytest.mark.heavy  # (the 3-layer graph optimized whole too)
def test_each_copy_reads_its_own_weights_under_its_own_names(bert3):
    _, by_pieces, whole = bert3
    text = graph_text(by_pieces.graph)
    for i in range(3):
        assert f"l{i}_wq" in text and f"l{i}_y" in text or i == 2  # (the last layer's output is the return)
    assert text == graph_text(whole.graph)


def test_a_mask_every_block_reads_is_recomputed_in_each_block_as_whole_fusion_would():
    # the mask's pointwise ops are read by both blocks: each block's kernel computes them again
    layer = """
    s{i} = h{j} @ w{i}
    e{i} = exp(s{i} - max(s{i}, axis=-1, keepdims=true) + mask)
    p{i} = e{i} / sum(e{i}, axis=-1, keepdims=true)
    h{i} = relu(p{i} @ v{i} + h{j}) * 2.0 - 1.0
    t{i} = h{i} + 1.0
    h{i}b = h{i} * t{i} - 0.5
    """
    body = "    mask = where(m > 0.5, 0.0, -1e9)" + "".join(layer.format(i=i, j=f"{i - 1}b") for i in (1, 2, 3))
    params = ", ".join(f"w{i}: f32[16, 16], v{i}: f32[16, 16]" for i in (1, 2, 3))
    g = one_graph(f"graph f(h0b: f32[8, 16], m: f32[16], {params}) -> f32[8, 16] {{{body}    return h3b\n}}")
    pieces = repeats.find(C.unfused(g))
    # the mask's two ops (m > 0.5, where) computed first, then copied into each of the 3 blocks
    assert pieces is not None and [p.copies for p in pieces.pieces] == [0, 2, 2, 2] and pieces.cls == [0, 1, 1, 1]
    r = optimize_graph(g)
    assert r.report["repeats"] is not None
    # no kernel of its own writes the mask: each block's kernels compute it where they read it
    bodies = [[m.op for m in n.body.nodes] for n in r.graph.nodes if n.op == "kernel"]
    assert any("where" in ops for ops in bodies)
    assert all(set(ops) - {"input", "const", "where", "gt"} for ops in bodies)
    xs = rand_inputs(g, {}, seed=2)
    assert_same_values(run(r.graph, xs), run(g, xs))


def test_a_graph_without_a_repeated_block_is_optimized_whole():
    g = one_graph((ROOT / "examples" / "mlp.g").read_text())
    assert repeats.find(C.unfused(g)) is None
    assert optimize_graph(g).report["repeats"] is None
