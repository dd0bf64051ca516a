"""`@eqfuse.jit` and `eqfuse.numpy`: traced functions match numpy; the cache; errors at the user's line."""

from __future__ import annotations

import numpy as np
import pytest

import eqfuse
import eqfuse.numpy as enp
from eqfuse.trace.tracer import DataDependentError

HERE = __file__


def rand(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def close(a, b, tol=1e-4):
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_mlp_matches_numpy_and_shows_its_graph():
    @eqfuse.jit
    def mlp(x, w1, b1, w2, b2):
        return enp.relu(x @ w1 + b1) @ w2 + b2

    x, w1, b1, w2, b2 = rand(8, 32), rand(32, 64, seed=1), rand(64, seed=2), rand(64, 10, seed=3), rand(10, seed=4)
    close(mlp(x, w1, b1, w2, b2), np.maximum(x @ w1 + b1, 0) @ w2 + b2)
    assert mlp.graph.splitlines() == [
        "graph mlp(x: f32[8, 32], w1: f32[32, 64], b1: f32[64], w2: f32[64, 10], b2: f32[10]) -> f32[8, 10] {",
        "    return relu(x @ w1 + b1) @ w2 + b2",
        "}"]
    report = mlp.explain()
    assert "# report for graph mlp" in report and "kernels:    5 -> 2" in report
    assert "# boundaries of graph mlp" in report


def test_layernorm_written_out_is_one_layernorm_kernel():
    @eqfuse.jit
    def ln(x, g, b):
        mu = enp.mean(x, axis=-1, keepdims=True)
        var = enp.mean((x - mu) ** 2, axis=-1, keepdims=True)
        return (x - mu) / enp.sqrt(var + 1e-5) * g + b

    x, g, b = rand(16, 64), rand(64, seed=1), rand(64, seed=2)
    mu = x.mean(-1, keepdims=True)
    close(ln(x, g, b), (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b)
    assert "kernels:    10 -> 1" in ln.explain()


def attention_numpy(x, wqkv, wo, heads):
    S, D = x.shape
    qkv = x @ wqkv
    split = lambda t: t.reshape(S, heads, D // heads).transpose(1, 0, 2)  # noqa: E731
    q, k, v = split(qkv[:, :D]), split(qkv[:, D:2 * D]), split(qkv[:, 2 * D:])
    s = q @ k.transpose(0, 2, 1) / np.sqrt(D // heads)
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    return (p @ v).transpose(1, 0, 2).reshape(S, D) @ wo, p[0, :, None, ...].sum(-1)


@pytest.mark.heavy
def test_attention_with_slicing_reshapes_and_a_static_argument():
    @eqfuse.jit
    def attention(x, wqkv, wo, heads):
        S, D = x.shape
        qkv = x @ wqkv
        split = lambda t: enp.transpose(enp.reshape(t, (S, heads, D // heads)), (1, 0, 2))  # noqa: E731
        q, k, v = split(qkv[:, :D]), split(qkv[:, D:2 * D]), split(qkv[:, 2 * D:])
        p = enp.softmax(q @ k.transpose(0, 2, 1) / np.sqrt(D // heads), axis=-1)
        return enp.reshape(enp.transpose(p @ v, (1, 0, 2)), (S, D)) @ wo, p[0, :, None, ...].sum(axis=-1)

    x, wqkv, wo = rand(16, 32, scale=0.3), rand(32, 96, seed=1, scale=0.3), rand(32, 32, seed=2, scale=0.3)
    for heads in (4, 2):
        got, want = attention(x, wqkv, wo, heads), attention_numpy(x, wqkv, wo, heads)
        assert isinstance(got, tuple) and len(got) == 2
        close(got[0], want[0])
        close(got[1], want[1])
    assert attention.traces == 2  # the static argument is part of the signature


def test_the_cache_traces_once_per_signature():
    calls = []

    @eqfuse.jit
    def f(x, y):
        calls.append(x.shape)
        return enp.tanh(x) * 2 - y

    x, y = rand(4, 8), rand(4, 8, seed=1)
    close(f(x, y), np.tanh(x) * 2 - y)
    close(f(x + 1, y), np.tanh(x + 1) * 2 - y)  # same signature: the compiled graph, not Python
    assert f.traces == 1 and calls == [(4, 8)]
    f(rand(5, 8), rand(5, 8))  # a new shape traces again
    f(x.astype(np.int64).astype(np.float32), y)
    assert f.traces == 2 and calls == [(4, 8), (5, 8)]
    with pytest.raises(eqfuse.EqfuseError, match="tanh needs f32 tensors, got i64"):
        f(x.astype(np.int64), y)  # a new dtype traces again (and i64 is refused by tanh)


def test_numpy_names_containers_and_closed_over_arrays():
    w = rand(8, 3, seed=5)

    @eqfuse.jit
    def f(params, x):
        h = enp.concatenate([x, np.exp(x)], axis=1)[:, ::2]  # a numpy ufunc on a traced array
        z = enp.where(h > 0, h, 0.1 * h) @ w + params["b"]
        return {"z": z, "m": enp.maximum(z, params["floor"]).T, "s": enp.sum(z, axis=0, keepdims=True)}

    x, params = rand(4, 8), {"b": rand(3, seed=1), "floor": rand(1, seed=2)}
    out = f(params, x)
    h = np.concatenate([x, np.exp(x)], axis=1)[:, ::2]
    z = np.where(h > 0, h, 0.1 * h) @ w + params["b"]
    close(out["z"], z)
    close(out["m"], np.maximum(z, params["floor"]).T)
    close(out["s"], z.sum(0, keepdims=True))
    assert "params_b: f32[3]" in f.graph and "c0: f32[8, 3]" in f.graph


def test_integer_index_arrays_gather():
    @eqfuse.jit
    def embed(table, ids):
        return table[ids] + table[np.array([0, 2])].sum(axis=0)

    table, ids = rand(10, 4), np.array([[1, 9], [3, 3]], dtype=np.int64)
    close(embed(table, ids), table[ids] + table[[0, 2]].sum(0))


def test_functions_run_eagerly_on_numpy_arrays():
    x = np.array([[-1.0, 2.0, 0.5]], dtype=np.float32)
    close(enp.relu(x), np.maximum(x, 0))
    close(enp.softmax(x, axis=-1), np.exp(x) / np.exp(x).sum())
    close(enp.sum(x, 1), x.sum(1))


def _line_of(text: str) -> int:
    return next(i for i, ln in enumerate(open(HERE).read().splitlines(), 1) if ln.strip().endswith(text))


@pytest.mark.parametrize("body, what", [
    ("if x.sum() > 0:", "bool()"),
    ("n = int(x[0, 0])", "int()"),
    ("n = float(x.max())", "float()"),
    ("n = range(x[0, 0])", "use as a Python index"),
])
def test_data_dependent_control_flow_names_the_users_line(body, what):
    def f(x):
        if body.startswith("if"):
            if x.sum() > 0:
                return x
            return -x
        if body.startswith("n = int"):
            n = int(x[0, 0])
        elif body.startswith("n = float"):
            n = float(x.max())
        else:
            n = range(x[0, 0])
        return x * n

    with pytest.raises(DataDependentError) as e:
        eqfuse.jit(f)(rand(2, 3))
    msg = str(e.value)
    assert msg.startswith(f"{HERE}:{_line_of(body)}:"), msg
    assert f"data-dependent control flow: {what}" in msg
    assert "enp.where" in msg
    assert body.strip() in msg  # the line itself, under it the caret


def test_shape_errors_name_the_users_line():
    @eqfuse.jit
    def f(x, w):
        return enp.relu(x @ w)  # the bad line

    with pytest.raises(eqfuse.EqfuseError) as e:
        f(rand(4, 8), rand(4, 8))
    msg = str(e.value)
    assert msg.startswith(f"{HERE}:{_line_of('# the bad line')}:")
    assert "matmul inner dimensions differ: [4, 8] @ [4, 8]" in msg and "^" in msg


@pytest.mark.parametrize("call, message", [
    (lambda x: x[::-1], "negative step"),
    (lambda x: x[0, 0, 0], "too many indices"),
    (lambda x: x[5], "index 5 is out of bounds"),
    (lambda x: x[x > 0], "boolean mask"),
    (lambda x: enp.softmax(x, axis=3), "axis 3 is out of range"),
    (lambda x: enp.softmax(x, dim=1), "softmax has no attribute dim="),
    (lambda x: enp.astype(x, np.complex64), "unknown dtype"),
    (lambda x: np.linalg.inv(x), "numpy.inv cannot run on a traced array"),
    (lambda x: "not an array", "must return traced arrays"),
])
def test_bad_uses_are_one_clear_error(call, message):
    with pytest.raises(eqfuse.EqfuseError, match=message):
        eqfuse.jit(call)(rand(2, 3))


def test_jit_options_go_to_compile():
    @eqfuse.jit(verify=True, threads=1)
    def f(x):
        return enp.gelu(x, approximate="tanh") + enp.var(x, axis=1, keepdims=True)

    x = rand(4, 16)
    from eqfuse.ir.ops import OPS

    want = OPS["gelu"].numpy([x], {"approximate": "tanh"}) + x.var(1, keepdims=True)
    close(f(x), want)
