"""The op reference: `eqfuse ops [NAME]` and the generated language section of docs/language.md."""

import re

import pytest
from helpers import ROOT, load_text

from eqfuse.cli import langref
from eqfuse.cli.main import main
from eqfuse.ir import opdocs, opref
from eqfuse.ir.ops import OPS, REQUIRED

LANGUAGE_MD = ROOT / "docs" / "language.md"


def cli(capsys, *args):
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err


def test_every_op_of_the_table_has_a_one_line_doc():
    missing = [name for name, op in OPS.items() if not op.doc.strip()]
    assert not missing, f"add these ops to eqfuse/ir/opdocs.py DOCS: {missing}"
    assert all("\n" not in op.doc for op in OPS.values())
    assert set(opdocs.DOCS) <= set(OPS), f"DOCS names ops the table does not have: {set(opdocs.DOCS) - set(OPS)}"


def test_ops_lists_every_op_with_signature_kind_and_meaning(capsys):
    status, out, err = cli(capsys, "ops")
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert lines[-1] == f"{len(OPS)} ops; 'eqfuse ops NAME' for one"
    for op in OPS.values():
        i = next(i for i, ln in enumerate(lines) if ln.startswith(op.name + "("))
        assert lines[i].split()[-1] == op.kind
        assert lines[i + 1].strip().startswith(op.doc)
    assert 'gelu(x, approximate="none")' in out
    assert "layernorm(x, gamma, beta, axis=-1, eps=1e-05)" in out
    assert "slice(x, axis=int, start=0, [stop=int], step=1)" in out  # required, defaulted, may be omitted
    assert "conv2d(x, w[, b], stride=1, padding=0, dilation=1, group=1)" in out


def test_ops_name_shows_one_op_in_full(capsys):
    status, out, err = cli(capsys, "ops", "gelu")
    assert status == 0 and err == ""
    assert out.splitlines() == [
        'gelu(x, approximate="none")',
        f"  {OPS['gelu'].doc}",
        "  kind:       pointwise",
        "  inputs:     1 (x)",
        '  attributes: approximate= "none" or "tanh", default "none"',
    ]
    status, out, _ = cli(capsys, "ops", "add")
    assert "  written:    infix `a + b`" in out and "  attributes: none" in out


def test_every_attribute_default_is_shown(capsys):
    for op in OPS.values():
        status, out, _ = cli(capsys, "ops", op.name)
        assert status == 0
        for a in op.attrs:
            want = "required" if a.default is REQUIRED else "default: omitted" if a.default is None \
                else f"default {opref.literal(a.default)}"
            assert f"{a.name}= " in out and want in out, (op.name, a.name)


@pytest.mark.parametrize("name, hint", [("gleu", "note: did you mean 'gelu'?\n"), ("zzzz", "")])
def test_an_unknown_op_is_a_usage_error_with_a_suggestion(capsys, name, hint):
    status, out, err = cli(capsys, "ops", name)
    assert status == 2 and out == ""
    assert err == f"error: unknown op '{name}' (see 'eqfuse ops' for the list)\n{hint}"


def test_the_manual_language_reference_is_generated_from_the_op_table():
    assert langref.DEFAULT_PATH == "docs/language.md" and LANGUAGE_MD.exists()
    text = LANGUAGE_MD.read_text()
    assert langref.splice(text, langref.language()) == text, \
        "docs/language.md's language reference is out of date: run python -m eqfuse.cli.langref --write docs/language.md"
    for op in OPS.values():
        assert f"| `{langref._cell(opref.signature(op))}` | {op.kind} |" in text


def test_the_check_mode_finds_a_stale_reference(tmp_path, capsys):
    stale = tmp_path / "language.md"
    stale.write_text(LANGUAGE_MD.read_text().replace("| `relu(x)` | pointwise | max(x, 0) |\n", ""))
    assert langref.main(["--check", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert langref.main(["--write", str(stale)]) == 0
    assert langref.main(["--check", str(stale)]) == 0 and stale.read_text() == LANGUAGE_MD.read_text()
    (tmp_path / "none.md").write_text("no markers\n")
    assert langref.main(["--check", str(tmp_path / "none.md")]) == 2


def test_the_default_file_is_docs_language_md(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert langref.main(["--check"]) == 0
    assert langref.main(["--check", "a.md", "b.md"]) == 2 and "usage" in capsys.readouterr().err


def test_the_reference_example_is_a_valid_graph():
    example = re.search(r"```\n(graph .*?)```", langref.LANGUAGE, re.S).group(1)
    (g,) = load_text(example)
    assert g.signature() == "block(x: f32[B, 64], w: f32[64, 32], b: f32[32]) -> (f32[B, 32], f32[B])"
