"""Bad input gets one clear message: file:line:col, the message, the line with a caret, exit 2.

The corpus is tests/bad/*.g (format in tests/bad/README.md); inputs that cannot hold an expect
line are generated here.
"""

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import BAD

from eqfuse.cli.main import main
from eqfuse.frontend.parser import MAX_DEPTH

EXPECT = re.compile(r"# expect: (\d+):(\d+): (.+)")


@dataclass
class Case:
    path: Path
    line: int
    col: int
    message: str
    notes: list[str]

    @classmethod
    def read(cls, path: Path) -> "Case":
        lines = path.read_text().splitlines()
        m = EXPECT.fullmatch(lines[0])
        assert m, f"{path.name}: the first line must be '# expect: LINE:COL: MESSAGE'"
        notes = [ln[len("# note: "):] for ln in lines if ln.startswith("# note: ")]
        return cls(path, int(m[1]), int(m[2]), m[3], notes)


def check_report(err: str, path: str, line: int | None, col: int | None, message: str, source_line: str | None):
    """The shape every error report has: one head line, the source line, a caret, maybe a note."""
    assert "Traceback" not in err
    lines = err.rstrip("\n").split("\n")
    where = f"{path}:{line}:{col}: " if line is not None else ""
    assert lines[0].startswith(f"{where}error: "), lines[0]
    assert message in lines[0]
    assert err.count("error:") == 1
    if source_line is not None:
        shown = source_line.expandtabs(1)
        assert lines[1] == "    " + shown
        caret = lines[2]
        assert re.fullmatch(r" *\^+", caret), caret
        assert caret.index("^") == 4 + col - 1
        assert len(lines) <= 4 and all(ln.startswith("note: ") for ln in lines[3:])


def run_check(capsys, path) -> tuple[int, str, str]:
    status = main(["check", str(path)])
    out, err = capsys.readouterr()
    return status, out, err


def test_the_corpus_is_big_enough():
    assert len(BAD) >= 50


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_model_is_refused_with_position_message_and_caret(capsys, path):
    case = Case.read(path)
    status, out, err = run_check(capsys, path)
    assert status == 2
    assert out == ""
    source = path.read_text().splitlines()[case.line - 1]
    check_report(err, str(path), case.line, case.col, case.message, source)
    for note in case.notes:
        assert f"note: {note}" in err


SUBPROCESS_CASES = ["syntax_missing_paren", "unknown_op", "shape_matmul_inner", "attr_bad_choice"]


@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_the_command_exits_2_without_a_traceback(name):
    path = next(p for p in BAD if p.stem == name)
    case = Case.read(path)
    env = {k: v for k, v in os.environ.items() if k != "EQFUSE_DEBUG"}
    r = subprocess.run([sys.executable, "-m", "eqfuse.cli", "check", str(path)],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2
    assert r.stdout == ""
    check_report(r.stderr, str(path), case.line, case.col, case.message,
                 path.read_text().splitlines()[case.line - 1])


# ---------------------------------------------------------------- inputs generated here


@pytest.mark.parametrize("name, data, message", [
    ("empty.g", b"", "empty.g is empty: expected at least one 'graph NAME(...) { ... }'"),
    ("blank.g", b"\n  \n\t\n", "blank.g is empty"),
    ("binary.g", b"\x7fELF\x02\x01\x01\x00\x00\x00graph\x00\x00", "binary.g is a binary file, not a .g text file"),
    ("latin1.g", "graph g(x: f32[4]) -> f32[4] {\n    # café\n    return x\n}\n".encode("latin-1"),
     "latin1.g is not UTF-8 text (byte 40 cannot be decoded)"),
    ("utf16.g", "graph g(x: f32[4]) -> f32[4] { return x }".encode("utf-16"), "utf16.g"),
])
def test_files_that_are_not_models(capsys, tmp_path, name, data, message):
    path = tmp_path / name
    path.write_bytes(data)
    status, out, err = run_check(capsys, path)
    assert status == 2 and out == ""
    assert "Traceback" not in err and err.count("error:") == 1
    assert message in err


@pytest.mark.parametrize("args, message", [
    (["check", "no/such/file.g"], "error: no/such/file.g: no such file"),
    (["check", "."], "error: . is a directory, not a model file"),
    (["check"], "the following arguments are required: model"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    ([], "a command is needed"),
])
def test_usage_errors(capsys, args, message):
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert message in err and "Traceback" not in err


def deep(expr: str) -> str:
    return "graph g(x: f32[4]) -> f32[4] {\n    return " + expr + "\n}\n"


DEEP = {
    # name: (source, None if it must work, else the start of the error)
    "parens_5000": (deep("(" * 5000 + "x" + ")" * 5000), None),
    "sum_5000": (deep(" + ".join(["x"] * 5000)), "expression nested too deeply"),
    "neg_3000": (deep("-" * 3000 + "x"), "expression nested too deeply"),
    "spaced_neg_3000": (deep("- " * 3000 + "x"), "expression nested too deeply"),
    "pow_3000": (deep("x ** " * 3000 + "x"), "expression nested too deeply"),
    "calls_3000": (deep("relu(" * 3000 + "x" + ")" * 3000), "expression nested too deeply"),
    "calls_in_parens": (deep("relu((" * 1000 + "x" + "))" * 1000), "expression nested too deeply"),
    "kernel_deep": (deep("kernel { " + "-" * 3000 + "x }"), "expression nested too deeply"),
    "at_the_limit": (deep("-" * (MAX_DEPTH - 1) + "x"), None),
    "just_past_the_limit": (deep("-" * MAX_DEPTH + "x"), "expression nested too deeply"),
    "long_chain_of_names": ("graph g(x: f32[4]) -> f32[4] {\n    t0 = x\n"
                            + "".join(f"    t{i} = t{i - 1} + x\n" for i in range(1, 3000))
                            + "    return t2999\n}\n", None),
}


@pytest.mark.parametrize("name", DEEP)
def test_deep_nesting_works_or_is_refused_clearly(capsys, tmp_path, name):
    src, message = DEEP[name]
    path = tmp_path / f"{name}.g"
    path.write_text(src)
    status, out, err = run_check(capsys, path)
    assert "Traceback" not in err and "RecursionError" not in err and "internal error" not in err
    if message is None:
        assert status == 0, err
        assert out.startswith("g(x: f32[4]) -> f32[4]")
    else:
        assert status == 2
        assert re.match(rf"{re.escape(str(path))}:2:\d+: error: {message}", err)


def test_a_short_misspelt_name_gets_a_did_you_mean():
    from eqfuse.errors import EqfuseError, did_you_mean
    from eqfuse.frontend.load import load

    assert did_you_mean("b3", ["w1", "b1", "x"]) == "did you mean 'b1'?"
    assert did_you_mean("q", ["w1", "b1", "x"]) is None  # nothing close
    with pytest.raises(EqfuseError) as e:
        load("graph g(x: f32[4], b1: f32[4]) -> f32[4] {\n    return x + b3\n}\n")
    assert "unknown name 'b3'" in str(e.value) and "did you mean 'b1'?" in str(e.value)
