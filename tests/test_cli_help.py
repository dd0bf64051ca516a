"""`eqfuse COMMAND --help` documents every option with its unit and default; a misspelt option
is a usage error that names the nearest option and the command's --help."""

import argparse
import inspect
import re

import pytest
from helpers import ROOT

from eqfuse.cli.args import EMIT_DIR, make_parser
from eqfuse.cli.main import main
from eqfuse.optimizer import egraph, extract

MLP = str(ROOT / "examples" / "mlp.g")
PARSER = make_parser()


def option(command: str, flag: str) -> argparse.Action:
    return PARSER.commands[command]._option_string_actions[flag]


def cli(capsys, *args):
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("command", sorted(PARSER.commands))
def test_every_option_has_help(command):
    for action in PARSER.commands[command]._actions:
        if not isinstance(action, argparse._HelpAction) and action.dest not in ("files",):
            assert action.help and len(action.help) > 15, (command, action.dest)


def test_help_states_the_defaults_the_code_uses():
    assert "(default: 30)" in option("opt", "--iter-limit").help and egraph.DEFAULT_ITER_LIMIT == 30
    assert "(default: 200000)" in option("opt", "--node-limit").help and egraph.DEFAULT_NODE_LIMIT == 200_000
    limit = option("opt", "--time-limit").help
    # (the module's constant as written: tests/conftest.py raises it for the tests)
    assert "seconds for the whole optimize" in limit and "10 s of saturation" in limit
    assert "\nDEFAULT_TIME_LIMIT = 10.0\n" in inspect.getsource(egraph)
    assert f"its own {extract.ILP_TIME_LIMIT:g} s limit" in limit
    cost = option("opt", "--cost")
    assert all(f"{m} = " in cost.help for m in cost.choices) and f"Default: {cost.default}" in cost.help
    for command, flag in (("bench", "--repeat"), ("check-rules", "--trials"), ("opt", "--report")):
        a = option(command, flag)
        assert f"(default: {a.default})" in a.help, (command, flag)
    out = option("emit", "--output")
    assert out.default == EMIT_DIR and f"(default: ./{EMIT_DIR})" in out.help
    assert "default: 1 and 2)" in option("bench", "--threads").help
    assert "keyed by graph name" in option("opt", "--report").help


def test_command_help_exits_0(capsys):
    with pytest.raises(SystemExit) as e:
        main(["opt", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: eqfuse opt") and "--time-limit S" in out


@pytest.mark.parametrize("args, message, note", [
    (["opt", MLP, "--iter-limt", "3"], "error: eqfuse opt: unknown option '--iter-limt' (see 'eqfuse opt --help')",
     "note: did you mean '--iter-limit'?"),
    (["opt", MLP, "--reprot=json"], "error: eqfuse opt: unknown option '--reprot' (see 'eqfuse opt --help')",
     "note: did you mean '--report'?"),
    (["check", MLP, "--cost", "time"], "error: eqfuse check: unknown option '--cost' (see 'eqfuse check --help')",
     "note: --cost is an option of opt, run, emit, lower, bench, export"),
    (["check", MLP, "more.g"], "error: unexpected argument 'more.g' (see 'eqfuse check --help')", None),
    (["--verison"], "error: eqfuse: unknown option '--verison' (see 'eqfuse --help')",
     "note: did you mean '--version'?"),
])
def test_a_misspelt_option_suggests_the_right_one(capsys, args, message, note):
    status, out, err = cli(capsys, *args)
    assert status == 2 and out == ""
    assert err.splitlines() == [message] + ([note] if note else [])


def test_pytest_keeps_its_summary_line_visible():
    import re

    addopts = re.search(r'^addopts = "(.*)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert addopts and "-q" not in addopts.group(1).split(), "pyproject's addopts must not hide the 'N passed' line"


def test_opt_shows_iterations_e_nodes_and_elapsed_time_on_a_terminal(capsys, monkeypatch):
    from eqfuse import progress

    monkeypatch.setattr(progress, "enabled", lambda: True)
    assert main(["opt", MLP, "--report", "json"]) == 0
    err = capsys.readouterr().err
    lines = err.split("\r\x1b[2K")
    assert lines[1] == "optimizing mlp ..."
    assert re.fullmatch(r"optimizing mlp: saturating, iteration 1, \d+ e-nodes, \d+\.\d s", lines[2]), lines[2]
    assert re.fullmatch(r"optimizing mlp: \d+(\.\d+)? (us|ms|s)\n", lines[-1])  # (progress.seconds: its unit)
