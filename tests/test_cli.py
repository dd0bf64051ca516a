"""The `eqfuse` command: check and run (with --reference), their options and their bad inputs."""

import subprocess
import sys

import numpy as np
import pytest
from helpers import GOOD, ROOT, load_text

import eqfuse
from eqfuse.cli.main import main

MLP = str(ROOT / "examples" / "mlp.g")
MULTI = str(GOOD[0].parent / "multi.g")


def cli(capsys, *args) -> tuple[int, str, str]:
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, out, err


def mlp_arrays(batch=3, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    shapes = {"x": (batch, 784), "w1": (784, 1024), "b1": (1024,), "w2": (1024, 10), "b2": (10,)}
    return {k: (rng.standard_normal(s) / 8).astype(dtype) for k, s in shapes.items()}


# ---------------------------------------------------------------- check


def test_check_prints_every_signature(capsys):
    status, out, err = cli(capsys, "check", MULTI)
    assert status == 0 and err == ""
    assert out.splitlines() == [g.signature() for g in load_text(open(MULTI).read())]


def test_check_binds_named_dims(capsys):
    status, out, _ = cli(capsys, "check", MLP, "--dim", "B=4")
    assert status == 0
    assert out == ("mlp(x: f32[4, 784], w1: f32[784, 1024], b1: f32[1024], w2: f32[1024, 10], b2: f32[10]) "
                   "-> f32[4, 10]\n")


def test_check_binds_dims_through_reshape(capsys):
    status, out, _ = cli(capsys, "check", ROOT / "examples" / "transformer.g", "--dim", "B=2")
    assert status == 0 and out.startswith("encoder(x: f32[2, 128, 256],") and out.endswith("-> f32[2, 128, 256]\n")


def test_check_binds_several_dims_in_several_graphs(capsys, tmp_path):
    model = tmp_path / "two.g"
    model.write_text("graph a(x: f32[B, T]) -> f32[B, T] { return x }\n"
                     "graph b(x: f32[T]) -> f32[T] { return x }\n")
    status, out, _ = cli(capsys, "check", model, "--dim", "B=2", "--dim", "T=5")
    assert status == 0
    assert out == "a(x: f32[2, 5]) -> f32[2, 5]\nb(x: f32[5]) -> f32[5]\n"


@pytest.mark.parametrize("dim", ["B", "B=", "=4", "B=0", "B=-1", "B=x", "3=4", "B=2.5", "B 4"])
def test_a_bad_dim_is_a_usage_error(capsys, dim):
    status, out, err = cli(capsys, "check", MLP, "--dim", dim)
    assert status == 2 and out == ""
    assert err == f"error: --dim expects NAME=POSITIVE_INT, got '{dim}'\n"


def test_a_dim_the_model_does_not_have_is_a_usage_error(capsys):
    status, _, err = cli(capsys, "check", MLP, "--dim", "b=4")
    assert status == 2
    assert "has no dimension named 'b' (its named dimensions: B)" in err


def test_version(capsys):
    assert cli(capsys, "--version") == (0, f"eqfuse {eqfuse.__version__}\n", "")


# ---------------------------------------------------------------- run --reference


@pytest.fixture
def mlp_npz(tmp_path):
    arrays = mlp_arrays()
    path = tmp_path / "in.npz"
    np.savez(path, **arrays)
    return path, arrays


def test_run_reference_writes_the_reference_outputs(capsys, tmp_path, mlp_npz):
    inputs, arrays = mlp_npz
    out_path = tmp_path / "out.npz"
    status, out, err = cli(capsys, "run", MLP, "--inputs", inputs, "--reference", "-o", out_path)
    assert status == 0, err
    want = eqfuse.reference(MLP)(*arrays.values())
    with np.load(out_path) as got:
        assert got.files == ["out0"]
        np.testing.assert_array_equal(got["out0"], want)
    assert out.startswith("out0: f32[3, 10]  min ")


def test_run_names_outputs_and_picks_the_graph(capsys, tmp_path):
    inputs, out_path = tmp_path / "in.npz", tmp_path / "out.npz"
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.savez(inputs, x=x, unused=np.zeros(1))
    status, out, err = cli(capsys, "run", MULTI, "--graph", "two", "--inputs", inputs, "--reference", "-o", out_path)
    assert status == 0, err
    with np.load(out_path) as got:
        assert got.files == ["out0", "out1"]
        np.testing.assert_array_equal(got["out0"], x)
        np.testing.assert_array_equal(got["out1"], x.T)
    np.savez(inputs, x=x[0, :2])
    status, out, err = cli(capsys, "run", MULTI, "--graph", "same_twice", "--inputs", inputs, "--reference", "-o", out_path)
    assert status == 0, err
    with np.load(out_path) as got:  # a named result keeps its name; the same value twice gets two
        assert got.files == ["y", "out1"]


def test_run_reference_checks_dims_given_on_the_command_line(capsys, mlp_npz):
    inputs, _ = mlp_npz
    status, _, err = cli(capsys, "run", MLP, "--inputs", inputs, "--reference", "--dim", "B=4")
    assert status == 2
    assert "parameter 'x' expects f32[B, 784], got shape [3, 784] (axis 0 is 3, expected 4)" in err


def test_run_with_a_missing_input_array(capsys, tmp_path):
    inputs = tmp_path / "in.npz"
    arrays = mlp_arrays()
    del arrays["w2"], arrays["b1"]
    np.savez(inputs, **arrays)
    status, out, err = cli(capsys, "run", MLP, "--inputs", inputs, "--reference")
    assert status == 2 and out == ""
    assert err == f"error: {inputs} has no array for inputs b1, w2 (it has: x, w1, b2)\n"


@pytest.mark.parametrize("param, dtype", [("x", np.float64), ("b2", np.int64), ("w1", np.float16)])
def test_run_with_a_wrong_dtype_names_the_parameter(capsys, tmp_path, param, dtype):
    inputs = tmp_path / "in.npz"
    arrays = mlp_arrays()
    arrays[param] = arrays[param].astype(dtype)
    np.savez(inputs, **arrays)
    status, _, err = cli(capsys, "run", MLP, "--inputs", inputs, "--reference")
    assert status == 2
    assert f"parameter '{param}' expects dtype float32" in err and f"got {np.dtype(dtype).name}" in err


def test_run_with_a_wrong_shape_names_the_parameter(capsys, tmp_path):
    inputs = tmp_path / "in.npz"
    arrays = mlp_arrays()
    arrays["b1"] = arrays["b1"][:100]
    np.savez(inputs, **arrays)
    status, _, err = cli(capsys, "run", MLP, "--inputs", inputs, "--reference")
    assert status == 2
    assert "parameter 'b1' expects f32[1024], got shape [100]" in err


def test_run_with_inputs_that_are_not_there_or_not_npz(capsys, tmp_path):
    status, _, err = cli(capsys, "run", MLP, "--inputs", tmp_path / "nope.npz", "--reference")
    assert status == 2 and err == f"error: {tmp_path / 'nope.npz'}: no such file\n"
    bad = tmp_path / "bad.npz"
    bad.write_text("not an archive")
    status, _, err = cli(capsys, "run", MLP, "--inputs", bad, "--reference")
    assert status == 2 and err.startswith(f"error: {bad}: not a readable .npz file")


def test_run_needs_inputs_and_a_known_graph(capsys, mlp_npz):
    status, _, err = cli(capsys, "run", MLP)
    assert status == 2 and "--inputs" in err
    status, _, err = cli(capsys, "run", MLP, "--inputs", mlp_npz[0], "--reference", "--graph", "nope")
    assert status == 2 and "no graph named 'nope' (the file has: mlp)" in err


def test_run_with_a_bad_model_reports_the_model_error(capsys, mlp_npz):
    bad = ROOT / "tests" / "bad" / "unknown_op.g"
    status, _, err = cli(capsys, "run", bad, "--inputs", mlp_npz[0], "--reference")
    assert status == 2 and err.startswith(f"{bad}:3:12: error: unknown op 'relux'")


@pytest.mark.heavy  # (the fast tier's time)
def test_run_in_a_subprocess_exits_2_without_a_traceback(tmp_path):
    inputs = tmp_path / "in.npz"
    arrays = mlp_arrays()
    arrays["x"] = arrays["x"].astype(np.float64)
    np.savez(inputs, **arrays)
    r = subprocess.run([sys.executable, "-m", "eqfuse.cli", "run", MLP, "--inputs", str(inputs), "--reference"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert "Traceback" not in r.stderr
    assert r.stderr.strip() == ("error: mlp(): parameter 'x' expects dtype float32 (f32[B, 784]), got float64")


@pytest.mark.heavy  # (the fast tier's time)
def test_python_dash_m_eqfuse_is_the_eqfuse_command():
    r = subprocess.run([sys.executable, "-m", "eqfuse", "--version"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"eqfuse {eqfuse.__version__}\n", "")
    r = subprocess.run([sys.executable, "-m", "eqfuse", "check", MLP, "--dim", "B=0"], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", "error: --dim expects NAME=POSITIVE_INT, got 'B=0'\n")


@pytest.mark.parametrize("content", ["graph", "npy"])
def test_run_says_what_an_inputs_file_must_be(capsys, tmp_path, content):
    bad = tmp_path / "in.x"
    if content == "npy":
        np.save(tmp_path / "one.npy", np.zeros(3))
        bad = tmp_path / "one.npy"
    else:
        bad.write_text(open(MLP).read())
    status, out, err = cli(capsys, "run", MLP, "--inputs", bad, "--reference")
    assert status == 2 and out == "" and "allow_pickle" not in err
    assert err == (f"error: {bad}: not a readable .npz file: --inputs expects a numpy .npz archive with one array "
                   "per parameter, named like it (numpy.savez('in.npz', x=x, w1=w1, ...))\n")


@pytest.mark.heavy
def test_the_mlp3_demo_lowers_to_three_kernels_with_a_total_uop_count(capsys):
    import re

    status, out, err = cli(capsys, "lower", ROOT / "examples" / "mlp3.g", "--uops", "--dim", "B=64")
    assert status == 0, err
    assert out.startswith("# graph mlp3: 3 kernels\n")
    counts = [int(c) for c in re.findall(r"  x(\d+)$", out, re.M)]
    assert counts and out.rstrip().endswith(f"total: {sum(counts)} uops (the x counts above, summed)")


def test_run_reference_summary_of_infinities_is_quiet(capsys, tmp_path):
    # the mean of inf and -inf is nan: printed, with no numpy RuntimeWarning
    import warnings

    (tmp_path / "inv.g").write_text("graph g(a: f32[4]) -> f32[4] {\n return 1 / a\n}\n")
    np.savez(tmp_path / "in.npz", a=np.array([0.0, -0.0, 1.0, 2.0], np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        status, out, err = cli(capsys, "run", tmp_path / "inv.g", "--inputs", tmp_path / "in.npz", "--reference")
    assert status == 0 and "min -inf  max inf  mean nan" in out, err


def _on_a_terminal(tmp_path, *argv) -> tuple[int, str, str]:
    """eqfuse run with its stderr on a pseudo-terminal and its stdout piped: (status, stdout, the
    terminal's text)."""
    import os
    import pty

    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "EQFUSE_QUIET"} | {
        "PYTHONPATH": str(ROOT), "EQFUSE_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.Popen([sys.executable, "-m", "eqfuse", *map(str, argv)], stdout=subprocess.PIPE, stderr=slave,
                         stdin=subprocess.DEVNULL, env=env, cwd=tmp_path)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    out = p.stdout.read().decode()
    return p.wait(timeout=600), out, b"".join(chunks).decode(errors="replace")


def _steps(tty: str) -> list[str]:
    """The finished progress lines: 'what: <time>' (the last rewrite of each line)."""
    return [ln.split("\x1b[2K")[-1] for ln in tty.replace("\r\n", "\n").split("\n") if "\x1b[2K" in ln]


@pytest.mark.heavy  # (opt, bench and export under a pty)
def test_long_steps_show_progress_on_a_terminal_and_stdout_stays_clean(tmp_path):
    import json
    import re

    (tmp_path / "g.g").write_text("graph g(x: f32[B, 32], w: f32[32, 32]) -> f32[B, 32] {\n"
                                  "    return relu(x @ w) + 1\n}\n")
    status, out, tty = _on_a_terminal(tmp_path, "opt", "g.g", "--dim", "B=8", "--report", "json")
    assert status == 0 and json.loads(out)["graph_name"] == "g", (out, tty)  # stdout: the JSON alone
    assert any(re.fullmatch(r"optimizing g: [\d.]+ (us|ms|s)", s) for s in _steps(tty)), tty
    status, out, tty = _on_a_terminal(tmp_path, "bench", "g.g", "--dim", "B=8", "--repeat", "2", "--threads", "1",
                                      "--peers", "numpy")
    steps = _steps(tty)
    assert status == 0 and out.startswith("g (B=8)"), (out, tty)
    for what in ("compiling 1 kernels of g", "bench g: eqfuse unfused, threads=1, 2 calls",
                 "bench g: eqfuse fused, threads=1, 2 calls", "bench g: numpy op by op, threads=1, 2 calls"):
        assert any(s.startswith(what + ": ") for s in steps), (what, steps)
    status, out, tty = _on_a_terminal(tmp_path, "export", "g.g", "--dim", "B=8", "-o", "lib")
    steps = _steps(tty)
    assert status == 0 and out.startswith("wrote "), (out, tty)
    assert any(s.startswith("exporting g: plans, C and example outputs: ") for s in steps), steps
    assert any(s.startswith("writing the library g to lib: ") for s in steps), steps
