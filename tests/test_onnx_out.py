"""`eqfuse opt MODEL --onnx-out fused.onnx`: the optimized graph as ONNX, each kernel a local
function named after its kind, run in onnxruntime against eqfuse's own output."""

import json

import numpy as np
import pytest
from helpers import ROOT
from test_kernel_counts import GPT2_BLOCK

import eqfuse
from eqfuse.cli.main import main

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

MLP = ROOT / "examples" / "mlp.g"


def opt(capsys, *args) -> tuple[int, str, str]:
    status = main([str(a) for a in ("opt", *args)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, out, err


def run_both(path, src, dims):
    """(onnxruntime's outputs, eqfuse's) on the same random inputs."""
    s = ort.InferenceSession(str(path))
    rng = np.random.default_rng(0)
    ins = {i.name: (rng.standard_normal(i.shape) / 4).astype(np.float32) for i in s.get_inputs()}
    return s.run(None, ins)[0], eqfuse.compile(src, dims=dims)(**ins)


def test_the_mlp_runs_in_onnxruntime_with_each_kernel_a_function(capsys, tmp_path):
    out = tmp_path / "mlp.onnx"
    status, text, _ = opt(capsys, MLP, "--dim", "B=4", "--onnx-out", out, "--report", "json")
    assert status == 0
    model = onnx.load(str(out))
    # one top-level node per kernel, each a call of its function, named after the kernel's kind
    names = [f.name for f in model.functions]
    assert names == ["contraction_1", "contraction_2"]
    assert [(n.op_type, n.domain) for n in model.graph.node] == [(f, "eqfuse.kernels") for f in names]
    assert len(names) == json.loads(text)["kernels_after"]
    ours, theirs = run_both(out, MLP, {"B": 4})
    assert ours.shape == (4, 10)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.heavy
def test_views_are_functions_of_kind_view_and_the_block_runs(capsys, tmp_path):
    src = tmp_path / "block.g"
    src.write_text(GPT2_BLOCK)
    out = tmp_path / "block.onnx"
    status, text, _ = opt(capsys, src, "--onnx-out", out, "--report", "json")
    assert status == 0
    r = json.loads(text)
    names = [f.name for f in onnx.load(str(out)).functions]
    assert sum(n.startswith("view") for n in names) == r["views_after"]
    assert len(names) - r["views_after"] == r["kernels_after"] and "attention" in names
    ours, theirs = run_both(out, src, {})
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_an_op_without_a_mapping_is_refused_by_name(capsys, tmp_path):
    out = tmp_path / "conv.onnx"
    status, _, err = opt(capsys, ROOT / "examples" / "conv_bn_relu.g", "--dim", "N=1", "--onnx-out", out)
    assert status != 0 and "'conv2d' has no ONNX mapping" in err and not out.exists()


def test_unbound_dims_are_refused(capsys, tmp_path):
    status, _, err = opt(capsys, MLP, "--onnx-out", tmp_path / "mlp.onnx")
    assert status != 0 and "--onnx-out needs every dim bound" in err and "B" in err


def bert_layer_export(tmp_path):
    """One transformers BertLayer (hidden 32, 2 heads, FFN 64) exported by torch.onnx.export
    (TorchScript exporter), with an additive attention mask as its second input."""
    import model_exports as me

    def write(path):
        import torch
        from transformers import BertConfig
        from transformers.models.bert.modeling_bert import BertLayer

        torch.manual_seed(0)
        cfg = BertConfig(hidden_size=32, num_attention_heads=2, intermediate_size=64, attn_implementation="eager")
        layer = BertLayer(cfg).eval()

        class Wrap(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = layer

            def forward(self, x, mask):
                out = self.layer(x, attention_mask=mask)
                return out[0] if isinstance(out, tuple) else out

        args = (torch.randn(2, 8, 32), torch.zeros(2, 1, 1, 8))
        torch.onnx.export(Wrap().eval(), args, str(path), input_names=["x", "mask"], output_names=["y"],
                          opset_version=17, dynamo=False)
    return me.cached("bert-layer-torchscript", write)


@pytest.mark.heavy  # (torch and transformers import; the export itself is cached)
def test_an_exported_bert_layer_runs_in_onnxruntime(capsys, tmp_path):
    src = bert_layer_export(tmp_path)
    out = tmp_path / "layer.onnx"
    status, text, _ = opt(capsys, src, "--onnx-out", out, "--report", "json")
    assert status == 0
    r = json.loads(text)
    names = [f.name for f in onnx.load(str(out)).functions]
    assert len(names) - r["views_after"] == r["kernels_after"] == 7 and "attention" in names
    rng = np.random.default_rng(0)
    mask = np.zeros((2, 1, 1, 8), np.float32)
    mask[1, ..., 5:] = np.finfo(np.float32).min  # the second sequence padded after 5 tokens
    ins = {"x": rng.standard_normal((2, 8, 32)).astype(np.float32), "mask": mask}
    fused = ort.InferenceSession(str(out)).run(None, ins)[0]  # the fused graph, in onnxruntime
    original = ort.InferenceSession(str(src)).run(None, ins)[0]  # the export as torch wrote it
    np.testing.assert_allclose(fused, original, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(eqfuse.compile(str(src))(**ins), original, rtol=1e-4, atol=1e-5)
