"""Gradients of whole models against torch autograd (an MLP, a transformer encoder layer, a
ResNet basic block with training-form batch norm), each compiled gradient also checked against
the numpy reference of the joint graph (verify=True); and 20 SGD steps of examples/train_mlp.py
against the same steps in plain numpy."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import eqfuse

torch = pytest.importorskip("torch")
F = torch.nn.functional
ROOT = Path(__file__).resolve().parent.parent


def _close(ours, theirs, name):
    theirs = theirs.detach().numpy()
    # relative to the gradient's largest element; a gradient that is 0 in exact arithmetic (a key
    # bias under softmax) is rounding noise on both sides, held to 1e-7 absolute
    scale = max(float(np.abs(theirs).max()), 1e-3)
    err = float(np.abs(ours - theirs).max()) / scale
    assert ours.shape == theirs.shape and err < 1e-4, f"{name}: relative error {err:.2e}"


def _compare(src, torch_loss, wrt, arrays):
    mod = eqfuse.compile(src, grad=wrt, verify=True)
    out = mod(**arrays)
    grads = out[-len(wrt):]
    ts = {k: torch.tensor(v, requires_grad=k in wrt) for k, v in arrays.items()}
    loss = torch_loss(**ts)
    loss.backward()
    _close(out[0], loss, "loss")
    for name, g in zip(wrt, grads):
        _close(g, ts[name].grad, name)
    return mod


def _randn(rng, *shape, scale=1.0):
    return (rng.normal(0, 1, shape) * scale).astype(np.float32)


@pytest.mark.heavy  # (a few seconds: the whole suite runs it, the fast tier not)
def test_mlp_matches_torch():
    src = """graph mlp(x: f32[16, 12], w1: f32[12, 32], b1: f32[32], w2: f32[32, 5], b2: f32[5], t: f32[16, 5]) {
        h = gelu(x @ w1 + b1)
        return mean((tanh(h @ w2 + b2) - t) ** 2)
    }"""
    rng = np.random.default_rng(0)
    a = dict(x=_randn(rng, 16, 12), w1=_randn(rng, 12, 32, scale=0.3), b1=_randn(rng, 32), w2=_randn(rng, 32, 5, scale=0.2),
             b2=_randn(rng, 5), t=_randn(rng, 16, 5))

    def ref(x, w1, b1, w2, b2, t):
        return ((torch.tanh(F.gelu(x @ w1 + b1) @ w2 + b2) - t) ** 2).mean()
    _compare(src, ref, ["w1", "b1", "w2", "b2", "x"], a)


ENCODER = """graph encoder(x: f32[2, 8, 16], wq: f32[16, 16], bq: f32[16], wk: f32[16, 16], bk: f32[16],
                   wv: f32[16, 16], bv: f32[16], wo: f32[16, 16], bo: f32[16], g1: f32[16], be1: f32[16],
                   w1: f32[16, 32], b1: f32[32], w2: f32[32, 16], b2: f32[16], g2: f32[16], be2: f32[16],
                   target: f32[2, 8, 16]) {
    q = transpose(reshape(x @ wq + bq, shape=[2, 8, 2, 8]), perm=[0, 2, 1, 3])
    k = transpose(reshape(x @ wk + bk, shape=[2, 8, 2, 8]), perm=[0, 2, 1, 3])
    v = transpose(reshape(x @ wv + bv, shape=[2, 8, 2, 8]), perm=[0, 2, 1, 3])
    p = softmax(q @ transpose(k, perm=[0, 1, 3, 2]) * 0.35355339059327373)
    o = reshape(transpose(p @ v, perm=[0, 2, 1, 3]), shape=[2, 8, 16])
    h1 = layernorm(x + o @ wo + bo, g1, be1)
    y = layernorm(h1 + gelu(h1 @ w1 + b1) @ w2 + b2, g2, be2)
    return mean((y - target) * (y - target)), y
}"""


def _encoder_torch(x, wq, bq, wk, bk, wv, bv, wo, bo, g1, be1, w1, b1, w2, b2, g2, be2, target):
    def heads(t):
        return t.reshape(2, 8, 2, 8).permute(0, 2, 1, 3)
    q, k, v = heads(x @ wq + bq), heads(x @ wk + bk), heads(x @ wv + bv)
    p = torch.softmax(q @ k.transpose(-1, -2) * 0.35355339059327373, dim=-1)
    o = (p @ v).permute(0, 2, 1, 3).reshape(2, 8, 16)
    h1 = F.layer_norm(x + o @ wo + bo, (16,), g1, be1)
    y = F.layer_norm(h1 + F.gelu(h1 @ w1 + b1) @ w2 + b2, (16,), g2, be2)
    return ((y - target) ** 2).mean()


# (the suite's budget: the MLP here, and attention's gradients in test_attention_grad.py, in the default
# run)
@pytest.mark.extended
def test_transformer_encoder_layer_matches_torch():
    rng = np.random.default_rng(1)
    shapes = {"x": (2, 8, 16), "target": (2, 8, 16), "w1": (16, 32), "b1": (32,), "w2": (32, 16)}
    names = ["x", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo", "g1", "be1", "w1", "b1", "w2", "b2", "g2", "be2", "target"]
    a = {n: _randn(rng, *shapes.get(n, (16, 16) if n.startswith("w") else (16,)), scale=0.4 if n.startswith("w") else 1.0)
         for n in names}
    a["g1"], a["g2"] = a["g1"] * 0.2 + 1, a["g2"] * 0.2 + 1
    wrt = [n for n in names if n not in ("x", "target")] + ["x"]
    _compare(ENCODER, _encoder_torch, wrt, a)


BLOCK = """graph block(x: f32[2, 4, 6, 6], w1: f32[4, 4, 3, 3], g1: f32[4], b1: f32[4],
                 w2: f32[4, 4, 3, 3], g2: f32[4], b2: f32[4]) {
    c1 = conv2d(x, w1, padding=1)
    m1 = mean(c1, axis=[0, 2, 3], keepdims=true)
    v1 = mean((c1 - m1) * (c1 - m1), axis=[0, 2, 3], keepdims=true)
    h = relu((c1 - m1) * rsqrt(v1 + 1e-5) * reshape(g1, shape=[1, 4, 1, 1]) + reshape(b1, shape=[1, 4, 1, 1]))
    c2 = conv2d(h, w2, padding=1)
    m2 = mean(c2, axis=[0, 2, 3], keepdims=true)
    v2 = mean((c2 - m2) * (c2 - m2), axis=[0, 2, 3], keepdims=true)
    out = relu((c2 - m2) * rsqrt(v2 + 1e-5) * reshape(g2, shape=[1, 4, 1, 1]) + reshape(b2, shape=[1, 4, 1, 1]) + x)
    return mean(out * out), out
}"""


@pytest.mark.extended  # (the suite's budget: conv gradients are checked op by op in the default run)
def test_resnet_basic_block_matches_torch():
    rng = np.random.default_rng(2)
    a = dict(x=_randn(rng, 2, 4, 6, 6), w1=_randn(rng, 4, 4, 3, 3, scale=0.3), g1=1 + _randn(rng, 4, scale=0.1),
             b1=_randn(rng, 4, scale=0.1), w2=_randn(rng, 4, 4, 3, 3, scale=0.3), g2=1 + _randn(rng, 4, scale=0.1),
             b2=_randn(rng, 4, scale=0.1))

    def ref(x, w1, g1, b1, w2, g2, b2):
        h = F.relu(F.batch_norm(F.conv2d(x, w1, padding=1), None, None, g1, b1, training=True, eps=1e-5))
        out = F.relu(F.batch_norm(F.conv2d(h, w2, padding=1), None, None, g2, b2, training=True, eps=1e-5) + x)
        return (out * out).mean()
    _compare(BLOCK, ref, ["w1", "g1", "b1", "w2", "g2", "b2", "x"], a)


def _train_module():
    spec = importlib.util.spec_from_file_location("train_mlp", ROOT / "examples" / "train_mlp.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _numpy_step(p, x, labels, lr):
    """The same SGD step, forward and backward written out in numpy."""
    onehot = np.eye(3, dtype=np.float32)[labels]
    z1 = x @ p["w1"] + p["b1"]
    h = np.maximum(z1, 0)
    logits = h @ p["w2"] + p["b2"]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    prob = e / e.sum(axis=1, keepdims=True)
    dlogits = (prob - onehot) / len(x)
    dz1 = (dlogits @ p["w2"].T) * (z1 > 0)
    grads = {"w1": x.T @ dz1, "b1": dz1.sum(0), "w2": h.T @ dlogits, "b2": dlogits.sum(0)}
    for k, g in grads.items():
        p[k] -= np.float32(lr) * g.astype(np.float32)


@pytest.mark.heavy  # (a few seconds: the whole suite runs it, the fast tier not)
def test_train_mlp_matches_numpy_sgd():
    tm = _train_module()
    rng = np.random.default_rng(0)
    x, y = tm.spiral(64, rng)
    params = tm.init_params(rng)
    ref = {k: v.copy() for k, v in params.items()}
    step = tm.compile_step(32)
    losses = []
    for s in range(20):
        idx = np.random.default_rng(s).permutation(len(x))[:32]
        loss, _ = tm.sgd_step(step, params, x[idx], y[idx], 0.5)
        _numpy_step(ref, x[idx], y[idx], 0.5)
        losses.append(loss)
    for k in params:
        np.testing.assert_allclose(params[k], ref[k], rtol=1e-4, atol=1e-4, err_msg=k)
    assert np.mean(losses[-5:]) < np.mean(losses[:5])  # it learns


@pytest.mark.heavy  # (a few seconds: the whole suite runs it, the fast tier not)
def test_pooling_and_gather_elements_match_torch():
    # conv, max pool (3x3, stride 2, padding 1: ResNet's stem), avg pool, a class pick by
    # gather_elements (a cross-entropy's -log p[label])
    src = """graph net(x: f32[2, 3, 9, 9], w: f32[4, 3, 3, 3], lab: i64[2, 1]) {
        h = max_pool2d(relu(conv2d(x, w, padding=1)), kernel_size=3, stride=2, padding=1)
        a = avg_pool2d(h, kernel_size=2, stride=1)
        z = reshape(a, shape=[2, 64])
        p = softmax(z, axis=-1)
        return -mean(log(gather_elements(p, lab, axis=1)))
    }"""
    rng = np.random.default_rng(3)
    a = dict(x=_randn(rng, 2, 3, 9, 9), w=_randn(rng, 4, 3, 3, 3, scale=0.4), lab=np.array([[5], [60]], np.int64))

    def ref(x, w, lab):
        h = F.max_pool2d(F.relu(F.conv2d(x, w, padding=1)), 3, 2, 1)
        z = F.avg_pool2d(h, 2, 1).reshape(2, 64)
        return -torch.log(torch.gather(torch.softmax(z, -1), 1, lab)).mean()
    _compare(src, ref, ["w", "x"], a)
