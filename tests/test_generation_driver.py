"""eqfuse.generation's driver (Decoder) over a decoder written here in numpy, as the exports
are (docs/generation.md, "The export it runs"): its prefill and decode steps over the cache at a
fixed capacity, over a cache in place (the live decode step's contract), the prefill fed token by
token, and the cache doubled when it fills, each against the same model run on the whole
sequence without a cache. Nothing here compiles: the compiled decoders are tests/test_generate.py's.
And the refusals a user meets before anything runs: a model that is no decoder export, a missing
file, a position past the model's table, a prompt longer than the cache."""

from __future__ import annotations

import numpy as np
import pytest

import eqfuse
from eqfuse.generation import (
    LENGTH,
    LIVE_CACHE_BYTES,
    LIVE_CAPACITY_DEFAULT,
    Decoder,
    Signature,
    capacity_for,
    check_window,
    live_capacity,
)

B, V, E, H, D, POSITIONS = 2, 13, 8, 2, 4, 40
RNG = np.random.default_rng(0)
W = {n: (RNG.standard_normal(s) / 2).astype(np.float32) for n, s in
     (("emb", (V, E)), ("pos", (POSITIONS, E)), ("wq", (E, E)), ("wk", (E, E)), ("wv", (E, E)), ("wo", (E, E)),
      ("out", (E, V)))}
SIG = Signature([("input_ids", ("b", "s")), ("attention_mask", ("b", "t")), ("position_ids", ("b", "s")),
                 ("past_key", ("b", H, "p", D)), ("past_value", ("b", H, "p", D))], POSITIONS)


def heads(x):
    """[B, S, E] -> [B, H, S, D]"""
    return x.reshape(x.shape[0], x.shape[1], H, D).transpose(0, 2, 1, 3)


def attend(x, keys, values, visible):
    """One attention layer and the logits; visible [B, S, rows] says which key rows each query sees."""
    s = heads(x @ W["wq"]) @ keys.transpose(0, 1, 3, 2) / np.float32(np.sqrt(D))
    s = np.where(visible[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    a = (p / p.sum(-1, keepdims=True)) @ values
    return (x + a.transpose(0, 2, 1, 3).reshape(x.shape) @ W["wo"]) @ W["out"]


def export(feeds):
    """The decoder as an export runs: past rows the mask marks absent are not attended to, the new
    rows causally; returns the logits and present = concat(past, new, axis=2)."""
    ids, mask, pos = feeds["input_ids"], feeds["attention_mask"], feeds["position_ids"]
    x = W["emb"][ids] + W["pos"][pos]
    keys = np.concatenate([feeds["past_key"], heads(x @ W["wk"])], axis=2)
    values = np.concatenate([feeds["past_value"], heads(x @ W["wv"])], axis=2)
    s, p = ids.shape[1], keys.shape[2] - ids.shape[1]
    causal = np.arange(p + s)[None, :] <= p + np.arange(s)[:, None]
    return [attend(x, keys, values, causal[None] & (mask[:, None, :] != 0)), keys, values]


def whole(ids):
    """The logits at every position of ids [B, n], computed without a cache."""
    empty = np.zeros((ids.shape[0], H, 0, D), np.float32)
    return export({"input_ids": ids, "attention_mask": np.ones(ids.shape, np.int64),
                   "position_ids": np.tile(np.arange(ids.shape[1]), (ids.shape[0], 1)),
                   "past_key": empty, "past_value": empty})[0]


def in_place(copies=False, prepared=False):
    """The live decode step's contract (a model compiled with live="past"): each cache buffer
    [B, H, capacity + 1, D] gets the new row at the live length t, keys 0 .. t are attended to,
    and the buffers come back as the presents (with copies=True, the new row is written to copies
    of the buffers, which come back instead: a runtime that leaves its inputs alone). Records each
    (batch, capacity) asked for. With prepared=True the step also has `prepare(feeds)`, as a
    compiled step has (GraphFunction.prepare): a call over those very arrays, reading their
    values at each call; each prepare is recorded."""
    made, prepares = [], []

    def make(batch, capacity):
        made.append((batch, capacity))

        def step(feeds):
            t = int(feeds[LENGTH][0])
            assert feeds["past_key"].shape == (batch, H, capacity + 1, D) and 0 <= t <= capacity
            x = W["emb"][feeds["input_ids"]] + W["pos"][feeds["position_ids"]]
            bufs = [feeds["past_key"], feeds["past_value"]]
            bufs = [b.copy() for b in bufs] if copies else bufs
            for buf, w in zip(bufs, (W["wk"], W["wv"])):
                buf[:, :, t:t + 1] = heads(x @ w)
            visible = (np.arange(capacity + 1) <= t)[None, None] & (feeds["attention_mask"][:, None, :] != 0)
            logits = attend(x, bufs[0][:, :, :t + 1], bufs[1][:, :, :t + 1], visible[:, :, :t + 1])
            return [logits] + bufs
        if prepared:
            def prepare(feeds):
                prepares.append((batch, capacity))
                return lambda: step(feeds)
            step.prepare = prepare
        return step
    make.made, make.prepares = made, prepares
    return make


def generate_greedy(dec, prompt, new, by_steps=False, length=None):
    """Greedy ids through the Decoder, and its logits at each position it fed (the prefill
    padded to `length` tokens when given)."""
    logits = [dec.prefill_by_steps(prompt) if by_steps else dec.prefill(prompt, length)]
    ids = [prompt]
    for _ in range(new):
        ids.append(logits[-1].argmax(-1)[:, None].astype(np.int64))
        logits.append(dec.step(ids[-1]))
    return np.concatenate(ids, axis=1), logits


PROMPT = np.random.default_rng(1).integers(0, V, (B, 5)).astype(np.int64)


@pytest.mark.parametrize("how", ["fixed capacity", "in place", "in place, copied presents", "prompt by steps",
                                 "in place, prefill padded", "in place, prepared"])
def test_decoder_steps_match_the_model_without_a_cache(how):
    """A prompt of 5 and 20 decode steps from a cache of 16 rows: the cache fills at the 12th step
    and doubles to 32 (once); every step's logits are the logits of the whole sequence at its
    position, within f32 rounding of the same sums in another order. The prefill padded to 16
    tokens (its bucket: generation.prefill_plan) gives the unpadded one's logits and cache rows."""
    step = in_place(copies="copied" in how, prepared="prepared" in how) if "in place" in how or "steps" in how else None
    dec = Decoder(SIG, export, 16, step)
    ids, logits = generate_greedy(dec, PROMPT, 20, by_steps=how == "prompt by steps",
                                  length=16 if "padded" in how else None)
    want = whole(ids)
    for k, got in enumerate(logits):
        np.testing.assert_allclose(got, want[:, 4 + k], rtol=1e-5, atol=1e-5, err_msg=f"position {4 + k}")
    assert dec.capacity == 32 and dec.length == 25
    assert dec.cache[0].shape == (B, H, 32 + (step is not None), D)
    if step is not None:
        assert step.made == [(B, 16), (B, 32)]  # the decode step made at each capacity, once
        # prepared once per step and buffers: the ids, positions, live length and mask written in place
        assert step.prepares == ([(B, 16), (B, 32)] if "prepared" in how else [])


def test_a_position_past_the_table_and_a_prompt_past_the_cache_are_refused():
    dec = Decoder(SIG, export, 64)
    with pytest.raises(eqfuse.ArgumentError, match=r"generate: position 40 is past the model's maximum of 40 positions "
                                                   r"\(39 is the last\); use fewer new tokens or a shorter prompt"):
        generate_greedy(dec, PROMPT, 40)
    for by_steps in (False, True):
        with pytest.raises(eqfuse.ArgumentError, match="generate: a prompt of 17 tokens does not fit a cache of 16"):
            generate_greedy(Decoder(SIG, export, 16, in_place()), np.zeros((B, 17), np.int64), 1, by_steps)


def test_a_present_of_the_wrong_shape_is_refused_at_the_step():
    """A model whose step returns a present that is not past plus one row."""
    def short(feeds):
        logits, k, v = export(feeds)
        return [logits, k[:, :, :-1] if feeds["input_ids"].shape[1] == 1 else k, v]

    dec = Decoder(SIG, short, 16)
    dec.prefill(PROMPT)
    with pytest.raises(eqfuse.EqfuseError, match=r"present output for 'past_key' has shape \[2, 2, 16, 4\], "
                                                 r"expected \[2, 2, 17, 4\] \(past and new rows along axis 2\)"):
        dec.step(PROMPT[:, :1])


def test_capacity_is_a_power_of_two_from_16():
    assert [capacity_for(n) for n in (0, 1, 16, 17, 33, 100)] == [16, 16, 16, 32, 64, 128]


def test_a_cache_in_place_holds_the_position_table_or_a_default_within_its_memory():
    """live_capacity: a model's whole position table less one (a step's keys, the capacity and
    its new row, within the table); without one, 2048 rows, fewer when the buffers of the batch
    would pass 256 MB, and always the generation's own rows."""
    assert live_capacity(SIG, 10) == POSITIONS - 1 and live_capacity(SIG, 50) == 64  # (past the table: its own)

    def sig(layers, heads, head):  # a model without a position table
        pasts = [(f"past_{i}", ("b", heads, "p", head)) for i in range(2 * layers)]
        return Signature([("input_ids", ("b", "s")), ("attention_mask", ("b", "t")),
                          ("position_ids", ("b", "s")), *pasts])
    assert live_capacity(sig(2, 2, 16), 10) == LIVE_CAPACITY_DEFAULT == 2048
    assert live_capacity(sig(2, 2, 16), 5000) == 8192  # (longer: the power of two that holds it)
    big = sig(32, 8, 128)  # 256 KB a row
    row = 2 * 32 * 8 * 128 * 4
    assert live_capacity(big, 10) * row == LIVE_CACHE_BYTES  # 1024 rows at batch 1
    assert live_capacity(big, 10, batch=8) == 128 and live_capacity(big, 300, batch=8) == 512
    # a sliding-window model (its sliding layers keep 511 rows): its caches in place are whole,
    # so the window does not bound them; a cache at a fixed capacity stays within the window
    windowed = sig(2, 2, 16)
    windowed.window_rows = 511
    assert live_capacity(windowed, 10) == 2048 and live_capacity(windowed, 1000, batch=4096) == 1024
    check_window(windowed, 500, 11)  # (510 rows, and the step appending to them 511)
    with pytest.raises(eqfuse.ArgumentError, match="keep 511 .*up to 510 rows"):
        check_window(windowed, 500, 12)


@pytest.mark.parametrize("inputs, message", [
    ([("input_ids", ("b", "s")), ("attention_mask", ("b", "t")), ("position_ids", ("b", "s"))],
     "the model has no past key value inputs"),
    ([("input_ids", ("b", "s")), ("attention_mask", ("b", "t")), ("position_ids", ("b", "s")),
      ("past_0", ("b", 2, "p", 4)), ("token_type_ids", ("b", "s"))],
     "the model has inputs eqfuse.generate does not know how to feed: token_type_ids"),
])
def test_a_model_that_is_no_decoder_export_is_refused(inputs, message):
    with pytest.raises(eqfuse.EqfuseError, match=message):
        Signature(inputs)


def test_a_missing_file_is_refused(tmp_path):
    missing = tmp_path / "decoder.onnx"
    with pytest.raises(eqfuse.EqfuseError, match=f"{missing}: no such file"):
        eqfuse.generate(str(missing), PROMPT)


def test_the_position_table_is_found_through_casts_and_reshapes(tmp_path):
    """onnx_signature follows position_ids through a Cast and an Unsqueeze to the Gather of an
    initializer: its rows are the model's positions."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from eqfuse.generation import onnx_signature

    nodes = [helper.make_node("Cast", ["position_ids"], ["p32"], to=TensorProto.INT32),
             helper.make_node("Unsqueeze", ["p32", "axes"], ["p3"]),
             helper.make_node("Gather", ["wpe", "p3"], ["pe"]),
             helper.make_node("Identity", ["past_key"], ["present_key"])]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "sequence"]),
              helper.make_tensor_value_info("past_key", TensorProto.FLOAT, ["batch", 2, "past", 4])]
    g = helper.make_graph(nodes, "d", inputs, [helper.make_tensor_value_info("pe", TensorProto.FLOAT, None),
                                               helper.make_tensor_value_info("present_key", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.zeros((24, 8), np.float32), "wpe"),
                           numpy_helper.from_array(np.array([-1], np.int64), "axes")])
    path = tmp_path / "decoder.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    sig = onnx_signature(path)
    assert sig.max_positions == 24 and [n for n, _ in sig.pasts] == ["past_key"]
    assert (sig.ids, sig.mask, sig.positions) == ("input_ids", "attention_mask", "position_ids")
