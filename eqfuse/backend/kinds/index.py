"""The index kind: gather, gather_elements, cumsum, argmax, topk, range, tril/triu, pad and pooling.

Small kernels over integer, bool or float tensors that move or select elements rather than
compute: each is one C function from csrc_templates/index.c whose loop nest this module writes
for its op, over the concrete shapes of the plan. A kernel that reads indices returns how many
were out of range (0 when all were valid; the module turns any other count into an error, as
numpy and onnxruntime refuse such an index instead of reading past the tensor).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from eqfuse.backend.cexpr import kernel_params, param_job, render
from eqfuse.backend.kinds.base import PARALLEL_MIN, REGIONS, Kind, parallel_rule
from eqfuse.backend.kinds.contraction.conv import pool_blocked
from eqfuse.backend.plan import KernelPlan, UOp
from eqfuse.ir.graph import Node
from eqfuse.ir.kernels import K
from eqfuse.ir.ops import flit, pair
from eqfuse.ir.shapes import C_TYPE

INDEX_CHECKED = ("gather", "gather_elements", "scatter_add", "scatter_elements_add")  # kernels that return a count of bad indices


POOLS = ("max_pool2d", "avg_pool2d", "pool2d_grad")  # one image plane per iteration: split over threads


def _size(shape) -> int:
    return math.prod(shape) if shape else 1


def _strides(shape) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return list(reversed(out))


def _unflatten(var: str, shape, names: str) -> list[str]:
    """C lines splitting the flat index `var` over shape into longs names0, names1, ..."""
    st = _strides(shape)
    return [f"const long {names}{d} = ({var} / {st[d]}) % {shape[d]}; (void){names}{d};" for d in range(len(shape))]


def _gather(an: Node, ins, xs, out, ct, par: str = "0", count: str | None = None, skip: str = ""):
    """(`count`: the indices taken, a C expression, when not all of them: the first rows of a
    dim taken at run time, eqfuse.backend.runtime_dim; `skip`: a C condition on k, the index's
    flat position, under which it is not taken)"""
    data, idx = ins
    ax = an.attr["axis"] % len(xs[0])
    outer, axlen, inner = _size(xs[0][:ax]), xs[0][ax], _size(xs[0][ax + 1:])
    nidx = _size(xs[1])
    return [f"for (long o = 0; o < {outer}; o++)",
            f"    for (long k = 0; k < {count or nidx}; k++) {{",
            *([f"        if ({skip}) continue;"] if skip else []),
            f"        long j = (long){idx}[k];",
            f"        if (j < 0) j += {axlen};",
            f"        if (j < 0 || j >= {axlen}) {{ bad++; j = 0; }}",
            f"        memcpy(out + (o * {nidx} + k) * {inner}, {data} + (o * {axlen} + j) * {inner}, {inner} * sizeof(*out));",
            "    }"]


def _scatter_add(an: Node, ins, xs, out, ct, par: str = "0"):
    x, idx, upd = ins
    ax = an.attr["axis"] % len(xs[0])
    outer, axlen, inner = _size(xs[0][:ax]), xs[0][ax], _size(xs[0][ax + 1:])
    nidx = _size(xs[1])
    return [f"memcpy(out, {x}, {_size(out)} * sizeof(*out));",
            f"for (long o = 0; o < {outer}; o++)",
            f"    for (long k = 0; k < {nidx}; k++) {{",
            f"        long j = (long){idx}[k];",
            f"        if (j < 0) j += {axlen};",
            f"        if (j < 0 || j >= {axlen}) {{ bad++; continue; }}",
            f"        {ct} *dst = out + (o * {axlen} + j) * {inner};",
            f"        const {ct} *src = {upd} + (o * {nidx} + k) * {inner};",
            f"        for (long i = 0; i < {inner}; i++) dst[i] += src[i];",
            "    }"]


def _along_axis(idx: str, shape, ax: int, tshape, on_bad: str, stmt: str, count: str | None = None,
                skip: str = "") -> list[str]:
    """The loop of gather_elements and scatter_elements_add: for each element n of the indices
    (of `shape`), j = its index along axis ax (negative from the end; out of range counted, then
    `on_bad`), `pos` the offset of (i0, .., j, ..) in the contiguous tensor of `tshape` read or
    written; `stmt` uses n and pos. `count`: the elements taken when not all (gather's); `skip`:
    a C condition on i0, i1, .. under which an element is not taken."""
    st, L = _strides(tshape), tshape[ax]
    pos = " + ".join(f"j * {st[d]}" if d == ax else f"i{d} * {st[d]}" for d in range(len(shape)))
    return [f"for (long n = 0; n < {count or _size(shape)}; n++) {{",
            *("    " + ln for ln in _unflatten("n", shape, "i")),
            *([f"    if ({skip}) continue;"] if skip else []),
            f"    long j = (long){idx}[n];",
            f"    if (j < 0) j += {L};",
            f"    if (j < 0 || j >= {L}) {{ bad++; {on_bad}; }}",
            f"    const long pos = {pos};",
            f"    {stmt}",
            "}"]


def _gather_elements(an: Node, ins, xs, out, ct, par: str = "0", count: str | None = None, skip: str = ""):
    data, idx = ins
    ax = an.attr["axis"] % len(xs[0])
    return _along_axis(idx, out, ax, xs[0], "j = 0", f"out[n] = {data}[pos];", count, skip)


def _cumsum(an: Node, ins, xs, out, ct, par: str = "0", count: str | None = None):
    """(`count`: the positions summed along the axis, a C expression, when not all of them: the
    first of a dim taken at run time, a forward cumsum along it, eqfuse.backend.runtime_dim)"""
    ax = an.attr["axis"] % len(out)
    outer, L, inner = _size(out[:ax]), out[ax], _size(out[ax + 1:])
    first, step = (L - 1, -1) if an.attr["reverse"] else (0, 1)
    store = ["out[p] = acc; acc += v;"] if an.attr["exclusive"] else ["acc += v; out[p] = acc;"]
    return [f"for (long o = 0; o < {outer}; o++)",
            f"    for (long i = 0; i < {inner}; i++) {{",
            f"        {ct} acc = 0;  /* the input's type, which is the output's */",
            f"        for (long s = 0, l = {first}; s < {count or L}; s++, l += {step}) {{",
            f"            const long p = (o * {L} + l) * {inner} + i;",
            f"            const {ct} v = {ins[0]}[p];",
            *("            " + s for s in store),
            "        }",
            "    }"]


def _argmax(an: Node, ins, xs, out, ct, par: str = "0"):
    x = xs[0]
    ax = an.attr["axis"] % len(x)
    outer, L, inner = _size(x[:ax]), x[ax], _size(x[ax + 1:])
    xt = ct  # the input's element type
    return [f"for (long o = 0; o < {outer}; o++)",
            f"    for (long i = 0; i < {inner}; i++) {{",
            f"        {xt} best = {ins[0]}[o * {L} * {inner} + i];",
            "        long bi = 0;",
            f"        for (long l = 1; l < {L}; l++) {{",
            f"            const {xt} v = {ins[0]}[(o * {L} + l) * {inner} + i];",
            "            if (v > best || (v != v && best == best)) { best = v; bi = l; }  /* the first NaN wins, as in numpy */",
            "        }",
            f"        out[o * {inner} + i] = bi;",
            "    }"]


TOPK_INSERT_MAX = 64  # k up to which topk inserts into its k best; a larger k merge-sorts each line


def _topk(an: Node, ins, xs, out, ct, par: str = "0"):
    """Each line along the axis in the order of eqfuse.ir.ops_index.topk_order (NaN above every
    number, equal values in index order). Up to TOPK_INSERT_MAX, the line's k best so far are kept
    in order in the output (the values, or the indices then read through) and a new element is
    shifted in after every one at least as good: an element no better than the k-th costs one
    comparison. A larger k (a whole sort) merge-sorts the line's (value, index) pairs, stably, in
    a buffer of the kernel's own, and falls back to insertion if it cannot have one."""
    x = xs[0]
    ax = an.attr["axis"] % len(x)
    outer, L, inner, k = _size(x[:ax]), x[ax], _size(x[ax + 1:]), an.attr["k"]
    better = "(a != a && b == b) || a > b" if an.attr["largest"] else "(b != b && a == a) || a < b"
    slot = f"xl[ol[(j - 1) * {inner}L] * {inner}L]" if an.attr["indices"] else f"ol[(j - 1) * {inner}L]"
    insert = [f"        for (long l = 0; l < {L}; l++) {{",
              f"            const {ct} a = xl[l * {inner}L];",
              "            long j = n;",
              "            for (; j > 0; j--) {",
              f"                const {ct} b = {slot};",
              f"                if (!({better})) break;",
              "            }",
              f"            if (j >= {k}) continue;",
              f"            for (long s = n < {k} ? n : {k - 1}; s > j; s--) ol[s * {inner}L] = ol[(s - 1) * {inner}L];",
              f"            ol[j * {inner}L] = {'l' if an.attr['indices'] else 'a'};",
              f"            if (n < {k}) n++;",
              "        }"]
    merge = ["        if (buf) {",
             f"            for (long l = 0; l < {L}; l++) {{ buf[l].v = xl[l * {inner}L]; buf[l].i = l; }}",
             f"            eqf_topk_t *src = buf, *dst = buf + {L};",
             f"            for (long w = 1; w < {L}; w *= 2) {{",
             f"                for (long lo = 0; lo < {L}; lo += 2 * w) {{",
             f"                    const long mid = lo + w < {L} ? lo + w : {L}, hi = lo + 2 * w < {L} ? lo + 2 * w : {L};",
             "                    long p = lo, q = mid, o = lo;",
             "                    while (p < mid && q < hi) {",
             f"                        const {ct} a = src[q].v, b = src[p].v;",
             f"                        dst[o++] = ({better}) ? src[q++] : src[p++];  /* the left one on ties: stable */",
             "                    }",
             "                    while (p < mid) dst[o++] = src[p++];",
             "                    while (q < hi) dst[o++] = src[q++];",
             "                }",
             "                eqf_topk_t* t = src; src = dst; dst = t;",
             "            }",
             f"            for (long j = 0; j < {k}; j++) ol[j * {inner}L] = src[j].{'i' if an.attr['indices'] else 'v'};",
             "            continue;",
             "        }"] if k > TOPK_INSERT_MAX else []
    head = ([f"typedef struct {{ {ct} v; long i; }} eqf_topk_t;",
             f"eqf_topk_t* buf = malloc(2 * {L} * sizeof(eqf_topk_t));  /* (NULL: insertion) */"] if merge else [])
    return [*head,
            f"for (long o = 0; o < {outer}; o++)",
            f"    for (long i = 0; i < {inner}; i++) {{",
            f"        const {ct}* restrict xl = {ins[0]} + o * {L * inner}L + i;",
            f"        __typeof__(out[0])* restrict ol = out + o * {k * inner}L + i;",
            *merge,
            "        long n = 0;  /* slots filled */",
            *insert,
            "    }",
            *(["free(buf);"] if merge else [])]


def _range(an: Node, ins, xs, out, ct, par: str = "0"):
    return [f"for (long n = 0; n < {out[0]}; n++)",
            f"    out[n] = {an.attr['start']} + n * {an.attr['step']};"]


def _tri(an: Node, ins, xs, out, ct, par: str = "0"):
    R, C = out[-2], out[-1]
    keep = "c - r <= k" if an.op == "tril" else "c - r >= k"
    return [f"const long k = {an.attr['k']};",
            f"for (long b = 0; b < {_size(out[:-2])}; b++)",
            f"    for (long r = 0; r < {R}; r++)",
            f"        for (long c = 0; c < {C}; c++) {{",
            f"            const long p = (b * {R} + r) * {C} + c;",
            f"            out[p] = ({keep}) ? {ins[0]}[p] : 0;",
            "        }"]


def _pad(an: Node, ins, xs, out, ct, par: str = "0"):
    # Axis by axis, each output axis in three ranges: the pad before (one contiguous run of the
    # value: all of the inner axes), the input's extent (a loop, the next axis inside), the pad
    # after; on the last axis the input's row is a copy the compiler vectorizes. No branch per
    # row: a row loop testing its index (`if (i >= lo && i < hi) copy else fill`) was vectorized
    # wrongly by gcc 12 at -O3 (the rows of a pad of outer axes alone left unwritten:
    # tests/test_dwpw.py, test_pad_rows_and_a_pad_folded_into_the_conv_match_the_reference).
    # Element by element, each element split its flat index over every axis (a division and a
    # modulo per axis) and tested every bound: a MobileNetV2's padding before its depthwise convs
    # cost more than all its convs (python benchmarks/bench_zoo.py --family mobilenet-v2 --spin)
    x, r = xs[0], len(out)
    lo, val = an.attr["pads"][:r], f"({ct}){flit(an.attr['value'])}"
    if r == 0:
        return [f"out[0] = {ins[0]}[0];"]
    xst, ost, lines = _strides(x), _strides(out), []

    def fill(ind: str, at: str, count: int) -> None:
        if count:
            lines.append(f"{ind}for (long j = 0; j < {count}; j++) out[{at} + j] = {val};")

    def axis(d: int, ind: str, o: str, s: str) -> None:  # o, s: the block's first output and input element
        before, after = lo[d] * ost[d], (out[d] - lo[d] - x[d]) * ost[d]
        fill(ind, o, before)
        if d == r - 1:
            lines.append(f"{ind}for (long j = 0; j < {x[d]}; j++) out[{o} + {before} + j] = {ins[0]}[{s} + j];")
        else:
            lines.append(f"{ind}for (long i{d} = 0; i{d} < {x[d]}; i{d}++) {{")
            axis(d + 1, ind + "    ", f"{o} + ({lo[d]} + i{d}) * {ost[d]}", f"{s} + i{d} * {xst[d]}")
            lines.append(f"{ind}}}")
        fill(ind, f"{o} + {(lo[d] + x[d]) * ost[d]}", after)

    axis(0, "", "0", "0")
    return lines


def _pool(an: Node, ins, xs, out, ct, par: str = "0"):
    _, _, H, W = xs[0]
    (kh, kw), (sh, sw), (ph, pw) = (pair(an.attr["kernel_size"]), pair(an.attr["stride"] or an.attr["kernel_size"]),
                                    pair(an.attr["padding"]))
    OH, OW = out[2], out[3]
    is_max = an.op == "max_pool2d"
    # (a max pool of a quantized model's u8 or i8 runs on them: its start the type's least value,
    # which a tap always passes, as -inf in f32; an average pool is f32)
    t = ct if is_max else "float"
    init = {"uint8_t": "0", "int8_t": "-128"}.get(t, "-INFINITY") if is_max else "0.0f"
    # one output row at a time, the window's taps outermost and the row's pixels innermost:
    # the pixels whose taps are all inside the image ([lo, hi)) in a vector loop without
    # branches, the few others with bounds checks. Pixel by pixel, the comparisons branched on
    # the data (a ResNet stem's 3x3/2 pool of 2 x 16 x 32 x 32); a copy of each row into a
    # padded buffer first stalled on store forwarding (benchmarks/bench_models.py --model resnet18)
    lo = min(OW, -(-pw // sw))
    hi = max(lo, min(OW, (W - kw + pw) // sw + 1))
    val = "a[ow] = ((v > a[ow]) | (v != v)) ? v : a[ow];" if is_max else "a[ow] += v; cnt[ow] += 1.0f;"
    fin = "a[ow]" if is_max else ("a[ow] / cnt[ow]" if not an.attr["count_include_pad"] else f"a[ow] / {kh * kw}.0f")
    head = [f"#pragma omp parallel for if ({par})",
            f"for (long nc = 0; nc < {out[0] * out[1]}; nc++)",
            f"    for (long oh = 0; oh < {OH}; oh++) {{"]
    s2 = par.removesuffix("_PARALLEL") + "_POOL_S2"  # (par is NAME_PARALLEL: the #define of the plan's pool_s2)
    if is_max and sw == 2:  # (ResNet's 3x3/2 pool)
        head += (_max_pool_stride2(ins[0], H, W, OH, OW, kh, kw, sh, ph, pw, s2) if t == "float" else
                 _max_pool_stride2_int(ins[0], t, H, W, OH, OW, kh, kw, sh, ph, pw, s2))
    return head + [
            f"        {t} a[{OW}]{'' if is_max else f'; float cnt[{OW}]'};",
            f"        for (long ow = 0; ow < {OW}; ow++) {{ a[ow] = {init};{'' if is_max else ' cnt[ow] = 0.0f;'} }}",
            f"        for (long dh = 0; dh < {kh}; dh++) {{",
            f"            const long h = oh * {sh} - {ph} + dh;",
            f"            if (h < 0 || h >= {H}) continue;",
            f"            const {t}* restrict row = {ins[0]} + (nc * {H} + h) * {W};",
            f"            for (long dw = 0; dw < {kw}; dw++) {{",
            "#pragma omp simd",
            f"                for (long ow = {lo}; ow < {hi}; ow++) {{",
            f"                    const {t} v = row[ow * {sw} - {pw} + dw];",
            f"                    {val}",
            "                }",
            *(ln for a, b in ((0, lo), (hi, OW)) if a < b for ln in (
                f"                for (long ow = {a}; ow < {b}; ow++) {{",
                f"                    const long w = ow * {sw} - {pw} + dw;",
                f"                    if (w < 0 || w >= {W}) continue;",
                f"                    const {t} v = row[w];",
                f"                    {val}",
                "                }")),
            "            }",
            "        }",
            f"        for (long ow = 0; ow < {OW}; ow++)",
            f"            out[(nc * {OH} + oh) * {OW} + ow] = {fin};",
            *(["#endif"] if is_max and sw == 2 else []),
            "    }"]


def _max_pool_stride2_int(x: str, t: str, H, W, OH, OW, kh, kw, sh, ph, pw, flag: str) -> list[str]:
    """_max_pool_stride2 of u8 or i8 (a quantized model's pool: rule maxpool_dequantized), 32
    output pixels at a time: for each tap column dw, the kernel rows' 64 bytes from w0 = 2 ow0 -
    pw + dw (a masked load each: taps outside the image load the type's least value, which no max
    keeps) are taken together by a byte max, and their even bytes (the 32 pixels' taps), widened
    to 16-bit lanes, join the 16-bit max; the 32 results are narrowed back to bytes. With 16
    pixels at a time, each tap a 32-byte load, a byte shuffle and a permute, the pool took
    longer than a quantized ResNet's residual adds (`benchmarks/bench_models.py --quantized static
    --model resnet_stages`, its kernels' profile: benchmarks/RESULTS.md). The scalar loop below
    (#else) took longer than the f32 pool and the dequantize and quantize around it together
    (`benchmarks/bench_models.py --quantized static --model resnet18`)."""
    u8 = t == "uint8_t"
    least, mx8, mx16 = ("0", "_mm512_max_epu8", "_mm512_max_epu16") if u8 else ("-128", "_mm512_max_epi8", "_mm512_max_epi16")
    # (the even bytes as 16-bit lanes: zero-extended for u8, sign-extended for i8)
    even = "_mm512_and_si512(m, _mm512_set1_epi16(0xff))" if u8 else "_mm512_srai_epi16(_mm512_slli_epi16(m, 8), 8)"
    return [
        f"#if {flag} && defined(__AVX512BW__) && defined(__AVX512VL__)",
        f"        const __m512i least = _mm512_set1_epi8((char){least});",
        f"        for (long ow0 = 0; ow0 < {OW}; ow0 += 32) {{",
        f"            __m512i a = _mm512_set1_epi16({least});",
        f"            for (long dw = 0; dw < {kw}; dw++) {{",
        f"                const long w0 = ow0 * 2 - {pw} + dw;",
        f"                const __mmask64 in = eqf_pool_lanes64(w0, {W});",
        "                __m512i m = least;",
        f"                for (long dh = 0; dh < {kh}; dh++) {{",
        f"                    const long h = oh * {sh} - {ph} + dh;",
        f"                    if (h < 0 || h >= {H}) continue;",
        f"                    m = {mx8}(m, _mm512_mask_loadu_epi8(least, in, {x} + (nc * {H} + h) * {W} + w0));",
        "                }",
        f"                a = {mx16}(a, {even});",
        "            }",
        f"            const long n = {OW} - ow0 < 32 ? {OW} - ow0 : 32;",
        f"            _mm256_mask_storeu_epi8(out + (nc * {OH} + oh) * {OW} + ow0, (__mmask32)(n == 32 ? ~0u : (1u << n) - 1),",
        "                                    _mm512_cvtepi16_epi8(a));",
        "        }",
        "#else",
    ]


def _max_pool_stride2(x: str, H, W, OH, OW, kh, kw, sh, ph, pw, flag: str) -> list[str]:
    """With AVX-512 (the plan's pool_s2, the #define `flag`), one output row of a stride-2 max
    pool 16 pixels at a time: a tap's 16 inputs
    are the even lanes of two masked loads (taps outside the image load -inf, which no max
    keeps), picked by one permute. The compiler's own vector loop gathered them lane by lane
    (vinsertps), several times slower than onnxruntime on ResNet-18's 2 x 16 x 32 x 32 stem pool
    (`benchmarks/bench_models.py --model resnet18`).
    NaN is kept as the scalar loop keeps it: a = (v > a || v != v) ? v : a. Without it, the loop
    below it (#else); `defined(__AVX512F__)` as well, so that a plan can never ask a build
    without AVX-512 for its intrinsics."""
    def inside(w0: str) -> str:  # the mask of lanes w0 + i inside [0, W)
        return f"eqf_pool_lanes({w0}, {W})"
    return [
        f"#if {flag} && defined(__AVX512F__)",
        "        const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);",
        "        const __m512 ninf = _mm512_set1_ps(-INFINITY);",
        "        for (long ow0 = 0; ow0 < " + str(OW) + "; ow0 += 16) {",
        "            __m512 a = ninf;",
        f"            for (long dh = 0; dh < {kh}; dh++) {{",
        f"                const long h = oh * {sh} - {ph} + dh;",
        f"                if (h < 0 || h >= {H}) continue;",
        f"                const float* row = {x} + (nc * {H} + h) * {W};",
        f"                for (long dw = 0; dw < {kw}; dw++) {{",
        f"                    const long w0 = ow0 * 2 - {pw} + dw;",
        f"                    const __m512 lo = _mm512_mask_loadu_ps(ninf, {inside('w0')}, row + w0);",
        f"                    const __m512 hi = _mm512_mask_loadu_ps(ninf, {inside('w0 + 16')}, row + w0 + 16);",
        "                    const __m512 v = _mm512_permutex2var_ps(lo, even, hi);",
        "                    a = _mm512_mask_mov_ps(a, _mm512_cmp_ps_mask(v, a, _CMP_GT_OQ) |",
        "                                              _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v);",
        "                }",
        "            }",
        f"            const long n = {OW} - ow0 < 16 ? {OW} - ow0 : 16;",
        f"            _mm512_mask_storeu_ps(out + (nc * {OH} + oh) * {OW} + ow0, (__mmask16)((1u << n) - 1), a);",
        "        }",
        "#else",
    ]


def _pool_grad(an: Node, ins, xs, out, ct, par: str = "0"):
    """dx of max_pool2d (each window's dy to its first largest element; the first NaN) or
    avg_pool2d (spread over the window's counted elements); one image plane per iteration."""
    _, _, H, W = xs[0]
    (kh, kw), (sh, sw), (ph, pw) = (pair(an.attr["kernel_size"]), pair(an.attr["stride"] or an.attr["kernel_size"]),
                                    pair(an.attr["padding"]))
    OH, OW = xs[1][2], xs[1][3]
    x, dy = ins
    head = [f"#pragma omp parallel for if ({par})",
            f"for (long nc = 0; nc < {out[0] * out[1]}; nc++) {{",
            f"    {ct}* restrict d = out + nc * {H * W}L;",
            f"    for (long i = 0; i < {H * W}; i++) d[i] = 0.0f;",
            f"    for (long oh = 0; oh < {OH}; oh++)",
            f"        for (long ow = 0; ow < {OW}; ow++) {{",
            f"            const float g = {dy}[(nc * {OH} + oh) * {OW} + ow];"]
    window = [f"            for (long dh = 0; dh < {kh}; dh++) {{",
              f"                const long h = oh * {sh} - {ph} + dh;",
              f"                if (h < 0 || h >= {H}) continue;",
              f"                for (long dw = 0; dw < {kw}; dw++) {{",
              f"                    const long w = ow * {sw} - {pw} + dw;",
              f"                    if (w < 0 || w >= {W}) continue;"]
    if an.attr["mode"] == "max":
        body = ["            long best = -1; float a = -INFINITY;", *window,
                f"                    const float v = {x}[(nc * {H} + h) * {W} + w];",
                "                    if (best < 0 || v > a || (v != v && a == a)) { a = v; best = h * " + f"{W} + w; }}",
                "                }", "            }",
                "            d[best] += g;"]
    else:
        lo_h, lo_w = f"oh * {sh} - {ph}", f"ow * {sw} - {pw}"  # the window's first row and column
        count = ([f"            const float share = g / {kh * kw}.0f;"] if an.attr["count_include_pad"] else
                 [f"            const long ch = ({lo_h} + {kh} < {H} ? {lo_h} + {kh} : {H}) - ({lo_h} > 0 ? {lo_h} : 0);",
                  f"            const long cw = ({lo_w} + {kw} < {W} ? {lo_w} + {kw} : {W}) - ({lo_w} > 0 ? {lo_w} : 0);",
                  "            const float share = g / (float)(ch * cw);"])
        body = [*count, *window, f"                    d[h * {W} + w] += share;", "                }", "            }"]
    return head + body + ["        }", "}"]


def _scatter_elements_add(an: Node, ins, xs, out, ct, par: str = "0"):
    x, idx, upd = ins
    ax = an.attr["axis"] % len(out)
    return [f"memcpy(out, {x}, {_size(out)} * sizeof(*out));",
            *_along_axis(idx, xs[1], ax, out, "continue", f"out[pos] += {upd}[n];")]


def _matmul_integer(an: Node, ins, xs, out, ct, par: str = "0"):
    """(int32(a) - a_zp) @ (int32(b) - b_zp) in int32: a plain loop over rows of a, the columns of
    b innermost (contiguous, so the compiler vectorizes it); exact, as onnxruntime's MatMulInteger.
    b is 2-D (shared by every batch) or has a's batch dims; b_zp is a scalar or one per column."""
    a, b, azp, bzp = ins
    M, K, N = xs[0][-2], xs[0][-1], xs[1][-1]
    rows = _size(out[:-1])
    b_batch = 0 if len(xs[1]) == 2 else K * N
    bz = f"(int32_t){bzp}[n]" if len(xs[3]) == 1 else f"(int32_t){bzp}[0]"
    return [f"const int32_t az = (int32_t){azp}[0];",
            f"for (long r = 0; r < {rows}; r++) {{",
            f"    int32_t *o = out + r * {N};",
            f"    const long bo = (r / {M}) * {b_batch};",
            f"    for (long n = 0; n < {N}; n++) o[n] = 0;",
            f"    for (long k = 0; k < {K}; k++) {{",
            f"        const int32_t av = (int32_t){a}[r * {K} + k] - az;",
            f"        for (long n = 0; n < {N}; n++) o[n] += av * ((int32_t){b}[bo + k * {N} + n] - {bz});",
            "    }",
            "}"]


def _range_pass(x: str, start: str, end: str) -> list[str]:
    """C lines setting dlo = min(x, 0), dhi = max(x, 0) over the floats x[start, end): one
    vectorized pass, started at 0 so the range holds 0; a NaN is passed over (v < lo is false). 64
    lanes of minima and maxima side by side (four vectors of each on AVX-512), so that the
    compare-selects of consecutive vectors do not wait for each other; min and max are exact, so
    the order they are taken in (and how the pass is split into blocks) changes nothing."""
    return ["float dlo = 0.0f, dhi = 0.0f;",
            "{",
            "    float lo[64] = {0.0f}, hi[64] = {0.0f};",
            f"    const long whole = {start} + ({end} - {start}) / 64 * 64;",
            f"    for (long i = {start}; i < whole; i += 64)",
            "#pragma omp simd",
            "        for (int j = 0; j < 64; j++) {",
            f"            const float v = {x}[i + j];",
            "            lo[j] = v < lo[j] ? v : lo[j];",
            "            hi[j] = v > hi[j] ? v : hi[j];",
            "        }",
            f"    for (long i = whole; i < {end}; i++) {{",
            f"        const float v = {x}[i];",
            "        lo[0] = v < lo[0] ? v : lo[0];",
            "        hi[0] = v > hi[0] ? v : hi[0];",
            "    }",
            "    for (int j = 0; j < 64; j++) {",
            "        dlo = lo[j] < dlo ? lo[j] : dlo;",
            "        dhi = hi[j] > dhi ? hi[j] : dhi;",
            "    }",
            "}"]


def _dynamic_range(x: str, n: int) -> list[str]:
    """The pass over all n floats of x, then DynamicQuantizeLinear's scale in f32 as onnxruntime:
    (hi - lo) / 255, divided."""
    return _range_pass(x, "0L", f"{n}L") + ["const float scale = dhi == dlo ? 1.0f : (dhi - dlo) / 255.0f;"]


def _dynamic_scale(an: Node, ins, xs, out, ct, par=False):
    return _dynamic_range(ins[0], _size(xs[0])) + ["out[0] = scale;"]


def _dynamic_zero_point(an: Node, ins, xs, out, ct, par=False):
    """saturate(round_half_even(-lo / scale)): onnxruntime's qmin - lo / scale, clamped, rounded."""
    return _dynamic_range(ins[0], _size(xs[0])) + ["out[0] = (uint8_t)eqf_quantize(-dlo, scale, 0.0f, 0.0f, 255.0f);"]


# dynamic_range's pass in blocks of floats (the plan's `block`, _range_block), the items of its
# parallel loop: at least RANGE_BLOCK_MIN floats each (a block's 64-lane partial minima and maxima
# are combined once per block), and at most RANGE_BLOCKS_MAX blocks (their [lo, hi] pairs are an
# array on the calling thread's stack)
RANGE_BLOCK_MIN = 4096
RANGE_BLOCKS_MAX = 256


def _range_block(n: int) -> int:
    per = max(RANGE_BLOCK_MIN, -(-n // RANGE_BLOCKS_MAX))
    return -(-per // 64) * 64


def _dynamic_range_pooled(name: str, x: str, n: int, block: int, par: str) -> tuple[list[str], str]:
    """[lo, hi]: the one pass over x whose two floats dynamic_scale and dynamic_zero_point then
    read, over blocks of `block` floats, the items of an eqf_region loop (common_pool.h: split over
    the call's threads when the plan is parallel). Each range of blocks is one pass (on one thread,
    all of x in one pass) that writes its [lo, hi] pair at its first block, and [0, 0] at the
    others (0 is in every range: those change nothing); the calling thread then takes the range
    of the pairs (min and max are exact: the result is the one pass's, whatever thread ran which
    blocks). (the kernel's lines, the C of the range function)"""
    nb = -(-n // block)
    fn = [f"/* {name}: dynamic_range's blocks [b0, b1) of {block} floats, one pass writing their [lo, hi] pair */",
          f"typedef struct {{ const float* x; float* part; }} {name}_job;",
          f"static void {name}_range(void* job, long b0, long b1)", "{", f"    const {name}_job* jb = job;",
          "    const float* restrict x = jb->x;",
          f"    const long s = b0 * {block}L, e = b1 * {block}L < {n}L ? b1 * {block}L : {n}L;",
          *("    " + ln for ln in _range_pass("x", "s", "e")),
          "    jb->part[2 * b0] = dlo;",
          "    jb->part[2 * b0 + 1] = dhi;",
          "    for (long b = b0 + 1; b < b1; b++)",
          "        jb->part[2 * b] = jb->part[2 * b + 1] = 0.0f;",
          "}", ""]
    lines = [f"float part[2 * {nb}];",
             f"{name}_job job = {{ {x}, part }};",
             f"eqf_region({nb}, {name}_range, &job, {par});",
             "float dlo = 0.0f, dhi = 0.0f;",
             f"for (long b = 0; b < {nb}; b++) {{",
             "    dlo = part[2 * b] < dlo ? part[2 * b] : dlo;",
             "    dhi = part[2 * b + 1] > dhi ? part[2 * b + 1] : dhi;",
             "}",
             "out[0] = dlo;",
             "out[1] = dhi;"]
    return lines, "\n".join(fn)


BUILDERS = {"matmul_integer": _matmul_integer, "range": _range, "gather": _gather, "scatter_add": _scatter_add, "gather_elements": _gather_elements, "cumsum": _cumsum, "argmax": _argmax, "topk": _topk,
            "tril": _tri, "triu": _tri, "pad": _pad, "max_pool2d": _pool, "avg_pool2d": _pool,
            "pool2d_grad": _pool_grad, "scatter_elements_add": _scatter_elements_add,
            "dynamic_scale": _dynamic_scale, "dynamic_zero_point": _dynamic_zero_point,
            "dynamic_range": _dynamic_range_pooled}  # (with its range function: Index.emit calls it)


@dataclass(frozen=True)
class IndexDetail:
    op: str
    checked: bool  # the kernel returns how many indices were out of range
    parallel: bool  # the `if` of the pooling kernels' parallel loop (the others run on one thread)
    # pooling between direct convs: input / output in blocks of VL channels (eqfuse.backend.kinds.contraction.conv)
    in_blocked: bool = False
    out_blocked: bool = False
    vl: int = 0  # the channels of a block (set with in_blocked / out_blocked)
    # a stride-2 max_pool2d, NCHW, 16 output pixels per AVX-512 vector (_max_pool_stride2): the
    # machine's vectors hold 16 floats
    pool_s2: bool = False
    # dynamic_range: the floats of one block of its pass, the items of its parallel loop (_range_block)
    block: int = 0

    @property
    def regions(self) -> bool:
        """Whether the kernel's parallel loop is eqf_region ranges (a pooling kernel's, `on_pool`): the
        call runs them as OpenMP's static split or on the claim-based pool, and the run function
        holds the pool's workers over the kernel in the latter (eqfuse.runtime.program.hold_pool)."""
        return self.op in POOLS or self.op == "dynamic_range"


class Index(Kind):
    kinds = (K.INDEX,)

    def plan(self, plan: KernelPlan, c) -> None:
        an = plan.body.nodes[plan.shape.anchor]
        total = _size(plan.out_shape)
        par = an.op in POOLS and total >= PARALLEL_MIN
        threads = ((f"the images x channels, {REGIONS} ({total} output elements >= {PARALLEL_MIN})" if par
                    else parallel_rule(par, f"{total} output elements", PARALLEL_MIN, ""))
                   if an.op in POOLS else "one thread, no parallel region (a selection)")
        block = 0
        if an.op == "dynamic_range":  # a reduction of all of x: its blocks over the threads
            n = _size(plan.body.nodes[an.args[0]].type.shape)
            block, par = _range_block(n), n >= PARALLEL_MIN
            threads = (f"blocks of {block} floats of x, {REGIONS} ({n} floats >= {PARALLEL_MIN})" if par
                       else parallel_rule(par, f"{n} floats of x", PARALLEL_MIN, ""))
        s2 = an.op == "max_pool2d" and pair(an.attr["stride"] or an.attr["kernel_size"])[1] == 2 and c.simd_floats >= 16
        plan.detail = IndexDetail(an.op, an.op in INDEX_CHECKED, par, pool_s2=s2, block=block)
        plan.threads = threads
        plan.cache_check = "streaming selection (no reuse to block for)"
        plan.uops = [UOp(0, "Loop", f"{total} output elements of {an.op}", total),
                     UOp(1, "Load", "the selected input element(s)", total),
                     UOp(1, "Store", "out element", total)]

    def emit(self, plan: KernelPlan) -> str:
        body = plan.body
        an = body.nodes[plan.shape.anchor]
        params, ptrs = kernel_params(plan)
        ins = [ptrs[a] for a in an.args]
        xs = [tuple(body.nodes[a].type.shape) for a in an.args]
        xts = [C_TYPE[body.nodes[a].type.dtype] for a in an.args] or [C_TYPE[an.type.dtype]]
        d = plan.detail
        par = f"{plan.name}_PARALLEL"  # (the template's #define of the plan's parallel)
        if d.in_blocked or d.out_blocked:
            lines = pool_blocked(an, ins[0], xs, tuple(plan.out_shape), plan.name)
        elif an.op == "dynamic_range":
            lines, ranges = _dynamic_range_pooled(plan.name, ins[0], _size(xs[0]), d.block, par)
        elif plan.live is not None and plan.live.what == "dim":  # (eqfuse.backend.runtime_dim) a cumsum
            params += ", long live"  # along the dim: its first live positions; a gather by indices over
            lines = BUILDERS[an.op](an, ins, xs, tuple(plan.out_shape), xts[0], par,  # the dim: those at
                                    **_live_indices(an.op, xs[1] if len(xs) > 1 else (), plan.live.rows))  # them
        else:
            lines = BUILDERS[an.op](an, ins, xs, tuple(plan.out_shape), xts[0], par)
        if an.op != "dynamic_range":
            lines, ranges = on_pool(plan.name, params, lines) if an.op in POOLS else (lines, "")
        return render("index.c", NAME=plan.name, OP=an.op, SPACE=list(plan.out_shape), PARAMS=params,
                      PARALLEL=int(d.parallel), IN_BLOCKED=int(d.in_blocked), OUT_BLOCKED=int(d.out_blocked),
                      VL=d.vl, CHECKED=int(d.checked), POOL_S2=int(d.pool_s2), RANGES=ranges,
                      BODY="\n".join("    " + ln for ln in lines))


def _live_indices(op: str, idx, capacity: int) -> dict:
    """The keywords of a cumsum's or a gather's builder over a dim taken at run time, `live` its
    length: a cumsum's first live positions along it; a gather's indices at the first live
    positions of each axis of the dim (its first rows when the dim leads them, at one axis), so
    that no index at a position past the length, which may hold anything, is read."""
    if op == "cumsum":
        return {"count": "live"}
    axes = [a for a, d in enumerate(idx) if d == capacity]
    if not axes:  # (the dim is the table's alone: its positions are copied, whatever they hold)
        return {}
    if len(axes) == 1 and all(d == 1 for d in idx[:axes[0]]):
        return {"count": f"(live * {_size(idx) // capacity})"}
    if op == "gather_elements":
        return {"skip": " || ".join(f"i{a} >= live" for a in axes)}
    return {"skip": " || ".join(f"k / {_size(idx[a + 1:])} % {capacity} >= live" for a in axes)}


PARALLEL_FOR = re.compile(r"#pragma omp parallel for if \((\w+)\)")
LOOP = re.compile(r"for \(long (\w+) = 0; \1 < ([^;]+); \1\+\+\)(.*)")


def on_pool(name: str, params: str, lines: list[str]) -> tuple[list[str], str]:
    """A pooling kernel's parallel loop (`#pragma omp parallel for if (P)` over `for (long v = 0;
    v < n; v++)`) as a range function of the claim-based pool (common_pool.h, eqf_region, which
    never waits for a thread that has not started, or OpenMP's static split: the call picks): (the
    kernel's lines, the C of the range function before it). The lines before the loop (a blocked
    pooling's macros) open the range function; the loop is the kernel's last statement. Lines
    without such a loop come back as they are, with no function."""
    i = next((k for k, ln in enumerate(lines) if PARALLEL_FOR.fullmatch(ln)), None)
    if i is None:
        return lines, ""
    m, loop = PARALLEL_FOR.fullmatch(lines[i]), LOOP.fullmatch(lines[i + 1])
    assert loop, lines[i + 1]
    v, n, rest = loop.groups()
    job = param_job(params)
    fn = [f"/* {name}: the loop's items [lo, hi), read from the call's job (its arguments) */",
          f"typedef struct {{ {job['PARAM_FIELDS']} }} {name}_job;",
          f"static void {name}_range(void* job, long lo, long hi)", "{", f"    const {name}_job* jb = job;",
          f"    {job['PARAM_UNPACK']}", *("    " + ln for ln in lines[:i]),
          f"    for (long {v} = lo; {v} < hi; {v}++){rest}", *("    " + ln for ln in lines[i + 2:]), "}", ""]
    call = [f"{name}_job job = {{ {job['PARAM_INIT']} }};", f"eqf_region({n}, {name}_range, &job, {m.group(1)});"]
    return call, "\n".join(fn)
