"""precision="bf16" (docs/precision.md): the bf16 GEMMs (blocked and few-rows, odd K, K in several
slices, an epilogue with bias + gelu, B bound by params= or passed per call) through both
instruction paths, the AVX512_BF16 one (vdpbf16ps; skipped where the CPU lacks it) and the
fallback (forced by pinning a machine model without AVX512_BF16, so it runs on every x86-64
machine); attention (q k^T and p v in bf16, the softmax in f32) on both paths and through the
portable loops, at its own bound (docs/precision.md, "Attention"); an MLP end to end; the report
and `eqfuse lower`; the command line's --precision.

Every result is checked twice against float64, at bounds stated in docs/precision.md and
computed from each test's own |A| @ |B| (no tolerance chosen after the fact):
- against the exact product, at the documented bound (2u + u^2 + 1.01 K eps) sum |a||b|;
- against the product of the operands rounded to bf16 (round to nearest even), at the
  accumulation bound alone, 1.01 K eps sum |ã||b̃|: a kernel that did not round its operands to
  bf16 (an f32 one) fails it, so the first check cannot pass by computing in f32.
"""

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

import eqfuse
from eqfuse import machine
from eqfuse.backend.kinds.contraction.plan_gemm import SKINNY_PF
from eqfuse.cli.main import main
from eqfuse.errors import ArgumentError

U = 2.0**-8  # bf16's unit roundoff (8 significant bits, round to nearest)
EPS = 2.0**-24  # f32's
GELU_LIP = 1.13  # max |gelu'(x)| = 1.1289
GELU_F32 = 8 * EPS  # eqfuse's f32 gelu, relative to |x| (docs/precision.md)
MLP = Path(__file__).resolve().parent.parent / "examples" / "mlp.g"


def bf16(a: np.ndarray) -> np.ndarray:
    """a (f32) rounded to bf16 as vcvtne2ps2bf16 does (to nearest even; the inputs here are normal)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def dot_bound(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The documented bound of each element of a @ b: (2u + u^2 + 1.01 K eps) |a| @ |b|."""
    K = a.shape[-1]
    assert K <= 2**15
    return (2 * U + U * U + 1.01 * K * EPS) * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))


def check_gemm(y, a, b, epilogue=lambda z: z, lip=1.0, own=EPS, bias=None):
    """y = epilogue(a @ b (+ bias)) computed in bf16: within the documented bound of the exact
    result, and within the accumulation bound of the bf16 operands' exact result."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    bias64 = 0.0 if bias is None else bias.astype(np.float64)
    for x, w, e in ((a64, b64, dot_bound(a, b)),  # exact operands, the whole bound
                    (bf16(a).astype(np.float64), bf16(b).astype(np.float64),  # bf16 operands: accumulation only
                     1.01 * a.shape[-1] * EPS * (np.abs(bf16(a)).astype(np.float64) @ np.abs(bf16(b)).astype(np.float64)))):
        z = x @ w + bias64
        ref = epilogue(z)
        bound = lip * (e + EPS * (np.abs(z) + e)) + own * (np.abs(z) + e)
        err = np.abs(y.astype(np.float64) - ref)
        worst = np.unravel_index(np.argmax(err - bound), err.shape)
        assert np.all(err <= bound), (f"error {err[worst]:.3g} > bound {bound[worst]:.3g} at {worst} "
                                      f"({'bf16' if x is not a64 else 'exact'} operands)")


def gelu(z):
    from scipy.special import erf

    return 0.5 * z * (1 + erf(z / np.sqrt(2)))


# ------------------------------------------------------------------ the instruction paths

@pytest.fixture(params=["avx512_bf16", "fallback"])
def path(request):
    """Plans for a machine with (AVX512_BF16) or without (fallback) vdpbf16ps."""
    m = machine.machine()
    if request.param == "avx512_bf16":
        if not (machine.host_isa()["avx512_bf16"] and m.simd_floats >= 16):
            pytest.skip("this CPU (or the pinned machine model's vector width) has no AVX512_BF16: "
                        "the vdpbf16ps path cannot run here (the fallback's test covers bf16)")
        model = dataclasses.replace(m, avx512_bf16=True, amx_bf16=False)  # (the AMX path: tests/test_amx.py)
    else:
        model = dataclasses.replace(m, avx512_bf16=False, bf16_fallback_all=True)  # (every kernel on it)
    with machine.pinned(model):
        yield request.param


def gemm_graph(M, K, N, act=""):
    y = f"{act}(x @ w + b)" if act else "x @ w + b"
    return f"graph g(x: f32[{M}, {K}], w: f32[{K}, {N}], b: f32[{N}]) -> f32[{M}, {N}] {{\n  return {y}\n}}"


def arrays(M, K, N, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32),
            rng.standard_normal(N).astype(np.float32))


def gemm_plan(mod):
    (p,) = [p for p in mod.default.last.plans if p.kind in ("contraction", "contraction_row")]
    return p


def assert_bf16(mod, path):
    p = gemm_plan(mod)
    assert (p.precision, p.precision_path) == ("bf16", path)
    assert mod.report["precision"][p.name] == {"precision": "bf16", "path": path}


# (M, K, N, bound by params=, the GEMM's path): odd K; K in several K slices with an odd last one;
# B passed per call (packed per call, converted while packed); K and N one panel each (gcc 12 warned
# of its packing's tail loop, and under -Werror failed: ViT's 64-wide layers; cbuild.FLAGS)
CASES = [(70, 301, 200, True, "blocked"), (40, 2203, 96, True, "blocked"), (33, 77, 130, False, "blocked"),
         (130, 64, 64, True, "blocked"),
         (5, 301, 200, True, "skinny"), (1, 999, 72, True, "skinny")]


@pytest.mark.parametrize("M,K,N,bound,kernel", CASES)
def test_bf16_gemm_within_the_bound(path, M, K, N, bound, kernel):
    x, w, b = arrays(M, K, N)
    src = gemm_graph(M, K, N)
    mod = eqfuse.compile(src, params={"w": w, "b": b} if bound else None, precision="bf16")
    y = mod(x) if bound else mod(x, w, b)
    assert_bf16(mod, path)
    p = gemm_plan(mod)
    assert p.detail.path == kernel
    if kernel == "skinny" and path == "fallback":  # (its stream prefetched even where f32's is not: the
        assert p.tiles["pf"] == SKINNY_PF > 0      # suite's pinned model has Machine.prefetch off)
    if kernel == "blocked" and K > 2000:
        assert p.tiles["kc"] < K and p.tiles["kc"] % 2 == 0  # (several K slices, whole K-pairs each)
    check_gemm(y, x, w, bias=b)


@pytest.mark.parametrize("M", [48, 7])  # the blocked GEMM, then the few-rows one
def test_bf16_epilogue_bias_gelu(path, M):
    K, N = 257, 80
    x, w, b = arrays(M, K, N, seed=1)
    mod = eqfuse.compile(gemm_graph(M, K, N, "gelu"), params={"w": w, "b": b}, precision="bf16")
    y = mod(x)
    assert_bf16(mod, path)
    assert gemm_plan(mod).detail.path == ("skinny" if M < 32 else "blocked")
    check_gemm(y, x, w, epilogue=gelu, lip=GELU_LIP, own=EPS + GELU_F32, bias=b)


def test_the_paths_round_the_same_operands():
    """The fallback and vdpbf16ps multiply the same bf16 values: their results differ only by the
    order of f32 additions (both within the accumulation bound of the bf16 operands)."""
    if not machine.host_isa()["avx512_bf16"] or machine.machine().simd_floats < 16:
        # an instruction path the host lacks is skipped with its reason (the fallback's own tests run everywhere)
        pytest.skip("this CPU has no AVX512_BF16: only the fallback path can run here")
    M, K, N = 24, 515, 64
    x, w, b = arrays(M, K, N, seed=2)
    out = {}
    for flag in (True, False):
        with machine.pinned(dataclasses.replace(machine.machine(), avx512_bf16=flag, amx_bf16=False,
                                                bf16_fallback_all=True)):
            out[flag] = eqfuse.compile(gemm_graph(M, K, N), params={"w": w, "b": b}, precision="bf16")(x)
    acc = 2 * 1.01 * K * EPS * (np.abs(bf16(x)).astype(np.float64) @ np.abs(bf16(w)).astype(np.float64)) \
        + 2 * EPS * np.abs(out[False])
    assert np.all(np.abs(out[True].astype(np.float64) - out[False]) <= acc)


# ------------------------------------------------------------------ attention

def attention_graph(Sq, Sk, D, Dv, scale, mask):
    m = ", mk: f32[{Sq}, {Sk}]".format(Sq=Sq, Sk=Sk) if mask else ""
    score = f"q @ transpose(k, perm=[0, 2, 1]) * {scale}" + (" + mk" if mask else "")
    return (f"graph g(q: f32[2, {Sq}, {D}], k: f32[2, {Sk}, {D}], v: f32[2, {Sk}, {Dv}]{m}) -> f32[2, {Sq}, {Dv}] {{\n"
            f"  return softmax({score}, axis=-1) @ v\n}}")


def attention_bound(q, k, v, scale, mask, bk, u=U):
    """The documented bound of bf16 attention (docs/precision.md, "Attention") of each output
    element, from the float64 softmax weights w and sum_j w_ij |v_je|; u=0 gives what an f32
    kernel's arithmetic alone may add."""
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    b64 = 0.0 if mask is None else mask.astype(np.float64)
    s = q64 @ k64.transpose(0, 2, 1) * scale + b64
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    D, Sk = q.shape[-1], k.shape[-2]
    T = -(-Sk // bk)
    dots = abs(scale) * (np.abs(q64) @ np.abs(k64).transpose(0, 2, 1))
    delta = ((2 * u + u * u + (1.02 * D + 6) * EPS) * dots + 4 * EPS * np.abs(b64)).max(-1, keepdims=True)
    log2e = 1 / np.log(2)
    R = 8 + log2e * (s.max(-1, keepdims=True) - s.min(-1, keepdims=True) + 2 * delta)
    theta = 2 * (T + 1) * (R + 5) * EPS + 1.01 * (Sk + T + 16) * EPS + 2 * EPS
    factor = np.exp(2 * delta) * (1 + theta) * (1 + 2 * u + u * u) * (1 + 1.02 * (Sk + T) * EPS) - 1
    return w @ v64, factor * (w @ np.abs(v64)) + Sk * 2.0**-126 * np.abs(v64).max()


# (Sq, Sk, D, Dv, mask): whole 64-key tiles and an odd last one (the vectorized micro-kernels; with
# a mask, the score pass), then a few keys (one tile of 16: the portable loops, the fallback)
ATTENTION = [(40, 101, 64, 64, False), (12, 130, 32, 48, True), (10, 10, 24, 8, False)]


@pytest.mark.parametrize("Sq,Sk,D,Dv,mask", ATTENTION)
def test_bf16_attention_within_the_bound(path, Sq, Sk, D, Dv, mask):
    rng = np.random.default_rng(5)
    q, k = (rng.standard_normal((2, S, D)).astype(np.float32) for S in (Sq, Sk))
    v = rng.standard_normal((2, Sk, Dv)).astype(np.float32)
    mk = np.triu(np.full((Sq, Sk), -1e4, np.float32), 1 + Sk - Sq) if mask else None
    scale = 1 / np.sqrt(D)
    mod = eqfuse.compile(attention_graph(Sq, Sk, D, Dv, scale, mask), precision="bf16")
    y = mod(q, k, v, *([mk] if mask else [])).astype(np.float64)
    (p,) = [p for p in mod.default.last.plans if p.kind == "attention"]
    want = path if p.detail.vec else "fallback"  # (the portable loops run the fallback)
    assert (p.precision, p.precision_path) == ("bf16", want)
    assert mod.report["precision"][p.name]["path"] == want
    assert p.detail.vec == (Sk > 16) and p.detail.score_ops == mask
    ref, bound = attention_bound(q, k, v, scale, mk, p.tiles["bk"])
    err = np.abs(y - ref)
    assert np.all(err <= bound), float(np.max(err / bound))
    # the operands really were rounded: the error passes what f32 arithmetic alone may add
    _, f32_part = attention_bound(q, k, v, scale, mk, p.tiles["bk"], u=0.0)
    assert np.any(err > f32_part)


def test_bf16_attention_paths_agree():
    """vdpbf16ps and the fallback multiply the same bf16 values; only the order of f32 additions
    differs (the two results are both within the bound; here, within each other's reach)."""
    if not machine.host_isa()["avx512_bf16"] or machine.machine().simd_floats < 16:
        # an instruction path the host lacks is skipped with its reason (the fallback's own tests run everywhere)
        pytest.skip("this CPU has no AVX512_BF16: only the fallback path can run here")
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 70, 64)).astype(np.float32) for _ in range(3))
    out = {}
    for flag in (True, False):
        with machine.pinned(dataclasses.replace(machine.machine(), avx512_bf16=flag, amx_bf16=False,
                                                 bf16_fallback_all=True)):
            out[flag] = eqfuse.compile(attention_graph(70, 70, 64, 64, 0.125, False), precision="bf16")(q, k, v)
    ref, bound = attention_bound(q, k, v, 0.125, None, 64)
    assert np.all(np.abs(out[True] - ref) <= bound) and np.all(np.abs(out[False] - ref) <= bound)
    assert np.abs(out[True] - out[False]).max() < np.abs(out[True] - ref).max()


# ------------------------------------------------------------------ end to end, report, lower

@pytest.mark.parametrize("n2", [24, 10])
def test_mlp_end_to_end_within_the_composed_bound(path, n2):
    """examples/mlp.g with n2 outputs. At most one vector of them (its 10), the second GEMM
    computes in f32 (plan_gemm.narrow_f32), well within the bound of its bf16 form."""
    B = 16
    rng = np.random.default_rng(3)
    x = rng.standard_normal((B, 784)).astype(np.float32)
    w1 = (rng.standard_normal((784, 1024)) / 28).astype(np.float32)
    b1 = rng.standard_normal(1024).astype(np.float32)
    w2 = (rng.standard_normal((1024, n2)) / 32).astype(np.float32)
    b2 = rng.standard_normal(n2).astype(np.float32)
    src = re.sub(r"\b10\]", f"{n2}]", MLP.read_text())
    mod = eqfuse.compile(src, params={"w1": w1, "b1": b1, "w2": w2, "b2": b2}, precision="bf16")
    y = mod(x).astype(np.float64)
    entries = [mod.report["precision"][k.name] for k in mod.kernels]
    narrow = n2 <= machine.machine().simd_floats
    assert entries[0] == {"precision": "bf16", "path": path}
    if narrow:
        assert entries[1]["precision"] == "f32" and "at most one vector" in entries[1]["note"], entries[1]
    else:
        assert entries[1] == {"precision": "bf16", "path": path}
    # the composed bound (docs/precision.md, "Layers"): relu is 1-Lipschitz
    h = np.maximum(x.astype(np.float64) @ w1 + b1, 0)
    e1 = dot_bound(x, w1)
    e1 = e1 + EPS * (np.abs(x.astype(np.float64) @ w1 + b1) + e1)  # (the bias add)
    dh = e1 + EPS * h
    hmax = h + dh  # |ĥ| at most
    aw2 = np.abs(w2).astype(np.float64)
    ref = h @ w2 + b2
    e2 = (2 * U + U * U + 1.01 * 1024 * EPS) * (hmax @ aw2) + dh @ aw2
    bound = e2 + EPS * (np.abs(ref) + e2)
    assert np.all(np.abs(y - ref) <= bound), float(np.max(np.abs(y - ref) - bound))


@pytest.mark.heavy  # (the fast tier's time)
def test_f32_kernels_under_bf16_say_so():
    """fuse=False: the matmul is a bf16 GEMM, the add and relu f32 kernels with a note; precision
    f32 reports every kernel in f32."""
    src = gemm_graph(8, 16, 32, "relu")
    x, w, b = arrays(8, 16, 32)
    with machine.pinned(dataclasses.replace(machine.machine(), bf16_fallback_all=True)):  # (a blocked GEMM)
        mod = eqfuse.compile(src, precision="bf16", fuse=False)
        mod(x, w, b)
    entries = mod.report["precision"]
    assert sorted(e["precision"] for e in entries.values()) == ["bf16", "f32", "f32"]
    assert all("only GEMMs multiply in bf16" in e["note"] for e in entries.values() if e["precision"] == "f32")
    f32 = eqfuse.compile(src)
    assert all(e == {"precision": "f32", "path": "f32"} for e in f32.report["precision"].values())
    assert len(f32.report["precision"]) == 1


WITHOUT_BF16 = """
graph nb(x: f32[64, 96], w: f32[96, 80], b: f32[80], r: f32[4, 96], i: f32[1, 8, 12, 12], c: f32[16, 8, 3, 3],
         q: f32[2, 70, 64], k: f32[2, 70, 64], v: f32[2, 70, 64], s: f32[2, 1024], u: f32[1024, 640]) {
  a = softmax((q @ transpose(k, perm=[0, 2, 1])) * 0.125, axis=-1) @ v
  return relu(x @ w + b), r @ w, relu(conv2d(i, c, padding=[1, 1, 1, 1])), a, s @ u
}"""


@pytest.mark.heavy
def test_without_a_bf16_multiply_compute_bound_kernels_stay_f32():
    """On a CPU with neither AVX512_BF16 nor AMX (the pinned model, whatever the host), bf16 only
    halves weight bytes: the blocked GEMM, the conv, the attention of several query rows and the
    few-rows GEMM over weights within L2 compute in f32 and say why, with precision f32's very
    outputs; the few-rows GEMM over weights past L2 (2.6 MB, the pinned L2 1 MB), whose time is
    their stream, multiplies bf16 on the fallback, within the GEMM's bound."""
    from eqfuse.backend.kinds.contraction.plan_gemm import FALLBACK_F32

    rng = np.random.default_rng(9)
    names = ("x", "w", "b", "r", "i", "c", "q", "k", "v", "s", "u")
    shapes = [(64, 96), (96, 80), (80,), (4, 96), (1, 8, 12, 12), (16, 8, 3, 3), (2, 70, 64), (2, 70, 64), (2, 70, 64),
              (2, 1024), (1024, 640)]
    xs = dict(zip(names, (rng.standard_normal(sh).astype(np.float32) for sh in shapes)))
    bound = {"w": xs["w"], "b": xs["b"], "c": xs["c"], "u": xs["u"]}
    calls = [xs[n] for n in names if n not in bound]
    model = dataclasses.replace(machine.machine(), avx512_bf16=False, amx_bf16=False, bf16_fallback_all=False,
                                l2=1 << 20)  # (pinned: u's 2.6 MB past it on any host)
    with machine.pinned(model):
        low = eqfuse.compile(WITHOUT_BF16, params=bound, precision="bf16")
        f32 = eqfuse.compile(WITHOUT_BF16, params=bound)
        ys, want = low(*calls), f32(*calls)
    plans = {p.name: p for p in low.default.last.plans}
    entries = low.report["precision"]
    kinds = {}
    for name, e in entries.items():
        kinds.setdefault(plans[name].kind, []).append(e)
    for kind in ("conv2d", "attention"):
        assert kinds[kind] == [{"precision": "f32", "path": "f32", "note": FALLBACK_F32}], kind
    gemms = sorted((plans[n].detail.path, plans[n].detail.K * plans[n].detail.N, e["precision"], e["path"])
                   for n, e in entries.items() if plans[n].kind in ("contraction", "contraction_row"))
    assert [g[:1] + g[2:] for g in gemms] == [("blocked", "f32", "f32"), ("skinny", "f32", "f32"),
                                              ("skinny", "bf16", "fallback")], gemms
    assert gemms[1][1] * 4 <= model.l2 < gemms[2][1] * 4  # (r @ w within L2, s @ u past it)
    for i in (0, 1, 2, 3):  # the f32 kernels: precision f32's outputs, bit for bit
        np.testing.assert_array_equal(ys[i], want[i])
    check_gemm(ys[4], xs["s"], xs["u"])


def test_unknown_precision_names_the_option():
    with pytest.raises(ArgumentError, match=r"precision= expects one of f32, bf16, got 'fp16'"):
        eqfuse.compile(gemm_graph(2, 3, 4), precision="fp16")
    with pytest.raises(ArgumentError, match="verify=True"):
        eqfuse.compile(gemm_graph(2, 3, 4), precision="bf16", verify=True)


def test_cli_precision(capsys, path):
    assert main(["lower", str(MLP), "--dim", "B=64", "--precision", "bf16", "--uops"]) == 0
    out = capsys.readouterr().out
    # (the 10-column GEMM in f32, narrow_f32, where 10 columns are at most one vector: 16 floats;
    # in bf16 on 8-float vectors, EQFUSE_TEST_MACHINE=avx2)
    narrow = 10 <= machine.machine().simd_floats
    assert out.count(f"precision: bf16, path: {path}") == (1 if narrow else 2)
    assert ("10 output columns, at most one vector" in out) == narrow
    assert ("vdpbf16ps" if path == "avx512_bf16" else "widened to f32 by a shift") in out
    assert main(["lower", str(MLP), "--dim", "B=64"]) == 0
    assert "precision:" not in capsys.readouterr().out  # (f32 plans print no precision line)
    for cmd in (["opt"], ["lower", "--dim", "B=4"], ["bench", "--dim", "B=4"]):
        assert main([cmd[0], str(MLP), *cmd[1:], "--precision", "f16"]) == 2
        assert "--precision expects one of f32, bf16, got 'f16'" in capsys.readouterr().err


@pytest.mark.heavy  # (a CLI run / a torch.compile)
def test_cli_run_bf16(tmp_path, capsys, path):
    rng = np.random.default_rng(4)
    ins = {"x": rng.standard_normal((4, 784)), "w1": rng.standard_normal((784, 1024)) / 28,
           "b1": rng.standard_normal(1024), "w2": rng.standard_normal((1024, 10)) / 32, "b2": rng.standard_normal(10)}
    ins = {k: v.astype(np.float32) for k, v in ins.items()}
    np.savez(tmp_path / "in.npz", **ins)
    out = tmp_path / "out.npz"
    assert main(["run", str(MLP), "--inputs", str(tmp_path / "in.npz"), "--precision", "bf16", "-o", str(out)]) == 0
    y = np.load(out)["out0"].astype(np.float64)
    ref = np.maximum(ins["x"].astype(np.float64) @ ins["w1"] + ins["b1"], 0) @ ins["w2"] + ins["b2"]
    f32 = np.load(out)  # (the f32 run for comparison: bf16 must differ from it, f32 must not)
    assert main(["run", str(MLP), "--inputs", str(tmp_path / "in.npz"), "-o", str(out)]) == 0
    f32 = np.load(out)["out0"].astype(np.float64)
    assert np.abs(f32 - ref).max() < np.abs(y - ref).max()  # (bf16 really ran: its error is the larger)
    assert main(["run", str(MLP), "--inputs", str(tmp_path / "in.npz"), "--precision", "bf16", "--verify"]) == 2
    assert "--verify compares at f32 tolerances" in capsys.readouterr().err


@pytest.mark.heavy  # (a CLI run / a torch.compile)
def test_torch_backend_precision_option(path):
    torch = pytest.importorskip("torch")
    from eqfuse.torch_backend import REPORTS

    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 40)
    x = torch.randn(12, 96)
    with torch.no_grad():
        torch._dynamo.reset()
        y = torch.compile(lin, backend="eqfuse", options={"precision": "bf16", "threads": 1})(x).numpy()
        torch._dynamo.reset()
    entries = REPORTS[-1].precision
    assert entries and all(e == {"precision": "bf16", "path": path} for e in entries.values())
    w, b = lin.weight.detach().numpy(), lin.bias.detach().numpy()
    check_gemm(y, x.numpy(), np.ascontiguousarray(w.T), bias=b)
    with pytest.raises(Exception, match=r"precision= expects one of f32, bf16, got 'int4'"):
        torch.compile(lin, backend="eqfuse", options={"precision": "int4"})(x)
    torch._dynamo.reset()


def test_bf16_decode_gemm_on_two_threads(path, monkeypatch):
    """A decode step's GEMM (one row, a 768 x 768 weight bound: 1.2 MB of bf16 panels) shares its
    panels among two threads (plan_gemm.skinny_parallel) and stays within the bound."""
    import eqfuse.runtime.program as program

    monkeypatch.setattr(program, "call_threads", lambda t, *own: (t, program.OPENMP))  # two threads, however loaded
    x, w, b = arrays(1, 768, 768, seed=3)
    mod = eqfuse.compile(gemm_graph(1, 768, 768), params={"w": w, "b": b}, precision="bf16", threads=2)
    for _ in range(2):  # the second call reads the panels of the first
        check_gemm(mod(x), x, w, bias=b)
    assert_bf16(mod, path)
    p = gemm_plan(mod)
    assert p.detail.path == "skinny" and p.detail.parallel
