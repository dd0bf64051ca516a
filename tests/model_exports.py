"""Real models exported to ONNX inside the tests: Hugging Face BERT, GPT-2 and ViT from small
configs with random weights (no download), a ResNet-18 and an MLP-Mixer written in torch, each
through the TorchScript exporter (opset 17) and the dynamo exporter (opset 18).

Exports are cached on disk (EQFUSE_EXPORT_CACHE, default ~/.cache/eqfuse/exports), keyed by
model, exporter (and dynamic axes: `cached`) and the torch and transformers versions, since an
export takes seconds (a dynamo one 5 s).
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from pathlib import Path

import numpy as np

B, S, VOCAB = 2, 16, 100


def _cache() -> Path:
    root = os.environ.get("EQFUSE_EXPORT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "eqfuse", "exports")
    return Path(root)


def _hf(name: str, layers: int = 2):
    import torch
    import transformers as T

    torch.manual_seed(0)
    if name in ("bert", "bert-base"):
        cfg = (T.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                            vocab_size=VOCAB, max_position_embeddings=64) if name == "bert" else
               T.BertConfig(vocab_size=VOCAB, max_position_embeddings=512))  # BERT-base: 12 x 768, 12 heads
        m = T.BertModel(cfg, add_pooling_layer=False).eval()

        class Wrap(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = m

            def forward(self, input_ids, attention_mask):
                return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return Wrap().eval(), ("input_ids", "attention_mask")
    if name == "gpt2":
        cfg = T.GPT2Config(n_embd=64, n_layer=layers, n_head=4, vocab_size=VOCAB, n_positions=64,
                           bos_token_id=0, eos_token_id=0)
        m = T.GPT2Model(cfg).eval()

        class Wrap(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = m

            def forward(self, input_ids, attention_mask):
                return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return Wrap().eval(), ("input_ids", "attention_mask")
    cfg = T.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                      image_size=32, patch_size=8)
    m = T.ViTModel(cfg, add_pooling_layer=False).eval()

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, pixel_values):
            return self.m(pixel_values=pixel_values).last_hidden_state
    return Wrap().eval(), ("pixel_values",)


def _resnet18(stages: bool = False):
    """ResNet-18 narrowed to 16..128 channels with a 10-way head; with `stages`, torchvision's
    resnet18 at full width, stem + layer1 + layer2 only (64 and 128 channels, 56x56 and 28x28 maps
    from a 224x224 image), the network's output the last block's."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    class ResNet18(nn.Module):  # torchvision's resnet18 layout, narrower (16..128 channels)
        def __init__(self):
            super().__init__()
            c0 = 64 if stages else 16
            self.stem = nn.Sequential(nn.Conv2d(3, c0, 7, 2, 3, bias=False), nn.BatchNorm2d(c0), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            chans, layers, cin = [64, 128] if stages else [16, 32, 64, 128], [], c0
            for i, c in enumerate(chans):
                layers += [Block(cin, c, 1 if i == 0 else 2), Block(c, c, 1)]
                cin = c
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(128, 10)

        def forward(self, x):
            x = self.layers(self.stem(x))
            if stages:
                return x
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    torch.manual_seed(0)
    m = ResNet18().eval()
    with torch.no_grad():  # non-trivial batchnorm statistics
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
    return m, ("x",)


def _mixer(layers: int = 2):
    import torch
    from torch import nn

    class MixerBlock(nn.Module):
        def __init__(self, tokens, dim):
            super().__init__()
            self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.tok = nn.Sequential(nn.Linear(tokens, 32), nn.GELU(), nn.Linear(32, tokens))
            self.ch = nn.Sequential(nn.Linear(dim, 128), nn.GELU(), nn.Linear(128, dim))

        def forward(self, x):
            x = x + self.tok(self.n1(x).transpose(1, 2)).transpose(1, 2)
            return x + self.ch(self.n2(x))

    class Mixer(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(3, 64, 8, 8)
            self.blocks = nn.Sequential(*[MixerBlock(16, 64) for _ in range(layers)])
            self.norm = nn.LayerNorm(64)
            self.head = nn.Linear(64, 10)

        def forward(self, x):
            x = self.patch(x).flatten(2).transpose(1, 2)
            return self.head(self.norm(self.blocks(x)).mean(dim=1))

    torch.manual_seed(0)
    return Mixer().eval(), ("x",)


def _mlp():
    import torch
    from torch import nn

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    return m.eval(), ("x",)


MODELS = ("bert", "gpt2", "vit", "resnet18", "mixer")
# benchmarks/bench_models.py adds two that the tests do not export: the MLP 784-1024-1024-10 at
# batch 8, BERT-base geometry (12 layers, hidden 768, 12 heads, sequence 128, batch 1; 85M
# random weights, a 350 MB export).
# and ResNet-18's stem and first two stages at full width on one 224x224 image (layer1 at 56x56).
BENCH_MODELS = MODELS + ("mlp", "bert-base", "resnet_stages")
EXPORTERS = ("torchscript", "dynamo")
# The exporter of each model that the default run takes in a model x exporter matrix (`matrix`):
# both exporters stay represented, and `-m extended` (its own step of .ci/run) runs the other.
DEFAULT_EXPORTER = {"bert": "dynamo", "gpt2": "torchscript", "vit": "dynamo", "resnet18": "dynamo",
                    "mixer": "torchscript"}


def matrix(names=MODELS, exporters=EXPORTERS, default=MODELS) -> list:
    """pytest params (name, exporter) of every model and exporter; the pairs that are not the
    model's DEFAULT_EXPORTER, and every pair of a model not in `default`, are marked `extended`."""
    import pytest

    def marks(n, e):
        return [] if n in default and DEFAULT_EXPORTER.get(n, e) == e else [pytest.mark.extended]

    return [pytest.param(n, e, marks=marks(n, e), id=f"{n}-{e}") for n in names for e in exporters]


def inputs(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if name in ("bert", "gpt2"):
        mask = np.ones((B, S), np.int64)
        mask[1, S - 5:] = 0  # padding at the end of the second sequence
        return {"input_ids": rng.integers(1, VOCAB, (B, S)).astype(np.int64), "attention_mask": mask}
    if name == "bert-base":
        return {"input_ids": rng.integers(1, VOCAB, (1, 128)).astype(np.int64),
                "attention_mask": np.ones((1, 128), np.int64)}
    if name == "mlp":
        return {"x": rng.standard_normal((8, 784)).astype(np.float32)}
    if name == "vit" or name == "mixer":
        return {("pixel_values" if name == "vit" else "x"): rng.standard_normal((B, 3, 32, 32)).astype(np.float32)}
    if name == "resnet_stages":
        return {"x": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}
    return {"x": rng.standard_normal((B, 3, 64, 64)).astype(np.float32)}


def torch_model(name: str, layers: int = 2):
    """(the torch module, its input names) that `export` exports, built the same way."""
    if layers != 2 and name not in ("gpt2", "mixer"):
        raise ValueError(f"{name}: the number of layers is fixed")
    return (_hf(name, layers) if name in ("bert", "bert-base", "gpt2", "vit") else
            _resnet18() if name == "resnet18" else _resnet18(stages=True) if name == "resnet_stages" else _mlp() if name == "mlp" else _mixer(layers))


def cached(tag: str, write) -> Path:
    """The path of an export the caller makes with write(path) (once, then taken from the cache):
    `tag` names the model and everything that shapes the export (exporter, dynamic axes). (The
    versions are read from the packages' metadata: a cached export imports neither.)"""
    from importlib.metadata import version

    path = _cache() / f"{tag}-torch{version('torch')}-tf{version('transformers')}.onnx"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        write(tmp)
    os.replace(tmp, path)
    return path


def export(name: str, exporter: str, layers: int = 2) -> Path:
    """The path of the model's ONNX export (made once, then taken from the cache). `layers`
    sets the number of layers of GPT-2 and of blocks of the MLP-Mixer (2 by default)."""
    def write(path):
        import torch

        model, names = torch_model(name, layers)
        args = tuple(torch.from_numpy(v) for v in inputs(name).values())
        if exporter == "torchscript":
            torch.onnx.export(model, args, str(path), input_names=list(names), output_names=["y"], opset_version=17,
                              dynamo=False)
        else:
            torch.onnx.export(model, args, str(path), input_names=list(names), output_names=["y"], opset_version=18,
                              dynamo=True, external_data=False)
    return cached(f"{name}{'' if layers == 2 else f'-{layers}layers'}-{exporter}", write)


def encoder_g(width: int, heads: int, ff: int | None = None, batch: int = 0) -> str:
    """The .g source of one post-norm encoder layer over a sequence S (a named dim): `heads` heads
    of width / heads, an MLP of `ff` (default 2 x width) with GELU, two layernorms; with `batch`,
    over `batch` sequences ([batch, S, width], the sequence behind the batch)."""
    hd, ff = width // heads, ff or 2 * width
    b, lead = (f"{batch}, ", 1) if batch else ("", 0)
    qp, kp = [lead + p for p in (1, 0, 2)], [lead + p for p in (0, 2, 1)]
    qp, kp = ([0] + qp, [0] + kp) if batch else (qp, kp)
    return f"""graph encoder(x: f32[{b}S, {width}],
              wq: f32[{width}, {width}], bq: f32[{width}], wk: f32[{width}, {width}], bk: f32[{width}],
              wv: f32[{width}, {width}], bv: f32[{width}], wo: f32[{width}, {width}], bo: f32[{width}],
              g1: f32[{width}], be1: f32[{width}],
              w1: f32[{width}, {ff}], b1: f32[{ff}], w2: f32[{ff}, {width}], b2: f32[{width}],
              g2: f32[{width}], be2: f32[{width}]) -> f32[{b}S, {width}] {{
    q = transpose(reshape(x @ wq + bq, shape=[{b}-1, {heads}, {hd}]), perm={qp})
    k = transpose(reshape(x @ wk + bk, shape=[{b}-1, {heads}, {hd}]), perm={qp})
    v = transpose(reshape(x @ wv + bv, shape=[{b}-1, {heads}, {hd}]), perm={qp})
    a = softmax(q @ transpose(k, perm={kp}) * {hd ** -0.5:.6f}, axis=-1) @ v
    o = reshape(transpose(a, perm={qp}), shape=[{b}-1, {width}])
    h = layernorm(x + (o @ wo + bo), g1, be1)
    f = gelu(h @ w1 + b1) @ w2 + b2
    return layernorm(h + f, g2, be2)
}}
"""
