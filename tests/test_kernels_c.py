"""Every kernel shape, compiled to C, against the numpy reference.

To keep C builds few, each test module is one graph with many outputs (one kernel block per
case, odd sizes included); the parametrized tests read their case from the shared result. The
graph holds the cases the run selected (`selected`): every case in the whole suite, the first
alone in the fast tier (tests/conftest.py marks the others slow).
"""

from dataclasses import replace

import numpy as np
import pytest

import eqfuse
from eqfuse.frontend.load import load
from eqfuse.ir.ops import OPS
from eqfuse.ir.reference import evaluate
from eqfuse.machine import machine, pinned
from eqfuse.runtime.verify import compare

RNG = np.random.default_rng(1234)
POSITIVE = {"log", "sqrt", "rsqrt", "pow"}  # ops whose first operand must be positive here


def selected(request, test: str, cases: list[tuple]) -> list[tuple]:
    """The cases (id first) of the test function `test`, parametrized by "cid", that this run selected."""
    chosen = {item.callspec.params["cid"] for item in request.session.items
              if item.module is request.module and getattr(item, "originalname", None) == test}
    return [c for c in cases if c[0] in chosen] or cases


def run_cases(name: str, params: dict[str, tuple], cases: list[tuple[str, str]], threads: int | None = None):
    """Compile one graph returning every case's kernel; return {case id: (got, want)}."""
    sig = ", ".join(f"{p}: f32[{', '.join(map(str, s))}]" if s else f"{p}: f32" for p, s in params.items())
    lines = [f"    out_{i} = kernel {{ {expr} }}" for i, (_, expr) in enumerate(cases)]
    rets = ", ".join(f"out_{i}" for i in range(len(cases)))
    src = f"graph {name}({sig}) {{\n" + "\n".join(lines) + f"\n    return {rets}\n}}\n"
    arrays = []
    for p, s in params.items():
        a = RNG.standard_normal(s).astype(np.float32)
        arrays.append(np.abs(a) + np.float32(0.5) if p.startswith("p") else a)
    mod = eqfuse.compile(src, fuse="manual", threads=threads)  # the kernel blocks as written, not the optimizer's choice
    got = mod(*arrays)
    got = got if isinstance(got, tuple) else (got,)
    want = evaluate(load(src)[0], arrays)
    return {cid: (g, w) for (cid, _), g, w in zip(cases, got, want)}, mod


def check(results, cid):
    g, w = results[cid]
    assert compare([g], [w]) == [], cid


# ------------------------------------------------------------------ every pointwise op

# f32 -> f32 ops (the mask, cast and expand ops are compiled in tests/test_dtypes.py)
POINTWISE = sorted(n for n, op in OPS.items() if op.kind in ("pointwise", "channel")
                   and op.dtype in ("float", "numeric") and n != "expand")


def _pointwise_cases():
    cases = []
    for name in POINTWISE:
        op = OPS[name]
        choices = [dict()]
        for a in op.attrs:
            if a.choices:
                choices = [{a.name: c} for c in a.choices]
        for attrs in choices:
            at = "".join(f', {k}="{v}"' for k, v in attrs.items())
            x = "p" if name in POSITIVE else "x"
            if op.kind == "channel":
                cases.append((f"{name}", f"{name}(c, m, pv, g, b)"))
            elif op.arity == (1, 1):
                cases.append((f"{name}{at}", f"{name}({x}{at})"))
                cases.append((f"{name}{at}-odd", f"{name}({x}1{at})"))
            else:
                cases.append((f"{name}-bcast", f"{name}({x}, y)"))  # [7, 33] with [33]
                cases.append((f"{name}-scalar", f"{name}({x}, 2)"))
                cases.append((f"{name}-col", f"{name}(y2, {x})"))  # [7, 1] with [7, 33]
    return cases


@pytest.fixture(scope="module")
def pointwise_results(request):
    params = {"x": (7, 33), "p": (7, 33), "y": (33,), "y2": (7, 1), "x1": (1,), "p1": (1,),
              "c": (2, 3, 5, 7), "m": (3,), "pv": (3,), "g": (3,), "b": (3,)}
    res, _ = run_cases("pointwise_ops", params, selected(request, "test_pointwise_op", _pointwise_cases()))
    return res


@pytest.mark.parametrize("cid", [c for c, _ in _pointwise_cases()])
def test_pointwise_op(pointwise_results, cid):
    check(pointwise_results, cid)


# ------------------------------------------------------------------ pointwise trees, broadcasting

TREE_CASES = [
    ("chain", "relu(a * b + c)"),
    ("shared", "exp(-(a * b) * (a * b)) / (1 + abs(a))"),
    ("bcast-row", "a * r + 0.5"),
    ("bcast-col", "sigmoid(a) - col"),
    ("bcast-3d", "t3 * t3b + t3c"),
    ("scalar-param", "a * s"),
    ("odd-1d", "tanh(v127) * v127"),
]


@pytest.fixture(scope="module")
def tree_results(request):
    params = {"a": (33, 127), "b": (33, 127), "c": (33, 127), "r": (127,), "col": (33, 1),
              "t3": (5, 1, 7), "t3b": (1, 3, 1), "t3c": (7,), "s": (), "v127": (127,)}
    res, _ = run_cases("trees", params, selected(request, "test_pointwise_tree", TREE_CASES))
    return res


@pytest.mark.parametrize("cid", [c for c, _ in TREE_CASES])
def test_pointwise_tree(tree_results, cid):
    check(tree_results, cid)


# ------------------------------------------------------------------ contractions

MM_CASES = [
    ("1x1x1", "m1 @ n1"),
    ("7x33x127-bias-relu", "relu(x7 @ w33 + b127)"),
    ("odd-residual", "x7 @ w33 + r7"),
    ("transposed-b", "x7 @ transpose(wt) * 0.5"),
    ("batched-shared-b", "xb @ w33 + b127"),
    ("batched-both", "qb @ kb"),
    ("batched-bcast", "x4 @ w4"),
    ("batched-bcast-epi", "gelu(x4 @ w4 + e4)"),
    # A read through a swap of its last two axes (packed from K x M), alone and with a transposed B
    ("transposed-a", "relu(transpose(xt) @ w33 + b127)"),
    ("transposed-a-b", "transpose(xt, perm=[1, 0]) @ transpose(wt) - 1"),
    ("batched-transposed-a", "transpose(xbt, perm=[0, 2, 1]) @ w33 + b127"),
    ("batched-transposed-a-both", "transpose(qbt, perm=[0, 2, 1]) @ kb"),
]


@pytest.fixture(scope="module")
def mm_results(request):
    params = {"m1": (1, 1), "n1": (1, 1), "x7": (7, 33), "w33": (33, 127), "b127": (127,), "r7": (7, 127),
              "wt": (65, 33), "xb": (3, 5, 33), "qb": (3, 9, 17), "kb": (3, 17, 12),
              "x4": (2, 3, 5, 7), "w4": (3, 7, 6), "e4": (2, 1, 5, 1),
              "xt": (33, 7), "xbt": (3, 33, 5), "qbt": (3, 17, 9)}
    res, mod = run_cases("contractions", params, selected(request, "test_contraction", MM_CASES))
    assert all(k.kind == "contraction" for k in mod.kernels)  # no layout kernel for the transposes
    return res


@pytest.mark.parametrize("cid", [c for c, _ in MM_CASES])
def test_contraction(mm_results, cid):
    check(mm_results, cid)


CONV_CASES = [
    ("3x3-pad1-bias-relu", "relu(conv2d(x, w3, b, padding=1))"),
    ("3x3-stride2", "conv2d(x, w3, stride=2, padding=1) * 2"),
    ("1x1-direct", "conv2d(x, w1) + b2"),
    ("5x3-asym", "conv2d(x, w53, stride=[2, 1], padding=[2, 0])"),
    ("bn-relu-epilogue", "relu(batchnorm(conv2d(x, w3, padding=1), m, pv, g, b))"),
]


@pytest.fixture(scope="module")
def conv_results(request):
    params = {"x": (2, 3, 9, 7), "w3": (5, 3, 3, 3), "b": (5,), "w1": (5, 3, 1, 1), "b2": (5, 1, 1),
              "w53": (5, 3, 5, 3), "m": (5,), "pv": (5,), "g": (5,)}
    res, _ = run_cases("convs", params, selected(request, "test_conv2d", CONV_CASES))
    return res


@pytest.mark.parametrize("cid", [c for c, _ in CONV_CASES])
def test_conv2d(conv_results, cid):
    check(conv_results, cid)


# ------------------------------------------------------------------ row, reduce, attention, layout

ROW_CASES = [
    ("softmax", "softmax(x)"),
    ("softmax-prologue-epilogue", "softmax(x * 0.5 + r) * 3"),
    ("softmax-axis0", "softmax(x, axis=0)"),
    ("softmax-1", "softmax(one)"),
    ("layernorm-residual", "layernorm(x + r, g, bt)"),
    ("layernorm-2axes", "layernorm(x3, g2, b2, axis=-2)"),
    ("rmsnorm-epilogue", "relu(rmsnorm(x, g)) + x"),
    ("sum-last", "sum(x, axis=-1)"),
    ("mean-keepdims", "mean(x * x, axis=-1, keepdims=true)"),
    ("max-2axes", "max(x3, axis=[1, 2]) + 1"),
    ("sum-all", "sum(x)"),
    ("reduce-axis0", "sum(x3, axis=0)"),
    ("reduce-middle", "mean(exp(x3), axis=1)"),
    ("reduce-outer-inner", "max(x3, axis=[0, 2], keepdims=true)"),
]


@pytest.fixture(scope="module")
def row_results(request):
    params = {"x": (7, 127), "r": (127,), "one": (5, 1), "g": (127,), "bt": (127,),
              "x3": (3, 33, 5), "g2": (33, 5), "b2": (33, 5)}
    cases = selected(request, "test_row_and_reduce", ROW_CASES)
    res, mod = run_cases("rows", params, cases)
    kinds = {k.kind for k in mod.kernels}
    assert {"row", "reduce"} <= kinds or len(cases) < len(ROW_CASES)  # (the fast tier compiles one case)
    return res


@pytest.mark.parametrize("cid", [c for c, _ in ROW_CASES])
def test_row_and_reduce(row_results, cid):
    check(row_results, cid)


ATT_CASES = [
    ("plain", "softmax(q @ transpose(k, perm=[0, 1, 3, 2]) * 0.125) @ v"),
    ("mask-epilogue", "relu(softmax(q @ transpose(k, perm=[0, 1, 3, 2]) * 0.125 + mask) @ v) + 1"),
    ("odd-kT-given", "softmax(q2 @ kt2) @ v2"),
    ("broadcast-kv", "softmax(q @ transpose(k1, perm=[0, 1, 3, 2])) @ v1"),
    # multi-head layouts read and written in place: head split views in, head merge out
    ("heads-split-merge", "transpose(softmax(transpose(xq, perm=[0, 2, 1, 3]) @ transpose(transpose(xk, "
                          "perm=[0, 2, 1, 3]), perm=[0, 1, 3, 2]) * 0.25) @ transpose(xv, perm=[0, 2, 1, 3]), "
                          "perm=[0, 2, 1, 3])"),
    ("heads-reshape-kT", "reshape(transpose(softmax(transpose(reshape(fq, shape=[2, 33, 3, 16]), perm=[0, 2, 1, 3]) "
                         "@ transpose(reshape(fk, shape=[2, 70, 3, 16]), perm=[0, 2, 3, 1])) "
                         "@ transpose(reshape(fv, shape=[2, 70, 3, 8]), perm=[0, 2, 1, 3]), perm=[0, 2, 1, 3]), "
                         "shape=[2, 33, 24])"),
    ("heads-mask-epilogue", "transpose(relu(softmax(transpose(xq, perm=[0, 2, 1, 3]) @ transpose(k, perm=[0, 1, 3, 2]) "
                            "+ mask) @ v) * 2, perm=[0, 2, 1, 3])"),
    ("heads-vector", "transpose(softmax(transpose(wq, perm=[0, 2, 1, 3]) @ transpose(transpose(wk, perm=[0, 2, 1, 3]), "
                     "perm=[0, 1, 3, 2])) @ transpose(wv, perm=[0, 2, 1, 3]), perm=[0, 2, 1, 3])"),
    # a per-head mask and residual: score and output offsets share one C scope (once both off0)
    ("head-mask-residual", "softmax(q @ transpose(k, perm=[0, 1, 3, 2]) + hmask) @ v + res"),
    # the AVX-512 path (head size 64) with partial query blocks and key tiles; the constant scale
    # is folded into q in all three spellings, the mask takes the general score pass
    ("vec-partial-div", "softmax(wq2 @ transpose(wk2, perm=[0, 2, 1]) / 8.0) @ wv2"),
    ("vec-partial-left-scale", "softmax(0.125 * (wq2 @ transpose(wk2, perm=[0, 2, 1]))) @ wv2"),
    ("vec-partial-mask", "softmax(wq2 @ transpose(wk2, perm=[0, 2, 1]) * 0.125 + wmask) @ wv2"),
    # head size 128: the 32 KiB key tile streams from L2 (still tiles of 64 keys, blocks of 16 queries)
    ("vec-head-128", "softmax(hq @ transpose(hk, perm=[0, 2, 1]) * 0.088) @ hv"),
    # value widths that are multiples of 16 but not of 64: 32 + 16 and 64 + 32 + 16 columns
    ("vec-dv-48", "softmax(sq @ transpose(sk, perm=[0, 2, 1]) * 0.2) @ sv"),
    ("vec-dv-112", "softmax(sq @ transpose(sk, perm=[0, 2, 1]) + wmask2) @ sv2"),
]


@pytest.fixture(scope="module")
def att_results(request):
    params = {"q": (2, 3, 33, 16), "k": (2, 3, 70, 16), "v": (2, 3, 70, 8), "mask": (33, 70),
              "q2": (1, 7), "kt2": (7, 129), "v2": (129, 5), "k1": (2, 1, 70, 16), "v1": (1, 1, 70, 8),
              "xq": (2, 33, 3, 16), "xk": (2, 70, 3, 16), "xv": (2, 70, 3, 8),
              "fq": (2, 33, 48), "fk": (2, 70, 48), "fv": (2, 70, 24),
              "wq": (1, 128, 2, 64), "wk": (1, 192, 2, 64), "wv": (1, 192, 2, 64),
              "hmask": (2, 3, 1, 70), "res": (2, 3, 33, 8),
              "wq2": (2, 37, 64), "wk2": (2, 100, 64), "wv2": (2, 100, 64), "wmask": (37, 100),
              "hq": (2, 21, 128), "hk": (2, 130, 128), "hv": (2, 130, 128),
              "sq": (2, 21, 32), "sk": (2, 70, 32), "sv": (2, 70, 48), "sv2": (2, 70, 112), "wmask2": (21, 70)}
    cases = selected(request, "test_attention", ATT_CASES)
    res, mod = run_cases("attention", params, cases)
    assert all(k.kind == "attention" for k in mod.kernels)
    kernels = dict(zip([c for c, _ in cases], mod.kernels))
    if "vec-head-128" in kernels:  # it keeps the vectorized tiles, blocks of >= 16 queries
        assert kernels["vec-head-128"].tiles["bk"] == 64 and kernels["vec-head-128"].tiles["bq"] >= 16
    return res


@pytest.mark.parametrize("cid", [c for c, _ in ATT_CASES])
def test_attention(att_results, cid):
    check(att_results, cid)


@pytest.mark.parametrize("d", [64, 24])  # the AVX-512 path and the portable one
@pytest.mark.parametrize("threads", [1, 2])
def test_attention_rising_scores_and_masked_tiles(d, threads):
    """The online softmax raises a row's maximum lazily (only when a key tile passes it by more
    than 2^8) and rescales what it has summed: here the scores grow tile after tile, so every row
    is rescaled several times. A -inf mask hides the whole first key tile from rows 60 and up (their
    maximum starts at -inf) and a causal-like tail from the rest."""
    sq, sk = 70, 150
    q = RNG.standard_normal((2, sq, d)).astype(np.float32)
    growth = np.linspace(0.2, 3.0, sk, dtype=np.float32)[:, None]
    k = (RNG.standard_normal((2, sk, d)) * growth).astype(np.float32)
    v = RNG.standard_normal((2, sk, d)).astype(np.float32)
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    mask = np.where((j > i + 70) | ((j < 64) & (i >= 60)), -np.inf, 0).astype(np.float32)
    src = (f"graph att(q: f32[2, {sq}, {d}], k: f32[2, {sk}, {d}], v: f32[2, {sk}, {d}], m: f32[{sq}, {sk}]) "
           f"-> (f32[2, {sq}, {d}], f32[2, {sq}, {d}]) {{\n"
           "    a = kernel { softmax(q @ transpose(k, perm=[0, 2, 1]) * 0.5) @ v }\n"
           "    b = kernel { softmax(q @ transpose(k, perm=[0, 2, 1]) * 0.5 + m) @ v }\n"
           "    return a, b\n}\n")
    mod = eqfuse.compile(src, fuse="manual", threads=threads)
    assert [kn.kind for kn in mod.kernels] == ["attention", "attention"]
    s = np.einsum("bid,bjd->bij", q.astype(np.float64), k.astype(np.float64)) * 0.5
    assert np.all(np.diff(s.max(-1)) != 0)  # sanity: scores are not constant
    got = mod(q, k, v, mask)
    for g, scores in zip(got, (s, s + mask)):
        e = np.exp(scores - scores.max(-1, keepdims=True))
        want = (e / e.sum(-1, keepdims=True)) @ v.astype(np.float64)
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, want, rtol=2e-5, atol=2e-5)


def test_attention_with_rows_off_the_vector_width_runs_and_is_right():
    """A head of 40 and a value width of 47 (tests/test_bf16_random.py found it): the kernel's
    local tiles are rows of those widths, and gcc's vectorizer stored to them with aligned moves
    in a frame it had not aligned, a fault (csrc_templates/attention.c declares them aligned)."""
    q = RNG.standard_normal((1, 2, 40)).astype(np.float32)
    k = RNG.standard_normal((1, 128, 40)).astype(np.float32)
    v = RNG.standard_normal((1, 128, 47)).astype(np.float32)
    src = ("graph att(q: f32[1, 2, 40], k: f32[1, 128, 40], v: f32[1, 128, 47]) -> f32[1, 2, 47] {\n"
           "    return softmax(q @ transpose(k, perm=[0, 2, 1]), axis=-1) @ v\n}\n")
    mod = eqfuse.compile(src)
    assert [kn.kind for kn in mod.kernels] == ["attention"]
    s = np.einsum("bid,bjd->bij", q.astype(np.float64), k.astype(np.float64))
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(mod(q, k, v), (e / e.sum(-1, keepdims=True)) @ v.astype(np.float64), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("sq", [1, 9])  # the decode kernel (one query row) and the general one
def test_attention_rows_masked_with_the_most_negative_float_weigh_their_keys_evenly(sq):
    """transformers' eager attentions (BLOOM's) add finfo(float32).min to the scores of masked
    keys: a row whose every key is masked so (a padding query of a left-padded batch) has finite
    scores, all equal in f32 (the mask absorbs them), which the reference's softmax weighs
    evenly. The kernels take scores in base 2 (times log2 e), where the mask would overflow to
    -inf and the row would be NaN (csrc_templates/common.h, eqf_score2)."""
    sk, d, low = 40, 16, np.finfo(np.float32).min
    q = RNG.standard_normal((2, sq, d)).astype(np.float32)
    k = RNG.standard_normal((2, sk, d)).astype(np.float32)
    v = RNG.standard_normal((2, sk, d)).astype(np.float32)
    m = np.zeros((2, sq, sk), np.float32)
    m[0, :, :10] = low  # some keys masked
    m[1] = low  # every key masked
    src = (f"graph att(q: f32[2, {sq}, {d}], k: f32[2, {sk}, {d}], v: f32[2, {sk}, {d}], m: f32[2, {sq}, {sk}]) {{\n"
           "    a = kernel { softmax(q @ transpose(k, perm=[0, 2, 1]) * 0.5 + m) @ v }\n"
           "    return a\n}\n")
    mod = eqfuse.compile(src, fuse="manual")
    assert [kn.kind for kn in mod.kernels] == ["attention"]
    s = (np.einsum("bid,bjd->bij", q.astype(np.float64), k.astype(np.float64)) * 0.5).astype(np.float32) + m
    e = np.exp(s.astype(np.float64) - s.max(-1, keepdims=True))
    want = (e / e.sum(-1, keepdims=True)) @ v.astype(np.float64)
    assert np.all(s[1] == low)  # (the mask absorbs the scores in f32)
    got = mod(q, k, v, m)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(got[1], np.broadcast_to(v[1].mean(0), (sq, d)), rtol=2e-5, atol=2e-5)


LAYOUT_CASES = [
    ("transpose-2d", "transpose(a)"),
    ("transpose-4d", "transpose(x, perm=[3, 1, 0, 2])"),
    ("transpose-heads", "transpose(x, perm=[0, 2, 1, 3])"),
    ("reshape", "reshape(x, shape=[6, -1])"),
    ("slice", "slice(x, axis=2, start=1, stop=3)"),
    ("slice-neg", "slice(a, axis=-1, start=-5)"),
    ("concat", "concat(x, y, axis=2)"),
    ("concat-0", "concat(a, a, axis=0)"),
]


@pytest.fixture(scope="module")
def layout_results(request):
    params = {"a": (7, 33), "x": (2, 3, 4, 5), "y": (2, 3, 1, 5)}
    res, _ = run_cases("layouts", params, selected(request, "test_layout", LAYOUT_CASES))
    return res


@pytest.mark.parametrize("cid", [c for c, _ in LAYOUT_CASES])
def test_layout(layout_results, cid):
    check(layout_results, cid)


# ------------------------------------------------------------------ streaming (non-temporal) pointwise

# Caches patched small so that outputs from 512 KiB (STREAM_MIN floats) on stream: the same code
# path as 64 MiB outputs on this machine, at test-sized arrays, on any machine.
STREAM_CACHES = dict(l1=32 << 10, l2=256 << 10, l3=1 << 20, simd_floats=16, cores=2)
STREAM_MIN = min(STREAM_CACHES["l3"] // 2, 8 * STREAM_CACHES["l2"] * STREAM_CACHES["cores"]) // 4

STREAM_CASES = [  # (id, expression, streams?)
    ("just-over-odd-tail", "relu(a * b + c)", 1),  # 1-D, STREAM_MIN + 37 elements
    ("at-threshold", "sigmoid(e) * s - 1", 1),  # exactly STREAM_MIN, scalar parameter broadcast
    ("just-below", "relu(d * d + 1)", 0),  # STREAM_MIN - 37: ordinary stores
    ("rows-misaligned-bcast", "m * r + col", 1),  # rows of 1027: every row starts at another skew
    ("bcast-middle", "t * u + 0.5", 1),  # (43, 3, 1031) * (43, 1, 1031): inner 1031, outer 129
    ("coalesced-3d", "exp(-(v3 * v3)) + v3", 1),  # (7, 11, 1709) all walked as one inner loop
    ("short-rows", "abs(w65) * 2 + w65r", 1),  # rows of 65: a partial line each side, few whole ones
    ("narrow-rows", "n40 * 3 + n40r", 0),  # rows of 40 < STREAM_MIN_INNER: ordinary stores
]


@pytest.fixture(scope="module")
def stream_results(request):

    big = STREAM_MIN + 37
    params = {"a": (big,), "b": (big,), "c": (big,), "e": (STREAM_MIN,), "s": (), "d": (STREAM_MIN - 37,),
              "m": (131, 1027), "r": (1027,), "col": (131, 1), "t": (43, 3, 1031), "u": (43, 1, 1031),
              "v3": (7, 11, 1709), "w65": (2049, 65), "w65r": (65,), "n40": (3280, 40), "n40r": (40,)}
    for name, shape in params.items():
        assert name in ("s", "d", "r", "col", "u", "w65r", "n40r") or np.prod(shape) >= STREAM_MIN, name
    with pinned(replace(machine(), **STREAM_CACHES)):
        cases = selected(request, "test_streaming_pointwise", STREAM_CASES)
        res, mod = run_cases("streaming", params, [(cid, expr) for cid, expr, _ in cases])
    return res, dict(zip([c for c, _, _ in cases], mod.kernels))


@pytest.mark.parametrize("cid", [c for c, _, _ in STREAM_CASES])
def test_streaming_pointwise(stream_results, cid):
    res, kernels = stream_results
    check(res, cid)
    k = kernels[cid]
    want = dict((c, s) for c, _, s in STREAM_CASES)[cid]
    assert k.kind == "pointwise" and k.tiles["stream"] == want, (cid, k.tiles)
    assert f"STREAM ({want})" in k.c_source


def test_streaming_pointwise_non_contiguous_inputs_and_threads():
    """Strided and transposed views as arguments, 1 and 2 threads, just over the threshold."""

    rows, cols = 129, 1031  # 133 k elements >= STREAM_MIN
    src = (f"graph nc(x: f32[{rows}, {cols}], y: f32[{rows}, {cols}], z: f32[{cols}]) -> f32[{rows}, {cols}] "
           "{ return kernel { relu(x * y + z) } }")
    with pinned(replace(machine(), **STREAM_CACHES)):
        mod = eqfuse.compile(src, fuse="manual")
        x = RNG.standard_normal((rows, 2 * cols)).astype(np.float32)[:, ::2]  # strided
        y = np.ascontiguousarray(RNG.standard_normal((cols, rows)).astype(np.float32)).T  # transposed
        z = RNG.standard_normal(2 * cols + 1).astype(np.float32)[1::2]  # odd offset, stride 2
        assert not (x.flags.c_contiguous or y.flags.c_contiguous or z.flags.c_contiguous)
        want = evaluate(load(src)[0], [x, y, z])
        for threads in (1, 2):
            mod.nc.threads = threads
            assert compare([mod(x, y, z)], want) == [], threads
    assert mod.kernels[0].tiles["stream"] == 1


# ------------------------------------------------------------------ contraction with row epilogue

# rowop(pointwise(A @ B), params) + pointwise: M not a multiple of the 6-row register tile, N odd
# (37) and over two 64-wide panels (130), B shared by a 3-D batch (folded into M), both operands
# batched, broadcast batches (a GEMM per batch), B transposed, K in two KC slices.
ROW_EPI_CASES = [
    ("ln-residual-epi", "relu(layernorm(r7 + (xa @ w37 + b37), g37, be37)) * 2 + r7"),
    ("ln-batched-3d", "layernorm(xb3 @ w37 + rb, g37, be37) + b37"),
    ("ln-130-gelu", "gelu(layernorm(xa @ w130 + b130, g130, be130))"),
    ("ln-transposed-b", "layernorm(xa @ transpose(wt) + r7, g37, be37)"),
    ("ln-k-slices", "layernorm(xk @ wk + b37, g37, be37) + 1"),
    ("rms-residual-epi", "rmsnorm(r7 + xa @ w37, g37) * 0.5 - r7"),
    ("rms-batched-both", "sigmoid(rmsnorm(qb @ kb, g37))"),
    ("softmax-epi", "softmax(xa @ w37 * 0.125 + b37) * 3 + r7"),
    ("softmax-batched-bcast", "softmax(x4 @ w4) + b37"),
    ("softmax-130-batched", "softmax(xb3 @ w130)"),
]
ROW_EPI_PARAMS = {"xa": (7, 40), "w37": (40, 37), "b37": (37,), "r7": (7, 37), "g37": (37,), "be37": (37,),
                  "xb3": (3, 5, 40), "rb": (3, 5, 37), "w130": (40, 130), "b130": (130,), "g130": (130,),
                  "be130": (130,), "wt": (37, 40), "xk": (13, 700), "wk": (700, 37), "qb": (3, 11, 17),
                  "kb": (3, 17, 37), "x4": (2, 3, 5, 7), "w4": (3, 7, 37)}


@pytest.fixture(scope="module", params=[1, 2], ids=["1thread", "2threads"])
def row_epi_results(request):
    res, mod = run_cases("rowepi", ROW_EPI_PARAMS, selected(request, "test_contraction_row_epilogue", ROW_EPI_CASES),
                         threads=request.param)
    assert {k.kind for k in mod.kernels} == {"contraction_row"}, [(k.name, k.kind) for k in mod.kernels]
    return res


@pytest.mark.parametrize("cid", [c for c, _ in ROW_EPI_CASES])
def test_contraction_row_epilogue(row_epi_results, cid):
    check(row_epi_results, cid)


@pytest.mark.heavy  # (the fast tier's time)
def test_contraction_row_epilogue_small_blocks(monkeypatch):
    """Tiny GEMM blocks: several K slices (the row op only after the last), row chunks per
    thread, B panels (N = 130 over 64-wide NC blocks: the row op per chunk of rows; N = 37 in one
    NC block: per MR-row tile) and, on 2 threads, threads sharing a panel."""
    import eqfuse.backend.kinds.contraction.plan_gemm as plan_gemm

    monkeypatch.setattr(plan_gemm, "gemm_tiles", lambda M, N, K, m, even_kc=False, a_bytes=4: {"mr": 6, "nr": 64, "kc": min(16, K),
                                                                      "mc": min(12, -(-M // 6) * 6), "nc": 64})
    src = ("graph sb(x: f32[2, 53, 40], w: f32[40, 130], b: f32[130], g: f32[130], be: f32[130], "
           "r: f32[2, 53, 130], v: f32[40, 37], h: f32[37]) -> (f32[2, 53, 130], f32[2, 53, 130], f32[2, 53, 37]) {\n"
           "    y = kernel { relu(layernorm(x @ w + r, g, be)) + b }\n"
           "    z = kernel { softmax(x @ w + b) * r }\n"
           "    u = kernel { rmsnorm(x @ v + h, h) - 1 }\n"
           "    return y, z, u\n}")
    arrays = [RNG.standard_normal(s).astype(np.float32) for s in [(2, 53, 40), (40, 130), (130,), (130,), (130,),
                                                                   (2, 53, 130), (40, 37), (37,)]]
    want = evaluate(load(src)[0], arrays)
    for threads in (1, 2):
        mod = eqfuse.compile(src, fuse="manual", threads=threads)
        assert [k.kind for k in mod.kernels] == ["contraction_row"] * 3
        assert "KC 16L" in mod.kernels[0].c_source.replace("_KC ", "KC ")
        assert compare(list(mod(*arrays)), want) == [], threads


def test_contraction_row_epilogue_too_wide_is_split(machine_model):
    """A row too long for the row epilogue (N floats and the row op's parameters beyond L1): the
    backend computes the kernel block as a GEMM and a row kernel, with the same result."""
    N = machine_model.l1 // (4 * 3) + 100  # a row of C and the two parameter vectors: past L1
    src = (f"graph wide(x: f32[5, 8], w: f32[8, {N}], g: f32[{N}], be: f32[{N}]) -> f32[5, {N}] "
           "{ return kernel { layernorm(x @ w, g, be) * 2 } }")
    arrays = [RNG.standard_normal(s).astype(np.float32) for s in [(5, 8), (8, N), (N,), (N,)]]
    mod = eqfuse.compile(src, fuse="manual")
    assert sorted(k.kind for k in mod.kernels) != ["contraction_row"]
    assert compare([mod(*arrays)], evaluate(load(src)[0], arrays)) == []


def test_contraction_row_epilogue_needs_the_row_op_before_its_epilogue():
    """The epilogue after the row op may not read the values before it (C holds them no more)."""
    from eqfuse.errors import EqfuseError

    src = ("graph bad(x: f32[5, 8], w: f32[8, 16], g: f32[16], be: f32[16]) -> f32[5, 16] {\n"
           "    return kernel { t = x @ w\n layernorm(t, g, be) + t }\n}")
    with pytest.raises(EqfuseError, match="supported kernel shapes"):
        eqfuse.compile(src, fuse="manual")


# ------------------------------------------------------------------ transcendental accuracy

TRANSCENDENTAL = {  # op -> its value in float64
    "exp(x)": np.exp,
    "tanh(x)": np.tanh,
    "erf(x)": lambda x: __import__("scipy.special", fromlist=["erf"]).erf(x),
    "sigmoid(x)": lambda x: 1 / (1 + np.exp(-x)),
    "silu(x)": lambda x: x / (1 + np.exp(-x)),
    "gelu(x)": lambda x: 0.5 * x * __import__("scipy.special", fromlist=["erfc"]).erfc(-x / np.sqrt(2)),
    # 1 + tanh(u) = 2 / (1 + exp(-2u)): without float64's own cancellation in the tail
    'gelu(x, approximate="tanh")': lambda x: x / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
}


@pytest.fixture(scope="module")
def transcendental_results():
    x = np.concatenate([np.linspace(-120, 120, 24001), np.linspace(-1, 1, 2001), np.geomspace(1e-20, 1, 200),
                        -np.geomspace(1e-20, 1, 200), [0.0, -0.0, np.inf, -np.inf, np.nan, 88.72, 88.7228,
                                                        88.73, -87.3, -87.34, -103.9, -104.0]]).astype(np.float32)
    ops = list(TRANSCENDENTAL)
    n = x.size
    src = (f"graph t(x: f32[{n}]) -> ({', '.join([f'f32[{n}]'] * len(ops))}) {{\n"
           + "\n".join(f"    o{i} = kernel {{ {o} }}" for i, o in enumerate(ops))
           + f"\n    return {', '.join(f'o{i}' for i in range(len(ops)))}\n}}")
    got = eqfuse.compile(src, fuse="manual")(x)
    return x, dict(zip(ops, got))


@pytest.mark.parametrize("op", list(TRANSCENDENTAL))
def test_transcendental_accuracy(transcendental_results, op):
    """The vectorizable exp / tanh / erf of common.h (and what is built on them) against float64
    over [-120, 120], tiny magnitudes and the special values: relative error < 2e-6 where the true
    value exceeds 1e-6 in magnitude, < 1e-4 down to 1e-30 (the rounding of x
    itself is amplified in far tails like exp(-x^2)), and inf, -inf, nan, 0 where they belong."""
    x, got = transcendental_results
    with np.errstate(all="ignore"):
        true = TRANSCENDENTAL[op](x.astype(np.float64))
    g = got[op].astype(np.float64)
    normal = np.isfinite(true) & (np.abs(true) > 1e-30) & (np.abs(true) < 3e38)
    rel = np.abs(g[normal] - true[normal]) / np.abs(true[normal])
    big = np.abs(true[normal]) > 1e-6
    assert rel[big].max() < 2e-6, (op, float(rel[big].max()), float(x[normal][big][np.argmax(rel[big])]))
    assert rel.max() < 1e-4, (op, float(rel.max()), float(x[normal][np.argmax(rel)]))
    special = ~normal & ~(np.isfinite(true) & (np.abs(true) >= 3e38))
    np.testing.assert_allclose(g[special], true[special].astype(np.float32), rtol=0, atol=1e-30)


def test_a_square_and_a_cube_are_products():
    """x ** 2 and x ** 3 compute as x * x and x * x * x (eqf_pow with a constant exponent: the rules
    pow_two and pow_three's forms, which vectorize), not as powf: bit for bit numpy's products."""
    x = np.random.default_rng(5).standard_normal(4099).astype(np.float32) * 3
    src = "graph p(x: f32[4099]) -> (f32[4099], f32[4099]) {\n    a = kernel { x ** 2 }\n    b = kernel { x ** 3 }\n    return a, b\n}"
    sq, cube = eqfuse.compile(src, fuse="manual")(x)
    np.testing.assert_array_equal(sq, x * x)
    np.testing.assert_array_equal(cube, x * x * x)


SUBNORMAL = {"exp(x)": np.exp, "sigmoid(x)": TRANSCENDENTAL["sigmoid(x)"], "silu(x)": TRANSCENDENTAL["silu(x)"]}


@pytest.fixture(scope="module")
def subnormal_results():
    x = np.concatenate([np.linspace(-112, -86, 26001), [-87.33, -87.34, -103.9, -103.97, -103.98, -104.0, -108.6,
                                                        -120.0, -121.0, -1e30, -np.inf]]).astype(np.float32)
    src = (f"graph t(x: f32[{x.size}]) -> ({', '.join([f'f32[{x.size}]'] * 3)}) {{\n"
           + "\n".join(f"    o{i} = kernel {{ {o} }}" for i, o in enumerate(SUBNORMAL))
           + "\n    return o0, o1, o2\n}")
    return x, dict(zip(SUBNORMAL, eqfuse.compile(src, fuse="manual")(x)))


@pytest.mark.parametrize("op", list(SUBNORMAL))
def test_subnormal_results_are_not_flushed(subnormal_results, op):
    """exp, sigmoid and silu of x in [-112, -86], where the results fall into float32's subnormals
    (below 2^-126 ~ 1.2e-38) and then to 0: within 2 units of the last place (the subnormals' unit
    is 2^-149) of the float32 rounding of the true value, never 0 where it is not."""
    x, got = subnormal_results
    with np.errstate(all="ignore"):
        true = SUBNORMAL[op](x.astype(np.float64))
    want = true.astype(np.float32)
    g = got[op]
    finite = np.isfinite(x)
    ulps = np.abs(g.view(np.int32).astype(np.int64) - want.view(np.int32))[finite]
    assert ulps.max() <= 2, (op, int(ulps.max()), float(x[finite][np.argmax(ulps)]))
    assert not np.any((g == 0) & (want != 0)), (op, x[(g == 0) & (want != 0)][:5])
    assert np.any((want != 0) & (np.abs(want) < 2.0 ** -126)), "the range must reach the subnormals"
    np.testing.assert_array_equal(g[~finite], want[~finite])


@pytest.fixture(scope="module")
def sin_cos_results():
    """sin and cos of x over |x| <= 1e4 densely (rotary angles), near multiples of pi/2, at every
    binade up to 3e38 (random mantissas, the table reduction from 2^24 on) and the special
    values, compiled as two pointwise kernels."""
    rng = np.random.default_rng(0)
    k = np.arange(-6000, 6001)
    mags = (rng.uniform(1, 2, 4000) * 2.0 ** rng.integers(-140, 128, 4000)).astype(np.float32)
    x = np.concatenate([np.linspace(-1e4, 1e4, 200001), rng.uniform(-1e4, 1e4, 20000), k * np.pi / 2,
                        np.nextafter((k * np.pi / 2).astype(np.float32), np.float32(np.inf)),
                        mags, -mags, 2.0 ** np.arange(-149, 128), [0.0, -0.0, 16777215.0, 16777216.0,
                        3.4028235e38, -3.4028235e38, np.inf, -np.inf, np.nan]]).astype(np.float32)
    src = (f"graph t(x: f32[{x.size}]) -> (f32[{x.size}], f32[{x.size}]) {{\n"
           "    s = kernel { sin(x) }\n    c = kernel { cos(x) }\n    return s, c\n}")
    mod = eqfuse.compile(src, fuse="manual")
    s, c = mod(x)
    return x, {"sin": s, "cos": c}, [k.c_source for k in mod.kernels]


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_sin_cos_accuracy(sin_cos_results, op):
    """common.h's eqf_sinf / eqf_cosf against numpy's float64 sin and cos of the same float32 x:
    for |x| < 2^24 within 1 ulp (the result is one of the two floats around the true value), for
    larger |x| within 1 ulp + 3e-14 (the table reduction's bound, stated in common.h); inf and NaN
    give NaN, and sin keeps the sign of 0."""
    x, got, _ = sin_cos_results
    g = got[op]
    finite = np.isfinite(x)
    true = getattr(np, op)(x[finite].astype(np.float64))
    ulp = np.spacing(np.abs(true).astype(np.float32)).astype(np.float64)
    err = np.abs(g[finite].astype(np.float64) - true)
    small = np.abs(x[finite]) < 2.0 ** 24
    assert np.all(err[small] <= ulp[small]), (op, float(x[finite][small][np.argmax(err[small] / ulp[small])]))
    assert np.all(err[~small] <= ulp[~small] + 3e-14), (op, float(x[finite][~small][np.argmax(err[~small])]))
    assert np.all(np.isnan(g[~finite]))
    if op == "sin":
        zeros = x == 0
        assert np.array_equal(np.signbit(g[zeros]), np.signbit(x[zeros]))


def test_sin_cos_two_passes_over_mixed_arguments():
    """A pointwise kernel computes sin and cos of each run of elements with the |x| < 2^24 forms
    and again exactly if any element fails that guard (plan field two_pass; pointwise.c). Runs
    mixing small and large x, NaN and inf meet test_sin_cos_accuracy's bounds, and a small x gets
    the same bits whether its run was computed again or not. Planned for this host with a small
    L3, the output is streamed, so the streamed lines and a row's partial first and last lines
    take both passes too."""
    from dataclasses import replace

    from eqfuse.machine import machine, pinned

    n = (1 << 16) + 13
    rng = np.random.default_rng(1)
    small = rng.uniform(-1e4, 1e4, n).astype(np.float32)
    x = small.copy()
    at = np.arange(0, n // 2, 97)  # one large argument in about every 100 of the first half
    x[at] = (rng.uniform(1, 2, at.size) * 2.0 ** rng.integers(24, 128, at.size)).astype(np.float32)
    x[at[::7]] = -x[at[::7]]
    x[at[1::50]], x[at[2::50]] = np.nan, np.inf
    src = f"graph t(x: f32[{n}]) -> (f32[{n}], f32[{n}]) {{ s = kernel {{ sin(x) }}\n c = kernel {{ cos(x) }}\n return s, c }}"
    with pinned(replace(machine(), l3=1 << 18)):  # outputs from 128 KiB on are streamed
        mod = eqfuse.compile(src, fuse="manual")
    assert [(k.tiles["stream"], k.decisions["two_pass"]) for k in mod.kernels] == [(1, 1), (1, 1)]
    s, c = mod(x)
    s0, c0 = mod(small)
    finite = np.isfinite(x)
    kept = np.ones(n, bool)
    kept[at] = False
    for op, g, g0 in (("sin", s, s0), ("cos", c, c0)):
        true = getattr(np, op)(x[finite].astype(np.float64))
        ulp = np.spacing(np.abs(true).astype(np.float32)).astype(np.float64)
        err = np.abs(g[finite].astype(np.float64) - true)
        lo = np.abs(x[finite]) < 2.0 ** 24
        assert np.all(err[lo] <= ulp[lo]), op
        assert np.all(err[~lo] <= ulp[~lo] + 3e-14), op
        assert np.all(np.isnan(g[~finite])), op
        np.testing.assert_array_equal(g[kept].view(np.int32), g0[kept].view(np.int32))


def test_sin_cos_table_is_2_over_pi():
    """The reduction table in common.h holds the bits of 2/pi it says: int(2^(E + 71) / pi) mod
    2^72 for E = 1..104, in 24-bit chunks."""
    mpmath = pytest.importorskip("mpmath")
    import re

    from eqfuse.backend.cbuild import templates_dir

    text = (templates_dir() / "common.h").read_text()  # (inside the package when installed)
    body = text[text.index("eqf_2opi[3][104] = {"):]
    body = body[:body.index("};")]
    chunks = [[int(v) for v in re.findall(r"\d+", part)] for part in body.split("{")[2:]]
    with mpmath.workprec(400):
        want = [int(mpmath.floor(mpmath.ldexp(1 / mpmath.pi, e + 71))) % (1 << 72) for e in range(1, 105)]
    got = [(a << 48) | (b << 24) | c for a, b, c in zip(*chunks)]
    assert got == want
