"""ConvNeXt's block up to its first Linear as one kernel (rules fuse_dw_ln_mm*,
eqfuse.ir.kernels.ConvNorm, backend/kinds/contraction/conv_dwln.py): a depthwise conv + its bias,
the permute to NHWC, the layernorm over the channels and the matmul C -> F (+ its bias, + GELU),
compiled from .g and checked against the numpy reference at the project's tolerances (rtol 1e-4,
atol 1e-5). The cases take each path of the kernel: the depthwise sums as one run of vectors
(flat) or pixel by pixel, one band or parallel bands whose last band is shorter, odd channel
counts and an F that is not a whole number of register tiles, the bias before or after the
matmul, with and without GELU, the weights packed per call or once when bound (params=). Then
the zoo's tiny ConvNeXt's ONNX export against onnxruntime with the kernel in its plan, and the
cost rule's refusal (an image of fewer than DWLN_MIN_PIXEL_VECTORS vectors of pixels)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import Compiled

import eqfuse
from eqfuse.frontend.load import load
from eqfuse.ir.kernels import DWLN_MIN_PIXEL_VECTORS
from eqfuse.ir.reference import evaluate
from eqfuse.machine import machine

RTOL, ATOL = 1e-4, 1e-5
VL = machine().simd_floats  # (the model tests/conftest.py pins)

# (name, N, C, H, W, F, k, padding, stride, the bias after the matmul (else before), GELU, the path)
# pixels_bias_r: a 2 x VL image (DWLN_MIN_PIXEL_VECTORS vectors of pixels) in one-row bands of VL + 6
# padded pixels, under two vectors: pixel by pixel at any vector width
CASES = [
    ("odd_gelu", 2, 13, 9, 11, 52, 7, 3, 1, False, True, dict(flat=1, band=9, parallel=0)),
    ("bands_gelu", 1, 24, 13, 13, 96, 7, 3, 1, False, True, dict(flat=1, band=7, parallel=1)),
    ("pixels_bias_r", 1, 48, 2, VL, 384, 7, 3, 1, True, False, dict(flat=0, band=1, parallel=1)),
    ("k3_bias", 2, 17, 6, 7, 20, 3, 1, 1, False, False, dict(flat=1, band=6, parallel=0)),
    # a stride of 2 over rows of 9 pixels, the first band's top rows in the padding (the padded
    # rows' copy once compiled wrongly here)
    ("s2_bands", 1, 33, 20, 9, 132, 7, 3, 2, False, True, dict(flat=1, band=5, parallel=1)),
    # a depthwise conv without its bias (rules fuse_dw_ln_mm*_nobias)
    ("nobias_gelu", 1, 20, 8, 8, 80, 7, 3, 1, False, True, dict(flat=1, band=8, parallel=0)),
]
NO_DW_BIAS = {"nobias_gelu"}


def _graph(name, n, c, h, w, f, k, p, s, after, gelu, _path) -> str:
    bd, pbd = ("", "") if name in NO_DW_BIAS else (", bd", f" bd: f32[{c}],")
    mm = (f"layernorm(transpose(conv2d(x, wd{bd}, stride={s}, padding={p}, group={c}), perm=[0, 2, 3, 1]), ga, be, "
          f"eps=1e-6) @ w1")
    e = f"{mm} + b1" if after else f"b1 + {mm}"
    return (f"graph {name}(x: f32[{n}, {c}, {h}, {w}], wd: f32[{c}, 1, {k}, {k}],{pbd} ga: f32[{c}], "
            f"be: f32[{c}], w1: f32[{c}, {f}], b1: f32[{f}]) {{\n    return {f'gelu({e})' if gelu else e}\n}}\n")


def _arrays(case, seed: int) -> list[np.ndarray]:
    g = load(_graph(*case))[0]
    rng = np.random.default_rng(seed)
    out = []
    for name, t in g.params:
        a = rng.standard_normal(t.shape).astype(np.float32)
        if name in ("wd", "w1"):  # (sums of about unit size)
            a /= np.float32(np.sqrt(np.prod(t.shape[1:]) if name == "wd" else t.shape[0]))
        out.append(a)
    return out


REFUSED = ("small", 2, 32, 3, 5, 128, 7, 3, 1, False, True, {})  # 15 pixels: < 2 vectors of AVX2 or AVX-512


@pytest.fixture(scope="module")
def compiled():
    """The cases and the refused one: each graph compiled when its test first runs
    (helpers.Compiled)."""
    return Compiled({c[0]: _graph(*c) for c in CASES + [REFUSED]})


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fused_depthwise_layernorm_matmul_matches_the_reference(compiled, case):
    g = load(_graph(*case))[0]
    args = _arrays(case, CASES.index(case))
    fn = getattr(compiled, case[0])
    np.testing.assert_allclose(fn(*args), evaluate(g, args)[0], rtol=RTOL, atol=ATOL)
    (k,) = fn.last.kernels  # one kernel, on the path the case is for (with 2 cores: the bands)
    want = case[-1] if machine().cores == 2 else {f: v for f, v in case[-1].items() if f == "flat"}
    assert k.kind == "conv2d" and {f: k.decisions[f] for f in want} == want, k.decisions
    assert {"band", "ro", "nv", "flat", "parallel", "prepacked_b"} <= set(k.decisions)


def test_an_image_of_few_pixels_stays_three_kernels(compiled):
    """Below DWLN_MIN_PIXEL_VECTORS vectors of pixels (a 3 x 5 image) the depthwise conv, the
    layernorm and the matmul stay separate kernels, with the same result."""
    assert 3 * 5 < DWLN_MIN_PIXEL_VECTORS * machine().simd_floats
    g = load(_graph(*REFUSED))[0]
    args = _arrays(REFUSED, 7)
    np.testing.assert_allclose(compiled.small(*args), evaluate(g, args)[0], rtol=RTOL, atol=ATOL)
    kinds = [k.kind for k in compiled.small.last.kernels if k.kind != "view"]
    assert kinds == ["conv2d", "row", "contraction"], kinds


def test_bound_weights_are_packed_once_and_match():
    case = CASES[0]
    g = load(_graph(*case))[0]
    args = _arrays(case, 0)
    names = [n for n, _ in g.params]
    mod = eqfuse.compile(_graph(*case), params={n: a for n, a in zip(names, args) if n != "x"})
    (k,) = mod.kernels
    assert k.kind == "conv2d" and k.decisions["prepacked_b"] == 1
    np.testing.assert_allclose(mod(args[0]), evaluate(g, args)[0], rtol=RTOL, atol=ATOL)


@pytest.mark.heavy  # (an export and a model's compile: about 5 s on the 2-vCPU VM; not in the fast tier)
def test_the_zoo_convnext_matches_onnxruntime_with_the_fused_block():
    """The zoo's tiny ConvNeXt (TorchScript export): its first stage's block (16 channels at
    8 x 8) is one kernel, its second's (32 channels at 4 x 4: DWLN_MIN_PIXEL_VECTORS vectors of
    pixels at 8 lanes, fewer at 16) one at 8 lanes, three at 16; the output matches onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("transformers")
    import zoo_models as zm

    path = str(zm.export("convnext", "torchscript"))
    ins = zm.inputs("convnext")
    mod = eqfuse.compile(path)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, ins)[0]
    np.testing.assert_allclose(mod(**ins), want, rtol=RTOL, atol=ATOL)
    fused = [line for line in mod.report["graph"].splitlines() if "layernorm(transpose(conv2d(" in line]
    second = 4 * 4 >= DWLN_MIN_PIXEL_VECTORS * machine().simd_floats
    assert len(fused) == 1 + second and all("gelu(" in line for line in fused), fused
    assert "group=16" in fused[0] and (not second or "group=32" in fused[1]), fused


NCHW_RESIDUAL = Path(eqfuse.__file__).parent / "optimizer" / "rules" / "extra" / "nchw_residual.rw"


def _block(n: int, c: int, h: int) -> str:
    """ConvNeXt's whole block as the TorchScript export writes it: the fused first half, then the
    second Linear (4C -> C), its bias, the layer scale, the permute back to NCHW and the residual
    add."""
    f = 4 * c
    return (f"graph block{n}(x: f32[{n}, {c}, {h}, {h}], wd: f32[{c}, 1, 7, 7], bd: f32[{c}], ga: f32[{c}], "
            f"be: f32[{c}], w1: f32[{c}, {f}], b1: f32[{f}], w2: f32[{f}, {c}], b2: f32[{c}], ls: f32[{c}]) {{\n"
            f"    h = gelu(b1 + layernorm(transpose(conv2d(x, wd, bd, padding=3, group={c}), perm=[0, 2, 3, 1]), "
            f"ga, be, eps=1e-6) @ w1)\n"
            f"    return x + transpose(ls * (b2 + h @ w2), perm=[0, 3, 1, 2])\n}}\n")


@pytest.fixture(scope="module")
def blocks():
    """The blocks of one and two images, by default (False) and with the opt-in rules of
    rules/extra/nchw_residual.rw (True), each module compiled when a case first asks for it (the
    fast tier runs the first case only)."""
    src, mods = _block(1, 16, 8) + _block(2, 16, 8), {}

    def get(opt_in: bool):
        if opt_in not in mods:
            mods[opt_in] = eqfuse.compile(src, rules=[str(NCHW_RESIDUAL)] if opt_in else [])
        return mods[opt_in]
    return get


@pytest.mark.heavy  # (the opt-in rules; the whole suite runs it)
@pytest.mark.parametrize("n, opt_in, kinds", [
    (1, True, ["conv2d", "contraction"]), (2, True, ["conv2d", "contraction", "layout"]),
    (1, False, ["conv2d", "contraction", "pointwise"]), (2, False, ["conv2d", "contraction", "pointwise"])])
def test_the_whole_block_matches_with_its_residual_add_fused_or_not(blocks, n, opt_in, kinds):
    """By default the residual add after the permute back to NCHW is a kernel of its own. With
    rules/extra/nchw_residual.rw (slower on the CPUs measured) the second Linear's GEMM adds the
    residual (read through the NHWC view): one image, it writes its result through the permute
    (the channels at a column stride), so the block is two kernels; two images, the GEMM's rows
    run over both, which the NCHW result does not lay out at one row stride, and the permute
    stays a copy."""
    src = _block(n, 16, 8)
    g = load(src)[0]
    rng = np.random.default_rng(n)
    args = []
    for name, t in g.params:
        a = rng.standard_normal(t.shape).astype(np.float32)
        if name in ("wd", "w1", "w2"):  # (sums of about unit size)
            a /= np.float32(np.sqrt(np.prod(t.shape[1:]) if name == "wd" else t.shape[0]))
        args.append(a)
    fn = getattr(blocks(opt_in), f"block{n}")
    np.testing.assert_allclose(fn(*args), evaluate(g, args)[0], rtol=RTOL, atol=ATOL)
    assert [k.kind for k in fn.last.kernels if k.kind != "view"] == kinds


@pytest.mark.heavy  # (dynamo's trace and a compile: about 4 s on the 2-vCPU VM; not in the fast tier)
def test_the_block_through_torch_compile_is_the_same_kernels():
    """torch.compile(backend="eqfuse") of ConvNeXt's block, its depthwise conv without a bias: each
    Linear, reshape(reshape(y, [P, C]) @ transpose(w) + b, ...) from AOTAutograd, is the matmul
    over the NHWC tensor once optimizer/layout.py takes the reshapes away, and the fused kernel
    reads the Linear's [F][C] weight through its transpose (no copy kernel), so the block is the
    fused first half, the second Linear's GEMM with the layer scale and the residual add, as from
    ONNX; the result matches eager."""
    torch = pytest.importorskip("torch")
    from eqfuse import torch_backend
    from eqfuse.torch_backend import REPORTS

    class Block(torch.nn.Module):
        def __init__(self, c: int):
            super().__init__()
            self.dw = torch.nn.Conv2d(c, c, 7, padding=3, groups=c, bias=False)
            self.ln = torch.nn.LayerNorm(c, eps=1e-6)
            self.fc1, self.fc2 = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)
            self.gamma = torch.nn.Parameter(torch.rand(c) + 0.5)

        def forward(self, x):
            y = self.ln(self.dw(x).permute(0, 2, 3, 1))
            y = self.gamma * self.fc2(torch.nn.functional.gelu(self.fc1(y)))
            return x + y.permute(0, 3, 1, 2)

    torch.manual_seed(0)
    model = Block(16).eval()
    x = torch.randn(1, 16, 8, 8)
    torch_backend.register()
    torch._dynamo.reset()
    del REPORTS[:]
    try:
        with torch.no_grad():
            got, want = torch.compile(model, backend="eqfuse")(x), model(x)
        (part,) = [p for r in REPORTS for p in r.partitions]
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    kinds = [k.kind for k in eqfuse.compile(part).kernels if k.kind != "view"]
    assert kinds == ["conv2d", "contraction", "pointwise"], kinds
