"""The onnx.backend.base.Backend: both engines (compiled C and the numpy reference) give the
same answers; non-float inputs (a Reshape's shape) are folded per value."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from eqfuse import onnx_backend  # noqa: E402
from eqfuse.onnx_backend import EqfuseBackend  # noqa: E402


def mlp():
    rng = np.random.default_rng(1)
    w, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 3])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g), w, b


@pytest.mark.parametrize("engine", ["reference", "compile"])
def test_engines_agree_with_numpy(engine):
    m, w, b = mlp()
    rep = EqfuseBackend.prepare(m, engine=engine)
    x = np.random.default_rng(2).standard_normal((5, 4)).astype(np.float32)
    (y,) = rep.run([x])
    np.testing.assert_allclose(y, np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-5)
    assert rep.run({"x": x}).y.shape == (5, 3)  # outputs by name too


def test_engine_switch(monkeypatch):
    """compile by default (never a silent fallback to the reference); the env var chooses."""
    onnx_backend.set_engine(None)
    monkeypatch.delenv("EQFUSE_ONNX_ENGINE", raising=False)
    assert onnx_backend.engine() == "compile"
    onnx_backend.set_engine(None)
    monkeypatch.setenv("EQFUSE_ONNX_ENGINE", "reference")
    assert onnx_backend.engine() == "reference"
    onnx_backend.set_engine(None)
    with pytest.raises(ValueError):
        onnx_backend.set_engine("gpu")


@pytest.mark.heavy
def test_supports_device_and_run_node():
    assert EqfuseBackend.supports_device("CPU")
    assert not EqfuseBackend.supports_device("CUDA")
    x = np.array([[-1, 2], [3, -4]], np.float32)
    (y,) = EqfuseBackend.run_node(helper.make_node("Relu", ["x"], ["y"]), [x])
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_integer_inputs_are_folded_per_value():
    g = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "r",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                           helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                          [helper.make_empty_tensor_value_info("y")])
    rep = EqfuseBackend.prepare(helper.make_model(g))
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    assert rep.run([x, np.array([3, 4])])[0].shape == (3, 4)
    assert rep.run([x, np.array([-1, 2])])[0].shape == (6, 2)


def test_wrong_inputs_are_eqfuse_errors():
    from eqfuse.errors import EqfuseError

    m, _, _ = mlp()
    rep = EqfuseBackend.prepare(m)
    with pytest.raises(EqfuseError):
        rep.run([])
    with pytest.raises(EqfuseError):
        rep.run([np.zeros((5, 7), np.float32)])
