"""Random graphs from hypothesis, optimized, compiled to C and run: every output matches the
numpy reference of the unoptimized graph. This is the end-to-end property of the product; the
graphs mix broadcasting pointwise chains, contractions (plain and x @ transpose(w)), row ops,
reductions with keepdims and several outputs, at sizes that are not multiples of any tile."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_reads_alive, one_graph, rand_inputs, run
from hypothesis import example, given, settings
from hypothesis import strategies as st

import eqfuse

UNARY = ["relu", "tanh", "sigmoid", "gelu", "silu", "abs", "neg", "exp(tanh({x}))", "sqrt(abs({x}) + 1)"]
BINARY = ["+", "-", "*", "maximum"]
ROW = ["softmax({x})", "layernorm({x}, g, be)", "rmsnorm({x}, g)", "{x} - mean({x}, axis=-1, keepdims=true)",
       "{x} / (sum(abs({x}), axis=0, keepdims=true) + 1)", "max({x}, axis=-1, keepdims=true) * {x}"]
MATMUL = ["{x} @ w", "{x} @ transpose(w)", "tanh({x}) @ w * 0.5"]


def draw_lines(draw, count: int) -> tuple[list[str], list[str]]:
    """(names, lines): `count` random statements t0, t1, ... over a and b (and c, w, g, be), each
    a pointwise op, a row op or a contraction; names holds a, b and every t."""
    names, lines = ["a", "b"], []
    for i in range(count):
        kind = draw(st.sampled_from(["u", "b", "b", "row", "mm"]))
        x = draw(st.sampled_from(names))
        if kind == "u":
            u = draw(st.sampled_from(UNARY))
            e = u.format(x=x) if "{x}" in u else f"{u}({x})"
        elif kind == "row":
            e = draw(st.sampled_from(ROW)).format(x=x)
        elif kind == "mm":
            e = draw(st.sampled_from(MATMUL)).format(x=x)
        else:
            y = draw(st.sampled_from(names + ["c", "0.5"]))
            op = draw(st.sampled_from(BINARY))
            e = f"maximum({x}, {y})" if op == "maximum" else f"{x} {op} {y}"
        lines.append(f"    t{i} = {e}")
        names.append(f"t{i}")
    return names, lines


@st.composite
def random_model(draw):
    n, m = draw(st.sampled_from([1, 3, 7])), draw(st.sampled_from([5, 16, 33]))
    names, lines = draw_lines(draw, draw(st.integers(2, 6)))
    outs = sorted(set(draw(st.lists(st.sampled_from(names[2:]), min_size=1, max_size=2))) | {names[-1]})
    sig = ", ".join(f"f32[{n}, {m}]" for _ in outs)
    return (f"graph r(a: f32[{n}, {m}], b: f32[{n}, {m}], c: f32[{m}], w: f32[{m}, {m}], g: f32[{m}], "
            f"be: f32[{m}]) -> ({sig}) {{\n" + "\n".join(lines) + f"\n    return {', '.join(outs)}\n}}\n")


@settings(max_examples=12, deadline=None)
@given(random_model(), st.sampled_from([True, False]))
# found by hypothesis: a reduction over an axis of size 1 whose epilogue reads its prologue
@example(src="graph r(a: f32[1, 5], b: f32[1, 5], c: f32[5], w: f32[5, 5], g: f32[5], be: f32[5]) -> "
             "(f32[1, 5], f32[1, 5]) {\n    t0 = relu(a)\n    t1 = relu(a)\n    t2 = relu(t0)\n"
             "    t3 = maximum(t1, t1)\n    t4 = t3 / (sum(abs(t3), axis=0, keepdims=true) + 1)\n"
             "    return t0, t4\n}\n", fuse=True)
@pytest.mark.heavy
def test_random_graphs_compile_and_match_the_reference(src, fuse):
    g = one_graph(src)
    xs = rand_inputs(g, seed=5)
    want = run(g, xs)
    mod = eqfuse.compile(src, fuse=fuse)
    got = mod(*xs)
    assert_reads_alive(mod)
    got = [got] if isinstance(got, np.ndarray) else list(got)
    assert len(got) == len(want)
    for o, w in zip(got, want):
        assert o.shape == w.shape and o.dtype == np.float32
        np.testing.assert_allclose(o, w, rtol=1e-3, atol=1e-4, err_msg=src)


@pytest.mark.heavy
@settings(max_examples=8, deadline=None)
@given(random_model(), st.sets(st.sampled_from(["w", "b", "c", "g", "be"]), min_size=1))
def test_random_graphs_with_bound_params_match_the_reference(src, bound):
    """Some parameters bound by params= (constants: folded, and a bound GEMM weight prepacked);
    two calls, the second reusing what the first packed."""
    g = one_graph(src)
    xs = rand_inputs(g, seed=9)
    names = [n for n, _ in g.params]
    want = run(g, xs)
    mod = eqfuse.compile(src, params={n: x for n, x in zip(names, xs) if n in bound})
    free = [x for n, x in zip(names, xs) if n not in bound]
    for _ in range(2):
        got = mod(*free)
        got = [got] if isinstance(got, np.ndarray) else list(got)
        for o, w in zip(got, want):
            np.testing.assert_allclose(o, w, rtol=1e-3, atol=1e-4, err_msg=f"{src} bound={sorted(bound)}")


def test_unused_parameters_do_not_change_the_result():
    """Found by the property above: with four unused parameters the e-graph loaded `b + 0.5` as
    `0.5 + 0.5` (egglog resolved the global `$n1` to `$n11`); the names are now prefix-free."""
    src = ("graph r(a: f32[1, 5], b: f32[1, 5], c: f32[5], w: f32[5, 5], g: f32[5], be: f32[5]) -> "
           "(f32[1, 5], f32[1, 5]) {\n    t0 = relu(b)\n    t1 = tanh(b) @ w * 0.5\n    t2 = b + 0.5\n"
           "    return t0, t2\n}\n")
    from eqfuse.optimizer.optimize import optimize_graph

    g = one_graph(src)
    xs = rand_inputs(g, seed=1)
    want = run(g, xs)
    got = run(optimize_graph(g).graph, xs)
    for o, w in zip(got, want):
        np.testing.assert_allclose(o, w, rtol=1e-6)


@st.composite
def random_typed_model(draw):
    """Graphs over rank-3 tensors whose ops change shapes: batched and transposed contractions,
    attention, layout ops (transpose, slice, concat, reshape), reductions, row ops."""
    B, n, m = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 4, 9])), draw(st.sampled_from([3, 8, 17]))
    vals = {"a": (B, n, m), "b": (B, n, m), "c": (m,), "w": (m, m), "g": (m,), "be": (m,)}
    lines = []
    for i in range(draw(st.integers(2, 6))):
        x = draw(st.sampled_from([k for k, s in vals.items() if len(s) == 3]))
        s = vals[x]
        same = [k for k, t in vals.items() if t == s or t == (s[-1],)] + ["0.5"]
        options = ["unary", "binary", "reduce", "transpose", "concat", "reshape"]
        if s[-1] == m:
            options += ["matmul", "row", "row"]
        if s[-1] > 2:
            options.append("slice")
        if sum(t == s for t in vals.values()) >= 2:
            options += ["bmm_t", "attention"]
        kind = draw(st.sampled_from(options))
        if kind == "unary":
            u = draw(st.sampled_from(UNARY))
            e, t = (u.format(x=x) if "{x}" in u else f"{u}({x})"), s
        elif kind == "binary":
            e, t = f"{x} {draw(st.sampled_from(['+', '-', '*']))} {draw(st.sampled_from(same))}", s
        elif kind == "reduce":
            ax = draw(st.sampled_from([1, 2]))
            e, t = f"{x} - mean({x}, axis={ax}, keepdims=true)", s
        elif kind == "transpose":
            e, t = f"transpose({x}, perm=[0, 2, 1])", (s[0], s[2], s[1])
        elif kind == "concat":
            e, t = f"concat({x}, {x}, axis=1)", (s[0], 2 * s[1], s[2])
        elif kind == "reshape":
            e, t = f"reshape({x}, shape=[{s[0]}, {s[2]}, {s[1]}])", (s[0], s[2], s[1])
        elif kind == "slice":
            e, t = f"slice({x}, axis=2, start=1, stop={s[2] - 1})", (s[0], s[1], s[2] - 2)
        elif kind == "matmul":
            e, t = draw(st.sampled_from(["{x} @ w + c", "relu({x} @ transpose(w))"])).format(x=x), s
        elif kind == "row":
            e, t = draw(st.sampled_from(["layernorm({x} + b, g, be)" if s == vals["b"] else "layernorm({x}, g, be)",
                                         "softmax({x})", "rmsnorm({x}, g)"])).format(x=x), s
        else:
            y = draw(st.sampled_from([k for k, t in vals.items() if t == s]))
            if kind == "bmm_t":
                e, t = f"{x} @ transpose({y}, perm=[0, 2, 1])", (s[0], s[1], s[1])
            else:
                e, t = f"softmax({x} @ transpose({y}, perm=[0, 2, 1]) * 0.25, axis=-1) @ {y}", s
        lines.append(f"    t{i} = {e}")
        vals[f"t{i}"] = t
    names = [k for k in vals if k.startswith("t")]
    outs = sorted(set(draw(st.lists(st.sampled_from(names), min_size=0, max_size=1))) | {names[-1]})
    sig = ", ".join("f32[" + ", ".join(map(str, vals[o])) + "]" for o in outs)
    params = ", ".join(f"{k}: f32[{', '.join(map(str, s))}]" for k, s in vals.items() if not k.startswith("t"))
    return f"graph r({params}) -> ({sig}) {{\n" + "\n".join(lines) + f"\n    return {', '.join(outs)}\n}}\n"


@pytest.mark.heavy
@settings(max_examples=12, deadline=None)
@given(random_typed_model(), st.sampled_from([True, False]))
def test_random_shape_changing_graphs_compile_and_match_the_reference(src, fuse):
    g = one_graph(src)
    xs = rand_inputs(g, seed=7)
    want = run(g, xs)
    mod = eqfuse.compile(src, fuse=fuse)
    got = mod(*xs)
    assert_reads_alive(mod)
    got = [got] if isinstance(got, np.ndarray) else list(got)
    for o, w in zip(got, want):
        assert o.shape == w.shape and o.dtype == np.float32
        np.testing.assert_allclose(o, w, rtol=1e-3, atol=1e-4, err_msg=src)


SIZES = [1, 3, 8, 16]  # 8 and 16: a vector's width, where the compiler's own vectorizer takes a loop


@st.composite
def random_layout_model(draw):
    """Graphs of data movement over ranks 2 to 4 (pads of any axes, strided slices, transposes,
    concats, merged and split axes, broadcasts, gathers along any axis, triangles, running sums),
    with a pointwise op now and then: the index and layout kernels' loop nests, at sizes a
    vector's width, where gcc 12 once vectorized a pad of outer axes wrongly."""
    rank = draw(st.integers(2, 4))
    vals = {"a": tuple(draw(st.sampled_from(SIZES)) for _ in range(rank))}
    lines, bounds = [], {}
    for i in range(draw(st.integers(1, 4))):
        x = draw(st.sampled_from(sorted(vals)))
        s = vals[x]
        r = len(s)
        kind = draw(st.sampled_from(["pad", "pad", "slice", "transpose", "concat", "reshape", "expand", "gather",
                                     "tri", "cumsum", "pointwise"]))
        ax = draw(st.integers(0, r - 1))
        if kind == "pad":
            axes = draw(st.sets(st.integers(0, r - 1), min_size=1))  # (the last axis unpadded half the time)
            pads = [draw(st.integers(1, 2)) if k % r in axes and draw(st.booleans()) else 0 for k in range(2 * r)]
            value = draw(st.sampled_from([0.0, 1.5]))
            e, t = f"pad({x}, pads={pads}, value={value})", tuple(d + pads[k] + pads[k + r] for k, d in enumerate(s))
        elif kind == "slice" and s[ax] > 1:
            start = draw(st.integers(0, s[ax] - 1))
            stop = draw(st.integers(start + 1, s[ax]))
            step = draw(st.integers(1, 3))
            e, t = f"slice({x}, axis={ax}, start={start}, stop={stop}, step={step})", \
                s[:ax] + (len(range(start, stop, step)),) + s[ax + 1:]
        elif kind == "transpose":
            perm = draw(st.permutations(range(r)))
            e, t = f"transpose({x}, perm={list(perm)})", tuple(s[p] for p in perm)
        elif kind == "concat":
            e, t = f"concat({x}, {x} * 2.0, axis={ax})", s[:ax] + (2 * s[ax],) + s[ax + 1:]
        elif kind == "reshape" and r > 1 and ax < r - 1:  # two neighbouring axes merged
            t = s[:ax] + (s[ax] * s[ax + 1],) + s[ax + 2:]
            e = f"reshape({x}, shape={list(t)})"
        elif kind == "expand" and 1 in s:
            t = tuple(5 if d == 1 else d for d in s)
            e = f"expand({x}, shape={list(t)})"
        elif kind == "gather":  # indices i{i}, below the gathered axis's length (negative ones count from its end)
            n = draw(st.integers(1, 5))
            e, t = f"gather({x}, i{i}, axis={ax})", s[:ax] + (n,) + s[ax + 1:]
            bounds[f"i{i}"] = (n, s[ax])
        elif kind == "tri" and r >= 2:
            e, t = f"{draw(st.sampled_from(['tril', 'triu']))}({x}, k={draw(st.integers(-1, 1))})", s
        elif kind == "cumsum":
            e, t = f"cumsum({x}, axis={ax})", s
        else:
            e, t = f"relu({x}) - {x} * 0.5", s
        lines.append(f"    t{i} = {e}")
        vals[f"t{i}"] = t
    last = f"t{len(lines) - 1}"
    params = ", ".join([f"a: f32[{', '.join(map(str, vals['a']))}]"] + [f"{k}: i64[{n}]" for k, (n, _) in bounds.items()])
    src = (f"graph r({params}) -> f32[{', '.join(map(str, vals[last]))}] {{\n" + "\n".join(lines)
           + f"\n    return {last}\n}}\n")
    return src, {k: axis for k, (_, axis) in bounds.items()}


@pytest.mark.heavy
@settings(max_examples=15, deadline=None)
@given(random_layout_model(), st.sampled_from([True, False]))
def test_random_layout_graphs_compile_and_match_the_reference(model, fuse):
    check_layout_model(model, fuse)


@pytest.mark.extended
@settings(max_examples=150, deadline=None)
@given(random_layout_model(), st.sampled_from([True, False]))
def test_many_random_layout_graphs_compile_and_match_the_reference(model, fuse):
    check_layout_model(model, fuse)


def check_layout_model(model, fuse):
    src, bounds = model
    g = one_graph(src)
    rng = np.random.default_rng(11)
    xs = [rng.integers(-bounds[n], bounds[n], t.shape) if n in bounds else rng.standard_normal(t.shape).astype(np.float32)
          for n, t in g.params]
    want = run(g, xs)[0]
    got = eqfuse.compile(src, fuse=fuse)(*xs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=src)
