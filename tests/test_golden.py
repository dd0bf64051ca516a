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
from eqfuse.backend.emit import emit_graph
from eqfuse.frontend.load import load
from eqfuse.pipeline import lower

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("EQFUSE_UPDATE_GOLDEN") == "1"
# One snapshot set per vector width: AVX-512 (zen4) and AVX2. A host runs the sets whose vectors
# it has (an AVX2-only host plans zen4 with 8-float vectors, which is neither set).
MACHINES = [m for m in ("zen4", "avx2") if machine.MODELS[m].simd_floats <= machine.host_simd_floats()]


def _sources(model: str) -> dict[str, str]:
    """{kind: its kernel's C}, planned for the pinned machine."""
    with machine.pinned(model):
        _, _, plans = lower(load(KINDS)[0], {})
        emitted = emit_graph(plans)
    return {p.kind: emitted.kernel_sources[p.name] for p in plans}


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return _sources("zen4")


_CACHE: dict[str, dict[str, str]] = {}


@pytest.mark.parametrize("model", MACHINES)
@pytest.mark.parametrize("kind", ALL_KINDS)
def test_emitted_c_matches_the_golden_file(model, kind):
    if model not in _CACHE:
        _CACHE[model] = _sources(model)
    path = GOLDEN / ("" if model == "zen4" else model) / f"{kind}.c"
    got = _CACHE[model][kind]
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(got)
    want = path.read_text()
    diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), f"golden/{kind}.c", "emitted"))
    assert got == want, f"the emitted C differs from {path} (EQFUSE_UPDATE_GOLDEN=1 to accept):\n{diff[:4000]}"


def test_generated_names_are_deterministic(sources):
    with machine.pinned("zen4"):
        again = emit_graph(lower(load(KINDS)[0], {})[2]).kernel_sources
    assert sorted(again.values()) == sorted(sources.values())
    assert all(f"eqf_kinds_k{n}_" in src for n, src in enumerate(again.values()))
