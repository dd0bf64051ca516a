"""The AMX-INT8 path of the integer GEMM (kinds.contraction.qgemm.int8_path "amx_int8";
csrc_templates/gemm_u8s8.c PATH 5): tdpbusd on 2 x 2 C tiles of 16 x 16 int32, A through the
kernel's A buffer as u8 bytes, the panels' K padded to whole tiles of 16 K-groups.

Its sums are exact, so every check is equality: against numpy's int64 products, and a quantized
BERT against the same model on the vpdpbusd path (itself checked against onnxruntime node by node
in tests/test_quantized.py). Each runs twice where it can:
- emulated: the kernel's own C built with -DEQF_AMX_EMULATE (csrc_templates/common_amx.h's C for
  the tile instructions, after the operation sections of Intel's SDM), planned for a machine model
  with AMX-INT8 pinned without clamping it to the host: on every CPU;
- on the hardware, where /proc/cpuinfo has amx_int8 and amx_tile (skipped with the reason elsewhere).
The hypothesis tests of tests/test_int8_random.py run the path too (tests/test_quantized.py's
int8_path fixture), and the plan's test checks which GEMMs take it and that `eqfuse lower` says so.
"""

import dataclasses

import numpy as np
import pytest
from helpers import assembly_for

import eqfuse
from eqfuse import machine
from eqfuse.backend.emit import emit_graph
from eqfuse.backend.kinds.contraction import qgemm
from eqfuse.cli.main import main
from eqfuse.frontend.load import load
from eqfuse.pipeline import lower


def host_has_amx_int8() -> bool:
    flags = machine.cpu_flags()
    return "amx_int8" in flags and "amx_tile" in flags


def amx_model() -> machine.Machine:
    """This host's model with AMX-INT8 (and AVX512_VNNI, which every CPU with AMX-INT8 has)."""
    return dataclasses.replace(machine.machine(), simd_floats=16, avx512_vnni=True, amx_int8=True)


@pytest.fixture(params=["emulated", pytest.param("hardware", marks=pytest.mark.skipif(
    not host_has_amx_int8(), reason="this CPU has no AMX-INT8 (amx_int8/amx_tile not in /proc/cpuinfo)"))])
def amx(request, monkeypatch):
    """Plans for a machine with AMX-INT8: its tiles emulated in C, or the CPU's own. The tests'
    GEMMs are small (odd shapes, fast to emulate): AMX_INT8_MIN_MACS, a policy, is pinned to 0 so
    that they take the tiles; AMX_INT8_MIN_ROWS stays."""
    monkeypatch.setattr(qgemm, "AMX_INT8_MIN_MACS", 0)
    emulated = request.param == "emulated"
    if emulated:
        monkeypatch.setenv("EQFUSE_CFLAGS", "-DEQF_AMX_EMULATE")
    with machine.pinned(amx_model(), clamp=not emulated):
        yield request.param


# Odd shapes (no size a multiple of 16 or 32 but one), each a GEMM of its own kernel:
# - p: s8 A x u8 B, B per call and its zero points per column, 70 rows (two tiles and a part);
# - q: B bound (packed once), K = 2203 in several K blocks (int8_kc), 33 rows;
# - r: a batch of two s8 A over one s8 B, folded into 2 x 19 = 38 rows, K = 64 (one tile deep);
# - s: A quantized from f32 in the kernel (quantize_linear), dequantized, bias and relu in the
#   epilogue; t: an s8 A quantized so (its bytes xor 0x80 into the buffer);
# - few: 15 rows, fewer than AMX_INT8_MIN_ROWS: the vpdpbusd path.
GRAPH = """
graph g(a: i8[70, 301], b: u8[301, 200], az: i8, bz: u8[200],
        c: u8[33, 2203], d: i8[2203, 70], cz: u8, dz: i8,
        e: i8[2, 19, 64], f: i8[64, 33], ez: i8, fz: i8,
        x: f32[40, 37], qs: f32, xz: u8, w: i8[37, 53], wz: i8, sc: f32[53], bias: f32[53],
        xs: f32[45, 37], sz: i8, few: u8[15, 100], fw: i8[100, 17]) {
    p = kernel { matmul_integer(a, b, az, bz) }
    q = kernel { matmul_integer(c, d, cz, dz) }
    r = kernel { matmul_integer(e, f, ez, fz) }
    s = kernel { relu(cast(matmul_integer(quantize_linear(x, qs, xz), w, xz, wz), to="f32") * sc + bias) }
    t = kernel { matmul_integer(quantize_linear(xs, qs, sz), w, sz, wz) }
    u = kernel { matmul_integer(few, fw, cz, dz) }
    return p, q, r, s, t, u
}
"""


def _arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    u8 = lambda *s: rng.integers(0, 256, s).astype(np.uint8)  # noqa: E731
    i8 = lambda *s: rng.integers(-128, 128, s).astype(np.int8)  # noqa: E731
    return {"a": i8(70, 301), "b": u8(301, 200), "az": i8(), "bz": u8(200),
            "c": u8(33, 2203), "d": i8(2203, 70), "cz": u8(), "dz": i8(),
            "e": i8(2, 19, 64), "f": i8(64, 33), "ez": i8(), "fz": i8(),
            "x": rng.uniform(-40, 40, (40, 37)).astype(np.float32), "qs": np.asarray(0.25, np.float32), "xz": np.asarray(131, np.uint8),
            "w": i8(37, 53), "wz": i8(), "sc": rng.uniform(1e-4, 1e-3, 53).astype(np.float32),
            "bias": rng.standard_normal(53).astype(np.float32),
            "xs": rng.uniform(-40, 40, (45, 37)).astype(np.float32), "sz": np.asarray(-3, np.int8), "few": u8(15, 100), "fw": i8(100, 17)}


def _exact(p, q, pz, qz) -> np.ndarray:
    return np.matmul(p.astype(np.int64) - pz.astype(np.int64), q.astype(np.int64) - qz.astype(np.int64))


def _quantize(x, s, z) -> np.ndarray:
    info = np.iinfo(z.dtype)
    return np.clip(np.rint(x / s) + z.astype(np.int64), info.min, info.max).astype(z.dtype)


def test_integer_gemms_on_amx_tiles_are_exact(amx):
    v = _arrays(1)
    mod = eqfuse.compile(GRAPH, fuse="manual", params={k: v[k] for k in ("d", "dz")})
    plans = [p for p in mod.default.last.plans if p.kind == "contraction"]
    paths = [p.precision_path for p in plans]
    assert paths == ["amx_int8"] * 5 + ["avx512_vnni"], paths
    assert all(mod.report["precision"][p.name]["path"] == p.precision_path for p in plans)
    assert plans[1].detail.prepack is not None and plans[1].tiles["kc"] < plans[1].detail.K  # (K in blocks)
    assert all((p.tiles["mr"], p.tiles["nr"]) == (32, 32) for p in plans[:5])
    got = mod(**{k: a for k, a in v.items() if k not in ("d", "dz")})
    want = [_exact(v["a"], v["b"], v["az"], v["bz"]), _exact(v["c"], v["d"], v["cz"], v["dz"]),
            _exact(v["e"], v["f"], v["ez"], v["fz"])]
    qx, qxs = _quantize(v["x"], v["qs"], v["xz"]), _quantize(v["xs"], v["qs"], v["sz"])
    assert qx.min() == 0 and qx.max() == 255 and qxs.min() == -128 and qxs.max() == 127  # (saturated at both ends)
    for i, w in enumerate(want + [None, _exact(qxs, v["w"], v["sz"], v["wz"]), _exact(v["few"], v["fw"], v["cz"], v["dz"])]):
        if w is not None:
            assert got[i].dtype == np.int32 and np.array_equal(got[i].astype(np.int64), w), f"output {i}"
    # the epilogue in f32 on the exact sum: the product and the add round once each (or once,
    # fused), relu 1-Lipschitz
    acc = _exact(qx, v["w"], v["xz"], v["wz"]).astype(np.float64)
    z = acc * v["sc"].astype(np.float64) + v["bias"]
    bound = 2.0**-24 * (np.abs(acc * v["sc"]) + np.abs(z))
    assert np.all(np.abs(got[3] - np.maximum(z, 0)) <= bound)


def test_a_refused_tile_state_stops_the_integer_gemm_with_an_error(monkeypatch):
    """The operating system's refusal (emulated: eqf_amx_ready() says no) stops the integer GEMM
    before any tile instruction, and the call raises an error naming the path and the way out."""
    from eqfuse.errors import EqfuseError

    monkeypatch.setenv("EQFUSE_CFLAGS", "-DEQF_AMX_EMULATE -DEQF_AMX_EMULATE_REFUSED -O0")  # (-O0: gcc's time only)
    src = "graph g(a: u8[40, 64], w: i8[64, 60], az: u8, wz: i8) -> i32[40, 60] {\n  return matmul_integer(a, w, az, wz)\n}"
    monkeypatch.setattr(qgemm, "AMX_INT8_MIN_MACS", 0)
    with machine.pinned(amx_model(), clamp=False):
        mod = eqfuse.compile(src)
    assert {e["path"] for e in mod.report["precision"].values()} == {"amx_int8"}
    with pytest.raises(EqfuseError, match="AMX-INT8 tiles.*refused this process the tile state.*EQFUSE_AMX=0.*vpdpbusd"):
        mod(np.ones((40, 64), np.uint8), np.ones((64, 60), np.int8), np.asarray(0, np.uint8), np.asarray(0, np.int8))


def test_a_machine_with_amx_int8_plans_the_tiles_and_lower_prints_it(tmp_path, capsys, monkeypatch):
    """Matmuls of AMX_INT8_MIN_ROWS rows and AMX_INT8_MIN_MACS multiply-adds or more take the
    tiles; fewer, and convs, vpdpbusd. `eqfuse lower` prints the path and the tiles' micro-kernel."""
    m, big = machine.MODELS["xeon-spr"], qgemm.AMX_INT8_MIN_MACS
    assert qgemm.int8_path(m, amx=qgemm.amx_fits(False, 16, big)) == "amx_int8"
    assert qgemm.int8_path(m, amx=qgemm.amx_fits(False, 15, big)) == "avx512_vnni"
    assert qgemm.int8_path(m, amx=qgemm.amx_fits(False, 128, big - 1)) == "avx512_vnni"
    assert qgemm.int8_path(m, amx=qgemm.amx_fits(True, 4096, big)) == "avx512_vnni"
    assert qgemm.int8_path(dataclasses.replace(m, amx_int8=False), amx=True) == "avx512_vnni"
    assert qgemm.int8_kc(2203, 32, m, "amx_int8") % 64 == 0
    g = tmp_path / "q.g"
    g.write_text(GRAPH)
    monkeypatch.setattr(qgemm, "AMX_INT8_MIN_MACS", 0)  # (the graph's small GEMMs: see the fixture amx)
    with machine.pinned(amx_model(), clamp=False):
        assert main(["lower", str(g), "--uops"]) == 0
    text = capsys.readouterr().out
    assert text.count("precision: int8, path: amx_int8") == 5 and text.count("precision: int8, path: avx512_vnni") == 1
    assert text.count("tdpbusd on 2 x 2 C tiles") == 5 and "K=2203 (padded to 2240)" in text
    assert "copy A [70 x 301] i8 into the kernel's A buffer as u8" in text


def test_the_real_amx_int8_kernel_compiles_for_a_cpu_with_amx(tmp_path):
    """The C of the real path (no emulation), built for a CPU with AMX-TILE and AMX-INT8, holds the
    tile instructions (compiled only: this CPU may have no AMX)."""
    src = "graph g(a: u8[40, 1101], w: i8[1101, 96], az: u8, wz: i8) -> i32[40, 96] {\n  return matmul_integer(a, w, az, wz)\n}"
    with pytest.MonkeyPatch.context() as mp, machine.pinned(amx_model(), clamp=False):  # (K in several blocks, B bound)
        mp.setattr(qgemm, "AMX_INT8_MIN_MACS", 0)
        _, _, plans = lower(load(src)[0], {}, params=frozenset({"w", "wz"}))
        code = "\n".join(emit_graph(plans).kernel_sources.values())
    assert "_tile_dpbusd" in code
    asm = assembly_for(code, tmp_path, ["-mavx512vnni", "-mamx-tile", "-mamx-int8"])
    for insn in ("ldtilecfg", "tileloadd", "tdpbusd", "tilestored", "tilezero", "tilerelease"):
        assert insn in asm, insn


@pytest.mark.heavy  # (an export, its quantization and two compiles: the whole suite runs it, the fast tier not)
def test_a_dynamically_quantized_bert_on_amx_tiles_equals_the_vpdpbusd_path(amx, tmp_path):
    """A small transformers BERT (batch 2 x 16 tokens: 32 rows), exported by torch and quantized by
    onnxruntime's quantize_dynamic (as tests/test_quantized.py does): its integer GEMMs on the
    tiles give the same bits as on vpdpbusd (exact sums, the same epilogues)."""
    import model_exports as me
    from test_quantized import _quantize

    q = tmp_path / "q.onnx"
    _quantize("bert-hf", "dynamic", me.export("bert", "dynamo"), q)
    feeds = me.inputs("bert")
    mod = eqfuse.compile(str(q))
    paths = [e["path"] for e in mod.report["precision"].values() if e["precision"] == "int8"]
    assert paths and set(paths) == {"amx_int8"}, paths
    with machine.pinned(dataclasses.replace(amx_model(), amx_int8=False), clamp=False):
        vnni = eqfuse.compile(str(q))
    assert {e["path"] for e in vnni.report["precision"].values() if e["precision"] == "int8"} == {"avx512_vnni"}
    got, want = (f(**feeds) for f in (mod, vnni))
    for g, w in zip(*(x if isinstance(x, (list, tuple)) else [x] for x in (got, want))):
        assert np.array_equal(np.asarray(g), np.asarray(w))
