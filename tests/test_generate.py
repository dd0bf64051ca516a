"""eqfuse.generate and the decoder exports it runs (tests/decoder_exports.py): a GPT-2 exported
with its KV cache loads (concat along the named past dim), its prefill and 20 decode steps match
onnxruntime on the same file, and generation matches transformers."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import decoder_exports as de  # noqa: E402

import eqfuse  # noqa: E402
from eqfuse.generate import Decoder, capacity_for, onnx_signature  # noqa: E402

B, S, STEPS = 2, 8, 20
NEW = STEPS + 1  # a prefill and 20 decode steps make 21 tokens
CAPACITY = capacity_for(S + NEW - 1)  # 32: every test here runs the same two bindings

_compiled: dict[str, object] = {}


def compiled(exporter: str):
    """(path, Module) of the export, compiled once per test session."""
    path = de.export_gpt2(exporter)
    if exporter not in _compiled:
        _compiled[exporter] = eqfuse.compile(path)
    return path, _compiled[exporter]


def ort_run(path):
    """onnxruntime on the same file, fed by the names eqfuse gives the inputs."""
    from eqfuse.frontend.onnx_inputs import input_shapes

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    onnx_name = {p: o for o, p, _ in input_shapes(str(path))}
    return lambda feeds: sess.run(None, {onnx_name[k]: v for k, v in feeds.items()})


def prompt(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, de.VOCAB, (B, S)).astype(np.int64)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_decode_steps_match_onnxruntime(exporter):
    """Prefill and 20 decode steps through eqfuse and onnxruntime on the same feeds (the cache at
    a fixed capacity, eqfuse.generate's), and onnxruntime on the cache at its live length, as
    the export is meant to run (an empty past at the prefill): the masked rows change nothing."""
    path, mod = compiled(exporter)
    sig = onnx_signature(path)
    assert sig.max_positions == de.POSITIONS
    ours = Decoder(sig, lambda feeds: mod(**feeds), CAPACITY)
    theirs = Decoder(sig, ort_run(path), CAPACITY)
    live = ort_run(path)

    ids = prompt()
    a, b = ours.prefill(ids), theirs.prefill(ids)
    past = [np.zeros((B, de.HEADS, 0, de.HEAD), np.float32) for _ in de.PAST_NAMES]
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
        for mine, full in zip(ours.cache, past):
            np.testing.assert_allclose(mine[:, :, :n], full, atol=1e-4, rtol=1e-4)
            assert not mine[:, :, n:].any()  # the rows past the live length are untouched
