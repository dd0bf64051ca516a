"""Decoders exported with their KV cache, for eqfuse.generate: a tiny Hugging Face GPT-2 LM
(2 layers, 64 wide, 4 heads, 100 tokens, 128 positions) and a tiny Llama (the same sizes, RMSNorm,
rotary embeddings, SwiGLU, grouped-query attention with 2 key/value heads) with random weights (no download),
through the TorchScript exporter (opset 17, dynamic_axes) and the dynamo one (opset 18,
dynamic_shapes). Inputs: input_ids, attention_mask, position_ids, past_key_values.{i}.key/value
[batch, heads, past, head size]; outputs: logits, present.{i}.key/value (past and new rows).
Also Qwen2, Phi, Phi-3, Gemma 3 and Mistral (sliding windows) and BLOOM (ALiBi, no position_ids:
its export has no position_ids input) at the same sizes (MODELS). Cached on disk like
tests/model_exports.py.
"""

from __future__ import annotations

import hashlib

from model_exports import cached

LAYERS, HEADS, WIDTH, VOCAB, POSITIONS = 2, 4, 64, 100, 128
HEAD = WIDTH // HEADS
EOS = 99  # the config's eos token (in the vocabulary: transformers' generate stops at it)


def gpt2(layers: int = LAYERS, width: int = WIDTH, heads: int = HEADS, positions: int = POSITIONS,
         vocab: int = VOCAB, **_):
    """The transformers GPT2LMHeadModel the exports are made from (seeded: the same weights
    in every process); the sizes are the tests' unless benchmarks/bench_generate.py sets them."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    cfg = T.GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=positions,
                       bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS)
    return T.GPT2LMHeadModel(cfg).eval()


KV_HEADS = 2  # the Llama's key/value heads (grouped-query attention: 2 query heads share each)


def llama(layers: int = LAYERS, width: int = WIDTH, heads: int = HEADS, positions: int = POSITIONS,
          vocab: int = VOCAB, ff: int | None = None, kv_heads: int = KV_HEADS):
    """The transformers LlamaForCausalLM the Llama exports are made from (seeded, as gpt2); `ff`
    is the MLP's width (2 x width by default)."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    cfg = T.LlamaConfig(hidden_size=width, intermediate_size=ff or 2 * width, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                        max_position_embeddings=positions, bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS)
    m = T.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # random norm weights (they start at 1): the test sees a norm's weight applied
        for n, p in m.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    return m


def qwen2(layers: int = LAYERS, width: int = WIDTH, heads: int = HEADS, positions: int = POSITIONS):
    """A transformers Qwen2ForCausalLM (seeded, as gpt2): the Llama's layout with biases on the
    query, key and value projections, grouped-query attention with 2 key/value heads."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    cfg = T.Qwen2Config(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                        max_position_embeddings=positions, tie_word_embeddings=False, use_sliding_window=False,
                        bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS)
    m = T.Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # random norm weights and biases (they start at 1 and 0)
        for n, p in m.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
            elif n.endswith("bias"):
                p.uniform_(-0.5, 0.5)
    return m


def phi(layers: int = LAYERS, width: int = WIDTH, heads: int = HEADS, positions: int = POSITIONS):
    """A transformers PhiForCausalLM (seeded, as gpt2): LayerNorm, attention and the GELU MLP in
    parallel off one norm, rotary embeddings on half of each head (partial_rotary_factor 0.5)."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    cfg = T.PhiConfig(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, vocab_size=VOCAB,
                      max_position_embeddings=positions, partial_rotary_factor=0.5,
                      bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS)
    m = T.PhiForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "layernorm" in n and n.endswith("weight"):
                p.uniform_(0.5, 1.5)
    return m


def phi3(layers: int = LAYERS, width: int = WIDTH, heads: int = HEADS, positions: int = POSITIONS):
    """A transformers Phi3ForCausalLM (seeded, as gpt2): RMSNorm, one fused projection for the
    query, keys and values and one for the SwiGLU's gate and up, rotary embeddings over the whole
    head (its export slices an empty pass-through part), grouped-query attention with 2 key/value
    heads."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    cfg = T.Phi3Config(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                       max_position_embeddings=positions, original_max_position_embeddings=positions,
                       bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS)
    m = T.Phi3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    return m


SLIDING_WINDOW = 32  # the Gemma3's: its sliding layers keep their last 31 rows


def gemma3(layers: int = LAYERS, width: int = WIDTH, heads: int = HEADS, positions: int = POSITIONS):
    """A transformers Gemma3ForCausalLM (seeded, as gpt2; the family of the small Gemma 3 text
    models): a sliding-window layer (window SLIDING_WINDOW, its cache the last window - 1 rows)
    then a full one, RMSNorms around attention and MLP, grouped-query attention with 2 key/value
    heads, logit soft-capping off."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    cfg = T.Gemma3TextConfig(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=KV_HEADS, head_dim=width // heads,
                             vocab_size=VOCAB, max_position_embeddings=positions, sliding_window=SLIDING_WINDOW,
                             layer_types=["sliding_attention", "full_attention"] * (layers // 2),
                             bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS)
    m = T.Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():  # (Gemma's norms scale by 1 + weight, the weight starting at 0)
        for n, p in m.named_parameters():
            if "norm" in n:
                p.uniform_(-0.5, 0.5)
    return m


def mistral(layers: int = LAYERS, width: int = WIDTH, heads: int = HEADS, positions: int = POSITIONS):
    """A transformers MistralForCausalLM (seeded, as gpt2): the Llama's layout with a sliding
    window (SLIDING_WINDOW - 8) in every layer, so every cache is a window's."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    cfg = T.MistralConfig(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=KV_HEADS, head_dim=width // heads,
                          vocab_size=VOCAB, max_position_embeddings=4096, sliding_window=SLIDING_WINDOW - 8,
                          bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS)
    return T.MistralForCausalLM(cfg).eval()


def bloom(layers: int = LAYERS, width: int = WIDTH, heads: int = HEADS, positions: int = POSITIONS):
    """A transformers BloomForCausalLM (seeded, as gpt2): ALiBi, no position input (the bias of
    each key comes from the attention mask's running count), the attention over merged batch
    and heads ([B * heads, S, T] batched matmuls), a layernorm after the embedding. Weights
    drawn wider than its initializer's (0.02), so that greedy tokens vary."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    cfg = T.BloomConfig(hidden_size=width, n_layer=layers, n_head=heads, vocab_size=VOCAB, initializer_range=0.2,
                        tie_word_embeddings=False,
                        bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS)
    return T.BloomForCausalLM(cfg).eval()


POSITIONLESS = {"bloom"}  # models whose forward takes no position_ids (nor does their export)

# More decoder families a user brings, built from their transformers config at the test sizes
# (family): the config's own names where they differ, and what sets each family apart.
_SIZES = dict(hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=2 * WIDTH,
              max_position_embeddings=POSITIONS)
_GQA = dict(_SIZES, num_key_value_heads=KV_HEADS)
_GPT = dict(n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, n_positions=POSITIONS)
FAMILIES = {
    "gpt_neox": dict(_SIZES, rotary_pct=0.5),  # rotary on a quarter of each head, parallel residual
    "falcon": dict(_SIZES, new_decoder_architecture=True, num_kv_heads=HEADS, alibi=False),
    "gptj": dict(_GPT, rotary_dim=8),  # rotary on interleaved pairs
    "codegen": dict(_GPT, rotary_dim=8, n_ctx=POSITIONS),
    "gpt_bigcode": dict(_GPT, multi_query=True),  # one key/value head
    "gemma2": dict(_GQA, head_dim=HEAD, sliding_window=SLIDING_WINDOW),  # soft-capped logits and scores
    "opt": dict(_SIZES, ffn_dim=2 * WIDTH, word_embed_proj_dim=WIDTH),  # learned positions from the mask
    "xglm": dict(d_model=WIDTH, num_layers=LAYERS, attention_heads=HEADS, ffn_dim=2 * WIDTH,
                 max_position_embeddings=POSITIONS),  # sinusoidal positions, softmax over merged heads
    "stablelm": dict(_GQA),
    "starcoder2": dict(_GQA, sliding_window=None),
    "olmo2": dict(_GQA),  # RMSNorm of the queries and keys
    "qwen3": dict(_GQA, head_dim=HEAD),  # RMSNorm of each head's queries and keys
    "cohere": dict(_GQA),  # LayerNorm without a bias, rotary on interleaved pairs
    # its causal masks sliced from a positions x positions table by the key length, every other
    # layer's to a window of 16
    "gpt_neo": dict(hidden_size=WIDTH, num_layers=LAYERS, num_heads=HEADS, max_position_embeddings=POSITIONS,
                    attention_types=[[["global", "local"], LAYERS // 2]], window_size=16),
}


def family(model_type: str):
    """The maker of a FAMILIES model (seeded, as gpt2), its norms' weights drawn away from 1."""
    def make(layers: int = LAYERS, width: int = WIDTH, heads: int = HEADS, positions: int = POSITIONS):
        import torch
        import transformers as T

        assert (layers, width, heads, positions) == (LAYERS, WIDTH, HEADS, POSITIONS)
        torch.manual_seed(0)
        cfg = T.AutoConfig.for_model(model_type, **FAMILIES[model_type], vocab_size=VOCAB, bos_token_id=EOS,
                                     eos_token_id=EOS, pad_token_id=EOS)
        m = T.AutoModelForCausalLM.from_config(cfg).eval()
        with torch.no_grad():
            for n, p in m.named_parameters():
                if ("norm" in n or "ln" in n) and p.dim() == 1 and not n.endswith("bias"):
                    p.uniform_(0.5, 1.5)
        return m
    return make


def _kv_heads(cfg: dict) -> int:
    return 1 if cfg.get("multi_query") else cfg.get("num_key_value_heads", cfg.get("num_kv_heads", HEADS))


MODELS = {"gpt2": (gpt2, HEADS), "llama": (llama, KV_HEADS), "qwen2": (qwen2, KV_HEADS),
          "phi": (phi, HEADS), "phi3": (phi3, KV_HEADS), "gemma3": (gemma3, KV_HEADS), "mistral": (mistral, KV_HEADS), "bloom": (bloom, HEADS),
          **{f: (family(f), _kv_heads(c)) for f, c in FAMILIES.items()}}  # -> (maker, key/value heads)


def _wrapped(model, layers: int = LAYERS, positions: bool = True):
    """The model with the cache as flat tensors in and out (the exporters take no Cache object);
    with positions=False, a model that takes no position_ids (BLOOM, whose cache argument is
    `cache`)."""
    import torch
    import transformers as T

    def run(input_ids, attention_mask, position_ids, past):
        cache = T.DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(layers)], config=model.config)
        if positions:
            out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                        past_key_values=cache, use_cache=True)
        else:
            out = model(input_ids=input_ids, attention_mask=attention_mask, cache=cache, use_cache=True)
        flat = [out.logits]
        for layer in out.past_key_values.layers[:layers]:
            flat += [layer.keys, layer.values]
        return tuple(flat)

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            return run(input_ids, attention_mask, position_ids, past)

    class Positionless(Step):
        def forward(self, input_ids, attention_mask, *past):
            return run(input_ids, attention_mask, None, past)
    return (Step() if positions else Positionless()).eval()


def names(layers: int = LAYERS, positions: bool = True) -> tuple[list[str], list[str], list[str]]:
    """(past input names, all input names, output names) of an export with `layers` layers."""
    past = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    outs = ["logits"] + [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    return past, ["input_ids", "attention_mask"] + ["position_ids"] * positions + past, outs


PAST_NAMES, INPUT_NAMES, OUTPUT_NAMES = names()


def export_gpt2(exporter: str, layers: int = LAYERS, width: int = WIDTH, heads: int = HEADS,
                positions: int = POSITIONS):
    """The path of the GPT-2 decoder export through `exporter` ("torchscript" or "dynamo")."""
    return export_decoder("gpt2", exporter, layers, width, heads, positions)


def export_decoder(model: str, exporter: str, layers: int = LAYERS, width: int = WIDTH, heads: int = HEADS,
                   positions: int = POSITIONS, **sizes):
    """The path of a decoder export (a key of MODELS) through `exporter` ("torchscript", "dynamo", or
    "dynamo-opset23": opset 23, whose Attention, RMSNormalization and RotaryEmbedding it writes);
    `sizes` (vocab=, and the Llama's ff=, kv_heads=) as benchmarks/bench_generate.py sets them."""
    positioned = model not in POSITIONLESS
    past_names, input_names, output_names = names(layers, positioned)
    make, kv = MODELS[model]
    kv = heads if model in ("gpt2", "phi") else sizes.get("kv_heads", kv)

    def write(path):
        import torch

        step = _wrapped(make(layers, width, heads, positions, **sizes), layers, positioned)
        b, s, p = 2, 3, 5
        args = (torch.randint(0, sizes.get("vocab", VOCAB), (b, s)), torch.ones(b, p + s, dtype=torch.long),
                *[torch.arange(p, p + s).expand(b, s).contiguous()] * positioned,
                *(torch.randn(b, kv, p, width // heads) for _ in past_names))
        if exporter == "torchscript":
            dyn = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "total"},
                   "logits": {0: "batch", 1: "sequence"}}
            if positioned:
                dyn["position_ids"] = {0: "batch", 1: "sequence"}
            dyn.update({n: {0: "batch", 2: "past"} for n in past_names})
            dyn.update({n: {0: "batch", 2: "total"} for n in output_names[1:]})
            torch.onnx.export(step, args, str(path), input_names=input_names, output_names=output_names,
                              dynamic_axes=dyn, opset_version=17, dynamo=False)
        else:
            from torch.export import Dim

            batch, seq = Dim("batch", min=1, max=64), Dim("sequence", min=1, max=positions)
            past, total = Dim("past", min=1, max=4 * positions), Dim("total", min=2, max=5 * positions)
            shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: total},
                      **({"position_ids": {0: batch, 1: seq}} if positioned else {}),
                      "past": tuple({0: batch, 2: past} for _ in past_names)}
            torch.onnx.export(step, args, str(path), input_names=input_names, output_names=output_names,
                              dynamic_shapes=shapes, opset_version=23 if exporter == "dynamo-opset23" else 18,
                              dynamo=True, external_data=False)
    tag = "" if (layers, width, heads, positions) == (LAYERS, WIDTH, HEADS, POSITIONS) and not sizes else \
        f"-{layers}x{width}h{heads}p{positions}" + "".join(f"{k}{v}" for k, v in sorted(sizes.items()))
    if model in FAMILIES:  # (its config in the name: a changed config is another export)
        tag += "-" + hashlib.sha256(repr(sorted(FAMILIES[model].items())).encode()).hexdigest()[:8]
    return cached(f"{model}-decoder{tag}-{exporter}", write)
