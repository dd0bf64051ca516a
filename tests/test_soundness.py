"""Every rule is checked for soundness: both sides in numpy on random inputs (like check-rules)."""

from __future__ import annotations

import pytest

from eqfuse.cli.main import main
from eqfuse.optimizer.rules import RULES_DIR, load_rules, parse_rules
from eqfuse.optimizer.soundness import check_rule

BUILTIN = load_rules()


def rule_id(r) -> str:
    return r.name + ("-reverse" if r.reverse else "")


@pytest.mark.parametrize("rule", BUILTIN, ids=[rule_id(r) for r in BUILTIN])
def test_builtin_rule_is_sound(rule):
    ce = check_rule(rule, trials=6, seed=1)
    assert ce is None, str(ce)


def test_opt_in_commutativity_rules_are_sound():
    for r in parse_rules((RULES_DIR / "extra" / "comm.rw").read_text(), "comm.rw"):
        assert check_rule(r, trials=4) is None


UNSOUND = {
    # NaN on the left for x < 0 where the right side is a number
    "exp_log": "rule exp_log: exp(log(?x)) => ?x",
    # the tanh approximation is not the erf form (differs by up to 4.7e-4)
    "gelu_forms": 'rule gelu_forms: gelu(?x, approximate="tanh") => gelu(?x)',
    # a scalar 0 does not have the shape of x
    "sub_self": "rule sub_self: ?x - ?x => 0",
    # wrong constant
    "half": "rule half: ?x * 0.5 => ?x / 3",
    # sqrt(x)**2 is NaN for x < 0
    "sqrt_sq": "rule sqrt_sq: sqrt(?x) * sqrt(?x) => ?x",
    # an unguarded layernorm pattern: a full tensor taken for gamma
    "ln_unguarded": "rule ln_unguarded: (?x - mean(?x, axis=-1, keepdims=true)) / sqrt(mean((?x - mean(?x, "
                    "axis=-1, keepdims=true)) ** 2, axis=-1, keepdims=true) + ?e) * ?g + ?b "
                    "=> layernorm(?x, ?g, ?b, eps=?e) where const(?e)",
    # transposing twice with any perm is not the identity
    "tt_any": "rule tt_any: transpose(transpose(?x, perm=?p), perm=?p) => ?x",
    # quantized ops: a scale of 0 gives NaN (saturated low), 3e38 overflows (the guard s > 0, s <= 1e36)
    "dq_q_unguarded": "rule dq_q_unguarded: quantize_linear(dequantize_linear(?q, ?s, ?z), ?s, ?z) => ?q "
                      "where const(?s) and rank(?z) == 0",
    "dq_q_zero_scale": "rule dq_q_zero_scale: quantize_linear(dequantize_linear(?q, ?s, ?z), ?s, ?z) => ?q "
                       "where const(?s) and ?s >= 0 and ?s <= 1e36 and rank(?z) == 0",
    # another scale requantizes
    "dq_q_other_scale": "rule dq_q_other_scale: quantize_linear(dequantize_linear(?q, ?s, ?z), ?t, ?z) => ?q "
                        "where const(?s) and const(?t) and ?s > 0 and ?s <= 1e36 and rank(?z) == 0",
    # a zero point with more elements broadcasts q to its shape
    "dq_q_zp_shape": "rule dq_q_zp_shape: quantize_linear(dequantize_linear(?q, ?s, ?z), ?s, ?z) => ?q "
                     "where const(?s) and ?s > 0 and ?s <= 1e36",
    # quantizing rounds: the other order is not the identity
    "q_dq": "rule q_dq: dequantize_linear(quantize_linear(?x, ?s, ?z), ?s, ?z) => ?x "
            "where const(?s) and ?s > 0 and ?s <= 1e36 and rank(?z) == 0",
    # a conv of dequantized operands scaled by x's scale only (conv shapes are drawn: found)
    "conv_dq_one_scale": "rule conv_dq_one_scale: conv2d(dequantize_linear(?x, ?xs, ?xz), dequantize_linear(?w, ?ws, ?wz), "
                         "stride=?s, padding=?p, dilation=?d, group=?g) => cast(conv_integer(?x, ?w, ?xz, ?wz, stride=?s, "
                         "padding=?p, dilation=?d, group=?g), to=\"f32\") * ?xs where const(?xs) and const(?ws) "
                         "and ?xs >= 1e-10 and ?xs <= 1e10 and ?ws >= 1e-10 and ?ws <= 1e10 and rank(?xz) == 0 and rank(?wz) == 0",
    # the conv quantizing its own f32 x, its bias added to the integer sum before the scale: drawn
    # only through the rank conditions (shape_conds adds a square draw's axes to x, w and b)
    "conv_dq_qa_bias_unscaled": "rule conv_dq_qa_bias_unscaled: conv2d(dequantize_linear(quantize_linear(?x, ?xs, ?xz), ?xs, ?xz), "
                                "dequantize_linear(?w, ?ws, ?wz), ?b, stride=?s, padding=?p, dilation=?d, group=?g) => "
                                "(cast(conv_integer(quantize_linear(?x, ?xs, ?xz), ?w, ?xz, ?wz, stride=?s, padding=?p, "
                                "dilation=?d, group=?g), to=\"f32\") + reshape(?b, shape=[-1, 1, 1])) * (?xs * ?ws) "
                                "where const(?xs) and const(?ws) and ?xs >= 1e-10 and ?xs <= 1e10 and ?ws >= 1e-10 "
                                "and ?ws <= 1e10 and rank(?xz) == 0 and rank(?wz) == 0 and rank(?x) == 4 and rank(?w) == 4 "
                                "and rank(?b) == 1",
    # softmax over the wrong axis
    "softmax_axis": "rule softmax_axis: exp(?x) / sum(exp(?x), axis=0, keepdims=true) => softmax(?x) "
                    "where rank(?x) >= 1",
}


@pytest.mark.parametrize("name", sorted(UNSOUND))
def test_unsound_rule_gets_a_counterexample(name):
    (rule,) = parse_rules(UNSOUND[name], "bad.rw")
    ce = check_rule(rule, trials=8, seed=0)
    assert ce is not None, f"{name} passed as sound"
    text = str(ce)
    assert text.startswith(f"{name} at bad.rw:1: ")
    assert "shapes:" in text


def test_counterexample_reports_shapes_inputs_and_error():
    (rule,) = parse_rules(UNSOUND["gelu_forms"], "bad.rw")
    ce = check_rule(rule, trials=8)
    assert ce.reason == "the sides differ" and 1e-5 < ce.max_error < 1e-3
    assert set(ce.shapes) == {"x"} and "x" in ce.inputs
    assert "max error" in str(ce) and "first difference" in str(ce)


def test_reverse_direction_is_checked_on_its_own():
    rules = parse_rules("rule m: maximum(?x, 0) <=> relu(?x)", "m.rw")
    assert [check_rule(r) for r in rules] == [None, None]
    # relu(x) => x loses the negatives; x => relu(x) cannot even be written (a lone variable)
    fwd, back = parse_rules("rule r: relu(?x) * 1 <=> relu(?x) * relu(?x)", "r.rw")
    assert check_rule(fwd) is not None and check_rule(back) is not None


def test_conditions_steer_the_inputs():
    (r,) = parse_rules("rule u: sum(?x, axis=-1, keepdims=true) => ?x where dim(?x, -1) == 1", "u.rw")
    assert check_rule(r) is None
    (r,) = parse_rules("rule u: sum(?x, axis=-1, keepdims=true) => ?x where dim(?x, -1) == 2", "u.rw")
    assert check_rule(r) is not None


def test_a_rule_no_input_satisfies_is_reported_untestable():
    (r,) = parse_rules("rule never: relu(?x) => ?x where rank(?x) > 9", "n.rw")
    ce = check_rule(r, trials=1)
    assert ce is not None and "cannot be tested" in ce.reason


def test_check_rules_cli(tmp_path, capsys):
    good = tmp_path / "good.rw"
    good.write_text("rule neg2: -(-?x) => ?x\nrule swap: ?a + ?b <=> ?b + ?a\n")
    assert main(["check-rules", str(good)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("OK") and "neg2" in out[0]
    assert any(ln.startswith("OK") and "swap (right to left)" in ln for ln in out)

    bad = tmp_path / "bad.rw"
    bad.write_text("rule fine: relu(relu(?x)) => relu(?x)\n" + UNSOUND["exp_log"] + "\n")
    assert main(["check-rules", str(bad), "--trials", "4"]) == 1
    cap = capsys.readouterr()
    lines = cap.out.splitlines()
    assert lines[0].startswith("OK") and "fine" in lines[0]
    assert lines[1].startswith("UNSOUND") and "exp_log" in lines[1]
    assert "shapes: ?x=" in cap.out and "inputs:" in cap.out
    assert "1 of 2 rules unsound" in cap.err and "Traceback" not in cap.err
