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


def _decoder_step(layers: int) -> str:
    """A decode step of `layers` attention layers with a KV cache each (tests/decode_step.g's
    layer, repeated)."""
    params = ", ".join(f"pk{i}: f32[2, 4, P, 16], pv{i}: f32[2, 4, P, 16], wq{i}: f32[64, 64], "
                       f"wk{i}: f32[64, 64], wv{i}: f32[64, 64], wo{i}: f32[64, 64]" for i in range(layers))
    body, outs = [], []
    for i in range(layers):
        x = f"h{i - 1}" if i else "x"
        heads = "shape=[-1, 1, 4, 16]), perm=[0, 2, 1, 3])"
        body += [f"q{i} = transpose(reshape({x} @ wq{i}, {heads}",
                 f"k{i} = concat(pk{i}, transpose(reshape({x} @ wk{i}, {heads}, axis=2)",
                 f"v{i} = concat(pv{i}, transpose(reshape({x} @ wv{i}, {heads}, axis=2)",
                 f"a{i} = softmax(q{i} @ transpose(k{i}, perm=[0, 1, 3, 2]) * 0.25, axis=-1) @ v{i}",
                 f"h{i} = {x} + reshape(transpose(a{i}, perm=[0, 2, 1, 3]), shape=[-1, 1, 64]) @ wo{i}"]
        outs += [f"k{i}", f"v{i}"]
    lines = "\n    ".join(body)
    return f"graph step(x: f32[2, 1, 64], {params}) {{\n    {lines}\n    return h{layers - 1}, {', '.join(outs)}\n}}\n"


@pytest.mark.heavy  # (the fast tier's time)
def test_a_decode_step_with_caches_in_place_is_cut_into_its_layers():
    """live= reads each cache through a slice of its buffer (eqfuse.ir.live); each slice is
    written in its own layer, so the layers stay equal pieces and are optimized once. (Beside the
    inputs, every layer's slice was a tensor made before the first block and read by one layer
    only: no cut was clean, the whole step went into one e-graph and, on a slow machine, its
    time limit left a 20-layer Llama's attentions unrecognized, which live= refuses.)"""
    from eqfuse.ir.live import cache_graph

    g = one_graph(_decoder_step(4).replace("P", "8"))
    live = cache_graph(g, {f"p{n}{i}": 2 for i in range(4) for n in "kv"}, "t")
    for i, n in enumerate(live.nodes):
        if n.op == "slice":
            assert live.nodes[i + 1].op == "concat" and live.nodes[i + 1].args[0] == i
    pieces = repeats.find(C.unfused(live))
    assert pieces is not None and pieces.copies >= 3, pieces
    step = __import__("eqfuse").compile(_decoder_step(4), dims={"P": 8}, live="P")
    assert "optimized once per class" in str(step.report["repeats"])
