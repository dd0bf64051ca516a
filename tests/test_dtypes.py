"""i64, i32 and bool tensors: index and mask arithmetic compiled to C, checked against numpy."""

import numpy as np
import pytest
from helpers import ROOT, compile_once, load_text, rand_inputs

import eqfuse
from eqfuse.errors import ArgumentError, EqfuseError
from eqfuse.ir.printer import module_text

MASKS = (ROOT / "tests" / "good" / "masks.g").read_text()
DIMS = {"B": 3, "S": 5}


@pytest.fixture(scope="module")
def reference():
    """The numpy reference of every graph of masks.g."""
    return eqfuse.reference(MASKS)


@pytest.mark.parametrize("graph", [g.name for g in load_text(MASKS)])
def test_mask_and_index_graphs_compile_to_the_reference(reference, graph):
    g = next(g for g in load_text(MASKS) if g.name == graph)
    # (the graph alone, so that a worker or a selection builds only the graphs it tests)
    mod = compile_once(module_text([g]), dims=tuple((d, v) for d, v in DIMS.items() if d in g.dims()))
    for seed in range(3):
        xs = rand_inputs(g, DIMS, seed=seed)
        got, want = getattr(mod, graph)(*xs), getattr(reference, graph)(*xs)
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
    ("graph b(x: u16[4]) -> f32[4] {\n    return x\n}\n", "unknown dtype 'u16'"),
])
def test_dtype_mistakes_are_errors_with_a_position(src, message):
    with pytest.raises(EqfuseError, match=message) as e:
        load_text(src)
    assert e.value.pos is not None


ATTENTION = """graph att(q: f32[2, 4, 24, 16], k: f32[2, 4, 24, 16], v: f32[2, 4, 24, 16], pad: bool[2, 1, 1, 24],
                         causal: bool[1, 1, 24, 24]) -> f32[2, 4, 24, 16] {
    p = softmax((q * 0.5) @ (transpose(k, perm=[0, 1, 3, 2]) * 0.5) + where(logical_and(causal, pad), 0, -inf))
    return where(isnan(p), 0, p) @ v
}
"""


@pytest.mark.heavy  # (the fast tier's time)
def test_the_mask_of_an_exported_attention_is_read_inside_the_attention_kernel():
    """torch's decomposed scaled_dot_product_attention: scales on q and k, an additive
    where(mask, 0, -inf), and where(isnan(p), 0, p) for fully masked rows: one attention kernel
    that reads the bool masks, and zeros (not NaN) for a fully masked row."""
    mod = eqfuse.compile(ATTENTION)
    assert [k.kind for k in mod.kernels] == ["attention"]
    assert "where(logical_and(causal, pad), 0, -inf)" in mod.graph and "zero_nan=true" in mod.graph
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 4, 24, 16)).astype(np.float32) for _ in range(3))
    pad = rng.random((2, 1, 1, 24)) < 0.8
    pad[1] = False  # a sequence that is all padding: every row fully masked
    causal = np.tril(np.ones((24, 24), bool))[None, None]
    got, want = mod(q, k, v, pad, causal), eqfuse.reference(ATTENTION)(q, k, v, pad, causal)
    assert not np.isnan(want).any() and np.all(want[1] == 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rows", ["softmax(x, zero_nan=true)", "softmax(x @ w, zero_nan=true)"])
def test_a_zero_nan_softmax_zeroes_the_rows_that_would_be_nan(rows):
    src = f"graph s(x: f32[6, 32], w: f32[32, 32]) -> f32[6, 32] {{\n    return {rows} * 2\n}}\n"
    x = np.random.default_rng(1).standard_normal((6, 32)).astype(np.float32)
    x[1] = -np.inf
    x[2, 3] = np.nan
    w = np.eye(32, dtype=np.float32)
    got, want = eqfuse.compile(src)(x, w), eqfuse.reference(src)(x, w)
    assert np.all(want[1] == 0) and np.all(want[2] == 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_inf_and_nan_are_literals_that_print_and_parse_back():
    from eqfuse.ir.printer import graph_text

    g = load_text("graph g(m: bool[2], x: f32[2]) -> f32[2] {\n    return where(m, x, -inf) + nan * 0\n}\n")[0]
    assert "-inf" in graph_text(g) and graph_text(load_text(graph_text(g))[0]) == graph_text(g)


@pytest.mark.heavy
@pytest.mark.parametrize("S, D", [(8, 16), (128, 64)])  # the portable path, and the AVX-512 one
def test_a_fully_masked_attention_row_is_nan_as_in_numpy_without_the_guard(S, D):
    src = (f"graph a(q: f32[1, {S}, {D}], k: f32[1, {S}, {D}], v: f32[1, {S}, {D}], m: bool[1, {S}, {S}]) "
           f"-> f32[1, {S}, {D}] {{\n    return softmax(where(m, q @ transpose(k, perm=[0, 2, 1]), -inf)) @ v\n}}\n")
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, S, D)).astype(np.float32) for _ in range(3))
    m = rng.random((1, S, S)) < 0.6
    m[0, 3] = False
    mod = eqfuse.compile(src)
    assert [kk.kind for kk in mod.kernels] == ["attention"]
    got, want = mod(q, k, v, m), eqfuse.reference(src)(q, k, v, m)
    assert np.isnan(want[0, 3]).all() and np.isnan(got[0, 3]).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_integer_division_truncates_and_never_traps():
    """Issue 29: an i64 `/` truncates (as C and ONNX's Div); x / 0 is 0 and INT64_MIN / -1 wraps, in
    the reference and in the C (whose own division raised SIGFPE and killed the process). A
    literal divisor next to an integer tensor is an integer; floats divide as numpy."""
    src = """graph f(a: i64[8], b: i64[8], x: f32[4], y: f32[4]) -> (i64[8], i64[8], i64[8], f32[4]) {
        return a / b, a / 0, a / -2, x / y
    }"""
    lo = -9223372036854775808
    a = np.array([7, -7, 7, -7, 0, 5, lo, lo], np.int64)
    b = np.array([2, 2, -2, -2, 3, 0, -1, 1], np.int64)
    x = np.array([1.0, -1.0, 0.0, 3.0], np.float32)
    y = np.array([0.0, -0.0, 0.0, 2.0], np.float32)
    want = ([3, -3, -3, 3, 0, 0, lo, lo], [0] * 8, [-3, 3, -3, 3, 0, -2, 2 ** 62, 2 ** 62], [np.inf, np.inf, np.nan, 1.5])
    for got in (eqfuse.reference(src)(a, b, x, y), eqfuse.compile(src)(a, b, x, y)):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, np.asarray(w, g.dtype))


def test_floordiv_and_mod_floor_like_numpy_and_never_trap():
    """Integer division in C truncates and traps on 0; floordiv and mod floor like numpy and give
    0 for a zero divisor (also INT64_MIN // -1, which overflows in C)."""
    src = """graph f(a: i64[10], b: i64[10], x: f32[4], y: f32[4]) -> (i64[10], i64[10], f32[4], f32[4]) {
        return floordiv(a, b), mod(a, b), floordiv(x, y), mod(x, y)
    }"""
    a = np.array([7, -7, 7, -7, 0, 5, -9223372036854775808, -9223372036854775808, 3, -3], np.int64)
    b = np.array([2, 2, -2, -2, 3, 0, -1, 1, 0, 1], np.int64)
    x = np.array([7.5, -7.5, 7.5, -0.5], np.float32)
    y = np.array([2.0, 2.0, -2.0, 0.25], np.float32)
    q, r, fq, fr = eqfuse.compile(src)(a, b, x, y)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(q, np.floor_divide(a, b))
        np.testing.assert_array_equal(r, np.remainder(a, b))
    np.testing.assert_allclose(fq, np.floor_divide(x, y))
    np.testing.assert_allclose(fr, np.remainder(x, y), atol=1e-6)
