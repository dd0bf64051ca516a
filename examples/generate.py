"""Generate text with eqfuse.generate from a tiny GPT-2 with random weights (no download).

    python examples/generate.py

Needs torch, transformers and onnx (`pip install '.[test]'`). The model is exported to ONNX
with its KV cache (past_key_values in, present out), compiled by eqfuse at its first call (the
prefill, and the decode step over the cache in place with its length a run-time value:
docs/generation.md), and decoded greedily and by sampling.
"""

import os
import tempfile
import warnings

import numpy as np
import torch
import transformers as T

import eqfuse

LAYERS, HEADS, WIDTH, VOCAB, POSITIONS = 2, 4, 64, 100, 128


class Step(torch.nn.Module):
    """One decoder call with the cache as flat tensors: the exporter takes no Cache object."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = T.DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(LAYERS)], config=self.m.config)
        out = self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                     past_key_values=cache, use_cache=True)
        flat = [out.logits]
        for layer in out.past_key_values.layers[:LAYERS]:
            flat += [layer.keys, layer.values]
        return tuple(flat)


def export(path: str) -> None:
    torch.manual_seed(0)
    cfg = T.GPT2Config(n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS, vocab_size=VOCAB, n_positions=POSITIONS,
                       bos_token_id=0, eos_token_id=0)
    past = [f"past_key_values.{i}.{k}" for i in range(LAYERS) for k in ("key", "value")]
    outputs = ["logits"] + [f"present.{i}.{k}" for i in range(LAYERS) for k in ("key", "value")]
    dyn = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "total"},
           "position_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"},
           **{n: {0: "batch", 2: "past"} for n in past}, **{n: {0: "batch", 2: "total"} for n in outputs[1:]}}
    args = (torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 8, dtype=torch.long),
            torch.arange(5, 8)[None], *(torch.zeros(1, HEADS, 5, WIDTH // HEADS) for _ in past))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Step(T.GPT2LMHeadModel(cfg).eval()), args, path, dynamo=False, opset_version=17,
                          input_names=["input_ids", "attention_mask", "position_ids"] + past,
                          output_names=outputs, dynamic_axes=dyn)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "gpt2-decoder.onnx")
        export(path)
        prompt = np.array([[5, 17, 42, 8, 99, 23, 61, 3]])
        greedy = eqfuse.generate(path, prompt, max_new_tokens=24)
        print("greedy: ", greedy[0, prompt.shape[1]:].tolist())
        sampled = eqfuse.generate(path, prompt, max_new_tokens=24, do_sample=True, temperature=0.8, top_k=20,
                                  seed=0)  # the same prompt length and capacity: nothing compiles again
        print("sampled:", sampled[0, prompt.shape[1]:].tolist())


if __name__ == "__main__":
    main()
