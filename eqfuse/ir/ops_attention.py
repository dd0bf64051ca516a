"""The op table, continued: the gradients of attention, which recompute the probabilities.

With S = q @ k^T * scale (+ mask), P = softmax(S) over the keys, and dy the gradient of the
attention value P @ v:

    attention_dv(q, k, dy)     = P^T @ dy
    attention_dq(q, k, v, dy)  = dS @ k        dS = P * (dP - rowsum(dP * P)) * scale,
    attention_dk(q, k, v, dy)  = dS^T @ q      dP = dy @ v^T

each with an optional last argument, the additive mask (f32, broadcast to the scores' shape).
q, k, v and dy share their batch axes; q is [..., Sq, D], k [..., Sk, D], v [..., Sk, Dv] and
dy [..., Sq, Dv]. These ops are what the optimizer's attention-gradient rules
(eqfuse/optimizer/rules/training.rw) rewrite the backward graph of softmax(q @ k^T * c) @ v into:
their kernels (eqfuse/backend/kinds/attention_grad.py) recompute P a row at a time, so the
Sq x Sk probabilities are never stored, which the cost model weighs against storing them.
"""

from __future__ import annotations

import numpy as np

from eqfuse.errors import ShapeError
from eqfuse.ir.ops import OPS, Attr, define
from eqfuse.ir.shapes import TType, broadcast, fmt

ATTRS = (Attr("scale", "float", 1.0), Attr("zero_nan", "bool", False))
# op -> (its tensor arguments without the mask, the argument whose shape the result has)
ARGS = {"attention_dv": (("q", "k", "dy"), "v"), "attention_dq": (("q", "k", "v", "dy"), "q"),
        "attention_dk": (("q", "k", "v", "dy"), "k")}


def _infer(name: str):
    names, like = ARGS[name]

    def infer(ts, attrs):
        t = dict(zip(names, ts))
        q, k, dy = t["q"], t["k"], t["dy"]
        v = t.get("v", TType(k.shape[:-1] + dy.shape[-1:]) if k.rank >= 2 and dy.rank >= 1 else k)
        if any(x.rank < 2 for x in (q, k, v, dy)) or any(x.dtype != "f32" for x in ts):
            raise ShapeError(f"{name} needs f32 tensors of rank >= 2, got {', '.join(fmt(x.shape) for x in ts)}")
        batch = q.shape[:-2]
        want = {"k": batch + (k.shape[-2], q.shape[-1]), "v": batch + (k.shape[-2], v.shape[-1]),
                "dy": batch + (q.shape[-2], v.shape[-1])}
        for nm, w in want.items():
            if tuple(t.get(nm, v).shape) != tuple(w):
                raise ShapeError(f"{name}: {nm} must be {fmt(w)} for q {fmt(q.shape)} (the batch axes equal, "
                                 f"keys {k.shape[-2]}), got {fmt(t.get(nm, v).shape)}")
        if len(ts) > len(names):
            scores = batch + (q.shape[-2], k.shape[-2])
            if ts[-1].rank > len(scores) or tuple(broadcast(ts[-1].shape, scores)) != tuple(scores):
                raise ShapeError(f"{name}: the mask {fmt(ts[-1].shape)} does not broadcast to the scores "
                                 f"{fmt(scores)}")
        return TType(t.get(like, v).shape)
    return infer


def attention_grad_flops(name: str, batch_rows: int, Sk: int, D: int, Dv: int) -> int:
    """FLOPs of one attention gradient over batch_rows query rows (batch x Sq) and Sk keys, as its
    kernel computes it: the scores (and dP) recomputed, then the accumulation; dk and dv first
    take each query row's softmax statistics (scores, and dP for dk) in a pass of their own."""
    pairs = batch_rows * Sk
    per = {"attention_dq": 2 * D + Dv, "attention_dv": 2 * D + Dv, "attention_dk": 3 * D + 2 * Dv}[name]
    return 2 * pairs * per + 6 * pairs  # and about six per pair for the exp and the softmax


def _swap(x):
    return np.swapaxes(x, -1, -2)


def attention_grad_numpy(name: str, args, attrs) -> np.ndarray:
    """The gradient, through the op table's softmax (so NaN rows follow its zero_nan rule)."""
    names, _ = ARGS[name]
    t = dict(zip(names, args))
    q, k, dy = t["q"], t["k"], t["dy"]
    scale = q.dtype.type(attrs["scale"])
    s = q @ _swap(k) * scale
    if len(args) > len(names):
        s = s + args[-1]
    p = OPS["softmax"].numpy([s], {"axis": -1, "zero_nan": attrs["zero_nan"]})
    if name == "attention_dv":
        return _swap(p) @ dy
    dp = dy @ _swap(t["v"])
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True)) * scale
    return ds @ k if name == "attention_dq" else _swap(ds) @ q


def _numpy(name: str):
    return lambda args, attrs: attention_grad_numpy(name, args, attrs)


for _name, (_names, _) in ARGS.items():
    define(name=_name, kind="attention_grad", arity=(len(_names), len(_names) + 1), infer=_infer(_name), attrs=ATTRS,
        numpy=_numpy(_name))
