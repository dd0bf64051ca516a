"""The integer GEMM's avx2_maddubs path (kinds.contraction.qgemm.int8_path): on a CPU without
VNNI, bound weights are multiplied by vpmaddubsw, whose int16 sum of a pair of u8 x s8 products
saturates only for a pair of weights of one sign whose magnitudes sum past 128; the pack reduces
the larger of each such pair and the kernel adds A's byte times the remainder to its tiles
(qgemm.pair_corrections counts them when the plan is made), then vpmaddwd by ones sums the pairs
into int32. Any other B keeps the exact vpmaddwd fallback.

The tests that run kernels pin a machine model without VNNI (the host's, VNNI turned off), so that
the path runs on every AVX2, AVX-512 and AMX host; the plan tests pin models as they are."""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import one_graph

import eqfuse
from eqfuse import machine
from eqfuse.backend.kinds.contraction import qgemm
from eqfuse.backend.lower import format_uops, lower_graph
from eqfuse.ir.ops import OPS


def seven_bit(rng, shape, dtype=np.int8):
    """Random 7-bit weights (u8: 64..192, read by the kernel as w - 128), the first two output
    channels (last axis of a matmul's B, first of a conv's) at the two extremes, so that every
    vpmaddubsw pair of them meets A's 255s at the largest sums that need no correction."""
    lo, hi = (-64, 64) if dtype == np.int8 else (64, 192)
    w = rng.integers(lo, hi + 1, shape).astype(dtype)
    first = (slice(None), 0) if len(shape) == 2 else (0,)
    second = (slice(None), 1) if len(shape) == 2 else (1,)
    w[first], w[second] = hi, lo
    return w


# pairs of packed weights (s8) at and past the edge of vpmaddubsw's int16: one sign and magnitudes
# summing past 128 (corrected), at 128 exactly and of opposite signs (not)
PAIRS = [(127, 127), (-128, -128), (-128, -1), (-2, -127), (127, 2), (65, 64), (64, 64), (-128, 127), (127, -128)]
CORRECTED = 6  # (the first six)


def eight_bit(rng, shape, dtype=np.int8, where=None, channels=(0, 1), step=1):
    """Full-range 8-bit weights as a quantizer writes them (a bell-shaped spread, +-127 at the
    largest), with every pair of PAIRS planted in the first two output channels, at K-pairs spread
    over K (`where`: the K index of each pair's first weight, even; its second `step` after it, the
    two adjacent in the packed K), in the first output channel and swapped in the second
    (`channels`), against the reference that meets them with A's 255s."""
    v = np.clip(np.round(rng.normal(0, 20, shape)), -128, 127).astype(np.int16)
    mat = v.reshape(shape[0], -1) if len(shape) > 2 else v.T  # (output channels x K)
    ks = where if where is not None else np.linspace(0, mat.shape[1] - 2, len(PAIRS)).astype(int) // 2 * 2
    for c in channels:
        for (a, b), k in zip(PAIRS, ks):
            mat[c, k], mat[c, k + step] = (a, b) if c == 0 else (b, a)
    w = (mat.reshape(shape) if len(shape) > 2 else mat.T).copy()
    return (w + 128).astype(np.uint8) if dtype == np.uint8 else w.astype(np.int8)


# Odd shapes (M, N, K not multiples of the tiles 3 x 24, 4 x 16, 6 x 8; K not a multiple of 4), a u8 A
# and an s8 one, a zero point per column, a u8 B of 7 bits after its - 128, one with K in blocks
# (partial sums between them) and its panels shared by the threads
MATMULS = """
graph mm(a1: u8[7, 237], w1: i8[237, 53], a2: i8[13, 130], w2: i8[130, 70], a3: u8[11, 6], w3: i8[6, 5],
         a4: u8[10, 600], w4: u8[600, 16], a5: u8[40, 1501], w5: i8[1501, 70], az: u8, sz: i8, wz: i8, wzc: i8[70],
         uz: u8) {
    return matmul_integer(a1, w1, az, wz), matmul_integer(a2, w2, sz, wzc), matmul_integer(a3, w3, az, wz),
           matmul_integer(a4, w4, az, uz), matmul_integer(a5, w5, az, wz)
}
"""


@pytest.mark.parametrize("bits", [8, 7])  # (the fast tier runs the first: the corrected pairs)
def test_the_maddubs_path_is_exact_on_edge_tiles_and_extreme_weights(no_vnni, bits):
    rng = np.random.default_rng(30)
    u8 = lambda *s: rng.integers(0, 256, s).astype(np.uint8)  # noqa: E731
    weights = seven_bit if bits == 7 else eight_bit
    w = {"w1": weights(rng, (237, 53)), "w2": weights(rng, (130, 70)), "w3": seven_bit(rng, (6, 5)),
         "w4": weights(rng, (600, 16), np.uint8), "w5": weights(rng, (1501, 70))}
    x = {"a1": u8(7, 237), "a2": rng.integers(-128, 128, (13, 130)).astype(np.int8), "a3": u8(11, 6), "a4": u8(10, 600),
         "a5": u8(40, 1501), "az": np.asarray(131, np.uint8), "sz": np.asarray(-77, np.int8),
         "wz": np.asarray(-3, np.int8), "wzc": rng.integers(-128, 128, 70).astype(np.int8), "uz": np.asarray(200, np.uint8)}
    for k in ("a1", "a3", "a4", "a5"):
        x[k][0] = 255  # (a row of the largest activations)
    x["a2"][0] = 127  # (read as u8 a + 128 = 255)
    mod = eqfuse.compile(MATMULS, params=w)
    plans = [p for p in mod.default.last.plans if p.kind == "contraction"]
    assert [p.precision_path for p in plans] == ["avx2_maddubs"] * 5 and all(p.prepack is not None for p in plans)
    # (7 bits: no pair to correct; 8 bits: the planted ones and those of the random weights, the same
    # count as the numpy model of the packed weights gives)
    # (the C's room for them from the shape alone, `eqfuse lower` saying how many there are)
    names = {(237, 53): "w1", (130, 70): "w2", (6, 5): "w3", (600, 16): "w4", (1501, 70): "w5"}
    text = {p.name: format_uops([p]) for p in plans}
    fixes = {}
    for p in plans:
        packed = qgemm.packed_weights(w[names[p.detail.K, p.detail.N]], p.detail)
        n = qgemm.pair_corrections(packed)
        assert p.detail.corrections == (qgemm.correction_room(packed) if n else 0), p.name
        assert (f"the {n} weight pairs vpmaddubsw could saturate on" in text[p.name]) == (n > 0), p.name
        fixes[names[p.detail.K, p.detail.N]] = n
    assert fixes["w3"] == 0
    assert all(fixes[k] == 0 if bits == 7 else fixes[k] >= 2 * CORRECTED for k in ("w1", "w2", "w4", "w5")), fixes
    # (N = 53: 4 x 16 pads to 64, 3 x 24 to 72; N = 70: 3 x 24 to 72, 4 x 16 to 80; N = 16 and 5)
    assert sorted((p.tiles["mr"], p.tiles["nr"]) for p in plans) == [(3, 24), (3, 24), (4, 16), (4, 16), (6, 8)]
    assert sorted(p.detail.K for p in plans if p.tiles["kc"] < p.detail.K) == sorted(p.detail.K for p in plans if p.detail.parallel) == [1501]
    assert all("_PATH 4 " in k.c_source for k in mod.kernels if k.kind == "contraction")  # (the plan is what runs)
    ab = [("a1", "w1", "az", "wz"), ("a2", "w2", "sz", "wzc"), ("a3", "w3", "az", "wz"), ("a4", "w4", "az", "uz"),
          ("a5", "w5", "az", "wz")]
    want = [(x[a].astype(np.int64) - x[az].astype(np.int64)) @ (w[b].astype(np.int64) - x[bz].astype(np.int64))
            for a, b, az, bz in ab]
    assert max(np.abs(wi).max() for wi in want) > 1 << 15  # (sums past int16: the int32 step is exercised)
    for threads in (1, 2):
        mod.default.threads = threads
        for (a, *_), g, wi in zip(ab, mod(**x), want):
            assert g.dtype == np.int32 and np.array_equal(g.astype(np.int64), wi), (a, threads)


# Integer convs with bound weights of one group: read in place as virtual pixels (DIRECT_X 1:
# OW = 11, stride 1), by output row (DIRECT_X 2: OW = 6, a multiple of the tile's 3 rows: 48 output
# channels take 3 x 24, which pads them no more than 4 x 16), and a 5 x 5, read in place too when
# x's channels are in fours (else through its im2col); more output channels than one panel. x's
# channels: 12, in fours (the K-groups four channels of a tap: qgemm.channels_in_fours), or 10
# (kernel rows padded to four taps)
CONVS = """
graph cv(x: u8[2, {c}, 9, 11], w: i8[48, {c}, 3, 3], w5: i8[20, {c}, 5, 5], xz: u8, wz: i8[48], wz0: i8) {{
    return conv_integer(x, w, xz, wz, padding=1), conv_integer(x, w, xz, wz, stride=2, padding=1),
           conv_integer(x, w5, xz, wz0, padding=2)
}}
"""


@pytest.mark.parametrize("bits, c", [(8, 12), (8, 10), (7, 12)])  # (the fast tier runs the first: the corrected pairs)
def test_the_maddubs_path_is_exact_in_integer_convs(no_vnni, bits, c):
    rng = np.random.default_rng(31)
    if bits == 7:
        w = {"w": seven_bit(rng, (48, c, 3, 3)), "w5": seven_bit(rng, (20, c, 5, 5))}
    elif c % 4 == 0:  # (the convs read x in place, its channels in fours: a packed pair is channels 4 j + 2 i
        # and 4 j + 2 i + 1 at one tap, KH x KW apart in the weights' order (channel, kernel row, tap))
        taps = [(0, 0), (2, 1), (4, 2), (6, 3), (8, 4), (10, 5), (0, 6), (2, 7), (4, 8)]
        w = {"w": eight_bit(rng, (48, c, 3, 3), where=[ch * 9 + t for ch, t in taps], channels=(0,), step=9),
             "w5": eight_bit(rng, (20, c, 5, 5), where=[ch * 25 + t for ch, t in taps], channels=(0,), step=25)}
    else:  # (the 3 x 3's pairs at taps 0-1 of a kernel row, the padded rows' K: (c, u) 4 packed bytes apart)
        w = {"w": eight_bit(rng, (48, c, 3, 3), where=np.arange(len(PAIRS)) * 3, channels=(0,)),
             "w5": eight_bit(rng, (20, c, 5, 5), channels=(0,))}
    x = {"x": rng.integers(0, 256, (2, c, 9, 11)).astype(np.uint8), "xz": np.asarray(77, np.uint8),
         "wz": rng.integers(-128, 128, 48).astype(np.int8), "wz0": np.asarray(0, np.int8)}
    x["x"][0] = 255  # (an image of the largest activations)
    mod = eqfuse.compile(CONVS.format(c=c), params=w)
    convs = [k for k in mod.kernels if k.kind == "contraction"]
    assert [k.decisions["prepacked_b"] for k in convs] == [1, 1, 1]
    assert sorted(k.decisions["direct_x"] for k in convs) == ([1, 1, 2] if c % 4 == 0 else [0, 1, 2])
    assert all(v["path"] == "avx2_maddubs" for v in mod.report["precision"].values() if v["precision"] == "int8")
    text = format_uops([p for p in mod.default.last.plans if p.kind == "contraction"])
    fixes = [int(n) for n in re.findall(r"the (\d+) weight pairs vpmaddubsw could saturate on", text)]
    assert fixes == [] if bits == 7 else len(fixes) == 3 and min(fixes) >= CORRECTED, fixes
    conv = OPS["conv_integer"].numpy  # (the reference: int64 sums of (x - x_zp) (w - w_zp))
    geo = lambda **a: {"stride": 1, "padding": 0, "dilation": 1, "group": 1, **a}  # noqa: E731
    want = [conv([x["x"], w["w"], x["xz"], x["wz"]], geo(padding=1)),
            conv([x["x"], w["w"], x["xz"], x["wz"]], geo(stride=2, padding=1)),
            conv([x["x"], w["w5"], x["xz"], x["wz0"]], geo(padding=2))]
    for threads in (1, 2):
        mod.default.threads = threads
        for g, wi in zip(mod(**x), want):
            assert g.dtype == np.int32 and g.shape == wi.shape and np.array_equal(g, wi), threads


ONE = "graph one(a: u8[16, 40], w: {t}[40, 48], az: u8, wz: {t}) {{ return matmul_integer(a, w, az, wz) }}"
CONV_G = """graph c(x: u8[1, 4, 8, 8], w: i8[8, {c}, 3, 3], xz: u8, wz: i8) {{
    return conv_integer(x, w, xz, wz, padding=1, group={g})
}}"""


def _path(src: str, model: str, w: np.ndarray | None, bound: bool = True) -> tuple[str, str]:
    """(the integer GEMM's precision_path, `eqfuse lower`'s text) planned for `model` as it is,
    with w bound (params=) and its values known (w None: bound, values unknown) or a run-time input."""
    with machine.pinned(model, clamp=False) as m:
        arrays = None if w is None else {"w": w}
        _, plans = lower_graph(one_graph(src), m, params=frozenset({"w"} if bound else ()), arrays=arrays)
    (p,) = [p for p in plans if p.kind == "contraction"]
    return p.precision_path, format_uops(plans)


def test_bound_weights_take_vpmaddubsw_with_their_pairs_counted():
    rng = np.random.default_rng(1)
    w = rng.integers(-64, 65, (40, 48)).astype(np.int8)
    path, text = _path(ONE.format(t="i8"), "avx2", w)
    assert path == "avx2_maddubs" and "saturate on" not in text  # (7 bits: nothing to correct)
    w[6, 9], w[7, 9] = 100, 29  # (one pair past 128: corrected, and said so)
    path, text = _path(ONE.format(t="i8"), "avx2", w)
    assert path == "avx2_maddubs" and "the 1 weight pairs vpmaddubsw could saturate on" in text
    w[6, 9], w[7, 9] = 100, -29  # (opposite signs: never saturates)
    assert "saturate on" not in _path(ONE.format(t="i8"), "avx2", w)[1]
    # full-range weights drawn evenly: a quarter of the pairs past 128, more than CORRECTED_PAIRS_MAX
    flat = rng.integers(-128, 128, (40, 48)).astype(np.int8)
    assert qgemm.pair_corrections(flat.astype(np.int16)) > qgemm.CORRECTED_PAIRS_MAX * flat.size / 2
    assert _path(ONE.format(t="i8"), "avx2", flat)[0] == "fallback"


def test_only_bound_weights_choose_vpmaddubsw_and_only_without_vnni():
    rng = np.random.default_rng(2)
    w = rng.integers(-64, 65, (40, 48)).astype(np.int8)
    path, text = _path(ONE.format(t="i8"), "avx2", w)
    assert path == "avx2_maddubs" and "precision: int8, path: avx2_maddubs" in text and "vpmaddubsw + vpmaddwd by ones" in text
    assert _path(ONE.format(t="i8"), "avx2", w, bound=False)[0] == "fallback"  # (B a run-time input: any range)
    assert _path(ONE.format(t="i8"), "avx2", None)[0] == "fallback"  # (bound, its values not given)
    assert _path(ONE.format(t="i8"), "zen4", w)[0] == "avx512_vnni"  # (vpdpbusd where the CPU has it)
    # a u8 B is packed as w - 128: 0 and 255 are -128 and 127
    u = rng.integers(64, 193, (40, 48)).astype(np.uint8)
    assert _path(ONE.format(t="u8"), "avx2", u)[0] == "avx2_maddubs"
    u[2, 4], u[3, 4] = 255, 255
    assert "the 1 weight pairs" in _path(ONE.format(t="u8"), "avx2", u)[1]


def test_a_conv_takes_the_maddubs_path_only_with_its_weights_packed_once():
    w1 = np.random.default_rng(3).integers(-64, 65, (8, 4, 3, 3)).astype(np.int8)
    assert _path(CONV_G.format(c=4, g=1), "avx2", w1)[0] == "avx2_maddubs"
    # two groups: the weights are not prepacked (qgemm.mark_bound), so their values are not the plan's
    assert _path(CONV_G.format(c=2, g=2), "avx2", w1[:, :2].copy())[0] == "fallback"


def test_pair_corrections_reads_the_pairs_as_the_kernel_packs_them():
    col = lambda *v: np.array(v, np.int16)[:, None]  # noqa: E731  (one packed column)
    assert qgemm.pair_corrections(col(64, 64, -64, -64)) == 0  # (at 128: no saturation)
    assert qgemm.pair_corrections(col(65, 64, -65, -64)) == 2
    assert qgemm.pair_corrections(col(127, -128, -128, 127)) == 0  # (opposite signs)
    assert qgemm.pair_corrections(col(0, 127, 127, 0, 127, 127)) == 1  # (pairs are k even and k + 1)
