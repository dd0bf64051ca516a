"""The .rw language: parsing into the Rule contract, validation errors, loading, `eqfuse rules`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eqfuse.cli.main import main
from eqfuse.errors import EqfuseError
from eqfuse.frontend.load import load
from eqfuse.optimizer.rule_match import match
from eqfuse.optimizer.rules import (
    AttrVar,
    Cond,
    PKernel,
    PNum,
    POp,
    PVar,
    Rule,
    Test,
    load_rules,
    parse_rules,
    rule_files,
)

ROOT = Path(__file__).resolve().parent.parent
BAD = sorted((Path(__file__).parent / "rules_bad").glob("*.rw"))


def one(text: str) -> Rule:
    rules = parse_rules(text, "t.rw")
    assert len(rules) == 1
    return rules[0]


# ---------------------------------------------------------------- the contract


def test_spec_examples_parse_to_the_contract():
    rules = parse_rules(
        "# Comments as in .g files.\n"
        "rule double_transpose: transpose(transpose(?x, perm=?p), perm=?p) => ?x  where ?p == [1, 0]\n"
        "rule silu_pattern:     ?x * sigmoid(?x) => silu(?x)\n"
        "rule mul_comm:         ?a * ?b <=> ?b * ?a\n", "spec.rw")
    dt, silu, fwd, back = rules
    t_inner = POp("transpose", (PVar("x"),), (("perm", AttrVar("p")),))
    assert dt == Rule("double_transpose", POp("transpose", (t_inner,), (("perm", AttrVar("p")),)), PVar("x"),
                      (Cond(("attr", "p"), "==", (1, 0)),), "spec.rw", 2, dt.text)
    assert dt.text.startswith("rule double_transpose: transpose(") and dt.text.endswith("[1, 0]")
    assert silu.lhs == POp("mul", (PVar("x"), POp("sigmoid", (PVar("x"),), ())), ())
    assert silu.rhs == POp("silu", (PVar("x"),), ())
    assert (fwd.name, fwd.reverse, back.name, back.reverse) == ("mul_comm", False, "mul_comm", True)
    assert back.lhs == fwd.rhs and back.rhs == fwd.lhs and fwd.line == back.line == 4


def test_every_attribute_is_present_with_defaults_and_normalized():
    r = one("rule s: exp(?x) / sum(exp(?x), axis=-1, keepdims=true) => softmax(?x)")
    assert r.rhs == POp("softmax", (PVar("x"),), (("axis", -1), ("zero_nan", False)))
    assert r.lhs.args[1] == POp("sum", (POp("exp", (PVar("x"),), ()),), (("axis", (-1,)), ("keepdims", True)))
    r = one('rule g: gelu(?x, approximate="tanh") => gelu(?x)')
    assert r.lhs.attrs == (("approximate", "tanh"),) and r.rhs.attrs == (("approximate", "none"),)
    with pytest.raises(EqfuseError, match="not bound by the left side"):
        one('rule g: gelu(?x) => gelu(?x, approximate=?a) where ?a == 1')


def test_literals_negative_numbers_and_kernel_blocks():
    r = one("rule k: ?x * -1 + 2.5 => kernel { t = -?x\n  u = t + 2.5\n  u }")
    assert r.lhs == POp("add", (POp("mul", (PVar("x"), PNum(-1.0)), ()), PNum(2.5)), ())
    assert r.rhs == PKernel(POp("add", (POp("neg", (PVar("x"),), ()), PNum(2.5)), ()))


def test_conditions_terms_and_tests():
    r = one("rule c: sum(?x * ?c, axis=?a) => sum(?x, axis=?a) * ?c\n"
            "  where const(?c) and rank(?x) >= 2 and dim(?x, -1) != 3 and size(?x) < 100\n"
            "  and shape(?x) == [2, 4] and ?a == [0]")
    assert r.conds == (Test("const", "c"), Cond(("rank", "x"), ">=", 2), Cond(("dim", "x", -1), "!=", 3),
                       Cond(("size", "x"), "<", 100), Cond(("shape", "x"), "==", (2, 4)),
                       Cond(("attr", "a"), "==", (0,)))


def test_rules_continue_over_lines_and_comments():
    rules = parse_rules("rule a: relu(\n   ?x)   # trailing comment\n  => ?x\n  where rank(?x) == 0\n\n"
                        "# between\nrule b: abs(abs(?x))\n    => abs(?x)\n", "t.rw")
    assert [r.name for r in rules] == ["a", "b"]
    assert rules[0].text == "rule a: relu( ?x) => ?x where rank(?x) == 0"
    assert rules[1].line == 7


def test_empty_and_comment_only_files_have_no_rules():
    assert parse_rules("", "e.rw") == []
    assert parse_rules("# nothing yet\n\n", "e.rw") == []


def test_constant_used_as_attribute():
    r = one("rule e: sqrt(?v + ?eps) => rmsnorm(?v, ?v, eps=?eps) where const(?eps)")
    assert r.rhs.attrs == (("eps", AttrVar("eps")),)


# ---------------------------------------------------------------- errors from examples


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_rule_files(path: Path, capsys):
    head = path.read_text().splitlines()[0]
    m = re.fullmatch(r"# expect: (\d+):(\d+): (.+)", head)
    assert m, f"{path.name} needs a '# expect: LINE:COL: substring' header"
    line, col, want = int(m[1]), int(m[2]), m[3]
    assert main(["rules", "--rules", str(path)]) == 2
    err = capsys.readouterr().err
    first, src, caret = err.splitlines()[:3]
    assert first.startswith(f"{path}:{line}:{col}: error: "), err
    assert want in first, err
    assert caret.strip() and set(caret.strip()) == {"^"} and caret.index("^") == 4 + col - 1, err
    assert "Traceback" not in err
    assert main(["check-rules", str(path)]) == 2


def test_error_corpus_covers_the_spec_cases():
    names = {p.stem for p in BAD}
    assert {"syntax_paren", "unknown_op", "unknown_attr", "unbound_rhs", "unbound_bidir", "bad_cond_fn",
            "bad_cond_var", "duplicate"} <= names


def test_binary_and_missing_rule_files():
    with pytest.raises(EqfuseError, match="binary"):
        parse_rules(b"rule \0", "b.rw")
    with pytest.raises(EqfuseError, match="no such rule file"):
        load_rules(["/nonexistent/x.rw"])


# ---------------------------------------------------------------- loading and the CLI


def test_builtin_files_load_in_sorted_order():
    files = rule_files()
    assert [f.name for f in files] == sorted(f.name for f in files)
    assert {"algebra.rw", "patterns.rw"} <= {f.name for f in files}
    assert all(f.parent.name == "rules" for f in files)  # extra/comm.rw is opt-in
    rules = load_rules()
    assert not {"add_comm", "mul_comm", "add_assoc", "mul_assoc"} & {r.name for r in rules}
    order = [r.file for r in rules]
    assert order == sorted(order, key=lambda f: [str(p) for p in files].index(f))


def test_disable_turns_both_directions_off_and_unknown_names_are_errors(tmp_path):
    user = tmp_path / "u.rw"
    user.write_text("rule my_swap: relu(?a) * ?b <=> ?b * relu(?a)\n")
    rules = load_rules([user])
    assert [r.reverse for r in rules if r.name == "my_swap"] == [False, True]
    assert not [r for r in load_rules([user], ["my_swap"]) if r.name == "my_swap"]
    with pytest.raises(EqfuseError, match="no rule named 'silu_patern'") as e:
        load_rules(disable=["silu_patern"])
    assert "silu_pattern" in str(e.value)


def test_a_user_rule_may_not_reuse_a_builtin_name(tmp_path):
    user = tmp_path / "u.rw"
    user.write_text("rule silu_pattern: relu(relu(?x)) => relu(?x)\n")
    with pytest.raises(EqfuseError, match="already defined"):
        load_rules([user])


def test_cli_rules_lists_every_active_rule(tmp_path, capsys):
    user = tmp_path / "mine.rw"
    user.write_text("rule my_rule: relu(relu(?x)) => relu(?x)\n")
    assert main(["rules", "--rules", str(user), "--disable", "silu_pattern"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^my_rule +\S*mine\.rw:1$", out, re.M)
    assert "    rule my_rule: relu(relu(?x)) => relu(?x)" in out
    assert re.search(r"^softmax_pattern +\S*patterns\.rw:\d+$", out, re.M)
    assert not re.search(r"^silu_pattern ", out, re.M)
    assert main(["rules", "--disable", "no_such_rule"]) == 2


# ---------------------------------------------------------------- grammar sync


def _block(text: str, start: str, end: str) -> list[str]:
    lines = text.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith(start))
    j = next(k for k, ln in enumerate(lines) if ln.startswith(end))
    return [ln for ln in lines[i:j + 1] if "// rules only" not in ln]


def test_expression_grammar_is_the_graph_languages():
    graph = (ROOT / "grammar" / "graph.lark").read_text()
    rules = (ROOT / "grammar" / "rules.lark").read_text()
    assert _block(rules, "?expr:", "signed:") == _block(graph, "?expr:", "signed:")
    for term in ("PLUS", "MINUS", "STAR", "SLASH", "AT", "POW", "NAME", "NUMBER", "STRING", "COMMENT", "_NL"):
        want = next(ln for ln in graph.splitlines() if ln.startswith(term + ":"))
        assert want in rules.splitlines(), term


# ---------------------------------------------------------------- the reference matcher and guards

LN = """graph ln(x: f32[B, 8], g: f32[8], b: f32[8], full: f32[B, 8]) {
    c = x - mean(x, axis=-1, keepdims=true)
    n = c / sqrt(mean(c ** 2, axis=-1, keepdims=true) + 1e-5)
    return n * g + b, n * full + b, n * g + full
}
graph rms(x: f32[4, 8], g: f32[8], full: f32[4, 8]) {
    r = x / sqrt(mean(x ** 2, axis=-1, keepdims=true) + 1e-6)
    return r * g, r * full
}
graph act(x: f32[4, 8], y: f32[4, 8]) {
    return x * sigmoid(x), x * sigmoid(y), kernel { x * sigmoid(x) }
}
"""


@pytest.fixture(scope="module")
def graphs():
    return {g.name: g for g in load(LN)}


@pytest.fixture(scope="module")
def builtin():
    return {r.name: r for r in load_rules() if not r.reverse}


def test_layernorm_pattern_needs_vector_gamma_and_beta(graphs, builtin):
    g, r = graphs["ln"], builtin["layernorm_pattern"]
    ok, full_gamma, full_beta = g.outputs
    b = match(r.lhs, g, ok, r.conds)
    assert b is not None and (b["x"], b["g"], b["b"]) == (0, 1, 2)
    assert g.nodes[b["eps"]].value == pytest.approx(1e-5)
    # structurally the pattern fits, but a full tensor is never taken for gamma or beta
    assert match(r.lhs, g, full_gamma) is not None
    assert match(r.lhs, g, full_gamma, r.conds) is None
    assert match(r.lhs, g, full_beta, r.conds) is None


def test_rmsnorm_pattern_needs_vector_gamma(graphs, builtin):
    g, r = graphs["rms"], builtin["rmsnorm_pattern"]
    assert match(r.lhs, g, g.outputs[0], r.conds) is not None
    assert match(r.lhs, g, g.outputs[1], r.conds) is None


def test_silu_needs_the_same_tensor_and_matches_inside_kernels(graphs, builtin):
    g, r = graphs["act"], builtin["silu_pattern"]
    same, other, kern = g.outputs
    assert match(r.lhs, g, same) == {"x": 0}
    assert match(r.lhs, g, other) is None
    assert match(r.lhs, g, kern) is None
    assert match(PKernel(r.lhs), g, kern) == {"x": 0}


def test_attribute_defaults_must_match(builtin):
    g = load("graph s(x: f32[4, 8]) {\n e = exp(x - max(x, axis=0, keepdims=true))\n"
             " return e / sum(e, axis=0, keepdims=true)\n}")[0]
    r = builtin["softmax_pattern"]
    assert match(r.lhs, g, g.outputs[0], r.conds) is None  # axis=0 is not softmax's default axis=-1
    g = load("graph s(x: f32[4, 8]) {\n e = exp(x - max(x, axis=-1, keepdims=true))\n"
             " return e / sum(e, axis=-1, keepdims=true)\n}")[0]
    assert match(r.lhs, g, g.outputs[0], r.conds) == {"x": 0}


def test_gelu_patterns_recognize_common_spellings(builtin):
    g = load("graph g(x: f32[4, 8]) {\n"
             " return x * 0.5 * (1.0 + erf(x * 0.7071067811865476)),"
             " 0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x ** 3)))\n}")[0]
    erf_form, tanh_form = g.outputs
    assert match(builtin["gelu_erf_x_half"].lhs, g, erf_form) == {"x": 0}
    assert match(builtin["gelu_tanh"].lhs, g, tanh_form) == {"x": 0}
    assert builtin["gelu_tanh"].rhs.attrs == (("approximate", "tanh"),)
    assert builtin["gelu_erf"].rhs.attrs == (("approximate", "none"),)


def test_every_rule_line_has_a_comment():
    """Each built-in rule states its identity in a comment on the line(s) just above it."""
    for path in rule_files():
        lines = path.read_text().splitlines()
        for r in parse_rules(path.read_text(), str(path)):
            above = lines[r.line - 2].strip() if r.line >= 2 else ""
            assert above.startswith("#") or lines[r.line - 2].startswith("rule "), f"{r.name} has no comment"


def test_a_guard_on_a_tensors_values_is_refused_by_every_command(capsys):
    # `where ?x > 0` over a tensor: refused where it is written (not an internal error in the
    # soundness check); a scalar constant may be compared once const(?c) says it is one
    path = Path(__file__).parent / "rules_bad" / "tensor_guard.rw"
    for argv in (["check-rules", str(path)], ["opt", str(ROOT / "examples/elementwise.g"), "--rules", str(path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"{path}:2:43: error: ?x is a tensor") and "const(?c)" in err, err
    (r,) = parse_rules("rule one: ?x * ?c => ?x where ?c == 1 and const(?c)", "t.rw")
    assert r.conds[0] == Cond(("attr", "c"), "==", 1)


def test_a_rule_named_like_a_built_in_is_refused_by_check_rules_and_opt_alike(tmp_path, capsys):
    # one notion of a duplicate: rule names are global, a user's file cannot reuse a built-in's
    path = tmp_path / "my.rw"
    path.write_text("rule relu_relu: relu(relu(?x)) => relu(?x)\n")
    errs = []
    for argv in (["check-rules", str(path)], ["opt", str(ROOT / "examples/elementwise.g"), "--rules", str(path)]):
        assert main(argv) == 2
        errs.append(capsys.readouterr().err)
    assert errs[0] == errs[1] and errs[0].startswith(f"{path}:1:6: error: rule 'relu_relu' is already defined: "
                                                     "a built-in rule at "), errs
    assert main(["check-rules", str(ROOT / "eqfuse/optimizer/rules/algebra.rw"), "--trials", "1"]) == 0
