"""`eqfuse check-grads`: every derivative rule against central finite differences in float64.

Each case is one op applied to parameters (a .g expression); its loss is sum(OP(...) * r) for a
fixed random r, so every element of the op's result weighs in. For each float parameter the
joint graph's gradient (eqfuse/grad/vjp.py, evaluated op by op in float64 with the op table's
numpy) is compared with (loss(p + h) - loss(p - h)) / 2h, element by element. A rule of
derivatives.rw that no case reaches is reported as untested, which fails the check too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eqfuse.frontend.load import load
from eqfuse.grad.rules import derivatives
from eqfuse.grad.vjp import grad_graph
from eqfuse.ir.graph import Graph
from eqfuse.ir.ops import OPS
from eqfuse.ir.shapes import NUMPY_DTYPE

N, P, W = "normal", "positive", "wide"  # value domains: N(0, 1), U(0.5, 2), N(0, 3)
IDS = np.array([2, 0, 2, 4, -1], dtype=np.int64)  # gather indices: a repeat and a negative one

# (expression, {parameter: (shape, domain)}); parameters named i are the i64 indices IDS
CASES: list[tuple[str, dict]] = [
    *[(f"{op}(x)", {"x": ((3, 4), N)}) for op in ("neg", "abs", "relu", "sigmoid", "tanh", "exp", "erf",
                                                   "silu", "gelu", "softplus", "hard_swish", "sin", "cos")],
    # sign, ceil and floor: 0 away from their jumps; the fixed-seed N(0, 1) draws lie far from 0
    # and from every integer next to the step h (a difference across a jump would not be 0)
    *[(f"{op}(x)", {"x": ((3, 4), N)}) for op in ("sign", "ceil", "floor")],
    *[(f"{op}(x)", {"x": ((3, 4), P)}) for op in ("log", "sqrt", "rsqrt")],
    ('gelu(x, approximate="tanh")', {"x": ((3, 4), N)}),
    ("leaky_relu(x, alpha=0.1)", {"x": ((3, 4), N)}),
    ("clip(x, min=-0.5, max=0.7)", {"x": ((3, 4), N)}),
    ("clip(x, min=0.1)", {"x": ((3, 4), N)}),
    ("hard_sigmoid(x)", {"x": ((3, 4), W)}),
    ("hard_swish(x)", {"x": ((3, 4), W)}),
    ('cast(x, to="f32")', {"x": ((3, 4), N)}),
    ("expand(x, shape=[3, 4])", {"x": ((1, 4), N)}),
    *[(f"a {s} b", {"a": ((3, 4), N), "b": ((4,), P if s == "/" else N)}) for s in "+-*/"],
    *[(f"a {s} b", {"a": ((1, 4), N), "b": ((3, 1), P if s == "/" else N)}) for s in "+-*/"],
    ("a ** b", {"a": ((3, 4), P), "b": ((4,), N)}),
    ("maximum(a, b)", {"a": ((3, 4), N), "b": ((3, 1), N)}),
    ("minimum(a, b)", {"a": ((3, 4), N), "b": ((4,), N)}),
    ("where(a > b, a, b)", {"a": ((3, 4), N), "b": ((4,), N)}),
    ("a @ b", {"a": ((3, 4), N), "b": ((4, 5), N)}),
    ("a @ b", {"a": ((2, 3, 4), N), "b": ((4, 5), N)}),
    ("a @ b", {"a": ((2, 1, 3, 4), N), "b": ((3, 4, 2), N)}),
    ("conv2d(x, w, padding=1)", {"x": ((2, 3, 5, 5), N), "w": ((4, 3, 3, 3), N)}),
    ("conv2d(x, w, b, stride=2, padding=1)", {"x": ((2, 2, 6, 5), N), "w": ((3, 2, 3, 2), N), "b": ((3,), N)}),
    ("conv2d(x, w, stride=[2, 1])", {"x": ((1, 2, 5, 4), N), "w": ((2, 2, 2, 2), N)}),
    ("conv2d(x, w, b, padding=1, group=4)", {"x": ((2, 4, 5, 4), N), "w": ((4, 1, 3, 3), N), "b": ((4,), N)}),
    ("conv2d(x, w, stride=2, padding=[1, 0], dilation=[2, 1], group=2)",
     {"x": ((2, 4, 7, 5), N), "w": ((6, 2, 3, 2), N)}),
    ("conv2d(x, w, padding=2, dilation=2)", {"x": ((1, 2, 5, 6), N), "w": ((3, 2, 3, 3), N)}),
    # padding [top, left, bottom, right]: TF's "same" padding of a stride-2 conv, and a dense one
    ("conv2d(x, w, b, stride=2, padding=[0, 0, 1, 1], group=3)", {"x": ((1, 3, 6, 4), N), "w": ((3, 1, 3, 3), N),
                                                                  "b": ((3,), N)}),
    ("conv2d(x, w, padding=[2, 0, 1, 1])", {"x": ((1, 2, 4, 5), N), "w": ((2, 2, 3, 2), N)}),
    ("conv2d(x, w, stride=[1, 2], dilation=[1, 2], group=3)", {"x": ((1, 3, 4, 8), N), "w": ((6, 1, 2, 2), N)}),
    ("conv1d(x, w, b, stride=2, padding=1, dilation=2, group=2)",
     {"x": ((2, 4, 9), N), "w": ((4, 2, 3), N), "b": ((4,), N)}),
    ("conv1d(x, w, padding=1)", {"x": ((2, 3, 6), N), "w": ((2, 3, 3), N)}),
    ("conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, group=2)",
     {"x": ((2, 4, 3, 3), N), "w": ((4, 3, 3, 3), N), "b": ((6,), N)}),
    ("conv_transpose2d(x, w, stride=[2, 1], padding=[0, 1])", {"x": ((1, 2, 3, 4), N), "w": ((2, 3, 2, 3), N)}),
    ("sum(x, axis=1)", {"x": ((2, 3, 4), N)}),
    ("sum(x)", {"x": ((2, 3, 4), N)}),
    ("mean(x, axis=[0, 2], keepdims=true)", {"x": ((2, 3, 4), N)}),
    ("max(x, axis=-1)", {"x": ((2, 3, 4), N)}),
    ("min(x, axis=0, keepdims=true)", {"x": ((2, 3, 4), N)}),
    ("prod(x, axis=1)", {"x": ((2, 3, 4), P)}),
    ("softmax(x)", {"x": ((2, 3, 4), N)}),
    ("softmax(x, axis=0)", {"x": ((2, 3, 4), N)}),
    ("layernorm(x, g, b)", {"x": ((2, 3, 4), N), "g": ((4,), N), "b": ((4,), N)}),
    ("layernorm(x, g, b, axis=-2, eps=0.01)", {"x": ((2, 3, 4), N), "g": ((3, 4), N), "b": ((3, 4), N)}),
    ("rmsnorm(x, g)", {"x": ((2, 3, 4), N), "g": ((4,), N)}),
    ("batchnorm(x, m, v, g, b)", {"x": ((2, 3, 2, 2), N), "m": ((3,), N), "v": ((3,), P), "g": ((3,), N),
                                  "b": ((3,), N)}),
    ("transpose(x, perm=[2, 0, 1])", {"x": ((2, 3, 4), N)}),
    ("transpose(x)", {"x": ((2, 3, 4), N)}),
    ("reshape(x, shape=[4, 6])", {"x": ((2, 3, 4), N)}),
    ("slice(x, axis=1, start=1, stop=4)", {"x": ((2, 5), N)}),
    ("slice(x, axis=-1, start=1, step=2)", {"x": ((2, 6), N)}),
    ("concat(a, b, a, axis=1)", {"a": ((2, 3), N), "b": ((2, 2), N)}),
    ("pad(x, pads=[1, 0, 0, 2], value=1.5)", {"x": ((2, 3), N)}),
    ("tril(x)", {"x": ((3, 3), N)}),
    ("triu(x, k=1)", {"x": ((2, 3, 3), N)}),
    ("cumsum(x, axis=1)", {"x": ((2, 4), N)}),
    ("cumsum(x, axis=0, exclusive=true, reverse=true)", {"x": ((3, 2), N)}),
    ("gather(t, i)", {"t": ((5, 3), N), "i": ((5,), "ids")}),
    ("gather(t, i, axis=1)", {"t": ((2, 5), N), "i": ((5,), "ids")}),
    ("gather_elements(t, i, axis=1)", {"t": ((2, 5), N), "i": ((2, 5), "ids")}),
    ("max_pool2d(x, kernel_size=3, stride=2, padding=1)", {"x": ((1, 2, 5, 5), N)}),
    ("avg_pool2d(x, kernel_size=3, stride=2, padding=1)", {"x": ((1, 2, 5, 5), N)}),
    ("avg_pool2d(x, kernel_size=2, padding=1, count_include_pad=true)", {"x": ((1, 2, 4, 4), N)}),
]


@dataclass(frozen=True)
class Result:
    case: str
    param: str
    rules: tuple[str, ...]
    error: float  # the largest |analytic - numeric| / (1 + |numeric|), elementwise
    ok: bool


def evaluate64(g: Graph, arrays) -> list[np.ndarray]:
    """The graph op by op in the op table's numpy, float values kept in float64."""
    vals: list = [None] * len(g.nodes)
    for i, a in zip(g.inputs, arrays):
        vals[i] = a
    with np.errstate(all="ignore"):
        for i, n in enumerate(g.nodes):
            if n.op == "input":
                continue
            if n.op == "const":
                vals[i] = np.float64(n.value)
                continue
            if n.op == "cast" and n.type.dtype == "f32":  # float64 stands for f32 here: no rounding
                vals[i] = np.asarray(vals[n.args[0]], dtype=np.float64)
                continue
            out = OPS[n.op].numpy([vals[a] for a in n.args], n.attr)
            dt = np.float64 if n.type.dtype == "f32" else NUMPY_DTYPE[n.type.dtype]
            vals[i] = np.asarray(out, dtype=dt)
    return [vals[o] for o in g.outputs]


def _draw(rng, shape, domain):
    if domain == "ids":
        return np.resize(IDS, shape)  # (IDS itself for shape (5,))
    if domain == P:
        return rng.uniform(0.5, 2.0, shape)
    return rng.normal(0, 3 if domain == W else 1, shape)


def case_graph(expr: str, params: dict, rng) -> tuple[Graph, list[np.ndarray]]:
    """graph c(params, r) { return sum(expr * r) } and its float64 arguments."""
    def decl(extra=""):
        ps = ", ".join(f"{n}: {'i64' if d == 'ids' else 'f32'}[{', '.join(map(str, s))}]"
                       for n, (s, d) in params.items())
        return f"graph c({ps}{extra})"
    probe = load(f"{decl()} {{ return {expr} }}")[0]
    shape = probe.result_types[0].shape
    r = f", r: f32[{', '.join(map(str, shape))}]" if shape else ", r: f32"
    g = load(f"{decl(r)} {{ return sum(({expr}) * r) }}")[0]
    arrays = [_draw(rng, s, d) for s, d in params.values()] + [rng.normal(0, 1, shape)]
    return g, arrays


def check_case(expr: str, params: dict, seed: int = 0, h: float = 1e-6, tol: float = 1e-6) -> list[Result]:
    rng = np.random.default_rng(seed)
    g, arrays = case_graph(expr, params, rng)
    names = [n for n, (s, d) in params.items() if d != "ids"]
    used: list[tuple[str, int, int]] = []
    joint = grad_graph(g, names, used=used)
    root = g.nodes[g.nodes[g.outputs[0]].args[0]].args[0]  # expr in sum(expr * r)
    grads = evaluate64(joint, arrays)[1:]
    out = []
    for k, (name, analytic) in enumerate(zip(names, grads)):
        j = list(params).index(name)
        numeric = np.zeros_like(arrays[j])
        flat = numeric.reshape(-1)
        for e in range(arrays[j].size):
            def loss(delta):
                moved = [a.copy() for a in arrays]
                moved[j].reshape(-1)[e] += delta
                return float(evaluate64(g, moved)[0])
            flat[e] = (loss(h) - loss(-h)) / (2 * h)
        err = float(np.max(np.abs(analytic - numeric) / (1 + np.abs(numeric)))) if numeric.size else 0.0
        ok = analytic.shape == numeric.shape and bool(np.isfinite(err)) and err <= tol
        rules = tuple(dict.fromkeys(r for r, i, a in used if i == root and g.nodes[i].args[a] == g.inputs[j]))
        out.append(Result(expr, name, rules, err, ok))
    return out


def check_derivatives(seed: int = 0) -> tuple[list[Result], list[str]]:
    """(every case's result per parameter, the rules of derivatives.rw no case applied)."""
    results: list[Result] = []
    for expr, params in CASES:
        results += check_case(expr, params, seed)
    applied = {r for res in results for r in res.rules}
    untested = [d.name for d in derivatives() if d.name not in applied]
    return results, untested
