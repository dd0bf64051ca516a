"""The AMX-BF16 path of the blocked bf16 GEMM (docs/precision.md, "AMX-BF16"): tdpbf16ps on 2 x 2
C tiles of 16 x 16 f32, A packed as rows of bf16, B as the K-pairs of the vdpbf16ps path.

A CPU without AMX tests it three ways, and one with AMX a fourth:
- emulated: the kernels' own C, built with -DEQF_AMX_EMULATE (through EQFUSE_CFLAGS), where
  csrc_templates/common_amx.h replaces the tile instructions by C that follows the operation
  sections of Intel's SDM; planned for a machine model with AMX-BF16 (pinned without clamping it
  to the host), over odd shapes with epilogues, against float64 at the documented bf16 bound
  (tests/test_bf16.py's check_gemm);
- the plan: a machine model with AMX-BF16 plans the path, and `eqfuse lower --precision bf16`
  prints it; the few-rows GEMM takes vdpbf16ps, f32 or the widening fallback by the CPU's
  vdpbf16ps rate and its weights' size, and says why;
- compiled for a CPU with AMX (gcc -mamx-tile -mamx-bf16): the assembly holds the tile
  instructions;
- on the hardware, where /proc/cpuinfo has amx_bf16 and amx_tile (skipped with the reason elsewhere).
"""

import contextlib
import dataclasses
import re

import numpy as np
import pytest
from helpers import assembly_for
from test_bf16 import EPS, GELU_F32, GELU_LIP, attention_bound, attention_graph, check_gemm, gelu

import eqfuse
from eqfuse import machine
from eqfuse.backend.cbuild import COMMON_C, build, header_c
from eqfuse.backend.emit import emit_graph
from eqfuse.backend.kinds.contraction.plan_gemm import SLOW_BF16_DOT, SLOW_DOT_F32, amx_kc_top, amx_tiles
from eqfuse.cli.main import main
from eqfuse.errors import EqfuseError
from eqfuse.frontend.load import load
from eqfuse.pipeline import lower

# Odd shapes (no size a multiple of 16 or 32), two GEMMs (one module: each is a gcc run):
# - B passed per call (packed at each call, whole panels by vcvtne2ps2bf16 where the CPU has it),
#   one K slice, bias and relu;
# - a transposed B bound by params= (packed once), K in several slices with a short last one, 33
#   rows (one whole row tile and one row of the next), bias and gelu.
GRAPH = """
graph amx(x1: f32[70, 301], w1: f32[301, 200], b1: f32[200], x2: f32[33, 1101], w2t: f32[130, 1101],
          b2: f32[130]) {
    y1 = kernel { relu(x1 @ w1 + b1) }
    y2 = kernel { gelu(x2 @ transpose(w2t) + b2) }
    return y1, y2
}
"""
SHAPES = {"x1": (70, 301), "w1": (301, 200), "b1": (200,), "x2": (33, 1101), "w2t": (130, 1101), "b2": (130,)}
BOUND = ("w2t", "b2")  # (params=: packed once)


def amx_model() -> machine.Machine:
    """This host's model with AMX-BF16 (and AVX512_BF16, which every CPU with AMX-BF16 has), and an
    L2 of 256 KiB: K slices of at most 512 (plan_gemm.amx_kc_top), so that w2t's K of 1101 takes
    several and the partial sums' path runs."""
    return dataclasses.replace(machine.machine(), simd_floats=16, avx512_bf16=True, amx_bf16=True, l2=256 << 10)


def host_has_amx() -> bool:
    flags = machine.cpu_flags()
    return "amx_bf16" in flags and "amx_tile" in flags


def arrays(seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def compile_amx(a: dict[str, np.ndarray]):
    return eqfuse.compile(GRAPH, fuse="manual", params={k: a[k] for k in BOUND}, precision="bf16")


def check_all(mod, a: dict[str, np.ndarray]) -> None:
    """Every GEMM planned on the AMX path and within the documented bound of float64."""
    plans = [p for p in mod.default.last.plans if p.kind == "contraction"]
    assert len(plans) == 2 and plans[1].detail.prepack is not None
    for p in plans:
        assert (p.precision, p.precision_path, p.detail.path) == ("bf16", "amx_bf16", "blocked"), p.name
        assert (p.tiles["mr"], p.tiles["nr"]) == (32, 32) and mod.report["precision"][p.name]["path"] == "amx_bf16"
    assert any(p.tiles["kc"] < p.detail.K for p in plans)  # (K in several slices)
    y1, y2 = mod(*[a[k] for k in SHAPES if k not in BOUND])
    check_gemm(y1, a["x1"], a["w1"], epilogue=lambda z: np.maximum(z, 0), bias=a["b1"])
    check_gemm(y2, a["x2"], a["w2t"].T, epilogue=gelu, lip=GELU_LIP, own=EPS + GELU_F32, bias=a["b2"])


@pytest.fixture(scope="module")
def emulated():
    """The AMX kernels built with the emulated tile instructions (EQF_AMX_EMULATE)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EQFUSE_CFLAGS", "-DEQF_AMX_EMULATE")
        with machine.pinned(amx_model(), clamp=False):
            a = arrays()
            yield compile_amx(a), a


@pytest.mark.heavy  # (a few seconds: the whole suite runs it, the fast tier not)
def test_emulated_amx_gemms_are_within_the_bf16_bound(emulated):
    mod, a = emulated
    check_all(mod, a)


@pytest.mark.heavy  # (the fast tier's time)
def test_a_refused_tile_state_is_an_error_not_a_signal(monkeypatch):
    """The operating system's refusal (emulated: eqf_amx_ready() says no) stops the GEMM before
    any tile instruction, and the call raises an error that says what to do."""
    monkeypatch.setenv("EQFUSE_CFLAGS", "-DEQF_AMX_EMULATE -DEQF_AMX_EMULATE_REFUSED -O0")  # (-O0: gcc's time only)
    src = "graph g(x: f32[40, 50], w: f32[50, 60]) -> f32[40, 60] {\n  return x @ w\n}"
    with machine.pinned(amx_model(), clamp=False):
        mod = eqfuse.compile(src, precision="bf16")
        with pytest.raises(EqfuseError, match="refused this process the tile state.*EQFUSE_AMX=0"):
            mod(np.ones((40, 50), np.float32), np.ones((50, 60), np.float32))


@pytest.mark.skipif(not host_has_amx(), reason="this CPU has no AMX-BF16 (amx_bf16/amx_tile not in /proc/cpuinfo)")
def test_amx_gemms_on_the_hardware_are_within_the_bf16_bound():
    with machine.pinned(amx_model()):
        check_all(compile_amx(arrays(1)), arrays(1))


def test_a_machine_with_amx_plans_the_tiles_and_lower_prints_it(tmp_path, capsys):
    model = tmp_path / "g.g"
    model.write_text("graph g(x: f32[1024, 1024], w: f32[1024, 1024], b: f32[1024]) -> f32[1024, 1024] {\n"
                     "  return relu(x @ w + b)\n}\n")
    with machine.pinned(machine.MODELS["xeon-spr"], clamp=False):
        assert main(["lower", str(model), "--precision", "bf16"]) == 0
        text = capsys.readouterr().out
        assert "precision: bf16, path: amx_bf16" in text
        tiles = dict(re.findall(r"(\w+)=(\d+)", re.search(r"tiles: (.*)", text).group(1)))
        # (all of K in one slice: the C tiles stay in the tile registers; a B panel of half of L2)
        assert (tiles["mr"], tiles["nr"], tiles["kc"], tiles["nc"]) == ("32", "32", "1024", "512")
        # a K past the deepest slice (4096 with this model's 2 MiB L2) is cut into equal slices
        assert amx_kc_top(machine.MODELS["xeon-spr"]) == 4096
        assert amx_tiles(512, 512, 8193, machine.MODELS["xeon-spr"])["kc"] == 2752  # (3 slices, whole blocks of 32)
        # few rows (AMX_WHOLE_M): K in slices whose A block holds all of them (BERT's FFN2), not more rows
        assert [amx_tiles(m, 768, 3072, machine.MODELS["xeon-spr"])[t] for m in (128, 256) for t in ("kc", "mc")] == \
            [1536, 128, 3072, 64]
    # the few-rows GEMM over a bound weight (a group of 16 rows would fill an A tile in part): on
    # vdpbf16ps where it is as fast as the FMA, saying so; where vdpbf16ps is slow (this model's),
    # f32 while the weights fit L2, and bf16 weights widened by the FMA path past it
    def few_rows(model, k, n):
        src = f"graph s(x: f32[4, {k}], w: f32[{k}, {n}]) -> f32[4, {n}] {{\n  return kernel {{ x @ w }}\n}}"
        with machine.pinned(model, clamp=False):
            _, _, plans = lower(load(src)[0], {}, fuse="manual", params=frozenset({"w"}), precision="bf16")
        (p,) = [p for p in plans if p.kind == "contraction"]
        assert p.detail.path == "skinny"
        return p.precision, p.precision_path, p.precision_note
    fast = dataclasses.replace(machine.MODELS["xeon-spr"], bf16_dot_ratio=2.0)
    precision, path, note = few_rows(fast, 256, 128)
    assert (precision, path) == ("bf16", "avx512_bf16") and "AMX" in note
    precision, path, note = few_rows(machine.MODELS["xeon-spr"], 256, 128)  # (128 KiB in f32: within L2)
    assert (precision, path) == ("f32", "f32") and "fit L2" in note
    precision, path, note = few_rows(machine.MODELS["xeon-spr"], 1024, 1024)  # (4 MiB in f32: past L2)
    assert (precision, path) == ("bf16", "fallback") and SLOW_BF16_DOT in note
    # without AMX: vdpbf16ps where it issues as often as the FMA; f32, saying why, where it is slower
    for ratio, want in ((2.0, "precision: bf16, path: avx512_bf16"), (0.5, "precision: f32, path: f32")):
        slow = dataclasses.replace(machine.MODELS["xeon-spr"], amx_bf16=False, bf16_dot_ratio=ratio)
        with machine.pinned(slow, clamp=False):
            assert main(["lower", str(model), "--precision", "bf16"]) == 0
            text = capsys.readouterr().out
            assert want in text and (ratio > 1 or SLOW_DOT_F32 in text), text
    # the attention on AMX tiles (whole 64-key tiles, rows of v in vectors of 16, query blocks of
    # whole 16-row tiles, attention.AMX_MIN_KEYS keys or more); with fewer keys, or a few (one tile
    # of 16: the portable loops), not, and where vdpbf16ps is slow it computes in f32, saying why
    for sk, want in ((64, "precision: bf16, path: amx_bf16\n"), (40, "precision: f32, path: f32 ("),
                     (10, "precision: f32, path: f32 (")):
        attention = tmp_path / "a.g"
        attention.write_text(f"graph a(q: f32[1, 2, 64, 64], k: f32[1, 2, {sk}, 64], v: f32[1, 2, {sk}, 64]) -> "
                             "f32[1, 2, 64, 64] {\n"
                             "  return softmax(q @ transpose(k, perm=[0, 1, 3, 2]) * 0.125, axis=-1) @ v\n}\n")
        with machine.pinned(machine.MODELS["xeon-spr"], clamp=False):
            assert main(["lower", str(attention), "--precision", "bf16"]) == 0
        text = capsys.readouterr().out
        assert re.search(r"_attention: .*\n(  .*\n)*  " + re.escape(want), text), text
        assert sk >= 64 or ("fewer than 64 keys" if sk > 16 else "tiles are not whole 64-key tiles") in text


def test_the_real_amx_kernels_compile_for_a_cpu_with_amx(tmp_path):
    """The C of the real path (no emulation), built for a CPU with AMX-TILE and AMX-BF16, holds
    the tile instructions (compiled only: this CPU may have no AMX)."""
    src = "graph g(x: f32[40, 1101], w: f32[1101, 96]) -> f32[40, 96] {\n  return kernel { x @ w }\n}"
    with machine.pinned(amx_model(), clamp=False):  # (K in several slices, B bound: every part of the path)
        _, _, plans = lower(load(src)[0], {}, fuse="manual", params=frozenset({"w"}), precision="bf16")
        code = "\n".join(emit_graph(plans).kernel_sources.values())
    assert "_tile_dpbf16ps" in code
    asm = assembly_for(code, tmp_path, ["-mavx512bf16", "-mamx-tile", "-mamx-bf16"])
    for insn in ("ldtilecfg", "tileloadd", "tdpbf16ps", "tilestored", "tilezero", "tilerelease"):
        assert insn in asm, insn
    assert "syscall(SYS_arch_prctl, 0x1023, 18)" in header_c(code)  # (the permission, asked before the tiles)


# The other mappings of a GEMM onto the AMX kernel: strided batches (one call, a stride per
# operand) and an im2col conv; each against the avx512_bf16 path on the same bf16 operands.
MAPPINGS = """
graph maps(xb: f32[3, 19, 45], wb: f32[3, 45, 33], img: f32[2, 5, 11, 13], f: f32[7, 5, 3, 3]) {
    b = kernel { xb @ wb }
    c = kernel { relu(conv2d(img, f, padding=1)) }
    return b, c
}
"""


@pytest.mark.extended
@pytest.mark.skipif(not machine.host_isa()["avx512_bf16"],
                    reason="the vdpbf16ps side runs on the host, and this CPU has no AVX512_BF16")
def test_emulated_amx_batches_and_im2col_convs_agree_with_vdpbf16ps(monkeypatch):
    """Both paths multiply the same bf16 values: they differ by the order of the f32 additions,
    within twice the accumulation bound of the bf16 operands (tests/test_bf16.py's paths test)."""
    from test_bf16 import bf16

    monkeypatch.setenv("EQFUSE_CONV", "im2col")
    rng = np.random.default_rng(3)
    shapes = {"xb": (3, 19, 45), "wb": (3, 45, 33), "img": (2, 5, 11, 13), "f": (7, 5, 3, 3)}
    a = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    out = {}
    for amx in (True, False):
        monkeypatch.setenv("EQFUSE_CFLAGS", "-DEQF_AMX_EMULATE" if amx else "")
        with machine.pinned(dataclasses.replace(amx_model(), amx_bf16=amx), clamp=False):
            mod = eqfuse.compile(MAPPINGS, fuse="manual", precision="bf16")
        assert {e["path"] for e in mod.report["precision"].values()} == {"amx_bf16" if amx else "avx512_bf16"}
        out[amx] = mod(*[a[k] for k in shapes])
    absb = lambda x: np.abs(bf16(x)).astype(np.float64)  # noqa: E731
    cols = np.lib.stride_tricks.sliding_window_view(np.pad(absb(a["img"]), ((0, 0), (0, 0), (1, 1), (1, 1))),
                                                    (3, 3), axis=(2, 3))  # [n, c, oh, ow, kh, kw]
    sums = [absb(a["xb"]) @ absb(a["wb"]), np.einsum("nchwij,ocij->nohw", cols, absb(a["f"]))]
    for (y_amx, y_vdp, s, K) in zip(out[True], out[False], sums, (45, 5 * 9)):
        bound = 2 * 1.01 * K * EPS * s + 2 * EPS * np.abs(y_vdp)
        assert np.all(np.abs(y_amx.astype(np.float64) - y_vdp) <= bound)


def test_eqfuse_amx_0_turns_the_tiles_off(monkeypatch):
    """A host whose /proc/cpuinfo has amx_bf16 and amx_tile plans the tiles, unless EQFUSE_AMX=0
    (the way out when the operating system refuses the tile state)."""
    flags = frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    monkeypatch.setattr(machine, "cpu_flags", lambda: flags)
    assert machine.host_isa()["amx_bf16"]
    monkeypatch.setenv("EQFUSE_AMX", "0")
    assert not machine.host_isa()["amx_bf16"] and machine.host_isa()["avx512_bf16"]
    monkeypatch.setattr(machine, "cpu_flags", lambda: flags - {"amx_tile"})
    monkeypatch.delenv("EQFUSE_AMX")
    assert not machine.host_isa()["amx_bf16"]


TDP_C = r"""
/* one tdpbf16ps: c (16 x 16 f32) += a (16 rows x 32 bf16) . b (16 K-pairs x 16 columns) */
void tdp(const uint16_t* a, const uint16_t* b, float* c)
{
    eqf_amx_begin();
    _tile_loadd(0, c, 64);
    _tile_loadd(4, a, 64);
    _tile_loadd(6, b, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_stored(0, c, 64);
    _tile_release();
}
"""


@pytest.mark.heavy  # (the fast tier's time)
def test_the_emulated_tdpbf16ps_is_the_sdm_operation():
    """The emulation against the SDM's operation written again in numpy, bit for bit: per output
    element two f32 sums (even and odd elements of the K-pairs) over the 16 pairs, then their sum
    added to C, every step rounded to nearest even and flushed (DAZ = FTZ = 1). One element reads
    a denormal bf16 and another makes a denormal product, where the flushes show."""
    built = build(header_c(TDP_C) + COMMON_C + TDP_C, "void tdp(const uint16_t* a, const uint16_t* b, float* c);",
                  "tdp", extra_flags=("-DEQF_AMX_EMULATE", "-O0"))
    rng = np.random.default_rng(4)
    to_bf16 = lambda x: (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)  # noqa: E731 (exact here)
    a = to_bf16(rng.standard_normal((16, 32)) * 2.0 ** rng.integers(-4, 5, (16, 32)))
    b = to_bf16(rng.standard_normal((16, 32)))
    a[0, :], a[0, 0], b[0, 0] = 0, 0x0001, to_bf16(2.0**100)  # a denormal bf16 (2^-133) x 2^100: 2^-33 unless read as 0
    a[1, :], a[1, 2], b[1, 4] = 0, to_bf16(2.0**-70), to_bf16(2.0**-60)  # a denormal product, 2^-130, unless flushed
    c = rng.standard_normal((16, 16)).astype(np.float32)
    c[0, 0] = c[1, 2] = 0
    got = c.copy()
    built.lib.tdp(*(built.ffi.from_buffer(t, x) for t, x in (("uint16_t[]", a), ("uint16_t[]", b), ("float[]", got))))

    def sdm(flush):
        f32 = lambda h: (h.astype(np.uint32) << 16).view(np.float32)  # noqa: E731 (make_fp32)
        fa, fb = flush(f32(a)), flush(f32(b))
        even, odd = np.zeros((16, 16), np.float32), np.zeros((16, 16), np.float32)
        for k in range(16):  # (a bf16 product is exact in f32: the FMA rounds once, at the add)
            even = flush(even + fa[:, 2 * k, None] * fb[None, k, 0::2])
            odd = flush(odd + fa[:, 2 * k + 1, None] * fb[None, k, 1::2])
        return flush(flush(c) + flush(even + odd))

    with np.errstate(over="ignore", under="ignore"):
        want = sdm(lambda x: np.where(np.abs(x) < 2.0**-126, np.copysign(np.float32(0), x), x).astype(np.float32))
        plain = sdm(lambda x: x.astype(np.float32))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert got[0, 0] == got[1, 2] == 0 and plain[0, 0] == 2.0**-33 and plain[1, 2] == 2.0**-130  # (the flushes show)


def test_the_bf16_dot_table_reads_the_vendor(monkeypatch):
    """Machine.bf16_dot_ratio per CPU (machine.bf16_dot_ratio): Intel's vdpbf16ps runs at half
    the f32 FMA's FLOPs, AMD's at twice; EQFUSE_BF16_DOT overrides; the planner's bf16 peak of
    the avx512_bf16 path is that ratio."""
    monkeypatch.delenv("EQFUSE_BF16_DOT", raising=False)
    info = "processor\t: 0\nvendor_id\t: {}\ncpu family\t: {}\n"
    assert machine.bf16_dot_ratio(info.format("GenuineIntel", 6)) == 0.5
    assert machine.bf16_dot_ratio(info.format("AuthenticAMD", 25)) == machine.bf16_dot_ratio("") == 2.0
    monkeypatch.setenv("EQFUSE_BF16_DOT", "2")
    assert machine.bf16_dot_ratio(info.format("GenuineIntel", 6)) == 2.0
    assert machine.bf16_peak_ratio(machine.MODELS["xeon-spr"], "avx512_bf16") == 0.5
    assert machine.bf16_peak_ratio(machine.MODELS["zen4"], "avx512_bf16") == 2.0


# convs on AMX tiles, their B packed from the image (plan_gemm.implicit_im2col), those the direct
# AMX conv leaves (conv_amx: too few channels to fill its K blocks, a dilation): rows that end
# inside a 16-lane group (OW 11), a stride-2 stem (the gather), a dilated window, two images
CONVS = """
graph convs(x1: f32[2, 5, 13, 11], w1: f32[33, 5, 3, 3], x2: f32[1, 3, 23, 23], w2: f32[16, 3, 5, 5],
            x3: f32[1, 4, 12, 12], w3: f32[20, 4, 3, 3]) {
    y1 = relu(conv2d(x1, w1, stride=1, padding=1))
    y2 = relu(conv2d(x2, w2, stride=2, padding=2))
    y3 = relu(conv2d(x3, w3, stride=1, padding=2, dilation=2))
    return y1, y2, y3
}
"""
CONV_SHAPES = {"x1": (2, 5, 13, 11), "w1": (33, 5, 3, 3), "x2": (1, 3, 23, 23), "w2": (16, 3, 5, 5),
               "x3": (1, 4, 12, 12), "w3": (20, 4, 3, 3)}
CONV_GEOMETRY = [("x1", "w1", 1, 1, 1), ("x2", "w2", 2, 2, 1), ("x3", "w3", 1, 2, 2)]  # (stride, padding, dilation)


def conv64(x, w, stride, padding, dilation):
    """conv2d in float64 (NCHW, OIHW)."""
    from numpy.lib.stride_tricks import sliding_window_view

    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    span = [dilation * (k - 1) + 1 for k in w.shape[2:]]
    win = sliding_window_view(xp, span, axis=(2, 3))[:, :, ::stride, ::stride, ::dilation, ::dilation]
    return np.einsum("nchwij,ocij->nohw", win, w)


def check_implicit_convs(emulate: bool, seed: int) -> None:
    """Every conv on AMX tiles with the implicit im2col, within the documented bound of float64:
    (2u + u^2 + 1.01 K eps) sum |x||w| (docs/precision.md; relu is 1-Lipschitz)."""
    from test_bf16_conv import U

    rng = np.random.default_rng(seed)
    a = {k: rng.standard_normal(s).astype(np.float32) for k, s in CONV_SHAPES.items()}
    with pytest.MonkeyPatch.context() as mp:
        if emulate:
            mp.setenv("EQFUSE_CFLAGS", "-DEQF_AMX_EMULATE")
        with machine.pinned(amx_model(), clamp=False):
            mod = eqfuse.compile(CONVS, precision="bf16")
            ys = mod(*a.values())
    plans = [p for p in mod.default.last.plans if p.kind == "conv2d"]
    assert len(plans) == 3 and all(p.precision_path == "amx_bf16" and p.detail.implicit for p in plans)
    assert all("implicit im2col" in p.uops[0].what for p in plans)
    for y, (x, w, s, p, d) in zip(ys, CONV_GEOMETRY):
        K = np.prod(a[w].shape[1:])
        ref = np.maximum(conv64(a[x], a[w], s, p, d), 0)
        bound = (2 * U + U * U + 1.01 * K * EPS) * conv64(np.abs(a[x]), np.abs(a[w]), s, p, d)
        assert y.shape == ref.shape and np.all(np.abs(y - ref) <= bound), (x, float(np.max(np.abs(y - ref) - bound)))


def test_a_conv_on_amx_reads_its_tiles_from_the_input_where_the_shapes_suit_them():
    """On a machine with AMX, a bf16 conv whose copy channels fill K blocks of 32 well enough
    (conv_amx.MAX_K_PAD; less padding at a stride) is the direct conv on tiles (conv_amx), whatever
    its map (a 2 x 2 one too, whose f32 direct conv was slower), the kernel's columns folded into
    the channels where a kernel row fits a block; a conv of 3 channels and a 3x3 window (9 of 32)
    is the GEMM packing from the image, or, with fewer output pixels than channels, the f32 direct
    conv (conv.plan_conv_direct)."""
    src = ("graph g(x: f32[1, 16, 12, 12], w: f32[32, 16, 3, 3], y: f32[2, 64, 2, 2], v: f32[64, 64, 3, 3],\n"
           "        a: f32[1, 3, 12, 12], b: f32[32, 3, 3, 3], c: f32[1, 3, 4, 4], d: f32[64, 3, 3, 3],\n"
           "        e: f32[1, 16, 12, 12], f: f32[32, 16, 1, 1], g: f32[1, 8, 12, 12], h: f32[32, 8, 3, 3]) {\n"
           "    return conv2d(x, w, padding=1), conv2d(y, v, padding=1), conv2d(a, b, padding=1), conv2d(c, d, padding=1),\n"
           "           conv2d(e, f, stride=2), conv2d(g, h, stride=2, padding=1)\n}")
    with machine.pinned(machine.MODELS["xeon-spr"], clamp=False):
        _, _, plans = lower(load(src)[0], {}, precision="bf16")
    convs = [p for p in plans if p.kind == "conv2d"]
    assert [(type(p.detail).__name__, p.precision_path) for p in convs] == [
        ("ConvAmxDetail", "amx_bf16"), ("ConvAmxDetail", "amx_bf16"), ("GemmDetail", "amx_bf16"),
        ("ConvDirectDetail", "f32"), ("GemmDetail", "amx_bf16"),  # (a 1x1 of 16 channels at stride 2: 16 of 32)
        ("ConvAmxDetail", "amx_bf16")]
    assert convs[3].precision_note == SLOW_DOT_F32
    c16, amx, folded = convs[0].detail, convs[1].detail, convs[5].detail
    assert (c16.fold, c16.kc, c16.kcp, c16.taps, c16.flat) == (False, 16, 32, 9, (14, 14))
    assert (amx.fold, amx.waste, amx.flat, amx.kcp, amx.taps) == (False, 4.0, (4, 4), 64, 9)
    # (folded: its tiles' rows overlapping in a copy of the image, each output row in whole tiles of 16)
    assert (folded.fold, folded.overlap, folded.kc, folded.kcp, folded.taps, folded.phases, folded.flat) == \
        (True, True, 24, 32, 3, (1, 1), (6, 16))


@pytest.mark.heavy  # (the emulated tiles' time)
def test_emulated_amx_convs_pack_their_panels_from_the_image():
    check_implicit_convs(emulate=True, seed=3)


@pytest.mark.skipif(not host_has_amx(), reason="this CPU has no AMX-BF16 (amx_bf16/amx_tile not in /proc/cpuinfo)")
def test_amx_convs_on_the_hardware_pack_their_panels_from_the_image():
    check_implicit_convs(emulate=False, seed=4)


# A row epilogue on the AMX path: the macro kernel runs its B micro-panels outside its row tiles
# (gemm.c, JR_OUTER), so the layernorm of a block's rows runs once all of them are done. 70 rows
# (three row tiles, the last partial), bound weights (prefetched a panel ahead), K in two slices
# (plan_gemm.AMX_WHOLE_M: an A block of all 96 rows at the depth of all of K would pass a quarter of
# the model's 256 KiB L2), the row epilogue after the last. The same GEMM
# without the row epilogue, then the layernorm as its own f32 row kernel, reads the same products
# (same plan, same K slices): the two results agree to f32 rounding of the layernorm alone.
ROW_GRAPH = """
graph r(x: f32[70, 400], w: f32[400, 96], b: f32[96], g: f32[96], be: f32[96]) {
    fused = kernel { layernorm(x @ w + b, g, be) }
    y = kernel { x @ w + b }
    apart = kernel { layernorm(y, g, be) }
    return fused, apart
}
"""


def check_row_epilogue(emulate: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x, w, b, g, be = (rng.standard_normal(s).astype(np.float32) for s in ((70, 400), (400, 96), (96,), (96,), (96,)))
    with pytest.MonkeyPatch.context() as mp:
        if emulate:
            mp.setenv("EQFUSE_CFLAGS", "-DEQF_AMX_EMULATE")
        with machine.pinned(amx_model(), clamp=not emulate):
            mod = eqfuse.compile(ROW_GRAPH, fuse="manual", params={"w": w, "g": g, "be": be}, precision="bf16")
            fused, apart = mod(x, b)
    kinds = {p.name: (p.kind, p.precision_path) for p in mod.default.last.plans}
    assert ("contraction_row", "amx_bf16") in kinds.values(), kinds
    assert all(p.tiles["kc"] == 224 and p.tiles["mc"] == 96 for p in mod.default.last.plans if p.kind.startswith("contraction"))
    # (layernorm's f32 evaluation: a few roundings of each output, relative to |g normalized| + |be|)
    scale = np.abs(apart - be) + np.abs(be)
    assert np.all(np.abs(fused - apart) <= 16 * np.finfo(np.float32).eps * scale)


@pytest.mark.heavy  # (a gcc run)
def test_emulated_amx_row_epilogues_run_on_whole_rows():
    check_row_epilogue(emulate=True, seed=5)


@pytest.mark.skipif(not host_has_amx(), reason="this CPU has no AMX-BF16 (amx_bf16/amx_tile not in /proc/cpuinfo)")
def test_amx_row_epilogues_on_the_hardware_run_on_whole_rows():
    check_row_epilogue(emulate=False, seed=6)


# The direct conv on AMX tiles (conv_amx.c): B tiles loaded from a copy of the input in K-pairs,
# each stride phase's pixels flat over a padded width. Two images with a bias and a residual in
# the epilogue and 48 output channels (a channel block half empty); 40 channels (padded to a K
# block of 64) at stride 2 (four phase planes); a 1x1 conv at stride 2 (one phase); 2 x 2 maps of
# 64 channels (the flat pixels 4 times the output's); with the kernel's columns folded into the
# copy's channels (conv_amx.folds), a 7x7 stem of 3 channels at stride 2 and an 8-channel 3x3 conv
# of two images at stride 2 (24 copy channels of a K block of 32), and a 5x5 conv of 4 channels
# (20 copy channels: the copy's pixel-by-pixel path for a stem's few channels, all four of its
# lanes' blocks). The emulated
# run pins an L1 of 16 KiB: K in slices of 4 blocks, the C tiles kept between them (conv_amx.k_slice).
AMX_CONVS = """
graph convs(x1: f32[2, 64, 13, 11], w1: f32[48, 64, 3, 3], b1: f32[48], r1: f32[2, 48, 13, 11],
            x2: f32[1, 40, 23, 23], w2: f32[32, 40, 3, 3], x3: f32[1, 32, 12, 12], w3: f32[64, 32, 1, 1],
            x4: f32[2, 64, 2, 2], w4: f32[64, 64, 3, 3], x5: f32[1, 3, 29, 29], w5: f32[16, 3, 7, 7],
            x6: f32[2, 8, 9, 10], w6: f32[24, 8, 3, 3], x7: f32[1, 4, 17, 19], w7: f32[24, 4, 5, 5]) {
    y1 = relu(conv2d(x1, w1, b1, stride=1, padding=1) + r1)
    y2 = relu(conv2d(x2, w2, stride=2, padding=1))
    y3 = conv2d(x3, w3, stride=2, padding=0)
    y4 = conv2d(x4, w4, stride=1, padding=1)
    y5 = relu(conv2d(x5, w5, stride=2, padding=3))
    y6 = conv2d(x6, w6, stride=2, padding=1)
    y7 = conv2d(x7, w7, stride=1, padding=2)
    return y1, y2, y3, y4, y5, y6, y7
}
"""
AMX_CONV_SHAPES = {"x1": (2, 64, 13, 11), "w1": (48, 64, 3, 3), "b1": (48,), "r1": (2, 48, 13, 11),
                   "x2": (1, 40, 23, 23), "w2": (32, 40, 3, 3), "x3": (1, 32, 12, 12), "w3": (64, 32, 1, 1),
                   "x4": (2, 64, 2, 2), "w4": (64, 64, 3, 3), "x5": (1, 3, 29, 29), "w5": (16, 3, 7, 7),
                   "x6": (2, 8, 9, 10), "w6": (24, 8, 3, 3), "x7": (1, 4, 17, 19), "w7": (24, 4, 5, 5)}


def check_amx_direct_convs(emulate: bool, seed: int, overlap: bool = True) -> None:
    """Every conv on the direct AMX kernel (w1 bound by params=: its B tiles made once), within the
    documented bound of float64: (2u + u^2 + 1.01 K eps) sum |x||w| plus the f32 epilogue's
    roundings of the bias and residual (relu is 1-Lipschitz). The folded convs read their A tiles'
    overlapping rows from a copy of the image (`overlap`) or from the folded copy."""
    from test_bf16_conv import U

    rng = np.random.default_rng(seed)
    a = {k: rng.standard_normal(s).astype(np.float32) for k, s in AMX_CONV_SHAPES.items()}
    model = dataclasses.replace(amx_model(), l1=16 << 10) if emulate else amx_model()
    with pytest.MonkeyPatch.context() as mp:
        if emulate:
            mp.setenv("EQFUSE_CFLAGS", "-DEQF_AMX_EMULATE")
        mp.setenv("EQFUSE_CONV_AMX_OVERLAP", "1" if overlap else "0")
        with machine.pinned(model, clamp=not emulate):
            mod = eqfuse.compile(AMX_CONVS, precision="bf16", params={"w1": a["w1"]})
            ys = mod(*[a[k] for k in AMX_CONV_SHAPES if k != "w1"])
    plans = [p for p in mod.default.last.plans if p.kind == "conv2d"]
    assert [(type(p.detail).__name__, p.precision_path) for p in plans] == [("ConvAmxDetail", "amx_bf16")] * 7
    assert [p.detail.fold for p in plans] == [False] * 4 + [True] * 3
    assert [p.detail.overlap for p in plans] == [False] * 4 + [overlap] * 3
    assert plans[0].detail.prepack is not None and mod.report["precision"][plans[0].name]["path"] == "amx_bf16"
    if emulate:
        assert plans[0].detail.kcb == 6 < plans[0].detail.KH * plans[0].detail.KW * 2  # (K in slices: 3/4 of a 16 KiB L1)
    for i, (y, (x, w, s, p)) in enumerate(zip(ys, [("x1", "w1", 1, 1), ("x2", "w2", 2, 1), ("x3", "w3", 2, 0),
                                                  ("x4", "w4", 1, 1), ("x5", "w5", 2, 3), ("x6", "w6", 2, 1),
                                                  ("x7", "w7", 1, 2)])):
        ref, mag = conv64(a[x], a[w], s, p, 1), conv64(np.abs(a[x]), np.abs(a[w]), s, p, 1)
        K = np.prod(a[w].shape[1:])
        bound = (2 * U + U * U + 1.01 * K * EPS) * mag
        if i == 0:
            extra = a["b1"][None, :, None, None] + a["r1"]
            ref, bound = ref + extra, bound + 2 * EPS * (np.abs(ref) + np.abs(extra))
        if i in (0, 1, 4):
            ref = np.maximum(ref, 0)
        assert y.shape == ref.shape and np.all(np.abs(y - ref) <= bound), (i, float(np.max(np.abs(y - ref) - bound)))


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "folded-copy"])
@pytest.mark.parametrize("emulate", [
    pytest.param(True, id="emulated", marks=pytest.mark.heavy),  # (the emulated tiles' time)
    pytest.param(False, id="hardware", marks=pytest.mark.skipif(
        not host_has_amx(), reason="this CPU has no AMX-BF16 (amx_bf16/amx_tile not in /proc/cpuinfo)"))])
def test_amx_direct_convs_are_within_the_bf16_bound(emulate, overlap):
    check_amx_direct_convs(emulate=emulate, seed=7 if emulate else 8, overlap=overlap)


@contextlib.contextmanager
def amx_compiled(src: str, emulate: bool, env: dict[str, str], model: machine.Machine, **kw):
    """src compiled in bf16 with `env` set, for `model` (pinned while the block runs its calls),
    on the emulated tiles (EQF_AMX_EMULATE) or the host's own."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        if emulate:  # (env's EQFUSE_CFLAGS kept beside it)
            mp.setenv("EQFUSE_CFLAGS", ("-DEQF_AMX_EMULATE " + env.get("EQFUSE_CFLAGS", "")).strip())
        with machine.pinned(model, clamp=not emulate):
            yield eqfuse.compile(src, precision="bf16", **kw)


# Convs on AMX tiles one after the other (conv_amx.copy_between_amx_convs): each writes the next one's
# copy, bf16 and pixel-major, into its output's buffer, the next reads it there. 48 outputs (the
# copy's channels 48-63 zero), a stride-2 consumer (four phase planes) beside a stride-2 1x1 conv
# that reads its copy's plane (1, 1) (a ResNet's downsample: `sibling`), a producer with a residual
# in its epilogue, a 1x1 consumer at stride 2 (one phase plane: rows it never reads not written).
AMX_CHAIN = """
graph chain(x: f32[2, 40, 20, 19], w1: f32[48, 40, 3, 3], b1: f32[48], w2: f32[64, 48, 3, 3],
            w3: f32[32, 64, 3, 3], wd: f32[32, 48, 1, 1], w4: f32[24, 32, 1, 1]) {
    y1 = relu(conv2d(x, w1, b1, stride=1, padding=1))
    y2 = conv2d(y1, w2, stride=2, padding=1)
    y3 = relu(conv2d(y2, w3, stride=1, padding=1) + conv2d(y1, wd, stride=2, padding=0))
    return conv2d(y3, w4, stride=2, padding=0)
}
"""
AMX_CHAIN_SHAPES = {"x": (2, 40, 20, 19), "w1": (48, 40, 3, 3), "b1": (48,), "w2": (64, 48, 3, 3),
                    "w3": (32, 64, 3, 3), "wd": (32, 48, 1, 1), "w4": (24, 32, 1, 1)}


@pytest.mark.parametrize("emulate", [
    pytest.param(True, id="emulated", marks=pytest.mark.heavy),
    pytest.param(False, id="hardware", marks=pytest.mark.skipif(
        not host_has_amx(), reason="this CPU has no AMX-BF16 (amx_bf16/amx_tile not in /proc/cpuinfo)"))])
def test_amx_convs_in_a_chain_write_the_next_ones_copy_and_give_the_same_bits(emulate):
    """The chained convs' output is bit for bit the unchained one's (EQFUSE_CONV_AMX_CHAIN=0, each
    conv its own copy: within the bf16 bound, test_amx_direct_convs_are_within_the_bf16_bound):
    the producer rounds to bf16 what the consumer's copy would have. Two calls: the second reads a
    buffer the first left dirty (the copy's zero padding written every call)."""
    rng = np.random.default_rng(11)
    a = {k: rng.standard_normal(s).astype(np.float32) * (0.3 if k[0] == "w" else 1.0) for k, s in AMX_CHAIN_SHAPES.items()}
    ys, plans = {}, {}
    free = {k: v for k, v in a.items() if k != "w2"}
    for chain in ("0", "1"):
        with amx_compiled(AMX_CHAIN, emulate, {"EQFUSE_CONV_AMX_CHAIN": chain}, amx_model(), params={"w2": a["w2"]}) as mod:
            ys[chain] = [mod(**free) for _ in range(2)]
            ys[chain].append(mod(**dict(free, x=-free["x"])))
        plans[chain] = [p for p in mod.default.last.plans if p.kind == "conv2d"]
    assert [type(p.detail).__name__ for p in plans["1"]] == ["ConvAmxDetail"] * 5
    # (y1 writes y2's copy, the 1x1 downsample reads its plane (1, 1); the add is in the downsample's
    # epilogue, y3's conv its operand, in blocks)
    assert [(p.detail.in_copy, bool(p.detail.out_copy), p.detail.sibling[:1]) for p in plans["1"]] == \
        [(False, True, ()), (True, True, ()), (True, False, ()), (True, True, (3,)), (True, False, ())]
    assert "phase plane (1, 1)" in plans["1"][3].uops[1].what
    assert not any(p.detail.in_copy or p.detail.out_copy or p.detail.sibling for p in plans["0"])
    assert "into the next conv's copy" in plans["1"][0].uops[-1].what
    for y0, y1 in zip(ys["0"], ys["1"]):
        assert y0.shape == (2, 24, 5, 5) and np.array_equal(y0, y1)
    assert not np.array_equal(ys["1"][0], ys["1"][2])


# A conv on AMX tiles whose output only a max pool reads (conv_amx.pool_into_amx_conv): the conv
# computes the pool, where its output is larger than L2 (pinned to 32 KiB here) and has two
# channel blocks or more. A folded stem of 40 outputs (a partial channel block) and its 3x3/2
# pool padded by 1, over two images; a 3x3 conv and a 2x2/2 pool of 64 channels, a NaN in the
# input.
AMX_POOL = """
graph pools(x: f32[2, 3, 45, 42], w: f32[40, 3, 7, 7], b: f32[40], x2: f32[1, 32, 15, 17], w2: f32[64, 32, 3, 3]) {
    y = max_pool2d(relu(conv2d(x, w, b, stride=2, padding=3)), kernel_size=3, stride=2, padding=1)
    y2 = max_pool2d(conv2d(x2, w2, stride=1, padding=1), kernel_size=2, stride=2)
    return y, y2
}
"""
AMX_POOL_SHAPES = {"x": (2, 3, 45, 42), "w": (40, 3, 7, 7), "b": (40,), "x2": (1, 32, 15, 17), "w2": (64, 32, 3, 3)}


@pytest.mark.parametrize("emulate", [
    pytest.param(True, id="emulated", marks=pytest.mark.heavy),
    pytest.param(False, id="hardware", marks=pytest.mark.skipif(
        not host_has_amx(), reason="this CPU has no AMX-BF16 (amx_bf16/amx_tile not in /proc/cpuinfo)"))])
def test_an_amx_conv_computes_the_max_pool_after_it_and_gives_the_same_bits(emulate, monkeypatch):
    """The conv with the pool in it gives bit for bit the conv and the pool apart
    (EQFUSE_CONV_AMX_POOL=0: the conv within the bf16 bound, the pool exact), NaN where a NaN
    input reaches a window; the pool's kernel is gone from the plans. On two threads, each a
    range of pool rows (y2's one image split between them, its edge rows computed by both)."""
    import eqfuse.runtime.program as program

    monkeypatch.setattr(program, "call_threads", lambda t, *own: (t, t))  # (two threads however loaded)
    rng = np.random.default_rng(12)
    a = {k: rng.standard_normal(s).astype(np.float32) * (0.3 if k[0] == "w" else 1.0) for k, s in AMX_POOL_SHAPES.items()}
    a["x2"][0, 5, 7, 9] = np.nan
    ys, plans = {}, {}
    for pool in ("0", "1"):
        with amx_compiled(AMX_POOL, emulate, {"EQFUSE_CONV_AMX_POOL": pool}, dataclasses.replace(amx_model(), l2=32 << 10)) as mod:
            mod.default.threads = 2
            ys[pool] = mod(**a)
            ys[pool] += mod(**dict(a, x=-a["x"]))  # (a second call: the maxima start again from -inf)
        plans[pool] = mod.default.last.plans
    assert [p.kind for p in plans["0"]].count("index") == 2 and [p.kind for p in plans["1"]] == ["conv2d"] * 2
    assert [p.detail.pool for p in plans["1"]] == [(3, 3, 2, 2, 1, 1, 12, 11), (2, 2, 2, 2, 0, 0, 7, 8)]
    assert "max pool" in plans["1"][0].uops[-1].what
    for y0, y1 in zip(ys["0"], ys["1"]):
        np.testing.assert_array_equal(y1, y0)
    assert np.isnan(ys["1"][1]).sum() == np.isnan(ys["0"][1]).sum() > 0
    with machine.pinned(amx_model(), clamp=False):  # (2 MiB of L2: both outputs fit, the pools stay apart)
        kept = lower(load(AMX_POOL)[0], {}, precision="bf16")[2]
    assert [p.kind for p in kept].count("index") == 2


# Convs on AMX tiles in the blocked channel layout (contraction/blocked.py): a ResNet's stages in
# small. A folded stem with its max pool (three channel blocks of 32, the last one partial: 80
# outputs) whose output two convs read, as input and as residual; a conv pair chained through its
# copy, the second adding that residual; its output read by a stride-2 3x3 conv (four phase
# planes) and a stride-2 1x1 conv; the 3x3 one's output read by a last 3x3 conv (in blocks: its
# copy would not fit the small map's buffer), whose output the 1x1 conv adds in its epilogue
# (fused there) to write the graph's output, NCHW, that residual read in blocks. Two images.
AMX_BLOCKED = """
graph stages(x: f32[2, 3, 40, 38], w0: f32[80, 3, 7, 7], b0: f32[80], w1: f32[80, 80, 3, 3], w2: f32[80, 80, 3, 3],
             w3: f32[48, 80, 3, 3], w4: f32[48, 80, 1, 1], w5: f32[48, 48, 3, 3], b5: f32[48]) {
    p = max_pool2d(relu(conv2d(x, w0, b0, stride=2, padding=3)), kernel_size=3, stride=2, padding=1)
    y1 = relu(conv2d(p, w1, stride=1, padding=1))
    y2 = relu(conv2d(y1, w2, stride=1, padding=1) + p)
    y3 = relu(conv2d(y2, w3, stride=2, padding=1))
    y4 = conv2d(y2, w4, stride=2, padding=0)
    return relu(conv2d(y3, w5, b5, stride=1, padding=1) + y4)
}
"""
AMX_BLOCKED_SHAPES = {"x": (2, 3, 40, 38), "w0": (80, 3, 7, 7), "b0": (80,), "w1": (80, 80, 3, 3), "w2": (80, 80, 3, 3),
                      "w3": (48, 80, 3, 3), "w4": (48, 80, 1, 1), "w5": (48, 48, 3, 3), "b5": (48,)}


@pytest.mark.parametrize("emulate", [
    pytest.param(True, id="emulated", marks=pytest.mark.heavy),
    pytest.param(False, id="hardware", marks=pytest.mark.skipif(
        not host_has_amx(), reason="this CPU has no AMX-BF16 (amx_bf16/amx_tile not in /proc/cpuinfo)"))])
def test_amx_convs_in_the_blocked_layout_give_the_same_bits(emulate):
    """Every tensor between the convs in blocks of 16 channels (the stem's pool written so, the
    copies converted from blocks, the residuals read at blk, the output NCHW), bit for bit what
    the convs give with their tensors NCHW (EQFUSE_CONV_AMX_BLOCKED=0): the layout moves values,
    it changes none. (The blocks' portable loops: the portable test below.) Two calls."""
    rng = np.random.default_rng(14)
    a = {k: rng.standard_normal(s).astype(np.float32) * (0.2 if k[0] == "w" else 1.0) for k, s in AMX_BLOCKED_SHAPES.items()}
    model = dataclasses.replace(amx_model(), l2=32 << 10)  # (the stem's output past L2: its pool in it)
    ys, plans = {}, {}
    for blocked in ("0", "1"):
        with amx_compiled(AMX_BLOCKED, emulate, {"EQFUSE_CONV_AMX_BLOCKED": blocked}, model, params={"w1": a["w1"]}) as mod:
            ys[blocked] = [mod(**{k: v for k, v in a.items() if k != "w1"}) for _ in range(2)]
        plans[blocked] = mod.default.last.plans
    d = [p.detail for p in plans["1"]]
    assert [type(e).__name__ for e in d] == ["ConvAmxDetail"] * 6 and d[0].pool
    assert [(e.in_blocked, e.out_blocked, e.blocked_args != (), e.in_copy, e.out_copy) for e in d] == [
        (False, True, False, False, False),  # the stem and its pool: written in blocks
        (True, False, False, False, True),  # y1: read from blocks, writes y2's copy
        (False, True, True, True, False),  # y2: its residual p in blocks, written in blocks
        (True, True, False, False, False),  # y3: stride 2 from blocks into blocks
        (True, True, False, False, False),  # conv(y3, w5, b5): from blocks into blocks
        (True, False, True, False, False)]  # y4 + that: 1x1 stride 2 from blocks, its residual in blocks, NCHW out
    assert all(e.vl == 16 for e in d if e.in_blocked or e.out_blocked or e.blocked_args)
    assert [e.staged for e in d] == [False] * 5 + [True]  # (NCHW out, its residual in blocks: staged)
    assert not any(e.in_blocked or e.out_blocked or e.blocked_args for e in (p.detail for p in plans["0"]))
    assert "in blocks already" in plans["1"][1].uops[1].what
    for y0, y1 in zip(ys["0"], ys["1"]):
        assert y0.shape == (2, 48, 5, 5) and np.array_equal(y0, y1)


@pytest.mark.heavy  # (three models' emulated tiles, twice)
# (without AVX-512 both builds would be the portable one: the emulated tests above already run
# those loops on such a host, so there is nothing to compare)
@pytest.mark.skipif("avx512f" not in machine.cpu_flags(),
                    reason="this CPU has no AVX-512: its builds take the portable paths already (the tests above)")
def test_the_amx_convs_portable_paths_give_the_same_bits_as_their_avx512_ones():
    """conv_amx.c's loops without AVX-512 (the copies, the transposes, the chained rows' rounding,
    the pool's maxima: what an AVX2 host's emulated run takes) against its AVX-512 ones, all
    emulated tiles: bit for bit, over the direct convs (the folded ones' copy of the image and
    their folded copy), the chain, the pools and the blocked layout above."""
    rng = np.random.default_rng(13)
    model = dataclasses.replace(amx_model(), l1=16 << 10, l2=32 << 10)
    for src, shapes, overlap in ((AMX_CONVS, AMX_CONV_SHAPES, "1"), (AMX_CONVS, AMX_CONV_SHAPES, "0"),
                                 (AMX_CHAIN, AMX_CHAIN_SHAPES, "1"), (AMX_POOL, AMX_POOL_SHAPES, "1"),
                                 (AMX_BLOCKED, AMX_BLOCKED_SHAPES, "1")):
        a = {k: rng.standard_normal(s).astype(np.float32) * (0.3 if k[0] == "w" else 1.0) for k, s in shapes.items()}
        ys = []
        for flags in ("-DEQF_AMX_EMULATE", "-DEQF_AMX_EMULATE -mno-avx512f"):
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("EQFUSE_CFLAGS", flags)
                mp.setenv("EQFUSE_CONV_AMX_OVERLAP", overlap)  # (the folded convs' copy of the image, or their folded copy)
                with machine.pinned(model, clamp=False):
                    y = eqfuse.compile(src, precision="bf16")(**a)
            ys.append(y if isinstance(y, tuple) else (y,))
        for y0, y1 in zip(*ys):
            np.testing.assert_array_equal(y1, y0)


# A few rows over bound weights on AMX tiles (plan_gemm.amx_few_rows): from 8 rows the blocked AMX
# GEMM with its B panels prepacked, the column panels ranges of the claim-based pool (gemm.c's
# POOL); fewer rows keep the few-rows kernel. 400 columns: 13 panels, the last one partial.
FEW_GRAPH = "graph f(x: f32[{m}, 520], w: f32[520, 400], b: f32[400]) {{\n  return kernel {{ relu(x @ w + b) }}\n}}"


def test_few_rows_on_amx_take_the_tiles_from_eight_rows():
    with machine.pinned(machine.MODELS["xeon-spr"], clamp=False):
        plans = {m: [p for p in lower(load(FEW_GRAPH.format(m=m))[0], {}, params={"w", "b"}, precision="bf16")[2]
                     if p.kind == "contraction"][0] for m in (4, 8, 32, 64)}
    assert plans[4].detail.path == "skinny" and plans[4].precision_path != "amx_bf16"
    for m in (8, 32):
        assert (plans[m].precision_path, plans[m].detail.path, plans[m].detail.pool) == ("amx_bf16", "blocked", True)
        assert plans[m].detail.prepack is not None and "claim-based pool" in plans[m].threads
    # (past AMX_POOL_MAX_M rows: the blocked GEMM's own parallel region)
    assert (plans[64].precision_path, plans[64].detail.path, plans[64].detail.pool) == ("amx_bf16", "blocked", False)


@pytest.mark.parametrize("emulate", [
    pytest.param(True, id="emulated", marks=pytest.mark.heavy),  # (the emulated tiles' time)
    pytest.param(False, id="hardware", marks=pytest.mark.skipif(
        not host_has_amx(), reason="this CPU has no AMX-BF16 (amx_bf16/amx_tile not in /proc/cpuinfo)"))])
def test_few_rows_on_amx_tiles_are_within_the_bf16_bound(emulate, monkeypatch):
    import eqfuse.runtime.program as program

    # two threads however loaded, the loops on the pool: the panels in several ranges
    monkeypatch.setattr(program, "call_threads", lambda t, *own: (t, t))
    rng = np.random.default_rng(9)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((8, 520), (520, 400), (400,)))
    with pytest.MonkeyPatch.context() as mp:
        if emulate:
            mp.setenv("EQFUSE_CFLAGS", "-DEQF_AMX_EMULATE")
        with machine.pinned(amx_model(), clamp=not emulate):
            mod = eqfuse.compile(FEW_GRAPH.format(m=8), fuse="manual", params={"w": w, "b": b}, precision="bf16")
            mod.default.threads = 2
            y = mod(x)
    (p,) = [p for p in mod.default.last.plans if p.kind == "contraction"]
    assert (p.precision_path, p.detail.pool) == ("amx_bf16", True)
    check_gemm(y, x, w, epilogue=lambda z: np.maximum(z, 0), bias=b)


# The attention on AMX tiles (csrc_templates/attention.c, BF16 3): (Sq, Sk, D, Dv, mask) a partial
# query block (40 queries: a block of 32, then 8 in one 16-row tile) and a partial last key tile
# (101 keys); a mask (the score pass), 16-query blocks, a v of a pair of column tiles and a single
# one (48); a head of 80 padded with zeros to whole K blocks of 32, a v of one column tile
AMX_ATTENTION = [(40, 101, 64, 64, False), (12, 130, 32, 48, True), (36, 70, 80, 16, True)]


@pytest.mark.parametrize("emulate,flags", [
    pytest.param(True, "", id="emulated", marks=pytest.mark.heavy),  # (the emulated tiles' time)
    # (what an AVX2 host's emulated run builds: the portable softmax, the operands rounded one by one)
    pytest.param(True, "-mno-avx512f", id="portable", marks=pytest.mark.heavy),
    pytest.param(False, "", id="hardware", marks=pytest.mark.skipif(
        not host_has_amx(), reason="this CPU has no AMX-BF16 (amx_bf16/amx_tile not in /proc/cpuinfo)"))])
def test_amx_attention_is_within_the_bf16_bound(emulate, flags):
    """Both products on tiles, the softmax between them in f32: within the documented bound of
    bf16 attention (tests/test_bf16.py's attention_bound), and past what f32 arithmetic alone may add."""
    rng = np.random.default_rng(11 if emulate else 12)
    for Sq, Sk, D, Dv, mask in AMX_ATTENTION:
        q, k = (rng.standard_normal((2, S, D)).astype(np.float32) for S in (Sq, Sk))
        v = rng.standard_normal((2, Sk, Dv)).astype(np.float32)
        mk = np.triu(np.full((Sq, Sk), -1e4, np.float32), 1 + Sk - Sq) if mask else None
        scale = 1 / np.sqrt(D)
        env = {"EQFUSE_CFLAGS": flags} if flags else {}
        with amx_compiled(attention_graph(Sq, Sk, D, Dv, scale, mask), emulate, env, amx_model()) as mod:
            y = mod(q, k, v, *([mk] if mask else [])).astype(np.float64)
        (p,) = [p for p in mod.default.last.plans if p.kind == "attention"]
        assert (p.precision, p.precision_path, p.detail.score_ops) == ("bf16", "amx_bf16", mask)
        assert mod.report["precision"][p.name]["path"] == "amx_bf16"
        ref, bound = attention_bound(q, k, v, scale, mk, p.tiles["bk"])
        err = np.abs(y - ref)
        assert np.all(err <= bound), (Sq, Sk, D, Dv, float(np.max(err / bound)))
        _, f32_part = attention_bound(q, k, v, scale, mk, p.tiles["bk"], u=0.0)
        assert np.any(err > f32_part)
