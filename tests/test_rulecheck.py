"""User rule files are checked for soundness before opt, run, emit, lower, bench, compile and
optimize use them (eqfuse/optimizer/rulecheck.py): an unsound rule is refused, exit 2 / RuleError."""

import pytest

import eqfuse
from eqfuse.cli.main import main
from eqfuse.errors import EqfuseError, RuleError
from eqfuse.optimizer import rulecheck

MLP = "examples/mlp.g"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EQFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(rulecheck, "_SOUND", set())
    return tmp_path / "cache"


@pytest.fixture
def bad(tmp_path):
    p = tmp_path / "bad.rw"
    p.write_text("rule r: relu(?x) => ?x\n")
    return p


@pytest.fixture
def good(tmp_path):
    p = tmp_path / "good.rw"
    p.write_text("rule my_silu: ?x * sigmoid(?x) => silu(?x)\n")
    return p


def test_opt_refuses_an_unsound_rule_with_its_counterexample(capsys, cache, bad):
    assert main(["opt", MLP, "--rules", str(bad)]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert "refused: rule r is unsound" in cap.err
    assert f"r at {bad}:1: the sides differ" in cap.err and "max error" in cap.err
    assert "--no-check-rules" in cap.err and "Traceback" not in cap.err


def test_no_check_rules_uses_the_unsound_rule(capsys, cache, bad):
    assert main(["opt", MLP, "--rules", str(bad), "--no-check-rules"]) == 0
    out = capsys.readouterr().out
    assert "relu" not in out.split("# report")[0]  # the rule removed the relu: wrong, but asked for
    assert "r x" in out


@pytest.mark.parametrize("cmd", [["run", "--inputs", "missing.npz"], ["emit", "-o", "unused_dir"],
                                 ["lower"], ["bench", "--peers", "numpy"]])
def test_every_optimizing_command_refuses_it(capsys, cache, bad, tmp_path, cmd):
    argv = [cmd[0], MLP, "--dim", "B=4", *[str(tmp_path / a) if a.endswith(("dir", ".npz")) else a for a in cmd[1:]],
            "--rules", str(bad)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "refused: rule r is unsound" in err and "Traceback" not in err
    assert not (tmp_path / "unused_dir").exists()


def test_check_rules_itself_keeps_exit_1(capsys, cache, bad):
    assert main(["check-rules", str(bad)]) == 1


def test_compile_and_optimize_raise_rule_error(cache, bad):
    with pytest.raises(RuleError, match="rule r is unsound") as e:
        eqfuse.compile(MLP, rules=[str(bad)], dims={"B": 2})
    assert isinstance(e.value, EqfuseError) and e.value.exit_status == 2
    with pytest.raises(RuleError):
        eqfuse.optimize(MLP, rules=[bad])
    out = eqfuse.optimize(MLP, rules=[bad], check_rules=False)
    assert out.report["rules_fired"].get("r", 0) > 0


def test_a_sound_file_is_checked_once_per_content(cache, good, monkeypatch):
    assert rulecheck.check_rule_file(good) is False  # checked
    markers = list((cache / "rules").glob("*.sound"))
    assert len(markers) == 1
    monkeypatch.setattr(rulecheck, "_SOUND", set())  # a new process: the marker on disk answers
    calls = []
    import eqfuse.optimizer.soundness as snd

    monkeypatch.setattr(snd, "check_rule", lambda r, **kw: calls.append(r) or None)
    assert rulecheck.check_rule_file(good) is True and calls == []
    good.write_text(good.read_text() + "rule tt: transpose(transpose(?x)) => ?x\n")  # new content: checked again
    assert rulecheck.check_rule_file(good) is False and len(calls) == 2
    assert len(list((cache / "rules").glob("*.sound"))) == 2


def test_an_unsound_file_is_not_cached(cache, bad):
    for _ in range(2):
        with pytest.raises(RuleError):
            rulecheck.check_rule_file(bad)
    assert not list(cache.glob("rules/*.sound"))


def test_a_missing_or_broken_rule_file_is_one_error(capsys, cache, tmp_path):
    assert main(["opt", MLP, "--rules", str(tmp_path / "nope.rw")]) == 2
    assert "no such rule file" in capsys.readouterr().err
    broken = tmp_path / "broken.rw"
    broken.write_text("rule r: relu(?x =>\n")
    assert main(["opt", MLP, "--rules", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "broken.rw:1:" in err and "Traceback" not in err


def test_opt_in_a_subprocess_exits_2_without_a_traceback(tmp_path, bad):
    import subprocess
    import sys

    env = {**__import__("os").environ, "EQFUSE_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "eqfuse.cli", "opt", MLP, "--rules", str(bad)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"error: {bad}: refused: rule r is unsound") and "Traceback" not in r.stderr
