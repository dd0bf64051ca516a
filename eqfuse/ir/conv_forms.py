"""conv1d and conv_transpose2d written as conv2d, and the transposed convolution that a
conv2d's input gradient is.

The backend has one convolution, conv2d (dense, grouped, depthwise, strided, dilated). The other
two convolutions of the op table become conv2d here, before the optimizer and the backend see
them (`expand_convs`); the .g text keeps them as written (`eqfuse opt` prints the graph it
optimized, in which they are conv2d):

- conv1d(x [N, C, W], w [O, I, K]) is conv2d over a height of 1: reshape x to [N, C, 1, W] and
  w to [O, I, 1, K], stride, padding and dilation [1, s], [0, p], [1, d], and reshape back (after
  the one-input pointwise ops that follow it, which then join the conv2d's kernel);
- conv_transpose2d(x [N, C, H, W], w [C, O / g, kh, kw]) scatters each input pixel times the
  kernel into the output at stride x pixel - padding. That is a stride-1 conv2d over the input
  with (stride - 1) zeros between its pixels, padded by (kh - 1) x dilation - padding, with the
  kernel flipped and its two channel axes swapped within each group (`transposed_conv`). The
  same construction is the gradient of conv2d with respect to its input (eqfuse.grad.helpers).

A conv2d padded unevenly (padding [top, left, bottom, right]) becomes a zero pad op of what is
more than the conv2d's symmetric part, then the conv2d of that part: only the fused depthwise +
1x1 conv kernel lowers uneven padding, and the fusion rules kernel_conv2d_pad_same* fold the pad
back into it there.

`transposed_conv` is written against an emitter (`op(name, args, **attrs)`, `shape(t)`): the
gradient's (eqfuse.grad.emitter) or `_GraphEm` below.
"""

from __future__ import annotations

from dataclasses import replace

from eqfuse.ir.graph import Graph, Node
from eqfuse.errors import ShapeError
from eqfuse.ir.ops import OPS, complete_attrs, conv_pads, pair, symmetric_pads

EXPANDED = ("conv1d", "conv_transpose2d")


def zero_stuff(em, t, sh: int, sw: int):
    """t [N, C, H, W] with (stride - 1) zeros between its pixels: [N, C, (H-1) sh + 1, (W-1) sw + 1]."""
    if sh == 1 and sw == 1:
        return t
    n, c, h, w = em.shape(t)
    t = em.op("reshape", [t], shape=(n, c, h, 1, w, 1))
    t = em.op("pad", [t], pads=(0, 0, 0, 0, 0, 0, 0, 0, 0, sh - 1, 0, sw - 1))
    t = em.op("reshape", [t], shape=(n, c, h * sh, w * sw))
    if sh > 1:
        t = em.op("slice", [t], axis=2, start=0, stop=(h - 1) * sh + 1)
    if sw > 1:
        t = em.op("slice", [t], axis=3, start=0, stop=(w - 1) * sw + 1)
    return t


def flip(em, t, axis: int):
    k = em.shape(t)[axis]
    if k == 1:
        return t
    idx = em.op("range", [], start=k - 1, stop=-1, step=-1, dtype="i64")
    return em.op("gather", [t, idx], axis=axis)


def transposed_weights(em, w, group: int):
    """w [C, O / g, kh, kw] (conv_transpose2d's layout, or a conv2d's OIHW seen from its output)
    as the OIHW weights of the conv2d that computes the transposed conv: [O, C / g, kh, kw], the
    two channel axes swapped within each group, the window flipped."""
    c, og, kh, kw = em.shape(w)
    if group == 1:
        t = em.op("transpose", [w], perm=(1, 0, 2, 3))
    else:
        t = em.op("reshape", [w], shape=(group, c // group, og, kh, kw))
        t = em.op("transpose", [t], perm=(0, 2, 1, 3, 4))
        t = em.op("reshape", [t], shape=(group * og, c // group, kh, kw))
    return flip(em, flip(em, t, 2), 3)


def transposed_conv(em, x, w, b, stride, padding, out_hw, group: int = 1, dilation=(1, 1)):
    """The transposed convolution of x [N, C, H, W] by w [C, O / g, kh, kw] (plus bias b [O] or
    None): out[n, o, y, z] = sum over (c, i, j) of x[n, c, i, j] w[c, o', ky, kz] where
    y = i stride - padding + ky dilation (likewise z), for output size out_hw; as a conv2d over
    the zero-stuffed, padded input (see the module docstring)."""
    (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(padding), pair(dilation)
    kh, kw = em.shape(w)[2:]
    z = zero_stuff(em, x, sh, sw)
    zh, zw = em.shape(z)[2:]
    pads = []
    for k, d, p, out, n in ((kh, dh, ph, out_hw[0], zh), (kw, dw, pw, out_hw[1], zw)):
        span = (k - 1) * d + 1
        lo = span - 1 - p
        hi = out + span - 1 - lo - n  # so that the conv's output has `out` pixels
        pads.append((lo, hi))
    # a negative pad drops input pixels no output reads
    for axis, (lo, hi) in ((2, pads[0]), (3, pads[1])):
        n = em.shape(z)[axis]
        if lo < 0 or hi < 0:
            z = em.op("slice", [z], axis=axis, start=max(0, -lo), stop=n + min(0, hi))
    (lo_h, hi_h), (lo_w, hi_w) = ((max(0, a), max(0, b_)) for a, b_ in pads)
    # the conv's own padding takes the symmetric part, a pad op the rest
    ch, cw = min(lo_h, hi_h), min(lo_w, hi_w)
    rest = (lo_h - ch, lo_w - cw, hi_h - ch, hi_w - cw)
    if any(rest):
        z = em.op("pad", [z], pads=(0, 0, rest[0], rest[1], 0, 0, rest[2], rest[3]))
    wf = transposed_weights(em, w, group)
    args = [z, wf] + ([b] if b is not None else [])
    return em.op("conv2d", args, padding=(ch, cw), dilation=(dh, dw), group=group)


class _GraphEm:
    """Appends typed ops to a graph (the interface transposed_conv needs)."""

    def __init__(self, g: Graph, pos=None):
        self.g, self.pos = g, pos

    def shape(self, t):
        return self.g.nodes[t].type.shape

    def op(self, name, args, **attrs):
        full = complete_attrs(OPS[name], attrs)
        t = OPS[name].infer([self.g.nodes[a].type for a in args], full)
        return self.g.add(Node(name, tuple(args), tuple(full.items()), t, pos=self.pos))


def _uneven(n: Node) -> bool:
    return n.op == "conv2d" and symmetric_pads(n.attr["padding"]) is None


def _reshape_to(shape) -> tuple[int, ...]:
    """A reshape's shape= for `shape`: its one named dim (a batch left named) as -1."""
    named = [d for d in shape if not isinstance(d, int)]
    if len(named) > 1:
        raise ShapeError(f"a conv1d over {list(shape)}: more than one named dim (bind them with dims=)")
    return tuple(d if isinstance(d, int) else -1 for d in shape)


def expand_node(em, n: Node, args: list[int]) -> int:
    """The conv2d form of a conv1d or conv_transpose2d node n over the ids `args`; a conv2d
    padded unevenly as a pad op and a conv2d padded evenly."""
    at = n.attr
    if _uneven(n):
        t, left, b, r = conv_pads(at["padding"])
        h, w = min(t, b), min(left, r)
        x = em.op("pad", [args[0]], pads=(0, 0, t - h, left - w, 0, 0, b - h, r - w), value=0.0)
        return em.op("conv2d", [x, *args[1:]], **dict(at, padding=h if h == w else (h, w)))  # (as rules write it)
    if n.op == "conv1d":
        (N, C, W), (O, I, K) = em.shape(args[0]), em.shape(args[1])
        x = em.op("reshape", [args[0]], shape=_reshape_to((N, C, 1, W)))
        w = em.op("reshape", [args[1]], shape=(O, I, 1, K))
        y = em.op("conv2d", [x, w, *args[2:]], stride=(1, at["stride"]), padding=(0, at["padding"]),
                  dilation=(1, at["dilation"]), group=at["group"])
        return em.op("reshape", [y], shape=_reshape_to(n.type.shape))
    assert n.op == "conv_transpose2d"
    b = args[2] if len(args) == 3 else None
    return transposed_conv(em, args[0], args[1], b, at["stride"], at["padding"], n.type.shape[2:], at["group"])


def expand_convs(g: Graph, body: bool = False) -> Graph:
    """g with every conv1d and conv_transpose2d (in kernel bodies too) as conv2d, and every
    unevenly padded conv2d outside kernel bodies (a kernel block's stays, for the fused depthwise
    + 1x1 conv) as a pad and an evenly padded conv2d; g itself when it has none. Types must be
    concrete where they are."""
    if not any(n.op in EXPANDED or _uneven(n) for _, _, n in g.walk()):
        return g
    out = Graph(g.name, pos=g.pos)
    em = _GraphEm(out)
    ids: dict[int, int] = {}
    # a conv1d's reshape back to [N, O, W] -> the conv2d-shaped value it views: a one-input
    # pointwise op over it is applied before the reshape instead (elementwise, it commutes with
    # any reshape), so that it can join the conv2d's kernel as its epilogue (Whisper's GELU after
    # its conv1d: benchmarks/bench_conv.py --set whisper)
    viewed: dict[int, int] = {}
    for i, n in enumerate(g.nodes):
        args = [ids[a] for a in n.args]
        if (n.body is None and len(args) == 1 and args[0] in viewed and OPS.get(n.op) is not None
                and OPS[n.op].kind == "pointwise"):
            em.pos = n.pos
            inner = em.op(n.op, [viewed[args[0]]], **dict(n.attr))
            ids[i] = em.op("reshape", [inner], shape=_reshape_to(n.type.shape))
            viewed[ids[i]] = inner
            if n.name is not None:
                out.nodes[ids[i]] = replace(out.nodes[ids[i]], name=n.name)
        elif n.op in EXPANDED or (_uneven(n) and not body):
            em.pos = n.pos
            ids[i] = expand_node(em, n, args)
            if n.op == "conv1d":
                viewed[ids[i]] = out.nodes[ids[i]].args[0]
            if n.name is not None and out.nodes[ids[i]].name is None:
                out.nodes[ids[i]] = replace(out.nodes[ids[i]], name=n.name)
        else:
            inner = expand_convs(n.body, body=True) if n.body is not None else None
            ids[i] = out.add(replace(n, args=tuple(args), body=inner))
    out.inputs = [ids[i] for i in g.inputs]
    out.outputs = [ids[o] for o in g.outputs]
    return out
