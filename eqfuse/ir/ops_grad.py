"""The op table, continued: the row ops that derivative rules write (eqfuse/grad/derivatives.rw).

    softmax_grad(dy, y, axis=)          y * (dy - sum(dy * y, axis, keepdims))      y = softmax(x)
    layernorm_grad(dy, x, g, axis=, eps=)
        rstd * (g dy - mean(g dy) - xhat * mean(g dy xhat))   xhat = (x - mean(x)) * rstd

over the same rows as the forward op (softmax: its one axis; layernorm: the axes from axis= to
the last). They are row ops: one kernel walks each row in cache (eqfuse/backend/kinds/row.py,
csrc_templates/row_grad.c), with dy's pointwise prologue (the gradient arriving from the loss)
fused in front and an epilogue behind, where primitive spellings would be several reductions and
pointwise kernels.
"""

from __future__ import annotations

import numpy as np

from eqfuse.errors import ShapeError
from eqfuse.ir.ops import Attr, define, norm_params
from eqfuse.ir.shapes import TType, fmt, norm_axis


def _softmax_grad_infer(ts, attrs):
    dy, y = ts
    norm_axis(attrs["axis"], dy.rank)
    if tuple(dy.shape) != tuple(y.shape):
        raise ShapeError(f"softmax_grad needs dy and y of one shape, got {fmt(dy.shape)} and {fmt(y.shape)}")
    return TType(dy.shape)


def _softmax_grad_np(args, attrs):
    dy, y = args
    return y * (dy - np.sum(dy * y, axis=attrs["axis"], keepdims=True))


def _layernorm_grad_infer(ts, attrs):
    dy, x, g = ts
    ax = norm_axis(attrs["axis"], x.rank)
    if tuple(dy.shape) != tuple(x.shape):
        raise ShapeError(f"layernorm_grad needs dy and x of one shape, got {fmt(dy.shape)} and {fmt(x.shape)}")
    norm_params([g], x.shape[ax:], "layernorm_grad", ("gamma",))
    return TType(x.shape)


def _layernorm_grad_np(args, attrs):
    dy, x, g = args
    axes = tuple(range(norm_axis(attrs["axis"], x.ndim), x.ndim))
    mu = np.mean(x, axis=axes, keepdims=True)
    rstd = 1 / np.sqrt(np.mean(np.square(x - mu), axis=axes, keepdims=True) + x.dtype.type(attrs["eps"]))
    xhat = (x - mu) * rstd
    gdy = g * dy
    return rstd * (gdy - np.mean(gdy, axis=axes, keepdims=True) - xhat * np.mean(gdy * xhat, axis=axes, keepdims=True))


define(name="softmax_grad", kind="row", arity=(2, 2), infer=_softmax_grad_infer, numpy=_softmax_grad_np,
    attrs=(Attr("axis", "int", -1),), flops=4)
define(name="layernorm_grad", kind="row", arity=(3, 3), infer=_layernorm_grad_infer, numpy=_layernorm_grad_np,
    attrs=(Attr("axis", "int", -1), Attr("eps", "float", 1e-5)), flops=12)


