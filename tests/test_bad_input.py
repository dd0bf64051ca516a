"""Issue 13, item 7: bad input is one clear error with exit 2 (never a traceback, never exit 3):
huge ranks and sizes, huge --dim/dims= bindings, damaged ONNX data, unwritable emit outputs."""

from __future__ import annotations

import re

import numpy as np
import pytest

import eqfuse
from eqfuse.cli.main import main

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def run_cli(capsys, *argv) -> tuple[int, str]:
    status = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    return status, err


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_300_named_dims_are_refused_at_check_and_opt(tmp_path, capsys):
    dims = ", ".join(f"D{i}" for i in range(300))
    model = write(tmp_path, "rank.g", f"graph g(x: f32[{dims}]) -> f32 {{\n return sum(x)\n}}\n")
    for cmd in ("check", "opt"):
        status, err = run_cli(capsys, cmd, model)
        assert status == 2 and "a tensor of rank 300 has too many dimensions (at most 64" in err, err


def test_an_op_whose_result_has_too_many_dims_is_refused(tmp_path, capsys):
    shape = ", ".join(["1"] * 99 + ["4"])
    model = write(tmp_path, "r.g", f"graph g(x: f32[4]) -> f32 {{\n return sum(reshape(x, shape=[{shape}]))\n}}\n")
    status, err = run_cli(capsys, "check", model)
    assert status == 2 and err.startswith(f"{model}:2:13: error: a tensor of rank 100 has too many"), err


def test_an_intermediate_too_large_is_refused_where_it_is_made(tmp_path, capsys):
    model = write(tmp_path, "bc.g", "graph g(x: f32[10000000, 1], y: f32[1, 10000000]) -> f32 {\n return sum(x + y)\n}\n")
    status, err = run_cli(capsys, "check", model)
    assert status == 2 and err.startswith(f"{model}:2:15: error: a tensor of 100000000000000 elements is too large"), err


NM = "graph g(x: f32[N, 1], y: f32[1, M]) -> f32 {\n z = x * y\n return sum(z)\n}\n"
TOO_BIG = "N=10000000, M=10000000 make 'z' (f32[N, M]) a tensor of 100000000000000 elements, too large"


@pytest.mark.parametrize("cmd", ["check", "opt", "emit", "lower"])
def test_dims_so_large_an_intermediate_overflows_name_the_dims(tmp_path, capsys, cmd):
    model = write(tmp_path, "nm.g", NM)
    status, err = run_cli(capsys, cmd, model, "--dim", "N=10000000", "--dim", "M=10000000")
    assert status == 2 and err.startswith(f"error: --dim {TOO_BIG}"), err


def test_dims_keyword_so_large_an_intermediate_overflows_is_an_argument_error():
    with pytest.raises(eqfuse.ArgumentError, match=re.escape(f"dims=: {TOO_BIG}")):
        eqfuse.compile(NM, dims={"N": 10_000_000, "M": 10_000_000})


def test_dims_that_fit_still_work(tmp_path, capsys):
    model = write(tmp_path, "nm.g", NM)
    status, _ = run_cli(capsys, "check", model, "--dim", "N=1000000", "--dim", "M=1000000")
    assert status == 0


@pytest.mark.parametrize("where", ["{tmp}/file/sub", "{tmp}/file", "{tmp}/dir"])
def test_emit_onto_an_existing_file_or_into_a_file_exits_2(tmp_path, capsys, where):
    model = write(tmp_path, "e.g", "graph g(x: f32[4]) -> f32[4] {\n return exp(x)\n}\n")
    (tmp_path / "file").write_text("keep")
    (tmp_path / "dir" / "g.c").mkdir(parents=True)  # g.c is a directory: cannot be written
    out = where.format(tmp=tmp_path)
    status, err = run_cli(capsys, "emit", model, "-o", out)
    assert status == 2 and err.startswith("error: "), err
    assert (tmp_path / "file").read_text() == "keep"


# ------------------------------------------------------------------ ONNX files


def onnx_model(tmp_path, nodes, x_shape, inits=(), y_shape=None):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], list(inits))
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def raw_tensor(name, dims, raw: bytes):
    t = TensorProto()
    t.name, t.data_type = name, TensorProto.FLOAT
    t.dims.extend(dims)
    t.raw_data = raw
    return t


def short_float_data():
    t = TensorProto()
    t.name, t.data_type = "w", TensorProto.FLOAT
    t.dims.extend([4, 4])
    t.float_data.extend([1.0, 2.0, 3.0])
    return t


BAD_INITS = {
    "short raw_data": (raw_tensor("w", [4, 4], b"\0" * 10), "initializer 'w': its data does not match its dims [4, 4]"),
    "few float_data": (short_float_data(), "initializer 'w': its data does not match its dims [4, 4]"),
    "huge dims": (raw_tensor("w", [10**11, 10**11], b"\0" * 16), "initializer 'w' has 10000000000000000000000 elements"),
    "negative dim": (raw_tensor("w", [-4, 4], b"\0" * 64), "initializer 'w' has dimension -4 at axis 0"),
}


@pytest.mark.parametrize("case", list(BAD_INITS))
@pytest.mark.parametrize("cmd", ["check", "opt"])
def test_a_damaged_onnx_initializer_exits_2(tmp_path, capsys, case, cmd):
    init, message = BAD_INITS[case]
    path = onnx_model(tmp_path, [helper.make_node("Add", ["x", "w"], ["y"])], [4, 4], [init])
    status, err = run_cli(capsys, cmd, path)
    assert status == 2 and err.startswith(f"error: {message}"), err


@pytest.mark.parametrize("shape", [[16.0], [1e30]])
def test_a_reshape_with_a_float_shape_exits_2(tmp_path, capsys, shape):
    s = numpy_helper.from_array(np.array(shape, np.float32), "s")
    path = onnx_model(tmp_path, [helper.make_node("Reshape", ["x", "s"], ["y"])], [4, 4], [s])
    status, err = run_cli(capsys, "check", path)
    assert status == 2 and err.startswith("error: Reshape: input shape must be integers (int64), not float32"), err


@pytest.mark.parametrize("shape, message", [
    ([-4, 4], "input 'x' has dimension -4 at axis 0; eqfuse needs positive dimensions"),
    ([4, 0], "input 'x' has dimension 0 at axis 1; eqfuse needs positive dimensions"),
    ([10**12, 10**12], "input 'x' has 1000000000000000000000000 elements, too large"),
])
@pytest.mark.parametrize("cmd", ["check", "opt"])
def test_onnx_inputs_with_bad_dims_exit_2(tmp_path, capsys, shape, message, cmd):
    path = onnx_model(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], shape, y_shape=shape)
    status, err = run_cli(capsys, cmd, path)
    assert status == 2 and err.startswith(f"error: {message}"), err


def test_an_onnx_op_whose_result_is_too_large_names_the_node(tmp_path, capsys):
    shape = numpy_helper.from_array(np.array([10**7, 10**7], np.int64), "s")
    path = onnx_model(tmp_path, [helper.make_node("Expand", ["x", "s"], ["y"], name="big")], [1, 1], [shape])
    status, err = run_cli(capsys, "check", path)
    assert status == 2 and "a tensor of 100000000000000 elements is too large" in err and "node 'big'" in err, err
