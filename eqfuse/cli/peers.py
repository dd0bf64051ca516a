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

from eqfuse.ir.graph import Graph
from eqfuse.ir.ops import (
    conv_pads,
    norm_axis,
    pair,
    perm_of,
    reduce_axes,
    slice_bounds,
    symmetric_pads,
)
from eqfuse.ir.shapes import NUMPY_DTYPE


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
    x, pad = a[0], symmetric_pads(at["padding"])
    if pad is None:  # (torch pads evenly: an uneven padding is F.pad's)
        top, left, bottom, right = conv_pads(at["padding"])
        x, pad = t.nn.functional.pad(x, (left, right, top, bottom)), (0, 0)
    return t.nn.functional.conv2d(x, a[1], bias, stride=pair(at["stride"]), padding=pad,
                                  dilation=pair(at["dilation"]), groups=at["group"])


def _conv_integer(t, a, at):
    """In float64, exact for integers below 2^53 (a conv of u8 / i8 values is far below)."""
    wz = a[3].double().reshape(-1, 1, 1, 1) if a[3].dim() == 1 else a[3].double()
    y = t.nn.functional.conv2d(a[0].double() - a[2].double(), a[1].double() - wz, None, stride=pair(at["stride"]),
                               padding=pair(at["padding"]), dilation=pair(at["dilation"]), groups=at["group"])
    return y.int()


def _dynamic_scale(t, x):
    """DynamicQuantizeLinear's scale in f32: (max(x, 0) - min(x, 0)) / 255, 1 for an empty range."""
    lo, hi = t.clamp(x.min(), max=0), t.clamp(x.max(), min=0)
    return t.where(hi == lo, t.ones_like(hi), (hi - lo) / 255)


def _conv1d(t, a, at):
    bias = a[2] if len(a) == 3 else None
    return t.nn.functional.conv1d(a[0], a[1], bias, stride=at["stride"], padding=at["padding"],
                                  dilation=at["dilation"], groups=at["group"])


def _conv_transpose2d(t, a, at):
    bias = a[2] if len(a) == 3 else None
    return t.nn.functional.conv_transpose2d(a[0], a[1], bias, stride=pair(at["stride"]), padding=pair(at["padding"]),
                                            output_padding=pair(at["output_padding"]), groups=at["group"])


def _slice(t, a, at):
    x = a[0]
    ax = norm_axis(at["axis"], x.ndim)
    lo, hi, _ = slice_bounds(x.shape[ax], at)
    return x[(slice(None),) * ax + (slice(lo, hi, at["step"]),)]


def _prod(t, a, at):
    x = a[0]
    for ax in sorted(reduce_axes(at, x.ndim), reverse=True):
        x = t.prod(x, dim=ax, keepdim=at["keepdims"])
    return x


def _gather(t, a, at):
    data, idx = a
    ax = at["axis"] % data.ndim
    idx = t.where(idx < 0, idx + data.shape[ax], idx)
    return t.index_select(data, ax, idx.reshape(-1)).reshape(data.shape[:ax] + idx.shape + data.shape[ax + 1:])


def _cumsum(t, a, at):
    x, ax = a[0], at["axis"]
    x = t.flip(x, [ax]) if at["reverse"] else x
    out = t.cumsum(x, dim=ax, dtype=x.dtype)
    out = out - x if at["exclusive"] else out
    return t.flip(out, [ax]) if at["reverse"] else out


def _torch_pads(pads, rank):  # eqfuse: begins then ends, first axis first; torch: last axis first, pairs
    out = []
    for d in reversed(range(rank)):
        out += [pads[d], pads[rank + d]]
    return out


def _pool_kw(at):
    return dict(kernel_size=pair(at["kernel_size"]), stride=pair(at["stride"] or at["kernel_size"]),
                padding=pair(at["padding"]))


def _reshaped(op, x, at):
    from eqfuse.ir.ops_index import RESHAPES
    from eqfuse.ir.shapes import TType

    return RESHAPES[op](TType(tuple(x.shape)), at)


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
    "sin": lambda t, a, at: t.sin(a[0]),
    "cos": lambda t, a, at: t.cos(a[0]),
    "sign": lambda t, a, at: t.sign(a[0]),
    "ceil": lambda t, a, at: t.ceil(a[0]),
    "floor": lambda t, a, at: t.floor(a[0]),
    "round": lambda t, a, at: t.round(a[0]),
    **{op: (lambda op: lambda t, a, at: getattr(t, op)(a[0]))(op)
       for op in ("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "expm1", "log1p")},
    "gelu": _gelu,
    "add": lambda t, a, at: a[0] + a[1],
    "sub": lambda t, a, at: a[0] - a[1],
    "mul": lambda t, a, at: a[0] * a[1],
    "div": lambda t, a, at: a[0] / a[1],
    "pow": lambda t, a, at: t.pow(a[0], a[1]),
    "maximum": lambda t, a, at: t.maximum(a[0], a[1]),
    "minimum": lambda t, a, at: t.minimum(a[0], a[1]),
    "floordiv": lambda t, a, at: t.floor_divide(a[0], a[1]),
    "mod": lambda t, a, at: t.remainder(a[0], a[1]),
    "matmul": lambda t, a, at: t.matmul(a[0], a[1]),
    "conv2d": _conv2d,
    "conv1d": _conv1d,
    "conv_transpose2d": _conv_transpose2d,
    "sum": _reduce("sum"),
    "mean": _reduce("mean"),
    "max": _reduce("max"),
    "softmax": lambda t, a, at: (lambda p: t.where(t.isnan(p), t.zeros_like(p), p) if at["zero_nan"] else p)(
        t.softmax(a[0], dim=at["axis"])),
    "layernorm": _layernorm,
    "rmsnorm": _rmsnorm,
    "batchnorm": _batchnorm,
    "transpose": lambda t, a, at: a[0].permute(*perm_of(at, a[0].ndim)),
    "reshape": lambda t, a, at: a[0].reshape(*at["shape"]),
    "slice": _slice,
    "concat": lambda t, a, at: t.cat(list(a), dim=at["axis"]),
    # masks and indices
    **{op: (lambda f: lambda t, a, at: getattr(t, f)(a[0], a[1]))(f)
       for op, f in (("eq", "eq"), ("ne", "ne"), ("lt", "lt"), ("le", "le"), ("gt", "gt"), ("ge", "ge"),
                     ("logical_and", "logical_and"), ("logical_or", "logical_or"))},
    "logical_not": lambda t, a, at: t.logical_not(a[0]),
    "isnan": lambda t, a, at: t.isnan(a[0]),
    "where": lambda t, a, at: t.where(a[0], a[1], a[2]),
    "cast": lambda t, a, at: a[0].to(getattr(t, NUMPY_DTYPE[at["to"]])),
    # quantized models: torch.round rounds half to even, as ONNX's QuantizeLinear
    "quantize_linear": lambda t, a, at: t.clamp(t.round(a[0] / a[1]) + a[2].float(), *(
        (0, 255) if a[2].dtype == t.uint8 else (-128, 127))).to(a[2].dtype),
    "dequantize_linear": lambda t, a, at: (a[0].int() - a[2].int()).float() * a[1],
    "conv_integer": _conv_integer,
    "dynamic_scale": lambda t, a, at: _dynamic_scale(t, a[0]),
    "dynamic_zero_point": lambda t, a, at: t.clamp(t.round(-t.clamp(a[0].min(), max=0) / _dynamic_scale(t, a[0])), 0, 255).to(t.uint8),
    "dynamic_range": lambda t, a, at: t.stack([t.clamp(a[0].min(), max=0), t.clamp(a[0].max(), min=0)]),
    "matmul_integer": lambda t, a, at: t.matmul(a[0].long() - a[2].long(), a[1].long() - a[3].long()).int(),
    "expand": lambda t, a, at: t.broadcast_to(a[0], t.broadcast_shapes(a[0].shape, tuple(at["shape"]))),
    "clip": lambda t, a, at: t.clamp(a[0], at["min"], at["max"]),
    "leaky_relu": lambda t, a, at: t.nn.functional.leaky_relu(a[0], at["alpha"]),
    "hard_sigmoid": lambda t, a, at: t.clamp(a[0] * at["alpha"] + at["beta"], 0, 1),
    "hard_swish": lambda t, a, at: t.nn.functional.hardswish(a[0]),
    "softplus": lambda t, a, at: t.nn.functional.softplus(a[0]),
    "min": lambda t, a, at: t.amin(a[0], dim=reduce_axes(at, a[0].ndim), keepdim=at["keepdims"]),
    "prod": _prod,
    "gather": lambda t, a, at: _gather(t, a, at),
    "scatter_add": lambda t, a, at: _scatter_add(t, a, at),
    "gather_elements": lambda t, a, at: t.gather(a[0], at["axis"], t.where(a[1] < 0, a[1] + a[0].shape[at["axis"]], a[1])),
    "cumsum": _cumsum,
    "argmax": lambda t, a, at: t.argmax(a[0], dim=at["axis"], keepdim=at["keepdims"]),
    "topk": lambda t, a, at: t.topk(a[0], at["k"], dim=at["axis"], largest=at["largest"])[1 if at["indices"] else 0],
    "range": lambda t, a, at: t.arange(at["start"], at["stop"], at["step"], dtype=getattr(t, NUMPY_DTYPE[at["dtype"]])),
    "tril": lambda t, a, at: t.tril(a[0], at["k"]),
    "triu": lambda t, a, at: t.triu(a[0], at["k"]),
    "pad": lambda t, a, at: t.nn.functional.pad(a[0], _torch_pads(at["pads"], a[0].ndim), value=at["value"]),
    "max_pool2d": lambda t, a, at: t.nn.functional.max_pool2d(a[0], **_pool_kw(at)),
    "avg_pool2d": lambda t, a, at: t.nn.functional.avg_pool2d(a[0], count_include_pad=at["count_include_pad"], **_pool_kw(at)),
    "pool2d_grad": lambda t, a, at: _pool_grad(t, a, at),
    "scatter_elements_add": lambda t, a, at: a[0].scatter_add(
        at["axis"], t.where(a[1] < 0, a[1] + a[0].shape[at["axis"]], a[1]), a[2]),
    "softmax_grad": lambda t, a, at: a[1] * (a[0] - (a[0] * a[1]).sum(dim=at["axis"], keepdim=True)),
    "layernorm_grad": lambda t, a, at: _layernorm_grad(t, a, at),
    "attention_dq": lambda t, a, at: _attention_grad(t, a, at, "attention_dq"),
    "attention_dk": lambda t, a, at: _attention_grad(t, a, at, "attention_dk"),
    "attention_dv": lambda t, a, at: _attention_grad(t, a, at, "attention_dv"),
    "squeeze": lambda t, a, at: a[0].reshape(_reshaped("squeeze", a[0], at)),
    "unsqueeze": lambda t, a, at: a[0].reshape(_reshaped("unsqueeze", a[0], at)),
    "flatten": lambda t, a, at: a[0].reshape(_reshaped("flatten", a[0], at)),
}


def _scatter_add(t, a, at):
    x, idx, upd = a
    ax = at["axis"] % x.ndim
    idx = t.where(idx < 0, idx + x.shape[ax], idx).reshape(-1)
    upd = upd.reshape(x.shape[:ax] + (idx.numel(),) + x.shape[ax + 1:])
    return x.index_add(ax, idx, upd)


def _pool_grad(t, a, at):
    """torch autograd's vector-Jacobian product of its own max_pool2d or avg_pool2d."""
    x = a[0].detach().requires_grad_(True)
    with t.enable_grad():
        if at["mode"] == "max":
            y = t.nn.functional.max_pool2d(x, **_pool_kw(at))
        else:
            y = t.nn.functional.avg_pool2d(x, count_include_pad=at["count_include_pad"], **_pool_kw(at))
        (g,) = t.autograd.grad(y, x, a[1])
    return g


def _layernorm_grad(t, a, at):
    """torch autograd's vector-Jacobian product of F.layer_norm with respect to x."""
    dy, x, g = a
    x = x.detach().requires_grad_(True)
    with t.enable_grad():
        y = t.nn.functional.layer_norm(x, tuple(x.shape[at["axis"] % x.ndim:]), g, None, at["eps"])
        (d,) = t.autograd.grad(y, x, dy)
    return d


def _attention_grad(t, a, at, name):
    """torch autograd's vector-Jacobian product of softmax(q @ k^T * scale + mask) @ v (v of zeros
    for attention_dv, whose gradient does not read it)."""
    q, k = a[0], a[1]
    v, dy = (a[2], a[3]) if name != "attention_dv" else (t.zeros(k.shape[:-1] + a[2].shape[-1:], dtype=q.dtype), a[2])
    mask = a[len(a) - 1] if len(a) == (5 if name != "attention_dv" else 4) else None
    x = {"attention_dq": q, "attention_dk": k, "attention_dv": v}[name].detach().requires_grad_(True)
    args = {"attention_dq": (x, k, v), "attention_dk": (q, x, v), "attention_dv": (q, k, x)}[name]
    with t.enable_grad():
        s = args[0] @ args[1].transpose(-1, -2) * at["scale"]
        p = t.softmax(s if mask is None else s + mask, dim=-1)
        if at["zero_nan"]:
            p = t.nan_to_num(p, nan=0.0)
        (g,) = t.autograd.grad(p @ args[2], x, dy)
    return g


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
                # a literal takes the dtype of the tensors it meets (eqfuse/ir/dtypes.py)
                strong = [g.nodes[a].type.dtype for a in n.args if g.nodes[a].op != "const"]
                dt = getattr(torch, NUMPY_DTYPE[strong[0]]) if strong else torch.float32
                # (a fraction stays a float: a dequantize's scale next to its integers)
                args = [torch.tensor(g.nodes[a].value, dtype=torch.float32 if float(g.nodes[a].value) % 1 else dt)
                        if g.nodes[a].op == "const" else vals[a] for a in n.args]
                vals[i] = TORCH[n.op](torch, args, n.attr)
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
    # (a read-only array, an ONNX model's initializer, is copied: torch warns about wrapping one)
    tensors = [torch.from_numpy(np.ascontiguousarray(a) if a.flags.writeable else np.array(a)) for a in arrays]

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
