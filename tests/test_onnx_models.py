"""Real exported models, compiled by eqfuse and matched against onnxruntime on the same inputs:
BERT, GPT-2 and ViT from transformers (small configs, random weights), ResNet-18 and MLP-Mixer,
each through the TorchScript (opset 17) and dynamo (opset 18) exporters (tests/model_exports.py)."""

from pathlib import Path

import numpy as np
import pytest
from helpers import skip_unless_installed

pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extras: pip install '.[test]'")
skip_unless_installed("transformers", reason="transformers is in the test extras: pip install '.[test]'")

import model_exports as me  # noqa: E402
import onnxruntime as ort  # noqa: E402

import eqfuse  # noqa: E402


@pytest.mark.heavy
@pytest.mark.parametrize("name, exporter", me.matrix())
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


@pytest.mark.heavy
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


def _cli(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "eqfuse", *map(str, args)], capture_output=True, text=True, timeout=600)


@pytest.mark.heavy
def test_the_command_line_binds_the_initializers_and_takes_inputs_by_onnx_name(tmp_path):
    path = me.export("bert", "torchscript")
    feeds = me.inputs("bert")
    np.savez(tmp_path / "in.npz", **feeds)
    r = _cli("run", path, "--inputs", tmp_path / "in.npz", "--verify", "-o", tmp_path / "out.npz")
    assert r.returncode == 0, r.stderr
    assert "verified" in r.stderr
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = np.load(tmp_path / "out.npz")
    np.testing.assert_allclose(got[got.files[0]], want, rtol=1e-4, atol=1e-5)
    np.savez(tmp_path / "short.npz", input_ids=feeds["input_ids"])
    r = _cli("run", path, "--inputs", tmp_path / "short.npz")
    assert r.returncode == 2 and "no array for input attention_mask" in r.stderr and "Traceback" not in r.stderr
    r = _cli("opt", path)
    assert r.returncode == 0, r.stderr
    assert "kernel {" in r.stdout


@pytest.mark.heavy
def test_bench_measures_onnxruntime_on_the_onnx_model():
    r = _cli("bench", me.export("mlp", "dynamo"), "--repeat", "2", "--peers", "numpy,onnxruntime")
    assert r.returncode == 0, r.stderr
    assert "onnxruntime (ORT_ENABLE_ALL)" in r.stdout and "eqfuse fused" in r.stdout


@pytest.mark.heavy
def test_bench_measures_openvino_in_f32_and_its_default_precision():
    pytest.importorskip("openvino")
    r = _cli("bench", me.export("mlp", "dynamo"), "--repeat", "2", "--threads", "1", "--peers", "numpy,openvino",
             "--precision", "bf16")
    assert r.returncode == 0, r.stderr
    assert "OpenVINO f32" in r.stdout and "OpenVINO default (" in r.stdout and "eqfuse fused" in r.stdout
    assert "OpenVINO: measured on the .onnx model" in r.stdout
    r = _cli("bench", Path(__file__).resolve().parent.parent / "examples" / "mlp.g", "--dim", "B=4", "--repeat", "2", "--threads", "1",
             "--peers", "numpy,openvino")
    assert r.returncode == 0 and "OpenVINO: runs .onnx models only" in r.stdout, r.stdout + r.stderr


# (GPT-2 through dynamo in the extended tier: the suite's time)
@pytest.mark.parametrize("name, exporter", [
    pytest.param(n, e, marks=[pytest.mark.extended] if (n, e) == ("gpt2", "dynamo") else [])
    for n in ("bert", "gpt2") for e in me.EXPORTERS])
def test_the_attention_masks_of_bert_and_gpt2_are_inside_their_attention_kernels(name, exporter):
    mod = eqfuse.compile(str(me.export(name, exporter)))
    attention = [line for line in mod.graph.splitlines() if "softmax(" in line]
    assert len(attention) == 2  # one kernel per layer
    assert all("@" in line and "where(" in line and "zero_nan=true" in line for line in attention), attention
