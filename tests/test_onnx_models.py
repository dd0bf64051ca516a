"""Real exported models, compiled by eqfuse and matched against onnxruntime on the same inputs:
BERT, GPT-2 and ViT from transformers (small configs, random weights), ResNet-18 and MLP-Mixer,
each through the TorchScript (opset 17) and dynamo (opset 18) exporters (tests/model_exports.py)."""

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extras: pip install '.[test]'")
pytest.importorskip("transformers", reason="transformers is in the test extras: pip install '.[test]'")

import onnxruntime as ort  # noqa: E402

import eqfuse  # noqa: E402
import model_exports as me  # noqa: E402


@pytest.mark.parametrize("exporter", me.EXPORTERS)
@pytest.mark.parametrize("name", me.MODELS)
def test_exported_model_matches_onnxruntime(name, exporter):
    path = str(me.export(name, exporter))
    mod = eqfuse.compile(path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for seed in (0, 1):
        feeds = me.inputs(name, seed)
        (want,) = sess.run(None, feeds)
        got = mod(**feeds)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("exporter", me.EXPORTERS)
def test_integer_ids_and_the_mask_stay_runtime_inputs(exporter):
    """The ids and the attention mask are parameters of the compiled graph, not constants: a
    different mask changes the result as it does in onnxruntime."""
    path = str(me.export("bert", exporter))
    mod = eqfuse.compile(path)
    params = dict(mod.default.source.params)
    assert str(params["input_ids"]) == "i64[2, 16]" and str(params["attention_mask"]) == "i64[2, 16]"
    feeds = me.inputs("bert")
    full = dict(feeds, attention_mask=np.ones_like(feeds["attention_mask"]))
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    a, b = mod(**feeds), mod(**full)
    assert not np.allclose(a[1], b[1])  # the padded positions of the second sequence change
    np.testing.assert_allclose(b, sess.run(None, full)[0], rtol=1e-4, atol=1e-5)
