"""Comments and docstrings say what the code does and why, not how fast it ran on which machine
(issue 27). Over every comment and docstring of eqfuse/**/*.py and every /* */ and // comment of
csrc_templates/*, split into paragraphs at blank lines, this fails listing file:line for

- a CPU model name (Zen, Xeon, EPYC, Sapphire Rapids, Genoa, Skylake, ...), anywhere;
- a measured time or rate: a number with a unit of time (ns, us, µs, ms, s, min) or of
  throughput (GFLOP/s, GB/s, MB/s, calls/s, ...), "2.5x faster/slower", or a percentage next to a
  word about time ("cost 2.7%", "3% slower", "12% of the run time"), unless the same paragraph
  names the benchmark command that measures it: a path `benchmarks/bench_*.py` (that exists),
  optionally with its arguments. A number that justifies a constant belongs next to that command.

What counts: Python comments (tokenize) and docstrings, taken as every statement that is a bare
string (ast: module, class and function docstrings, and the string after an assignment that
documents it); C comments, found by a small lexer that skips string and character literals.
String literals that are program data (C code held in Python strings, help texts, messages) are
not comments and are not read.

Not measurements, and not flagged: sizes (KiB, MB of memory), counts, "1s" and "0s" (ones and
zeros), and a number inside a `code span`, which quotes what the program prints or is given (the
progress line's `what: done in 1.2 s`), not what it measured. A duration that is a limit the code sets or a default it documents ("a 2 s time limit",
"timeout 30 s", "the default deadline") is a parameter, not a measurement: it is allowed when the
same sentence says "limit", "timeout", "deadline" or "budget".
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CPU = re.compile(
    r"\b(?:Zen(?:\s?\d\w*)?|Xeon|EPYC|Epyc|Ryzen|Threadripper|Opteron|Core i[3579]|"
    r"(?:Sapphire|Emerald|Granite) Rapids|Genoa|Turin|Bergamo|Milan|"
    r"(?:Ice|Cascade|Cooper|Alder|Raptor|Tiger|Kaby|Coffee|Comet|Meteor|Lunar|Arrow) Lake|"
    r"Skylake(?:-\w+)?|Haswell|Broadwell|Ivy Bridge|Sandy Bridge|Graviton\d*|Neoverse|Apple M\d)\b")

_NUM = r"(?<![\w.])\d+(?:[.,]\d+)*"
# A number and a unit of time or of throughput. "1s" and "0s" are ones and zeros: a duration of
# 0 or 1 s is written with its space.
TIME = re.compile(
    _NUM + r"(?:\s?|-)(?:ns|us|µs|μs|ms|s|sec|secs|seconds?|milliseconds?|microseconds?|"
    r"nanoseconds?|min|minutes?|hours?)(?![\w/])"
    r"|" + _NUM + r"\s?(?:[GMKT]i?B/s|[GMT]?FLOP/s|[GT]FLOPS|calls/s|ops/s|it/s)"
    r"|" + _NUM + r"\s?(?:x|×|times)\s+(?:faster|slower|quicker|the speed)"
    r"|" + _NUM + r"\s?%(?:\s|\)|,|\.|;|$)(?:\s*of\s+(?:the\s+)?(?:\w+\s+)?(?:time|run|runtime|wall|call))?")
PERCENT = re.compile(_NUM + r"\s?%")
# Words that make a percentage a measured share of time or a speed-up.
TIMEWORD = re.compile(r"\b(?:cost|costs|costing|took|takes|spent|spends|saves?|saved|pays?|paid|slower|faster|"
                      r"speed-?ups?|overhead|time|runtime|wall|latency|throughput)\b", re.I)
ONES_ZEROS = re.compile(r"(?<![\w.])[01]s\b")
BENCH = re.compile(r"\bbenchmarks/(bench_\w+\.py)")
CODE_SPAN = re.compile(r"`[^`\n]*`")
LIMIT = re.compile(r"\b(?:limit|limits|timeout|deadline|budget)\b", re.I)


def python_comments(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of each comment block (consecutive comment lines) and docstring."""
    src = path.read_text()
    out: list[tuple[int, str]] = []
    block: list[tuple[int, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type != tokenize.COMMENT:
            continue
        line = tok.start[0]
        if block and line != block[-1][0] + 1:
            out.append((block[0][0], "\n".join(t for _, t in block)))
            block = []
        block.append((line, tok.string.lstrip("#").strip()))
    if block:
        out.append((block[0][0], "\n".join(t for _, t in block)))
    for node in ast.walk(ast.parse(src)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            out.append((node.lineno, node.value.value))
    return out


def c_comments(src: str) -> list[tuple[int, str]]:
    """(first line, text) of each /* */ comment and each block of // lines, string and character
    literals skipped."""
    out: list[tuple[int, str]] = []
    i, line, n = 0, 1, len(src)
    slashes: list[tuple[int, str]] = []

    def flush() -> None:
        if slashes:
            out.append((slashes[0][0], "\n".join(t for _, t in slashes)))
            slashes.clear()

    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            if slashes and slashes[-1][0] != line - 1:
                flush()
            slashes.append((line, src[i + 2:j].strip()))
            i = j
        elif src.startswith("/*", i):
            flush()
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            text = src[i + 2:j - 2]
            text = "\n".join(t.strip().lstrip("*").strip() for t in text.split("\n"))
            out.append((line, text))
            line += src.count("\n", i, j)
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            i = j + 1
        else:
            if not c.isspace():
                flush()
            i += 1
    flush()
    return out


def paragraphs(line: int, text: str) -> list[tuple[int, str]]:
    """Split a comment into blank-line separated paragraphs, each with its first line."""
    out = []
    for m in re.finditer(r"(?:[^\n]*\S[^\n]*(?:\n|$))+", text):
        out.append((line + text.count("\n", 0, m.start()), m.group(0)))
    return out


def _sentence(para: str, pos: int) -> str:
    start = max(para.rfind(". ", 0, pos), para.rfind(".\n", 0, pos), para.rfind(";", 0, pos)) + 1
    ends = [e for e in (para.find(". ", pos), para.find(".\n", pos), para.find(";", pos)) if e >= 0]
    return para[start:min(ends) if ends else len(para)]


def findings_in(para: str) -> list[tuple[int, str]]:
    """(offset, reason) for each CPU name and each measurement not next to a benchmark command."""
    out = [(m.start(), f"CPU model name {m.group(0)!r}") for m in CPU.finditer(para)]
    benches = BENCH.findall(para)
    if any((ROOT / "benchmarks" / b).is_file() for b in benches):
        return out
    spans = [m.span() for m in CODE_SPAN.finditer(para)]
    for m in TIME.finditer(para):
        text = m.group(0).strip()
        if any(a < m.start() < b for a, b in spans):
            continue
        if ONES_ZEROS.fullmatch(text):
            continue
        if PERCENT.match(text):
            around = para[max(0, m.start() - 40):m.end() + 40]
            if not TIMEWORD.search(around):
                continue
        if LIMIT.search(_sentence(para, m.start())):
            continue
        out.append((m.start(), f"measurement {text!r} without its benchmarks/bench_*.py command"))
    return out


def scan(path: Path, chunks: list[tuple[int, str]]) -> list[str]:
    rel = path.relative_to(ROOT)
    found = []
    for line, text in chunks:
        for pline, para in paragraphs(line, text):
            for pos, why in findings_in(para):
                found.append(f"{rel}:{pline + para.count(chr(10), 0, pos)}: {why}")
    return found


def all_findings() -> list[str]:
    found: list[str] = []
    for path in sorted((ROOT / "eqfuse").rglob("*.py")):
        found += scan(path, python_comments(path))
    for path in sorted((ROOT / "csrc_templates").glob("*")):
        if path.is_file():
            found += scan(path, c_comments(path.read_text()))
    return found


def test_no_cpu_names_or_unmeasured_timings():
    found = all_findings()
    assert not found, (f"{len(found)} comment(s) with a CPU name or a measurement without its "
                       "benchmark command:\n" + "\n".join(found))


def test_checker_flags_and_accepts():
    assert findings_in("Tuned on Zen 4.")
    assert findings_in("A Xeon runs this differently.")
    assert findings_in("This took 3.2 ms.")
    assert findings_in("it is 2.5x faster than the loop")
    assert findings_in("the copy cost 2.7% of the call")
    assert findings_in("at 51 GFLOP/s")
    assert findings_in("3.2 ms, see benchmarks/bench_nonexistent.py")
    assert not findings_in("3.2 ms (benchmarks/bench_gemm.py --only 128x768x768)")
    assert not findings_in("a buffer of 64 KiB, 2 MB of memory, 8 threads, 3 loops")
    assert not findings_in("fill with 1s and 0s")
    assert not findings_in("the optimizer's time limit defaults to 2 s")
    assert not findings_in("a tolerance of 5% on the values")
    assert not findings_in("the end shows `what: done in 1.2 s`")
    # A CPU name is flagged even next to a benchmark command.
    assert findings_in("Zen 4: 3.2 ms (benchmarks/bench_gemm.py)")


def test_c_lexer():
    src = 'a = "/* not */ // a comment";\n// one\n// two\n\nx; /* three\n * four */ y;\n'
    assert c_comments(src) == [(2, "one\ntwo"), (5, "three\nfour")]
    assert paragraphs(10, "a\nb\n\nc\n") == [(10, "a\nb\n"), (13, "c\n")]
