"""ONNX handlers of the arithmetic, activation, normalization, reduction, contraction and layout
ops: each turns one ONNX node into ops of the op table. Registered into
eqfuse.frontend.onnx_import.HANDLERS (the mask, index and pooling ops are in eqfuse/frontend/onnx_ops.py).
"""

from __future__ import annotations

import math

import numpy as np

from eqfuse.errors import ShapeError
from eqfuse.frontend import onnx_symbolic as sy
from eqfuse.frontend.onnx_registry import (
    BIG,
    HANDLERS,
    ONNX_DTYPES,
    Empty,
    NeedsDims,
    Unsupported,
    dtype_name,
    f32_float,
    handles,
    one_dim,
    pair,
    tensor_array,
)
from eqfuse.ir.shapes import NUMPY_DTYPE, Dim, dtype_of_numpy

F32 = np.float32

for _onnx, _ours in {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Exp": "exp",
                     "Sqrt": "sqrt", "Neg": "neg", "Abs": "abs", "Log": "log",
                     "Sin": "sin", "Cos": "cos", "Sign": "sign", "Ceil": "ceil", "Floor": "floor",
                     "Round": "round", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan",
                     "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh"}.items():
    HANDLERS[_onnx] = ((lambda o: lambda imp, ins, at: imp.op(o, [imp.data(ins[0], imp.node.input[0])]))(_ours),
                       {"consumed_inputs"})


@handles("Reciprocal")
def _reciprocal(imp, ins, at):
    return imp.binary("div", np.asarray(1.0, F32), ins[0], ("", imp.node.input[0]))


@handles("Gelu", attrs=("approximate",))
def _gelu(imp, ins, at):
    return imp.op("gelu", [imp.data(ins[0], imp.node.input[0])], approximate=at.get("approximate", "none"))


@handles("Add", "Sub", "Mul", "Div", "Pow", attrs=("consumed_inputs",))
def _binary(imp, ins, at):
    name = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow"}[imp.node.op_type]
    b = ins[1]
    if name == "pow" and imp.is_const(b) and b.dtype.kind in "iu":  # Pow allows an integer exponent
        b = b.astype(F32)
    return imp.binary(name, ins[0], b, tuple(imp.node.input))


@handles("Max", "Min", "Sum", "Mean")
def _variadic(imp, ins, at):
    t = imp.node.op_type
    name = {"Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add"}[t]
    acc = imp.data(ins[0], imp.node.input[0])
    for v, n in zip(ins[1:], imp.node.input[1:]):
        acc = imp.binary(name, acc, v, ("", n))
    if t == "Mean" and len(ins) > 1:
        acc = imp.binary("div", acc, np.asarray(len(ins), F32))
    return acc


@handles("Identity", "Dropout", attrs=("ratio", "seed", "is_test"))
def _identity(imp, ins, at):
    if imp.node.op_type == "Dropout":
        if len(ins) > 2 and ins[2] is not None and (not imp.is_const(ins[2]) or bool(ins[2])):
            raise Unsupported("training_mode (eqfuse imports models for inference)")
        if len(imp.node.output) > 1 and imp.node.output[1]:
            raise Unsupported("mask output")
    return ins[0]


@handles("Constant", attrs=("value", "value_float", "value_floats", "value_int", "value_ints"))
def _constant(imp, ins, at):
    if "value" in at:
        return tensor_array(at["value"], f"the value of Constant '{imp.node.name or imp.node.output[0]}'")
    if "value_float" in at:
        return np.asarray(at["value_float"], F32)
    if "value_floats" in at:
        return np.asarray(at["value_floats"], F32)
    if "value_int" in at:
        return np.asarray(at["value_int"], np.int64)
    if "value_ints" in at:
        return np.asarray(at["value_ints"], np.int64)
    raise Unsupported("constant kind (sparse or string)")


@handles("Cast", "CastLike", attrs=("to", "saturate", "round_mode"))
def _cast(imp, ins, at):
    if imp.node.op_type == "CastLike":
        target = ins[1]
        to = dtype_of_numpy(target.dtype) if imp.is_const(target) else imp.type(target).dtype
    else:
        to = ONNX_DTYPES.get(at.get("to"), "f32" if at.get("to") in (10, 11, 16) else None)  # f16/f64/bf16 -> f32
    if to is None:
        raise Unsupported(f"cast to {dtype_name(at.get('to'))}")
    if imp.is_const(ins[0]):
        return np.asarray(ins[0]).astype(NUMPY_DTYPE[to])
    if imp.type(ins[0]).dtype == to:
        return ins[0]
    return imp.op("cast", [ins[0]], to=to)


@handles("Shape", attrs=("start", "end"))
def _shape(imp, ins, at):
    shape = ins[0].shape if imp.is_const(ins[0]) else imp.type(ins[0]).shape
    shape = shape[slice(at.get("start", 0), at.get("end"))]
    return sy.sym(shape)  # an int64 array, or a Sym when a dim is named


@handles("Size")
def _size(imp, ins, at):
    return sy.sym([sy.product(ins[0].shape if imp.is_const(ins[0]) else imp.type(ins[0]).shape)], scalar=True)


@handles("MatMul")
def _matmul(imp, ins, at):
    a, b = imp.data(ins[0], imp.node.input[0]), imp.data(ins[1], imp.node.input[1])
    ta, tb = imp.type(a).shape, imp.type(b).shape
    if len(ta) == 1:
        a = imp.reshape_to(a, (1,) + ta)
    if len(tb) == 1:
        b = imp.reshape_to(b, tb + (1,))
    y = imp.op("matmul", [a, b])
    out = imp.type(y).shape
    if len(tb) == 1:
        out = out[:-1]
    if len(ta) == 1:
        out = out[:-2] + out[-1:] if len(tb) != 1 else out[:-1]
    return imp.reshape_to(y, out)


@handles("Gemm", attrs=("alpha", "beta", "transA", "transB", "broadcast"))
def _gemm(imp, ins, at):
    a, b = imp.data(ins[0], imp.node.input[0]), imp.data(ins[1], imp.node.input[1])
    if at.get("transA", 0):
        a = imp.op("transpose", [a], perm=(1, 0))
    if at.get("transB", 0):
        b = imp.op("transpose", [b], perm=(1, 0))
    y = imp.op("matmul", [a, b])
    alpha, beta = at.get("alpha", 1.0), at.get("beta", 1.0)
    if alpha != 1.0:
        y = imp.binary("mul", y, np.asarray(alpha, F32))
    if len(ins) > 2 and ins[2] is not None and beta != 0.0:
        c = ins[2]
        if beta != 1.0:
            c = imp.binary("mul", c, np.asarray(beta, F32), (imp.node.input[2], ""))
        y = imp.binary("add", y, c, ("", imp.node.input[2]))
    return y


@handles("Softmax", "LogSoftmax", attrs=("axis",))
def _softmax(imp, ins, at):
    """softmax over the axis; LogSoftmax as x - max - log(sum(exp(x - max))), which the optimizer
    fuses into one row kernel as it does softmax's own expansion."""
    x = imp.data(ins[0], imp.node.input[0])
    return softmax_of(imp, x, at.get("axis"), imp.opset, imp.node.op_type == "LogSoftmax")


def softmax_of(imp, x: int, axis: int | None, opset: int, log: bool = False) -> int:
    """(Log)Softmax of x over `axis` (None: the opset's default) as opset `opset` defines it:
    before opset 13 over all the dims from `axis` on, flattened; from 13 on over that one axis.
    QLinearSoftmax (frontend/onnx_quant.py) names its opset in an attribute."""
    shape = imp.type(x).shape
    rank = len(shape)
    axis = (1 if opset < 13 else -1) if axis is None else axis
    if not -rank <= axis < rank:
        raise ShapeError(f"axis {axis} is out of range for rank {rank}")
    axis %= rank
    if opset < 13 and axis != rank - 1:
        flat = imp.reshape_to(x, (one_dim(shape[:axis]), one_dim(shape[axis:])))
        return imp.reshape_to(_normalize(imp, flat, -1, log), shape)
    return _normalize(imp, x, axis - rank, log)


def _normalize(imp, x: int, axis: int, log: bool) -> int:
    if not log:
        return imp.op("softmax", [x], axis=axis)
    shifted = imp.op("sub", [x, imp.op("max", [x], axis=axis, keepdims=True)])
    total = imp.op("sum", [imp.op("exp", [shifted])], axis=axis, keepdims=True)
    return imp.op("sub", [shifted, imp.op("log", [total])])


def _norm_input(imp, ins, at):
    """(x, its shape, the first normalized axis, from 0) of a LayerNormalization or RMSNormalization."""
    x = imp.data(ins[0], imp.node.input[0])
    shape = imp.type(x).shape
    axis = at.get("axis", -1)
    if not -len(shape) <= axis < len(shape):
        raise ShapeError(f"axis {axis} is out of range for rank {len(shape)}")
    return x, shape, axis % len(shape)


@handles("LayerNormalization", attrs=("axis", "epsilon", "stash_type"))
def _layernorm(imp, ins, at):
    x, shape, axis = _norm_input(imp, ins, at)
    rank = len(shape)
    eps = f32_float(at.get("epsilon", 1e-5))
    tail = shape[axis:]
    gamma = _norm_param(imp, ins[1], imp.node.input[1], tail, 1.0)
    beta = _norm_param(imp, ins[2] if len(ins) > 2 else None, imp.node.input[2] if len(ins) > 2 else "", tail, 0.0)
    outs = [imp.op("layernorm", [x, gamma, beta], axis=axis - rank, eps=eps)]
    wanted = [o for o in imp.node.output[1:]]
    if any(wanted):
        _, mean, inv = _normalized(imp, x, tuple(range(axis, rank)), eps)
        outs += [mean, inv][:len(wanted)]
    return outs


def _normalized(imp, x: int, axes: tuple[int, ...], eps: float) -> tuple[int, int, int]:
    """(x - mean) / sqrt(var + eps) over `axes` spelled out, the mean and 1 / sqrt(var + eps):
    the moments as the reference computes them (the population variance)."""
    mean = imp.op("mean", [x], axis=axes, keepdims=True)
    d = imp.op("sub", [x, mean])
    inv = imp.op("rsqrt", [imp.binary("add", imp.op("mean", [imp.op("mul", [d, d])], axis=axes, keepdims=True),
                                      np.asarray(eps, F32))])
    return imp.op("mul", [d, inv]), mean, inv


@handles("InstanceNormalization", attrs=("epsilon",))
def _instancenorm(imp, ins, at):
    """InstanceNormalization(x [N, C, ...], scale [C], B [C]): each (n, c) normalized over the
    spatial dims, then scaled and shifted per channel (TorchScript's export of a GroupNorm with
    as many groups as channels: Wav2Vec2's first conv, PoolFormer): `_group_norm` with C groups."""
    x = imp.data(ins[0], imp.node.input[0])
    shape = imp.type(x).shape
    if len(shape) < 3:
        raise ShapeError(f"InstanceNormalization input of rank {len(shape)} (it takes [N, C, spatial...])")
    return _group_norm(imp, x, shape[1], f32_float(at.get("epsilon", 1e-5)), ins[1], ins[2])


@handles("GroupNormalization", attrs=("epsilon", "num_groups", "stash_type"))
def _groupnorm(imp, ins, at):
    """GroupNormalization(x [N, C, ...], scale, bias) (opsets 18 and 21; the dynamo exporter's
    GroupNorm: Wav2Vec2's first conv): each group of C / num_groups channels of each n normalized
    over its channels and spatial dims, then scaled and shifted per channel (opset 21: scale and
    bias [C]) or per group (opset 18: [num_groups], each value for its group's channels)."""
    x = imp.data(ins[0], imp.node.input[0])
    shape = imp.type(x).shape
    groups = int(at.get("num_groups", 0))
    if len(shape) < 2 or not isinstance(shape[1], int) or groups <= 0 or shape[1] % groups:
        raise ShapeError(f"GroupNormalization of {groups} groups over an input of shape {list(shape)}")
    params = list(ins[1:3])
    if imp.opset < 21:  # per group: each value repeated for the group's channels
        for k, v in enumerate(params):
            if not imp.is_const(v):
                raise Unsupported("scale or bias computed at run time (opset 18: per group)")
            params[k] = np.repeat(np.asarray(v, F32).reshape(-1), shape[1] // groups)
    return _group_norm(imp, x, groups, f32_float(at.get("epsilon", 1e-5)), *params)


def _group_norm(imp, x: int, groups: int, eps: float, scale, bias) -> int:
    """x [N, C, ...] with each group of C / groups channels normalized over its channels and the
    spatial dims, then times scale and plus bias, per channel ([C], constants or tensors). Dims
    that are numbers: one layernorm over each group flattened (a row kernel); named ones: the mean
    and variance spelled out, as the reference computes them."""
    shape = imp.type(x).shape
    spatial = shape[2:]
    per = (shape[1] // groups) if isinstance(shape[1], int) else None
    if per is not None and all(isinstance(d, int) for d in spatial):
        n = per * math.prod(spatial)
        flat = imp.reshape_to(x, (shape[0], groups, n))
        ones, zeros = (imp.new_param(f"{imp.node.name or imp.node.output[0]}_{k}", np.full((n,), v, F32))
                       for k, v in (("ones", 1.0), ("zeros", 0.0)))
        y = imp.reshape_to(imp.op("layernorm", [flat, ones, zeros], axis=-1, eps=eps), shape)
    elif groups == shape[1] or per == 1:
        y = _normalized(imp, x, tuple(range(2, len(shape))), eps)[0]
    else:
        raise NeedsDims(f"a GroupNormalization over the named dims {list(spatial)}")
    per_channel = (shape[1],) + (1,) * len(spatial)
    for k, (op, v) in enumerate((("mul", scale), ("add", bias))):
        if imp.is_const(v):
            if v.ndim != 1 or (isinstance(shape[1], int) and v.size != shape[1]):
                raise ShapeError(f"{imp.node.op_type} {('scale', 'B')[k]} of shape {list(v.shape)} for "
                                 f"{shape[1]} channels")
            v = imp.new_param(imp.node.input[k + 1], v.astype(F32).reshape(-1, *(1,) * len(spatial)))
        else:
            v = imp.reshape_to(v, per_channel)
        y = imp.op(op, [y, v])
    return y


@handles("RMSNormalization", attrs=("axis", "epsilon", "stash_type"))
def _rmsnorm(imp, ins, at):
    """RMSNormalization (opset 23; the dynamo exporter's torch.nn.RMSNorm and transformers' RMSNorms
    at that opset): x / sqrt(mean(x^2) + epsilon) * scale over the axes from `axis` on. One rmsnorm
    over the last axis, or over the trailing axes flattened when they are numbers."""
    x, shape, axis = _norm_input(imp, ins, at)
    rank = len(shape)
    tail = shape[axis:]
    if axis < rank - 1 and not all(isinstance(d, int) for d in tail):
        raise NeedsDims(f"RMSNormalization over the named dims {list(tail)}")
    gamma = _norm_param(imp, ins[1], imp.node.input[1], tail, 1.0)
    flat = (math.prod(tail),) if axis < rank - 1 else tail
    y = imp.op("rmsnorm", [imp.reshape_to(x, shape[:axis] + flat), imp.reshape_to(gamma, flat)],
               eps=f32_float(at.get("epsilon", 1e-5)))
    return imp.reshape_to(y, shape)


@handles("Attention", attrs=("is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode", "scale", "softcap",
                             "softmax_precision"))
def _attention(imp, ins, at):
    """Attention (opset 23; the dynamo exporter's scaled_dot_product_attention at that opset), as
    the TorchScript exporter spells it out, so that the optimizer finds the same attention:
    softmax(q k^T * scale + bias) v per head, q and k each scaled by sqrt(scale) (scale 1 / sqrt(head
    size) unless given); 3-D inputs [batch, sequence, heads x head size] split into q_num_heads and
    kv_num_heads heads and the output joined back; past_key and past_value put before the new keys
    and values (the outputs present_key and present_value); grouped-query attention's key and
    value heads each repeated for their query heads; softcap (c tanh(scores / c)) before the bias.
    The bias: attn_mask (a bool mask: 0 where true, else -inf; a float one added as it is), padded
    with masked keys to the keys' length, and is_causal's mask (key j of query i when j <= i + past
    length), constant shapes only. A query whose keys are all masked gets zeros, as the operator
    defines: the softmax's NaN is set to 0, the guard torch's exports write, which the attention
    kernel computes (the rule softmax_zero_nan). qk_matmul_output (output 3) is refused."""
    if len(ins) > 6 and ins[6] is not None:
        raise Unsupported("nonpad_kv_seqlen (a cache of run-time lengths per batch)")
    if len(imp.node.output) > 3 and imp.node.output[3] in imp.read:
        raise Unsupported("output qk_matmul_output")
    if at.get("softmax_precision", 1) != 1:
        raise Unsupported(f"softmax_precision {at['softmax_precision']} (eqfuse computes the softmax in float32)")
    q, k, v = (imp.data(ins[i], imp.node.input[i]) for i in range(3))
    rank = imp.type(q).rank
    if rank not in (3, 4) or imp.type(k).rank != rank or imp.type(v).rank != rank:
        raise Unsupported(f"Q, K and V of ranks {rank}, {imp.type(k).rank}, {imp.type(v).rank} (3 or 4 each)")
    if rank == 3:
        qh, kvh = int(at.get("q_num_heads", 0)), int(at.get("kv_num_heads", 0))
        if qh <= 0 or kvh <= 0:
            raise Unsupported("3-D Q, K and V without q_num_heads and kv_num_heads")

        def heads(t, n):  # [B, L, n x d] -> [B, n, L, d]
            b, length, width = imp.type(t).shape
            if not isinstance(width, int) or width % n:
                raise ShapeError(f"a hidden size of {width} in {n} heads")
            return imp.op("transpose", [imp.reshape_to(t, (b, length, n, width // n))], perm=(0, 2, 1, 3))
        q, k, v = heads(q, qh), heads(k, kvh), heads(v, kvh)
    qh, kvh, d = imp.type(q).shape[1], imp.type(k).shape[1], imp.type(q).shape[3]
    presents, past = [], 0
    for t, i in ((k, 4), (v, 5)):
        if len(ins) > i and ins[i] is not None:
            cache = imp.data(ins[i], imp.node.input[i])
            past = imp.type(cache).shape[2]
            t = imp.op("concat", [cache, t], axis=2)
        presents.append(t)
    k, v = presents
    if qh != kvh:
        if not (isinstance(qh, int) and isinstance(kvh, int)) or qh % kvh:
            raise ShapeError(f"{qh} query heads for {kvh} key and value heads")

        def repeat(t):  # each key and value head once for each of its query heads, in order
            b, n, length, width = imp.type(t).shape
            wide = imp.op("expand", [imp.reshape_to(t, (b, n, 1, length, width))], shape=(b, n, qh // kvh, length, width))
            return imp.reshape_to(wide, (b, qh, length, width))
        k, v = repeat(k), repeat(v)
    scale = at.get("scale", 0.0) or 1.0 / math.sqrt(d)
    root = imp.const(f32_float(math.sqrt(scale)))
    scores = imp.op("matmul", [imp.op("mul", [q, root]),
                               imp.op("mul", [imp.op("transpose", [k], perm=(0, 1, 3, 2)), root])])
    if at.get("softcap", 0.0) > 0:
        c = f32_float(at["softcap"])
        scores = imp.op("mul", [imp.op("tanh", [imp.op("div", [scores, imp.const(c)])]), imp.const(c)])
    S, T = imp.type(scores).shape[2:]
    low = imp.const(float("-inf"))
    if len(ins) > 3 and ins[3] is not None:
        mask = imp.data(ins[3], imp.node.input[3])
        short = imp.type(mask).shape[-1]
        if short != T:
            if not (isinstance(short, int) and isinstance(T, int) and short < T):
                raise NeedsDims(f"an attn_mask of {short} keys for {T} keys")
            mask = imp.op("pad", [mask], pads=(0,) * (2 * imp.type(mask).rank - 1) + (T - short,),
                          value=0.0 if imp.type(mask).dtype == "bool" else float("-inf"))
        if imp.type(mask).dtype == "bool":
            mask = imp.op("where", [mask, imp.const(0.0), low])
        scores = imp.op("add", [scores, mask])
    if at.get("is_causal", 0):
        if not (isinstance(S, int) and isinstance(T, int) and isinstance(past, int)):
            raise NeedsDims("is_causal over named sequence lengths")
        later = np.arange(T)[None, :] > np.arange(S)[:, None] + past
        scores = imp.op("where", [imp.new_param("causal", later), low, scores])
    p = imp.op("softmax", [scores], axis=-1)
    p = imp.op("where", [imp.op("isnan", [p]), imp.const(0.0), p])  # (a query whose keys are all masked)
    y = imp.op("matmul", [p, v])
    if rank == 3:
        b, n, length, width = imp.type(y).shape
        y = imp.reshape_to(imp.op("transpose", [y], perm=(0, 2, 1, 3)), (b, length, n * width))
    return [y, *presents]


@handles("RotaryEmbedding", attrs=("interleaved", "num_heads", "rotary_embedding_dim"))
def _rotary_embedding(imp, ins, at):
    """RotaryEmbedding (opset 23; the dynamo exporter's rotary embeddings of a decoder with its
    cache): the first rotary_embedding_dim features of each head (all by default) rotated by the
    angles whose cosines and sines are cos_cache and sin_cache ([batch, sequence, dim / 2], or
    [positions, dim / 2] rows taken at position_ids). Spelled as transformers' apply_rotary_pos_emb
    is exported, x cos + rotate_half(x) sin with the halves' angles repeated, so that the optimizer
    finds the same kernels; interleaved=1 rotates the pairs (2i, 2i + 1) instead of (i, i + dim / 2).
    Input [batch, heads, sequence, head size], or [batch, sequence, num_heads x head size]."""
    x = imp.data(ins[0], imp.node.input[0])
    shape = imp.type(x).shape
    if len(shape) == 3:
        nh = int(at.get("num_heads", 0))
        if nh <= 0 or not isinstance(shape[2], int) or shape[2] % nh:
            raise Unsupported(f"a 3-D input of shape {list(shape)} with num_heads {nh}")
        x = imp.reshape_to(x, (shape[0], shape[1], nh, shape[2] // nh))  # [B, S, heads, D]
    elif len(shape) != 4:
        raise Unsupported(f"an input of rank {len(shape)} (3 or 4)")
    xs = imp.type(x).shape
    d = xs[3]
    r = int(at.get("rotary_embedding_dim", 0)) or d
    if not isinstance(d, int) or r % 2 or r > d:
        raise Unsupported(f"rotary_embedding_dim {r} of heads of {d}")
    cos, sin = (imp.data(ins[i], imp.node.input[i]) for i in (1, 2))
    if len(ins) > 3 and ins[3] is not None:
        pos = imp.data(ins[3], imp.node.input[3])
        cos, sin = (imp.op("gather", [c, pos], axis=0) for c in (cos, sin))
    for c in (cos, sin):
        if imp.type(c).rank != 3 or imp.type(c).shape[2] != r // 2:
            raise ShapeError(f"cos_cache and sin_cache of shape {list(imp.type(c).shape)} for [batch, sequence, {r // 2}]")
    b, seq = imp.type(cos).shape[:2]
    # the angles beside each head's features: [B, 1, S, .] (4-D input) or [B, S, 1, .] (3-D)
    at_heads = (b, 1, seq) if len(shape) == 4 else (b, seq, 1)
    rot = imp.op("slice", [x], axis=3, start=0, stop=r) if r < d else x
    if at.get("interleaved", 0):
        pairs = imp.reshape_to(rot, tuple(xs[:3]) + (r // 2, 2))
        x1, x2 = (imp.reshape_to(imp.op("slice", [pairs], axis=4, start=i, stop=i + 1), tuple(xs[:3]) + (r // 2,))
                  for i in (0, 1))
        c, s_ = (imp.reshape_to(t, at_heads + (r // 2,)) for t in (cos, sin))
        real = imp.op("sub", [imp.op("mul", [c, x1]), imp.op("mul", [s_, x2])])
        imag = imp.op("add", [imp.op("mul", [s_, x1]), imp.op("mul", [c, x2])])
        out = imp.reshape_to(imp.op("concat", [imp.reshape_to(t, tuple(xs[:3]) + (r // 2, 1)) for t in (real, imag)],
                                    axis=4), tuple(xs[:3]) + (r,))
    else:
        c, s_ = (imp.reshape_to(imp.op("concat", [t, t], axis=-1), at_heads + (r,)) for t in (cos, sin))
        x1, x2 = (imp.op("slice", [rot], axis=3, start=lo, stop=lo + r // 2) for lo in (0, r // 2))
        half = imp.op("concat", [imp.op("neg", [x2]), x1], axis=3)
        out = imp.op("add", [imp.op("mul", [rot, c]), imp.op("mul", [half, s_])])
    if r < d:
        out = imp.op("concat", [out, imp.op("slice", [x], axis=3, start=r, stop=d)], axis=3)
    return imp.reshape_to(out, shape)


MS = "com.microsoft"  # onnxruntime's contrib ops, as its transformer optimizer writes them


@handles("SkipLayerNormalization", attrs=("epsilon",), domain=MS)
def _skip_layernorm(imp, ins, at):
    """onnxruntime's SkipLayerNormalization (input, skip, gamma[, beta[, bias]]): s = input + skip
    (+ bias), the residual add its transformer optimizer folds into the next norm; outputs
    layernorm(s) over the last axis and, as output 3 (input_skip_bias_sum), s itself, which the
    next residual add reads. Outputs 1 and 2 (mean, inv_std_var) onnxruntime's CPU kernel does
    not compute: refused."""
    if any(imp.node.output[1:3]):
        raise Unsupported("output mean or inv_std_var (onnxruntime's CPU kernel computes neither)")
    if "epsilon" not in at:
        raise Unsupported("a node without epsilon (onnxruntime requires the attribute)")
    x = imp.data(ins[0], imp.node.input[0])
    shape = imp.type(x).shape
    s = imp.binary("add", x, ins[1], tuple(imp.node.input[:2]))
    if len(ins) > 4 and ins[4] is not None:
        s = imp.binary("add", s, ins[4], ("", imp.node.input[4]))
    if imp.type(s).shape != shape:
        raise ShapeError(f"skip or bias of shape {list(imp.type(s).shape)} with input of shape {list(shape)} "
                         "(they broadcast to the input's shape)")
    tail = shape[-1:]
    gamma = _norm_param(imp, ins[2], imp.node.input[2], tail, 1.0)
    beta = _norm_param(imp, ins[3] if len(ins) > 3 else None, imp.node.input[3] if len(ins) > 3 else "", tail, 0.0)
    return [imp.op("layernorm", [s, gamma, beta], axis=-1, eps=f32_float(at["epsilon"])), None, None, s]


@handles("FastGelu", "BiasGelu", "Gelu", domain=MS)
def _contrib_gelu(imp, ins, at):
    """onnxruntime's GELUs: FastGelu(x[, bias]) the tanh approximation of x + bias, BiasGelu(x, bias)
    and Gelu(x) the exact (erf) one."""
    x = imp.data(ins[0], imp.node.input[0])
    if len(ins) > 1 and ins[1] is not None:
        x = imp.binary("add", x, ins[1], ("", imp.node.input[1]))
    return imp.op("gelu", [x], approximate="tanh" if imp.node.op_type == "FastGelu" else "none")


def _norm_param(imp, v, name: str, tail: tuple[Dim, ...], fill: float) -> int:
    """gamma/beta of exactly the normalized shape (ONNX lets them broadcast)."""
    if v is None:
        if not all(isinstance(d, int) for d in tail):
            raise NeedsDims(f"LayerNormalization without bias over named dims {list(tail)}")
        return imp.new_param(f"{imp.node.name or imp.node.output[0]}_{'bias' if fill == 0 else 'scale'}",
                             np.full(tail, fill, F32))
    if imp.is_const(v):
        if tuple(v.shape) != tuple(tail):
            if not all(isinstance(d, int) for d in tail):
                raise Unsupported(f"LayerNormalization parameter {name} of shape {list(v.shape)}")
            return imp.new_param(name, np.broadcast_to(v.astype(F32), tail))
        return imp.data(v, name)
    if imp.type(v).shape != tuple(tail):
        raise Unsupported(f"LayerNormalization parameter '{name}' that broadcasts to the normalized shape")
    return v


@handles("BatchNormalization", attrs=("epsilon", "momentum", "training_mode", "is_test", "spatial",
                                       "consumed_inputs"))
def _batchnorm(imp, ins, at):
    """Inference's BatchNormalization (the running statistics); with training_mode=1 and only its
    output Y read, the batch's own statistics over every axis but the channels (BiT's weight
    standardization, exported as a training-mode batch norm of the conv's weight)."""
    if any(o in imp.read for o in imp.node.output[1:] if o):
        raise Unsupported("the running mean and variance outputs (eqfuse imports models for inference)")
    if at.get("spatial", 1) != 1:
        raise Unsupported("spatial=0")
    eps = f32_float(at.get("epsilon", 1e-5))
    if not at.get("training_mode", 0):
        x, scale, bias, mean, var = [imp.data(v, n) for v, n in zip(ins, imp.node.input)]
        return [imp.op("batchnorm", [x, mean, var, scale, bias], eps=eps), None, None]
    x = imp.data(ins[0], imp.node.input[0])
    rank = imp.type(x).rank
    y = _normalized(imp, x, (0, *range(2, rank)), eps)[0]
    per_channel = (-1,) + (1,) * (rank - 2)
    for k, op in ((1, "mul"), (2, "add")):
        v = imp.data(ins[k], imp.node.input[k])
        y = imp.op(op, [y, v if rank == 2 else imp.op("reshape", [v], shape=per_channel)])
    return [y, None, None]


def axes_of(imp, ins, at, k: int) -> list[int] | None:
    """Axes from the attribute (older opsets) or input k (newer); None when not given."""
    if "axes" in at:
        return list(at["axes"])
    if len(ins) > k and ins[k] is not None:
        return imp.ints(ins[k], "axes")
    return None


@handles("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceSumSquare", attrs=("axes", "keepdims", "noop_with_empty_axes"))
def _reduce(imp, ins, at):
    x = imp.data(ins[0], imp.node.input[0])
    if 0 in [d for d in imp.type(x).shape if isinstance(d, int)]:
        raise Unsupported("zero-size input")
    t = imp.node.op_type
    if t == "ReduceSumSquare":
        x, t = imp.op("mul", [x, x]), "ReduceSum"
    axes = axes_of(imp, ins, at, 1)
    keep = bool(at.get("keepdims", 1))
    if not axes:
        if at.get("noop_with_empty_axes", 0):
            return x
        axes = None
    axis = None if axes is None else tuple(axes)
    name = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min"}[t]
    return imp.op(name, [x], axis=axis, keepdims=keep)


@handles("Transpose", attrs=("perm",))
def _transpose(imp, ins, at):
    x = imp.data(ins[0], imp.node.input[0])
    perm = tuple(at.get("perm", range(imp.type(x).rank - 1, -1, -1)))
    if perm == tuple(range(len(perm))):
        return x
    return imp.op("transpose", [x], perm=perm)


@handles("Reshape", attrs=("allowzero", "shape"))
def _reshape(imp, ins, at):
    x = imp.data(ins[0], imp.node.input[0])
    spec = list(at["shape"]) if "shape" in at else imp.ints(ins[1], "shape")
    return sy.reshape(imp, x, spec, bool(at.get("allowzero", 0)))


@handles("Flatten", attrs=("axis",))
def _flatten(imp, ins, at):
    x = imp.data(ins[0], imp.node.input[0])
    shape = imp.type(x).shape
    axis = at.get("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    return sy.reshape(imp, x, [sy.product(shape[:axis]), sy.product(shape[axis:])])


@handles("Squeeze", "Unsqueeze", attrs=("axes",))
def _squeeze(imp, ins, at):
    x = imp.data(ins[0], imp.node.input[0])
    shape = list(imp.type(x).shape)
    axes = axes_of(imp, ins, at, 1)
    if imp.node.op_type == "Unsqueeze":
        rank = len(shape) + len(axes)
        for a in sorted(a % rank for a in axes):
            shape.insert(a, 1)
    else:
        rank = len(shape)
        drop = {a % rank for a in axes} if axes is not None else {i for i, d in enumerate(shape) if d == 1}
        if any(shape[a] != 1 for a in drop):
            raise ShapeError(f"cannot squeeze axes {sorted(drop)} of shape {shape}")
        shape = [d for i, d in enumerate(shape) if i not in drop]
    return imp.reshape_to(x, tuple(shape))


@handles("Slice", attrs=("starts", "ends", "axes"))
def _slice(imp, ins, at):
    x = imp.data(ins[0], imp.node.input[0])
    if imp.opset < 10:
        starts, ends, axes, steps = list(at["starts"]), list(at["ends"]), at.get("axes"), None
    else:
        starts, ends = imp.ints(ins[1], "starts"), imp.ints(ins[2], "ends")
        axes = imp.ints(ins[3], "axes") if len(ins) > 3 and ins[3] is not None else None
        steps = imp.ints(ins[4], "steps") if len(ins) > 4 and ins[4] is not None else None
    rank = imp.type(x).rank
    axes = list(range(len(starts))) if axes is None else [a % rank for a in axes]
    steps = steps or [1] * len(starts)
    if 0 in steps:
        raise ShapeError(f"Slice steps {steps}: a step must not be 0")
    for axis, lo, hi, step in zip(axes, starts, ends, steps):
        n = imp.type(x).shape[axis]
        if isinstance(n, str):
            if lo == 0 and hi >= BIG and step == 1:
                continue
            if lo < 0 or hi < 0 or hi >= BIG or step != 1:
                raise NeedsDims(f"slice [{lo}:{hi}:{step}] of named dim {n} (bind it with dims=)")
        else:  # (ONNX clamps its starts and ends as Python's slices do, for either sign of the step)
            r = range(n)[max(lo, -BIG):min(hi, BIG):step]
            if len(r) == 0:  # (only a concat takes it: the pass-through half of a whole-head rotary)
                shape = imp.type(x).shape
                return Empty(shape[:axis] + (0,) + shape[axis + 1:], f"empty slice on axis {axis}")
            if step < 0:  # a reversal (torch.flip's export): the rows taken, in their order
                x = imp.op("gather", [x, imp.new_param("slice_rows", np.array(r, np.int64))], axis=axis)
                continue
            lo, hi = r.start, r.stop
            if lo == 0 and hi == n and step == 1:
                continue
        x = imp.op("slice", [x], axis=axis, start=lo, stop=hi, step=step)
    return x


@handles("Concat", attrs=("axis",))
def _concat(imp, ins, at):
    axis = at.get("axis", 0 if imp.opset < 4 else None)
    args = [imp.data(v, n) for v, n in zip(ins, imp.node.input) if not isinstance(v, Empty)]
    empty = [v for v in ins if isinstance(v, Empty)]
    if empty:  # a zero-size operand adds nothing, once its other dims agree
        if not args:
            raise Unsupported(f"{empty[0].why}, concatenated only with empty tensors (zero-size tensors)")
        shape = imp.type(args[0]).shape
        rank = len(shape)
        if axis is None or not -rank <= axis < rank:
            raise ShapeError(f"concat axis {axis} out of range for rank {rank}")
        k = axis % rank
        for e in empty:
            if len(e.shape) != rank or any(a != b for i, (a, b) in enumerate(zip(e.shape, shape)) if i != k):
                raise ShapeError(f"concat of shapes {sy.fmt(shape)} and {sy.fmt(e.shape)} along axis {axis}")
        if len(args) == 1:
            return args[0]
    return imp.op("concat", args, axis=axis)


def conv_geometry(xs, ws, at) -> tuple[list[int], list[tuple[int, int]], list[int], list]:
    """An ONNX Conv's (strides, (begin, end) pads per spatial axis, dilations, dilated kernel spans)
    from its attributes and the shapes of x and w (auto_pad resolved)."""
    nd = len(xs) - 2
    strides = list(at.get("strides", [1] * nd))
    dilations = list(at.get("dilations", [1] * nd))
    spans = [(kk - 1) * d + 1 if isinstance(kk, int) else kk for kk, d in zip(ws[2:], dilations)]
    auto = at.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        p = list(at.get("pads", [0] * (2 * nd)))
        pads = [(p[i], p[i + nd]) for i in range(nd)]
    elif auto == "VALID":
        pads = [(0, 0)] * nd
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for n, kk, s in zip(xs[2:], spans, strides):
            if not isinstance(n, int):
                raise Unsupported("auto_pad SAME over a named spatial dim")
            total = max((math.ceil(n / s) - 1) * s + kk - n, 0)
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
    else:
        raise Unsupported(f"auto_pad {auto!r}")
    return strides, pads, dilations, spans


def _zero_pad_into(imp, x: int, pads: list[tuple[int, int]]):
    """(x, its shape, the conv's pads): a zero Pad of only the spatial axes before the Conv (the TF
    "same" padding that Hugging Face's MobileNetV2 exports before each depthwise conv) joins the
    Conv's own pads when the sum is symmetric, so that the conv reads the unpadded tensor and pads
    the band it copies (no pad kernel, no padded tensor); a sum that is not symmetric (the (0, 1)
    pad before a stride-2 conv) keeps the Pad. A Pad read by other nodes too stays for them."""
    n = imp.graph.nodes[x]
    if n.op != "pad" or n.attr["value"] != 0.0:
        return x, imp.type(x).shape, pads
    p, r = n.attr["pads"], len(imp.type(x).shape)
    if any(p[:2]) or any(p[r:r + 2]):
        return x, imp.type(x).shape, pads
    both = [(a + p[2 + i], b + p[r + 2 + i]) for i, (a, b) in enumerate(pads)]
    if any(a != b for a, b in both):
        return x, imp.type(x).shape, pads
    src = n.args[0]
    return src, imp.type(src).shape, both


@handles("Conv", attrs=("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"))
def _conv(imp, ins, at):
    x, w = imp.data(ins[0], imp.node.input[0]), imp.data(ins[1], imp.node.input[1])
    xs, ws = imp.type(x).shape, imp.type(w).shape
    nd = len(xs) - 2
    if nd not in (1, 2):
        raise Unsupported(f"{nd}-D convolution (eqfuse supports 1-D, NCW, and 2-D, NCHW)")
    group = at.get("group", 1)
    strides, pads, dilations, spans = conv_geometry(xs, ws, at)
    x, xs, pads = _zero_pad_into(imp, x, pads)
    # Asymmetric padding: pad both sides by the larger amount and slice the extra outputs off;
    # when the extra is at the end and the stride does not divide it, one zero pad op pads the
    # ends of those axes by it (TF's "same" padding of a stride-2 conv, as the dynamo exporter
    # writes Hugging Face's MobileNetV2: the pad that rules kernel_conv2d_pad_same* fold into a
    # fused depthwise + 1x1 conv, as they fold the TorchScript exporter's Pad node).
    ends = [0] * len(xs)
    for axis, ((a, b), s) in enumerate(zip(pads, strides), start=2):
        if b > a and (b - a) % s:
            if not isinstance(xs[axis], int):
                raise NeedsDims(f"asymmetric pads {[p for p in pads]} with stride {s} over named dims")
            ends[axis] = b - a
            pads[axis - 2] = (a, a)
    if any(ends):
        x = imp.op("pad", [x], pads=tuple([0] * len(xs) + ends), value=0.0)
        xs = imp.type(x).shape
    pad = [max(a, b) for a, b in pads]
    args = [x, w] + ([imp.data(ins[2], imp.node.input[2])] if len(ins) > 2 and ins[2] is not None else [])
    if nd == 1:
        y = imp.op("conv1d", args, stride=strides[0], padding=pad[0], dilation=dilations[0], group=group)
    else:
        y = imp.op("conv2d", args, stride=pair(strides), padding=pair(pad), dilation=pair(dilations), group=group)
    for axis, ((a, b), s, n, kk) in enumerate(zip(pads, strides, xs[2:], spans), start=2):
        if a == b:
            continue
        first = (max(a, b) - a) // s
        count = (n + a + b - kk) // s + 1
        y = imp.op("slice", [y], axis=axis, start=first, stop=first + count)
    return y


@handles("ConvTranspose", attrs=("auto_pad", "dilations", "group", "kernel_shape", "output_padding",
                                 "output_shape", "pads", "strides"))
def _conv_transpose(imp, ins, at):
    x, w = imp.data(ins[0], imp.node.input[0]), imp.data(ins[1], imp.node.input[1])
    xs, ws = imp.type(x).shape, imp.type(w).shape
    if len(xs) != 4:
        raise Unsupported(f"{len(xs) - 2}-D ConvTranspose (eqfuse supports 2-D, NCHW)")
    if any(d != 1 for d in at.get("dilations", [1, 1])):
        raise Unsupported(f"ConvTranspose with dilations {list(at['dilations'])}")
    if "output_shape" in at:
        raise Unsupported("ConvTranspose with output_shape (give pads and output_padding)")
    if at.get("auto_pad", "NOTSET") not in ("NOTSET", "", "VALID"):
        raise Unsupported(f"ConvTranspose with auto_pad {at['auto_pad']!r}")
    strides = list(at.get("strides", [1, 1]))
    p = list(at.get("pads", [0, 0, 0, 0]))
    outpad = list(at.get("output_padding", [0, 0]))
    args = [x, w] + ([imp.data(ins[2], imp.node.input[2])] if len(ins) > 2 and ins[2] is not None else [])
    # asymmetric pads: the op pads both sides by the smaller amount; the outputs before the larger
    # begin are sliced off, and at the end output_padding (or a slice) gives ONNX's size
    # s (H - 1) + output_padding + k - begin - end
    pad, extra, bounds = [], [], []
    for i in range(2):
        a, b, s, kk, n = p[i], p[i + 2], strides[i], ws[2 + i], xs[2 + i]
        if not (isinstance(n, int) and isinstance(kk, int)):
            raise NeedsDims("ConvTranspose over a named spatial dim (bind it with dims=)")
        lo = min(a, b)
        e = outpad[i] + lo - b
        if not 0 <= outpad[i] < s:
            raise Unsupported(f"ConvTranspose output_padding {outpad} with strides {strides}")
        pad.append(lo)
        extra.append(max(e, 0))
        bounds.append((a - lo, a - lo + s * (n - 1) + outpad[i] + kk - a - b))
    y = imp.op("conv_transpose2d", args, stride=pair(strides), padding=pair(pad), output_padding=pair(extra),
               group=at.get("group", 1))
    for axis, (lo, hi) in enumerate(bounds, start=2):
        if (lo, hi) != (0, imp.type(y).shape[axis]):
            y = imp.op("slice", [y], axis=axis, start=lo, stop=hi)
    return y


@handles("Split", attrs=("axis", "split", "num_outputs"))
def _split(imp, ins, at):
    x = imp.data(ins[0], imp.node.input[0])
    shape = imp.type(x).shape
    axis = at.get("axis", 0) % len(shape)
    n = shape[axis]
    outs = [o for o in imp.node.output]
    if "split" in at:
        sizes = list(at["split"])
    elif len(ins) > 1 and ins[1] is not None:
        sizes = imp.ints(ins[1], "split")
    else:
        if not isinstance(n, int):
            raise NeedsDims(f"Split of named dim {n}")
        k = at.get("num_outputs", len(outs))
        step = -(-n // k)  # the last part may be smaller
        sizes = [min(step, n - i * step) for i in range(k)]
    if not isinstance(n, int):
        raise NeedsDims(f"Split of named dim {n}")
    if sum(sizes) != n or min(sizes) < 0:
        raise ShapeError(f"split sizes {sizes} do not fill dimension {n}")
    res, lo = [], 0
    for s in sizes:  # (an empty part, as a RotaryEmbedding's expansion over the whole head splits off: Empty)
        res.append(x if s == n else imp.op("slice", [x], axis=axis, start=lo, stop=lo + s) if s else
                   Empty(shape[:axis] + (0,) + shape[axis + 1:], "an empty part of a Split"))
        lo += s
    return res


@handles("Range")
def _range(imp, ins, at):
    """Range over constants is folded before any handler; one that reaches here has a bound
    computed from named dims at run time (a decoder's positions past .. past + sequence), which
    folds once they are bound."""
    raise NeedsDims("Range whose bounds depend on named dims (bind them with dims=)")
