"""Reverse-mode differentiation: the derivative rules against finite differences, the joint
graph as text, the errors of `eqfuse grad`, and compiled gradients against the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

import eqfuse
from eqfuse.cli.main import main
from eqfuse.frontend.load import load
from eqfuse.grad import check as C
from eqfuse.grad import grad_graph
from eqfuse.grad import rules as R
from eqfuse.ir.printer import module_text
from eqfuse.ir.reference import evaluate


def test_every_derivative_matches_finite_differences():
    results, untested = C.check_derivatives()
    bad = [(r.case, r.param, r.error) for r in results if not r.ok]
    assert not bad and not untested
    # every op of the cases has a line per float argument, with the rule that produced it
    assert all(r.rules for r in results)


def test_check_finds_a_wrong_derivative(monkeypatch):
    wrong = R.parse_derivatives("rule relu_x: relu(?x) => ?dy where wrt(?x)\n"
                                "rule sum_x: sum(?x, axis=?a, keepdims=?k) => unreduce(?dy, ?x, axis=?a, keepdims=?k) "
                                "where wrt(?x)\nrule mul_a: ?a * ?b => ?dy * ?b where wrt(?a)\n")
    monkeypatch.setattr(R, "derivatives", lambda: tuple(wrong))
    monkeypatch.setattr("eqfuse.grad.vjp.derivatives", lambda: tuple(wrong))
    (res,) = C.check_case("relu(x)", {"x": ((3, 4), C.N)})
    assert not res.ok and res.rules == ("relu_x",)


@pytest.mark.heavy  # (the fast tier's time)
def test_check_grads_command(capsys):
    assert main(["check-grads"]) == 0
    out = capsys.readouterr().out
    assert "OK       d/dw  conv2d(x, w, padding=1)" in out
    assert out.rstrip().endswith("match central finite differences in float64")


@pytest.mark.parametrize("text, message", [
    ("rule r: relu(?x) => ?dy\n", "does not say which argument"),
    ("rule r: relu(?x) => ?z where wrt(?x)\n", "?z is not bound"),
    ("rule r: relu(?x) => unreduce(?dy, ?x) where wrt(?x)\n", "needs the attribute axis="),
    ("rule r: relu(?x) => ?dy where wrt(?y)\n", "names one argument"),
])
def test_bad_derivative_files(text, message):
    with pytest.raises(eqfuse.EqfuseError, match=message.replace("?", r"\?")):
        R.parse_derivatives(text, "d.rw")


MLP = """graph mlp(x: f32[B, 6], w1: f32[6, 16], b1: f32[16], w2: f32[16, 3], y: f32[B, 3]) {
    h = relu(x @ w1 + b1)
    return mean((h @ w2 - y) * (h @ w2 - y)), h
}
"""


def test_grad_command_round_trips(tmp_path, capsys):
    src = tmp_path / "mlp.g"
    src.write_text(MLP)
    out = tmp_path / "mlp_grad.g"
    assert main(["grad", str(src), "--wrt", "w2,b1", "--dim", "B=4", "-o", str(out)]) == 0
    text = out.read_text()
    (g,) = load(text)
    assert module_text([g]) == text
    assert [str(t) for t in g.result_types] == ["f32", "f32[4, 16]", "f32[16, 3]", "f32[16]"]
    assert "d_w2 = " in text and "d_b1 = " in text


@pytest.mark.parametrize("argv, message", [
    (["--wrt", "w3", "--dim", "B=4"], "'w3' is not a parameter of graph mlp"),
    (["--wrt", "w1,w1", "--dim", "B=4"], "'w1' is named twice"),
    (["--wrt", "w1"], "unbound dimension B"),
    (["--wrt", "w1", "--graph", "ids"], "'w1' is not a parameter"),
    (["--wrt", "t", "--graph", "ids"], "the first result of graph ids is the loss and must be an f32 scalar"),
    (["--wrt", "i", "--graph", "ids"], "'i' is i64[5]; only f32 parameters have gradients"),
])
def test_grad_command_errors(tmp_path, capsys, argv, message):
    src = tmp_path / "m.g"
    src.write_text(MLP + "graph ids(i: i64[5], t: f32[7, 2]) { return gather(t, i) }\n")
    assert main(["grad", str(src), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("error:") == 1


def _arrays(rng, g, **domains):
    out = []
    for name, t in g.params:
        if t.dtype == "i64":
            out.append(domains[name])
        else:
            out.append(rng.normal(0, 1, [d for d in t.shape]).astype(np.float32))
    return out


@pytest.mark.heavy  # (a few seconds: the whole suite runs it, the fast tier not)
def test_compiled_gradients_match_the_reference_of_the_joint_graph():
    """An embedding (gather's gradient is scatter_add), layernorm, softmax and a slice: compiled
    gradients against the numpy reference of the same joint graph (verify=True checks every call)."""
    src = """graph emb(ids: i64[6], table: f32[10, 8], g: f32[8], b: f32[8], w: f32[8, 5]) {
        e = layernorm(gather(table, ids), g, b)
        p = softmax(slice(e @ w, axis=1, start=1))
        return sum(p * p)
    }"""
    mod = eqfuse.compile(src, grad=["table", "g", "b", "w"], verify=True)
    rng = np.random.default_rng(0)
    ids = np.array([1, 3, 3, 9, 0, 3], np.int64)
    args = _arrays(rng, load(src)[0], ids=ids)
    out = mod(*args)
    joint = grad_graph(load(src)[0], ["table", "g", "b", "w"])
    for a, b in zip(out, evaluate(joint, args)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert not out[1][[2, 4, 5, 6, 7, 8]].any() and out[1][3].any()  # rows never read get no gradient


@pytest.mark.heavy
def test_unbound_dims_compile_per_binding():
    mod = eqfuse.compile(MLP, grad=["w1", "b1"])
    rng = np.random.default_rng(1)
    for batch in (4, 7):
        args = [rng.normal(0, 1, s).astype(np.float32) for s in ((batch, 6), (6, 16), (16,), (16, 3), (batch, 3))]
        loss, h, dw1, db1 = mod(*args)
        ref = evaluate(grad_graph(load(MLP.replace("B", str(batch)))[0], ["w1", "b1"]), args)
        for a, b in zip((loss, h, dw1, db1), ref):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kw, message", [
    (dict(grad=["w9"]), "grad=: 'w9' is not a parameter"),
    (dict(grad="w1"), "grad= expects a non-empty list"),
])
def test_compile_grad_errors(kw, message):
    with pytest.raises(eqfuse.EqfuseError, match=message):
        eqfuse.compile(MLP, **kw)
