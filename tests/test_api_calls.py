"""The Python API as a user expects: keyword calls, dims= checked like --dim, kernels and repr
before the first call, one report shape in mod.report and `eqfuse opt --report json`."""

import json

import numpy as np
import pytest
from helpers import ROOT

import eqfuse
from eqfuse import ArgumentError, EqfuseError
from eqfuse.cli.main import main

SRC = """\
graph lin(x: f32[B, 4], w: f32[4, 3], b: f32[3]) -> f32[B, 3] {
    return relu(x @ w + b)
}
graph scale(y: f32[T]) -> f32[T] {
    return y * 2
}
"""


@pytest.fixture(scope="module")
def mod():
    return eqfuse.compile(SRC)


def arrays(batch=2):
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in
            {"x": (batch, 4), "w": (4, 3), "b": (3,)}.items()}


@pytest.mark.heavy
def test_keyword_and_mixed_calls_agree_with_positional_ones(mod):
    a = arrays()
    want = eqfuse.reference(SRC)(*a.values())
    np.testing.assert_allclose(mod(*a.values()), want, rtol=1e-5)
    np.testing.assert_allclose(mod(**a), want, rtol=1e-5)
    np.testing.assert_allclose(mod(a["x"], b=a["b"], w=a["w"]), want, rtol=1e-5)
    np.testing.assert_allclose(mod.lin(b=a["b"], x=a["x"], w=a["w"]), want, rtol=1e-5)


@pytest.mark.parametrize("call, message", [
    (lambda m, a: m(a["x"], x=a["x"], w=a["w"], b=a["b"]), r"lin\(\): parameter 'x' given twice, by position and by keyword"),
    (lambda m, a: m(x=a["x"], w=a["w"]), r"lin\(\) is missing the array for b$"),
    (lambda m, a: m(a["x"]), r"lin\(\) takes 3 arrays \(x, w, b\), got 1"),
    (lambda m, a: m(x=a["x"], ww=a["w"], b=a["b"]), r"lin\(\) has no parameter 'ww' \(parameters: x, w, b\); did you mean 'w'\?"),
    (lambda m, a: m(a["x"], a["w"], a["b"], a["b"], b=a["b"]), r"lin\(\) takes 3 positional arrays \(x, w, b\), got 4"),
])
def test_bad_keyword_calls_name_the_parameter(mod, call, message):
    with pytest.raises(ArgumentError, match=message):
        call(mod, arrays())


@pytest.mark.heavy  # (the fast tier's time)
def test_a_parameter_bound_by_params_cannot_be_passed_by_keyword():
    a = arrays()
    m = eqfuse.compile(SRC, params={"w": a["w"]})
    np.testing.assert_allclose(m(x=a["x"], b=a["b"]), eqfuse.reference(SRC)(*a.values()), rtol=1e-5)
    with pytest.raises(ArgumentError, match="parameter 'w' is bound by params="):
        m(x=a["x"], w=a["w"], b=a["b"])


@pytest.mark.parametrize("dims, message", [
    ({"b": 4}, r"dims= names 'b', which is not a dimension of the model \(its named dimensions: B, T\)"),
    ({"B": 0}, "dims=: 'B' expects a positive integer, got 0"),
    ({"T": -3}, "dims=: 'T' expects a positive integer, got -3"),
    ({"B": 2.0}, "dims=: 'B' expects a positive integer, got 2.0"),
])
def test_dims_are_checked_like_the_command_line(dims, message):
    with pytest.raises(ArgumentError, match=message):
        eqfuse.compile(SRC, dims=dims)


def test_an_empty_model_is_named_as_such():
    for src in ("", "  \n"):
        with pytest.raises(EqfuseError, match="the model is empty"):
            eqfuse.compile(src)


@pytest.mark.heavy  # (the fast tier's time)
def test_kernels_and_repr_before_and_after_the_first_call():
    m = eqfuse.compile(SRC, dims={"T": 5})
    assert [k.graph for k in m.kernels] == ["scale"]  # lin waits for B
    assert repr(m.lin) == ("<eqfuse function lin(x, w, b): compiled at the first call (B unbound); "
                           "batch dim B at any size, buckets chosen at the first call>")
    assert repr(m.scale) == "<eqfuse function scale(y): 1 kernel>"
    m(**arrays())
    assert {k.graph for k in m.kernels} == {"lin", "scale"}
    assert repr(m.lin) == "<eqfuse function lin(x, w, b): 1 kernel; batch dim B at any size, compiled at 1, 2>"
    from eqfuse.runtime.module import Module

    assert "at its first call" in Module.kernels.__doc__


def test_report_json_and_mod_report_have_one_shape(tmp_path, capsys, mod):
    model = tmp_path / "two.g"
    model.write_text(SRC)
    assert main(["opt", str(model), "--report", "json"]) == 0
    several = json.loads(capsys.readouterr().out)
    assert list(several) == ["lin", "scale"] == list(mod.report)
    for name, r in several.items():
        assert r["graph_name"] == name and set(r) >= {"kernels_after", "bytes_after", "stop_reason", "graph"}
        # mod.report adds what compile did (folded)
        assert set(r) <= set(mod.report[name])
    assert main(["opt", str(model), "--report", "json", "--graph", "scale"]) == 0
    one = json.loads(capsys.readouterr().out)  # one graph: its report itself (SPEC 3)
    assert one["graph_name"] == "scale" and one["graph"].startswith("graph scale(")
    assert eqfuse.compile(SRC.split("graph scale")[0]).report["graph_name"] == "lin"


def test_the_reference_takes_keyword_calls_too():
    ref = eqfuse.reference(str(ROOT / "examples" / "mlp.g"))
    rng = np.random.default_rng(0)
    x, w1, b1 = rng.standard_normal((2, 784), np.float32), rng.standard_normal((784, 1024), np.float32), \
        rng.standard_normal(1024, np.float32)
    w2, b2 = rng.standard_normal((1024, 10), np.float32), rng.standard_normal(10, np.float32)
    np.testing.assert_array_equal(ref(x, w1, b1, w2=w2, b2=b2), ref(x, w1, b1, w2, b2))
    np.testing.assert_array_equal(ref.mlp(b2=b2, w2=w2, b1=b1, w1=w1, x=x), ref(x, w1, b1, w2, b2))
    with pytest.raises(eqfuse.ArgumentError, match="has no parameter 'w3'"):
        ref(x, w1, b1, w2, w3=b2)
    with pytest.raises(eqfuse.ArgumentError, match="missing the array for b2"):
        ref(x, w1, b1, w2=w2)
