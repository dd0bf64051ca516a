"""The numpy reference against hand-written numpy: every example model, every op, and its API.

The hand-written versions compute in float64 from the textbook formulas, so they share no code
with eqfuse.ops; the reference (float32) must agree within a float32-sized tolerance.
"""

import math

import numpy as np
import pytest
from helpers import ROOT, one_graph, rand_inputs, run

import eqfuse
from eqfuse.errors import ArgumentError
from eqfuse.ir.ops import OPS

RTOL, ATOL = 1e-4, 1e-4
erf = np.vectorize(math.erf, otypes=[np.float64])


def close(got, want, rtol=RTOL, atol=ATOL):
    assert got.dtype == np.float32
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def f64(arrays):
    return [a.astype(np.float64) for a in arrays]


def scaled_inputs(graph, dims, seed):
    """Random inputs with weights scaled by 1/sqrt(fan_in), and positive variances, as in a real model."""
    xs = rand_inputs(graph, dims, seed)
    for i, (name, t) in enumerate(graph.params):
        if name == "var":
            xs[i] = np.abs(xs[i]) + np.float32(0.5)
        elif t.rank >= 2 and name != "x":
            fan_in = int(np.prod(xs[i].shape[1:])) if t.rank == 4 else xs[i].shape[0]
            xs[i] = (xs[i] / np.float32(math.sqrt(fan_in))).astype(np.float32)
    return xs


# ---------------------------------------------------------------- the example models by hand


def relu(x):
    return np.maximum(x, 0)


def layernorm(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps) * g + b


def mlp(x, w1, b1, w2, b2):
    return relu(x @ w1 + b1) @ w2 + b2


def mlp3(x, w1, b1, w2, b2, w3, b3):
    return relu(relu(x @ w1 + b1) @ w2 + b2) @ w3 + b3


def encoder(x, wq, bq, wk, bk, wv, bv, wo, bo, g1, be1, w1, b1, w2, b2, g2, be2, heads=4):
    batch, seq, width = x.shape
    d = width // heads

    def split(t):  # [B, S, H*D] -> [B, H, S, D]
        return t.reshape(batch, seq, heads, d).transpose(0, 2, 1, 3)

    q, k, v = split(x @ wq + bq), split(x @ wk + bk), split(x @ wv + bv)
    scores = np.einsum("bhsd,bhtd->bhst", q, k) / math.sqrt(d)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    attn = np.einsum("bhst,bhtd->bhsd", p, v).transpose(0, 2, 1, 3).reshape(batch, seq, width)
    h = layernorm(x + attn @ wo + bo, g1, be1)
    u = h @ w1 + b1
    f = (0.5 * u * (1 + erf(u / math.sqrt(2)))) @ w2 + b2
    return layernorm(h + f, g2, be2)


def conv2d_loops(x, w, bias=None, stride=(1, 1), padding=(0, 0)):
    """Direct convolution: one shifted, strided window of the padded input per kernel tap."""
    (sh, sw), (ph, pw) = stride, padding
    n, c, hh, ww = x.shape
    o, _, kh, kw = w.shape
    ho, wo = (hh + 2 * ph - kh) // sh + 1, (ww + 2 * pw - kw) // sw + 1
    xp = np.zeros((n, c, hh + 2 * ph, ww + 2 * pw))
    xp[:, :, ph:ph + hh, pw:pw + ww] = x
    out = np.zeros((n, o, ho, wo))
    for i in range(kh):
        for j in range(kw):
            window = xp[:, :, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw]
            out += np.einsum("nchw,oc->nohw", window, w[:, :, i, j])
    return out if bias is None else out + bias[None, :, None, None]


def conv1d_loops(x, w, stride=1, padding=0, dilation=1, group=1):
    """A 1-d convolution by its definition: each output element a sum over its group's channels
    and the dilated taps of the zero-padded input."""
    n, c, length = x.shape
    o, cg, k = w.shape
    og = o // group
    xp = np.zeros((n, c, length + 2 * padding))
    xp[:, :, padding:padding + length] = x
    lo = (length + 2 * padding - dilation * (k - 1) - 1) // stride + 1
    out = np.zeros((n, o, lo))
    for b in range(n):
        for oc in range(o):
            g = oc // og
            for t in range(lo):
                out[b, oc, t] = sum(xp[b, g * cg + ci, t * stride + j * dilation] * w[oc, ci, j]
                                    for ci in range(cg) for j in range(k))
    return out


def conv_transpose2d_loops(x, w, stride=(1, 1), padding=(0, 0), output_padding=(0, 0), group=1):
    """A transposed convolution by its definition: every input pixel adds its value times its
    group's filters into the output window at stride x pixel - padding."""
    n, c, hh, ww = x.shape
    _, og, kh, kw = w.shape
    cg = c // group
    (sh, sw), (ph, pw), (oph, opw) = stride, padding, output_padding
    ho, wo = (hh - 1) * sh - 2 * ph + kh + oph, (ww - 1) * sw - 2 * pw + kw + opw
    full = np.zeros((n, og * group, (hh - 1) * sh + kh + oph, (ww - 1) * sw + kw + opw))
    for b in range(n):
        for ci in range(c):
            g = ci // cg
            for i in range(hh):
                for j in range(ww):
                    full[b, g * og:(g + 1) * og, i * sh:i * sh + kh, j * sw:j * sw + kw] += x[b, ci, i, j] * w[ci]
    return full[:, :, ph:ph + ho, pw:pw + wo]


def conv_bn_relu(x, w, mean, var, gamma, beta):
    y = conv2d_loops(x, w, padding=(1, 1))
    c = (slice(None), None, None)
    return relu((y - mean[c]) / np.sqrt(var[c] + 1e-5) * gamma[c] + beta[c])


def chain(a, b, c):
    t = relu(a * b + c)
    u = 1 / (1 + np.exp(-t)) * np.tanh(c) - 0.5
    return np.exp(-u * u) / (1 + np.abs(t))


def mlp_train(x, onehot, w1, b1, w2, b2):
    """examples/mlp_train.g: the loss (softmax cross-entropy) and the logits; the loss first."""
    logits = relu(x @ w1 + b1) @ w2 + b2
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return -np.mean(np.sum(onehot * np.log(e / e.sum(axis=1, keepdims=True)), axis=-1))


MODELS = [("mlp.g", mlp, {"B": 3}), ("mlp_train.g", mlp_train, {"B": 3}), ("mlp3.g", mlp3, {"B": 3}), ("transformer.g", encoder, {"B": 2}),
          ("conv_bn_relu.g", conv_bn_relu, {"N": 2}), ("elementwise.g", chain, {"N": 1000})]


@pytest.mark.parametrize("file, by_hand, dims", MODELS, ids=[m[0] for m in MODELS])
def test_example_models_match_numpy_written_by_hand(file, by_hand, dims):
    ref = eqfuse.reference(str(ROOT / "examples" / file))
    xs = scaled_inputs(ref.default, dims, seed=7)
    got = ref(*xs)
    close(got[0] if isinstance(got, tuple) else got, by_hand(*f64(xs)))


def test_every_example_is_covered():
    assert sorted(m[0] for m in MODELS) == sorted(p.name for p in (ROOT / "examples").glob("*.g"))


# ---------------------------------------------------------------- every op by hand

SQRT_2_PI = math.sqrt(2 / math.pi)
OP_SEMANTICS = {
    # op: (parameter types, call text, float64 numpy by hand); x, y are standard normal, p is positive
    "neg": ("x: f32[3, 4]", "neg(x)", lambda x: -x),
    "abs": ("x: f32[3, 4]", "abs(x)", np.abs),
    "relu": ("x: f32[3, 4]", "relu(x)", lambda x: np.where(x > 0, x, 0)),
    "sigmoid": ("x: f32[3, 4]", "sigmoid(x)", lambda x: 1 / (1 + np.exp(-x))),
    "tanh": ("x: f32[3, 4]", "tanh(x)", lambda x: (np.exp(2 * x) - 1) / (np.exp(2 * x) + 1)),
    "exp": ("x: f32[3, 4]", "exp(x)", lambda x: np.e ** x),
    "log": ("p: f32[3, 4]", "log(p)", np.log),
    "sqrt": ("p: f32[3, 4]", "sqrt(p)", lambda p: p ** 0.5),
    "rsqrt": ("p: f32[3, 4]", "rsqrt(p)", lambda p: p ** -0.5),
    "erf": ("x: f32[3, 4]", "erf(x)", erf),
    "silu": ("x: f32[3, 4]", "silu(x)", lambda x: x / (1 + np.exp(-x))),
    # sin and cos through Euler's formula; sign, ceil and floor by comparisons and int rounding
    "sin": ("x: f32[3, 4]", "sin(x)", lambda x: np.imag(np.exp(1j * x))),
    "cos": ("x: f32[3, 4]", "cos(x)", lambda x: np.real(np.exp(1j * x))),
    "sign": ("x: f32[3, 4]", "sign(x)", lambda x: (x > 0).astype(float) - (x < 0)),
    "ceil": ("x: f32[3, 4]", "ceil(3 * x)", lambda x: np.array([-int(-v // 1) for v in (3 * x).flat]).reshape(x.shape)),
    "floor": ("x: f32[3, 4]", "floor(3 * x)", lambda x: np.array([int(v // 1) for v in (3 * x).flat]).reshape(x.shape)),
    # halves to even by Python's round; the rest by math's functions, element by element
    "round": ("x: f32[3, 4]", "round(2 * x) + round(x * 0 + 2.5) + round(x * 0 - 0.5)",
              lambda x: np.vectorize(round)(2 * x) + 2.0 - 0.0),
    **{op: ("x: f32[3, 4]", f"{op}({arg})", (lambda fn, g: lambda x: np.vectorize(fn)(g(x)))(getattr(math, op), g))
       for op, arg, g in [("tan", "x", lambda x: x), ("asin", "x * 0.3", lambda x: x * 0.3),
                          ("acos", "x * 0.3", lambda x: x * 0.3), ("atan", "x", lambda x: x),
                          ("sinh", "x", lambda x: x), ("cosh", "x", lambda x: x), ("asinh", "x", lambda x: x),
                          ("acosh", "abs(x) + 1", lambda x: abs(x) + 1), ("atanh", "x * 0.3", lambda x: x * 0.3),
                          ("expm1", "x", lambda x: x), ("log1p", "abs(x)", lambda x: abs(x))]},
    "gelu": ("x: f32[3, 4]", "gelu(x) - gelu(x, approximate=\"tanh\")",
             lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))) - 0.5 * x * (1 + np.tanh(SQRT_2_PI * (x + 0.044715 * x ** 3)))),
    "add": ("x: f32[3, 4], y: f32[4]", "add(x, y)", lambda x, y: x + y),
    "sub": ("x: f32[3, 4], y: f32[3, 1]", "sub(x, y)", lambda x, y: x - y),
    "mul": ("x: f32[3, 4], y: f32", "mul(x, y)", lambda x, y: x * y),
    "div": ("x: f32[3, 4], p: f32[4]", "div(x, p)", lambda x, p: x / p),
    "pow": ("p: f32[3, 4], y: f32[4]", "pow(p, y)", lambda p, y: np.exp(y * np.log(p))),
    "maximum": ("x: f32[3, 4], y: f32[4]", "maximum(x, y)", lambda x, y: np.where(x > y, x, y)),
    "minimum": ("x: f32[3, 4], y: f32[4]", "minimum(x, y)", lambda x, y: np.where(x < y, x, y)),
    "floordiv": ("x: f32[3, 4], p: f32[4]", "floordiv(x, p)", lambda x, p: np.floor(x / p)),
    "mod": ("x: f32[3, 4], p: f32[4]", "mod(x, p)", lambda x, p: x - np.floor(x / p) * p),
    "matmul": ("x: f32[2, 3, 4], y: f32[4, 5]", "matmul(x, y)",
               lambda x, y: np.array([[[sum(x[b, i, k] * y[k, j] for k in range(4)) for j in range(5)]
                                       for i in range(3)] for b in range(2)])),
    "conv2d": ("x: f32[2, 3, 7, 6], y: f32[4, 3, 3, 2], p: f32[4]", "conv2d(x, y, p, stride=[2, 1], padding=[1, 0])",
               lambda x, y, p: conv2d_loops(x, y, p, stride=(2, 1), padding=(1, 0))),
    "conv1d": ("x: f32[2, 4, 11], y: f32[6, 2, 3]", "conv1d(x, y, stride=2, padding=1, dilation=2, group=2)",
               lambda x, y: conv1d_loops(x, y, stride=2, padding=1, dilation=2, group=2)),
    "conv_transpose2d": ("x: f32[1, 4, 3, 4], y: f32[4, 3, 3, 2]",
                         "conv_transpose2d(x, y, stride=2, padding=1, output_padding=[1, 0], group=2)",
                         lambda x, y: conv_transpose2d_loops(x, y, (2, 2), (1, 1), (1, 0), group=2)),
    "sum": ("x: f32[3, 4, 5]", "sum(x, axis=[0, 2])", lambda x: np.einsum("ijk->j", x)),
    "mean": ("x: f32[3, 4, 5]", "mean(x, axis=-1, keepdims=true)", lambda x: x.sum(-1, keepdims=True) / 5),
    "max": ("x: f32[3, 4, 5]", "max(x, axis=1)", lambda x: np.maximum(np.maximum(x[:, 0], x[:, 1]), np.maximum(x[:, 2], x[:, 3]))),
    "softmax": ("x: f32[3, 4]", "softmax(x, axis=0)", lambda x: np.exp(x) / np.exp(x).sum(0)),
    "layernorm": ("x: f32[2, 3, 4], y: f32[3, 4], p: f32[3, 4]", "layernorm(x, y, p, axis=1, eps=0.01)",
                  lambda x, y, p: (x - x.mean((1, 2), keepdims=True)) / np.sqrt(x.var((1, 2), keepdims=True) + 0.01) * y + p),
    "rmsnorm": ("x: f32[3, 4], y: f32[4]", "rmsnorm(x, y, eps=0.01)",
                lambda x, y: x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 0.01) * y),
    "batchnorm": ("x: f32[2, 3, 4], y: f32[3], p: f32[3]", "batchnorm(x, y, p, y, p, eps=0.1)",
                  lambda x, y, p: (x - y[:, None]) / np.sqrt(p[:, None] + 0.1) * y[:, None] + p[:, None]),
    "transpose": ("x: f32[2, 3, 4]", "transpose(x) + transpose(transpose(x, perm=[2, 0, 1]), perm=[0, 2, 1])",
                  lambda x: 2 * np.einsum("ijk->kji", x)),
    "reshape": ("x: f32[2, 3, 4]", "reshape(x, shape=[4, -1])", lambda x: x.ravel().reshape(4, 6)),
    "slice": ("x: f32[6, 4]", "slice(x, axis=0, start=-4, stop=-1)", lambda x: x[2:5]),
    "concat": ("x: f32[2, 3], y: f32[2, 1]", "concat(x, y, x, axis=1)", lambda x, y: np.hstack([x, y, x])),
    # masks and indices: integer and bool results are cast to f32 in the call, to compare as floats
    "eq": ("i: i64[3, 4], j: i64[3, 4]", 'cast(i == j, to="f32")', lambda i, j: (i - j) ** 2 == 0),
    "ne": ("i: i64[3, 4], j: i64[3, 4]", 'cast(i != j, to="f32")', lambda i, j: (i - j) ** 2 > 0),
    "lt": ("x: f32[3, 4], y: f32[3, 4]", 'cast(x < y, to="f32")', lambda x, y: np.sign(y - x) > 0),
    "le": ("i: i64[3, 4], j: i64[3, 4]", 'cast(i <= j, to="f32")', lambda i, j: np.sign(j - i) >= 0),
    "gt": ("x: f32[3, 4], y: f32[3, 4]", 'cast(x > y, to="f32")', lambda x, y: np.sign(x - y) > 0),
    "ge": ("i: i64[3, 4], j: i64[3, 4]", 'cast(i >= j, to="f32")', lambda i, j: np.sign(i - j) >= 0),
    "logical_and": ("m: bool[3, 4], n: bool[3, 4]", 'cast(logical_and(m, n), to="f32")', lambda m, n: m * n),
    "logical_or": ("m: bool[3, 4], n: bool[3, 4]", 'cast(logical_or(m, n), to="f32")', lambda m, n: np.minimum(m + n, 1)),
    "logical_not": ("m: bool[3, 4]", 'cast(logical_not(m), to="f32")', lambda m: 1 - m),
    "isnan": ("x: f32[3, 4]", 'cast(isnan(x / x), to="f32")', lambda x: 0 * x),
    "where": ("m: bool[3, 4], x: f32[3, 4], y: f32[4]", "where(m, x, y)", lambda m, x, y: m * x + (1 - m) * y),
    "cast": ("i: i64[3, 4]", 'cast(i, to="f32")', lambda i: i),
    "expand": ("y: f32[4]", "expand(y, shape=[3, 1])", lambda y: np.stack([y, y, y])),
    "clip": ("x: f32[3, 4]", "clip(x, min=-0.5, max=0.5)", lambda x: np.minimum(np.maximum(x, -0.5), 0.5)),
    "leaky_relu": ("x: f32[3, 4]", "leaky_relu(x, alpha=0.1)", lambda x: np.maximum(x, 0.1 * x)),
    "hard_sigmoid": ("x: f32[3, 4]", "hard_sigmoid(x)", lambda x: np.minimum(np.maximum(0.2 * x + 0.5, 0), 1)),
    "hard_swish": ("x: f32[3, 4]", "hard_swish(x)", lambda x: x * np.minimum(np.maximum(x + 3, 0), 6) / 6),
    "softplus": ("x: f32[3, 4]", "softplus(x)", lambda x: np.log(1 + np.exp(x))),
    "min": ("x: f32[3, 4, 5]", "min(x, axis=1)", lambda x: -np.maximum(np.maximum(-x[:, 0], -x[:, 1]), np.maximum(-x[:, 2], -x[:, 3]))),
    "prod": ("x: f32[3, 4]", "prod(x, axis=1)", lambda x: x[:, 0] * x[:, 1] * x[:, 2] * x[:, 3]),
    "gather": ("t: f32[5, 3], i: i64[2, 4]", "gather(t, i)", lambda t, i: np.array([[t[int(k)] for k in r] for r in i])),
    "gather_elements": ("x: f32[3, 4], i: i64[3, 2]", "gather_elements(x, i, axis=1)",
                        lambda x, i: np.array([[x[r, int(k)] for k in i[r]] for r in range(3)])),
    "scatter_add": ("x: f32[5, 3], i: i64[4], u: f32[4, 3]", "scatter_add(x, i, u)",
                    lambda x, i, u: x + np.array([sum((u[j] for j in range(4) if int(i[j]) == r), np.zeros(3))
                                                  for r in range(5)])),
    "cumsum": ("x: f32[3, 4]", "cumsum(x, axis=1)", lambda x: np.stack([x[:, :k + 1].sum(1) for k in range(4)], 1)),
    "argmax": ("x: f32[3, 4]", 'cast(argmax(x, axis=1), to="f32")', lambda x: np.array([list(r).index(max(r)) for r in x])),
    "topk": ("x: f32[3, 4]", 'topk(x, k=2) + cast(topk(x, k=2, axis=1, largest=false, indices=true), to="f32")',
             lambda x: np.array([sorted(r, reverse=True)[:2] for r in x])
             + np.array([sorted(range(4), key=lambda j: r[j])[:2] for r in x])),
    "range": ("x: f32[1]", 'cast(range(start=1, stop=9, step=2), to="f32") + x', lambda x: np.array([1, 3, 5, 7]) + x),
    "tril": ("x: f32[4, 4]", "tril(x)", lambda x: np.array([[x[r, c] if c <= r else 0 for c in range(4)] for r in range(4)])),
    "triu": ("x: f32[4, 4]", "triu(x, k=1)", lambda x: np.array([[x[r, c] if c > r else 0 for c in range(4)] for r in range(4)])),
    "pad": ("x: f32[2, 3]", "pad(x, pads=[1, 0, 0, 2], value=7)", lambda x: np.vstack([np.full((1, 5), 7.0), np.hstack([x, np.full((2, 2), 7.0)])])),
    "max_pool2d": ("x: f32[1, 2, 4, 4]", "max_pool2d(x, kernel_size=2)",
                   lambda x: np.maximum(np.maximum(x[:, :, ::2, ::2], x[:, :, 1::2, ::2]), np.maximum(x[:, :, ::2, 1::2], x[:, :, 1::2, 1::2]))),
    "avg_pool2d": ("x: f32[1, 2, 4, 4]", "avg_pool2d(x, kernel_size=2)",
                   lambda x: (x[:, :, ::2, ::2] + x[:, :, 1::2, ::2] + x[:, :, ::2, 1::2] + x[:, :, 1::2, 1::2]) / 4),
    "pool2d_grad": ("x: f32[1, 2, 4, 4], dy: f32[1, 2, 2, 2]", 'pool2d_grad(x, dy, mode="max", kernel_size=2)',
                    lambda x, dy: _max_pool_grad_by_hand(x, dy)),
    "scatter_elements_add": ("x: f32[3, 4], i: i64[3, 2], u: f32[3, 2]", "scatter_elements_add(x, i, u, axis=1)",
                             lambda x, i, u: x + np.array([[sum(u[r, j] for j in range(2) if int(i[r, j]) % 4 == c)
                                                            for c in range(4)] for r in range(3)])),
    "softmax_grad": ("dy: f32[2, 3], y: f32[2, 3]", "softmax_grad(dy, y)",
                     lambda dy, y: np.array([[y[r, c] * (dy[r, c] - sum(dy[r, x] * y[r, x] for x in range(3)))
                                              for c in range(3)] for r in range(2)])),
    "layernorm_grad": ("dy: f32[2, 4], x: f32[2, 4], g: f32[4]", "layernorm_grad(dy, x, g)",
                       lambda dy, x, g: _layernorm_grad_by_hand(dy, x, g)),
    "attention_dq": ("q: f32[3, 2], k: f32[4, 2], v: f32[4, 3], dy: f32[3, 3]", "attention_dq(q, k, v, dy, scale=0.5)",
                     lambda q, k, v, dy: _attention_grad_by_hand(q, k, v, dy, "q")),
    "attention_dk": ("q: f32[3, 2], k: f32[4, 2], v: f32[4, 3], dy: f32[3, 3]", "attention_dk(q, k, v, dy, scale=0.5)",
                     lambda q, k, v, dy: _attention_grad_by_hand(q, k, v, dy, "k")),
    "attention_dv": ("q: f32[3, 2], k: f32[4, 2], dy: f32[3, 3]", "attention_dv(q, k, dy, scale=0.5)",
                     lambda q, k, dy: _attention_grad_by_hand(q, k, None, dy, "v")),
    "squeeze": ("x: f32[3, 1, 4]", "squeeze(x, axis=1)", lambda x: x[:, 0]),
    "unsqueeze": ("x: f32[3, 4]", "unsqueeze(x, axis=-1)", lambda x: x[:, :, None]),
    "flatten": ("x: f32[3, 2, 2]", "flatten(x)", lambda x: x.reshape(3, 4)),
    # quantized models: x * 400 spans past [0, 255], so both ends saturate; Python's round() rounds
    # half to even, as ONNX's QuantizeLinear
    "quantize_linear": ("x: f32[3, 4], z: u8", 'cast(quantize_linear(x * 200, 0.5, z), to="f32")',
                        lambda x, z: np.vectorize(lambda v: min(255, max(0, round(v * 400) + int(z))))(x)),
    "dequantize_linear": ("q: i8[3, 4], z: i8[4]", "dequantize_linear(q, 0.25, z)",
                          lambda q, z: np.array([[(q[r, c] - z[c]) / 4 for c in range(4)] for r in range(3)])),
    "matmul_integer": ("a: u8[3, 4], b: i8[4, 2], za: u8, zb: i8[2]", 'cast(matmul_integer(a, b, za, zb), to="f32")',
                       lambda a, b, za, zb: np.array([[sum((a[r, k] - za) * (b[k, c] - zb[c]) for k in range(4))
                                                       for c in range(2)] for r in range(3)])),
    # the padding is the zero point za: a padded tap adds 0
    "conv_integer": ("x: u8[1, 2, 4, 3], y: i8[4, 2, 3, 2], za: u8, zb: i8[4]",
                     'cast(conv_integer(x, y, za, zb, padding=[1, 0]), to="f32")',
                     lambda x, y, za, zb: conv2d_loops(x - za, y - zb[:, None, None, None], padding=(1, 0))),
    # DynamicQuantizeLinear's scale and zero point: the range [min(x, 0), max(x, 0)] over 255 steps
    # (in f32), and -min / scale rounded half to even (x + 0.5 keeps min(x) inside the range)
    "dynamic_scale": ("x: f32[3, 4]", "dynamic_scale(x + 0.5)",
                      lambda x: np.float32(max(x.max() + 0.5, 0) - min(x.min() + 0.5, 0)) / np.float32(255)),
    "dynamic_zero_point": ("x: f32[3, 4]", 'cast(dynamic_zero_point(x + 0.5), to="f32")',
                           lambda x: min(255, max(0, round(-min(x.min() + 0.5, 0) / (
                               (max(x.max() + 0.5, 0) - min(x.min() + 0.5, 0)) / 255))))),
    # ... the range itself, [min(x, 0), max(x, 0)], and the scale of it: that of x
    "dynamic_range": ("x: f32[3, 4]", "dynamic_range(x + 0.5) + dynamic_scale(dynamic_range(x - 1.0))",
                      lambda x: np.array([min(x.min() + 0.5, 0), max(x.max() + 0.5, 0)], np.float32)
                      + np.float32(max(x.max() - 1, 0) - min(x.min() - 1, 0)) / np.float32(255)),
}


def _max_pool_grad_by_hand(x, dy):
    """Each 2x2 window's dy to its first largest element (row by row)."""
    dx = np.zeros_like(x)
    for c in range(x.shape[1]):
        for oh in range(dy.shape[2]):
            for ow in range(dy.shape[3]):
                cells = [(2 * oh + a, 2 * ow + b) for a in range(2) for b in range(2)]
                h, w = max(cells, key=lambda hw: (x[0, c, hw[0], hw[1]], -cells.index(hw)))
                dx[0, c, h, w] += dy[0, c, oh, ow]
    return dx


def _layernorm_grad_by_hand(dy, x, g, eps=1e-5):
    """Row by row, from the definition: d/dx_i of sum_j dy_j (g_j (x_j - mu) / sd + b_j)."""
    out = np.zeros_like(x)
    n = x.shape[1]
    for r in range(x.shape[0]):
        mu = sum(x[r]) / n
        sd = math.sqrt(sum((v - mu) ** 2 for v in x[r]) / n + eps)
        xhat = [(v - mu) / sd for v in x[r]]
        for i in range(n):  # d xhat_j / d x_i = ((i == j) - 1/n - xhat_i xhat_j / n) / sd
            out[r, i] = sum(dy[r, j] * g[j] * ((i == j) - 1 / n - xhat[i] * xhat[j] / n) / sd for j in range(n))
    return out


def _attention_grad_by_hand(q, k, v, dy, wrt):
    """Element by element: p[i][j] = e^s_ij / sum_j e^s_ij with s_ij = 0.5 q_i . k_j, then the
    chain rule through softmax(s) @ v."""
    Sq, Sk = len(q), len(k)
    s = [[0.5 * sum(q[i][d] * k[j][d] for d in range(len(q[0]))) for j in range(Sk)] for i in range(Sq)]
    p = [[math.exp(s[i][j]) / sum(math.exp(x) for x in s[i]) for j in range(Sk)] for i in range(Sq)]
    if wrt == "v":
        return np.array([[sum(p[i][j] * dy[i][e] for i in range(Sq)) for e in range(len(dy[0]))] for j in range(Sk)])
    dp = [[sum(dy[i][e] * v[j][e] for e in range(len(v[0]))) for j in range(Sk)] for i in range(Sq)]
    ds = [[0.5 * p[i][j] * (dp[i][j] - sum(dp[i][x] * p[i][x] for x in range(Sk))) for j in range(Sk)] for i in range(Sq)]
    if wrt == "q":
        return np.array([[sum(ds[i][j] * k[j][d] for j in range(Sk)) for d in range(len(k[0]))] for i in range(Sq)])
    return np.array([[sum(ds[i][j] * q[i][d] for i in range(Sq)) for d in range(len(q[0]))] for j in range(Sk)])


def test_every_op_has_hand_written_semantics():
    assert set(OP_SEMANTICS) == set(OPS)


@pytest.mark.parametrize("op", sorted(OP_SEMANTICS))
def test_op_reference_matches_its_textbook_formula(op):
    params, call, by_hand = OP_SEMANTICS[op]
    g = one_graph(f"graph g({params}) {{\n    return {call}\n}}\n")
    xs = rand_inputs(g, seed=11)
    for i, (name, _) in enumerate(g.params):
        if name == "p":
            xs[i] = np.abs(xs[i]) + np.float32(0.25)
    (got,) = run(g, xs)
    close(got, by_hand(*f64(xs)))


@pytest.mark.parametrize("stride, padding", [((1, 1), (0, 0)), ((2, 2), (1, 1)), ((3, 1), (2, 0)), ((1, 2), (0, 3))])
def test_conv2d_matches_direct_convolution(stride, padding):
    g = one_graph("graph c(x: f32[2, 3, 9, 8], w: f32[5, 3, 3, 4], b: f32[5]) {\n"
                  f"    return conv2d(x, w, b, stride={list(stride)}, padding={list(padding)})\n}}\n")
    xs = rand_inputs(g, seed=2)
    (got,) = run(g, xs)
    close(got, conv2d_loops(*f64(xs), stride=stride, padding=padding))


def test_softmax_is_stable_for_large_inputs():
    g = one_graph("graph s(x: f32[4]) -> f32[4] { return softmax(x) }")
    (got,) = run(g, [np.array([1000, 1001, 1002, -1000], np.float32)])
    e = np.exp([-2.0, -1.0, 0.0])
    close(got, np.concatenate([e / e.sum(), [0.0]]))


# ---------------------------------------------------------------- the Python API

MLP = ROOT / "examples" / "mlp.g"


@pytest.fixture(scope="module")
def ref():
    return eqfuse.reference(str(MLP))


def mlp_inputs(batch=3, seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(batch, 784), (784, 1024), (1024,), (1024, 10), (10,)]
    return [rng.standard_normal(s).astype(np.float32) / np.float32(8) for s in shapes]


def test_reference_from_a_path_from_text_and_by_graph_name(ref):
    xs = mlp_inputs()
    want = ref(*xs)
    assert want.shape == (3, 10) and want.dtype == np.float32
    np.testing.assert_array_equal(eqfuse.reference(MLP)(*xs), want)
    np.testing.assert_array_equal(eqfuse.reference(MLP.read_text()).mlp(*xs), want)
    with pytest.raises(AttributeError):
        ref.nothing


def test_several_outputs_come_back_as_a_tuple():
    ref = eqfuse.reference("graph a(x: f32[2]) -> f32[2] { return x }\n"
                           "graph b(x: f32[2]) -> (f32[2], f32) { return -x, sum(x) }\n")
    x = np.array([1, 2], np.float32)
    out = ref.b(x)
    assert isinstance(out, tuple) and len(out) == 2
    np.testing.assert_array_equal(out[0], -x)
    assert out[1].shape == () and out[1] == 3
    np.testing.assert_array_equal(ref(x), x)  # the first graph by default


def test_a_numpy_scalar_is_accepted_for_a_scalar_parameter():
    src = "graph s(x: f32[2], s: f32) -> f32[2] { return x * s }"
    for run in (eqfuse.reference(src), eqfuse.compile(src)):  # (the compiled call as the reference)
        np.testing.assert_array_equal(run(np.ones(2, np.float32), np.float32(3)), [3, 3])
        np.testing.assert_array_equal(run(x=np.ones(2, np.float32), s=np.float32(2)), [2, 2])


@pytest.mark.parametrize("change, message", [
    (lambda xs: xs[:-1], "mlp() takes 5 arrays (x, w1, b1, w2, b2), got 4"),
    (lambda xs: xs + xs[:1], "takes 5 arrays (x, w1, b1, w2, b2), got 6"),
    (lambda xs: [xs[0].astype(np.float64)] + xs[1:], "parameter 'x' expects dtype float32 (f32[B, 784]), got float64"),
    (lambda xs: xs[:2] + [xs[2].astype(np.int32)] + xs[3:], "parameter 'b1' expects dtype float32 (f32[1024]), got int32"),
    (lambda xs: xs[:1] + [xs[1][:, :512]] + xs[2:], "parameter 'w1' expects f32[784, 1024], got shape [784, 512] (axis 1 is 512, expected 1024)"),
    (lambda xs: xs[:4] + [xs[4][None]], "parameter 'b2' expects f32[10] (rank 1), got shape [1, 10]"),
    (lambda xs: [xs[0].tolist()] + xs[1:], "parameter 'x' expects a numpy array of f32[B, 784], got list"),
])
def test_argument_errors_name_the_parameter_the_expected_and_the_actual(ref, change, message):
    with pytest.raises(ArgumentError) as info:
        ref(*change(mlp_inputs()))
    assert message in str(info.value)
    assert isinstance(info.value, TypeError)  # a wrong call is a TypeError to Python code


def test_a_named_dim_must_agree_across_parameters():
    ref = eqfuse.reference("graph g(x: f32[B, 2], y: f32[B, 2]) -> f32[B, 2] { return x + y }")
    with pytest.raises(ArgumentError, match=r"parameter 'y' expects f32\[B, 2\], got shape \[4, 2\] \(axis 0 is 4, expected 3\)"):
        ref(np.ones((3, 2), np.float32), np.ones((4, 2), np.float32))


def test_a_named_dim_takes_its_size_from_each_call(ref):
    for batch in (1, 5):
        assert ref(*mlp_inputs(batch)).shape == (batch, 10)


def test_non_contiguous_inputs_give_the_same_results(ref):
    x, w1, b1, w2, b2 = mlp_inputs(batch=6, seed=4)
    want = ref(x, w1, b1, w2, b2)
    views = [
        np.asfortranarray(x),                              # column-major
        np.ascontiguousarray(w1.T).T,                      # a transposed view
        np.repeat(b1, 2)[::2],                             # a strided slice
        np.ascontiguousarray(w2[::-1])[::-1],              # negative strides
        np.tile(b2, (3, 1))[1],                            # a row of a bigger array
    ]
    for v, a in zip(views, (x, w1, b1, w2, b2)):
        np.testing.assert_array_equal(v, a)
    assert not any(v.flags.c_contiguous for v in views[1:4])
    np.testing.assert_array_equal(ref(*views), want)
    rows = np.concatenate([x, x])[::2]                     # strided rows of the batch
    np.testing.assert_array_equal(ref(rows, w1, b1, w2, b2), ref(np.ascontiguousarray(rows), w1, b1, w2, b2))


def test_inputs_are_not_modified(ref):
    xs = mlp_inputs()
    copies = [a.copy() for a in xs]
    ref(*xs)
    for a, c in zip(xs, copies):
        np.testing.assert_array_equal(a, c)


def test_repr_names_each_graph_and_its_signature():
    ref = eqfuse.reference("graph f(a: f32[N, 4]) -> f32[N, 4] {\n return relu(a)\n}\n"
                           "graph g(a: f32[3], b: f32[3]) -> f32[3] {\n return a + b\n}\n")
    assert repr(ref) == ("<eqfuse reference: f(a: f32[N, 4]) -> f32[N, 4]; "
                         "g(a: f32[3], b: f32[3]) -> f32[3]>")
