"""The reduce kind over any axes: csrc_templates/reduce.c's five loops, each over a run of kept
or reduced axes (kinds.reduce.loop_runs), against the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import eqfuse
from eqfuse.backend.kinds.reduce import LOOPS, loop_runs


def _check(shape, axes, op="sum"):
    dims = ", ".join(map(str, shape))
    out = [n for k, n in enumerate(shape) if k not in axes] or [1]
    src = f"""graph r(x: f32[{dims}]) -> f32[{", ".join(map(str, out))}] {{
  return {op}(x * 2 - 1, axis={list(axes)}) + 1
}}"""
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    mod = eqfuse.compile(src)
    got = mod(x)
    np.testing.assert_allclose(got, eqfuse.reference(src)(x).reshape(got.shape), rtol=1e-5, atol=1e-5)
    return mod


def test_runs_group_adjacent_axes_and_pad_the_outer_loops():
    assert loop_runs((5, 9, 13), (1,)) == (((), False), ((), False), ((0,), False), ((1,), True), ((2,), False))
    # an axis of 1 belongs to no run: axes 0, 2 and 3 reduced are one run
    assert loop_runs((4, 1, 3, 2), (0, 2, 3)) == (((), False),) * 4 + (((0, 2, 3), True),)
    # more runs than loops: g0 walks the outer ones together
    runs = loop_runs((2, 3, 2, 3, 2, 3, 2), (1, 3, 5))
    assert len(runs) == LOOPS and runs[0] == ((0, 1, 2), None) and runs[-1] == ((6,), False)


@pytest.mark.parametrize("shape, axes, op", [
    ((5, 9, 13), (1,), "sum"),          # kept, reduced, kept: the output updated as a vector
    ((6, 7, 5, 5), (0, 2, 3), "max"),   # a channel reduction: reduced, kept, reduced
    ((2, 3, 2, 3, 2, 3), (1, 3, 5), "sum"),      # six runs: g0 walks two of them
    ((2, 3, 2, 3, 2, 3, 2), (1, 3, 5), "min"),   # seven runs, the innermost kept
    ((64, 128, 3), (0,), "mean"),       # large enough to split over threads
])
def test_reductions_over_alternating_axes_match_the_reference(shape, axes, op):
    mod = _check(shape, axes, op)
    assert "reduce" in [k.kind for k in mod.kernels]


@pytest.mark.extended  # (the suite's budget: the reductions over alternating axes run in the default run)
@settings(max_examples=8, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=2, max_size=6).flatmap(
    lambda s: st.tuples(st.just(tuple(s)), st.sets(st.integers(0, len(s) - 1), min_size=1, max_size=len(s) - 1))))
def test_random_reductions_match_the_reference(case):
    shape, axes = case
    _check(shape, tuple(sorted(axes)))
