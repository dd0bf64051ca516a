"""A GPT-2 through onnxruntime's own deployment pipeline: the export (tests/model_exports.py, and
the decoder with its KV cache, tests/decoder_exports.py) fused by onnxruntime's transformer
optimizer (`optimize_model(model_type="gpt2")`: test_quantized.ort_optimized), then
`quantize_dynamic` (7-bit weights where onnxruntime's integer GEMM saturates: ORT_EXACT_S8),
compiled by eqfuse and run beside onnxruntime on the same quantized file.

onnxruntime 1.32's optimizer writes no com.microsoft Attention for transformers' GPT-2 of today,
so quantize_dynamic writes no QAttention (eqfuse's QAttention is tested on the node itself in
test_quantized.py). Its GPT-2 fusions (FusionGptAttentionNoPast, FusionGptAttention and the
Megatron one) match the graph transformers wrote before its attention rewrite: a causal mask
sliced per layer from the `attn.bias` buffer, the scores divided (Div) by sqrt(head size), the
past and present stacked [2, batch, heads, P, head size] per layer. transformers 5 builds the
mask once for all layers (And, Where, Expand over attention_mask), scales the scores by a Mul
(eager attention) or the query and key by its square root each (sdpa, the default, with an
IsNaN guard after the softmax and a Reshape before the head transpose), and keeps the keys and
values of the cache apart. Tried without a fusion: the TorchScript and dynamo exports, without
and with the past, sdpa and eager attention, opt_level 0, 1, 2 and 99, only_onnxruntime, and
model_type "bert" (its FusionAttention wants separate Q, K and V MatMuls); the dynamo exports
with model_type "gpt2" stop in the optimizer itself (IndexError in Gpt2OnnxModel.postprocess,
which takes every Gemm to have a bias). test_the_optimizer_writes_no_attention_for_gpt2 holds
this: when a later onnxruntime or transformers fuses, it fails, and the QAttention it writes is
the case to add here.

What the optimizer does write: SkipLayerNormalization (the residual add folded into the next
norm, whose input_skip_bias_sum output feeds the next residual), FastGelu (bias and tanh GELU),
the Gemms as MatMul + Add; quantize_dynamic then writes DynamicQuantizeLinear + MatMulInteger for
each linear layer and a quantized Gather + DequantizeLinear for the embeddings. Bounds as in
test_quantized.py: the output within one quantization step of onnxruntime's, for a dynamic
model's float output the f32 rounding of its float tail, 1e-5 x max|output|; a contrib op alone
within the same bound of onnxruntime's kernel.
"""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
quant = pytest.importorskip("onnxruntime.quantization")
pytest.importorskip("transformers")

import decoder_exports as de  # noqa: E402
import model_exports as me  # noqa: E402
from test_quantized import MS, _literal, _ort, _quantize, ort_optimized  # noqa: E402

import eqfuse  # noqa: E402
from eqfuse.runtime.padded import PaddedFunction  # noqa: E402

F32T = onnx.TensorProto.FLOAT
H = 16  # the contrib ops' hidden size


def _contrib_model():
    """The com.microsoft ops onnxruntime's transformer optimizer writes for BERT and GPT-2, side by
    side over x, r [2, 5, 16]: SkipLayerNormalization with beta and bias and its sum output (the
    skip [5, 16], broadcast over the batch), without beta and bias, FastGelu with and without its
    bias, BiasGelu and Gelu."""
    h, nh = onnx.helper, onnx.numpy_helper
    rng = np.random.default_rng(5)
    inits = {k: rng.uniform(lo, hi, shape).astype(np.float32) for k, lo, hi, shape in
             (("g", 0.5, 1.5, H), ("be", -0.5, 0.5, H), ("bi", -0.5, 0.5, H), ("skip", -1, 1, (5, H)))}
    n = h.make_node
    nodes = [n("SkipLayerNormalization", ["x", "skip", "g", "be", "bi"], ["sln", "", "", "sum"], domain=MS,
               epsilon=1e-5, name="sln"),
             n("SkipLayerNormalization", ["x", "r", "g"], ["sln_plain"], domain=MS, epsilon=1e-3, name="sln_plain"),
             n("FastGelu", ["x", "bi"], ["fast_bias"], domain=MS), n("FastGelu", ["r"], ["fast"], domain=MS),
             n("BiasGelu", ["x", "bi"], ["bias_gelu"], domain=MS), n("Gelu", ["r"], ["gelu"], domain=MS)]
    g = h.make_graph(nodes, "contrib", [h.make_tensor_value_info(v, F32T, [2, 5, H]) for v in ("x", "r")],
                     [onnx.ValueInfoProto(name=o) for nd in nodes for o in nd.output if o],
                     [nh.from_array(v, k) for k, v in inits.items()])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)])


def test_the_transformer_optimizers_contrib_ops_match_onnxruntime(tmp_path):
    """Each output, in eqfuse's reference and its compiled C, within the f32 rounding of
    onnxruntime's kernel (1e-5 x max|output|); a value as large as the sum's would show a skip,
    bias or beta taken in the wrong place."""
    model = _contrib_model()
    f = tmp_path / "contrib.onnx"
    onnx.save(model, str(f))
    mod, ref = eqfuse.compile(str(f)), eqfuse.reference(str(f))
    from eqfuse.frontend.onnx_import import onnx_params

    outs = [o.name for o in model.graph.output]
    for seed in range(2):
        rng = np.random.default_rng(seed)
        feeds = {v: (3 * rng.standard_normal((2, 5, H))).astype(np.float32) for v in ("x", "r")}
        want = _ort(model, feeds)
        for got in (ref(**feeds, **onnx_params(str(f))), mod(**feeds)):
            for out, w, g in zip(outs, want, got):
                g = np.asarray(g)
                assert g.shape == w.shape, (out, g.shape, w.shape)
                assert np.max(np.abs(g - w)) <= 1e-5 * np.max(np.abs(w)), (out, seed, np.max(np.abs(g - w)))


@pytest.mark.parametrize("outputs, attrs, message", [
    (["y", "mean"], {"epsilon": 1e-5}, "output mean or inv_std_var (onnxruntime's CPU kernel computes neither)"),
    (["y"], {}, "a node without epsilon"),
])
def test_an_unsupported_skip_layernorm_is_refused_by_name(outputs, attrs, message, tmp_path, capsys):
    from eqfuse.cli.main import main

    h = onnx.helper
    g = np.ones(H, np.float32)
    node = h.make_node("SkipLayerNormalization", ["x", "x", "g"], outputs, domain=MS, name="sln", **attrs)
    graph = h.make_graph([node], "g", [h.make_tensor_value_info("x", F32T, [2, 5, H])],
                         [onnx.ValueInfoProto(name=o) for o in outputs], [onnx.numpy_helper.from_array(g, "g")])
    f = tmp_path / "sln.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)]), str(f))
    assert main(["opt", str(f)]) == 2
    err = capsys.readouterr().err
    assert message in err and "'sln'" in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2, err


def _rows_model():
    """quantize_dynamic's linear layer over batch x sequence rows as a decoder export writes it
    (GPT-2's Conv1D: x [batch, 5, 16] reshaped to [-1, 16]), batch a named dim: the reshape's rows
    are batch x 5, which DynamicQuantizeLinear, MatMulInteger, the scale multiply (by a scalar
    computed at run time) and the bias add take as they are."""
    h, nh = onnx.helper, onnx.numpy_helper
    rng = np.random.default_rng(2)
    inits = [nh.from_array(np.asarray(v), k) for k, v in (
        ("flat", np.array([-1, H], np.int64)), ("back", np.array([-1, 5, 8], np.int64)),
        ("w", rng.integers(-64, 65, (H, 8)).astype(np.int8)), ("ws", np.float32(0.01)), ("wz", np.int8(0)),
        ("bias", rng.uniform(-1, 1, 8).astype(np.float32)))]
    n = h.make_node
    nodes = [n("Reshape", ["x", "flat"], ["rows"]), n("DynamicQuantizeLinear", ["rows"], ["q", "qs", "qz"]),
             n("Mul", ["qs", "ws"], ["s"]), n("MatMulInteger", ["q", "w", "qz", "wz"], ["acc"], name="mmi"),
             n("Cast", ["acc"], ["accf"], to=F32T), n("Mul", ["accf", "s"], ["scaled"]),
             n("Add", ["scaled", "bias"], ["lin"]), n("Reshape", ["lin", "back"], ["y"])]
    g = h.make_graph(nodes, "rows", [h.make_tensor_value_info("x", F32T, ["batch", 5, H])],
                     [h.make_tensor_value_info("y", F32T, ["batch", 5, 8])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_a_dynamically_quantized_layer_over_batch_rows_compiles_with_the_batch_named(tmp_path):
    """The model imports with its batch unbound (one compile for every batch size) and matches
    onnxruntime within the f32 rounding of its float tail at batch 1 and 3."""
    model = _rows_model()
    f = tmp_path / "rows.onnx"
    onnx.save(model, str(f))
    mod = eqfuse.compile(str(f))
    assert not isinstance(mod.default, PaddedFunction), mod.report  # (not bound per call: imported as it is)
    for b in (1, 3):
        x = np.random.default_rng(b).standard_normal((b, 5, H)).astype(np.float32)
        (want,) = _literal(model, {"x": x})
        got = np.asarray(mod(x=x))
        assert got.shape == want.shape and np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want)), b


def test_a_model_that_needs_its_batch_bound_compiles_it_per_value(tmp_path):
    """A model whose import needs every named dim bound, the batch too (here a softmax over the
    flattened batch x 4): the batch is compiled per value, and the reason names the node and its
    shape. (It once built a model bound per call whose every bucket was again one: a recursion
    that started threads until none could start; then it was refused.)"""
    h = onnx.helper
    nodes = [h.make_node("Reshape", ["x", "s"], ["f"]), h.make_node("Softmax", ["f"], ["y"], axis=0, name="sm")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", F32T, ["batch", 4])], [onnx.ValueInfoProto(name="y")],
                     [onnx.numpy_helper.from_array(np.array([-1], np.int64), "s")])
    f = tmp_path / "flat.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), str(f))
    mod = eqfuse.compile(str(f))
    for b in (2, 3):
        x = np.random.default_rng(b).standard_normal((b, 4)).astype(np.float32)
        e = np.exp(x.reshape(-1) - x.max())
        np.testing.assert_allclose(mod(x), e / e.sum(), rtol=1e-5)
    assert re.search(r"Softmax of a tensor of shape \[batch\*4\].*'sm'", mod.default.padding["batch"])
    assert sorted(mod.default.modules) == [(2,), (3,)]


# ------------------------------------------------------------------ the GPT-2 exports through the pipeline

def _quantized_gpt2(tmp_path, past: bool):
    """(the quantized file, its op counts) of the GPT-2 export without a past (GPT2Model, its
    hidden states) or the decoder with its cache (GPT2LMHeadModel, logits and presents)."""
    f32 = (ort_optimized(de.export_gpt2("torchscript"), "gpt2-decoder-torchscript") if past else
           ort_optimized(me.export("gpt2", "torchscript"), "gpt2-torchscript"))
    tmp_path.mkdir(exist_ok=True)
    q = tmp_path / "q.onnx"
    _quantize("gpt2-ort", "dynamic", f32, q)
    return q, collections.Counter(n.op_type for n in onnx.load(str(q)).graph.node)


# per layer: Q, K and V's projection, the attention's output projection and the MLP's two
LINEARS = 4 * de.LAYERS


@pytest.mark.heavy  # (the optimizer and the quantizer on two exports: a few seconds)
def test_the_optimizer_writes_no_attention_for_gpt2(tmp_path):
    """The module docstring's finding, and what the pipeline writes instead: one integer GEMM per
    linear layer (and the LM head's), a SkipLayerNormalization per residual add, a FastGelu per
    layer; eqfuse's reference of the file without a past matches onnxruntime (the compiled C:
    test_quantized.py's gpt2-ort case and the decoder test below)."""
    from eqfuse.frontend.onnx_import import onnx_params

    for past in (True, False):
        q, ops = _quantized_gpt2(tmp_path / f"past{past}", past)
        assert ops["Attention"] == ops["QAttention"] == 0, f"onnxruntime now fuses GPT-2's attention: test it here {ops}"
        assert ops["MatMulInteger"] == ops["DynamicQuantizeLinear"] == LINEARS + past, ops
        assert (ops["SkipLayerNormalization"], ops["FastGelu"], ops["Softmax"]) == (2 * de.LAYERS, de.LAYERS, de.LAYERS)

    ref, model = eqfuse.reference(str(q)), onnx.load(str(q))
    feeds = me.inputs("gpt2")
    (want,) = _literal(model, feeds)
    got = np.asarray(ref(**feeds, **onnx_params(str(q))))
    assert got.shape == want.shape and np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


@pytest.mark.extended  # (the decoder's buckets and its decode step: some minutes of compiles with the cache cold)
def test_the_quantized_decoder_steps_and_generates_as_onnxruntime(tmp_path):
    """The decoder (onnxruntime-optimized, dynamically quantized, batch and lengths named): eqfuse's
    prefill of 8 tokens and 6 decode steps over its cache in place against onnxruntime's at the
    same capacity, fed the same tokens: logits and the cache's live rows within the bound of
    a dynamic model's output (1e-5 x max|output|); then eqfuse.generate's greedy ids are
    onnxruntime's greedy decoding of the same file (test_generate.ort_greedy)."""
    from test_generate import ort_greedy, ort_run

    from eqfuse.generation import (
        PREFILL_MIN,
        Decoder,
        capacity_for,
        load_decoder,
        step_maker,
    )

    q, _ = _quantized_gpt2(tmp_path, True)
    mod, sig = load_decoder(q)
    B, S, steps = 2, 8, 6
    cap = capacity_for(S + steps)
    ours = Decoder(sig, lambda feeds: mod(**feeds), cap, step_maker(mod, sig))
    theirs = Decoder(sig, ort_run(q), cap)
    ids = np.random.default_rng(0).integers(0, de.VOCAB, (B, S)).astype(np.int64)
    a, b = ours.prefill(ids, PREFILL_MIN), theirs.prefill(ids)
    for k in range(steps + 1):
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b)), f"step {k}"
        n = S + k
        for mine, full in zip(ours.cache, theirs.cache):
            live, want = mine[:, :, :n], full[:, :, :n]
            assert np.max(np.abs(live - want)) <= 1e-5 * np.max(np.abs(want)), f"step {k}"
        if k < steps:
            tok = b.argmax(-1)[:, None].astype(np.int64)
            a, b = ours.step(tok), theirs.step(tok)
    new = 10
    np.testing.assert_array_equal(eqfuse.generate(mod, ids, max_new_tokens=new),
                                  ort_greedy(q, ids, new, capacity_for(S + new)))
