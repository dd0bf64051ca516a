"""i64, i32 and bool tensors: index and mask arithmetic compiled to C, checked against numpy."""

import numpy as np
import pytest

import eqfuse
from eqfuse.errors import ArgumentError, EqfuseError
from helpers import ROOT, load_text, rand_inputs

MASKS = (ROOT / "tests" / "good" / "masks.g").read_text()
DIMS = {"B": 3, "S": 5}


@pytest.fixture(scope="module")
def masks():
    return eqfuse.compile(MASKS, dims=DIMS), eqfuse.reference(MASKS)


@pytest.mark.parametrize("graph", [g.name for g in load_text(MASKS)])
def test_mask_and_index_graphs_compile_to_the_reference(masks, graph):
    mod, ref = masks
    g = next(g for g in load_text(MASKS) if g.name == graph)
    for seed in range(3):
        xs = rand_inputs(g, DIMS, seed=seed)
        got, want = getattr(mod, graph)(*xs), getattr(ref, graph)(*xs)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape
            if a.dtype == np.float32:
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True)
            else:
                np.testing.assert_array_equal(a, b)


def test_a_mask_fuses_into_the_float_kernel_that_reads_it():
    src = ("graph m(ids: i64[B, S], s: f32[B, S]) -> f32[B, S] {\n"
           "    return where(ids != 0, s * 2, -1e9)\n}\n")
    mod = eqfuse.compile(src, dims={"B": 2, "S": 7})
    assert [k.kind for k in mod.kernels] == ["pointwise"]
    ids = np.array([[0, 3, 4, 0, 1, 1, 0], [5, 0, 0, 2, 2, 0, 9]], np.int64)
    s = np.random.default_rng(0).standard_normal((2, 7)).astype(np.float32)
    np.testing.assert_array_equal(mod(ids, s), np.where(ids != 0, s * 2, np.float32(-1e9)))


def test_integer_arithmetic_is_exact_beyond_float_precision():
    mod = eqfuse.compile("graph p(i: i64[4]) -> i64[4] {\n    return i * 3 + 1\n}\n")
    i = np.array([2 ** 40 + 1, -7, 0, 123456789012], np.int64)
    np.testing.assert_array_equal(mod(i), i * 3 + 1)


def test_an_i32_array_where_i64_is_declared_names_the_parameter():
    mod = eqfuse.compile("graph p(ids: i64[4], m: bool[4]) -> i64[4] {\n    return where(m, ids, 0)\n}\n")
    with pytest.raises(ArgumentError, match="parameter 'ids' expects dtype int64.*got int32"):
        mod(np.arange(4, dtype=np.int32), np.ones(4, bool))
    with pytest.raises(ArgumentError, match="parameter 'm' expects dtype bool"):
        mod(np.arange(4, dtype=np.int64), np.ones(4, np.float32))


def test_a_gather_index_out_of_range_is_an_error_not_a_read_past_the_table():
    mod = eqfuse.compile("graph e(t: f32[10, 4], ids: i64[3]) -> f32[3, 4] {\n    return gather(t, ids)\n}\n")
    t = np.ones((10, 4), np.float32)
    np.testing.assert_array_equal(mod(t, np.array([9, -1, 0], np.int64)), np.ones((3, 4), np.float32))
    with pytest.raises(ArgumentError, match="out of range in gather"):
        mod(t, np.array([1, 10, 0], np.int64))


@pytest.mark.parametrize("src, message", [
    ("graph b(x: f32[4], i: i64[4]) -> f32[4] {\n    return x + i\n}\n", "add mixes dtypes f32, i64"),
    ("graph b(i: i64[4]) -> f32[4] {\n    return exp(i)\n}\n", "exp needs f32 tensors, got i64"),
    ("graph b(x: f32[4]) -> f32[4] {\n    return where(x, x, 0)\n}\n", "where needs a bool condition"),
    ("graph b(x: f32[4], t: f32[4]) -> f32[4] {\n    return gather(t, x)\n}\n", "gather needs integer index"),
    ("graph b(x: u8[4]) -> f32[4] {\n    return x\n}\n", "unknown dtype 'u8'"),
])
def test_dtype_mistakes_are_errors_with_a_position(src, message):
    with pytest.raises(EqfuseError, match=message) as e:
        load_text(src)
    assert e.value.pos is not None
