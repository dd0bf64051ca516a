"""One-file artifacts (eqfuse.runtime.artifact): Module.save, eqfuse.load without the compiler,
the refusals (another ISA level, a damaged or truncated file, another version), the command line,
and a Module pickled to its artifact and shipped to worker processes."""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT

import eqfuse
from eqfuse.cli.main import main
from eqfuse.machine import LEVELS, level_rank, machine, pinned, usable_level
from eqfuse.runtime import artifact
from eqfuse.runtime.artifact import HEADER, PAGE, ArtifactError, artifact_info
from eqfuse.runtime.verify import compare

MLP = """
graph mlp(x: f32[B, 64], w1: f32[64, 256], b1: f32[256], w2: f32[256, 16], b2: f32[16]) -> f32[B, 16] {
    h = relu(x @ w1 + b1)
    return h @ w2 + b2
}
"""


def weights(seed=0):
    rng = np.random.default_rng(seed)
    return {"w1": rng.standard_normal((64, 256), dtype=np.float32), "b1": rng.standard_normal(256, dtype=np.float32),
            "w2": rng.standard_normal((256, 16), dtype=np.float32), "b2": rng.standard_normal(16, dtype=np.float32)}


def reference(x, w):
    """The numpy reference of MLP."""
    return eqfuse.reference(MLP)(x, **w)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(the compiled Module, its weights, the artifact's path): the batch dim B at buckets 1 and 4."""
    w = weights()
    mod = eqfuse.compile(MLP, params=w, buckets={"B": [1, 4]})
    path = tmp_path_factory.mktemp("artifact") / "mlp.eqf"
    mod.save(path)
    return mod, w, path


def test_a_loaded_module_runs_as_the_compiled_one_with_its_weights_mapped(saved):
    mod, w, path = saved
    loaded = eqfuse.load(path)
    man = artifact_info(path)
    assert list(man["targets"]) == [usable_level()] and loaded.target == usable_level()
    assert man["eqfuse"] == eqfuse.__version__ and man["precision"] == loaded.precision == "f32"
    assert any(p.startswith("panel/") for p in man["parts"])  # the GEMM's prepacked weight is in it
    f = loaded.mlp
    assert sorted(b.sizes for b in f.buckets.values()) == [[1, 4]] and f.batch_dim == "B"
    assert all(not a.flags.writeable for a in f.params.values())  # memory-mapped, read-only
    np.testing.assert_array_equal(f.params["w1"], w["w1"])
    for n in (1, 3, 4, 9):  # whole buckets, padded or split chunks: as the compiled Module runs them
        x = np.random.default_rng(n).standard_normal((n, 64), dtype=np.float32)
        got = loaded(x)
        np.testing.assert_allclose(got, mod(x), rtol=1e-5, atol=1e-5)
        assert not compare([got], [reference(x, w)])
    assert [k.name for k in loaded.kernels] == [k.name for k in mod.kernels]
    assert loaded.graph == mod.graph


BLOCKER = """
import sys

class Refuse:
    # the compiler's packages, unimportable: loading must not need them
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("egglog", "lark", "setuptools", "distutils"):
            raise ImportError(f"{name} is not importable here")

sys.meta_path.insert(0, Refuse())
"""


def test_load_needs_neither_the_optimizer_nor_the_parser_nor_a_c_compiler(saved, tmp_path):
    _, w, path = saved
    x = np.random.default_rng(1).standard_normal((6, 64), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    script = BLOCKER + textwrap.dedent(f"""
        import numpy as np
        import eqfuse
        try:
            import lark  # noqa: F401
            raise SystemExit("lark was importable")
        except ImportError:
            pass
        m = eqfuse.load({str(path)!r})
        np.save({str(tmp_path / 'y.npy')!r}, m(np.load({str(tmp_path / 'x.npy')!r})))
        loaded = sorted(k for k in sys.modules if k.startswith(("eqfuse.frontend", "eqfuse.optimizer",
                                                                 "eqfuse.pipeline", "egglog", "lark", "setuptools")))
        print("LOADED", loaded)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert "LOADED []" in r.stdout
    assert not compare([np.load(tmp_path / "y.npy")], [reference(x, w)])


def lower_machine(level: str):
    """The machine model with the vector width of the level below `level`."""
    below = list(LEVELS)[list(LEVELS).index(level) - 1]
    return replace(machine(), simd_floats=LEVELS[below][1], target=None), below


def test_a_cpu_without_the_artifacts_isa_is_refused(saved):
    _, _, path = saved
    level = next(iter(artifact_info(path)["targets"]))
    if level == "x86-64-v2":
        pytest.skip("the artifact is built for the lowest level")  # (a machine model of x86-64-v2)
    model, below = lower_machine(level)
    with pinned(model):
        with pytest.raises(ArtifactError, match=f"built for {level}; this CPU runs up to {below}"):
            eqfuse.load(path)


@pytest.mark.heavy  # (the fast tier's time)
def test_an_artifact_of_two_levels_runs_the_one_this_cpu_has(saved, tmp_path):
    mod, w, _ = saved
    here = usable_level()
    if level_rank(here) < 2:
        pytest.skip("the host runs only x86-64-v2")  # (no lower level to build beside it)
    model, below = lower_machine(here)
    path = mod.save(tmp_path / "two.eqf", targets=[below, here])
    assert list(artifact_info(path)["targets"]) == [below, here]
    x = np.random.default_rng(2).standard_normal((5, 64), dtype=np.float32)
    assert eqfuse.load(path).target == here
    with pinned(model):
        low = eqfuse.load(path)
        assert low.target == below
        assert not compare([low(x)], [reference(x, w)])


def test_targets_that_cannot_be_built_here_are_refused_and_nothing_is_written(saved, tmp_path):
    mod, _, _ = saved
    with pytest.raises(ArtifactError, match="unknown target 'x86-64-v9'"):
        mod.save(tmp_path / "a.eqf", targets=["x86-64-v9"])
    # (on an AVX-512 host, as a CPU without it sees it)
    with pinned(lower_machine("x86-64-v4")[0]) if usable_level() == "x86-64-v4" else contextlib.nullcontext():
        with pytest.raises(ArtifactError, match="cannot build for x86-64-v4 on this machine"):
            mod.save(tmp_path / "a.eqf", targets=["x86-64-v4"])
    lazy = eqfuse.compile(MLP, params=weights(), buckets={})
    with pytest.raises(ArtifactError, match="not compiled yet"):
        lazy.save(tmp_path / "a.eqf")
    assert list(tmp_path.iterdir()) == []


def changed(data: bytes, part: str | None = None, cut: int | None = None, manifest=None) -> bytes:
    """An artifact's bytes with one byte of `part` flipped, cut to `cut` bytes, or its manifest
    changed by `manifest` (its digest updated, as a tool that rewrites it would)."""
    data = bytearray(data)
    magic, fmt, length, _ = HEADER.unpack(data[:HEADER.size])
    man = json.loads(data[HEADER.size:HEADER.size + length])
    start = -(-(HEADER.size + length) // PAGE) * PAGE
    if part is not None:
        name = next(n for n in man["parts"] if n.startswith(part))
        data[start + man["parts"][name]["offset"] + man["parts"][name]["size"] // 2] ^= 0xFF
    if cut is not None:
        data = data[:cut]
    if manifest is not None:
        manifest(man)
        text = json.dumps(man, indent=1, sort_keys=True).encode()
        assert len(text) == length  # (same-length edits keep the data where it is)
        data[:HEADER.size + length] = HEADER.pack(magic, fmt, length, hashlib.sha256(text).digest()) + text
    return bytes(data)


def damaged(path: Path, tmp_path: Path, **change) -> Path:
    """A changed copy of the artifact at `path` (`changed`), in tmp_path."""
    out = tmp_path / f"bad{len(list(tmp_path.iterdir()))}.eqf"
    out.write_bytes(changed(path.read_bytes(), **change))
    return out


def test_a_changed_truncated_or_foreign_artifact_is_refused_with_one_message(saved, tmp_path):
    _, w, path = saved
    size = path.stat().st_size
    for bad, words in [(damaged(path, tmp_path, part="lib/"), "part lib/"),
                       (damaged(path, tmp_path, part="meta"), "part meta"),
                       (damaged(path, tmp_path, cut=size - 100), "truncated"),
                       (damaged(path, tmp_path, cut=HEADER.size + 10), "does not match its digest"),
                       (damaged(path, tmp_path, manifest=lambda m: m.update(eqfuse="9.9.9")),
                        "saved by eqfuse 9.9.9; this is eqfuse")]:
        with pytest.raises(ArtifactError, match=words) as e:
            eqfuse.load(bad)
        assert "\n" not in str(e.value)
    # a weight is checked by size when loaded, and by its digest with verify=True
    bad = damaged(path, tmp_path, part="weight/")
    eqfuse.load(bad)
    with pytest.raises(ArtifactError, match="part weight/"):
        eqfuse.load(bad, verify=True)
    eqfuse.load(path, verify=True)
    (tmp_path / "not.eqf").write_bytes(b"x" * 100)
    for p, words in [(tmp_path / "not.eqf", "not an eqfuse artifact"), (tmp_path / "none.eqf", "no such file"),
                     (tmp_path, "is a directory")]:
        with pytest.raises(ArtifactError, match=words):
            eqfuse.load(p)


@pytest.mark.heavy  # (the fast tier's time)
def test_a_call_at_dims_the_artifact_does_not_hold_needs_the_compiler(tmp_path):
    mod = eqfuse.compile("graph sq(x: f32[N, N]) -> f32[N, N] { return x @ x + 1.0 }")
    x = np.random.default_rng(0).standard_normal((8, 8), dtype=np.float32)
    mod(x)  # N is not a batch dim: compiled for N=8 at this first call
    loaded = eqfuse.load(mod.save(tmp_path / "sq.eqf"))
    np.testing.assert_allclose(loaded(x), x @ x + 1, rtol=1e-5, atol=1e-5)
    with pytest.raises(ArtifactError, match="holds it compiled at N=8; a call at N=5 needs the compiler"):
        loaded(np.ones((5, 5), np.float32))


@pytest.mark.heavy
def test_the_command_line_compiles_and_runs_an_artifact(tmp_path, capsys):
    model = tmp_path / "mlp.g"
    model.write_text(MLP)
    out = tmp_path / "mlp.eqf"
    w = weights()
    x = np.random.default_rng(3).standard_normal((3, 64), dtype=np.float32)
    np.savez(tmp_path / "in.npz", x=x, **w)
    assert main(["compile", str(model), "--buckets", "B=1,4", "-o", str(out)]) == 0
    assert artifact_info(out)["buckets"] == {"mlp": [[1, 4]]}
    assert main(["run", str(out), "--inputs", str(tmp_path / "in.npz"), "--verify", "-o", str(tmp_path / "y.npz")]) == 0
    assert not compare([np.load(tmp_path / "y.npz")["out0"]], [reference(x, w)])
    capsys.readouterr()
    (tmp_path / "cut.eqf").write_bytes(out.read_bytes()[:-10])
    assert main(["run", str(tmp_path / "cut.eqf"), "--inputs", str(tmp_path / "in.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "truncated" in err
    assert main(["compile", str(model), "--targets", "x86-64-v9", "-o", str(tmp_path / "no.eqf")]) == 2
    assert "unknown target 'x86-64-v9'" in capsys.readouterr().err and not (tmp_path / "no.eqf").exists()


# ---------------------------------------------------------------- pickling


def test_a_module_pickles_to_its_artifact(saved):
    mod, w, path = saved
    data = pickle.dumps(mod)
    again = pickle.loads(data)
    x = np.random.default_rng(4).standard_normal((7, 64), dtype=np.float32)
    np.testing.assert_allclose(again(x), mod(x), rtol=1e-5, atol=1e-5)
    # a loaded Module pickles as the file it was loaded from, without building anything
    assert artifact.dumps(eqfuse.load(path)) == path.read_bytes()
    assert pickle.loads(pickle.dumps(again)).target == again.target
    # unpickling is artifact.loads of the bytes: a Module pickled by another version is refused
    _, (raw,) = mod.__reduce__()
    with pytest.raises(ArtifactError, match="saved by eqfuse 9.9.9"):
        artifact.loads(changed(raw, manifest=lambda m: m.update(eqfuse="9.9.9")))


@pytest.mark.heavy  # (the fast tier's time)
def test_a_process_pool_runs_a_pickled_module(saved):
    mod, w, _ = saved
    xs = [np.random.default_rng(k).standard_normal((k + 1, 64), dtype=np.float32) for k in range(6)]
    # spawn: a forked child would inherit the parent's OpenMP state, which GNU OpenMP does not survive
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as pool:
        got = list(pool.map(mod, xs))
    for x, y in zip(xs, got):
        np.testing.assert_allclose(y, mod(x), rtol=1e-5, atol=1e-5)
        assert not compare([y], [reference(x, w)])


@pytest.mark.heavy  # (a few seconds: the whole suite runs it, the fast tier not)
def test_a_padded_dim_keeps_its_buckets_in_the_artifact(tmp_path):
    """A dim that is not a batch dim, padded per call to its buckets (eqfuse.runtime.padded): saved
    after the first call, the artifact runs every length within them and refuses one beyond."""
    # (a sum over S: exact with zeros padded, and no kernel over S at run time)
    causal = "graph f(x: f32[S, 4], w: f32[4, 4]) -> f32[S, 4] { return x @ w + sum(x, axis=0, keepdims=true) }"
    w = np.random.default_rng(0).standard_normal((4, 4), dtype=np.float32)
    mod = eqfuse.compile(causal, params={"w": w}, buckets={"S": [4, 8]})
    with pytest.raises(ArtifactError, match="call it once before saving"):
        mod.save(tmp_path / "c.eqf")
    mod(np.ones((3, 4), np.float32))
    loaded = eqfuse.load(mod.save(tmp_path / "c.eqf"))
    assert loaded.f.padding == {"S": "exact"} and sorted(loaded.f.modules) == [(4,), (8,)]
    for n in (3, 8, 5, 1):
        x = np.random.default_rng(n).standard_normal((n, 4), dtype=np.float32)
        np.testing.assert_allclose(loaded(x), x @ w + x.sum(0, keepdims=True), rtol=1e-5, atol=1e-5)
    with pytest.raises(ArtifactError, match="holds it compiled at S=4; S=8; a call at S=16 needs the compiler"):
        loaded(np.ones((9, 4), np.float32))


@pytest.mark.heavy  # (three C builds when the kernel cache is cold)
def test_a_bf16_artifact_keeps_its_precision_and_instruction_path(tmp_path):
    """precision="bf16" saved and loaded: the same precision, report["precision"] and outputs as
    the compiled Module (its GEMM's AVX512_BF16 path, an extension beyond x86-64-v4 that the
    artifact then needs). A CPU of the level without it runs the level below, whose bf16 GEMM
    takes the f32 path on bf16 operands, within the same documented bound; with no such level
    in the artifact, it is refused."""
    from test_bf16 import check_gemm

    rng = np.random.default_rng(0)
    # (weights past any host's L2, 4 MiB: the few-rows GEMM multiplies bf16 on the fallback too, plan_skinny)
    x, w, b = (rng.standard_normal(s, dtype=np.float32) for s in ((8, 1024), (1024, 1024), (1024,)))
    mod = eqfuse.compile("graph g(x: f32[8, 1024], w: f32[1024, 1024], b: f32[1024]) -> f32[8, 1024] { return x @ w + b }",
                         params={"w": w, "b": b}, precision="bf16")
    here = usable_level()
    below = list(LEVELS)[level_rank(here) - 2] if level_rank(here) >= 2 else None
    path = mod.save(tmp_path / "bf16.eqf", targets=[t for t in (below, here) if t])
    man = artifact_info(path)
    ext = ["avx512_bf16"] if machine().avx512_bf16 and LEVELS[here][1] >= 16 else []
    assert man["precision"] == "bf16" and man["targets"][here]["extensions"] == ext
    loaded = eqfuse.load(path)
    assert loaded.precision == "bf16" and loaded.target == here
    assert loaded.report["precision"] == mod.report["precision"]
    assert {e["precision"] for e in loaded.report["precision"].values()} == {"bf16"}
    np.testing.assert_array_equal(loaded(x), mod(x))
    check_gemm(loaded(x), x, w, bias=b)
    if not ext or below is None:
        return
    only = mod.save(tmp_path / "v4.eqf", targets=[here])
    with pinned(replace(machine(), avx512_bf16=False)):
        low = eqfuse.load(path)
        assert low.target == below and low.precision == "bf16"
        assert {(e["precision"], e["path"]) for e in low.report["precision"].values()} == {("bf16", "fallback")}
        check_gemm(low(x), x, w, bias=b)
        with pytest.raises(ArtifactError, match=f"built for {here}\\+avx512_bf16; this CPU lacks avx512_bf16"):
            eqfuse.load(only)


SKINNY = """
graph step(x: f32[1, 512], w: f32[512, 1024]) -> f32[1, 1024] {
    return x @ w
}
"""


def advised_huge(a: np.ndarray) -> bool:
    """Whether the mapping that holds a's first byte is advised as huge pages (`hg` in its VmFlags)."""
    at, inside = a.ctypes.data, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= at < hi
            elif inside and head == "VmFlags:":
                return "hg" in line.split()[1:]
    return False


@pytest.mark.heavy  # (the fast tier's time)
def test_a_loaded_decode_weight_stream_is_copied_into_huge_pages_at_its_first_call(tmp_path):
    """A file mapping is in 4 KiB pages: a loaded artifact's few-rows GEMM panels (a decode
    step's weight stream, 2 MiB here) stay mapped through the load, and its first call copies
    them into memory advised as transparent huge pages, as a compiled Module packs them, where the
    system has THP (else they stay mapped). The results are the compiled Module's, bit for bit."""
    from eqfuse.runtime.program import huge_pages

    rng = np.random.default_rng(0)
    w, x = rng.standard_normal((512, 1024), dtype=np.float32), rng.standard_normal((1, 512), dtype=np.float32)
    mod = eqfuse.compile(SKINNY, params={"w": w})
    want = mod(x)
    loaded = eqfuse.load(mod.save(tmp_path / "step.eqf"))
    c = loaded.default.last
    assert [p.name for p in c.plans if getattr(p.detail, "path", None) == "skinny"]
    ((s, mapped),) = c.runner.packed().items()
    assert not mapped.flags.writeable and mapped.nbytes >= 1 << 20  # the file's pages: the load copied nothing
    np.testing.assert_array_equal(loaded(x), want)
    now = c.runner.packed()[s]
    np.testing.assert_array_equal(now, mapped)
    if huge_pages():
        assert now.flags.writeable and advised_huge(now) and not advised_huge(mapped)
    else:
        assert now is mapped


def test_weights_of_equal_bytes_and_another_dtype_or_shape_load_as_themselves(tmp_path):
    """A zero bias of 4 floats and 2 zero int64 indices are the same 16 bytes: each is stored as
    its own part (the parts are deduplicated by content, dtype and shape), and each loads as
    itself (the one part once served both, the indices then read as floats)."""
    src = """graph g(x: f32[3, 4], t: f32[5, 4], idx: i64[2], b: f32[4], c: f32[2, 2]) -> (f32[2, 4], f32[3, 4], f32[2, 2]) {
    return gather(t, idx, axis=0), x + b, c * 2.0
}
"""
    params = {"idx": np.zeros(2, np.int64), "b": np.zeros(4, np.float32), "c": np.zeros((2, 2), np.float32)}
    mod = eqfuse.compile(src, params=params)
    x, t = np.ones((3, 4), np.float32), np.arange(20, dtype=np.float32).reshape(5, 4)
    mod.save(tmp_path / "g.eqf")
    back = eqfuse.load(tmp_path / "g.eqf")
    for name, a in params.items():
        got = back.default.params[name]
        assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a), name
    for w, g in zip(mod(x=x, t=t), back(x=x, t=t)):
        np.testing.assert_array_equal(w, g)
