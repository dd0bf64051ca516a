"""A conv2d as a direct convolution (csrc_templates/conv_direct.c): planning and emit.

The im2col path (lower_gemm, emit_gemm.emit_conv2d) writes a column matrix of C x KH x KW rows
per output pixel and runs the packed GEMM over it. The direct kernel reads the input where it
is, in a zero-padded copy blocked by input channels (one pixel's CB channels in one cache line),
and the weights as output-channel blocks of OBW = V vectors, prepacked once when bound by
params=. Its register tile is RW output pixels (consecutive across rows and images, so the
2 x 2 maps of a ResNet's last stage fill a tile) by OBW channels; the epilogue (bias,
batchnorm, relu, a residual add: any pointwise ops) is applied to each tile as it is stored.

`plan_conv_direct` decides by `use_direct` (a cost rule) and, when direct, is the conv's
whole plan; otherwise the caller plans the im2col GEMM. A 3x3 stride-1 conv that Winograd
F(2x2, 3x3) can run (eqfuse.backend.conv_winograd.use_winograd) gets that plan instead, in the
same detail (`winograd` = its tiles per block), so the blocked layout below applies to it too. Once every kernel is planned,
`block_between_convs` (eqfuse.backend.conv_blocked) keeps the blocked channel layout
([N][C / VL][H][W][VL]) on the tensors that pass between direct convs and pooling (as inputs or
residual operands) and nowhere else: the graph's inputs and outputs, and every tensor another
kind of kernel reads, stay NCHW. EQFUSE_CONV=direct|im2col forces a path,
EQFUSE_CONV_TILE=V,RW,ROWS a register tile (both to measure the alternatives).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from eqfuse.backend.cexpr import kernel_params, render
from eqfuse.backend.conv_winograd import plan_winograd, use_winograd
from eqfuse.backend.emit_gemm import _ct, _epilogue
from eqfuse.backend.lower_gemm import Prepack, cdiv, parallel
from eqfuse.backend.plan import KernelPlan, UOp, ops_text, pointwise_flops
from eqfuse.ir.kernels import F32
from eqfuse.machine import Machine


@dataclass(frozen=True)
class ConvDirectDetail:
    """The plan of a direct conv2d: the constants of csrc_templates/conv_direct.c."""

    N: int
    C: int
    H: int
    W: int
    O: int
    KH: int
    KW: int
    OH: int
    OW: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    cb: int  # input channels per block of the padded input copy
    vl: int  # floats per vector
    v: int  # vectors per output-channel block (OBW = v x vl channels)
    rw: int  # output pixels per register tile
    rows: bool  # a tile's pixels are in one output row (else any RW consecutive pixels)
    parallel: bool  # the kernel opens a parallel region (lower_gemm.parallel's rule)
    prepack: Prepack | None = None  # the weights bound by params=, blocked once (`mark_bound`)
    # the input is (the output will be) in blocks of VL channels, [N][C / VL][H][W][VL], between two
    # direct convs (`block_between_convs`)
    in_blocked: bool = False
    out_blocked: bool = False
    # pixels in the vector lanes (csrc_templates/conv_pixels.c), (RO, RPH, RPW): RO output channels
    # x RPH rows x RPW vectors of pixels; None: channels in the lanes (conv_direct.c)
    pixels: tuple[int, int, int] | None = None
    pixels_as_rows: bool = False  # (an im2col GEMM's orientation: never here)
    blocked_args: tuple[int, ...] = ()  # body inputs of the epilogue read in blocks of VL channels
    in_place: bool = False  # the input in blocks read where it is, no padded copy (conv_blocked._mark_in)
    winograd: int = 0  # tiles per block of a Winograd F(2x2, 3x3) conv (conv_winograd.py), 0: direct

    @property
    def obw(self) -> int:
        return self.v * self.vl


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def register_tiles(simd_floats: int, rows: bool) -> list[tuple[int, int]]:
    """The (V, RW) register tiles a machine offers: RW x V accumulators, V weight vectors and
    one broadcast fit its vector registers (32 with AVX-512, 16 below). A tile of pixels from
    anywhere (not `rows`) holds a pointer per pixel: at most 8, to stay in the 16 general
    registers; a tile along one output row needs one pointer: up to 12 pixels (16 measured
    slower: a 7x7 stem 107 us against 69)."""
    regs = 32 if simd_floats >= 16 else 16
    return [(v, rw) for v in (1, 2, 3, 4) for rw in range(2, 13 if rows else 9) if rw * v + v + 1 <= regs]


def tile_cost(shape: tuple[int, int, int, int, int, int], m: Machine, v: int, rw: int, rows: bool) -> float:
    """Cycles of a whole conv with this tile, as a model. shape = (N, OH, OW, O, steps, taps), taps
    being input-channel blocks x kernel rows, steps CB x KW. A tile takes, per tap, `steps` of
    max(FMAs / 2 (two FMA ports), 5 (each accumulator's chain: an FMA's latency and the
    broadcast's; 8 accumulators measured 25% slower than 12 on a 7x7 stem), loads / 2.5 (weight
    vectors and broadcasts), its weight vectors' stream) plus its pointer work (one pointer along a row, one per pixel otherwise),
    then its store (about a cycle per 8 outputs). A channel block's first tile streams its
    weights from L3 (~3 cycles per 64 B), the others from L2 unless the block's weights exceed
    half of it. Padding lanes and pixels count as work. Measured on a Zen 5 core, 3x3 convs:
    128 channels at 2 x 2, two images, 8 pixels x 2 vectors 21.7 us against 4 x 4 35.9 us
    (the weight stream of a block read by one tile)."""
    N, OH, OW, O, cb, taps = shape
    vl = m.simd_floats
    per_block = N * OH * cdiv(OW, rw) if rows else cdiv(N * OH * OW, rw)

    def tile(wc: float) -> float:
        step = max(rw * v / 2, 5, (rw + v) / 2.5, wc * v * vl / 16)
        return taps * (cb * step + (1 if rows else rw / 2)) + rw * v * vl / 8
    rest = tile(3 if taps * cb * v * vl * 4 > m.l2 // 2 else 0.5)
    return cdiv(O, v * vl) * (tile(3) + (per_block - 1) * rest)


def choose_tile(m: Machine, shape: tuple[int, int, int, int, int, int]) -> tuple[int, int, bool]:
    """(V, RW, rows) of least `tile_cost`; ties go to the wider channel block, more pixels, rows."""
    cands = [(v, rw, rows) for rows in (True, False) for v, rw in register_tiles(m.simd_floats, rows)]
    return min(cands, key=lambda t: (tile_cost(shape, m, *t), -t[0], -t[1], not t[2]))


def pixel_tiles(simd_floats: int) -> list[tuple[int, int, int]]:
    """(RO, RPH, RPW) tiles of the pixel-vector kernel: RO x RPH x RPW accumulators, the RPH x RPW
    input vectors and one broadcast weight fit the vector registers."""
    regs = 32 if simd_floats >= 16 else 16
    return [(ro, rph, rpw) for ro in (2, 4, 6, 8, 12, 16) for rph in (1, 2, 3, 4) for rpw in (1, 2, 3)
            if ro * rph * rpw + rph * rpw + 1 <= regs]


def choose_pixel_tile(m: Machine, N: int, OH: int, OW: int, O: int) -> tuple[int, int, int]:
    """The pixel-vector tile of least work (padding pixels and channels included) per load of
    its inner step (RPH x RPW vectors, RO broadcasts for RO x RPH x RPW FMAs), at least 5
    cycles a step (an FMA's latency); ties go to fewer rows."""
    vl = m.simd_floats

    def cost(t):
        ro, rph, rpw = t
        tiles = cdiv(O, ro) * N * cdiv(OH, rph) * cdiv(OW, rpw * vl)
        return tiles * max(ro * rph * rpw / 2, 5, (ro + rph * rpw) / 1.5), rph, -ro
    return min(pixel_tiles(vl), key=cost)


def use_direct(KH: int, KW: int, SH: int, SW: int) -> bool:
    """Whether the direct kernel runs a conv rather than im2col + GEMM: when its windows overlap
    (a stride smaller than the window). im2col's column matrix holds each input element
    KH x KW / (SH x SW) times; with windows that do not overlap (1x1 convs, a ViT's or a
    Mixer's patch embedding) it is the input itself (stride 1), a part of it, or a permutation
    of it, no more than the direct kernel's padded copy, and the GEMM can store its result
    transposed into a token concat (lower_gemm.conv_c_layout). Measured (1 thread, + BN + ReLU,
    weights bound): 1x1/2 64 -> 128 at 56 x 56, 105 us direct against 79 im2col; the 3x3 convs
    of ResNet-18 0.85-0.95x of im2col's time at 28-56 pixels wide, 0.6-0.8x at 2-16 pixels
    (benchmarks/bench_conv.py). EQFUSE_CONV=direct|im2col forces either."""
    force = os.environ.get("EQFUSE_CONV", "").strip().lower()
    if force in ("direct", "im2col"):
        return force == "direct"
    return SH < KH or SW < KW


def plan_conv_direct(plan: KernelPlan, m: Machine, force: bool = False) -> bool:
    """Plan plan's conv2d as a direct conv when `use_direct` says so or `force` (True); else plan
    nothing."""
    body, a = plan.body, plan.shape.anchor
    cv = body.nodes[a]
    (N, C, H, W), (O, _, KH, KW) = (tuple(body.nodes[i].type.shape) for i in cv.args[:2])
    _, _, OH, OW = cv.type.shape
    if tuple(cv.type.shape) != tuple(plan.out_shape) or plan.in_strides:
        return False  # (an epilogue that broadcasts, inputs read through views: im2col's rules)
    NP, K = N * OH * OW, C * KH * KW
    sh, sw = _pair(cv.attr["stride"])
    if not force and not use_direct(KH, KW, sh, sw):
        return False
    vl = m.simd_floats
    cb = min(C, vl)
    v, rw, rows = choose_tile(m, (N, OH, OW, O, cb * KW, cdiv(C, cb) * KH))
    # one vector of output channels: each FMA would need its own broadcast input value; with
    # the pixels in the lanes, RO broadcast weights serve RPH x RPW vectors of pixels
    pixels = choose_pixel_tile(m, N, OH, OW, O) if v == 1 and 2 * OW >= vl and \
        os.environ.get("EQFUSE_CONV_PIXELS", "1") != "0" else None
    if os.environ.get("EQFUSE_CONV_TILE"):  # "V,RW,ROWS": a tile forced, to measure others
        v, rw, rows = (int(t) for t in os.environ["EQFUSE_CONV_TILE"].split(","))
        if (v, rw) not in register_tiles(vl, bool(rows)):
            raise ValueError(f"EQFUSE_CONV_TILE={v},{rw},{rows} is not a register tile of this machine")
        rows = bool(rows)
    par = parallel(NP, O, K, 1)
    d = ConvDirectDetail(N, C, H, W, O, KH, KW, OH, OW, (sh, sw), _pair(cv.attr["padding"]), cb, vl, v, rw, rows,
                         par, pixels=pixels)
    plan.detail = d
    plan.tiles = {"cb": cb, "obw": d.obw, "rw": rw, "rows": int(rows)}  # (constants of the C)
    if pixels:
        plan.tiles = dict(zip(("ro", "rph", "rpw"), pixels))
    plan.flops = 2 * NP * O * K + pointwise_flops(body)
    if use_winograd(d, vl):
        plan_winograd(plan, m, d)
        return True
    ncb, nob = cdiv(C, cb), cdiv(O, d.obw)
    nt = N * OH * cdiv(OW, rw) if rows else cdiv(NP, rw)
    hp, wp = (OH - 1) * sh + KH, (OW - 1) * sw + KW
    regs = rw * v + v + 1
    plan.cache_check = (f"registers: {rw} x {v} accumulators + {v} weights + 1 broadcast = {regs} vectors; "
                        f"one tap's weights {cb} x {d.obw} x {F32} = {cb * d.obw * F32} B, "
                        f"a channel block's {ncb * KH * KW * cb * d.obw * F32} B <= L2 {m.l2} B: "
                        f"{'ok' if ncb * KH * KW * cb * d.obw * F32 <= m.l2 else 'NO'}")
    plan.threads = (f"the {nob} channel blocks x {nt} pixel tiles split evenly, channel blocks outermost"
                    if par else f"one thread, no parallel region ({NP * O * K} multiply-adds < 2^18)")
    epi = ops_text(body, skip={a} | set(cv.args))
    plan.uops += [
        UOp(0, "Exec", "weights to blocks [NOB][NCB][KH][KW][CB][OBW] (once when bound by params=)", 1),
        UOp(0, "Load", f"input to a zero-padded copy [N][{ncb}][{hp}][{wp}][{cb}]", N * ncb * hp),
        UOp(0, "Loop", f"{nob} channel blocks of {d.obw} x {nt} tiles of {rw} pixels"
                       f"{' along an output row' if rows else ''}", nob * nt),
        UOp(1, "Exec", f"{rw} x {d.obw} register tile over {ncb} x {KH} taps of {KW} x {cb} FMA steps",
            nob * nt * ncb * KH),
        UOp(1, "Store", f"tile through the epilogue ({epi or 'none'}) into NCHW", nob * nt)]
    if pixels:
        _pixel_plan(plan, m, epi)
    return True


def _pixel_plan(plan: KernelPlan, m: Machine, epi: str) -> None:
    """The cache check, thread rule and uops of a pixel-vector conv (conv_pixels.c)."""
    d = plan.detail
    ro, rph, rpw = d.pixels
    tw = rpw * d.vl
    nt = cdiv(d.O, ro) * d.N * cdiv(d.OH, rph) * cdiv(d.OW, tw)
    hp, wq = (cdiv(d.OH, rph) * rph - 1) * d.stride[0] + d.KH, cdiv(d.OW, tw) * tw + (d.KW - 1) // d.stride[1] + 1
    regs = ro * rph * rpw + rph * rpw + 1
    plan.cache_check = (f"registers: {ro} x {rph} x {rpw} accumulators + {rph * rpw} pixel vectors + 1 broadcast = "
                        f"{regs} vectors <= {32 if m.simd_floats >= 16 else 16}: ok")
    if d.parallel:
        plan.threads = f"the {nt} tiles ({ro} channels x {rph} rows x {tw} pixels) split evenly"
    plan.uops = [
        UOp(0, "Exec", "weights to [C][KH][KW][OPAD] (once when bound by params=)", 1),
        UOp(0, "Load", f"input to a zero-padded copy, rows split by column phase [N][{d.C}][{hp}][{d.stride[1]}][{wq}]",
            d.N * d.C * hp),
        UOp(0, "Loop", f"{nt} tiles of {ro} output channels x {rph} rows x {tw} pixels", nt),
        UOp(1, "Exec", f"{rph * rpw} pixel vectors x {ro} broadcast weights per input channel and tap",
            nt * d.C * d.KH * d.KW),
        UOp(1, "Store", f"tile through the epilogue ({epi or 'none'}) into NCHW, a channel's pixels together", nt)]


def mark_bound(plan: KernelPlan, bound: set[int]) -> None:
    """detail.prepack when the weights are a body input bound by params= and read by nothing
    else in the kernel: the runtime then blocks them once (`NAME_prepack`)."""
    body = plan.body
    w = body.nodes[plan.shape.anchor].args[1]
    if w not in bound or len([n for n in body.nodes if w in n.args]) != 1:
        return
    plan.detail = replace(plan.detail, prepack=Prepack(body.inputs.index(w), f"{plan.name}_prepack",
                                                       f"{plan.name}_prepack_floats"))
    plan.uops = [replace(u, what="weights blocked once when bound (params=), read in place")
                 if u.what.startswith("weights to blocks") else u for u in plan.uops]


def edge_tiles(d: ConvDirectDetail) -> tuple[int, int]:
    """(EL, ER) of a ROWS tiling read in place: the tile columns tr < EL have windows crossing the
    image's left edge, those from ER on its right edge (or a short tile's past the row end); the
    columns between read the image in place."""
    tr_n, step, wl = cdiv(d.OW, d.rw), d.rw * d.stride[1], (d.rw - 1) * d.stride[1] + d.KW
    el = min(tr_n, cdiv(d.padding[1], step))
    er = next((t for t in range(el, tr_n) if t * step - d.padding[1] + wl > d.W), tr_n)
    return el, er


def reorders(d: ConvDirectDetail) -> bool:
    """Whether an NCHW output is stored in blocks first and reordered after (conv_direct.c's
    REORDER): tiles along rows, whole blocks of VL channels, rows at least VL pixels wide."""
    return (d.rows and not d.out_blocked and d.O % d.vl == 0 and d.OW >= d.vl and d.vl in (4, 8, 16)
            and os.environ.get("EQFUSE_CONV_REORDER", "1") != "0")


def transpose_c(vl: int, vf: str) -> str:
    """C lines transposing m[VL] (VL vectors of VL floats) in place with two-input shuffles:
    log2(VL) stages; at block size h, rows i and i + h exchange blocks of h lanes."""
    lines, h = [], vl // 2
    while h >= 1:
        lo = [(kb % 2) * vl + (kb // 2) * 2 * h + w for kb in range(vl // h) for w in range(h)]
        hi = [x + h for x in lo]
        lines.append(f"            {{ const vi lo = {{{', '.join(map(str, lo))}}}, hi = {{{', '.join(map(str, hi))}}};")
        for i in range(vl):
            if i & h == 0:
                lines.append(f"              const {vf} a{i} = m[{i}], b{i} = m[{i + h}];")
                lines.append(f"              m[{i}] = __builtin_shuffle(a{i}, b{i}, lo); m[{i + h}] = __builtin_shuffle(a{i}, b{i}, hi);")
        lines.append("            }")
        h //= 2
    return "\n".join(lines)


def reorder_fn(name: str, vl: int) -> str:
    """The C of NAME_reorder (csrc_templates/conv_reorder.c): blocks of VL channels to NCHW."""
    return render("conv_reorder.c", NAME=name, VL=vl, TRANSPOSE=transpose_c(vl, f"{name}_vf"))


def epilogue_c(plan: KernelPlan) -> tuple[str, str]:
    """(the epilogue's C expression of `acc`, the declarations of the operands it reads) of a
    direct or Winograd conv: acc is the conv's sum at output element (b, i, j), j = oh x OW + ow;
    operands in blocks of VL channels (detail.blocked_args) are read at `blk`."""
    body, a, d = plan.body, plan.shape.anchor, plan.detail
    cv = body.nodes[a]
    _, ptrs = kernel_params(plan)
    groups = [("b", [0], False), ("i", [1], False), ("j", [2, 3], False)]
    bias = f"eqf_e{body.inputs.index(cv.args[2])}" if len(cv.args) == 3 else None
    preset = {a: f"(acc + {bias}[i])" if bias else "acc"}
    for k in d.blocked_args:  # read at the output element's offset in blocks (`blk`, conv_direct.c)
        preset[body.inputs[k]] = f"eqf_e{k}[blk]"
    expr, extras = _epilogue(plan, groups, preset)
    if bias and cv.args[2] not in dict(extras):
        extras.append((cv.args[2], bias))
    return expr, "\n".join(f"    const {_ct(body, i)}* restrict {name} = {ptrs[i]};" for i, name in extras)


def emit_conv_direct(plan: KernelPlan) -> str:
    if plan.detail.winograd:
        from eqfuse.backend.conv_winograd import emit_conv_winograd
        return emit_conv_winograd(plan)
    body, a = plan.body, plan.shape.anchor
    cv, d = body.nodes[a], plan.detail
    params, ptrs = kernel_params(plan)
    expr, decls = epilogue_c(plan)
    if d.pixels:
        ro, rph, rpw = d.pixels
        return render("conv_pixels.c", NAME=plan.name, PARAMS=params, EXTRAS=decls, X=ptrs[cv.args[0]],
                      WEIGHTS=ptrs[cv.args[1]], PREPACKED=int(d.prepack is not None), PARALLEL=int(d.parallel),
                      EPILOGUE=expr, N=d.N, C=d.C, H=d.H, W=d.W, O=d.O, KH=d.KH, KW=d.KW, OH=d.OH, OW=d.OW,
                      SH=d.stride[0], SW=d.stride[1], PH=d.padding[0], PW=d.padding[1], VL=d.vl, RO=ro, RPH=rph,
                      RPW=rpw)
    el, er = edge_tiles(d)
    return render("conv_direct.c", NAME=plan.name, PARAMS=params, EXTRAS=decls, X=ptrs[cv.args[0]],
                  WEIGHTS=ptrs[cv.args[1]], PREPACKED=int(d.prepack is not None), PARALLEL=int(d.parallel),
                  EPILOGUE=expr, N=d.N, C=d.C, H=d.H, W=d.W, O=d.O, KH=d.KH, KW=d.KW, OH=d.OH, OW=d.OW,
                  SH=d.stride[0], SW=d.stride[1], PH=d.padding[0], PW=d.padding[1], CB=d.cb, VL=d.vl, V=d.v, OBW=d.obw,
                  RW=d.rw, ROWS=int(d.rows), IN_BLOCKED=int(d.in_blocked), OUT_BLOCKED=int(d.out_blocked),
                  INPLACE=int(d.in_place), EDGE_L=el, EDGE_R=er, REORDER=int(reorders(d)),
                  REORDER_FN=reorder_fn(plan.name, d.vl) if reorders(d) else "",
                  EPI_BLOCKED=int(bool(d.blocked_args)), EPILOGUE_NCHW="acc" if d.blocked_args else expr)


# (the blocked layout's decisions and pooling in it; imported here, after the names it uses,
# for eqfuse.backend.lower)
from eqfuse.backend.conv_blocked import block_between_convs  # noqa: F401
