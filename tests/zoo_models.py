"""The model zoo of tests/test_zoo.py and benchmarks/bench_zoo.py: one tiny model per Hugging Face
family (small configs, random weights, no download), its inputs, and its ONNX export through the
TorchScript exporter (opset 17) and the dynamo exporter (opset 18), cached on disk as
tests/model_exports.py caches its exports (`cached`, keyed by the torch and transformers versions).

Each model returns one tensor (the last hidden state, or the feature map of a CNN), so that the
ONNX graph has one output named "y".
"""

from __future__ import annotations

import model_exports as me
import numpy as np

B, S, VOCAB = 2, 16, 100
IMAGE = 32  # the side of the vision models' input images
MOBILEVIT_IMAGE = 64  # (see _config)
MELS, FRAMES = 16, 32  # Whisper's log-mel input: 16 bins, 32 frames (2 x max_source_positions)
SAMPLES = 400  # Wav2Vec2's raw audio: its two convs (kernel 10 stride 5, kernel 3 stride 2) make 39 frames

# family -> group; the test matrix and the benchmark go through them in this order
GROUPS = {
    "bert": "encoder", "distilbert": "encoder", "roberta": "encoder", "albert": "encoder",
    "electra": "encoder", "deberta-v2": "encoder", "mpnet": "encoder", "t5-encoder": "encoder", "funnel": "encoder",
    "convbert": "encoder",
    "gpt2": "decoder", "gpt-neo": "decoder", "opt": "decoder", "llama": "decoder", "qwen2": "decoder",
    "phi": "decoder", "bloom": "decoder", "falcon": "decoder",
    "vit": "vision", "deit": "vision", "swin": "vision", "clip-vision": "vision", "convnext": "vision",
    "resnet": "vision", "mobilenet-v2": "vision", "efficientnet": "vision", "regnet": "vision",
    "mobilevit": "vision", "dinov2": "vision",
    "whisper-encoder": "audio", "wav2vec2": "audio",
}
FAMILIES = tuple(GROUPS)
EXPORTERS = ("torchscript", "dynamo")
DECODERS = {f for f, g in GROUPS.items() if g == "decoder"}  # run without a cache
# the text families take an attention mask beside the ids, the second sequence padded at its end
# (without a mask, transformers looks for packed sequences in the positions with aten::diff, which
# the TorchScript exporter lacks)
MASKED = {f for f, g in GROUPS.items() if g in ("encoder", "decoder")}
# part of the exports' cache key, which sees the torch and transformers versions but not this
# file: bump it when a family's config or inputs change
REVISION = 1

_TEXT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             vocab_size=VOCAB, max_position_embeddings=64)


def _config(family: str):
    import transformers as T

    if family == "bert":
        return T.BertModel(T.BertConfig(**_TEXT), add_pooling_layer=False)
    if family == "distilbert":
        return T.DistilBertModel(T.DistilBertConfig(dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                                    vocab_size=VOCAB, max_position_embeddings=64))
    if family == "roberta":  # pad_token_id 1: the ids start at 2 (positions count from the pad id)
        return T.RobertaModel(T.RobertaConfig(**dict(_TEXT, max_position_embeddings=64 + 2)), add_pooling_layer=False)
    if family == "albert":  # one layer's weights shared by both layers, factorized embeddings
        return T.AlbertModel(T.AlbertConfig(embedding_size=32, **_TEXT), add_pooling_layer=False)
    if family == "electra":
        return T.ElectraModel(T.ElectraConfig(embedding_size=32, **_TEXT))
    if family == "deberta-v2":  # disentangled attention: content-to-position and position-to-content
        return T.DebertaV2Model(T.DebertaV2Config(**_TEXT, relative_attention=True, position_buckets=8,
                                                  pos_att_type=["p2c", "c2p"], max_relative_positions=16))
    if family == "mpnet":
        return T.MPNetModel(T.MPNetConfig(**_TEXT), add_pooling_layer=False)
    if family == "t5-encoder":  # relative position buckets, RMS norm
        return T.T5EncoderModel(T.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                           vocab_size=VOCAB))
    if family == "funnel":  # relative positional attention, mean-pooled blocks (the dynamo export's ScatterND)
        return T.FunnelBaseModel(T.FunnelConfig(d_model=64, n_head=4, d_head=16, d_inner=128, block_sizes=[1, 1],
                                                vocab_size=VOCAB))
    if family == "convbert":  # span-based dynamic convolution heads beside self-attention (a softmax over axis 1)
        return T.ConvBertModel(T.ConvBertConfig(**_TEXT, embedding_size=64))
    if family == "gpt2":
        return T.GPT2Model(T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64))
    if family == "gpt-neo":  # a global then a local (windowed) attention layer
        return T.GPTNeoModel(T.GPTNeoConfig(hidden_size=64, num_layers=2, num_heads=4, vocab_size=VOCAB,
                                            max_position_embeddings=64, window_size=8,
                                            attention_types=[[["global", "local"], 1]]))
    if family == "opt":
        return T.OPTModel(T.OPTConfig(hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
                                      word_embed_proj_dim=64, vocab_size=VOCAB, max_position_embeddings=64))
    if family == "llama":  # grouped-query attention: 2 key/value heads for 4 query heads
        return T.LlamaModel(T.LlamaConfig(**_TEXT, num_key_value_heads=2))
    if family == "qwen2":
        return T.Qwen2Model(T.Qwen2Config(**_TEXT, num_key_value_heads=2))
    if family == "phi":  # rotary embedding on half of each head
        return T.PhiModel(T.PhiConfig(**_TEXT, partial_rotary_factor=0.5))
    if family == "falcon":  # multi-query attention (one key/value head), parallel attention and MLP
        return T.FalconModel(T.FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB))
    if family == "bloom":  # ALiBi, the attention over merged batch and heads
        return T.BloomModel(T.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=VOCAB))
    vit = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
               image_size=IMAGE, patch_size=8)
    if family == "vit":
        return T.ViTModel(T.ViTConfig(**vit), add_pooling_layer=False)
    if family == "deit":
        return T.DeiTModel(T.DeiTConfig(**vit), add_pooling_layer=False)
    if family == "clip-vision":
        return T.CLIPVisionModel(T.CLIPVisionConfig(**vit))
    if family == "swin":  # shifted 4x4 windows over an 8x8 then a 4x4 patch grid
        return T.SwinModel(T.SwinConfig(image_size=IMAGE, patch_size=4, embed_dim=16, depths=[2, 2],
                                        num_heads=[2, 4], window_size=4), add_pooling_layer=False)
    if family == "convnext":  # depthwise 7x7 convs
        return T.ConvNextModel(T.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2))
    if family == "resnet":
        return T.ResNetModel(T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                            layer_type="bottleneck"))
    if family == "mobilenet-v2":  # depthwise 3x3 convs in inverted residuals
        return T.MobileNetV2Model(T.MobileNetV2Config(image_size=IMAGE, depth_multiplier=0.25),
                                  add_pooling_layer=False)
    if family == "efficientnet":  # depthwise convs, squeeze-and-excitation, swish
        return T.EfficientNetModel(T.EfficientNetConfig(image_size=IMAGE, width_coefficient=0.25,
                                                        depth_coefficient=0.25, hidden_dim=320))
    if family == "regnet":  # grouped 3x3 convs, squeeze-and-excitation
        return T.RegNetModel(T.RegNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                            groups_width=8))
    if family == "mobilevit":  # inverted residuals, then transformer blocks over unfolded patches
        # at 64x64 every feature map divides into 2x2 patches, as at MobileViT's own 256x256; at 32x32
        # the last (1x1) would be resized up and back (bilinear), which the full-size model never does
        return T.MobileViTModel(T.MobileViTConfig(image_size=MOBILEVIT_IMAGE, hidden_sizes=[32, 48, 64],
                                                  neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                                                  num_attention_heads=2), expand_output=False)
    if family == "whisper-encoder":  # two conv1d (the second strided), then the transformer encoder
        return T.WhisperModel(T.WhisperConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4,
                                              decoder_layers=1, decoder_attention_heads=4,
                                              encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=VOCAB,
                                              # special tokens inside the tiny vocabulary
                                              pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                              decoder_start_token_id=1,
                                              num_mel_bins=MELS, max_source_positions=FRAMES // 2)).get_encoder()
    if family == "dinov2":  # its position embeddings resized (bicubic) to the image's patch grid
        return T.Dinov2Model(T.Dinov2Config(**{k: v for k, v in vit.items() if k != "intermediate_size"}, mlp_ratio=2))
    if family == "wav2vec2":  # convs over raw audio, a GroupNorm per channel, a weight-normed positional conv
        return T.Wav2Vec2Model(T.Wav2Vec2Config(**{k: v for k, v in _TEXT.items() if k not in ("vocab_size",
                                                                                              "max_position_embeddings")},
                                                conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3),
                                                num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4))
    raise ValueError(f"unknown family {family}")


def input_names(family: str) -> tuple[str, ...]:
    if family in MASKED:
        return ("input_ids", "attention_mask")
    if family == "wav2vec2":
        return ("input_values",)
    return ("input_features",) if family == "whisper-encoder" else ("pixel_values",)


def inputs(family: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if family in MASKED:
        mask = np.ones((B, S), np.int64)
        mask[1, S - 5:] = 0  # padding at the end of the second sequence
        return {"input_ids": rng.integers(2, VOCAB, (B, S)).astype(np.int64), "attention_mask": mask}
    if family == "whisper-encoder":
        return {"input_features": rng.standard_normal((B, MELS, FRAMES)).astype(np.float32)}
    if family == "wav2vec2":
        return {"input_values": rng.standard_normal((B, SAMPLES)).astype(np.float32)}
    side = MOBILEVIT_IMAGE if family == "mobilevit" else IMAGE
    return {"pixel_values": rng.standard_normal((B, 3, side, side)).astype(np.float32)}


def torch_model(family: str):
    """The family's tiny model in eval mode, called with `inputs`' arrays (as tensors) in order,
    returning one tensor."""
    import warnings

    import torch

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes on configs
        m = _config(family).eval()
    with torch.no_grad():  # batchnorm statistics that are not the identity
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
    names = input_names(family)

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, *args):
            kw = dict(zip(names, args))
            if family in DECODERS:
                kw["use_cache"] = False
            return self.m(**kw).last_hidden_state
    return Wrap().eval()


def export(family: str, exporter: str):
    """The path of the family's ONNX export (made once, then taken from the cache): `exporter` is
    one of EXPORTERS, or "dynamo-opset23"."""
    def write(path):
        import torch

        args = tuple(torch.from_numpy(v) for v in inputs(family).values())
        if exporter == "torchscript":
            torch.onnx.export(torch_model(family), args, str(path), input_names=list(input_names(family)),
                              output_names=["y"], opset_version=17, dynamo=False)
        else:  # ("dynamo-opset23": opset 23, whose Attention and RMSNormalization ops it then writes)
            torch.onnx.export(torch_model(family), args, str(path), input_names=list(input_names(family)),
                              output_names=["y"], opset_version=23 if exporter == "dynamo-opset23" else 18,
                              dynamo=True, external_data=False)
    return me.cached(f"zoo{REVISION}-{family}-{exporter}", write)


def export_dynamic(family: str):
    """The path of a text family's TorchScript export with dynamic batch and sequence axes, as
    optimum exports it (made once, then cached)."""
    def write(path):
        import torch

        names = input_names(family)
        args = tuple(torch.from_numpy(v) for v in inputs(family).values())
        axes = {n: {0: "batch", 1: "sequence"} for n in (*names, "y")}
        torch.onnx.export(torch_model(family), args, str(path), input_names=list(names), output_names=["y"],
                          opset_version=17, dynamo=False, dynamic_axes=axes)
    return me.cached(f"zoo{REVISION}-{family}-torchscript-dynamic-batch-sequence", write)
