"""NaN and infinities follow numpy: max reductions, softmax and attention propagate them.

Each kernel kind that takes a maximum (row reductions, strided reductions, softmax, flash
attention, maximum/minimum) runs on inputs with NaN or +-inf in some rows and none in others,
and must give numpy's NaN where numpy does and the same values elsewhere.
"""

import numpy as np
import pytest
from helpers import selected_params

import eqfuse
from eqfuse.frontend.load import load
from eqfuse.ir.reference import evaluate
from eqfuse.runtime.verify import compare

CASES = [
    ("max-row", "max(x, axis=-1)"),
    ("max-row-keepdims-epilogue", "max(x * 2, axis=-1, keepdims=true) + 1"),
    ("max-all", "max(x)"),
    ("max-axis0", "max(x, axis=0)"),
    ("max-outer-inner", "max(x3, axis=[0, 2], keepdims=true)"),
    ("max-middle", "max(x3, axis=1)"),
    ("min-as-neg-max", "-max(-x, axis=-1)"),
    ("softmax", "softmax(x)"),
    ("softmax-axis0", "softmax(x, axis=0)"),
    ("maximum", "maximum(x, y)"),
    ("minimum", "minimum(x, y)"),
    ("relu", "relu(x)"),
    ("attention", "softmax(q @ transpose(k, perm=[0, 2, 1]) * 0.125) @ v"),
    ("attention-64", "softmax(q6 @ transpose(k6, perm=[0, 2, 1]) * 0.125) @ v6"),
]
SHAPES = {"x": (9, 67), "y": (9, 67), "x3": (3, 21, 5), "q": (2, 13, 16), "k": (2, 70, 16), "v": (2, 70, 8),
          "q6": (2, 37, 64), "k6": (2, 100, 64), "v6": (2, 100, 64)}


def poisoned(shape, rng, special):
    """Standard normal, with `special` (NaN or an infinity) at one element of every third row, and
    in the whole last row."""
    a = rng.standard_normal(shape).astype(np.float32)
    flat = a.reshape(-1, shape[-1])
    for r in range(0, flat.shape[0], 3):
        flat[r, rng.integers(shape[-1])] = special
    flat[-1] = special  # and one row of nothing else
    return a


@pytest.fixture(scope="module", params=[np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def results(request):
    # the cases this run tests (the fast tier's first: all 14 took 1.5 s to compile)
    chosen = selected_params(request, "test_special_values_as_numpy", "cid")
    cases = [c for c in CASES if c[0] in chosen] or CASES
    lines = [f"    out_{i} = kernel {{ {e} }}" for i, (_, e) in enumerate(cases)]
    sig = ", ".join(f"{p}: f32[{', '.join(map(str, s))}]" for p, s in SHAPES.items())
    src = f"graph nans({sig}) {{\n" + "\n".join(lines) + f"\n    return {', '.join(f'out_{i}' for i in range(len(cases)))}\n}}\n"
    rng = np.random.default_rng(7)
    arrays = [poisoned(s, rng, request.param) for s in SHAPES.values()]
    got = eqfuse.compile(src, fuse="manual")(*arrays)
    got = got if isinstance(got, tuple) else (got,)  # (one case: one result)
    with np.errstate(all="ignore"):
        want = evaluate(load(src)[0], arrays)
    return {cid: (g, w) for (cid, _), g, w in zip(cases, got, want)}


@pytest.mark.parametrize("cid", [c for c, _ in CASES])
def test_special_values_as_numpy(results, cid):
    g, w = results[cid]
    assert np.array_equal(np.isnan(g), np.isnan(w)), f"{cid}: NaN at {np.argwhere(np.isnan(g) != np.isnan(w))[:5]}"
    assert compare([g], [w]) == [], cid


def test_max_of_a_vector_with_nan():
    mod = eqfuse.compile("graph g(a: f32[N]) -> f32 {\n return max(a)\n}\n")
    assert np.isnan(mod(np.array([1, np.nan, 2], np.float32)))
