"""Row kernels whose prologue and epilogue both read tensors, compiled and checked against the reference.

Regression: a row reduction (sum/mean/max over trailing axes) declares the hoisted row offsets
of its prologue (over the input's rows) and of its epilogue (over the output) in the same C
scope. Both were numbered off0, off1, ... from zero, so `mean(x, axis=-1, keepdims=true) + c`
failed in the C compiler with "redefinition of 'off0'" (the ONNX LayerNormalization expansion,
and any per-row statistic combined with another per-row tensor, has this shape). Offsets are now
numbered per kernel.
"""

import re

import numpy as np
import pytest

import eqfuse
from eqfuse.runtime.verify import compare

# Each graph is one kernel block: a row reduction whose epilogue reads a per-row tensor.
ROWS = """
graph smallest(x: f32[R, L], c: f32[R, 1]) -> f32[R, 1] {
    return kernel { mean(x, axis=-1, keepdims=true) + c }
}

graph no_keepdims(x: f32[R, L], c: f32[R]) -> f32[R] {
    return kernel { sum(x * x, axis=-1) * c }
}

graph same_tensor_two_views(x: f32[R, L], c: f32[R, 1]) -> f32[R, 1] {
    return kernel { max(x * c, axis=-1, keepdims=true) - c }
}

graph variance(x: f32[R, L], m: f32[R, 1]) -> f32[R, 1] {
    return kernel { sqrt(mean(x * x, axis=-1, keepdims=true) - m * m + 1e-05) }
}

graph two_axes(x: f32[R, 3, L], c: f32[R, 1, 1]) -> f32[R, 1, 1] {
    return kernel { mean(x - c, axis=[1, 2], keepdims=true) + c }
}
"""

GRAPHS = ["smallest", "no_keepdims", "same_tensor_two_views", "variance", "two_axes"]
# (R, L; the last in the extended tier: the suite's time)
SHAPES = [(1, 1), (5, 7), (3, 127), pytest.param(17, 33, marks=pytest.mark.extended)]


def offset_names_unique(c_source: str) -> bool:
    """Every function of a kernel's C declares each hoisted offset name once."""
    for fn in re.split(r"\n(?=void )", c_source):
        names = re.findall(r"const long (off\d+) =", fn)
        if len(names) != len(set(names)):
            return False
    return True


def inputs(graph: str, R: int, L: int, rng) -> list[np.ndarray]:
    shapes = {"smallest": [(R, L), (R, 1)], "no_keepdims": [(R, L), (R,)],
              "same_tensor_two_views": [(R, L), (R, 1)], "variance": [(R, L), (R, 1)],
              "two_axes": [(R, 3, L), (R, 1, 1)]}[graph]
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    if graph == "variance":  # m is the rows' mean, as in a layernorm, so the variance is >= 0
        xs[1] = xs[0].mean(axis=-1, keepdims=True)
    return xs


@pytest.mark.heavy
@pytest.mark.parametrize("R,L", SHAPES)
def test_row_reduction_with_epilogue_reads(R, L):
    mod = eqfuse.compile(ROWS, dims={"R": R, "L": L}, fuse="manual")
    ref = eqfuse.reference(ROWS)
    rng = np.random.default_rng(R * 1000 + L)
    for name in GRAPHS:
        xs = inputs(name, R, L, rng)
        got, want = getattr(mod, name)(*xs), getattr(ref, name)(*xs)
        assert compare([got], [want]) == [], (name, R, L)
    assert all(offset_names_unique(k.c_source) for k in mod.kernels)


def test_optimizer_fuses_the_smallest_graph_into_one_row_kernel():
    src = """
graph f(x: f32[R, L], c: f32[R, 1]) -> f32[R, 1] {
    return mean(x, axis=-1, keepdims=true) + c
}
"""
    mod = eqfuse.compile(src, dims={"R": 9, "L": 31})
    assert [k.kind for k in mod.kernels] == ["row"]
    rng = np.random.default_rng(0)
    x, c = rng.standard_normal((9, 31)).astype(np.float32), rng.standard_normal((9, 1)).astype(np.float32)
    assert compare([mod(x, c)], [eqfuse.reference(src)(x, c)]) == []
