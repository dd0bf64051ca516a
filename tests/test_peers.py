"""The torch peer of `eqfuse bench`: every op of the op table has a torch entry that agrees with
the numpy reference, so a peer column in a benchmark table computes the same graph."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import EXAMPLES, one_graph, rand_inputs, run
from test_reference import OP_SEMANTICS

from eqfuse.cli.peers import TORCH, torch_function
from eqfuse.ir.ops import OPS

torch = pytest.importorskip("torch")


def test_every_op_has_a_torch_entry():
    assert set(TORCH) == set(OPS)


def _check(g, dims=None, rtol=1e-4, atol=1e-5):
    xs = rand_inputs(g, dims, seed=3)
    for i, (name, _) in enumerate(g.params):
        if name == "p":
            xs[i] = np.abs(xs[i]) + np.float32(0.25)
    want = run(g, xs)
    got = torch_function(g)(*[torch.from_numpy(x) for x in xs])
    got = [got] if isinstance(got, torch.Tensor) else list(got)
    for w, o in zip(want, got):
        np.testing.assert_allclose(o.numpy(), w, rtol=rtol, atol=atol)


@pytest.mark.parametrize("op", sorted(OP_SEMANTICS))
def test_torch_op_matches_the_reference(op):
    params, call, _ = OP_SEMANTICS[op]
    _check(one_graph(f"graph g({params}) {{\n    return {call}\n}}\n"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_torch_runs_the_examples(path):
    from eqfuse.frontend.load import load

    for g in load(path):
        _check(g, {"B": 2}, rtol=1e-3, atol=1e-4)


def test_read_only_inputs_reach_torch_without_a_warning():
    # an ONNX model's initializers are read-only arrays; torch warns when it wraps one
    pytest.importorskip("torch")
    import warnings

    from eqfuse.cli.peers import torch_peers

    g = one_graph("graph g(a: f32[4], b: f32[4]) -> f32[4] {\n return a * b\n}\n")
    a, b = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    b.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ((_, eager),) = torch_peers(g, [a, b], compiled=False)
        assert np.array_equal(eager(1), a)
