"""Kernels whose C is the same but for the name are compiled once (eqfuse.backend.emit,
share=True): the run function calls the first of them with each one's own arrays."""

from __future__ import annotations

import numpy as np

import eqfuse
from eqfuse.backend.emit import emit_graph
from eqfuse.frontend.load import load
from eqfuse.pipeline import lower, optimize

TWO_LAYERS = """
graph two(x: f32[8, 64], w1: f32[64, 64], b1: f32[64], w2: f32[64, 64], b2: f32[64]) -> f32[8, 64] {
    h = relu(x @ w1 + b1)
    return relu(h @ w2 + b2)
}
"""


def test_identical_layers_share_one_kernel_with_their_own_weights():
    g = load(TWO_LAYERS)[0]
    opt, _ = optimize(g)
    _, _, plans = lower(opt, {}, params=frozenset({"w1", "w2"}))
    shared = emit_graph(plans, share=True)
    alone = emit_graph(plans)
    names = [p.name for p in plans if p.kind != "view"]
    assert len(names) == 2 and shared.alias == {names[1]: names[0]} and not alone.alias
    assert shared.source.count(f"void {names[0]}(") == 1 and f"void {names[1]}(" not in shared.source
    assert len([p for p in plans if p.prepack]) == 2  # each layer packs its own weights (with the first's function)

    rng = np.random.default_rng(0)
    w = {n: rng.standard_normal(t.shape).astype(np.float32) * 0.2 for n, t in g.params[1:]}
    mod = eqfuse.compile(TWO_LAYERS, params=w)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    want = np.maximum(np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"] + w["b2"], 0)
    np.testing.assert_allclose(mod(x), want, rtol=1e-4, atol=1e-4)
    assert [k.name for k in mod.kernels] == names  # every kernel is still listed, with its C
    assert mod.kernels[1].c_source == mod.kernels[0].c_source


# two layers alike but for their scales (as a quantized model's are), and one whose literal both
# layers have alike
SCALED = """
graph scaled(x: f32[8, 64], w1: f32[64, 64], w2: f32[64, 64]) -> f32[8, 64] {
    h = relu(x @ w1) * 0.171875 + 3.0
    return relu(h @ w2) * 0.671875 + 3.0
}
"""


def test_layers_apart_only_by_a_literal_share_one_kernel_with_the_literal_an_input():
    from eqfuse.backend.literals import lift_literals
    from eqfuse.backend.lower import kernelize

    g = load(SCALED)[0]
    opt, _ = optimize(g)
    kg, plans = lower(opt, {}, params=frozenset({"w1", "w2"}))[1:]
    kernels = [n for n in kg.nodes if n.op == "kernel"]
    assert len(kernels) == 2
    # the scale is each kernel's input, read from a const of the kernelized graph; 3.0 stays a literal
    lits = [[kg.nodes[a].value for a in k.args if kg.nodes[a].op == "const"] for k in kernels]
    assert lits == [[0.171875], [0.671875]]
    assert all(not any(n.op == "const" and n.value in (0.171875, 0.671875) for n in k.body.nodes) for k in kernels)
    assert all(any(n.op == "const" and n.value == 3.0 for n in k.body.nodes) for k in kernels)
    shared = emit_graph(plans, share=True)
    names = [p.name for p in plans if p.kind != "view"]
    assert shared.alias == {names[1]: names[0]} and "0.171875" not in shared.source and "0.671875" not in shared.source
    # nothing to lift: the same graph back
    one = kernelize(load(TWO_LAYERS)[0])
    assert lift_literals(one)[0] is one

    rng = np.random.default_rng(1)
    w = {n: rng.standard_normal(t.shape).astype(np.float32) * 0.2 for n, t in g.params[1:]}
    mod = eqfuse.compile(SCALED, params=w)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    want = np.maximum((np.maximum(x @ w["w1"], 0) * 0.171875 + 3.0) @ w["w2"], 0) * 0.671875 + 3.0
    np.testing.assert_allclose(mod(x), want, rtol=1e-4, atol=1e-4)
    assert len({k.c_source for k in mod.kernels}) == 1
