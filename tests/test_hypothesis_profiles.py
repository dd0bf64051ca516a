"""Issue 29 item 2: hypothesis is deterministic in CI. tests/conftest.py loads the "ci" profile
(derandomized) when the environment variable CI is set, else "dev" (new examples on every run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("ci, profile, derandomize", [
    (None, "dev", False), ("true", "ci", True), ("1", "ci", True), ("false", "dev", False), ("", "dev", False),
])
def test_the_ci_environment_variable_picks_a_derandomized_profile(ci, profile, derandomize):
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "HYPOTHESIS_PROFILE")}
    if ci is not None:
        env["CI"] = ci
    code = ("import conftest\nfrom hypothesis import settings\n"
            "print(settings._current_profile, settings.default.derandomize, settings.default.deadline)")
    r = subprocess.run([sys.executable, "-c", code], cwd=TESTS, env=env, capture_output=True, text=True, check=True)
    assert r.stdout.split() == [profile, str(derandomize), "None"]
