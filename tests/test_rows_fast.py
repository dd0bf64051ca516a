"""The row kernels' vector paths (common.h: eqf_row_exp_sum, eqf_row_sq_dev, the prefetch of the
next row) against float64 numpy, on the AVX-512 path (zen4, when the host has it) and the
portable one (avx2).

Row lengths around the vector widths (1, 2, 3, 15, 16, 17, 31, 33, 63, 64, 65, ...) reach every
masked tail and remainder loop; large magnitudes check the two-pass variance and the exp's range
reduction; -inf checks masked softmax rows.
"""

import numpy as np
import pytest

import eqfuse
from eqfuse import machine

LENGTHS = [1, 2, 3, 15, 16, 17, 31, 33, 63, 64, 65, 100, 767, 1025]
ROWS = 5
RTOL, ATOL = 1e-5, 1e-6
MACHINES = ["zen4", "avx2"]


def softmax64(x, axis=-1):
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)


def layernorm64(x, g, b, eps=1e-5):
    x = x.astype(np.float64)
    d = x - x.mean(-1, keepdims=True)
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + eps) * g + b


def rmsnorm64(x, g, eps=1e-6):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def graph(lengths) -> str:
    """One graph, three one-kernel outputs (softmax, layernorm, rmsnorm) per row length."""
    params, lines, outs = [], [], []
    for n in lengths:
        params += [f"x{n}: f32[{ROWS}, {n}]", f"g{n}: f32[{n}]", f"b{n}: f32[{n}]"]
        for op, call in (("s", f"softmax(x{n})"), ("l", f"layernorm(x{n}, g{n}, b{n})"), ("r", f"rmsnorm(x{n}, g{n})")):
            lines.append(f"    {op}{n} = kernel {{ {call} }}")
            outs.append(f"{op}{n}")
    return f"graph rows({', '.join(params)}) {{\n" + "\n".join(lines) + f"\n    return {', '.join(outs)}\n}}\n"


def arrays(lengths, rng, scale=3.0, shift=0.0):
    out = []
    for n in lengths:
        out += [(rng.standard_normal((ROWS, n)) * scale + shift).astype(np.float32),
                rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)]
    return out


def close(got, want, what):
    ok = np.isclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True)
    assert ok.all(), f"{what}: {int((~ok).sum())} differ, max abs error {np.nanmax(np.abs(got - want)):.3g}"


@pytest.fixture(scope="module", params=MACHINES)
def compiled(request):
    with machine.pinned(request.param):
        return eqfuse.compile(graph(LENGTHS), fuse="manual", verify=False)


@pytest.mark.heavy  # (the fast tier's time)
@pytest.mark.parametrize("scale,shift", [(3.0, 0.0), (300.0, 0.0), (0.5, 1e3)], ids=["normal", "wide", "offset"])
def test_rows_match_float64_numpy(compiled, scale, shift):
    """Every length and magnitude: wide rows put most exps far below the maximum; an offset of
    1e3 over a spread of 0.5 is where a one-pass sum-of-squares variance loses every digit and a
    plain two-pass one the last few (the float32 mean is off by up to half an ulp of 1e3)."""
    ins = arrays(LENGTHS, np.random.default_rng(int(scale + shift)), scale, shift)
    outs = compiled(*ins)
    for k, n in enumerate(LENGTHS):
        x, g, b = ins[3 * k: 3 * k + 3]
        s, ln, rms = outs[3 * k: 3 * k + 3]
        close(s, softmax64(x), f"softmax L={n}")
        close(ln, layernorm64(x, g, b), f"layernorm L={n}")
        close(rms, rmsnorm64(x, g), f"rmsnorm L={n}")


@pytest.mark.heavy  # (the fast tier's time)
def test_softmax_with_minus_inf(compiled):
    """-inf anywhere in a row (and in the masked tail of the vector loop) is 0; a row of -inf only
    is NaN, as in numpy; +inf makes its row NaN."""
    rng = np.random.default_rng(3)
    ins = arrays(LENGTHS, rng)
    for k, n in enumerate(LENGTHS):
        x = ins[3 * k]
        x[0, rng.integers(n, size=max(1, n // 3))] = -np.inf
        x[1, -1] = -np.inf
        x[2] = -np.inf
        x[3, 0] = np.inf
        x[4, :] = 0.0
    outs = compiled(*ins)
    for k, n in enumerate(LENGTHS):
        got, want = outs[3 * k], softmax64(ins[3 * k])
        assert np.array_equal(np.isnan(got), np.isnan(want)), f"L={n}"
        close(got, want, f"softmax -inf L={n}")
        assert np.isnan(got[2]).all() and (n == 1 or np.isnan(got[3]).all())


@pytest.mark.parametrize("model", MACHINES)
def test_exp_accuracy_over_the_whole_range(model):
    """p = e^x / sum with x from 0 down to -110 (into the subnormals and to 0). The relative error
    is below 2e-6 while e^x > 1e-6 (what rtol 1e-5 and atol 1e-6 see), below 2e-5 down to the
    smallest normal float (the rounding of x log2 e grows with |x|), and absolute below the
    smallest normal after."""
    n = 2221
    x = -np.linspace(0, 110, n, dtype=np.float32)[None, :]
    src = f"graph e(x: f32[1, {n}]) -> f32[1, {n}] {{ return kernel {{ softmax(x) }} }}"
    with machine.pinned(model):
        got = eqfuse.compile(src, verify=False)(x).astype(np.float64)
    want = softmax64(x)
    normal = want > np.finfo(np.float32).tiny
    rel = np.abs(got - want) / np.maximum(want, np.finfo(np.float32).tiny)
    assert rel[want > 1e-6].max() < 2e-6
    assert rel[normal].max() < 2e-5
    assert np.all(np.abs(got[~normal] - want[~normal]) <= np.finfo(np.float32).tiny)


@pytest.mark.parametrize("model", MACHINES)
def test_strided_and_fused_rows(model):
    """softmax over axis 0 (rows at a stride: the portable loop), a prologue and epilogue around
    each op at an odd length, and a row op as a GEMM's epilogue (no next row to prefetch)."""
    src = ("graph f(x: f32[37, 19], r: f32[37, 19], g: f32[19], b: f32[19], w: f32[19, 23]) {\n"
           "    a = kernel { softmax(x, axis=0) }\n"
           "    c = kernel { softmax(x * 0.5 + r) * 2 }\n"
           "    d = kernel { relu(layernorm(x + r, g, b)) }\n"
           "    e = kernel { rmsnorm(x - r, g) + 1 }\n"
           "    h = kernel { softmax(x @ w) }\n"
           "    return a, c, d, e, h\n}\n")
    rng = np.random.default_rng(5)
    x, r = (rng.standard_normal((37, 19)).astype(np.float32) * 3 for _ in range(2))
    g, b = (rng.standard_normal(19).astype(np.float32) for _ in range(2))
    w = rng.standard_normal((19, 23)).astype(np.float32)
    with machine.pinned(model):
        mod = eqfuse.compile(src, fuse="manual", verify=False)
    a, c, d, e, h = mod(x, r, g, b, w)
    close(a, softmax64(x, axis=0), "softmax axis 0")
    close(c, softmax64(x * np.float32(0.5) + r) * 2, "softmax prologue epilogue")
    close(d, np.maximum(layernorm64(x + r, g, b), 0), "layernorm prologue epilogue")
    close(e, rmsnorm64(x - r, g) + 1, "rmsnorm prologue epilogue")
    close(h, softmax64(x.astype(np.float64) @ w), "softmax GEMM epilogue")
    kinds = {k.name: k.kind for k in mod.kernels}
    assert "contraction_row" in kinds.values(), kinds


def test_the_next_row_is_prefetched_only_from_contiguous_f32_rows():
    """A plain softmax names the row of its input one block ahead; a softmax over axis 0 (strided
    rows) and a GEMM's row epilogue (its row is C's, in cache) pass NULL."""
    src = ("graph f(x: f32[8, 40], w: f32[40, 40], g: f32[40], b: f32[40]) {\n"
           "    a = kernel { softmax(x) }\n    c = kernel { softmax(x, axis=0) }\n"
           "    d = kernel { layernorm(x @ w, g, b) }\n    return a, c, d\n}\n")
    with machine.pinned("zen4"):
        mod = eqfuse.compile(src, fuse="manual", verify=False)
    by_kind = {}
    for k in mod.kernels:
        by_kind.setdefault(k.kind, []).append(k.c_source)
    plain, strided = by_kind["row"]
    assert "mx[r - rb], (r + EQF_ROW_BLOCK(40) < 8 ? in0 + (r + EQF_ROW_BLOCK(40)) * 40 : NULL));" in plain
    assert "mx[r - rb], NULL);" in strided
    assert "mean0, NULL, &dev)" in by_kind["contraction_row"][0]
