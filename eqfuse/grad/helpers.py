"""The structural helpers of derivatives.rw: shape bookkeeping the rule language cannot state.

Each helper expands into ops of the op table at the forward node's concrete shapes (an inverse
permutation, the shape a reduction kept, the pads that undo a slice). None computes anything
that an op does not; `eqfuse check-grads` checks the rules that use them like every other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from eqfuse.grad.emitter import Emitter
from eqfuse.ir.conv_forms import flip, transposed_conv, zero_stuff
from eqfuse.ir.graph import Node
from eqfuse.ir.ops import conv_pads, pair, reduce_axes, slice_bounds, symmetric_pads
from eqfuse.ir.shapes import norm_axis


@dataclass(frozen=True)
class Ctx:
    node: Node  # the forward node
    k: int  # which of its arguments is differentiated


def unbroadcast(em: Emitter, t: int, shape: tuple) -> int:
    """t summed over the axes numpy broadcasting added or stretched to reach its shape from `shape`."""
    s = em.shape(t, concrete=False)
    if s == tuple(shape):
        return t
    if len(s) < len(shape) or any(a != b and b != 1 for a, b in zip(s[len(s) - len(shape):], shape)):
        return em.op("expand", [t], shape=tuple(shape))
    lead = len(s) - len(shape)
    if lead:
        t = em.op("sum", [t], axis=tuple(range(lead)), keepdims=False)
    ones = tuple(i for i, (a, b) in enumerate(zip(em.shape(t, concrete=False), shape)) if b == 1 and a != 1)
    if ones:
        t = em.op("sum", [t], axis=ones, keepdims=True)
    return t


def _unreduce(em, ctx, args, at):
    t, x = args
    shape = em.shape(x)
    axes = reduce_axes({"axis": at["axis"]}, len(shape))
    kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
    if em.shape(t) != kept:
        t = em.op("reshape", [t], shape=kept)
    return t if kept == shape else em.op("expand", [t], shape=shape)


def _count(em, ctx, args, at):
    shape = em.shape(args[0])
    return em.const(math.prod(shape[i] for i in reduce_axes({"axis": at["axis"]}, len(shape))))


def _tail(em, t, axis) -> tuple[int, ...]:
    r = len(em.shape(t, concrete=False))
    return tuple(range(norm_axis(axis, r), r))


def _rowmean(em, ctx, args, at):
    return em.op("mean", [args[0]], axis=_tail(em, args[0], at["axis"]), keepdims=True)


def _rstd(em, ctx, args, at):
    x = args[0]
    axes = _tail(em, x, at["axis"])
    if at["center"]:
        d = em.op("sub", [x, em.op("mean", [x], axis=axes, keepdims=True)])
    else:
        d = x
    var = em.op("mean", [em.op("mul", [d, d])], axis=axes, keepdims=True)
    return em.op("rsqrt", [em.op("add", [var, em.const(at["eps"])])])


def _chan(em, ctx, args, at):
    t, x = args
    r = len(em.shape(x, concrete=False))
    return em.op("reshape", [t], shape=(1, em.shape(t)[0]) + (1,) * (r - 2))


def _unchan(em, ctx, args, at):
    t, x = args
    r = len(em.shape(x, concrete=False))
    return em.op("sum", [t], axis=tuple(i for i in range(r) if i != 1), keepdims=False)


def _swap_last(r: int) -> tuple[int, ...]:
    return tuple(range(r - 2)) + (r - 1, r - 2)


def _rows(em, ctx, args, at):
    """T as a matrix: every axis but the last folded into its rows."""
    shape = em.shape(args[0])
    return em.op("reshape", [args[0]], shape=(math.prod(shape[:-1]), shape[-1]))


def _mT(em, ctx, args, at):
    return em.op("transpose", [args[0]], perm=_swap_last(len(em.shape(args[0], concrete=False))))


def _untranspose(em, ctx, args, at):
    r = len(em.shape(args[0], concrete=False))
    perm = at["perm"]
    if perm is None:
        return em.op("transpose", [args[0]])  # reversing the axes is its own inverse
    inv = [0] * r
    for i, p in enumerate(perm):
        inv[p] = i
    return em.op("transpose", [args[0]], perm=tuple(inv))


def _reshape_as(em, ctx, args, at):
    return em.op("reshape", [args[0]], shape=em.shape(args[1]))


def _pad_axis(em, t, axis, before, after):
    if not before and not after:
        return t
    r = len(em.shape(t))
    pads = [0] * (2 * r)
    pads[axis], pads[r + axis] = before, after
    return em.op("pad", [t], pads=tuple(pads))


def _unslice(em, ctx, args, at):
    t, x = args
    shape = em.shape(x)
    ax = norm_axis(at["axis"], len(shape))
    n = shape[ax]
    lo, _, count = slice_bounds(n, at)
    step = at["step"]
    if step > 1:  # interleave step - 1 zeros after each element: [.., count, 1, ..] -> [.., count, step, ..]
        ts = em.shape(t)
        t = em.op("reshape", [t], shape=ts[:ax] + (count, 1) + ts[ax + 1:])
        t = _pad_axis(em, t, ax + 1, 0, step - 1)
        t = em.op("reshape", [t], shape=ts[:ax] + (count * step,) + ts[ax + 1:])
        if count * step > n - lo:
            t = em.op("slice", [t], axis=ax, start=0, stop=n - lo)
    return _pad_axis(em, t, ax, lo, n - lo - em.shape(t)[ax])


def _unpad(em, ctx, args, at):
    t, x = args
    shape = em.shape(x)
    for d, lo in enumerate(at["pads"][:len(shape)]):
        if em.shape(t)[d] != shape[d]:
            t = em.op("slice", [t], axis=d, start=lo, stop=lo + shape[d])
    return t


def _unconcat(em, ctx, args, at):
    t = args[0]
    ax = norm_axis(at["axis"], len(em.shape(t)))
    sizes = [em.shape(a)[ax] for a in ctx.node.args]
    off = sum(sizes[:ctx.k])
    return em.op("slice", [t], axis=ax, start=off, stop=off + sizes[ctx.k])


def _zeros_like(em, ctx, args, at):
    return em.op("expand", [em.const(0.0)], shape=em.shape(args[0]))


def _dilate(em, t, sh, sw):
    """dy of a strided convolution with (stride - 1) zeros between its elements."""
    return zero_stuff(em, t, sh, sw)


def _flip(em, t, axis):
    return flip(em, t, axis)


def _conv_geometry(em, dy, x, w, at):
    (sh, sw), (ph, pw) = pair(at["stride"]), pair(at["padding"])
    _, _, h, wd = em.shape(x)
    kh, kw = em.shape(w)[2:]
    oh, ow = em.shape(dy)[2:]
    rh, rw = h + 2 * ph - kh - (oh - 1) * sh, wd + 2 * pw - kw - (ow - 1) * sw  # rows no window reached
    return sh, sw, ph, pw, h, wd, kh, kw, rh, rw


def _plain(at) -> bool:
    return at.get("group", 1) == 1 and pair(at.get("dilation", 1)) == (1, 1)


def _conv2d_dx(em, ctx, args, at):
    """dx: the full correlation of the dilated dy with the flipped, transposed kernel, cropped
    (grouped or dilated: the transposed convolution of dy by w, eqfuse.ir.conv_forms)."""
    dy, x, w = args
    if not _plain(at):
        return transposed_conv(em, dy, w, None, at["stride"], at["padding"], em.shape(x)[2:], at["group"],
                               at["dilation"])
    sh, sw, ph, pw, h, wd, kh, kw, rh, rw = _conv_geometry(em, dy, x, w, at)
    d = _dilate(em, dy, sh, sw)
    d = em.op("pad", [d], pads=(0, 0, kh - 1, kw - 1, 0, 0, kh - 1 + rh, kw - 1 + rw))
    wf = _flip(em, _flip(em, em.op("transpose", [w], perm=(1, 0, 2, 3)), 2), 3)
    full = em.op("conv2d", [d, wf])
    if ph:
        full = em.op("slice", [full], axis=2, start=ph, stop=ph + h)
    if pw:
        full = em.op("slice", [full], axis=3, start=pw, stop=pw + wd)
    return full


def _conv2d_dw_grouped(em, dy, x, w, at):
    """dw[o, c, ky, kz] = sum over (n, i, j) of dy[n, o, i, j] x[n, g(o) C/g + c, i s - p + ky d, ...]:
    a conv2d whose images are the group's input channels, whose channels are (group, image)
    pairs in `group` groups and whose kernel is dy, with stride d (the forward dilation) and
    dilation s (the forward stride): [C / g, O, >= kh, >= kw], cropped and transposed."""
    g = at["group"]
    n, c, h, wd = em.shape(x)
    kh, kw = em.shape(w)[2:]
    xt = em.op("reshape", [x], shape=(n, g, c // g, h, wd))
    xt = em.op("transpose", [xt], perm=(2, 1, 0, 3, 4))
    xt = em.op("reshape", [xt], shape=(c // g, g * n, h, wd))
    dt = em.op("transpose", [dy], perm=(1, 0, 2, 3))
    r = em.op("conv2d", [xt, dt], padding=at["padding"], stride=at["dilation"], dilation=at["stride"], group=g)
    rh, rw = em.shape(r)[2:]
    if rh != kh:
        r = em.op("slice", [r], axis=2, start=0, stop=kh)
    if rw != kw:
        r = em.op("slice", [r], axis=3, start=0, stop=kw)
    return em.op("transpose", [r], perm=(1, 0, 2, 3))


def _conv2d_dw(em, ctx, args, at):
    """dw[o, c] = sum over n of x[n, c] correlated with the dilated dy[n, o]: a convolution with
    the batch axis as its channels."""
    dy, x, w = args
    if not _plain(at):
        return _conv2d_dw_grouped(em, dy, x, w, at)
    sh, sw, ph, pw, h, wd, kh, kw, rh, rw = _conv_geometry(em, dy, x, w, at)
    xt = em.op("transpose", [x], perm=(1, 0, 2, 3))
    dt = em.op("transpose", [_dilate(em, dy, sh, sw)], perm=(1, 0, 2, 3))
    r = em.op("conv2d", [xt, dt], padding=(ph, pw))  # [C, O, kh + rh, kw + rw]
    if rh:
        r = em.op("slice", [r], axis=2, start=0, stop=kh)
    if rw:
        r = em.op("slice", [r], axis=3, start=0, stop=kw)
    return em.op("transpose", [r], perm=(1, 0, 2, 3))


def _as_2d(em, t):
    """A conv1d tensor [A, B, L] as conv2d's [A, B, 1, L]."""
    a, b, n = em.shape(t)
    return em.op("reshape", [t], shape=(a, b, 1, n))


def _at_2d(at):
    return {"stride": (1, at["stride"]), "padding": (0, at["padding"]), "dilation": (1, at["dilation"]),
            "group": at["group"]}


def _conv1d_dx(em, ctx, args, at):
    """conv1d's gradients: conv2d's over a height of 1."""
    dy, x, w = args
    r = _conv2d_dx(em, ctx, [_as_2d(em, dy), _as_2d(em, x), _as_2d(em, w)], _at_2d(at))
    return em.op("reshape", [r], shape=em.shape(x))


def _conv1d_dw(em, ctx, args, at):
    dy, x, w = args
    r = _conv2d_dw(em, ctx, [_as_2d(em, dy), _as_2d(em, x), _as_2d(em, w)], _at_2d(at))
    return em.op("reshape", [r], shape=em.shape(w))


def _evened(em, x, at):
    """(x zero-padded by what is more than the symmetric part of conv2d's padding, the attributes
    with that part, the pad's (top, left)): an unevenly padded conv2d ([top, left, bottom, right])
    is the evenly padded conv2d of the padded x."""
    t, left, b, r = conv_pads(at["padding"])
    h, w = min(t, b), min(left, r)
    xp = em.op("pad", [x], pads=(0, 0, t - h, left - w, 0, 0, b - h, r - w), value=0.0)
    return xp, dict(at, padding=h if h == w else (h, w)), (t - h, left - w)


def _conv2d_uneven_dx(em, ctx, args, at):
    """dx of an unevenly padded conv2d: the padded x's, cropped to x."""
    dy, x, w = args
    if symmetric_pads(at["padding"]) is not None:
        return _conv2d_dx(em, ctx, args, at)
    xp, even, (t, left) = _evened(em, x, at)
    r = _conv2d_dx(em, ctx, [dy, xp, w], even)
    _, _, h, wd = em.shape(x)
    if em.shape(r)[2] != h:
        r = em.op("slice", [r], axis=2, start=t, stop=t + h)
    if em.shape(r)[3] != wd:
        r = em.op("slice", [r], axis=3, start=left, stop=left + wd)
    return r


def _conv2d_uneven_dw(em, ctx, args, at):
    dy, x, w = args
    if symmetric_pads(at["padding"]) is not None:
        return _conv2d_dw(em, ctx, args, at)
    xp, even, _ = _evened(em, x, at)
    return _conv2d_dw(em, ctx, [dy, xp, w], even)


# name -> (function, tensor arguments, attribute names)
HELPERS: dict[str, tuple[Callable, int, tuple[str, ...]]] = {
    "unreduce": (_unreduce, 2, ("axis", "keepdims")),
    "count": (_count, 1, ("axis",)),
    "rowmean": (_rowmean, 1, ("axis",)),
    "rstd": (_rstd, 1, ("axis", "eps", "center")),
    "chan": (_chan, 2, ()),
    "unchan": (_unchan, 2, ()),
    "mT": (_mT, 1, ()),
    "rows": (_rows, 1, ()),
    "untranspose": (_untranspose, 1, ("perm",)),
    "reshape_as": (_reshape_as, 2, ()),
    "unslice": (_unslice, 2, ("axis", "start", "stop", "step")),
    "unpad": (_unpad, 2, ("pads",)),
    "unconcat": (_unconcat, 1, ("axis",)),
    "zeros_like": (_zeros_like, 1, ()),
    "conv2d_dx": (_conv2d_uneven_dx, 3, ("stride", "padding", "dilation", "group")),
    "conv2d_dw": (_conv2d_uneven_dw, 3, ("stride", "padding", "dilation", "group")),
    "conv1d_dx": (_conv1d_dx, 3, ("stride", "padding", "dilation", "group")),
    "conv1d_dw": (_conv1d_dw, 3, ("stride", "padding", "dilation", "group")),
}
