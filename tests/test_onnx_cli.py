"""ONNX models through the command line and through eqfuse.compile (C kernels)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import eqfuse  # noqa: E402
from eqfuse.frontend.onnx_import import import_onnx, onnx_params  # noqa: E402
from eqfuse.ir.printer import graph_text  # noqa: E402

F = TensorProto.FLOAT
rng = np.random.default_rng(0)


def model(nodes, inputs, outputs, inits=(), opset=20, name="g"):
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, F, s) for n, s in outputs],
                          initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def cli(*args):
    return subprocess.run([sys.executable, "-m", "eqfuse.cli", *map(str, args)], capture_output=True, text=True)


@pytest.mark.heavy
def test_compile_onnx_path_with_params(tmp_path):
    """The contract: compile(path, params=onnx_params(path)) takes only the model's own inputs."""
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (5, 4), (5,)))
    path = tmp_path / "gemm.onnx"
    onnx.save(model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=0.5, beta=2.0, transA=1, transB=1)],
                    [("a", [4, 3])], [("y", [3, 5])], {"b": b, "c": c}), path)
    mod = eqfuse.compile(str(path), params=onnx_params(path))
    np.testing.assert_allclose(mod(a), 0.5 * a.T @ b.T + 2.0 * c, rtol=1e-4, atol=1e-5)


@pytest.mark.heavy
def test_compile_onnx_path_binds_initializers_by_default(tmp_path):
    """compile("model.onnx") binds the initializers itself; params= overrides one of them."""
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (3, 5), (5,)))
    path = tmp_path / "gemm.onnx"
    onnx.save(model([helper.make_node("Gemm", ["a", "b", "c"], ["y"])],
                    [("a", [4, 3])], [("y", [4, 5])], {"b": b, "c": c}), path)
    np.testing.assert_allclose(eqfuse.compile(str(path))(a), a @ b + c, rtol=1e-4, atol=1e-5)
    c2 = np.ones(5, np.float32)
    np.testing.assert_allclose(eqfuse.compile(path, params={"c": c2})(a), a @ b + c2, rtol=1e-4, atol=1e-5)


@pytest.mark.heavy
def test_compiled_conv_batchnorm_softmax(tmp_path):
    x, w = rng.standard_normal((2, 3, 6, 6)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    mean, var = rng.standard_normal(4).astype(np.float32), (np.abs(rng.standard_normal(4)) + 0.5).astype(np.float32)
    gamma, beta = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    m = model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
               helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["b"], epsilon=1e-3),
               helper.make_node("Softmax", ["b"], ["y"], axis=1)],
              [("x", [2, 3, 6, 6])], [("y", [2, 4, 3, 3])],
              {"w": w, "mean": mean, "var": var, "gamma": gamma, "beta": beta})
    from eqfuse.ir.ops import OPS

    conv = OPS["conv2d"].numpy([x, w], {"stride": 2, "padding": 1})
    sh = (1, -1, 1, 1)
    bn = (conv - mean.reshape(sh)) / np.sqrt(var.reshape(sh) + 1e-3) * gamma.reshape(sh) + beta.reshape(sh)
    e = np.exp(bn - bn.max(axis=1, keepdims=True))
    mod = eqfuse.compile(graph_text(import_onnx(m)), params=onnx_params(m))
    np.testing.assert_allclose(mod(x), e / e.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-5)


@pytest.mark.heavy
def test_cli_check_and_errors(tmp_path):
    good = tmp_path / "m.onnx"
    onnx.save(model([helper.make_node("Relu", ["x"], ["y"])], [("x", ["N", 3])], [("y", ["N", 3])]), good)
    r = cli("check", good)
    assert (r.returncode, r.stdout.strip()) == (0, "g(x: f32[N, 3]) -> f32[N, 3]"), r.stderr
    r = cli("check", good, "--dim", "N=5")
    assert r.stdout.strip() == "g(x: f32[5, 3]) -> f32[5, 3]", r.stderr

    bad = tmp_path / "bad.onnx"
    onnx.save(model([helper.make_node("Mod", ["x", "x"], ["y"], name="Mod_12")],
                    [("x", [3])], [("y", [3])]), bad)
    r = cli("check", bad)
    assert r.returncode == 2
    assert "unsupported ONNX op 'Mod' in node 'Mod_12'" in r.stderr
    assert "Traceback" not in r.stderr

    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    r = cli("check", junk)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    r = cli("check", tmp_path / "missing.onnx")
    assert r.returncode == 2 and "no such file" in r.stderr
