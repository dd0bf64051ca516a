"""Issue 13, item 10: mutated .g, .rw and .onnx inputs through the command line. Whatever the
damage (a changed byte, a token deleted or doubled, a number replaced), `eqfuse check`/`opt`/
`rules` end cleanly: exit 0, or exit 2 with one error message; never a traceback, an internal
error (exit 3) or a signal. Few examples by default; the `slow` profile runs many more."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eqfuse.cli.main import main

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
G_SEEDS = {p.name: p.read_text() for p in [*(ROOT / "examples").glob("*.g"), *(ROOT / "tests/good").glob("*.g")]}
SMALL_G = ["elementwise.g", "pointwise.g", "rows.g", "reduction.g"]  # cheap enough to optimize
RW_SEED = "\n".join((ROOT / "eqfuse/optimizer/rules/algebra.rw").read_text().splitlines()[:40]) + "\n"
RW_GRAPH = "graph g(a: f32[N, 8], b: f32[8]) -> f32[N, 8] {\n return relu(a * b + 0.5) - a\n}\n"
NUMBERS = ["0", "-1", "1", "3", "-7", "0.5", "1e30", "1e400", "99999999999999999999", "2147483648",
           "-9223372036854775809", "1e-45", "nan", "inf", "00", "1.", ".5", "1_0", "0x10"]
TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\S")
NUMBER = re.compile(r"\d+(?:\.\d*)?(?:[eE][-+]?\d+)?")
ODD_CHARS = "()[]{},:;=?<>+-*/@#.\"'\\\t\n 0123456789azAZ_\u00e9\u2028\x00\x7f"


@st.composite
def mutated_text(draw, seed: str) -> str:
    text = seed
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "delete", "duplicate", "number", "truncate"]))
        if kind == "flip":
            i = draw(st.integers(0, max(0, len(text) - 1)))
            text = text[:i] + draw(st.sampled_from(ODD_CHARS)) + text[i + 1:]
        elif kind == "truncate":
            text = text[:draw(st.integers(0, len(text)))]
        elif kind == "number":
            spans = [m.span() for m in NUMBER.finditer(text)]
            if spans:
                a, b = draw(st.sampled_from(spans))
                text = text[:a] + draw(st.sampled_from(NUMBERS)) + text[b:]
        else:
            spans = [m.span() for m in TOKEN.finditer(text)]
            if spans:
                a, b = draw(st.sampled_from(spans))
                text = text[:a] + text[b:] if kind == "delete" else text[:b] + " " + text[a:b] + text[b:]
    return text


def clean(argv: list[str]) -> tuple[int, str]:
    """Run the CLI in-process; the outcome must be clean (see the module docstring)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    msg = err.getvalue()
    assert "Traceback" not in msg and "internal error" not in msg, msg
    assert status in (0, 2), (status, msg)
    if status == 2:
        assert msg.count("error:") == 1, msg
    return status, msg


# A few fixed inputs from earlier fuzz runs, plus whatever the examples draw.
FAST = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))


def check_g(tmp_path_factory, seed_name, text, optimize):
    path = tmp_path_factory.mktemp("g") / "m.g"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    status, _ = clean(["check", str(path)])
    if optimize and status == 0:
        clean(["opt", str(path), "--dim", "N=7", "--time-limit", "5"] if "N" in text else ["opt", str(path), "--time-limit", "5"])


g_case = st.sampled_from(sorted(G_SEEDS)).flatmap(lambda n: st.tuples(st.just(n), mutated_text(G_SEEDS[n])))
small_g_case = st.sampled_from(SMALL_G).flatmap(lambda n: st.tuples(st.just(n), mutated_text(G_SEEDS[n])))


@FAST
@given(case=g_case)
def test_mutated_g_checks_cleanly(tmp_path_factory, case):
    check_g(tmp_path_factory, *case, optimize=False)


@pytest.mark.heavy
@FAST
@given(case=small_g_case)
def test_mutated_g_optimizes_cleanly(tmp_path_factory, case):
    check_g(tmp_path_factory, *case, optimize=True)


def check_rw(tmp_path_factory, text):
    d = tmp_path_factory.mktemp("rw")
    (d / "r.rw").write_bytes(text.encode("utf-8", "surrogatepass"))
    (d / "g.g").write_text(RW_GRAPH)
    status, _ = clean(["rules", "--rules", str(d / "r.rw")])
    if status == 0:
        clean(["opt", str(d / "g.g"), "--rules", str(d / "r.rw"), "--dim", "N=5", "--iter-limit", "4",
               "--time-limit", "5"])


@pytest.mark.heavy
@FAST
@given(text=mutated_text(RW_SEED))
def test_mutated_rules_load_cleanly(tmp_path_factory, text):
    check_rw(tmp_path_factory, text)


# ------------------------------------------------------------------ ONNX


def onnx_seed() -> bytes:
    import numpy as np

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    s = numpy_helper.from_array(np.array([-1, 2, 2], np.int64), "s")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["q"]),
             helper.make_node("Softmax", ["q"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 2, 2])], [w, b, s])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


ONNX_SEED = onnx_seed()
ONNX_NUMBERS = [0, -1, 1, 2, 3, 7, 2**31, 2**40, 10**12, -(2**62)]


def numeric_fields(m):
    """(message, field, index) of every int in the model that steers shapes or data."""
    out = []
    g = m.graph
    for t in g.initializer:
        out += [(t, "dims", i) for i in range(len(t.dims))] + [(t, "int64_data", i) for i in range(len(t.int64_data))]
        out.append((t, "data_type", None))
    for vi in [*g.input, *g.output]:
        out += [(d, "dim_value", None) for d in vi.type.tensor_type.shape.dim]
    for n in g.node:
        out += [(a, "i", None) for a in n.attribute]
    return out


@st.composite
def mutated_onnx(draw) -> bytes:
    m = onnx.ModelProto()
    m.ParseFromString(ONNX_SEED)
    for t in m.graph.initializer:  # int64 values as a repeated field, so they can be changed one by one
        if t.data_type == TensorProto.INT64:
            vals = numpy_helper.to_array(t).tolist()
            t.ClearField("raw_data")
            t.int64_data.extend(vals)
    for _ in range(draw(st.integers(0, 3))):
        msg, field, i = draw(st.sampled_from(numeric_fields(m)))
        v = draw(st.sampled_from(ONNX_NUMBERS))
        if i is None:
            setattr(msg, field, min(abs(v), 30) if field == "data_type" else v)
        else:
            getattr(msg, field)[i] = v
    if draw(st.booleans()):
        nodes = list(m.graph.node)
        k = draw(st.integers(0, len(nodes) - 1))
        if draw(st.booleans()):
            del m.graph.node[k]
        else:
            m.graph.node.insert(k, nodes[k])
    data = bytearray(m.SerializeToString())
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(data) - 1))
        data[i] = draw(st.integers(0, 255))
    if draw(st.integers(0, 5)) == 0:
        data = data[:draw(st.integers(0, len(data)))]
    return bytes(data)


def check_onnx(tmp_path_factory, data, optimize=True):
    path = tmp_path_factory.mktemp("onnx") / "m.onnx"
    path.write_bytes(data)
    status, _ = clean(["check", str(path)])
    if optimize and status == 0:
        clean(["opt", str(path), "--time-limit", "5"])


@FAST
@given(data=mutated_onnx())
def test_mutated_onnx_registry_cleanly(tmp_path_factory, data):
    check_onnx(tmp_path_factory, data)


def _damaged_softmax_axis() -> bytes:
    """test_mutated_onnx_slow's finding: the Softmax's axis attribute with its type byte changed
    (an attribute of type UNDEFINED, whose value onnx's helper reads as None)."""
    m = onnx.ModelProto()
    m.ParseFromString(ONNX_SEED)
    (axis,) = m.graph.node[-1].attribute
    axis.type = onnx.AttributeProto.UNDEFINED
    return m.SerializeToString()


def _too_few_inputs(k: int) -> bytes:
    """test_mutated_onnx_slow's finding (an IndexError in a handler): node k with no input."""
    m = onnx.ModelProto()
    m.ParseFromString(ONNX_SEED)
    del m.graph.node[k].input[:]
    return m.SerializeToString()


def test_found_by_the_fast_onnx_fuzzer_an_input_of_2_31_rows_plans_at_once(tmp_path_factory):
    """test_mutated_onnx_registry_cleanly's finding: the seed's x with 2147483648 rows. Its
    skinny GEMM's tile was searched over every count of row groups (machine.skinny_tile), and
    `opt` planned for minutes (the test's 255 s in one run of the suite)."""
    m = onnx.ModelProto()
    m.ParseFromString(ONNX_SEED)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2**31
    path = tmp_path_factory.mktemp("onnx") / "m.onnx"
    path.write_bytes(m.SerializeToString())
    assert clean(["opt", str(path), "--time-limit", "5"]) == (0, "")


def _dim_name_not_utf8() -> bytes:
    """test_mutated_onnx_registry_cleanly's finding: x's dim name with a byte that is not UTF-8
    (protobuf then reads the field as bytes, and the importer failed on it with a TypeError)."""
    m = onnx.ModelProto()
    m.ParseFromString(ONNX_SEED)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "Bqzq"
    return m.SerializeToString().replace(b"Bqzq", b"B\x80zq")


@pytest.mark.parametrize("data, message", [
    (_dim_name_not_utf8(), "not a readable ONNX model (its graph.input[0].type.tensor_type.shape.dim[0].dim_param "
                           "is not UTF-8 text)"),
    (_damaged_softmax_axis(), "Softmax: attribute 'axis' has no value (attribute type 0) in node 'y'"),
    (_too_few_inputs(4), "ONNX op 'Softmax' takes 1 input, not 0 in node 'y'"),
    (_too_few_inputs(3), "ONNX op 'Reshape' takes 2 inputs, not 0 in node 'q'"),
    (_too_few_inputs(0), "ONNX op 'MatMul' takes 2 inputs, not 0 in node 'h'"),
], ids=["dim-name-not-utf8", "untyped-attribute", "softmax-no-input", "reshape-no-input", "matmul-no-input"])
def test_found_by_the_slow_onnx_fuzzer(tmp_path_factory, data, message):
    path = tmp_path_factory.mktemp("onnx") / "m.onnx"
    path.write_bytes(data)
    for argv in (["check", str(path)], ["opt", str(path)]):
        status, msg = clean(argv)
        assert status == 2 and message in msg, msg


# ------------------------------------------------------------------ the larger profile


@pytest.mark.extended
@SLOW
@given(case=g_case)
def test_mutated_g_slow(tmp_path_factory, case):
    check_g(tmp_path_factory, *case, optimize=case[0] in SMALL_G)


@pytest.mark.extended
@SLOW
@given(text=mutated_text(RW_SEED))
def test_mutated_rules_slow(tmp_path_factory, text):
    check_rw(tmp_path_factory, text)


@pytest.mark.extended
@SLOW
@given(data=mutated_onnx())
def test_mutated_onnx_slow(tmp_path_factory, data):
    check_onnx(tmp_path_factory, data)


# ------------------------------------------------------------------ a real process: no signal


@pytest.mark.extended  # (the suite's budget: the in-process fuzzers above run in the default run)
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(g=g_case, data=mutated_onnx())
def test_mutated_inputs_in_a_subprocess_exit_cleanly(tmp_path_factory, g, data):
    d = tmp_path_factory.mktemp("proc")
    (d / "m.g").write_bytes(g[1].encode("utf-8", "surrogatepass"))
    (d / "m.onnx").write_bytes(data)
    for model in ("m.g", "m.onnx"):
        p = subprocess.run([sys.executable, "-m", "eqfuse", "check", str(d / model)], capture_output=True,
                           text=True, timeout=300, cwd=ROOT)
        assert p.returncode in (0, 2), (p.returncode, p.stderr)  # a signal is a negative code
        assert "Traceback" not in p.stderr and "internal error" not in p.stderr, p.stderr
