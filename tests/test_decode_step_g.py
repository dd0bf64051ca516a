"""A decode step with a KV cache written by hand in .g (tests/decode_step.g): compiled once
with live="P" (the cache's capacity bound by dims=, its live length a run-time input), 10 steps
against a numpy reference of the same attention decoder over the live rows, the cache's spare
rows NaN so no step reads past its live length; and the error when dims= does not bind P."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import eqfuse

SRC = Path(__file__).resolve().parent / "decode_step.g"
B, CAP, H, D, E, V, STEPS = 2, 16, 4, 16, 64, 100, 10


@pytest.fixture(scope="module")
def step():
    return eqfuse.compile(SRC, dims={"B": B, "P": CAP}, live="P")


def reference(x, ks, vs, w):
    """The step in float64 over the live rows: ks, vs [B, heads, t + 1, head size] (past and new)."""
    q = (x @ w["wq"]).reshape(B, 1, H, D).transpose(0, 2, 1, 3)
    s = q @ ks.transpose(0, 1, 3, 2) * 0.25
    p = np.exp(s - s.max(-1, keepdims=True))
    a = (p / p.sum(-1, keepdims=True)) @ vs
    h = x + a.transpose(0, 2, 1, 3).reshape(B, 1, E) @ w["wo"]
    return h @ w["wout"]


def test_hand_written_decode_step_over_a_live_cache(step):
    rng = np.random.default_rng(0)
    w = {n: (rng.standard_normal((E, V if n == "wout" else E)) / 8).astype(np.float32)
         for n in ("wq", "wk", "wv", "wo", "wout")}
    kbuf = np.full((B, H, CAP + 1, D), np.nan, np.float32)  # the cache buffers: rows 0 .. t live, the rest NaN
    vbuf = np.full_like(kbuf, np.nan)
    kinds = [k.decisions.get("live", "") for k in step.kernels]
    assert sum(k.startswith("append") for k in kinds) == 2 and sum(k.startswith("keys") for k in kinds) == 1
    for t in range(STEPS):
        x = rng.standard_normal((B, 1, E)).astype(np.float32)
        logits, keys, values = step(x=x, past_k=kbuf, past_v=vbuf, P_length=np.array([t]), **w)
        assert np.shares_memory(keys, kbuf) and np.shares_memory(values, vbuf)  # appended in place
        x64 = x.astype(np.float64)
        new_k = (x64 @ w["wk"]).reshape(B, 1, H, D).transpose(0, 2, 1, 3)
        new_v = (x64 @ w["wv"]).reshape(B, 1, H, D).transpose(0, 2, 1, 3)
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
