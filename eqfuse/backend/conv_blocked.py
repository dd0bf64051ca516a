"""The blocked channel layout inside a compiled graph: [N][C / VL][H][W][VL], VL floats per vector.

A direct conv (conv_direct.c) reads its input a pixel's channel block at a time and computes a
register tile of pixels x channel vectors: in the blocked layout its input copy is a row copy
and its store a vector store, where NCHW costs a gather and a transposition. `block_between_convs`
decides, once every kernel is planned, which tensors are stored so: a tensor whose producer can
write the layout and whose every reader can read it, and that is neither a graph output nor
written into another tensor's storage. Producers: direct convs (channels in the lanes) and
max / avg pooling. Readers: a direct conv's input x, an operand of a direct conv's epilogue of
the conv's own shape (a residual add: read at the output element's blocked offset), pooling's
input, and a 1x1 conv planned as im2col + GEMM, which is planned again as a direct conv (its
input then needs no conversion; MLAS runs its NCHWc 1x1 convs the same way). The graph's inputs
and outputs, and every tensor any other kernel reads, stay NCHW: the layout changes only inside.
"""

from __future__ import annotations

import os
from dataclasses import replace

from eqfuse.backend.conv_direct import ConvDirectDetail, mark_bound, plan_conv_direct
from eqfuse.backend.plan import KernelPlan
from eqfuse.ir.graph import Graph
from eqfuse.ir.kernels import K
from eqfuse.ir.ops import _pair
from eqfuse.machine import machine

POOL_OPS = ("max_pool2d", "avg_pool2d")


def _is_pool(q: KernelPlan) -> bool:
    return q.kind == K.INDEX and getattr(q.detail, "op", None) in POOL_OPS


def _conv_input(q: KernelPlan, x: int) -> bool:
    """Whether body input x is the kernel's conv2d input and read by nothing else in it."""
    body = q.body
    return body.nodes[q.shape.anchor].args[0] == x and sum(a == x for n in body.nodes for a in n.args) == 1


def _direct_1x1(q: KernelPlan) -> bool:
    """An im2col conv that the direct kernel can run instead: a 1x1 window, no views, its own
    storage (the direct kernel writes NCHW contiguous or blocks)."""
    if q.kind != K.CONV2D or isinstance(q.detail, ConvDirectDetail) or q.in_strides or q.into is not None \
            or q.out_strides is not None:
        return False
    cv = q.body.nodes[q.shape.anchor]
    return tuple(q.body.nodes[cv.args[1]].type.shape[2:]) == (1, 1) and tuple(cv.type.shape) == tuple(q.out_shape)


def reads_blocked(q: KernelPlan, k: int, vl: int) -> str | None:
    """How q can read its argument k in blocks of vl channels: "x" (a direct conv's input),
    "operand" (an operand of a direct conv's epilogue, of the output's shape), "pool" (pooling's
    input), "replan" (the input of a 1x1 conv to plan again as direct); None: it cannot."""
    body = q.body
    x = body.inputs[k]
    shape = tuple(body.nodes[x].type.shape)
    if len(shape) != 4 or shape[1] % vl or body.nodes[x].type.dtype != "f32" or k in q.in_strides:
        return None
    d = q.detail
    if _is_pool(q):
        return "pool"
    if isinstance(d, ConvDirectDetail):
        if d.pixels or d.vl != vl:
            return None
        cv = body.nodes[q.shape.anchor]
        if _conv_input(q, x):
            return "x" if d.cb == vl else None
        if x in cv.args or shape != tuple(q.out_shape) or d.O % vl:
            return None
        return "operand"
    if _direct_1x1(q) and _conv_input(q, x) and machine().simd_floats == vl:
        return "replan"
    return None


def _writes_blocked(p: KernelPlan, vl: int) -> bool:
    d = p.detail
    if isinstance(d, ConvDirectDetail):
        return not d.pixels and d.vl == vl and d.O % vl == 0
    # a pool writes blocks only from blocks: from NCHW, each tap of a pixel's VL channels is a
    # gather of VL planes (a ResNet-18 stem's 3x3/2 pool of 2 x 16 x 32 x 32, 43.6 µs against
    # 7.2 for the NCHW pool and the next conv's own copy into blocks)
    return _is_pool(p) and p.out_shape[1] % vl == 0 and p.body.nodes[p.shape.anchor].type.dtype == "f32" \
        and p.detail.in_blocked


def _replan_direct(q: KernelPlan) -> None:
    """Plan the im2col 1x1 conv q again as a direct conv (its bound weights blocked once)."""
    old = q.prepack
    q.tiles, q.detail, q.uops = {}, None, []
    assert plan_conv_direct(q, machine(), force=True)
    if old is not None:
        mark_bound(q, {q.body.inputs[old.arg]})


def block_between_convs(kg: Graph, plans: list[KernelPlan]) -> None:
    """Store in blocks of VL channels every tensor whose producer can write them and whose
    readers can all read them (see the module's docstring); a 1x1 conv among the readers is
    planned again as a direct conv. Each plan's detail records which of its tensors are blocked:
    in_blocked / out_blocked, and for a direct conv `blocked_args`, the epilogue operands."""
    vl = machine().simd_floats
    readers: dict[int, list[tuple[KernelPlan, int]]] = {}
    for q in plans:
        for k, a in enumerate(q.args):
            readers.setdefault(a, []).append((q, k))
    changed = True
    while changed:  # (a 1x1 conv planned again as direct can then write blocks itself)
        changed = False
        for p in plans:
            if getattr(p.detail, "out_blocked", False) or not _writes_blocked(p, vl) or p.node in kg.outputs \
                    or p.into is not None or p.out_strides is not None:
                continue
            rs = readers.get(p.node, [])
            how = [reads_blocked(q, k, vl) for q, k in rs]
            if not rs or None in how:
                continue
            changed = True
            _mark_out(p)
            for (q, k), h in zip(rs, how):
                if h == "replan":
                    _replan_direct(q)
                    h = "x"
                _mark_in(q, k, h)


def _mark_out(p: KernelPlan) -> None:
    p.detail = replace(p.detail, out_blocked=True)
    vl = machine().simd_floats
    p.uops = [replace(u, what=f"{u.what}, into blocks of {vl} channels (read so by the next kernels)")
              if u.op == "Store" else u for u in p.uops]


def _mark_in(q: KernelPlan, k: int, how: str) -> None:
    if how == "operand":
        q.detail = replace(q.detail, blocked_args=tuple(sorted(set(q.detail.blocked_args) | {k})))
        return
    # read in place along output rows (the padded copy cost 3-4% of a 3x3 conv's time at 56 x 56,
    # 64 channels); EQFUSE_CONV_INPLACE=0 keeps the copy (to measure both)
    if how == "pool":
        q.detail = replace(q.detail, in_blocked=True)
        return
    in_place = q.detail.rows and os.environ.get("EQFUSE_CONV_INPLACE", "1") != "0"
    q.detail = replace(q.detail, in_blocked=True, in_place=in_place)
    what = ("input, in blocks already, read in place (a tile's window copied, zero padded, at the image's left "
            "and right edges)" if in_place else "input, in blocks already, to a zero-padded copy (a row copy)")
    q.uops = [replace(u, what=what) if u.what.startswith("input to a zero-padded copy") else u for u in q.uops]


def pool_blocked(an, x: str, xs, out, par: bool, in_blocked: bool, out_blocked: bool, vl: int) -> list[str]:
    """C lines of a max or avg pooling over VL channels at a time, the input and the output each
    NCHW or in blocks of VL channels: one vector per output pixel, the window's in-bounds taps
    (max_pool2d keeps a NaN, as the NCHW loop does)."""
    N, C, H, W = xs[0]
    OH, OW = out[2], out[3]
    (kh, kw), (sh, sw), (ph, pw) = (_pair(an.attr["kernel_size"]), _pair(an.attr["stride"] or an.attr["kernel_size"]),
                                    _pair(an.attr["padding"]))
    is_max = an.op == "max_pool2d"
    if is_max and kh * kw <= 25 and ph < kh and pw < kw:
        return _max_pool_taps(x, (N, C, H, W), (OH, OW), (kh, kw), (sh, sw), (ph, pw), par, in_blocked, out_blocked, vl)
    # nb = n x C / VL + channel block; a pixel's VL channels: VL consecutive floats (blocked) or
    # VL planes apart (NCHW, nb x VL being the block's first plane)
    src = f"(nb * {H} + h) * {W * vl}L + w * {vl}" if in_blocked else f"nb * {vl * H * W}L + h * {W}L + w"
    lane_in = "l" if in_blocked else f"l * {H * W}L"
    dst = f"(nb * {OH} + oh) * {OW * vl}L + ow * {vl} + l" if out_blocked else \
        f"nb * {vl * OH * OW}L + l * {OH * OW}L + oh * {OW}L + ow"
    val = "a[l] = ((v > a[l]) | (v != v)) ? v : a[l];" if is_max else "a[l] += v;"
    if is_max:
        fin = "a[l]"
    elif an.attr["count_include_pad"]:
        fin = f"a[l] / {kh * kw}.0f"
    else:
        fin = "a[l] / cnt"
    return [f"#pragma omp parallel for if ({int(par)})",
            f"for (long t = 0; t < {N * (C // vl) * OH}; t++) {{",
            f"    const long nb = t / {OH}, oh = t % {OH};",
            f"    for (long ow = 0; ow < {OW}; ow++) {{",
            f"        float a[{vl}];{'' if is_max else ' float cnt = 0.0f;'}",
            f"        for (long l = 0; l < {vl}; l++) a[l] = {'-INFINITY' if is_max else '0.0f'};",
            f"        for (long dh = 0; dh < {kh}; dh++) {{",
            f"            const long h = oh * {sh} - {ph} + dh;",
            f"            if (h < 0 || h >= {H}) continue;",
            f"            for (long dw = 0; dw < {kw}; dw++) {{",
            f"                const long w = ow * {sw} - {pw} + dw;",
            f"                if (w < 0 || w >= {W}) continue;",
            f"                const float* restrict s = {x} + {src};",
            *([] if is_max else ["                cnt += 1.0f;"]),
            "#pragma omp simd",
            f"                for (long l = 0; l < {vl}; l++) {{",
            f"                    const float v = s[{lane_in}];",
            f"                    {val}",
            "                }",
            "            }",
            "        }",
            "#pragma omp simd",
            f"        for (long l = 0; l < {vl}; l++)",
            f"            out[{dst}] = {fin};",
            "    }",
            "}"]


def _max_pool_taps(x: str, xs, os_, k, st, pad, par: bool, in_blocked: bool, out_blocked: bool,
                   vl: int) -> list[str]:
    """max_pool2d over VL channels at a time, the window's taps unrolled: one vector loop per output
    pixel (lanes: channels) with a max per tap and no bounds branches: a tap outside the image
    reads the nearest row / column inside instead, which is in the same window (the padding is
    smaller than the window), and max is idempotent. A NaN anywhere in the window makes the output
    NaN (numpy's maximum; x86's max would drop it): its flag is the or of the taps' v != v. The
    generic loop (`pool_blocked`) kept a vector of maxima in memory and branched on every tap's
    bounds: a ResNet stem's 3x3/2 pool of 64 x 112 x 112, 127 us against 62 (Zen 4, 1 thread, its input in
    cache)."""
    N, C, H, W = xs
    OH, OW = os_
    (kh, kw), (sh, sw), (ph, pw) = k, st, pad
    # a pixel's VL channels: VL consecutive floats (blocked) or VL planes apart (NCHW)
    row = (lambda h: f"{x} + (nb * {H} + ({h})) * {W * vl}L") if in_blocked else \
        (lambda h: f"{x} + nb * {vl * H * W}L + ({h}) * {W}L")
    px, lane = (vl, "l") if in_blocked else (1, f"l * {H * W}L")
    dst = f"(nb * {OH} + oh) * {OW * vl}L + ow * {vl} + l" if out_blocked else \
        f"nb * {vl * OH * OW}L + l * {OH * OW}L + oh * {OW}L + ow"
    clamp = lambda v, n: f"{v} < 0 ? 0 : {v} > {n - 1} ? {n - 1} : {v}"
    lines = [f"#pragma omp parallel for if ({int(par)})",
             f"for (long t = 0; t < {N * (C // vl) * OH}; t++) {{",
             f"    const long nb = t / {OH}, oh = t % {OH};"]
    for dh in range(kh):
        lines += [f"    const long h{dh} = oh * {sh} - {ph} + {dh};",
                  f"    const float* restrict r{dh} = {row(clamp(f'h{dh}', H))};"]
    # the next output row's new input rows into the cache along this row (blocked input): the
    # ResNet stem's output, 3.2 MB, comes from L3 in the model: 143 -> 120 us there (mean of 4
    # runs, 1 thread), though 63 -> 81 us with the input in L2 (the prefetches' load slots)
    ahead = [dh for dh in range(max(0, kh - sh), kh)] if in_blocked else []
    for dh in ahead:
        lines += [f"    const float* p{dh} = {row(clamp(f'h{dh} + {sh}', H))};"]
    lines += [f"    for (long ow = 0; ow < {OW}; ow++) {{"]
    for dw in range(kw):
        lines += [f"        const long w{dw} = ow * {sw} - {pw} + {dw}, c{dw} = ({clamp(f'w{dw}', W)}) * {px}L;"]
    for dh in ahead:
        lines += [f"        __builtin_prefetch(p{dh} + c{kw - 1} + {q * 16});" for q in range(max(1, sw * vl // 16))]
    lines += ["#pragma omp simd", f"        for (long l = 0; l < {vl}; l++) {{"]
    taps = [(dh, dw) for dh in range(kh) for dw in range(kw)]
    for i, (dh, dw) in enumerate(taps):
        v = f"r{dh}[c{dw} + {lane}]"
        if i == 0:
            lines += [f"            float a = {v};", "            int u = a != a;"]
        else:
            lines += [f"            const float v{i} = {v};",
                      f"            a = v{i} > a ? v{i} : a;",
                      f"            u |= v{i} != v{i};"]
    lines += [f"            out[{dst}] = u ? NAN : a;", "        }", "    }", "}"]
    return lines
