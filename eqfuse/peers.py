"""Peer runtimes for `eqfuse bench`: the same graph run by PyTorch (eager and torch.compile).

`torch_function(graph)` interprets a Graph with torch ops, one entry of TORCH per op of the op
table (tests/test_peers.py checks that every op has one and agrees with the numpy reference);
torch.compile traces that interpreter into one inductor graph, so the peer sees the whole
unfused graph and does its own fusion. torch is optional: without it there are no peers.
"""

from __future__ import annotations

import importlib.util
from typing import Callable, Sequence

import numpy as np

from .graph import Graph
from .ops import _pair, _perm, _slice_bounds, norm_axis, reduce_axes


def _gelu(t, a, at):
    return t.nn.functional.gelu(a[0], approximate=at["approximate"])


def _layernorm(t, a, at):
    x, g, b = a
    axes = tuple(range(norm_axis(at["axis"], x.ndim), x.ndim))
    return t.nn.functional.layer_norm(x, [x.shape[i] for i in axes], g, b, eps=at["eps"])


def _rmsnorm(t, a, at):
    x, g = a
    return x * t.rsqrt((x * x).mean(dim=-1, keepdim=True) + at["eps"]) * g


def _batchnorm(t, a, at):
    x, mean, var, g, b = a
    return t.nn.functional.batch_norm(x, mean, var, g, b, training=False, eps=at["eps"])


def _reduce(fn: str):
    def run(t, a, at):
        axes = reduce_axes(at, a[0].ndim)
        if fn == "max":
            return t.amax(a[0], dim=axes, keepdim=at["keepdims"])
        return getattr(t, fn)(a[0], dim=axes, keepdim=at["keepdims"])
    return run


def _conv2d(t, a, at):
    bias = a[2] if len(a) == 3 else None
    return t.nn.functional.conv2d(a[0], a[1], bias, stride=_pair(at["stride"]), padding=_pair(at["padding"]))


def _slice(t, a, at):
    x = a[0]
    ax = norm_axis(at["axis"], x.ndim)
    lo, hi, _ = _slice_bounds(x.shape[ax], at)
    return x[(slice(None),) * ax + (slice(lo, hi, at["step"]),)]


# op name -> (torch module, argument tensors, attributes) -> tensor
TORCH: dict[str, Callable] = {
    "neg": lambda t, a, at: -a[0],
    "abs": lambda t, a, at: t.abs(a[0]),
    "relu": lambda t, a, at: t.relu(a[0]),
    "sigmoid": lambda t, a, at: t.sigmoid(a[0]),
    "tanh": lambda t, a, at: t.tanh(a[0]),
    "exp": lambda t, a, at: t.exp(a[0]),
    "log": lambda t, a, at: t.log(a[0]),
    "sqrt": lambda t, a, at: t.sqrt(a[0]),
    "rsqrt": lambda t, a, at: t.rsqrt(a[0]),
    "erf": lambda t, a, at: t.erf(a[0]),
    "silu": lambda t, a, at: t.nn.functional.silu(a[0]),
    "gelu": _gelu,
    "add": lambda t, a, at: a[0] + a[1],
    "sub": lambda t, a, at: a[0] - a[1],
    "mul": lambda t, a, at: a[0] * a[1],
    "div": lambda t, a, at: a[0] / a[1],
    "pow": lambda t, a, at: t.pow(a[0], a[1]),
    "maximum": lambda t, a, at: t.maximum(a[0], a[1]),
    "minimum": lambda t, a, at: t.minimum(a[0], a[1]),
    "matmul": lambda t, a, at: t.matmul(a[0], a[1]),
    "conv2d": _conv2d,
    "sum": _reduce("sum"),
    "mean": _reduce("mean"),
    "max": _reduce("max"),
    "softmax": lambda t, a, at: t.softmax(a[0], dim=at["axis"]),
    "layernorm": _layernorm,
    "rmsnorm": _rmsnorm,
    "batchnorm": _batchnorm,
    "transpose": lambda t, a, at: a[0].permute(*_perm(at, a[0].ndim)),
    "reshape": lambda t, a, at: a[0].reshape(*at["shape"]),
    "slice": _slice,
    "concat": lambda t, a, at: t.cat(list(a), dim=at["axis"]),
}


def have_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


def torch_function(graph: Graph) -> Callable:
    """A function of torch tensors computing the graph op by op (kernel blocks inlined)."""
    import torch

    def run(g: Graph, args: Sequence):
        vals: list = [None] * len(g.nodes)
        for i, a in zip(g.inputs, args):
            vals[i] = a
        for i, n in enumerate(g.nodes):
            if n.op == "input":
                continue
            if n.op == "const":
                vals[i] = torch.tensor(n.value, dtype=torch.float32)
            elif n.op == "kernel":
                vals[i] = run(n.body, [vals[a] for a in n.args])[0]
            else:
                vals[i] = TORCH[n.op](torch, [vals[a] for a in n.args], n.attr)
        return [vals[o] for o in g.outputs]

    def fn(*tensors):
        outs = run(graph, tensors)
        return outs[0] if len(outs) == 1 else tuple(outs)
    return fn


def torch_peers(graph: Graph, arrays: Sequence[np.ndarray], compiled: bool = True) -> list[tuple[str, Callable]]:
    """[(label, fn(threads))]: torch eager and torch.compile on the graph, inputs already tensors.

    Each fn returns numpy arrays, so the timing includes what a user of eqfuse also pays (numpy
    out). torch.compile is warmed up (compiled) here, outside the timed runs.
    """
    if not have_torch():
        return []
    import torch

    fn = torch_function(graph)
    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]

    def call(f):
        def timed(threads: int):
            torch.set_num_threads(threads)
            with torch.no_grad():
                out = f(*tensors)
            return out.numpy() if isinstance(out, torch.Tensor) else tuple(o.numpy() for o in out)
        return timed

    peers = [("torch eager", call(fn))]
    if compiled:
        try:
            cfn = torch.compile(fn, dynamic=False)
            with torch.no_grad():
                cfn(*tensors)
            peers.append(("torch.compile (inductor)", call(cfn)))
        except Exception as e:  # a missing C++ toolchain, an inductor bug: report it, bench the rest
            peers.append((f"torch.compile failed: {type(e).__name__}", None))
    return peers


__all__ = ["TORCH", "torch_function", "torch_peers", "have_torch"]
