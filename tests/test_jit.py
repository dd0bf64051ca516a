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


X, Y = rand(3, 4), rand(3, 4, seed=1)
ORDER = np.argsort(X, axis=1)
# numpy's names in eqfuse.numpy, each beside the numpy call it stands for (same result, dtype and shape)
NUMPY_NAMES = [
    ("std", lambda: enp.std(X, 1, keepdims=True), lambda: np.std(X, 1, keepdims=True)),
    ("swapaxes", lambda: enp.swapaxes(X[None], 0, 2), lambda: np.swapaxes(X[None], 0, 2)),
    ("permute_dims", lambda: enp.permute_dims(X[None], (2, 0, 1)), lambda: np.transpose(X[None], (2, 0, 1))),
    ("transpose", lambda: enp.transpose(X), lambda: X.T),
    ("concat of a list", lambda: enp.concat([X, Y], axis=1), lambda: np.concatenate([X, Y], 1)),
    ("concat of arrays", lambda: enp.concat(X, Y), lambda: np.concatenate([X, Y])),
    ("stack", lambda: enp.stack([X, Y], axis=1), lambda: np.stack([X, Y], 1)),
    ("expand_dims", lambda: enp.expand_dims(X, 1), lambda: np.expand_dims(X, 1)),
    ("broadcast_to", lambda: enp.broadcast_to(X[:1], (3, 4)), lambda: np.broadcast_to(X[:1], (3, 4))),
    ("reshape to an int", lambda: enp.reshape(X, 12), lambda: X.reshape(12)),
    ("astype", lambda: enp.astype(X * 3, np.int32), lambda: (X * 3).astype(np.int32)),
    ("clip", lambda: enp.clip(X, -0.5, 0.5), lambda: np.clip(X, -0.5, 0.5)),
    ("clip below", lambda: enp.clip(X, a_min=0.0), lambda: np.maximum(X, np.float32(0))),
    ("square", lambda: enp.square(X), lambda: np.square(X)),
    ("reciprocal", lambda: enp.reciprocal(Y), lambda: np.reciprocal(Y)),
    ("dot", lambda: enp.dot(X, Y.T), lambda: np.dot(X, Y.T)),
    ("cumsum flat", lambda: enp.cumsum(X), lambda: np.cumsum(X)),
    ("cumulative_sum", lambda: enp.cumulative_sum(X, axis=1), lambda: np.cumsum(X, 1)),
    ("argmax flat", lambda: enp.argmax(X), lambda: np.argmax(X)),
    ("argmax", lambda: enp.argmax(X, axis=1, keepdims=True), lambda: np.argmax(X, 1, keepdims=True)),
    ("take flat", lambda: enp.take(X, np.array([[0, 11]])), lambda: np.take(X, [[0, 11]])),
    ("take", lambda: enp.take(X, np.array([3, 1]), axis=1), lambda: np.take(X, [3, 1], axis=1)),
    ("take_along_axis", lambda: enp.take_along_axis(X, ORDER, 1), lambda: np.take_along_axis(X, ORDER, 1)),
    ("take_along_axis flat", lambda: enp.take_along_axis(X, np.array([11, 0]), None),
     lambda: np.take_along_axis(X, np.array([11, 0]), None)),
    ("arange", lambda: enp.arange(5), lambda: np.arange(5)),
    ("arange by 3", lambda: enp.arange(2, 11, 3, dtype=np.int32), lambda: np.arange(2, 11, 3, dtype=np.int32)),
    ("arange of floats", lambda: enp.arange(0, 4, dtype="f32"), lambda: np.arange(0, 4, dtype=np.float32)),
    ("full", lambda: enp.full((2, 3), 7, dtype=np.int64), lambda: np.full((2, 3), 7, np.int64)),
    ("zeros", lambda: enp.zeros(3), lambda: np.zeros(3, np.float32)),
    ("ones", lambda: enp.ones((2, 2), dtype="bool"), lambda: np.ones((2, 2), bool)),
    ("full_like", lambda: enp.full_like(X, 2.5), lambda: np.full_like(X, 2.5)),
    ("zeros_like", lambda: enp.zeros_like(X, dtype=np.int32), lambda: np.zeros_like(X, np.int32)),
    ("ones_like", lambda: enp.ones_like(X), lambda: np.ones_like(X)),
    ("pad", lambda: enp.pad(X, ((1, 0), (2, 1)), constant_values=-1), lambda: np.pad(X, ((1, 0), (2, 1)), constant_values=-1)),
    ("pad by one", lambda: enp.pad(X, 1), lambda: np.pad(X, 1)),
    ("log_softmax", lambda: enp.log_softmax(X, 1), lambda: X - np.log(np.exp(X).sum(1, keepdims=True))),
    ("amax", lambda: enp.amax(X, 0), lambda: np.amax(X, 0)),
    ("amin", lambda: enp.amin(X, keepdims=True), lambda: np.amin(X, keepdims=True)),
    ("prod", lambda: enp.prod(X, 1), lambda: np.prod(X, 1)),
    ("subtract", lambda: enp.subtract(X, Y), lambda: np.subtract(X, Y)),
    ("power", lambda: enp.power(np.abs(X), Y), lambda: np.power(np.abs(X), Y)),
    ("greater_equal", lambda: enp.greater_equal(X, Y), lambda: np.greater_equal(X, Y)),
]


def test_numpy_names_run_eagerly_as_numpy():
    """Outside a trace each numpy name of eqfuse.numpy gives numpy's values, dtype and shape."""
    for name, ours, theirs in NUMPY_NAMES:
        got, want = np.asarray(ours()), np.asarray(theirs())
        assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, got.shape, want.dtype, want.shape)
        close(got, want)


@pytest.mark.heavy  # (the fast tier's time)
def test_numpy_names_traced_match_numpy():
    """The same names recorded in a trace and compiled; clip's array bounds become maximum and
    minimum (the clip op takes numbers)."""
    @eqfuse.jit
    def f(x, y, lo, hi):
        s = enp.stack([enp.clip(x, lo, hi), enp.clip(y, a_max=hi)], axis=0)
        return enp.log_softmax(s, -1) + enp.std(x, 1, keepdims=True), enp.take_along_axis(x, ORDER, 1)

    lo, hi = rand(3, 1, seed=2) - 1, rand(1, 4, seed=3) + 1
    s, taken = f(X, Y, lo, hi)
    t = np.stack([np.clip(X, lo, hi), np.minimum(Y, hi)])
    close(s, t - t.max(-1, keepdims=True) - np.log(np.exp(t - t.max(-1, keepdims=True)).sum(-1, keepdims=True))
          + X.std(1, keepdims=True))
    close(taken, np.take_along_axis(X, ORDER, 1))
    assert "maximum(" in f.graph and "minimum(" in f.graph


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
    (lambda x: enp.astype(x, "half a float"), "unknown dtype 'half a float': eqfuse has float32"),
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
