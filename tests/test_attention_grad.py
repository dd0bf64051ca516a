"""The attention gradients that recompute the probabilities (attention_dq / dk / dv): each
kernel against the op table's numpy semantics (NaN rows, masks, views, strided results), and the
optimizer choosing them for the backward graph of an attention layer, so that no Sq x Sk buffer
is written."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import covering

import eqfuse
from eqfuse.ir.ops import OPS
from eqfuse.machine import pinned

SIG = {"q": "q: f32[2, 3, 5, 4]", "k": "k: f32[2, 3, 7, 4]", "v": "v: f32[2, 3, 7, 6]", "dy": "dy: f32[2, 3, 5, 6]"}
RESULT = {"attention_dq": "f32[2, 3, 5, 4]", "attention_dk": "f32[2, 3, 7, 4]", "attention_dv": "f32[2, 3, 7, 6]"}
ARGS = {"attention_dq": "q, k, v, dy", "attention_dk": "q, k, v, dy", "attention_dv": "q, k, dy"}


def _arrays(rng):
    shapes = {"q": (2, 3, 5, 4), "k": (2, 3, 7, 4), "v": (2, 3, 7, 6), "dy": (2, 3, 5, 6)}
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}


def _numpy(op, arrays, names, attrs):
    return OPS[op].numpy([arrays[n].astype(np.float64) for n in names],
                         {"scale": attrs.get("scale", 1.0), "zero_nan": attrs.get("zero_nan", False)})


@pytest.mark.parametrize("op,mask,machine", covering(
    [(op, mask) for op in sorted(RESULT) for mask in (None, "2, 1, 1, 7", "2, 3, 5, 7")], ["avx2", "zen4"]))
def test_kernel_matches_numpy(op, mask, machine):
    rng = np.random.default_rng(len(op) + (len(mask) if mask else 0))
    a = _arrays(rng)
    names = ARGS[op].split(", ")
    params = [SIG[n] for n in names]
    if mask:
        a["m"] = rng.standard_normal([int(x) for x in mask.split(",")]).astype(np.float32)
        names.append("m")
        params.append(f"m: f32[{mask}]")
    src = f"graph g({', '.join(params)}) -> {RESULT[op]} {{ return {op}({', '.join(names)}, scale=0.375) }}"
    with pinned(machine):
        mod = eqfuse.compile(src)
    out = mod(*[a[n] for n in names])
    assert [p.kind for p in mod.g.last.plans] == ["attention_grad"]
    np.testing.assert_allclose(out, _numpy(op, a, names, {"scale": 0.375}), rtol=1e-5, atol=1e-5)


@pytest.mark.heavy
@pytest.mark.parametrize("zero_nan", [False, True])
def test_dead_rows_are_nan_or_zero_as_in_numpy(zero_nan):
    """A query row whose every key is masked with -inf (and one with a NaN score) has NaN
    probabilities in numpy's softmax, or 0 with zero_nan: the gradients follow."""
    rng = np.random.default_rng(3)
    a = _arrays(rng)
    m = np.zeros((2, 3, 5, 7), np.float32)
    m[0, 1, 2, :] = -np.inf
    m[1, 0, 4, 3] = np.nan
    m[1, 2, :, 6] = -np.inf  # one key masked everywhere: finite
    a["m"] = m
    for op, result in RESULT.items():
        names = ARGS[op].split(", ") + ["m"]
        src = (f"graph g({', '.join(SIG[n] for n in names[:-1])}, m: f32[2, 3, 5, 7]) -> {result} "
               f"{{ return {op}({', '.join(names)}, zero_nan={str(zero_nan).lower()}) }}")
        out = eqfuse.compile(src)(*[a[n] for n in names])
        want = _numpy(op, a, names, {"zero_nan": zero_nan})
        assert np.isnan(want).any() != zero_nan
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_heads_read_and_written_in_place():
    """q, k and v are head-split views of projections and the result goes through the head merge:
    no layout copy around the gradient kernels."""
    src = """graph g(x: f32[2, 6, 8], dy: f32[2, 2, 6, 4]) -> f32[2, 6, 8] {
        q = transpose(reshape(x * 2, shape=[2, 6, 2, 4]), perm=[0, 2, 1, 3])
        k = transpose(reshape(x + 1, shape=[2, 6, 2, 4]), perm=[0, 2, 1, 3])
        return reshape(transpose(attention_dq(q, k, q, dy, scale=0.5), perm=[0, 2, 1, 3]), shape=[2, 6, 8])
    }"""
    mod = eqfuse.compile(src, verify=True)
    rng = np.random.default_rng(0)
    mod(rng.standard_normal((2, 6, 8)).astype(np.float32), rng.standard_normal((2, 2, 6, 4)).astype(np.float32))
    kinds = [p.kind for p in mod.g.last.plans]
    assert "attention_grad" in kinds and "layout" not in kinds, kinds


MASKED = """graph layer(x: f32[2, 8, 16], mask: f32[2, 1, 1, 8], wq: f32[16, 16], wk: f32[16, 16], wv: f32[16, 16],
                 wo: f32[16, 16], target: f32[2, 8, 16]) {
    q = transpose(reshape(x @ wq, shape=[2, 8, 4, 4]), perm=[0, 2, 1, 3])
    k = transpose(reshape(x @ wk, shape=[2, 8, 4, 4]), perm=[0, 2, 1, 3])
    v = transpose(reshape(x @ wv, shape=[2, 8, 4, 4]), perm=[0, 2, 1, 3])
    p = softmax(q @ transpose(k, perm=[0, 1, 3, 2]) * 0.5 + mask)
    y = reshape(transpose(p @ v, perm=[0, 2, 1, 3]), shape=[2, 8, 16]) @ wo
    return mean((y - target) * (y - target))
}"""


@pytest.mark.heavy
def test_masked_attention_layer_recomputes_the_probabilities():
    """The gradient of a masked attention layer matches torch autograd, and the compiled joint
    graph has the three recomputing kernels and no kernel that writes the 8 x 8 probabilities."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    a = {n: (rng.standard_normal(s) * 0.5).astype(np.float32) for n, s in
         (("x", (2, 8, 16)), ("wq", (16, 16)), ("wk", (16, 16)), ("wv", (16, 16)), ("wo", (16, 16)),
          ("target", (2, 8, 16)))}
    a["mask"] = np.where(np.arange(8) < 6, 0.0, -1e9).astype(np.float32)[None, None, None, :].repeat(2, 0)
    a["mask"][1, ..., 3:] = -np.inf
    wrt = ["wq", "wk", "wv", "wo", "x"]
    mod = eqfuse.compile(MASKED, grad=wrt, verify=True)
    out = mod(**a)
    kinds = [p.kind for p in mod.layer.last.plans]
    assert kinds.count("attention_grad") == 3, kinds
    assert not [p.name for p in mod.layer.last.plans if p.kind != "view" and tuple(p.out_shape[-2:]) == (8, 8)]
    t = {n: torch.tensor(v, requires_grad=n in wrt) for n, v in a.items()}

    def heads(z):
        return z.reshape(2, 8, 4, 4).permute(0, 2, 1, 3)
    p = torch.softmax(heads(t["x"] @ t["wq"]) @ heads(t["x"] @ t["wk"]).transpose(-1, -2) * 0.5
                      + t["mask"], dim=-1)
    y = (p @ heads(t["x"] @ t["wv"])).permute(0, 2, 1, 3).reshape(2, 8, 16) @ t["wo"]
    loss = ((y - t["target"]) ** 2).mean()
    loss.backward()
    for name, g in zip(wrt, out[1:]):
        want = t[name].grad.numpy()
        assert np.abs(g - want).max() <= 1e-4 * max(np.abs(want).max(), 1e-3), name


def _joint_text(S: int, D: int) -> str:
    from eqfuse.frontend.load import load
    from eqfuse.grad.vjp import grad_graph
    from eqfuse.ir.printer import module_text

    src = f"""graph att(q: f32[2, {S}, {D}], k: f32[2, {S}, {D}], v: f32[2, {S}, {D}], t: f32[2, {S}, {D}]) {{
        y = softmax(q @ transpose(k, perm=[0, 2, 1]) * 0.125) @ v
        return mean((y - t) * (y - t))
    }}"""
    return module_text([grad_graph(load(src)[0], ["q", "k", "v"])])


@pytest.mark.parametrize("S, D, recompute", [(64, 8, True), (4, 256, False)])
def test_store_or_recompute_is_chosen_by_cost(S, D, recompute):
    """Long sequences and narrow heads: storing the S x S probabilities costs more bytes than
    recomputing them, so the gradients recompute; short sequences and wide heads: the other way.
    The report says how many bytes the gradients read of the forward pass."""
    from eqfuse import optimize
    from eqfuse.optimizer.optimize import report_text

    out = optimize(_joint_text(S, D), cost="memory")
    ops = {n.op for g in out.graphs for _, _, n in g.walk()}
    assert ("attention_dq" in ops and "attention_dk" in ops and "attention_dv" in ops) == recompute, ops
    assert ("softmax" in ops and ops & {"attention_dq", "attention_dk", "attention_dv"} == set()) != recompute
    r = out.report
    P = 4 * 2 * S * S
    assert r["saved_before"] >= P
    if recompute:  # every tensor the gradients read of the forward pass, but not P
        assert r["saved_after"] <= r["saved_before"] - P
    assert "#   saved for backward: " in report_text(r)
