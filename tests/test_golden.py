"""Golden C: the emitted C of one kernel of each kind, checked in under tests/golden/ and
compared as text, so that an emitter change shows up as a readable diff in review.

After a deliberate change: `EQFUSE_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py`
rewrites the files; read their diff before committing it.
"""

import difflib
import os
from pathlib import Path

import pytest
from test_plans import ALL_KINDS, KINDS

from eqfuse import machine
from eqfuse.compiler import lower
from eqfuse.emit import emit_graph
from eqfuse.frontend import load

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("EQFUSE_UPDATE_GOLDEN") == "1"


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    """{kind: its kernel's C}, planned for the pinned zen4 machine."""
    with machine.pinned("zen4"):
        _, _, plans = lower(load(KINDS)[0], {})
        emitted = emit_graph(plans)
    return {p.kind: emitted.kernel_sources[p.name] for p in plans}


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_emitted_c_matches_the_golden_file(sources, kind):
    path = GOLDEN / f"{kind}.c"
    got = sources[kind]
    if UPDATE:
        path.write_text(got)
    want = path.read_text()
    diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), f"golden/{kind}.c", "emitted"))
    assert got == want, f"the emitted C differs from {path} (EQFUSE_UPDATE_GOLDEN=1 to accept):\n{diff[:4000]}"


def test_generated_names_are_deterministic(sources):
    with machine.pinned("zen4"):
        again = emit_graph(lower(load(KINDS)[0], {})[2]).kernel_sources
    assert sorted(again.values()) == sorted(sources.values())
    assert all(f"eqf_kinds_k{n}_" in src for n, src in enumerate(again.values()))
