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
