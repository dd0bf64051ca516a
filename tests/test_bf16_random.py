"""precision="bf16" on random GEMMs and convolutions (docs/precision.md, "The error bound"): shapes,
layouts and options drawn by hypothesis, compiled in bf16 on this CPU's instruction path and on the
fallback (a machine model without AVX512_BF16, so both run on every x86-64 machine), and in the
extended tier on AMX-BF16 tiles emulated in C (tests/test_amx.py's emulation), each result checked
at the bound of the precision its plan reports:

- GEMMs: M, K, N from 1 (K across several K slices too), B bound by params= or passed per call, B
  transposed, a batch of A over one B, bias, and relu or gelu epilogues;
- convs: 1-3 images, 1-20 channels, 1x1 to 7x7 kernels, strides, dilations, even and uneven
  padding, groups (depthwise too), conv1d, bias and relu; Winograd F(2x2, 3x3) off
  (EQFUSE_CONV_WINOGRAD=0: its looser bound has its own tests in tests/test_bf16_conv.py), so
  every conv is held to the direct bound with K = C / group x KH x KW;
- attention (softmax(q k^T x scale (+ mask)) @ v): batches, query and key lengths, head sizes,
  scales, causal and random additive masks, at the attention bound of docs/precision.md
  (tests/test_bf16.py's attention_bound).

A kernel reported as bf16 is checked twice, as tests/test_bf16.py does: against the exact result
at the documented bound (2u + u^2 + 1.01 K eps) sum |a||b|, and against the exact result of its
operands rounded to bf16 at the accumulation bound alone (which a kernel that multiplied in f32
fails). A kernel reported as f32 under bf16 (a depthwise conv, a narrow GEMM: docs/precision.md)
is held to the bound with u = 0. Every bound is the documented one, computed from each example's
own operands; none is a tolerance chosen after the fact. A few examples in the default run; many
in the extended tier (`-m extended`).
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import sliding_window_view
from test_bf16 import EPS, GELU_F32, GELU_LIP, U, attention_bound, bf16, gelu

import eqfuse
from eqfuse import machine

CONTRACTIONS = ("contraction", "contraction_row", "conv2d")
FEW = settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
MANY = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))


@contextlib.contextmanager
def on_path(path: str):
    """Plans and builds for an instruction path: this host's model with vdpbf16ps, without it (the
    fallback), or with AMX-BF16 tiles emulated in C (common_amx.h's EQF_AMX_EMULATE, as
    tests/test_amx.py builds them; its other kernels on vdpbf16ps, so that path needs the host's)."""
    m = machine.machine()
    if path == "fallback":
        with machine.pinned(dataclasses.replace(m, avx512_bf16=False, amx_bf16=False, bf16_fallback_all=True)):
            yield
        return
    if not (machine.host_isa()["avx512_bf16"] and m.simd_floats >= 16):
        pytest.skip("this CPU (or the pinned machine model's vector width) has no AVX512_BF16: the "
                    f"{path} path cannot run here (the fallback's examples cover bf16)")
    if path == "avx512_bf16":
        with machine.pinned(dataclasses.replace(m, avx512_bf16=True, amx_bf16=False)):
            yield
        return
    assert path == "amx_emulated"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EQFUSE_CFLAGS", "-DEQF_AMX_EMULATE")
        with machine.pinned(dataclasses.replace(m, avx512_bf16=True, amx_bf16=True), clamp=False):
            yield


def runs_on(path: str) -> set[str]:
    """The precision paths a bf16 kernel may report on that path (with AMX, the kernels that are
    not blocked GEMMs keep vdpbf16ps: docs/precision.md, "AMX-BF16")."""
    return {"amx_emulated": {"amx_bf16", "avx512_bf16"}}.get(path, {path})


PATHS = ["avx512_bf16", "fallback", pytest.param("amx_emulated", marks=pytest.mark.extended)]


def the_plan(mod):
    """(precision, path) of the module's one contraction, as its plan and the report give it."""
    (p,) = [p for p in mod.default.last.plans if p.kind in CONTRACTIONS]
    entry = mod.report["precision"][p.name]
    assert (entry["precision"], entry["path"]) == (p.precision, p.precision_path)
    return p.precision, p.precision_path


def check(y, exact, magnitude, K: int, precision: str, epilogue=lambda z: z, lip=1.0, own=EPS):
    """y = epilogue(z) with z a sum of K products: exact(rounded) is z in float64 from the operands
    (rounded to bf16 or not), magnitude(rounded) the sum of the products' magnitudes. The bound of
    docs/precision.md, then passed through a Lipschitz epilogue that adds its own f32 rounding."""
    u = U if precision == "bf16" else 0.0
    rounds = (False, True) if precision == "bf16" else (False,)
    for rounded in rounds:
        e = (1.01 * K * EPS if rounded else 2 * u + u * u + 1.01 * K * EPS) * magnitude(rounded)
        z = exact(rounded)
        bound = lip * (e + EPS * (np.abs(z) + e)) + own * (np.abs(z) + e)
        err = np.abs(np.asarray(y, np.float64) - epilogue(z))
        worst = np.unravel_index(np.argmax(err - bound), err.shape)
        assert np.all(err <= bound), (f"{precision}: error {err[worst]:.3g} > bound {bound[worst]:.3g} at "
                                      f"{tuple(map(int, worst))} ({'bf16' if rounded else 'exact'} operands)")


# ------------------------------------------------------------------ GEMMs


@st.composite
def gemms(draw):
    dim = st.one_of(st.integers(1, 40), st.integers(41, 300))
    K = draw(st.one_of(st.integers(1, 64), st.integers(65, 700), st.integers(1500, 2600)))
    return {"M": draw(dim), "K": K, "N": draw(dim), "batch": draw(st.sampled_from([0, 0, 2, 3])),
            "bt": draw(st.booleans()), "bound": draw(st.booleans()),
            "act": draw(st.sampled_from(["", "relu", "gelu"])), "seed": draw(st.integers(0, 2**16))}


def gemm_source(c) -> str:
    M, K, N = c["M"], c["K"], c["N"]
    xs = f"{c['batch']}, {M}, {K}" if c["batch"] else f"{M}, {K}"
    ys = f"{c['batch']}, {M}, {N}" if c["batch"] else f"{M}, {N}"
    ws, prod = (f"{N}, {K}", "x @ transpose(w)") if c["bt"] else (f"{K}, {N}", "x @ w")
    body = f"{c['act']}({prod} + b)" if c["act"] else f"{prod} + b"
    return f"graph g(x: f32[{xs}], w: f32[{ws}], b: f32[{N}]) -> f32[{ys}] {{\n  return {body}\n}}"


def run_gemm(path: str, c) -> None:
    rng = np.random.default_rng(c["seed"])
    M, K, N = c["M"], c["K"], c["N"]
    x = rng.standard_normal((c["batch"], M, K) if c["batch"] else (M, K)).astype(np.float32)
    w = rng.standard_normal((N, K) if c["bt"] else (K, N)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    with on_path(path):
        mod = eqfuse.compile(gemm_source(c), params={"w": w, "b": b} if c["bound"] else None, precision="bf16")
        y = mod(x) if c["bound"] else mod(x, w, b)
        precision, got = the_plan(mod)
    assert got in (runs_on(path) if precision == "bf16" else {"f32"})
    wk = (w.T if c["bt"] else w).astype(np.float32)

    def ops(rounded):
        return [np.asarray(bf16(a) if rounded else a, np.float64) for a in (x, wk)]

    def exact(rounded):
        a, bb = ops(rounded)
        return a @ bb + b.astype(np.float64)

    def magnitude(rounded):
        a, bb = ops(rounded)
        return np.abs(a) @ np.abs(bb)

    act = {"": (lambda z: z, 1.0, EPS), "relu": (lambda z: np.maximum(z, 0), 1.0, EPS),
           "gelu": (gelu, GELU_LIP, GELU_F32)}[c["act"]]
    check(y, exact, magnitude, K, precision, *act)


@FEW
@given(c=gemms())
@pytest.mark.parametrize("path", PATHS)
def test_random_bf16_gemms_within_the_bound(path, c):
    run_gemm(path, c)


@pytest.mark.extended
@MANY
@given(c=gemms())
@pytest.mark.parametrize("path", PATHS)
def test_many_random_bf16_gemms_within_the_bound(path, c):
    run_gemm(path, c)


# ------------------------------------------------------------------ convolutions


@st.composite
def convs(draw):
    one_d = draw(st.integers(0, 4)) == 0
    group = draw(st.sampled_from([1, 1, 1, 2, 3, "depthwise"]))
    cg = draw(st.integers(1, 12))
    C = cg if group == "depthwise" else cg * group
    G = C if group == "depthwise" else group
    O = G * draw(st.integers(1, 2) if group == "depthwise" else st.integers(1, 24))  # (grouped: 16 a group and more)
    kh = 1 if one_d else draw(st.sampled_from([1, 2, 3, 3, 5, 7]))
    kw = draw(st.sampled_from([1, 2, 3, 3, 5, 7]))
    dil = [1 if one_d else draw(st.sampled_from([1, 1, 2])), draw(st.sampled_from([1, 1, 2]))]
    stride = [1 if one_d else draw(st.sampled_from([1, 1, 2])), draw(st.sampled_from([1, 1, 2, 3]))]
    span = [(kh - 1) * dil[0] + 1, (kw - 1) * dil[1] + 1]
    pads = [draw(st.integers(0, k // 2)) for k in (kh, kw, kh, kw)]  # top, left, bottom, right
    if one_d:  # (conv1d's padding is one int, on both ends)
        pads[0] = pads[2] = 0
        pads[3] = pads[1]
    H = 1 if one_d else draw(st.integers(max(1, span[0] - pads[0] - pads[2]), 20))
    W = draw(st.integers(max(1, span[1] - pads[1] - pads[3]), 24))
    return {"N": draw(st.integers(1, 3)), "C": C, "O": O, "G": G, "H": H, "W": W, "kh": kh, "kw": kw,
            "dil": dil, "stride": stride, "pads": pads, "one_d": one_d, "bound": draw(st.booleans()),
            "seed": draw(st.integers(0, 2**16))}


def out_size(n, k, d, s, p0, p1):
    return (n + p0 + p1 - (k - 1) * d - 1) // s + 1


def conv_source(c) -> tuple[str, tuple, tuple]:
    N, C, O, G = c["N"], c["C"], c["O"], c["G"]
    p = c["pads"]
    OH = out_size(c["H"], c["kh"], c["dil"][0], c["stride"][0], p[0], p[2])
    OW = out_size(c["W"], c["kw"], c["dil"][1], c["stride"][1], p[1], p[3])
    if c["one_d"]:
        xs, ws, ys = (N, C, c["W"]), (O, C // G, c["kw"]), (N, O, OW)
        opts = f"stride={c['stride'][1]}, padding={p[1]}, dilation={c['dil'][1]}"
        op = "conv1d"
    else:
        xs, ws, ys = (N, C, c["H"], c["W"]), (O, C // G, c["kh"], c["kw"]), (N, O, OH, OW)
        opts = (f"stride=[{c['stride'][0]}, {c['stride'][1]}], padding=[{p[0]}, {p[1]}, {p[2]}, {p[3]}], "
                f"dilation=[{c['dil'][0]}, {c['dil'][1]}]")
        op = "conv2d"
    dims = lambda s: ", ".join(map(str, s))  # noqa: E731
    src = (f"graph g(x: f32[{dims(xs)}], w: f32[{dims(ws)}], b: f32[{O}]) -> f32[{dims(ys)}] {{\n"
           f"  return relu({op}(x, w, b, {opts}, group={G}))\n}}")
    return src, xs, ws


def conv64(x, w, c):
    """The conv in float64 (NCHW, OIHW; x and w of 4 dims), group by group."""
    p, (sh, sw), (dh, dw) = c["pads"], c["stride"], c["dil"]
    xp = np.pad(np.asarray(x, np.float64), ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])))
    kh, kw = w.shape[2:]
    win = sliding_window_view(xp, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    G, cg, og = c["G"], x.shape[1] // c["G"], w.shape[0] // c["G"]
    return np.concatenate([np.einsum("nchwij,ocij->nohw", win[:, g * cg:(g + 1) * cg],
                                     np.asarray(w[g * og:(g + 1) * og], np.float64)) for g in range(G)], axis=1)


def run_conv(path: str, c, monkeypatch) -> None:
    monkeypatch.setenv("EQFUSE_CONV_WINOGRAD", "0")
    src, xs, ws = conv_source(c)
    rng = np.random.default_rng(c["seed"])
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(c["O"]).astype(np.float32)
    with on_path(path):
        mod = eqfuse.compile(src, params={"w": w, "b": b} if c["bound"] else None, precision="bf16")
        y = np.asarray(mod(x) if c["bound"] else mod(x, w, b), np.float64)
        precision, got = the_plan(mod)
    assert got in (runs_on(path) if precision == "bf16" else {"f32"})
    x4, w4 = (x[:, :, None, :], w[:, :, None, :]) if c["one_d"] else (x, w)
    y4 = y[:, :, None, :] if c["one_d"] else y
    bias = b.astype(np.float64)[None, :, None, None]

    def exact(rounded):
        return conv64(bf16(x4) if rounded else x4, bf16(w4) if rounded else w4, c) + bias

    def magnitude(rounded):
        return conv64(np.abs(bf16(x4) if rounded else x4), np.abs(bf16(w4) if rounded else w4), c)

    check(y4, exact, magnitude, ws[1] * c["kh"] * c["kw"], precision, lambda z: np.maximum(z, 0))


@FEW
@given(c=convs())
@pytest.mark.parametrize("path", PATHS)
def test_random_bf16_convs_within_the_bound(path, c, monkeypatch):
    run_conv(path, c, monkeypatch)


@pytest.mark.extended
@MANY
@given(c=convs())
@pytest.mark.parametrize("path", PATHS)
def test_many_random_bf16_convs_within_the_bound(path, c, monkeypatch):
    run_conv(path, c, monkeypatch)


# ------------------------------------------------------------------ attention


@st.composite
def attentions(draw):
    return {"B": draw(st.integers(1, 3)), "Sq": draw(st.integers(2, 80)), "Sk": draw(st.integers(1, 200)),
            "D": draw(st.integers(4, 128)), "Dv": draw(st.integers(1, 96)),
            "scale": draw(st.sampled_from([0.125, 0.3, 1.0])), "mask": draw(st.sampled_from(["", "causal", "random"])),
            "seed": draw(st.integers(0, 2**16))}


def run_attention(path: str, c) -> None:
    B, Sq, Sk, D, Dv = c["B"], c["Sq"], c["Sk"], c["D"], c["Dv"]
    rng = np.random.default_rng(c["seed"])
    q, k = (rng.standard_normal((B, S, D)).astype(np.float32) for S in (Sq, Sk))
    v = rng.standard_normal((B, Sk, Dv)).astype(np.float32)
    mk = (np.triu(np.full((Sq, Sk), -1e4, np.float32), 1 + max(Sk - Sq, 0)) if c["mask"] == "causal" else
          np.where(rng.random((Sq, Sk)) < 0.3, -1e4, rng.standard_normal((Sq, Sk))).astype(np.float32)
          if c["mask"] == "random" else None)
    m = f", mk: f32[{Sq}, {Sk}]" if mk is not None else ""
    score = f"q @ transpose(k, perm=[0, 2, 1]) * {c['scale']}" + (" + mk" if mk is not None else "")
    src = (f"graph g(q: f32[{B}, {Sq}, {D}], k: f32[{B}, {Sk}, {D}], v: f32[{B}, {Sk}, {Dv}]{m}) -> f32[{B}, {Sq}, {Dv}] "
           f"{{\n  return softmax({score}, axis=-1) @ v\n}}")
    with on_path(path):
        mod = eqfuse.compile(src, precision="bf16")
        y = np.asarray(mod(q, k, v, *([mk] if mk is not None else [])), np.float64)
    (p,) = [p for p in mod.default.last.plans if p.kind == "attention"]
    entry = mod.report["precision"][p.name]
    assert (entry["precision"], entry["path"]) == (p.precision, p.precision_path)
    if p.precision == "bf16":
        assert p.precision_path in (runs_on(path) if p.detail.vec else {"fallback"})  # (the portable loops: the fallback)
    ref, bound = attention_bound(q, k, v, c["scale"], mk, p.tiles["bk"], u=U if p.precision == "bf16" else 0.0)
    err = np.abs(y - ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), f"{p.precision}: error {err[worst]:.3g} > bound {bound[worst]:.3g} at {worst}"


@FEW
@given(c=attentions())
@pytest.mark.parametrize("path", PATHS)
def test_random_bf16_attention_within_the_bound(path, c):
    run_attention(path, c)


@pytest.mark.extended
@MANY
@given(c=attentions())
@pytest.mark.parametrize("path", PATHS)
def test_many_random_bf16_attention_within_the_bound(path, c):
    run_attention(path, c)
