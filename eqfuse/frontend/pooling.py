"""Pooling as the frontends read it, on the op table's max_pool2d and avg_pool2d.

Those ops take one padding per axis on both sides and floor their output size. ONNX's MaxPool
and AveragePool (and torch's max_pool2d / avg_pool2d) also take pads that differ at the two ends,
auto_pad, ceil_mode (the output size rounded up: a last window that runs past the end, as
GoogLeNet, SqueezeNet and Funnel pool), and 1-D windows. `pool` spells those with the same ops:

- a 1-D pool is the 2-D pool of x with a height of 1;
- when the ends' pads differ, or ceil_mode adds a window, x is padded explicitly (max: with
  the least value, which no window's max is, since every window holds a tap of x; average: with
  zeros) and pooled without padding; an average then divides by the number of taps each window
  counts (the taps in x, or with count_include_pad those in x and its explicit pads, never
  those ceil_mode adds) instead of the window's size: the pool of a mask of ones over the
  counted region, a constant the optimizer folds.
"""

from __future__ import annotations

from collections.abc import Callable

Op = Callable[..., int]  # op(name, [operands], **attrs) -> a node


def pool_extent(size: int, k: int, s: int, begin: int, end: int, ceil: bool) -> tuple[int, int]:
    """(output size, padding ceil_mode adds at the end) of one axis. With ceil_mode a last
    window must still start inside x or its begin padding (ONNX's and torch's rule)."""
    span = size + begin + end - k
    if span < 0:
        raise ValueError(f"a window of {k} does not fit {size} with pads {begin}, {end}")
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + begin:
        out -= 1
    return out, max(0, (out - 1) * s + k - (size + begin + end))


def same_pads(size: int, k: int, s: int, upper: bool) -> tuple[int, int]:
    """auto_pad SAME_UPPER / SAME_LOWER: the pads that make the output ceil(size / s) long,
    the odd one at the end (upper) or the beginning."""
    total = max(0, (-(-size // s) - 1) * s + k - size)
    return (total // 2, total - total // 2) if upper else (total - total // 2, total // 2)


def pool(op: Op, ones: Callable[[tuple[int, ...]], int], x: int, shape: tuple[int, ...], kind: str,
         kernel: list[int], stride: list[int], begins: list[int], ends: list[int], ceil: bool,
         count_include_pad: bool = False, least: float = float("-inf")) -> int:
    """max ("max") or average ("avg") pooling of x [N, C, *spatial] (one or two spatial axes);
    `ones(shape)` makes a tensor of ones, `least` is the least value of x's dtype."""
    rank = len(shape)
    if rank not in (3, 4) or not (len(kernel) == len(stride) == len(begins) == len(ends) == rank - 2):
        raise ValueError(f"pooling over {rank - 2} spatial axes with a {len(kernel)}-d window")
    if rank == 3:  # 1-D: a height of 1
        y = pool(op, ones, op("reshape", [x], shape=(*shape[:2], 1, shape[2])), (*shape[:2], 1, shape[2]),
                 kind, [1, *kernel], [1, *stride], [0, *begins], [0, *ends], ceil, count_include_pad, least)
        return op("reshape", [y], shape=(*shape[:2], -1))
    spatial = shape[2:]
    extents = [pool_extent(n, k, s, b, e, ceil) for n, k, s, b, e in zip(spatial, kernel, stride, begins, ends)]
    extra = [e for _, e in extents]
    kw = dict(kernel_size=tuple(kernel), stride=tuple(stride))
    name = "max_pool2d" if kind == "max" else "avg_pool2d"
    if begins == ends and not any(extra) and all(b < k for b, k in zip(begins, kernel)):
        attrs = {} if kind == "max" else {"count_include_pad": count_include_pad}
        return op(name, [x], padding=tuple(begins), **kw, **attrs)
    tails = [e + more for e, more in zip(ends, extra)]
    padded = op("pad", [x], pads=(0, 0, *begins, 0, 0, *tails), value=least if kind == "max" else 0.0)
    if kind == "max":
        return op(name, [padded], padding=(0, 0), **kw)
    y = op(name, [padded], padding=(0, 0), count_include_pad=True, **kw)
    if count_include_pad and not any(extra):  # every window's taps are counted
        return y
    # the counted taps over the window's size, per output position: those of x, or with
    # count_include_pad of x and its explicit pads (never ceil_mode's)
    if count_include_pad:
        region = ones((1, 1, *(n + b + e for n, b, e in zip(spatial, begins, ends))))
        mask = op("pad", [region], pads=(0, 0, 0, 0, 0, 0, *extra), value=0.0)
    else:
        mask = op("pad", [ones((1, 1, *spatial))], pads=(0, 0, *begins, 0, 0, *tails), value=0.0)
    return op("div", [y, op(name, [mask], padding=(0, 0), count_include_pad=True, **kw)])
