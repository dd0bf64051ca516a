"""eqfuse.ir.live.pick_row: a result cut to the one row an input picks at run time (eqfuse.generate's
prompt chunks compute their logits at one row), checked against the numpy reference of the graph
as written, at every row."""

from __future__ import annotations

import numpy as np
import pytest

from eqfuse.errors import EqfuseError
from eqfuse.frontend.load import load
from eqfuse.ir.live import pick_row
from eqfuse.ir.reference import evaluate

# an LM head after a norm, then a soft cap (Gemma 2's final_logit_softcapping): row-wise along axis 1
HEAD = """
graph head(h: f32[2, 6, 8], g: f32[8], w: f32[8, 5], cap: f32[]) -> f32[2, 6, 5] {
    n = rmsnorm(h, g, eps=1e-5)
    return tanh((n @ w) / cap) * cap
}
"""
# a softmax over the rows' axis mixes the rows: the result itself is gathered
MIXED = """
graph mixed(h: f32[2, 6, 8], w: f32[8, 5]) -> f32[2, 6, 5] {
    return softmax(h @ w, axis=1)
}
"""
# the matmul's right operand holds the rows too (a batched matmul): not a row-wise LM head
BATCHED = """
graph batched(h: f32[2, 6, 8], w: f32[2, 8, 5]) -> f32[2, 6, 5] {
    return h @ w
}
"""


def arrays_of(g, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.asarray(rng.uniform(0.5, 1.5, t.shape), np.float32) for _, t in g.params]


@pytest.mark.parametrize("src", [HEAD, MIXED, BATCHED])
def test_the_picked_row_is_that_row_of_the_result(src):
    (g,) = load(src)
    picked = pick_row(g, "row")
    assert [n for n, _ in picked.params] == [n for n, _ in g.params] + ["row"]
    arrays = arrays_of(g)
    (whole,) = evaluate(g, arrays)
    for r in range(whole.shape[1]):
        (one,) = evaluate(picked, arrays + [np.array([r], np.int64)])
        assert one.shape == (2, 1, 5)
        np.testing.assert_allclose(one[:, 0], whole[:, r], rtol=1e-6, atol=1e-7)


def test_the_gather_goes_before_a_row_wise_lm_head():
    """The matmul reads the gathered row (so it computes one row), the ops after it follow, and the
    matmul over every row is gone; where the rows mix or the matmul is batched, the result is
    gathered."""
    (g,) = load(HEAD)
    picked = pick_row(g, "row")
    (mm,) = [n for n in picked.nodes if n.op == "matmul"]
    assert picked.nodes[mm.args[0]].op == "gather" and picked.nodes[mm.args[0]].type.shape == (2, 1, 8)
    assert picked.nodes[picked.outputs[0]].op == "mul"
    for src in (MIXED, BATCHED):
        (g,) = load(src)
        picked = pick_row(g, "row")
        assert picked.nodes[picked.outputs[0]].op == "gather"


def test_an_input_of_that_name_is_refused():
    (g,) = load(HEAD)
    with pytest.raises(EqfuseError, match="already has an input named 'cap'"):
        pick_row(g, "cap")
