"""A decode step with a KV cache written by hand in .g (tests/decode_step.g): compiled once
with live="P" (the cache's capacity bound by dims=, its live length a run-time input), 10 steps
against a numpy reference of the same attention decoder over the live rows, the cache's spare
rows NaN so no step reads past its live length; the same with grouped-query attention (2 key and
value heads repeated for 4 query heads: the attention reads the 2 cache heads itself); and the errors
when dims= does not bind P, when another kernel reads the cache, and when the step is given to
eqfuse.generate, which needs a decoder export."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import assert_reads_alive

import eqfuse

SRC = Path(__file__).resolve().parent / "decode_step.g"
B, CAP, H, D, E, V, STEPS = 2, 16, 4, 16, 64, 100, 10
KV = 2  # key and value heads of the grouped-query step


def grouped_query(text: str) -> str:
    """decode_step.g with 2 key and value heads, each repeated for 2 query heads (the export of a
    Llama's repeat_kv: expand then reshape), at batch 2."""
    text = text.replace("f32[B, 4, P, 16]", "f32[B, 2, P, 16]").replace("f32[B, ", "f32[2, ")
    text = text.replace("wk: f32[64, 64], wv: f32[64, 64]", "wk: f32[64, 32], wv: f32[64, 32]")
    for n in "kv":
        text = text.replace(f"{n} = transpose(reshape(x @ w{n}, shape=[-1, 1, 4, 16])",
                            f"{n} = transpose(reshape(x @ w{n}, shape=[-1, 1, 2, 16])")
    repeat = "reshape(expand(unsqueeze({}, axis=2), shape=[1, 1, 2, 1, 1]), shape=[2, 4, -1, 16])"
    return text.replace("transpose(keys, perm", "transpose(" + repeat.format("keys") + ", perm") \
               .replace("@ values", "@ " + repeat.format("values"))


@pytest.fixture(scope="module")
def steps():
    """how -> the step compiled, once per module."""
    compiled = {}

    def get(how: str):
        if how not in compiled:
            text = SRC.read_text()
            gqa = how == "grouped-query"  # (batch 2 written in its shapes)
            compiled[how] = eqfuse.compile(grouped_query(text) if gqa else text,
                                           dims={"P": CAP} if gqa else {"B": B, "P": CAP}, live="P")
        return compiled[how]
    return get


def reference(x, ks, vs, w):
    """The step in float64 over the live rows: ks, vs [B, key heads, t + 1, head size] (past and
    new), each key head repeated for H / key heads query heads."""
    ks, vs = np.repeat(ks, H // ks.shape[1], axis=1), np.repeat(vs, H // vs.shape[1], axis=1)
    q = (x @ w["wq"]).reshape(B, 1, H, D).transpose(0, 2, 1, 3)
    s = q @ ks.transpose(0, 1, 3, 2) * 0.25
    p = np.exp(s - s.max(-1, keepdims=True))
    a = (p / p.sum(-1, keepdims=True)) @ vs
    h = x + a.transpose(0, 2, 1, 3).reshape(B, 1, E) @ w["wo"]
    return h @ w["wout"]


@pytest.mark.heavy  # (the fast tier's time)
@pytest.mark.parametrize("how", ["heads", "grouped-query"])
def test_hand_written_decode_step_over_a_live_cache(steps, how):
    step = steps(how)
    kv = KV if how == "grouped-query" else H
    rng = np.random.default_rng(0)
    w = {n: (rng.standard_normal((E, {"wout": V, "wk": kv * D, "wv": kv * D}.get(n, E))) / 8).astype(np.float32)
         for n in ("wq", "wk", "wv", "wo", "wout")}
    kbuf = np.full((B, kv, CAP + 1, D), np.nan, np.float32)  # the cache buffers: rows 0 .. t live, the rest NaN
    vbuf = np.full_like(kbuf, np.nan)
    kinds = [k.decisions.get("live", "") for k in step.kernels]
    assert sum(k.startswith("append") for k in kinds) == 2 and sum(k.startswith("keys") for k in kinds) == 1
    assert not any(k.startswith("repeat") for k in kinds)  # (grouped-query: the attention reads the cache heads)
    att = [k for k in step.kernels if k.kind == "attention"]
    assert [k.decisions["kv_group"] for k in att] == [H // kv]
    for t in range(STEPS):
        x = rng.standard_normal((B, 1, E)).astype(np.float32)
        logits, keys, values = step(x=x, past_k=kbuf, past_v=vbuf, P_length=np.array([t]), **w)
        assert np.shares_memory(keys, kbuf) and np.shares_memory(values, vbuf)  # appended in place
        x64 = x.astype(np.float64)
        new_k = (x64 @ w["wk"]).reshape(B, 1, kv, D).transpose(0, 2, 1, 3)
        new_v = (x64 @ w["wv"]).reshape(B, 1, kv, D).transpose(0, 2, 1, 3)
        np.testing.assert_allclose(kbuf[:, :, t:t + 1], new_k, rtol=1e-4, atol=1e-4, err_msg=f"step {t}")
        np.testing.assert_allclose(vbuf[:, :, t:t + 1], new_v, rtol=1e-4, atol=1e-4, err_msg=f"step {t}")
        assert np.isnan(kbuf[:, :, t + 1:]).all() and np.isnan(vbuf[:, :, t + 1:]).all()
        want = reference(x64, kbuf[:, :, :t + 1].astype(np.float64), vbuf[:, :, :t + 1].astype(np.float64), w)
        np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-4, err_msg=f"step {t}")


def test_concat_of_unbound_named_dims_points_at_the_line():
    """Without dims= binding P, the concat's length is a sum of names: one error at the op."""
    with pytest.raises(eqfuse.EqfuseError, match=r"decode_step\.g:12:12: error: concat along axis 2 sums named "
                                                 r"dimensions \(P \+ 1\).*: bind P with compile's dims= \(--dim\)"):
        eqfuse.compile(SRC)


def test_another_reader_of_the_cache_is_refused():
    """A kernel other than the append and the attention (here a sum over the keys) would read the
    cache's rows past the live ones: lowering refuses it, naming the kernel and the cache."""
    text = SRC.read_text().replace("return h @ wout, keys, values", "return h @ wout, keys, values, sum(keys, axis=2)")
    with pytest.raises(eqfuse.EqfuseError, match=r"live=: kernel \w+ \(reduce: [\w, ]*sum[\w, ]*\) reads the KV cache "
                                                 r"keys; only the append and attention over it take the run-time "
                                                 "length, so it would read rows past the live ones"):
        eqfuse.compile(text, dims={"B": B, "P": CAP}, live="P")


def test_an_input_named_as_the_length_is_refused():
    text = SRC.read_text().replace("wout: f32[64, 100])", "wout: f32[64, 100], P_length: f32[1])") \
                          .replace("return h @ wout,", "return h @ wout * P_length,")
    with pytest.raises(eqfuse.EqfuseError, match="live=: the graph already has an input named 'P_length'"):
        eqfuse.compile(text, dims={"B": B, "P": CAP}, live="P")


def test_generate_refuses_a_module_that_is_no_decoder_export(steps):
    """The step has no input_ids: eqfuse.generate says what it needs, before running anything."""
    with pytest.raises(eqfuse.EqfuseError, match=r"generate: the model has no input 'input_ids' \(its inputs: x, "
                                                 r"past_k, past_v, wq, wk, wv, wo, wout, P_length\); eqfuse.generate "
                                                 "needs a decoder export"):
        eqfuse.generate(steps("heads"), np.zeros((B, 3), np.int64))


@pytest.mark.parametrize("change, why", [
    (("return h @ wout, keys, values", "return h @ wout, keys, values, past_k"), "it is also returned"),
    (("wout: f32[64, 100])", "wout: f32[64, 100], past_q: f32[B, 4, P, 16])"), "nothing reads it"),
    (("values = concat(past_v, v, axis=2)", "values = concat(past_v, v, axis=2)\n    more = concat(past_v, v, v, axis=2)"),
     "the concats that read it have different shapes"),
], ids=["returned", "unread", "two-lengths"])
def test_an_input_that_cannot_hold_a_live_cache_is_refused(change, why):
    """live="P" makes every input with the dim P a cache buffer: each must be read once, as the
    first operand of its concat (before any optimization: the message names the input)."""
    text = SRC.read_text().replace(*change)
    if "more" in text:
        text = text.replace("return h @ wout, keys, values", "return h @ wout, keys, values, more")
    name = {"it is also returned": "past_k", "nothing reads it": "past_q"}.get(why, "past_v")
    with pytest.raises(eqfuse.EqfuseError, match=f"live=: input '{name}' cannot hold a KV cache with a run-time "
                                                 f"length: {why}"):
        eqfuse.compile(text, dims={"B": B, "P": CAP}, live="P")


FUSED = """graph chunk(x: f32[1, 4, 64], past_k: f32[1, 4, P, 16], past_v: f32[1, 4, P, 16], wqkv: f32[64, 192]) {
    qkv = x @ wqkv
    q = transpose(reshape(slice(qkv, axis=2, start=0, stop=64) * 0.25, shape=[-1, 4, 4, 16]), perm=[0, 2, 1, 3])
    k = transpose(reshape(slice(qkv, axis=2, start=64, stop=128) * 2.0, shape=[-1, 4, 4, 16]), perm=[0, 2, 1, 3])
    v = transpose(reshape(slice(qkv, axis=2, start=128, stop=192), shape=[-1, 4, 4, 16]), perm=[0, 2, 1, 3])
    keys = concat(past_k, k, axis=2)
    values = concat(past_v, v, axis=2)
    return softmax(q @ transpose(keys, perm=[0, 1, 3, 2]), axis=-1) @ values, keys, values
}
"""


def test_the_rows_an_append_reads_stay_alive_until_it_runs():
    """Four rows a step, their query, keys and values sliced from one fused projection (Phi-3's
    qkv_proj): the values are a view of the projection's result, which the append reads after the
    query's and the keys' kernels have. The memory plan keeps every buffer a kernel reads alive at
    that kernel's step, the append's too, so no kernel between reuses its memory (a Phi-3 chunk
    step's value rows were overwritten so)."""
    from eqfuse.ir.kernels import K

    mod = eqfuse.compile(FUSED, dims={"P": CAP}, live="P")
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((E, 192)) / 8).astype(np.float32)
    kbuf = np.full((1, H, CAP + 4, D), np.nan, np.float32)
    vbuf = np.full_like(kbuf, np.nan)
    for t in range(0, 12, 4):
        x = rng.standard_normal((1, 4, E)).astype(np.float32)
        out, _, _ = mod(x=x, past_k=kbuf, past_v=vbuf, P_length=np.array([t]), wqkv=w)
        qkv = x.astype(np.float64) @ w
        heads = [qkv[..., i:i + 64].reshape(1, 4, H, D).transpose(0, 2, 1, 3) for i in (0, 64, 128)]
        np.testing.assert_allclose(kbuf[:, :, t:t + 4], heads[1] * 2, rtol=1e-5, atol=1e-5, err_msg=f"keys at {t}")
        np.testing.assert_allclose(vbuf[:, :, t:t + 4], heads[2], rtol=1e-5, atol=1e-5, err_msg=f"values at {t}")
        s = heads[0] * 0.25 @ kbuf[:, :, :t + 4].astype(np.float64).transpose(0, 1, 3, 2)
        p = np.exp(s - s.max(-1, keepdims=True))
        want = p / p.sum(-1, keepdims=True) @ vbuf[:, :, :t + 4].astype(np.float64)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5, err_msg=f"attention at {t}")
    assert any(p.live is not None and p.live.what == "append" for p in mod.default.last.plans if p.kind != K.VIEW)
    assert_reads_alive(mod)
