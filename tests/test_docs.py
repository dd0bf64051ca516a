"""The documentation: README.md stays short, every relative link in README.md and docs/*.md
resolves (the file, and the heading when the link names one), and the README's set-up commands
are the ones .ci/run runs. Reads text only: no compiles."""

import re
from pathlib import Path

import pytest
from helpers import ROOT

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MANUAL = ["README", "language", "optimizing", "backend", "onnx", "torch", "training", "generation", "export",
          "precision", "deploy", "testing", "performance"]
MAX_README_LINES = 220

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file: lower case, punctuation dropped, spaces to
    hyphens, repeated headings numbered."""
    seen: dict[str, int] = {}
    out = set()
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _relative_links(page: Path) -> list[str]:
    links = LINK.findall(_prose(page.read_text()))
    return [t for t in links if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # not http:, https:, mailto: ...


def test_the_manual_has_its_pages():
    missing = [name for name in MANUAL if not (ROOT / "docs" / f"{name}.md").exists()]
    assert not missing, f"docs/ lacks {missing}"


def test_the_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}): move detail to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    bad = []
    for target in _relative_links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not bad, f"{page.relative_to(ROOT)}: broken links:\n  " + "\n  ".join(bad)


def test_the_readme_links_every_page_of_the_manual():
    targets = {t.partition("#")[0] for t in _relative_links(README)}
    assert {f"docs/{name}.md" for name in MANUAL if name != "README"} <= targets
    assert "benchmarks/RESULTS.md" in targets


def test_the_readme_set_up_commands_are_what_ci_runs():
    block = re.search(r"```sh\n(.*?)```", README.read_text(), re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["pip install . && eqfuse opt examples/mlp.g", "pip install '.[test]' && pytest -n 2"]
    ci = [line.replace(" -q", "") for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if not line.lstrip().startswith("#")]
    for c in commands:
        assert c in ci, f".ci/run does not run the README's command {c!r}"
