"""precision="bf16" for convolutions (docs/precision.md, "Convolutions"): each conv algorithm through
both instruction paths (the AVX512_BF16 one skipped where the CPU lacks it, the fallback forced by
pinning a machine model without it), in one module per path:

- the direct conv (channels in the lanes), a stem's 3 channels at 7x7 stride 2 (a kernel row of
  21 steps: 10 K-pairs, then one step alone);
- two direct convs with the blocked layout between them (the second rounds its blocked input to
  bf16 as it copies it), checked at the composed bound;
- Winograd F(2x2, 3x3), its weights passed at each call (transformed and rounded per call), at
  Winograd's own bound;
- a 1x1 conv that runs as im2col + GEMM (the GEMM's bf16 path).

Every bound is computed from each test's own operands, as docs/precision.md states it, never a
tolerance chosen after the fact. Each conv is also checked against the exact result of its
operands rounded to bf16 (round to nearest even) at the accumulation bound alone: a kernel that
multiplied in f32 fails that check.
"""

import dataclasses

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

import eqfuse
from eqfuse import machine

U = 2.0**-8  # bf16's unit roundoff
EPS = 2.0**-24  # f32's


def gamma(n: int) -> float:
    return n * EPS / (1 - n * EPS)


def bf16(a: np.ndarray) -> np.ndarray:
    """a (f32) rounded to bf16 as vcvtne2ps2bf16 does (to nearest even; the inputs here are normal)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def conv64(x, w, stride=1, padding=0):
    """conv2d in float64 (NCHW, OIHW)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    win = sliding_window_view(xp, w.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
    return np.einsum("nchwij,ocij->nohw", win, w)


def direct_bound(x, w, stride, padding):
    """The documented bound of a conv's output elements, a dot product of K = C x KH x KW terms:
    (2u + u^2 + 1.01 K eps) sum |x||w|; and the bound against the bf16 operands' exact result."""
    K = w.shape[1] * w.shape[2] * w.shape[3]
    full = (2 * U + U * U + 1.01 * K * EPS) * conv64(np.abs(x), np.abs(w), stride, padding)
    acc = 1.01 * K * EPS * conv64(np.abs(bf16(x)), np.abs(bf16(w)), stride, padding)
    return full, acc


def check_direct(y, x, w, stride, padding):
    full, acc = direct_bound(x, w, stride, padding)
    for xs, ws, bound in ((x, w, full), (bf16(x), bf16(w), acc)):
        err = np.abs(y - np.maximum(conv64(xs, ws, stride, padding), 0))  # (relu: exact, 1-Lipschitz)
        assert np.all(err <= bound), float(np.max(err - bound))


# F(2x2, 3x3)'s matrices, as conv_winograd.c applies them
BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)


def winograd_check(y, x, w):
    """A Winograd F(2x2, 3x3) conv (padding 1) in bf16 within docs/precision.md's bound:
    |y - y_ref| <= ((1 + dU)(1 + dV)(1 + gamma_C)(1 + gamma_4) - 1) |A^T| (sum_c |U_c| |V_c|) |A|,
    with |U| = |G||g||G^T|, |V| = |B^T||d||B| (the transforms of the magnitudes), dU = u + eps + u eps
    + 2^-50 (U in double, rounded to f32 then to bf16), dV = (1 + gamma_2)(1 + u) - 1 (two f32 adds,
    then bf16). Then against the exact result of the kernel's own rounded U and V (computed here in
    the kernel's order of f32 operations) at the accumulation bound alone."""
    N, C, H, W = x.shape
    O = w.shape[0]
    TH, TW = (H + 1) // 2, (W + 1) // 2
    xp = np.zeros((N, C, 2 * TH + 2, 2 * TW + 2), np.float32)
    xp[:, :, 1:H + 1, 1:W + 1] = x
    d = sliding_window_view(xp, (4, 4), axis=(2, 3))[:, :, ::2, ::2]  # [N][C][TH][TW][4][4]
    # V in the kernel's f32 order: rows, then columns
    t = np.stack([d[..., 0, :] - d[..., 2, :], d[..., 1, :] + d[..., 2, :], d[..., 2, :] - d[..., 1, :],
                  d[..., 1, :] - d[..., 3, :]], axis=-2)
    v32 = np.stack([t[..., 0] - t[..., 2], t[..., 1] + t[..., 2], t[..., 2] - t[..., 1], t[..., 1] - t[..., 3]], axis=-1)
    g = w.astype(np.float64)
    tg = np.stack([g[..., 0, :], 0.5 * (g[..., 0, :] + g[..., 1, :] + g[..., 2, :]),
                   0.5 * (g[..., 0, :] - g[..., 1, :] + g[..., 2, :]), g[..., 2, :]], axis=-2)
    u64 = np.stack([tg[..., 0], 0.5 * (tg[..., 0] + tg[..., 1] + tg[..., 2]),
                    0.5 * (tg[..., 0] - tg[..., 1] + tg[..., 2]), tg[..., 2]], axis=-1)
    ub, vb = bf16(u64.astype(np.float32)).astype(np.float64), bf16(v32).astype(np.float64)
    uabs = np.einsum("ij,ocjk,lk->ocil", np.abs(G), np.abs(g), np.abs(G))
    vabs = np.einsum("ij,nctsjk,lk->nctsil", np.abs(BT), np.abs(d.astype(np.float64)), np.abs(BT))

    def out(m, absolute=False):  # A^T m A of each tile ([N][O][TH][TW][4][4]), as NCHW
        at = np.abs(AT) if absolute else AT
        yt = np.einsum("ij,notsjk,lk->notsil", at, m, at)
        return yt.transpose(0, 1, 2, 4, 3, 5).reshape(N, O, 2 * TH, 2 * TW)[:, :, :H, :W]

    wsum = out(np.einsum("ocij,nctsij->notsij", uabs, vabs), True)
    dU, dV = U + EPS + U * EPS + 2.0**-50, (1 + gamma(2)) * (1 + U) - 1
    full = ((1 + dU) * (1 + dV) * (1 + gamma(C)) * (1 + gamma(4)) - 1) * wsum
    err = np.abs(y - np.maximum(conv64(x, w, 1, 1), 0))
    assert np.all(err <= full), f"exact operands: {float(np.max(err - full)):.3g} over the bound"
    own = out(np.einsum("ocij,nctsij->notsij", ub, vb))
    acc = ((1 + gamma(C)) * (1 + gamma(4)) - 1) * out(np.einsum("ocij,nctsij->notsij", np.abs(ub), np.abs(vb)), True)
    err = np.abs(y - np.maximum(own, 0))
    assert np.all(err <= acc), f"bf16 operands: {float(np.max(err - acc)):.3g} over the accumulation bound"
    return float(np.max(err)), float(np.max(full))


# stem: 3 channels 7x7/2 (direct, odd C); chain: two 3x3/2 direct convs, blocked between them;
# wino: 3x3 stride 1 at 10 x 10 (Winograd), its weights per call; pw: 1x1 (im2col + GEMM)
SRC = """graph convs(x1: f32[2, 3, 20, 20], ws: f32[16, 3, 7, 7], x2: f32[1, 16, 18, 18], w1: f32[32, 16, 3, 3],
                 w2: f32[48, 32, 3, 3], x3: f32[1, 16, 10, 10], ww: f32[32, 16, 3, 3], x4: f32[1, 24, 6, 6],
                 wp: f32[40, 24, 1, 1]) -> (f32[2, 16, 10, 10], f32[1, 48, 5, 5], f32[1, 32, 10, 10], f32[1, 40, 6, 6]) {
  stem = relu(conv2d(x1, ws, stride=2, padding=3))
  h = relu(conv2d(x2, w1, stride=2, padding=1))
  chain = relu(conv2d(h, w2, stride=2, padding=1))
  wino = relu(conv2d(x3, ww, padding=1))
  pw = relu(conv2d(x4, wp))
  return stem, chain, wino, pw
}"""
SHAPES = {"x1": (2, 3, 20, 20), "ws": (16, 3, 7, 7), "x2": (1, 16, 18, 18), "w1": (32, 16, 3, 3),
          "w2": (48, 32, 3, 3), "x3": (1, 16, 10, 10), "ww": (32, 16, 3, 3), "x4": (1, 24, 6, 6),
          "wp": (40, 24, 1, 1)}
BOUND = ("ws", "w1", "w2", "wp")  # (ww passed at each call)


# (the fallback at AVX2's 8 floats a vector too: x86-64-v3 kernels, in the extended tier)
@pytest.fixture(scope="module", params=["avx512_bf16", "fallback", pytest.param("fallback-avx2", marks=pytest.mark.extended)])
def run(request):
    """(path, arrays, outputs, plans) of SRC compiled in bf16 for a machine with (AVX512_BF16) or
    without (fallback) vdpbf16ps; one module per path, shared by the tests."""
    m = machine.MODELS["avx2"] if request.param == "fallback-avx2" else machine.machine()
    if request.param == "avx512_bf16" and not (machine.host_isa()["avx512_bf16"] and m.simd_floats >= 16):
        pytest.skip("this CPU (or the pinned machine model's vector width) has no AVX512_BF16: the vdpbf16ps "
                    "path cannot run here (the fallback's run covers the bf16 convs)")
    rng = np.random.default_rng(7)
    xs = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    with machine.pinned(dataclasses.replace(m, avx512_bf16=request.param == "avx512_bf16", amx_bf16=False,
                                            bf16_fallback_all=True)):
        mod = eqfuse.compile(SRC, params={k: xs[k] for k in BOUND}, precision="bf16")
        ys = mod(*(xs[k] for k in SHAPES if k not in BOUND))
    return request.param.split("-")[0], xs, [np.asarray(y, np.float64) for y in ys], mod


def test_every_conv_runs_in_bf16_on_its_path(run):
    path, _, _, mod = run
    convs = [p for p in mod.default.last.plans if p.kind == "conv2d"]
    algos = sorted(getattr(p.detail, "algorithm", "im2col") for p in convs)
    assert algos == ["channels", "channels", "channels", "im2col", "winograd"]
    for p in convs:
        assert (p.precision, p.precision_path) == ("bf16", path)
        assert mod.report["precision"][p.name] == {"precision": "bf16", "path": path}
    (second,) = [p for p in convs if getattr(p.detail, "in_blocked", False)]  # (the chain's, reading blocks)
    assert not second.detail.in_place  # (bf16: the copy rounds the input)


def test_direct_conv_odd_channels_within_the_bound(run):
    _, xs, ys, _ = run
    check_direct(ys[0], xs["x1"], xs["ws"], 2, 3)


def test_im2col_conv_within_the_bound(run):
    _, xs, ys, _ = run
    check_direct(ys[3], xs["x4"], xs["wp"], 1, 0)


def test_blocked_chain_within_the_composed_bound(run):
    """h = relu(conv(x2, w1)) (blocked, never stored NCHW), then relu(conv(h, w2)): h's error is at
    most E1 (relu is exact and 1-Lipschitz); the second conv rounds the computed ĥ, |ĥ| <= |h| + E1:
    its bound over those magnitudes, plus conv(E1, |w2|) carried from h (docs/precision.md, "Layers")."""
    _, xs, ys, _ = run
    x2, w1, w2 = xs["x2"], xs["w1"], xs["w2"]
    h = np.maximum(conv64(x2, w1, 2, 1), 0)
    e1, _ = direct_bound(x2, w1, 2, 1)
    K2 = 32 * 9
    aw2 = np.abs(w2).astype(np.float64)
    bound = (2 * U + U * U + 1.01 * K2 * EPS) * conv64(h + e1, aw2, 2, 1) + conv64(e1, aw2, 2, 1)
    err = np.abs(ys[1] - np.maximum(conv64(h, w2, 2, 1), 0))
    assert np.all(err <= bound), float(np.max(err - bound))


def test_winograd_within_its_bound(run):
    _, xs, ys, _ = run
    winograd_check(ys[2], xs["x3"], xs["ww"])


# ---------------------------------------------------------------- grouped and depthwise convs
# (docs/precision.md, "Depthwise and grouped convolutions"): a grouped conv of at least a vector of
# output channels per group multiplies bf16 K-pairs of its group's input channels; ga: 24 output
# channels a group (three vectors of 8 lanes, conv_grouped.lanes), its weights bound; gb: 15 input
# channels a group (an odd count: a zero channel completes the last pair), stride 2, its weights
# passed at each call; dw: a depthwise conv, which stays f32 and says why.
SRC_G = """graph gconvs(x1: f32[1, 48, 9, 11], w1: f32[48, 24, 3, 3], x2: f32[2, 30, 10, 9], w2: f32[32, 15, 3, 3],
                   x3: f32[1, 16, 8, 8], w3: f32[16, 1, 3, 3]) -> (f32[1, 48, 9, 11], f32[2, 32, 5, 5], f32[1, 16, 8, 8]) {
  ga = relu(conv2d(x1, w1, padding=1, group=2))
  gb = relu(conv2d(x2, w2, stride=2, padding=1, group=2))
  dw = relu(conv2d(x3, w3, padding=1, group=16))
  return ga, gb, dw
}"""
SHAPES_G = {"x1": (1, 48, 9, 11), "w1": (48, 24, 3, 3), "x2": (2, 30, 10, 9), "w2": (32, 15, 3, 3),
            "x3": (1, 16, 8, 8), "w3": (16, 1, 3, 3)}


def conv64_groups(x, w, stride, padding, group):
    """A grouped conv2d in float64: each group's channels a conv of their own."""
    cg, og = x.shape[1] // group, w.shape[0] // group
    return np.concatenate([conv64(x[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og], stride, padding)
                           for g in range(group)], axis=1)


@pytest.fixture(scope="module", params=["avx512_bf16", "fallback"])
def run_grouped(request):
    """(path, arrays, outputs, module) of SRC_G compiled in bf16 on each instruction path."""
    m = machine.machine()
    if request.param == "avx512_bf16" and not (machine.host_isa()["avx512_bf16"] and m.simd_floats >= 16):
        pytest.skip("this CPU (or the pinned machine model's vector width) has no AVX512_BF16: the vdpbf16ps "
                    "path cannot run here (the fallback's run covers the bf16 grouped convs)")
    rng = np.random.default_rng(11)
    xs = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES_G.items()}
    with machine.pinned(dataclasses.replace(m, avx512_bf16=request.param == "avx512_bf16", bf16_fallback_all=True)):
        mod = eqfuse.compile(SRC_G, params={"w1": xs["w1"]}, precision="bf16")
        ys = mod(*(xs[k] for k in SHAPES_G if k != "w1"))
    return request.param, xs, [np.asarray(y, np.float64) for y in ys], mod


def test_grouped_convs_run_in_bf16_and_depthwise_in_f32_with_a_note(run_grouped):
    path, xs, ys, mod = run_grouped
    convs = [p for p in mod.default.last.plans if p.kind == "conv2d"]
    got = sorted((p.detail.cg, p.precision, p.precision_path) for p in convs)
    assert got == [(1, "f32", "f32"), (15, "bf16", path), (24, "bf16", path)]
    # (24 per group in three blocks of 8 lanes: at 16 lanes half width, vdpbf16ps's ymm form on that
    # path; at 8 the whole width, whose half would be narrower than 8: conv_grouped.lanes)
    assert {p.detail.cg: p.detail.vl for p in convs}[24] == 8
    (dw,) = [p for p in convs if p.detail.cg == 1]
    assert "depthwise" in mod.report["precision"][dw.name]["note"]
    np.testing.assert_allclose(ys[2], np.maximum(conv64_groups(xs["x3"], xs["w3"], 1, 1, 16), 0), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("out, x, w, stride, group", [(0, "x1", "w1", 1, 2), (1, "x2", "w2", 2, 2)])
def test_grouped_conv_within_the_bound(run_grouped, out, x, w, stride, group):
    """Each output element is a dot product of K = CG x KH x KW terms of its group: the direct
    conv's bound over the group's magnitudes; and the exact result of the bf16-rounded operands at
    the accumulation bound alone, which an f32 kernel fails."""
    _, xs, ys, _ = run_grouped
    xa, wa = xs[x], xs[w]
    K = wa.shape[1] * wa.shape[2] * wa.shape[3]
    full = (2 * U + U * U + 1.01 * K * EPS) * conv64_groups(np.abs(xa), np.abs(wa), stride, 1, group)
    acc = 1.01 * K * EPS * conv64_groups(np.abs(bf16(xa)), np.abs(bf16(wa)), stride, 1, group)
    for xo, wo, bound in ((xa, wa, full), (bf16(xa), bf16(wa), acc)):
        err = np.abs(ys[out] - np.maximum(conv64_groups(xo, wo, stride, 1, group), 0))
        assert np.all(err <= bound), float(np.max(err - bound))


ROUND_C = """
void round_all(const float* x, uint16_t* scalar, uint32_t* pairs, uint16_t* hw, long n)
{
    for (long i = 0; i < n; i++)
        scalar[i] = eqf_bf16(x[i]);
    eqf_bf16_pairs(x, x + n / 2, pairs, n / 2);
#if defined(__AVX512BF16__)
    for (long i = 0; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i*)(hw + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
#else
    (void)hw;
#endif
}
"""


def test_the_c_rounding_is_vcvtneps2bf16s():
    """eqf_bf16 (branchless, so that the grouped conv's copies vectorize) and eqf_bf16_pairs on random
    bit patterns and the special values (zeros, denormals, infinities, NaNs): equal to vcvtneps2bf16
    itself where the CPU has it, and to its definition (round to nearest even; a zero or denormal
    to a zero of its sign; a NaN quieted) everywhere."""
    from eqfuse.backend.cbuild import COMMON_C, build, header_c

    built = build(header_c(ROUND_C) + COMMON_C + ROUND_C,
                  "void round_all(const float* x, uint16_t* scalar, uint32_t* pairs, uint16_t* hw, long n);", "round")
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)
    bits[:16] = [0, 0x80000000, 1, 0x807FFFFF, 0x7F800000, 0xFF800000, 0x7F800001, 0xFFC00000, 0x7FFFFFFF,
                 0x3F808000, 0x3F818000, 0x3F807FFF, 0x7F7FFFFF, 0x00800000, 0x7F7F8000, 0x3F80C000]
    x = bits.view(np.float32)
    scalar, pairs, hw = np.zeros(4096, np.uint16), np.zeros(2048, np.uint32), np.zeros(4096, np.uint16)
    built.lib.round_all(*(built.ffi.from_buffer(t, a) for t, a in (("float[]", x), ("uint16_t[]", scalar),
                                                                    ("uint32_t[]", pairs), ("uint16_t[]", hw))), 4096)
    u = bits.astype(np.uint64)
    want = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    want = np.where((bits & 0x7F800000) == 0, (bits >> 16) & 0x8000, want).astype(np.uint16)
    want = np.where((bits & 0x7FFFFFFF) > 0x7F800000, (bits >> 16) | 0x40, want).astype(np.uint16)
    np.testing.assert_array_equal(scalar, want)
    np.testing.assert_array_equal(pairs, want[:2048].astype(np.uint32) | want[2048:].astype(np.uint32) << 16)
    if machine.host_isa()["avx512_bf16"] and machine.machine().avx512_bf16:  # (and built for it: not so when pinned to avx2)
        np.testing.assert_array_equal(scalar, hw)


def test_grouped_conv_with_uneven_padding_within_the_bound():
    """TF's "same" padding (conv2d padding [0, 0, 1, 1], stride 2) on the bf16 grouped path: the
    K-pair copies of the group's input planes zero a tap's reads past the bottom and right edges
    (eqfuse.ir.kernels.uneven_pads_conv), no pad kernel; at the direct conv's bound of the input
    padded so, and of the bf16-rounded operands at the accumulation bound alone."""
    src = ("graph gu(x: f32[1, 30, 10, 9], w: f32[32, 15, 3, 3]) {\n"
           "  return relu(conv2d(x, w, stride=2, padding=[0, 0, 1, 1], group=2))\n}\n")
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 30, 10, 9)).astype(np.float32)
    w = rng.standard_normal((32, 15, 3, 3)).astype(np.float32)
    with machine.pinned(dataclasses.replace(machine.machine(), bf16_fallback_all=True)):  # (bf16 on any CPU)
        mod = eqfuse.compile(src, precision="bf16")
        y = np.asarray(mod(x, w), np.float64)
    (plan,) = [p for p in mod.default.last.plans if p.kind != "view"]
    assert plan.kind == "conv2d" and plan.precision == "bf16" and plan.detail.grouped, plan
    xp = np.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1)))
    K = 15 * 3 * 3
    full = (2 * U + U * U + 1.01 * K * EPS) * conv64_groups(np.abs(xp), np.abs(w), 2, 0, 2)
    acc = 1.01 * K * EPS * conv64_groups(np.abs(bf16(xp)), np.abs(bf16(w)), 2, 0, 2)
    for xo, wo, bound in ((xp, w, full), (bf16(xp), bf16(w), acc)):
        err = np.abs(y - np.maximum(conv64_groups(xo, wo, 2, 0, 2), 0))
        assert np.all(err <= bound), float(np.max(err - bound))
