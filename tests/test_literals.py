"""Number literals round-trip (issue 28 item 2): a decimal means the float32 nearest to its exact
value (ties to even), so that every f32 the printer writes, in a graph or in generated C, reads
back as the same bits: +-FLT_MAX (whose shortest text, 3.4028235e+38, lies a little above it),
subnormals, -0, inf and nan (compared as nan: payloads and signs are not kept).
"""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from helpers import load_text, nearest_f32, one_graph, run
from hypothesis import example, given, settings
from hypothesis import strategies as st

import eqfuse
from eqfuse.errors import EqfuseError
from eqfuse.ir.ops import flit
from eqfuse.ir.printer import fmt_number, module_text

FLT_MAX = float(np.finfo(np.float32).max)  # 3.4028234663852886e+38
TINY = 2.0 ** -149  # the smallest subnormal
OVERFLOW = 2.0 ** 128 * (1 - 2.0 ** -25)  # halfway between FLT_MAX and 2^128: rounds to inf


def bits(v) -> int:
    return int(np.float32(v).view(np.uint32))


def f32_of_bits(b: int) -> np.float32:
    return np.uint32(b).view(np.float32)


def same(a, b) -> bool:
    a, b = np.float32(a), np.float32(b)
    return (np.isnan(a) and np.isnan(b)) or bits(a) == bits(b)


# ---------------------------------------------------------------- printed by the printer, parsed back

TEMPLATE = """graph g(x: f32[3]) -> (f32[3], f32[3], f32[3], f32, f32[5]) {
    return x * 7, 7 - x, x - 7, neg(7), pad(x, pads=[1, 1], value=7.5)
}
"""


def with_constant(v: float):
    """The template graph with every constant (and pad's value=) set to v."""
    g = one_graph(TEMPLATE)
    for i, n in enumerate(g.nodes):
        if n.op == "const":
            g.nodes[i] = replace(n, attrs=(("value", v),))
        elif n.op == "pad":
            g.nodes[i] = replace(n, attrs=tuple((k, v if k == "value" else a) for k, a in n.attrs))
    return g


SPECIALS = [FLT_MAX, -FLT_MAX, TINY, -TINY, 0.0, -0.0, math.inf, -math.inf, math.nan,
            float(np.finfo(np.float32).tiny), float(np.float32(1 + 2.0 ** -23)), 16777216.0,
            float(np.nextafter(np.float32(TINY * 2 ** 23), np.float32(0)))]  # the largest subnormal


def check_round_trip(f: np.float32) -> None:
    g = with_constant(float(f))
    text = module_text([g])
    back = one_graph(text)
    assert module_text([back]) == text
    consts = [n.value for n in back.nodes if n.op == "const"] + [n.attr["value"] for n in back.nodes if n.op == "pad"]
    assert len(consts) == 5 and all(same(np.float32(c), f) for c in consts), (text, f)
    x = np.array([1.5, -2.0, 0.0], np.float32)
    for got, want in zip(run(back, [x]), run(g, [x])):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert all(same(a, b) for a, b in zip(got.reshape(-1), want.reshape(-1))), (text, got, want)


@pytest.mark.parametrize("v", SPECIALS, ids=repr)
def test_special_f32_values_print_and_parse_back_to_the_same_bits(v):
    check_round_trip(np.float32(v))


@settings(max_examples=150)  # cheap: 10 ms each
@given(st.integers(min_value=0, max_value=2 ** 32 - 1))
@example(bits(FLT_MAX))
@example(bits(-FLT_MAX))
@example(1)
@example(0x80000001)
@example(0x80000000)
@example(0x7F800000)
@example(0xFF800000)
@example(0x7FC00000)
@example(0xFFC00001)
@example(0x7F800001)
def test_every_f32_bit_pattern_prints_and_parses_back_to_the_same_bits(b):
    check_round_trip(f32_of_bits(b))


def test_how_specials_are_written():
    assert [fmt_number(v) for v in (math.inf, -math.inf, math.nan, -math.nan, -0.0, FLT_MAX, TINY)] == \
        ["inf", "-inf", "nan", "nan", "-0", "3.4028234663852886e+38", "1.401298464324817e-45"]
    src = "graph g(x: f32[2]) -> (f32[3], f32, f32) { return pad(x, pads=[1, 0], value=-inf), neg(inf), -nan }"
    assert module_text(load_text(module_text(load_text(src)))) == (
        "graph g(x: f32[2]) -> (f32[3], f32, f32) {\n"
        "    return pad(x, pads=[1, 0], value=-inf), neg(inf), nan\n"
        "}\n")


# ---------------------------------------------------------------- reading decimals


def parsed(text: str) -> np.float32:
    g = one_graph(f"graph g() -> f32 {{ return {text} }}")
    (out,) = run(g, [])
    assert same(out, np.float32(g.nodes[g.outputs[0]].value))
    return out


@pytest.mark.parametrize("text, want", [
    ("3.4028235e+38", FLT_MAX),  # FLT_MAX's shortest text, as the ONNX importer writes it
    ("-3.4028235e+38", -FLT_MAX),
    ("3.4028234663852886e+38", FLT_MAX),
    ("3.40282356e38", FLT_MAX),
    ("340282356779733661637539395458142568447.999", FLT_MAX),  # a double would round it to OVERFLOW
    ("1e-45", TINY),
    ("7.0064923216240853e-46", 0.0),  # just below half the smallest subnormal (as a double: half)
    ("7.00649232162408535461864791644958065640130970938257885878534141944895541342930300743319094181060791015625e-46",
     0.0),  # exactly half of it: to even
    ("7.0064923216240854e-46", TINY),  # just above it (as a double: half, which numpy rounds to 0)
    ("7.0064923216240862e-46", TINY),
    ("1.0000000596046448", 1 + 2.0 ** -23),  # the double is 1 + 2^-24 (halfway), the decimal above it
    ("1.000000059604644775390625", 1.0),  # exactly halfway: to even
    ("1.0000000596046447", 1.0),
    ("16777217", 16777216.0),
    ("-0", -0.0),
])
def test_a_decimal_means_the_nearest_f32(text, want):
    assert same(nearest_f32(text), want)
    assert same(parsed(text), want)


@pytest.mark.parametrize("text", ["340282356779733661637539395458142568448", "3.4028236e38", "1e39", "1e400"])
def test_a_decimal_rounding_to_infinity_is_an_error(text):
    assert np.isinf(nearest_f32(text))
    with pytest.raises(EqfuseError, match=f"number {text} is too large for f32") as e:
        parsed(text)
    assert e.value.pos.line == 1 and e.value.pos.col == 27


def test_a_number_rounding_to_infinity_is_refused_with_exit_status_2(tmp_path):
    path = tmp_path / "big.g"
    path.write_text("graph g(x: f32[4]) -> f32[4] {\n    return x * -3.40282357e+38\n}\n")
    r = subprocess.run([sys.executable, "-m", "eqfuse", "opt", str(path)], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.startswith(f"{path}:2:17: error: number 3.40282357e+38 is too large for f32\n"), r.stderr
    assert "                ^^^^^^^^^^^^^^" in r.stderr


def halfway_decimals():
    """Decimals within about 1e-25 (relative) of an f32 halfway point, on either side or on it:
    where a double rounds to the halfway point and np.float32 of it can pick the wrong neighbour."""
    def make(b, nudge):
        f = f32_of_bits(b)
        with np.errstate(over="ignore"):
            n = np.nextafter(f, np.float32(np.inf))
        hi = Fraction(2) ** 128 if np.isinf(n) else Fraction(float(n))
        half = (Fraction(float(f)) + hi) / 2
        x = half * (1 + Fraction(nudge, 10 ** 25))
        digits = 200  # enough for the nudge, and halfway itself (a multiple of 2^-150) is exact
        return f"{x.numerator * 10 ** digits // x.denominator}e-{digits}"
    return st.builds(make, st.integers(0, 0x7F7FFFFF), st.integers(-1000, 1000))


@given(st.one_of(
    halfway_decimals(),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.builds(lambda m, e: f"{m}e{e}", st.integers(0, 10 ** 20), st.integers(-70, 40)),
))
def test_random_decimals_read_as_the_nearest_f32_or_are_refused(text):
    want = nearest_f32(text)
    if np.isinf(want):
        with pytest.raises(EqfuseError, match="too large for f32"):
            parsed(text.lstrip("-"))
        return
    got = parsed(text.lstrip("-"))
    assert same(got, abs(want)), (text, got, want)


# ---------------------------------------------------------------- through the C backend


def test_c_literals_keep_the_bits(tmp_path):
    """flit's text of f32 values, read by the C compiler: one program prints the bits of each."""
    rng = np.random.default_rng(0)
    values = [np.float32(v) for v in SPECIALS] + list(rng.integers(0, 2 ** 32, 3000, dtype=np.uint64)
                                                      .astype(np.uint32).view(np.float32))
    values += [f32_of_bits(b) for b in (1, 2, 3, 0x007FFFFF, 0x00800000, 0x7F7FFFFE, 0x80000001)]
    # doubles halfway between two f32s whose shortest text is not exactly halfway
    doubles = [float(np.float32(1.0)) + 2.0 ** -24, TINY * 1.5, float(np.float32(3.0e-40)) + TINY / 2, FLT_MAX * 1.0000000001]
    lits = [flit(float(v)) for v in values] + [flit(d) for d in doubles]
    want = [bits(v) if not np.isnan(v) else None for v in values] + [bits(np.float32(d)) for d in doubles]
    src = tmp_path / "lits.c"
    src.write_text("#include <math.h>\n#include <stdio.h>\n#include <string.h>\n"
                   f"static const float v[{len(lits)}] = {{\n" + ",\n".join(lits) + "\n};\n"
                   "int main(void) { for (unsigned i = 0; i < sizeof v / sizeof v[0]; i++) {\n"
                   "    unsigned u; memcpy(&u, &v[i], 4); printf(\"%08x\\n\", u); } return 0; }\n")
    exe = tmp_path / "lits"
    subprocess.run(["gcc", "-O2", "-std=gnu11", "-Wall", "-Werror", "-fno-math-errno", "-fno-trapping-math",
                    "-o", str(exe), str(src), "-lm"], check=True)
    got = [int(line, 16) for line in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    for lit, g, w in zip(lits, got, want):
        if w is None:
            assert lit == "NAN" and (g & 0x7F800000) == 0x7F800000 and g & 0x007FFFFF, lit
        else:
            assert g == w, (lit, hex(g), hex(w))


@pytest.mark.parametrize("const", ["-3.4028235e+38", "1e-45"])
def test_where_with_extreme_constants_compiles_to_the_reference(const):
    src = f"""graph g(mask: bool[4, 16], x: f32[4, 16]) -> (f32[4, 16], f32[4, 16]) {{
    m = where(mask, 0, {const})
    return x + m, where(mask, x, {const})
}}"""
    rng = np.random.default_rng(1)
    mask = rng.random((4, 16)) < 0.5
    x = rng.standard_normal((4, 16)).astype(np.float32)
    got = eqfuse.compile(src)(mask, x)
    want = eqfuse.reference(src)(mask, x)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == np.float32
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
    assert np.float32(const) in want[1]


# ---------------------------------------------------------------- an ONNX attention mask


def test_onnx_where_with_the_f32_minimum_matches_onnxruntime(tmp_path):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    from eqfuse.frontend.onnx_import import import_model
    from eqfuse.ir.printer import graph_text

    lowest = np.float32(-3.4028234663852886e+38)  # torch.finfo(torch.float32).min
    assert lowest == np.finfo(np.float32).min
    nodes = [
        helper.make_node("Where", ["mask", "zero", "lowest"], ["bias"]),
        helper.make_node("Add", ["x", "bias"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["y"], axis=-1),
    ]
    g = helper.make_graph(
        nodes, "masked",
        [helper.make_tensor_value_info("mask", TensorProto.BOOL, [2, 8]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [numpy_helper.from_array(np.array(0, np.float32), "zero"), numpy_helper.from_array(np.array(lowest), "lowest")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    path = tmp_path / "masked.onnx"
    onnx.save(m, str(path))

    # the imported graph prints as text that reads back (it did not: "too large for f32")
    text = graph_text(import_model(m).graph)
    assert "-3.4028235e+38" in text
    assert graph_text(load_text(text)[0]) == text

    rng = np.random.default_rng(2)
    mask = rng.random((2, 8)) < 0.6
    mask[:, 0] = True
    x = rng.standard_normal((2, 8)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"mask": mask, "x": x})[0]
    got = eqfuse.compile(str(path))(mask=mask, x=x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert (got[~mask] == 0).all()
