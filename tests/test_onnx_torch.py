"""PyTorch models (random weights, tiny sizes) exported to ONNX with the TorchScript exporter,
imported by eqfuse and compared with torch's own output.

Each model runs through eqfuse.compile (C kernels) with the weights bound by onnx_params, and
through the numpy reference of the imported graph. Tolerance: rtol 1e-4, atol 1e-5.
"""

from __future__ import annotations

import io
import subprocess
import sys
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")
nn = torch.nn

import eqfuse  # noqa: E402
from eqfuse.frontend.onnx_import import import_onnx, onnx_params  # noqa: E402
from eqfuse.ir.printer import graph_text  # noqa: E402
from eqfuse.ir.reference import evaluate  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(torch.relu(self.fc1(x)))))


class SelfAttention(nn.Module):
    """Multi-head attention written out (q @ k^T * scale [+ mask], softmax, @ v)."""

    def __init__(self, d: int, heads: int, seq: int, causal: bool):
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        mask = torch.triu(torch.full((seq, seq), -1e9), diagonal=1) if causal else torch.zeros(seq, seq)
        self.register_buffer("mask", mask)
        self.causal = causal

    def split(self, x, b, t):
        return x.reshape(b, t, self.h, self.dh).transpose(1, 2)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.split(self.q(x), b, t), self.split(self.k(x), b, t), self.split(self.v(x), b, t)
        att = q @ k.transpose(-2, -1) * (1.0 / self.dh ** 0.5)
        if self.causal:
            att = att + self.mask[:t, :t]
        y = torch.softmax(att, dim=-1) @ v
        return self.o(y.transpose(1, 2).reshape(b, t, d))


class BertLayer(nn.Module):
    """Post-norm encoder layer: LN(x + attn(x)), LN(h + FFN(h)) with erf GELU."""

    def __init__(self, d=32, heads=4, ff=64, seq=8):
        super().__init__()
        self.attn = SelfAttention(d, heads, seq, causal=False)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x):
        h = self.ln1(x + self.attn(x))
        return self.ln2(h + self.ff2(nn.functional.gelu(self.ff1(h))))


class GPT2Block(nn.Module):
    """Pre-norm decoder block with a causal mask and tanh GELU."""

    def __init__(self, d=32, heads=4, seq=8):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = SelfAttention(d, heads, seq, causal=True)
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class ResBlock(nn.Module):
    """conv-bn-relu, conv-bn, + residual, relu (a ResNet basic block)."""

    def __init__(self, c=8):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1, self.b2 = nn.BatchNorm2d(c), nn.BatchNorm2d(c)
        for bn in (self.b1, self.b2):  # non-trivial running statistics
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.5, 0.5)

    def forward(self, x):
        return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


MODELS = {
    "mlp": (MLP, (4, 16)),
    "bert_layer": (BertLayer, (2, 8, 32)),
    "gpt2_block": (GPT2Block, (2, 8, 32)),
    "resnet_block": (ResBlock, (2, 8, 8, 8)),
}


def make_model(name: str):
    """(model in eval mode, a random input, torch's output as numpy), seeded."""
    torch.manual_seed(0)
    cls, shape = MODELS[name]
    model = cls().eval()
    x = torch.randn(*shape)
    with torch.no_grad():
        return model, x, model(x).numpy()


def export(model: nn.Module, x: torch.Tensor, **kw) -> bytes:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), f, dynamo=False, input_names=["x"], output_names=["y"], **kw)
    return f.getvalue()


@pytest.fixture(scope="module", params=sorted(MODELS))
def exported(request, tmp_path_factory):
    torch.manual_seed(0)
    cls, shape = MODELS[request.param]
    model = cls().eval()
    x = torch.randn(*shape)
    with torch.no_grad():
        want = model(x).numpy()
    path = tmp_path_factory.mktemp("onnx") / f"{request.param}.onnx"
    # training=EVAL without constant folding keeps BatchNormalization in the graph
    path.write_bytes(export(model, x, do_constant_folding=False, training=torch.onnx.TrainingMode.EVAL))
    return request.param, path, x.numpy(), want


def test_reference_matches_torch(exported):
    name, path, x, want = exported
    g, params = import_onnx(path), onnx_params(path)
    args = [x if n == "x" else params[n] for n, _ in g.params]
    (got,) = evaluate(g, args)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.heavy
def test_compiled_matches_torch(exported):
    name, path, x, want = exported
    mod = eqfuse.compile(str(path), params=onnx_params(path))
    np.testing.assert_allclose(mod(x), want, rtol=RTOL, atol=ATOL)
    if name == "resnet_block":  # both batchnorms folded into their convs' weights (eqfuse/optimizer/fold.py)
        assert len(mod.report["folded"]) == 2 and "batchnorm" not in mod.graph


def test_graph_text_is_valid_g(exported):
    """The imported graph prints as .g text that parses back to the same text."""
    name, path, x, want = exported
    text = graph_text(import_onnx(path))
    from eqfuse.frontend.load import load

    assert graph_text(load(text)[0]) == text


@pytest.mark.parametrize("name", ["bert_layer", "resnet_block"])
def test_default_export_with_constant_folding(name):
    """torch's default export pre-transposes weights (initializers named 'onnx::MatMul_123')
    and folds batchnorm into conv weights."""
    model, x, want = make_model(name)
    m = onnx.load_from_string(export(model, x))
    g, params = import_onnx(m), onnx_params(m)
    assert all(n.isidentifier() for n, _ in g.params)
    args = [x.numpy() if n == "x" else params[n] for n, _ in g.params]
    (got,) = evaluate(g, args)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.heavy
def test_dynamic_batch_is_a_named_dim(tmp_path):
    torch.manual_seed(0)
    model = MLP().eval()
    path = tmp_path / "mlp.onnx"
    path.write_bytes(export(model, torch.randn(2, 16), dynamic_axes={"x": {0: "batch size"}, "y": {0: "batch size"}}))
    g = import_onnx(path)
    assert g.params[0][1].shape == ("batch_size", 16)
    mod = eqfuse.compile(str(path), params=onnx_params(path))
    for b in (1, 5):
        x = torch.randn(b, 16)
        with torch.no_grad():
            want = model(x).numpy()
        np.testing.assert_allclose(mod(x.numpy()), want, rtol=RTOL, atol=ATOL)


@pytest.mark.heavy  # (the fast tier's time)
def test_cli_check(exported):
    name, path, x, want = exported
    r = subprocess.run([sys.executable, "-m", "eqfuse.cli", "check", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"main_graph(x: f32[{', '.join(map(str, x.shape))}]")
    assert "Traceback" not in r.stderr


@pytest.mark.heavy
@pytest.mark.parametrize("name,count,rows", [("bert_layer", 7, 2), ("gpt2_block", 9, 0)])
def test_exported_layers_fuse_like_the_example(name, count, rows, tmp_path):
    """The exported encoder / decoder layers fuse like examples/transformer.g: three projections,
    one attention kernel reading and writing the heads in place (no layout kernel), the output
    projection with the residual, two FFN GEMMs and the two layernorms. Post-norm (BERT): each
    layernorm is the row epilogue of the GEMM before it (7 kernels); pre-norm (GPT-2): the
    layernorms come before their GEMMs, kernels of their own (9)."""
    model, x, want = make_model(name)
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(export(model, x))
    mod = eqfuse.compile(str(path))
    kinds = [k.kind for k in mod.kernels if k.kind != "view"]
    assert len(kinds) == count and kinds.count("attention") == 1 and "layout" not in kinds, kinds
    assert kinds.count("contraction_row") == rows, kinds
    np.testing.assert_allclose(mod(x.numpy()), want, rtol=RTOL, atol=ATOL)
