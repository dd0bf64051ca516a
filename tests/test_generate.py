"""eqfuse.generate and the decoder exports it runs (tests/decoder_exports.py): a GPT-2 and a
Llama exported with their KV cache load (concat along the named past dim), their prefill and 20
decode steps (over the cache in place, its length a run-time value) match onnxruntime on the same
file, and generation matches transformers. The Llama cases are in the extended tier."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import skip_unless_installed

pytest.importorskip("torch")
skip_unless_installed("transformers")
pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

# Each test exports a decoder or compiles one (both cached per session): in the whole suite, not the fast tier.
pytestmark = pytest.mark.heavy

import decoder_exports as de  # noqa: E402

import eqfuse  # noqa: E402
from eqfuse.generation import (  # noqa: E402
    PREFILL_MIN,
    RUNTIME_CHUNK,
    Decoder,
    capacity_for,
    chunk_plan,
    held_chunks,
    live_capacity,
    load_decoder,
    module_signature,
    onnx_signature,
    run_batch,
    runtime_chunks,
    step_maker,
)

B, S, STEPS = 2, 8, 20
NEW = STEPS + 1  # a prefill and 20 decode steps make 21 tokens
CAPACITY = capacity_for(S + NEW - 1)  # 32: every test here runs the same two bindings
MODELS = ["gpt2"] + [pytest.param(m, marks=pytest.mark.extended) for m in ("llama", "qwen2", "phi", "phi3")]
# (Phi-3's greedy generation in the default run: its chunk step's value rows are a view of the
# fused projection, which the memory plan once let a kernel overwrite before the append read them.
# GPT-2's in the extended tier, the suite's time: the default run checks its decode steps against
# onnxruntime, and Gemma 3's, BLOOM's and Phi-3's greedy ids against transformers')
GREEDY_MODELS = ["phi3"] + [pytest.param(m, marks=pytest.mark.extended) for m in ("gpt2", "llama", "qwen2", "phi")]


def compiled(exporter: str, model: str = "gpt2"):
    """(path, Module) of the export, compiled once per test session (as eqfuse.generate compiles
    a path: the tests share its bindings)."""
    path = de.export_decoder(model, exporter)
    return path, load_decoder(path)[0]


def ort_run(path):
    """onnxruntime on the same file, fed by the names eqfuse gives the inputs."""
    from eqfuse.frontend.onnx_inputs import input_shapes

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    onnx_name = {p: o for o, p, _ in input_shapes(str(path))}
    return lambda feeds: sess.run(None, {onnx_name[k]: v for k, v in feeds.items()})


def prompt(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, de.VOCAB, (B, S)).astype(np.int64)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("exporter", ["torchscript", pytest.param("dynamo", marks=pytest.mark.extended)])
def test_decode_steps_match_onnxruntime(exporter, model):  # (the dynamo export in the extended tier: the suite's time)
    """Prefill and 20 decode steps: eqfuse's decode step over its cache in place (compiled once,
    live="past") against onnxruntime on the cache at a fixed capacity (masked rows) and on the
    cache at its live length, as the export is meant to run (an empty past at the prefill). The
    cache's spare rows hold NaN from the prefill on: a step that read past the live length
    would turn its logits to NaN. Each step returns the cache buffers themselves as presents
    (np.shares_memory): it appends one row, it copies no past."""
    path, mod = compiled(exporter, model)
    sig = onnx_signature(path)
    assert sig.max_positions == (de.POSITIONS if model == "gpt2" else None)  # (rotary positions have no table)
    heads = de.MODELS[model][1] if model != "gpt2" else de.HEADS
    ours = Decoder(sig, lambda feeds: mod(**feeds), CAPACITY, step_maker(mod, sig))
    theirs = Decoder(sig, ort_run(path), CAPACITY)
    live = ort_run(path)

    ids = prompt()
    a, b = ours.prefill(ids, PREFILL_MIN), theirs.prefill(ids)  # (ours padded to its bucket, as generate runs it)
    assert ours.live_step is not None and ours.cache[0].shape == (B, heads, CAPACITY + 1, de.HEAD)
    for c in ours.cache:
        c[:, :, S:] = np.nan
    buffers = list(ours.cache)
    run_step = ours.live_step
    presents = []
    ours.live_step = lambda feeds: presents.append(run_step(feeds)) or presents[-1]
    past = [np.zeros((B, heads, 0, de.HEAD), np.float32) for _ in de.PAST_NAMES]
    feeds = {"input_ids": ids, "attention_mask": np.ones((B, S), np.int64),
             "position_ids": np.tile(np.arange(S), (B, 1))}
    outs = live({**feeds, **{n: p for (n, _), p in zip(sig.pasts, past)}})
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(a, outs[0][:, -1], atol=1e-4, rtol=1e-4)
    past = outs[1:]
    for step in range(STEPS):
        tok = b.argmax(-1)[:, None].astype(np.int64)
        a, b = ours.step(tok), theirs.step(tok)
        n = S + step + 1
        outs = live({"input_ids": tok, "attention_mask": np.ones((B, n), np.int64),
                     "position_ids": np.full((B, 1), n - 1, np.int64), **{k: p for (k, _), p in zip(sig.pasts, past)}})
        past = outs[1:]
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4, err_msg=f"step {step}")
        np.testing.assert_allclose(a, outs[0][:, -1], atol=1e-4, rtol=1e-4, err_msg=f"step {step}")
        for mine, full, buf, present in zip(ours.cache, past, buffers, presents[-1][1:]):
            assert mine is buf and present is buf  # the step's present is the cache buffer, appended in place
            np.testing.assert_allclose(mine[:, :, :n], full, atol=1e-4, rtol=1e-4)
            assert np.isnan(mine[:, :, n:]).all()  # the rows past the live length are untouched


def test_no_decode_step_kernel_loops_over_the_capacity():
    """Every kernel of the decode step (at the batch and capacity of the test above: its compile
    reused) with an axis of the cache's C + 1 rows takes the live length at run time, so a step's
    cost does not grow with the reserved capacity: the appends, the attentions over the live keys,
    and the attention mask's cast from the driver's [B, C + 1] integers, over its live positions
    (its gather by the export's indices 0 .. B x (C + 1) - 1 folds to a view: no index kernel)."""
    path, mod = compiled("torchscript")
    sig = onnx_signature(path)
    step = mod.default.live_module({"batch": B, "sequence": 1, "past": CAPACITY, "total": CAPACITY + 1}, "past")
    plans = [p for p in step.default.compiled({}).plans if p.kind != "view"]
    over = [p for p in plans if CAPACITY + 1 in p.out_shape or CAPACITY in p.out_shape]
    assert over and all(p.live is not None for p in over), [(p.name, p.out_shape) for p in over if p.live is None]
    kinds = sorted({p.live.what for p in plans if p.live is not None})
    assert kinds == ["append", "keys", "rows"], kinds
    mask = [p for p in plans if p.live is not None and p.live.what == "rows"]
    assert [p.out_shape for p in mask] == [(B, CAPACITY + 1)]  # the mask's cast, once for every layer
    assert not [p for p in plans if p.kind == "index" and sig.mask in [step.default.compiled({}).kgraph.nodes[a].name
                                                                       for a in p.args]]


def test_a_step_is_compiled_with_its_weights_packed():
    """live_module packs the bound weights' panels in the thread that compiles the step (the
    chunk and decode steps compile on two threads: one packs while the other compiles), so the
    first call finds every one of them ready."""
    path, mod = compiled("torchscript")
    step = mod.default.live_module({"batch": 1, "sequence": 1, "past": CAPACITY, "total": CAPACITY + 1}, "past")
    runner = step.default.compiled({}).runner
    assert runner.mem.prepacks and {s for s, _ in runner.mem.prepacks} <= set(runner._packed)


def hf_generate(ids: np.ndarray, new: int, model: str = "gpt2", mask: np.ndarray | None = None):
    """transformers' greedy generation from the same weights: (ids, the logits of each step)."""
    import torch

    model = de.MODELS[model][0]()
    mask = np.ones(ids.shape, np.int64) if mask is None else mask
    with torch.no_grad():
        out = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                             do_sample=False, max_new_tokens=new, min_new_tokens=0, output_logits=True,
                             return_dict_in_generate=True, eos_token_id=de.EOS, pad_token_id=de.EOS)
    return out.sequences.numpy(), [t.numpy() for t in out.logits]


def assert_greedy_matches_transformers(ours: np.ndarray, ids: np.ndarray, new: int, model: str = "gpt2",
                                       mask: np.ndarray | None = None) -> None:
    """Token for token; where a token differs, only at a step whose top two logits are closer
    than 1e-4 (a tie f32 rounding may break either way), and the row is not compared after it."""
    theirs, logits = hf_generate(ids, new, model, mask)
    b, s = ids.shape
    assert ours.shape[0] == b and ours.shape[1] >= s + 1
    np.testing.assert_array_equal(ours[:, :s], ids)
    for r in range(b):
        for j in range(s, max(ours.shape[1], theirs.shape[1])):
            a = ours[r, j] if j < ours.shape[1] else de.EOS  # a shorter result is padded with eos
            t = theirs[r, j] if j < theirs.shape[1] else de.EOS
            if a != t:
                top = np.sort(logits[j - s][r])[-2:]
                assert top[1] - top[0] < 1e-4, f"row {r} token {j}: {a} vs transformers' {t}"
                break


@pytest.mark.parametrize("model", GREEDY_MODELS)
def test_greedy_matches_transformers(model):
    """eqfuse.generate's greedy ids are transformers' (assert_greedy_matches_transformers)."""
    path, mod = compiled("torchscript", model)
    ids = prompt(1)
    assert_greedy_matches_transformers(eqfuse.generate(mod, ids, max_new_tokens=NEW, eos_token_id=de.EOS), ids,
                                       NEW, model)


# The TorchScript exporter fails on Cohere's cache (its own AssertionError: "All tensors must have
# the same rank"), so Cohere is exported by dynamo.
FAMILY_EXPORTERS = {f: "dynamo" if f == "cohere" else "torchscript" for f in de.FAMILIES}


@pytest.mark.extended  # (thirteen exports and compiles: the families of the default run cover their ops)
@pytest.mark.parametrize("model", sorted(de.FAMILIES))
def test_decoder_families_generate_as_transformers(model):
    """More decoder families a user brings (tests/decoder_exports.py's FAMILIES: partial and
    interleaved rotary, multi-query, soft-capping, learned and sinusoidal positions, query and
    key norms), exported with their cache: eqfuse.generate's greedy ids are transformers'."""
    path = de.export_decoder(model, FAMILY_EXPORTERS[model])
    ids = prompt(2)
    assert_greedy_matches_transformers(eqfuse.generate(str(path), ids, max_new_tokens=NEW, eos_token_id=de.EOS),
                                       ids, NEW, model)


@pytest.mark.heavy
@pytest.mark.parametrize("model, exporter", [("gemma3", "torchscript")] + [
    pytest.param(m, e, marks=pytest.mark.extended) for m, e in (("gemma3", "dynamo"), ("mistral", "torchscript"))])
def test_a_sliding_window_model_generates_past_its_window(model, exporter):
    """Gemma 3's sliding layers keep the last sliding_window - 1 rows of their cache (the export
    slices the past before appending, and the present after); the steps over the cache in place
    keep it whole instead, and the band of the window is the export's mask computed from the
    live length (eqfuse.ir.live.causal_from_length); the dynamo export's count of the rows the
    window drops, Max(0, past - k), is imported as 0 (onnx_inputs.window_slices). Generation
    past the window gives transformers' ids: the decode steps, and a prompt longer than the
    window in chunks. (Mistral: a window in every layer.)"""
    _, mod = compiled(exporter, model)
    sig = module_signature(mod)
    window = de.MODELS[model][0]().config.sliding_window
    assert sig.window_rows == window - 1
    capacity = live_capacity(sig, S + NEW - 1)
    assert capacity > de.SLIDING_WINDOW  # (2048 rows by default: no position table)
    ids = prompt(3)
    new = window + 8 - S  # the last 8 tokens see a band of the keys
    assert_greedy_matches_transformers(eqfuse.generate(mod, ids, max_new_tokens=new), ids, new, model)
    long = np.random.default_rng(4).integers(0, de.VOCAB, (B, window + 9)).astype(np.int64)
    assert_greedy_matches_transformers(eqfuse.generate(mod, long, max_new_tokens=NEW), long, NEW, model)
    assert runtime_chunks(mod, sig, B, capacity)  # (the long prompt as one chunk of its 41 rows: the band within it)
    # the band across chunks: the long prompt in run-time chunks of at most 16 rows gives the
    # logits of the chunks compiled at 16 rows (the path checked against transformers before)
    ours = Decoder(sig, None, capacity, step_maker(mod, sig)).prefill_chunks(long, 16, runtime=True)
    compiled_rows = Decoder(sig, None, capacity, step_maker(mod, sig)).prefill_chunks(long, 16)
    np.testing.assert_allclose(ours, compiled_rows, atol=1e-4, rtol=1e-4)


def left_padded(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, attention_mask) [B, S]: prompts of S, S - 3 (and S - 7, ...) tokens padded on the
    left with the pad token, as transformers' tokenizers pad a batch for generation."""
    ids = prompt(seed)
    mask = np.ones_like(ids)
    for r in range(1, B):
        mask[r, :min(4 * r - 1, S - 1)] = 0
    return np.where(mask == 1, ids, de.EOS), mask


@pytest.mark.parametrize("model", ["gpt2"] + [pytest.param(m, marks=pytest.mark.extended) for m in ("phi3", "llama")])
def test_a_left_padded_batch_matches_transformers(model):
    """Prompts of different lengths in one batch, padded on the left, with their attention_mask:
    greedy ids are transformers' on the same batch and mask, and each row's new tokens are its
    prompt's alone. (Positions count real tokens only: GPT-2's position table sees them, where
    rotary embeddings, relative, would not see a row's positions all shifted.)"""
    _, mod = compiled("torchscript", model)
    ids, mask = left_padded(8)
    ours = eqfuse.generate(mod, ids, max_new_tokens=NEW, attention_mask=mask)
    assert_greedy_matches_transformers(ours, ids, NEW, model, mask)
    alone = eqfuse.generate(mod, ids[1:2, mask[1] == 1], max_new_tokens=NEW)
    np.testing.assert_array_equal(ours[1, S:], alone[0, -NEW:])
    np.testing.assert_array_equal(eqfuse.generate(mod, ids, max_new_tokens=NEW, attention_mask=np.ones_like(ids)),
                                  eqfuse.generate(mod, ids, max_new_tokens=NEW))


def test_a_left_padded_prompt_fed_by_steps_matches_onnxruntime():
    """The other two ways a prompt reaches the cache, with an attention_mask: a token at a time
    through the decode step over the cache in place (a loaded Module holding no prefill for the
    prompt's length: Decoder.prefill_by_steps), and the whole prompt at once into a cache of fixed
    capacity, here onnxruntime's (Decoder.prefill): the same logits, and the same logits at each
    of 4 greedy steps after."""
    path, mod = compiled("torchscript")
    sig = module_signature(mod)
    ids, mask = left_padded(9)
    ours = Decoder(sig, lambda f: mod(**f), CAPACITY, step_maker(mod, sig))
    theirs = Decoder(onnx_signature(path), ort_run(path), CAPACITY)
    a, b = ours.prefill_by_steps(ids, mask), theirs.prefill(ids, None, mask)
    for _ in range(4):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
        tok = b.argmax(-1)[:, None].astype(np.int64)
        a, b = ours.step(tok), theirs.step(tok)
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def test_generate_from_a_path_and_its_limits():
    """A path compiles (once per file) and runs as the Module; a position past the model's 128
    is refused before any compile, with the arithmetic in the message."""
    path, mod = compiled("torchscript")
    ids = prompt(2)
    np.testing.assert_array_equal(eqfuse.generate(str(path), ids, max_new_tokens=NEW),
                                  eqfuse.generate(mod, ids, max_new_tokens=NEW))
    with pytest.raises(eqfuse.ArgumentError, match="past the model's maximum of 128 positions"):
        eqfuse.generate(str(path), ids, max_new_tokens=de.POSITIONS - S + 2)
    for bad, message in [(np.ones((B, S + 1), np.int64), r"input_ids' shape \[2, 8\], got int64 \[2, 9\]"),
                         (np.full((B, S), 2), r"0 \(a padding token\) and 1 \(a real token\) only"),
                         (np.ones((B, S), np.float32), "must be integers or booleans"),
                         (np.zeros((B, S), bool), "row 0 masks every token of its prompt")]:
        with pytest.raises(eqfuse.ArgumentError, match=message):
            eqfuse.generate(mod, ids, max_new_tokens=2, attention_mask=bad)


def test_sampling():
    """The same seed gives the same ids, another seed others; top_k=1 is greedy; eos_token_id
    ends a sequence (its later tokens are eos) and generation stops when all have ended; no new
    tokens is the prompt."""
    _, mod = compiled("torchscript")
    ids = prompt(3)
    greedy = eqfuse.generate(mod, ids, max_new_tokens=NEW)
    assert greedy.shape == (B, S + NEW)
    one = eqfuse.generate(mod, ids, max_new_tokens=NEW, do_sample=True, seed=7, temperature=1.5, top_p=0.9)
    again = eqfuse.generate(mod, ids, max_new_tokens=NEW, do_sample=True, seed=7, temperature=1.5, top_p=0.9)
    other = eqfuse.generate(mod, ids, max_new_tokens=NEW, do_sample=True, seed=8, temperature=1.5, top_p=0.9)
    np.testing.assert_array_equal(one, again)
    assert (one != other).any()
    assert (one != greedy).any()
    np.testing.assert_array_equal(eqfuse.generate(mod, ids, max_new_tokens=NEW, do_sample=True, top_k=1, seed=3),
                                  greedy)
    eos = int(greedy[0, S + 3])
    ended = eqfuse.generate(mod, ids, max_new_tokens=NEW, eos_token_id=eos)
    first = S + int(np.argmax(greedy[0, S:] == eos))  # row 0 ends at its first eos (at S + 3 or before)
    assert (ended[0, first:] == eos).all()
    np.testing.assert_array_equal(ended[0, :first], greedy[0, :first])
    both = eqfuse.generate(mod, np.repeat(ids[:1], B, axis=0), max_new_tokens=NEW, eos_token_id=eos)
    assert both.shape == (B, first + 1)  # every row ended: no token after the last eos
    np.testing.assert_array_equal(eqfuse.generate(mod, ids[0], max_new_tokens=0), ids[:1])  # [S] is [1, S]


@pytest.mark.extended  # (the dynamo exports: some 25 s each when the export cache is cold)
@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_greedy_from_a_dynamo_export_matches_transformers(model):
    """The dynamo exporter combines the causal mask (folded at the capacity) with the padding
    mask before the attentions read it: the chunk step computes the causal part from the live
    length (eqfuse.ir.live.causal_from_length), so the prompt runs in chunks over the cache in
    place, as a TorchScript export's does, with transformers' ids, a left-padded batch too."""
    path = de.export_decoder(model, "dynamo")
    ids = prompt(1)
    assert_greedy_matches_transformers(eqfuse.generate(str(path), ids, max_new_tokens=NEW, eos_token_id=de.EOS), ids,
                                       NEW, model)
    mod, sig = load_decoder(path)
    assert runtime_chunks(mod, sig, B, live_capacity(sig, S + NEW - 1))  # (its chunk step held, at run time)
    padded, mask = left_padded(8)
    assert_greedy_matches_transformers(eqfuse.generate(str(path), padded, max_new_tokens=NEW, eos_token_id=de.EOS,
                                                       attention_mask=mask), padded, NEW, model, mask)


@pytest.mark.extended  # (a dynamo export)
def test_greedy_from_an_opset_23_export_matches_transformers():
    """At opset 23 the dynamo exporter writes a Llama's attention, RMSNorms and rotary embeddings
    as ONNX's Attention, RMSNormalization and RotaryEmbedding ops: imported as the ops the other
    exports spell them with, the decoder generates in chunks over its cache in place, as those do."""
    import onnx

    path = de.export_decoder("llama", "dynamo-opset23")
    assert {"Attention", "RMSNormalization", "RotaryEmbedding"} <= {n.op_type for n in onnx.load(str(path)).graph.node}
    ids = prompt(2)
    assert_greedy_matches_transformers(eqfuse.generate(str(path), ids, max_new_tokens=NEW, eos_token_id=de.EOS), ids,
                                       NEW, "llama")
    mod, sig = load_decoder(path)
    assert runtime_chunks(mod, sig, B, live_capacity(sig, S + NEW - 1))  # (its chunk step held, at run time)


def test_a_refused_chunk_step_prefills_whole_and_is_not_tried_again(monkeypatch):
    """A chunk step the live lowering refuses (ChunkRefused: as for a dynamo export's run-time
    mask, here refused for every chunk) leaves generate to prefill the prompt whole, with the same
    tokens; the module remembers the refusal, so a second generation builds no chunk step."""
    import eqfuse.backend.live as live
    import eqfuse.pipeline as pipeline
    from eqfuse.errors import ChunkRefused

    causal = live._causal

    def refuse(kg, p, length):
        if p.live.new > 1:
            raise ChunkRefused("live=: refused for the test")
        causal(kg, p, length)
    monkeypatch.setattr(live, "_causal", refuse)
    optimized = []
    optimize = pipeline.optimize
    monkeypatch.setattr(pipeline, "optimize", lambda *a, **k: optimized.append(1) or optimize(*a, **k))
    path, ids = de.export_gpt2("torchscript"), prompt(2)
    mod = eqfuse.compile(path)
    ours = eqfuse.generate(mod, ids, max_new_tokens=NEW, eos_token_id=de.EOS)
    assert any(len(dict(key)) and live_len for key, live_len, _ in mod.default.live_modules)  # the decode step
    assert mod.default._refused  # the chunk step's key, refused
    first = len(optimized)
    again = eqfuse.generate(mod, ids, max_new_tokens=NEW, eos_token_id=de.EOS)
    assert len(optimized) == first  # neither the chunk step tried again nor anything else compiled
    np.testing.assert_array_equal(again, ours)
    assert_greedy_matches_transformers(ours, ids, NEW)
    padded, mask = left_padded(8)  # (the whole prompt's prefill with padding on the left)
    assert_greedy_matches_transformers(eqfuse.generate(mod, padded, max_new_tokens=NEW, eos_token_id=de.EOS,
                                                       attention_mask=mask), padded, NEW, mask=mask)


def count_compiles(monkeypatch) -> dict[str, int]:
    """Counts, from now on, the C builds and the optimizer runs of every compile."""
    import eqfuse.pipeline as pipeline

    counts = {"build": 0, "optimize": 0}

    def counting(name, fn):
        def wrapped(*a, **k):
            counts[name] += 1
            return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(pipeline.cbuild, "build", counting("build", pipeline.cbuild.build))
    monkeypatch.setattr(pipeline, "optimize", counting("optimize", pipeline.optimize))
    return counts


def test_no_compile_after_the_first_generation(monkeypatch):
    """C builds and optimizer runs of a fresh Module compiled with batch buckets: the first
    prefill compiles the chunk step with its rows at run time (chunk_plan: RUNTIME_CHUNK within
    the capacity, 127 rows) and the decode step, both over the cache at the model's 128 positions
    less one (live_capacity: a step's 128 keys), their lengths at run time and the
    batch on its buckets; the 20 decode steps compile nothing. Then prompts of 5, 11, 16, 40 and
    100 tokens at batch sizes 2, 1, 3, 2 and 1 compile nothing: each prompt is one chunk of its
    own rows (Decoder.prefill_chunks, runtime=True), each batch on the one bucket of 2 (1 padded
    to 2, its cache rows appended in a copy and copied back; 3 as a chunk of 2 appending in place
    and 1 padded); and each generation is transformers' greedy one."""
    counts = count_compiles(monkeypatch)
    path = de.export_gpt2("torchscript")
    mod = eqfuse.compile(path, buckets={"batch": [2]})
    sig = module_signature(mod)
    cap = live_capacity(sig, S + NEW - 1)
    assert cap == de.POSITIONS - 1  # (the position table, read from the file the Module was compiled from)
    assert runtime_chunks(mod, sig, B, cap)
    assert chunk_plan(mod, sig, S, B, cap) == min(RUNTIME_CHUNK, cap)  # (nothing compiled yet)
    dec = Decoder(sig, lambda feeds: mod(**feeds), cap, step_maker(mod, sig))
    seen = []
    logits = dec.prefill_chunks(prompt(), chunk_plan(mod, sig, S, B, cap), runtime=True)
    rows = chunk_plan(mod, sig, S, B, cap)  # (the step compiled: its rows)
    assert rows == cap and runtime_chunks(mod, sig, B, cap)
    seen.append(dict(counts))
    for _ in range(STEPS):
        logits = dec.step(logits.argmax(-1)[:, None].astype(np.int64))
        seen.append(dict(counts))
    assert seen[0]["optimize"] >= 2 and seen[0]["build"] >= 2  # the chunk step and the decode step
    assert dec.live_step is not None
    assert seen[-1] == seen[0]  # the 20 decode steps ran without the compiler
    for b, s, new in ((2, 5, 13), (1, 11, 13), (3, 16, 13), (2, 40, 6), (1, 100, 6)):
        assert chunk_plan(mod, sig, s, b, cap) == rows
        ids = np.random.default_rng(s).integers(0, de.VOCAB, (b, s)).astype(np.int64)
        ours = eqfuse.generate(mod, ids, max_new_tokens=new, eos_token_id=de.EOS)
        assert counts == seen[0], f"batch {b}, {s} tokens: {counts} after the first generation's {seen[0]}"
        assert_greedy_matches_transformers(ours, ids, new)
    print(f"first prefill and step: {seen[0]}; decode steps 1-{STEPS} and 5 generations: none")


def test_chunked_prefill_matches_onnxruntime():
    """A prompt of 37 tokens prefilled as chunks of 16, 16 and 5 (padded to 16) over the cache in
    place, every row not yet live NaN before each chunk (a chunk reads only the rows before it
    and, causally, its own): each chunk's logits at its last real token (the one row a chunk
    computes) and the cache's rows at every prompt position are onnxruntime's on the whole prompt at the f32 tolerance of the other decoder tests here
    (test_decode_steps_match_onnxruntime: rtol and atol 1e-4)."""
    path, mod = compiled("torchscript")
    sig = module_signature(mod)
    s = 37
    ids = np.random.default_rng(7).integers(0, de.VOCAB, (B, s)).astype(np.int64)
    dec = Decoder(sig, None, de.POSITIONS, step_maker(mod, sig))
    chunk, seen = dec.make_step(B, de.POSITIONS, PREFILL_MIN), []

    def spy(feeds):
        t = int(feeds["past_length"][0])
        for n, _ in sig.pasts:
            feeds[n][:, :, t:] = np.nan
        seen.append(out := chunk(feeds))
        return out

    spy.pick = chunk.pick  # (the input that picks the row of logits the chunk computes)
    step = dec.make_step
    dec.make_step = lambda b, c, rows=1, runtime=False: spy if rows > 1 else step(b, c)
    last = dec.prefill_chunks(ids, PREFILL_MIN)  # (a chunk step of 16 rows compiled as such)
    assert len(seen) == 3
    # each chunk's logits: its last real token's only (eqfuse.ir.live.pick_row), prompt rows 15, 31, 36
    rows = [min((k + 1) * PREFILL_MIN, s) - 1 for k in range(len(seen))]
    assert all(o[0].shape[1] == 1 for o in seen)
    assert_chunks_match_onnxruntime(path, sig, ids, [o[0] for o in seen], rows, last, dec.cache)


def assert_chunks_match_onnxruntime(path, sig, ids, logits: list, rows: list[int], last, cache) -> None:
    """Each chunk's logits (at prompt rows `rows`), the last one prefill_chunks returned, and the
    cache's rows at every prompt position are onnxruntime's on the whole prompt at the f32
    tolerance of the decoder tests here (rtol and atol 1e-4)."""
    s = ids.shape[1]
    past = [np.zeros((B, h, 1, d), np.float32) for _, (_, h, _, d) in sig.pasts]
    mask = np.ones((B, 1 + s), np.int64)
    mask[:, 0] = 0  # (one masked past row: the export takes no empty past)
    feeds = {sig.ids: ids, sig.mask: mask, sig.positions: np.repeat(np.arange(s)[None], B, 0)}
    feeds.update({n: p for (n, _), p in zip(sig.pasts, past)})
    ref = ort_run(path)(feeds)
    ours = np.concatenate(logits, axis=1)
    np.testing.assert_allclose(ours, ref[0][:, rows], atol=1e-4, rtol=1e-4)
    np.testing.assert_array_equal(last, ours[:, -1])
    for c, r in zip(cache, ref[1:]):  # the cache's rows: the prompt's keys and values
        np.testing.assert_allclose(c[:, :, :s], r[:, :, 1:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("model", ["gpt2", pytest.param("llama", marks=pytest.mark.extended)])
def test_chunks_with_their_rows_at_run_time_match_onnxruntime(model):
    """The chunk step with its rows at run time (one step of at most 16 rows: 15, as 16 is the
    model's head size too) runs prompts of 37, 16, 15 and 5 tokens as chunks of their own rows
    (15, 15 and 7; 15 and 1; 15; 5), each computing its live rows only: before each chunk every
    cache row from the live length on is NaN, and the chunk's input rows past its live ones hold
    other tokens (a kernel that read them into a live result would change it). Each chunk's
    logits at its last token and the cache's rows at every prompt position are onnxruntime's on
    the whole prompt, at the f32 tolerance of the other decoder tests here (rtol and atol 1e-4)."""
    path, mod = compiled("torchscript", model)
    sig = module_signature(mod)
    rng = np.random.default_rng(3)
    for s in (37, 16, 15, 5):
        ids = rng.integers(0, de.VOCAB, (B, s)).astype(np.int64)
        dec = Decoder(sig, None, de.POSITIONS, step_maker(mod, sig))
        chunk, seen = dec.make_step(B, de.POSITIONS, 16, runtime=True), []
        assert (chunk.rows, chunk.new) == (15, f"{sig.shapes[sig.ids][1]}_length")

        def spy(feeds):
            t, m = int(feeds["past_length"][0]), int(feeds[chunk.new][0])
            for n, _ in sig.pasts:
                feeds[n][:, :, t:] = np.nan
            feeds[sig.ids][:, m:] = rng.integers(0, de.VOCAB, (B, chunk.rows - m))
            seen.append((m, out := chunk(feeds)))
            return out

        spy.pick, spy.new, spy.rows = chunk.pick, chunk.new, chunk.rows
        step = dec.make_step
        dec.make_step = lambda b, c, rows=1, runtime=False: spy if rows > 1 else step(b, c)
        last = dec.prefill_chunks(ids, 16, runtime=True)
        assert [m for m, _ in seen] == [min(15, s - t) for t in range(0, s, 15)]
        rows = list(np.cumsum([m for m, _ in seen]) - 1)
        assert_chunks_match_onnxruntime(path, sig, ids, [o[0] for _, o in seen], rows, last, dec.cache)
    # a chunk whose live rows would pass the buffers, or more rows than the step has: refused
    feeds = sig.feeds(np.zeros((B, chunk.rows), np.int64), dec.mask, np.zeros((B, chunk.rows), np.int64), dec.cache,
                      np.array([de.POSITIONS - 3], np.int64))
    feeds[chunk.pick] = np.array([0], np.int64)
    for m in (10, chunk.rows + 1):
        feeds[chunk.new] = np.array([m], np.int64)
        feeds[sig.pasts[0][0]] = dec.cache[0]
        with pytest.raises(eqfuse.ArgumentError, match="pass its buffers: at most 15 new rows"):
            chunk(feeds)


@pytest.mark.extended  # (the bf16 cache's kernels are checked at their bound by test_attention_decode.py)
def test_bf16_greedy_with_a_bf16_cache():
    """precision="bf16": the decode step holds its KV cache as bf16 (uint16: the driver's buffers
    become the step's bf16 presents at its first step, an f32 past rounded once), and greedy ids
    are transformers' f32 ones, except after a step whose top two f32 logits are closer than the
    rule below (a near tie that bf16's rounding may break either way; the row is not compared
    after it). The rule, fixed before any run: each bf16 product along a logit's path (4 GEMMs a
    layer, the attention's two, the head) rounds its operands, 2u relative (u = 2^-8), so twice
    their sum relative to the largest logit; the cache's own part (k and v rounded) is within the
    attention bound (tests/test_attention_decode.py). It is an estimate, not a bound: carrying
    docs/precision.md's bounds through the model (each bf16 GEMM's (2u + u^2 + 1.01 K eps)
    sum |a||W| plus its input's error times |W|, the attention bound at the perturbed scores, each
    layernorm's error divided by its sigma less the change of sigma) gives none here: in this
    GPT-2 (random weights of 0.02, K = 64) a GEMM's sum |a||W| is several times its result, and
    the error bound of the second layernorm's input is already 0.45 of its sigma (0.011 against
    0.024), that of the third 240 times it, where the bound of its output has no finite value."""
    path = de.export_gpt2("torchscript")
    mod = eqfuse.compile(path, precision="bf16")
    sig = onnx_signature(path)
    dec = Decoder(sig, lambda feeds: mod(**feeds), CAPACITY, step_maker(mod, sig))
    ids = prompt(1)
    logits = dec.prefill(ids, PREFILL_MIN)
    assert all(c.dtype == np.float32 for c in dec.cache)
    for _ in range(3):
        logits = dec.step(logits.argmax(-1)[:, None].astype(np.int64))
        assert all(c.dtype == np.uint16 and c.shape[2] == CAPACITY + 1 for c in dec.cache)
    (step,) = mod.default.live_modules.values()
    paths = [e["path"] for e in step.report["precision"].values()]
    assert paths.count("round") == 2 * de.LAYERS and paths.count("widen") == de.LAYERS  # (k and v appends, attentions)
    ours = eqfuse.generate(mod, ids, max_new_tokens=NEW, eos_token_id=de.EOS)
    theirs, hf_logits = hf_generate(ids, NEW)
    b, s = ids.shape
    rule = 2 * (4 * de.LAYERS + 2 + 1) * 2 * 2.0**-8
    for r in range(b):
        for j in range(s, min(ours.shape[1], theirs.shape[1])):
            if ours[r, j] != theirs[r, j]:
                top = np.sort(hf_logits[j - s][r])[-2:]
                assert top[1] - top[0] < rule * np.abs(hf_logits[j - s][r]).max(), (r, j)
                break


def test_bad_cache_and_arguments_are_refused():
    """Mismatched cache shapes, a model that is no decoder export, and bad arguments: one
    EqfuseError with a message each, before any compile."""
    _, mod = compiled("torchscript")
    sig = onnx_signature(de.export_gpt2("torchscript"))

    def feeds(rows=(CAPACITY,) * 4, heads=(de.HEADS,) * 4):
        f = {"input_ids": np.zeros((B, 1), np.int64), "attention_mask": np.ones((B, rows[0] + 1), np.int64),
             "position_ids": np.zeros((B, 1), np.int64)}
        f.update({n: np.zeros((B, h, r, de.HEAD), np.float32) for (n, _), r, h in zip(sig.pasts, rows, heads)})
        return f

    with pytest.raises(eqfuse.ArgumentError, match="dimension past is 32 in one input and 31 in 'past_key_values_1_key'"):
        mod(**feeds(rows=(32, 32, 31, 32)))
    # the first step over an empty cache, as onnxruntime runs it: what to do instead
    with pytest.raises(eqfuse.ArgumentError, match=r"'past_key_values_0_key' has an empty dimension past: eqfuse "
                                                   r"computes no zero-size tensor .*eqfuse.generate"):
        mod(**feeds(rows=(0,) * 4))
    with pytest.raises(eqfuse.ArgumentError, match=r"'past_key_values_0_value' expects f32\[batch, 4, past, 16\]|"
                                                   r"'past_key_values_0_value' expects f32\[batch, 4, 32, 16\]"):
        mod(**feeds(heads=(4, 3, 4, 4)))
    # a model whose present is not past plus the new rows
    dec = Decoder(sig, lambda f: [np.zeros((B, 1, de.VOCAB), np.float32)] +
                  [np.zeros((B, de.HEADS, 2, de.HEAD), np.float32)] * 4, CAPACITY)
    with pytest.raises(eqfuse.EqfuseError, match=r"present output for 'past_key_values_0_key' has shape "
                                                 r"\[2, 4, 2, 16\], expected \[2, 4, 9, 16\]"):
        dec.prefill(prompt())
    with pytest.raises(eqfuse.EqfuseError, match="returns 2 outputs"):
        Decoder(sig, lambda f: [np.zeros((B, S, de.VOCAB), np.float32)] * 2, CAPACITY).prefill(prompt())
    from eqfuse.generation import Signature
    with pytest.raises(eqfuse.EqfuseError, match="no input 'attention_mask'"):
        Signature([("input_ids", ("b", "s")), ("position_ids", ("b", "s")), ("past.0.key", ("b", 4, "p", 16))])
    assert Signature([("input_ids", ("b", "s")), ("attention_mask", ("b", "t")),
                      ("past.0.key", ("b", 4, "p", 16))]).positions is None  # (BLOOM's: from the mask)
    with pytest.raises(eqfuse.EqfuseError, match=r"past input 'past_0' has shape \['b', 'h', 'p', 16\]"):
        Signature([("input_ids", ("b", "s")), ("attention_mask", ("b", "t")), ("position_ids", ("b", "s")),
                   ("past_0", ("b", "h", "p", 16))])
    for bad, msg in [(dict(input_ids=prompt().astype(np.float32)), "input_ids must be integers"),
                     (dict(temperature=0.0), "temperature must be positive"),
                     (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
                     (dict(top_k=-1), "top_k must be a non-negative integer"),
                     (dict(max_new_tokens=-2), "max_new_tokens must be a non-negative integer")]:
        args = {"input_ids": prompt(), **bad}
        with pytest.raises(eqfuse.ArgumentError, match=msg):
            eqfuse.generate(mod, args.pop("input_ids"), **args)
    with pytest.raises(eqfuse.EqfuseError, match="must be an eqfuse Module or the path"):
        eqfuse.generate(object(), prompt())


def test_concat_along_named_dims_in_a_g_graph():
    """The shape rule refuses the sum of names at the op, with its position (an ONNX model is
    bound per call instead: the GPT-2 tests above)."""
    src = "graph g(p: f32[B, P, 4], x: f32[B, S, 4]) -> f32[B, P, 4] {\n    return exp(concat(p, x, axis=1))\n}\n"
    with pytest.raises(eqfuse.EqfuseError, match=r"<string>:2:16: error: concat along axis 1 sums named dimensions "
                                                 r"\(P \+ S\), which a shape cannot hold"):
        eqfuse.reference(src)


def test_live_length_and_option_errors():
    """The decode step's appends move the new rows only and its attentions take the live length;
    it refuses a live length its buffers cannot hold (before any kernel runs),
    and live= a dim that no concat appends along, or that dims= does not bind."""
    path, mod = compiled("torchscript")
    sig = onnx_signature(path)
    step = step_maker(mod, sig)(B, CAPACITY)
    kernels = mod.default.live_module({"batch": B, "sequence": 1, "past": CAPACITY, "total": CAPACITY + 1},
                                      "past").kernels
    appends = [k for k in kernels if k.decisions.get("live", "").startswith("append")]
    assert len(appends) == len(sig.pasts)  # one append per cache, each moving its new row only (read and
    assert all(k.bytes == 2 * 4 * B * de.HEADS * de.HEAD for k in appends)  # written), whatever the capacity
    assert sum(k.decisions.get("live", "").startswith("keys") for k in kernels) == de.LAYERS
    feeds = {"input_ids": np.zeros((B, 1), np.int64), "attention_mask": np.ones((B, CAPACITY + 1), np.int64),
             "position_ids": np.zeros((B, 1), np.int64), "past_length": np.array([CAPACITY + 1])}
    bufs = [np.zeros((B, de.HEADS, CAPACITY + 1, de.HEAD), np.float32) for _ in sig.pasts]
    feeds.update({n: b for (n, _), b in zip(sig.pasts, bufs)})
    with pytest.raises(eqfuse.ArgumentError, match=r"live length 33 is not in 0 \.\. 32"):
        step(feeds)
    with pytest.raises(eqfuse.ArgumentError, match=r"live length -1 is not in 0 \.\. 32"):
        step({**feeds, "past_length": np.array([-1])})
    assert not any(b.any() for b in bufs)  # nothing written
    with pytest.raises(eqfuse.ArgumentError, match="live= expects the name of a dimension that dims= binds"):
        eqfuse.compile(path, live="past")
    dims = {"past": 8, "sequence": 1, "total": 9, "batch": 1}
    # (no input along the sequence is appended to: a dim taken at run time by the loops, whose
    # capacity must be no other extent of the model: eqfuse.backend.runtime_dim)
    with pytest.raises(eqfuse.EqfuseError, match="live='sequence': its capacity 1 is also a fixed extent of "
                                                 "main_graph"):
        eqfuse.compile(path, dims=dims, live="sequence")


@pytest.mark.extended
def test_cache_grows_past_its_capacity():
    """A Decoder whose cache fills up doubles it (16 -> 32 -> 64: the buffers copied once each,
    the decode step compiled once at each capacity) and its steps still match onnxruntime. (A
    Module of its own: the session's holds steps at other capacities, which it would grow to.)"""
    path = de.export_gpt2("torchscript")
    mod = eqfuse.compile(path)
    sig = onnx_signature(path)
    ours = Decoder(sig, lambda f: mod(**f), 16, step_maker(mod, sig))
    theirs = Decoder(sig, ort_run(path), 64)
    a, b = ours.prefill(prompt(), PREFILL_MIN), theirs.prefill(prompt())
    for step in range(30):
        tok = b.argmax(-1)[:, None].astype(np.int64)
        a, b = ours.step(tok), theirs.step(tok)
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4, err_msg=f"step {step}")
    assert ours.capacity == 64 and ours.cache[0].shape == (B, de.HEADS, 65, de.HEAD)


@pytest.mark.extended  # (beside test_cache_grows_past_its_capacity: the suite's time)
def test_a_cache_grows_to_a_compiled_capacity_without_compiling(monkeypatch):
    """A Decoder at 16 rows whose model holds the decode step at 64 (at its batch) grows to 64 at
    once when it fills: one copy of the buffers, no C build and no optimizer run, and its steps
    still match onnxruntime."""
    path = de.export_gpt2("torchscript")
    mod = eqfuse.compile(path)
    sig = onnx_signature(path)
    make = step_maker(mod, sig)
    make(B, 64)  # (as an earlier generation would have)
    assert make.held(B) == {64}
    counts = count_compiles(monkeypatch)
    ours = Decoder(sig, lambda f: mod(**f), 16, make)
    theirs = Decoder(sig, ort_run(path), 64)
    a, b = ours.prefill(prompt(), PREFILL_MIN), theirs.prefill(prompt())
    built = dict(counts)  # (the prefill's chunk and decode steps at 16)
    for step in range(12):
        tok = b.argmax(-1)[:, None].astype(np.int64)
        a, b = ours.step(tok), theirs.step(tok)
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4, err_msg=f"step {step}")
    assert ours.capacity == 64 and ours.cache[0].shape == (B, de.HEADS, 65, de.HEAD)
    assert counts == built


def ort_greedy(path, ids: np.ndarray, new: int, capacity: int) -> np.ndarray:
    """Greedy ids through onnxruntime on the same file, the cache at `capacity` (Decoder)."""
    dec = Decoder(onnx_signature(path), ort_run(path), capacity)
    out, logits = [ids], dec.prefill(ids)
    for k in range(new):
        tok = logits.argmax(-1)[:, None].astype(np.int64)
        out.append(tok)
        if k + 1 < new:
            logits = dec.step(tok)
    return np.concatenate(out, axis=1)


@pytest.mark.extended  # (the artifact's libraries, built for its level: some 30 s of C builds when the cache is cold)
def test_a_loaded_decoder_generates_as_the_compiled_one(tmp_path):
    """The artifact of a decoder that has generated keeps its bindings (the chunk step with its
    rows at run time and the decode step over the cache in place at its capacity): generate on
    eqfuse.load's Module gives the compiled Module's tokens. A generation it holds no binding for
    runs without the compiler: a shorter one at the capacity held, any prompt up to the capacity
    as chunks of its own rows; one that needs a larger cache is refused with what to do."""
    path, mod = compiled("torchscript")
    ids = prompt(4)
    ours = eqfuse.generate(mod, ids, max_new_tokens=NEW)
    loaded = eqfuse.load(mod.save(tmp_path / "gpt2.eqf"))
    assert list(loaded.default.live_modules) == list(mod.default.live_modules)  # (dims, "past", pick): the steps
    np.testing.assert_array_equal(eqfuse.generate(loaded, ids, max_new_tokens=NEW), ours)
    sig = onnx_signature(path)
    assert held_chunks(loaded, sig, B, de.POSITIONS - 1)  # (the chunk step over the cache at 127 rows)
    assert runtime_chunks(loaded, sig, B, de.POSITIONS - 1)  # (its rows at run time)
    # 5 tokens and 4 new: onnxruntime's greedy ids
    short = prompt(5)[:, :5]
    np.testing.assert_array_equal(eqfuse.generate(loaded, short, max_new_tokens=4),
                                  ort_greedy(path, short, 4, CAPACITY))
    # a prompt of another length: one chunk of its own rows
    long = np.random.default_rng(6).integers(0, de.VOCAB, (B, 100)).astype(np.int64)
    np.testing.assert_array_equal(eqfuse.generate(loaded, long, max_new_tokens=4),
                                  ort_greedy(path, long, 4, capacity_for(103)))
    # one row more than the largest cache it holds (the loaded Module knows no position table)
    most = max(d["past"] for d in (dict(key) for key, *_ in loaded.default.live_modules) if d["sequence"] == 1)
    with pytest.raises(eqfuse.ArgumentError, match=rf"compiled for caches of .*{most} rows at batch 2; .* need {most + 1}"):
        eqfuse.generate(loaded, ids, max_new_tokens=most + 2 - ids.shape[1])


def test_a_smaller_batch_runs_on_a_compiled_larger_one(monkeypatch, tmp_path):
    """After a generation at batch 2, one at batch 1 runs on the batch-2 steps (generation.run_batch:
    its second row a copy of its first, dropped): no C build, no optimizer run, no new step, and
    transformers' greedy ids. A batch of 3 (more than the compiled 2) would run at its own. The
    artifact saved after the batch of 2 alone serves a batch of 1 too, with the same ids. (At the
    batch B and prompt length S of the other tests of GPT-2's export: their steps, in the kernel cache.)"""
    path = de.export_gpt2("torchscript")
    mod = eqfuse.compile(path)
    rng = np.random.default_rng(11)
    eqfuse.generate(mod, rng.integers(0, de.VOCAB, (B, S)).astype(np.int64), max_new_tokens=NEW)
    steps = set(mod.default.live_modules)
    loaded = eqfuse.load(mod.save(tmp_path / "two.eqf"))
    counts = count_compiles(monkeypatch)
    one = rng.integers(0, de.VOCAB, (1, S)).astype(np.int64)
    ours = eqfuse.generate(mod, one, max_new_tokens=NEW, eos_token_id=de.EOS)
    assert counts == {"build": 0, "optimize": 0} and set(mod.default.live_modules) == steps
    assert_greedy_matches_transformers(ours, one, NEW)
    np.testing.assert_array_equal(eqfuse.generate(loaded, one, max_new_tokens=NEW, eos_token_id=de.EOS), ours)
    sig = module_signature(mod)  # (a batch of 3: more than the compiled 2, so it would compile its own steps)
    assert [run_batch(mod, sig, b, S + NEW - 1) for b in (1, 2, 3)] == [2, 2, 3]
    # steps held at batch 3 instead: a batch of 2 runs on them, one of 1 (3 is more than twice it) at its own
    import eqfuse.generation as generation

    held, batch_dim = generation.compiled_steps(mod.default, sig), sig.shapes[sig.ids][0]
    monkeypatch.setattr(generation, "compiled_steps", lambda f, s: [{**d, batch_dim: 3} for d in held])
    assert [run_batch(mod, sig, b, S + NEW - 1) for b in (1, 2, 3)] == [1, 3, 3]


@pytest.mark.extended
def test_a_loaded_decoder_with_batch_buckets_generates_any_batch(tmp_path):
    """Saved after one generation at batch 2 with buckets={"batch": [2]}: the artifact holds the
    prefill at its bucket and the decode step on the batch bucket, so the loaded Module generates
    at batches 1 and 3 (never compiled) without the compiler, the compiled Module's ids."""
    path = de.export_gpt2("torchscript")
    mod = eqfuse.compile(path, buckets={"batch": [2]})
    eqfuse.generate(mod, prompt(7), max_new_tokens=NEW)
    loaded = eqfuse.load(mod.save(tmp_path / "gpt2.eqf"))
    cap = de.POSITIONS - 1  # (the chunk step of 127 rows at run time and the decode step over the cache at 127 rows)
    assert sorted(([dict(key) for key, *_ in loaded.default.live_modules]), key=lambda d: d["past"]) == [
        {"past": 1, "sequence": cap, "total": cap + 1},
        {"past": cap, "sequence": 1, "total": cap + 1}]  # no batch: bucketed
    for b in (1, 3):
        ids = np.random.default_rng(b).integers(0, de.VOCAB, (b, 6)).astype(np.int64)
        np.testing.assert_array_equal(eqfuse.generate(loaded, ids, max_new_tokens=NEW),
                                      eqfuse.generate(mod, ids, max_new_tokens=NEW))


@pytest.mark.extended
def test_deep_grouped_query_llama_steps_match_onnxruntime():
    """A 20-layer Llama with 16 query heads over 4 key/value heads: in a graph this large a
    constant scale on the cached keys stays its own pointwise kernel in some layers (before, live=
    refused it); every decode attention reads its cache heads itself, that scale folded into q,
    and 12 decode steps match onnxruntime."""
    layers = 20
    path = de.export_decoder("llama", "torchscript", layers, 256, 16, de.POSITIONS, kv_heads=4)
    mod, sig = load_decoder(path)
    ours = Decoder(sig, lambda f: mod(**f), CAPACITY, step_maker(mod, sig))
    theirs = Decoder(sig, ort_run(path), CAPACITY)
    a, b = ours.prefill(prompt()), theirs.prefill(prompt())
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
    for step in range(12):
        tok = b.argmax(-1)[:, None].astype(np.int64)
        a, b = ours.step(tok), theirs.step(tok)
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4, err_msg=f"step {step}")
    step = mod.default.live_module({"batch": B, "sequence": 1, "past": CAPACITY, "total": CAPACITY + 1}, "past")
    live = [k.decisions.get("live", "") for k in step.kernels]
    assert sum(x.startswith("append") for x in live) == 2 * layers
    # no copy of the live rows: every decode attention reads its cache heads (kv_group 4), the
    # scale on the keys folded into q (k_scale)
    groups = [k.decisions["kv_group"] for k in step.kernels if k.kind == "attention"]
    assert groups == [4] * layers and not any(x.startswith("repeat") for x in live), groups


@pytest.mark.parametrize("exporter", ["torchscript", pytest.param("dynamo", marks=pytest.mark.extended)])
def test_an_alibi_model_without_position_ids_generates(exporter):
    """BLOOM takes no position_ids: each key's ALiBi bias comes from the attention mask's running
    count, and its attention runs over merged batch and heads ([B * heads, S, T] batched matmuls,
    split into [B, heads, S, T] around the bias and the mask: eqfuse.optimizer.layout, so the
    attention is one kernel over the cache in place). Left-padded prompts of different lengths
    give transformers' ids, and each row its prompt's alone."""
    path, mod = compiled(exporter, "bloom")
    assert module_signature(mod).positions is None
    ids, mask = left_padded(9)
    ours = eqfuse.generate(mod, ids, max_new_tokens=NEW, attention_mask=mask)
    assert len(set(ours[:, S:].ravel().tolist())) > 4  # (varied tokens: the bias and the mask matter)
    assert_greedy_matches_transformers(ours, ids, NEW, "bloom", mask)
    alone = eqfuse.generate(mod, ids[1:2, mask[1] == 1], max_new_tokens=NEW)
    np.testing.assert_array_equal(ours[1, S:], alone[0, -NEW:])
