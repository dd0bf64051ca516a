"""`eqfuse export`: the standalone C library builds with make and the system compiler (no Python),
its example passes, and its entry points, called through ctypes, match the numpy reference."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import eqfuse
from eqfuse.cli.main import main
from eqfuse.export import export
from eqfuse.frontend.load import load
from eqfuse.runtime.verify import ELEMENT, OUTPUT, compare, scale_for

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def cli(capsys, *args):
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, out, err


def make(outdir: Path, *args: str) -> None:
    r = subprocess.run(["make", "-s", "-C", str(outdir), *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warning" not in r.stderr, r.stderr


def run_example(outdir: Path) -> str:
    r = subprocess.run([str(outdir / "example"), str(outdir)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all outputs match the numpy reference" in r.stdout
    return r.stdout


def weights_for(model, skip=("x",), seed=0) -> dict[str, np.ndarray]:
    g = load(model)[0]
    rng = np.random.default_rng(seed)
    return {n: (rng.standard_normal(t.shape) * (0.05 if len(t.shape) == 2 else 1)).astype(np.float32)
            for n, t in g.params if n not in skip}


def f32p(a):
    return a.ctypes.data_as(ctypes.c_void_p)


@pytest.mark.heavy
def test_mlp_library_builds_runs_its_example_and_matches_the_reference(capsys, tmp_path):
    w = weights_for(ROOT / "examples/mlp.g")
    np.savez(tmp_path / "w.npz", **w)
    out = tmp_path / "lib"
    status, stdout, err = cli(capsys, "export", ROOT / "examples/mlp.g", "--weights", tmp_path / "w.npz",
                              "--dim", "B=4", "-o", out)
    assert status == 0, err
    assert "libmlp" in stdout and "make -C" in stdout
    header = (out / "mlp.h").read_text()
    assert "long mlp_mlp(mlp_model* m, const float* x, float* out0);" in header
    assert "#define MLP_MLP_X_SIZE 3136L" in header and "input  x: f32[4, 784]" in header
    assert "-fopenmp" in (out / "Makefile").read_text() and "x86-64-v2" in (out / "Makefile").read_text()
    make(out)
    assert "out0: 40 elements" in run_example(out)
    # the expected file is the numpy reference's, and the library computes it for other inputs too
    ref = eqfuse.reference(ROOT / "examples/mlp.g")
    x0 = np.fromfile(out / "example_inputs.bin", dtype=np.float32).reshape(4, 784)
    np.testing.assert_array_equal(np.fromfile(out / "example_expected.bin", dtype=np.float32).reshape(4, 10),
                                  ref(x0, *w.values()))
    lib = ctypes.CDLL(str(out / "libmlp.so"))
    lib.mlp_load.restype = ctypes.c_void_p
    lib.mlp_load.argtypes = [ctypes.c_char_p]
    lib.mlp_mlp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.mlp_error.restype = ctypes.c_char_p
    lib.mlp_free.argtypes = [ctypes.c_void_p]
    m = lib.mlp_load(str(out / "weights.bin").encode())
    assert m, lib.mlp_error()
    x = np.random.default_rng(7).standard_normal((4, 784)).astype(np.float32)
    y = np.empty((4, 10), np.float32)
    assert lib.mlp_mlp(m, f32p(x), f32p(y)) == 0
    np.testing.assert_allclose(y, ref(x, *w.values()), rtol=1e-4, atol=1e-5)
    lib.mlp_free(ctypes.c_void_p(m))
    # a weights file of another export is refused with a message, not used
    assert not lib.mlp_load(str(out / "example_inputs.bin").encode())
    assert b"not an eqfuse weights file" in lib.mlp_error()
    if shutil.which("objdump"):  # the portable target uses no AVX register
        dis = subprocess.run(["objdump", "-d", str(out / "libmlp.so")], capture_output=True, text=True).stdout
        assert "ymm" not in dis and "zmm" not in dis


@pytest.mark.heavy
def test_transformer_layer_library_matches_the_reference(tmp_path):
    model = ROOT / "examples/transformer.g"
    w = weights_for(model)
    out = tmp_path / "tr"
    written = export(model, out, weights=w, dims={"B": 1}, name="enc")
    assert {p.name for p in written} >= {"enc.h", "enc.c", "enc_encoder.c", "Makefile", "example.c", "weights.bin"}
    make(out)
    run_example(out)
    x = np.fromfile(out / "example_inputs.bin", dtype=np.float32).reshape(1, 128, 256)
    want = eqfuse.reference(model)(x, *w.values())
    np.testing.assert_allclose(np.fromfile(out / "example_expected.bin", dtype=np.float32).reshape(want.shape),
                               want, rtol=1e-6, atol=1e-6)


INDEX_G = """
graph emb(ids: i64[2, 3], mask: bool[2, 3], table: f32[10, 4]) -> (f32[2, 3, 4], i64[2, 3], f32[2, 3]) {
    e = gather(table, ids) * 2.0
    return e, ids, where(mask, sum(e, axis=-1), -1.5)
}
"""


@pytest.mark.heavy
def test_embedded_weights_without_openmp_integer_inputs_and_copied_outputs(tmp_path):
    model = tmp_path / "emb.g"
    model.write_text(INDEX_G)
    table = np.arange(40, dtype=np.float32).reshape(10, 4) / 7
    out = tmp_path / "emb"
    export(model, out, weights={"table": table}, embed_weights=True,
           example_inputs={"ids": np.array([[0, 9, 3], [-1, 2, 2]], dtype=np.int64)})
    assert not (out / "weights.bin").exists() and (out / "emb_weights.c").exists()
    make(out, "OPENMP=0")
    run_example(out)
    lib = ctypes.CDLL(str(out / "libemb.so"))
    lib.emb_load.restype = ctypes.c_void_p
    lib.emb_emb.argtypes = [ctypes.c_void_p] + [ctypes.c_void_p] * 5
    lib.emb_emb.restype = ctypes.c_long
    m = lib.emb_load(None)
    assert m
    ids = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64)
    mask = np.array([[True, False, True], [False, True, True]])
    outs = [np.empty((2, 3, 4), np.float32), np.empty((2, 3), np.int64), np.empty((2, 3), np.float32)]
    assert lib.emb_emb(ctypes.c_void_p(m), f32p(ids), f32p(mask), *map(f32p, outs)) == 0
    for got, want in zip(outs, eqfuse.reference(INDEX_G)(ids, mask, table)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    ids[0, 0] = 10  # out of range: the entry point says how many, as the Python runtime does
    assert lib.emb_emb(ctypes.c_void_p(m), f32p(ids), f32p(mask), *map(f32p, outs)) == 1


@pytest.mark.parametrize("args, message", [
    (["--input", "x"], "no weights for parameters w2, b2"),
    (["--weights-extra"], "'w3' is not a parameter"),
    (["--bad-shape"], "parameter 'w1' expects"),
    (["--target", "pentium"], "invalid choice: 'pentium'"),
    (["--no-dim"], "unbound dimension B: an exported library has fixed shapes; bind --dim B=INT"),
    (["--unwritable"], "cannot write the library there"),
    (["--not-npz"], "not a readable .npz file"),
])
def test_bad_input_is_one_clear_error(capsys, tmp_path, args, message):
    w = weights_for(ROOT / "examples/mlp.g")
    del w["w2"], w["b2"]
    extra = []
    if args == ["--weights-extra"]:
        w["w3"], args = w["w1"], []
    if args == ["--bad-shape"]:
        w["w1"], args = w["w1"][:10], []
    if args == ["--no-dim"]:
        args = []
    else:
        extra = ["--dim", "B=2"]
    out = tmp_path / "out"
    if args == ["--unwritable"]:
        (tmp_path / "file").write_text("")
        out, args = tmp_path / "file" / "sub", []
    np.savez(tmp_path / "w.npz", **w)
    weights = tmp_path / "w.npz"
    if args == ["--not-npz"]:
        weights, args = ROOT / "examples/mlp.g", []
    status, _, err = cli(capsys, "export", ROOT / "examples/mlp.g", "--weights", weights, "-o", out, *extra, *args)
    assert status == 2
    assert message in err, err
    assert err.count("error") == 1


@pytest.mark.heavy
def test_onnx_model_initializers_are_the_weights(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["input.1", "w"], ["h"]),
                           helper.make_node("Add", ["h", "b"], ["h2"]), helper.make_node("Relu", ["h2"], ["y"])],
                          "g", [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [3, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 8])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "small.onnx")
    x = rng.standard_normal((3, 16)).astype(np.float32)
    export(tmp_path / "small.onnx", tmp_path / "lib", example_inputs={"input.1": x})
    assert "long small_g(small_model* m, const float* input_1, float* y);" in (tmp_path / "lib/small.h").read_text()
    make(tmp_path / "lib")
    run_example(tmp_path / "lib")
    np.testing.assert_allclose(np.fromfile(tmp_path / "lib/example_expected.bin", dtype=np.float32).reshape(3, 8),
                               np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-6)


CONV_G = """
graph blk(x: f32[1, 16, 32, 32], w1: f32[16, 16, 3, 3], w2: f32[16, 16, 3, 3]) -> f32[1, 16, 32, 32] {
    h = relu(conv2d(x, w1, padding=1))
    return relu(conv2d(h, w2, padding=1) + x)
}
"""


@pytest.mark.heavy
def test_a_winograd_conv_library_checks_its_example_against_the_outputs_scale(tmp_path):
    """A ResNet-style block of two 3x3 stride-1 convs (16 channels, 32 x 32, weights of standard
    deviation 1: outputs up to about 400) runs them as Winograd F(2x2, 3x3), whose rounding is
    bounded relative to the map's magnitudes, not each element's (eqfuse.runtime.verify): outputs
    near zero among large ones missed the elementwise rule, a false MISMATCH from `make check`
    (max error 1.5e-4 against the numpy reference's f32, which is itself 1.3e-4 from the exact
    result). The example checks such a graph's floats within 1e-5 + 1e-4 x the output's largest
    value, as `eqfuse run --verify` does; one element off by twice that bound is still a MISMATCH."""
    rng = np.random.default_rng(0)
    w = {"w1": rng.standard_normal((16, 16, 3, 3)).astype(np.float32),
         "w2": rng.standard_normal((16, 16, 3, 3)).astype(np.float32)}
    model, out = tmp_path / "blk.g", tmp_path / "blk"
    model.write_text(CONV_G)
    export(model, out, weights=w)
    assert (out / "blk_blk.c").read_text().count("by Winograd F(2x2, 3x3)") == 2
    make(out)
    x = np.fromfile(out / "example_inputs.bin", dtype=np.float32).reshape(1, 16, 32, 32)
    want = eqfuse.reference(model)(x, **w)
    lib = ctypes.CDLL(str(out / "libblk.so"))
    lib.blk_load.restype = ctypes.c_void_p
    lib.blk_load.argtypes = [ctypes.c_char_p]
    lib.blk_blk.argtypes = [ctypes.c_void_p] * 3
    m = lib.blk_load(str(out / "weights.bin").encode())
    got = np.empty_like(want)
    assert lib.blk_blk(ctypes.c_void_p(m), f32p(x), f32p(got)) == 0
    err = np.abs(got.astype(np.float64) - want)
    assert (err > 1e-5 + 1e-4 * np.abs(want)).any()  # the elementwise rule would fail this output
    assert err.max() <= 1e-5 + 1e-4 * np.abs(want).max()
    assert "relative to the output's largest value" in run_example(out)
    expected = np.fromfile(out / "example_expected.bin", dtype=np.float32)
    k = int(np.argmax(np.abs(expected)))
    expected[k] += 2e-4 * np.abs(expected).max()  # one element off by twice the bound: caught
    expected.tofile(out / "example_expected.bin")
    r = subprocess.run([str(out / "example"), str(out)], capture_output=True, text=True)
    assert r.returncode == 1 and "MISMATCH" in r.stdout, r.stdout
    # compile's verify= (and `eqfuse run --verify`) by the same rule: it raised CheckFailed here
    mod = eqfuse.compile(model, params=w, verify=True)
    assert scale_for(mod.default.last.plans) == OUTPUT
    mod(x)
    assert compare([want + 2e-4 * np.abs(want).max()], [want], scale=OUTPUT)  # and still fails beyond it


def test_the_output_scale_rule_covers_every_kernel_that_sums_products():
    """A sum of K products rounds relative to the products' magnitudes (eqfuse.runtime.verify): a
    matmul's or a direct conv's graph is checked against its output's scale, as Winograd's is; a
    graph of pointwise kernels keeps the elementwise rule."""
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32)
    mm = eqfuse.compile("graph m(x: f32[4, 8], w: f32[8, 3]) -> f32[4, 3] { return relu(x @ w) }", verify=True)
    mm(x, w)
    assert scale_for(mm.default.last.plans) == OUTPUT
    pw = eqfuse.compile("graph p(x: f32[4, 8]) -> f32[4, 8] { return tanh(x) * 2 }", verify=True)
    pw(x)
    assert scale_for(pw.default.last.plans) == ELEMENT
    # an element that cancels: 1e-3 from 0 where the output's scale is 1e3 passes by the output's
    # rule and not by the elementwise one
    want = np.array([[1e3, 0.0]], np.float32)
    got = np.array([[1e3, 1e-3]], np.float32)
    assert compare([got], [want], scale=OUTPUT) == [] and compare([got], [want], scale=ELEMENT) != []
