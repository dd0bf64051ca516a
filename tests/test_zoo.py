"""The model zoo: 31 Hugging Face families (tests/zoo_models.py: tiny configs, random weights, no
download) through eqfuse's two front doors, at rtol 1e-4 and atol 1e-5:

- `eqfuse.compile(model.onnx)` against onnxruntime on the same export, for the TorchScript
  exporter (opset 17) and the dynamo exporter (opset 18);
- `torch.compile(model, backend="eqfuse")` against torch eager.

The default run takes one family per group (encoder, decoder, vision, audio), each through one
exporter, and GPT-2 through torch.compile (DEFAULT); `-m extended` runs them all. A case that
cannot pass today is xfail(strict=True) with what stops it, and `raises=` keeps the xfail to
that cause: an exporter's own failure (ExportFailed), or ATen ops eqfuse has no op for, which
torch.compile leaves in torch (Fallback). Every ONNX case passes.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from helpers import skip_unless_installed

pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extras: pip install '.[test]'")
skip_unless_installed("transformers", reason="transformers is in the test extras: pip install '.[test]'")
torch = pytest.importorskip("torch", reason="torch is in the test extras: pip install '.[test]'")

import onnxruntime as ort  # noqa: E402
import zoo_models as zm  # noqa: E402

import eqfuse  # noqa: E402
from eqfuse import torch_backend  # noqa: E402
from eqfuse.torch_backend import REPORTS  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5
# the default run's family of each group, the quickest of each to export and compile, with the
# front doors it takes there (the exporters alternate; torch.compile for the decoder only), in the
# suite's budget; `extended` runs every family through every door
DEFAULT = {"distilbert": ("torchscript",), "gpt2": ("dynamo", "torch"), "resnet": ("torchscript",),
           "whisper-encoder": ("dynamo",)}


class ExportFailed(Exception):
    """torch.onnx.export itself failed (not eqfuse)."""


_VIEW = "Failed to decompose the FX graph for ONNX compatibility: Cannot view a tensor with shape "
# The exporters' own failures, with their messages: the export raises before eqfuse sees a model.
EXPORT_FAILS = {
    ("t5-encoder", "dynamo"): _VIEW + "[2, 16, 4, 16] and strides (1024, 16, 256, 1) as a tensor with shape "
                              "(2, 16, 64) (aten.view of the attention output after its transpose)",
    ("swin", "dynamo"): _VIEW + "[8, 16, 2, 8] and strides (256, 8, 128, 1) as a tensor with shape (8, 16, 16) "
                        "(aten.view of the window attention output after its transpose)",
}
class Fallback(Exception):
    """torch.compile's result matched eager, but these ops ran in torch: eqfuse has no op for them."""


# torch.compile: the ATen ops that eqfuse has no op for, which stay in torch (a FallbackWarning):
# family -> (the ops, where the model uses them). The case is xfail(raises=Fallback) when exactly
# these ops fall back and the result matches eager; any other fallback or a mismatch fails it.
TORCH_FALLBACKS: dict[str, tuple[set, str]] = {}  # none today: every family runs wholly in eqfuse


def _marks(family: str, path: str) -> list:
    marks = [] if path in DEFAULT.get(family, ()) else [pytest.mark.extended]
    if (family, path) in EXPORT_FAILS:
        marks.append(pytest.mark.xfail(strict=True, raises=ExportFailed,
                                       reason=f"the {path} exporter fails: {EXPORT_FAILS[family, path]}"))
    elif path == "torch" and family in TORCH_FALLBACKS:
        marks.append(pytest.mark.xfail(strict=True, raises=Fallback,
                                       reason=f"eqfuse gap: no op for {TORCH_FALLBACKS[family][1]}; they run in torch"))
    return marks


ONNX_CASES = [pytest.param(f, e, marks=_marks(f, e), id=f"{f}-{e}") for f in zm.FAMILIES for e in zm.EXPORTERS]
TORCH_CASES = [pytest.param(f, marks=_marks(f, "torch"), id=f) for f in zm.FAMILIES]


def _export(family: str, exporter: str) -> str:
    try:
        return str(zm.export(family, exporter))
    except Exception as e:  # the exporter's message, first line, with its root cause
        root = e
        while root.__cause__ is not None:
            root = root.__cause__
        # (from None: pytest would format the exporter's whole chained traceback, and on CPython
        # 3.11 parsing its sources for that, after dynamo's deep recursion, has raised SystemError
        # "AST constructor recursion depth mismatch", an internal error that stops the session)
        raise ExportFailed(f"{str(e).splitlines()[0]}: {str(root).splitlines()[0]}") from None


@pytest.mark.heavy  # an export and a compile each: out of the fast tier
@pytest.mark.parametrize("family, exporter", ONNX_CASES)
def test_onnx_export_matches_onnxruntime(family, exporter):
    path = _export(family, exporter)
    mod = eqfuse.compile(path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for seed in (0, 1):
        feeds = zm.inputs(family, seed)
        (want,) = sess.run(None, feeds)
        got = mod(**feeds)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.heavy
@pytest.mark.parametrize("family, ops", [("llama", {"Attention", "RMSNormalization"}),
                                         pytest.param("bert", {"Attention"}, marks=pytest.mark.extended),
                                         pytest.param("qwen2", {"Attention", "RMSNormalization"},
                                                      marks=pytest.mark.extended),
                                         pytest.param("wav2vec2", {"GroupNormalization"}, marks=pytest.mark.extended)])
def test_an_opset_23_export_matches_onnxruntime(family, ops):
    """The dynamo exporter at opset 23 writes scaled_dot_product_attention as ONNX's Attention, the
    RMSNorms as RMSNormalization and a GroupNorm as GroupNormalization: imported as the ops the
    other exports spell them with, they run as the same kernels."""
    path = _export(family, "dynamo-opset23")
    import onnx

    assert ops <= {n.op_type for n in onnx.load(path).graph.node}
    mod = eqfuse.compile(path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for seed in (0, 1):
        feeds = zm.inputs(family, seed)
        (want,) = sess.run(None, feeds)
        np.testing.assert_allclose(mod(**feeds), want, rtol=RTOL, atol=ATOL)


@pytest.fixture
def fresh_dynamo():
    torch_backend.register()
    torch._dynamo.reset()
    del REPORTS[:]
    yield
    torch._dynamo.reset()


@pytest.mark.heavy
@pytest.mark.parametrize("family", TORCH_CASES)
def test_torch_compile_matches_eager(family, fresh_dynamo):
    model = zm.torch_model(family)
    args = [torch.from_numpy(v) for v in zm.inputs(family).values()]
    compiled = torch.compile(model, backend="eqfuse")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes; what stays in torch is checked below
        got = compiled(*args)
        want = model(*args)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    assert REPORTS and all(r.partitions for r in REPORTS), "eqfuse computed nothing"
    left = {op: why for r in REPORTS for (op, why) in r.fallbacks}
    if left and set(left) == TORCH_FALLBACKS.get(family, (None,))[0]:
        raise Fallback(left)
    assert not left, left  # every op of the model ran in eqfuse


@pytest.mark.extended
def test_mobilenet_v2_tf_same_padding_fuses_alike_from_both_exporters():
    """Hugging Face's MobileNetV2 pads TF-style ("same", (0, 1)) before each stride-2 depthwise
    conv: the TorchScript exporter writes a Pad node, the dynamo exporter the Conv's own uneven
    pads. Both reach the same kernels (the pad folded into the fused depthwise kernel where
    extraction takes it, else into the depthwise conv's own kernel: rules kernel_conv2d_pad_same*,
    fuse_pw_pad_dw_clip), no pad kernel before a depthwise conv, and match onnxruntime."""
    kinds = {}
    for exporter in zm.EXPORTERS:
        path = _export("mobilenet-v2", exporter)
        mod = eqfuse.compile(path)
        kinds[exporter] = [k.kind for k in mod.kernels if k.kind != "view"]
        feeds = zm.inputs("mobilenet-v2", 2)
        (want,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
        np.testing.assert_allclose(mod(**feeds), want, rtol=RTOL, atol=ATOL)
    assert kinds["torchscript"] == kinds["dynamo"], kinds
    # (the stem's pad before its dense conv stays; one before a depthwise conv whose block the
    # cost rules keep apart folds into the grouped conv kernel: eqfuse.ir.kernels.uneven_pads_conv)
    assert kinds["torchscript"].count("index") == 1, kinds
