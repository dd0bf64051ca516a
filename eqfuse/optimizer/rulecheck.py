"""User rule files are checked before they are used: every command and API that takes user
rules (`opt`, `run`, `emit`, `lower`, `bench`, `eqfuse.compile(rules=...)`,
`eqfuse.optimize(rules=...)`) first runs the numeric soundness check of `eqfuse check-rules`
(eqfuse/optimizer/soundness.py) on each file. An unsound or untestable rule is refused with its
counterexample (RuleError, exit status 2); `--no-check-rules` / `check_rules=False` skips it.

A file found sound is remembered by a hash of its content (and of what the verdict depends on:
the eqfuse version, the number of trials, the soundness checker and the op table's numpy
semantics): an empty marker file `<cache dir>/rules/<hash>.sound`, so an unchanged file is
checked once per machine, not on every run. Unsound files are not cached (they fail fast).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Iterable

from eqfuse.errors import EqfuseError, RuleError

TRIALS = 5  # random draws per rule, as `eqfuse check-rules` by default
_SOUND: set[str] = set()  # hashes found sound in this process


@functools.lru_cache(maxsize=None)
def _checker_fingerprint() -> bytes:
    """What a verdict depends on besides the rule file itself."""
    from eqfuse.version import __version__

    package = Path(__file__).parent.parent
    h = hashlib.sha256(__version__.encode())
    for name in ("optimizer/soundness.py", "ir/ops.py", "ir/ops_index.py", "optimizer/rules.py"):
        try:
            h.update((package / name).read_bytes())
        except OSError:
            h.update(name.encode())
    return h.digest()


def content_key(data: bytes, trials: int = TRIALS) -> str:
    h = hashlib.sha256(b"eqfuse rule check\0")
    h.update(_checker_fingerprint())
    h.update(str(trials).encode() + b"\0")
    h.update(data)
    return h.hexdigest()


def owned_privately(path: Path) -> bool:
    from eqfuse.cache import owned_privately as owned

    try:
        return owned(path)
    except OSError:
        return False


def _marker(key: str) -> Path | None:
    from eqfuse.cache import usable_cache_dir

    try:
        return usable_cache_dir() / "rules" / f"{key}.sound"
    except OSError:
        return None


def check_rule_files(files: Iterable, enabled: bool = True, trials: int = TRIALS) -> None:
    """Refuse (RuleError) a user rule file with an unsound or untestable rule; no-op if not enabled."""
    if not enabled:
        return
    for f in files:
        check_rule_file(f, trials)


def check_rule_file(path, trials: int = TRIALS) -> bool:
    """Check one file; True if the verdict came from the cache (this process's or the disk's)."""
    from eqfuse.optimizer.rules import parse_rules, rule_file_bytes
    from eqfuse.optimizer.soundness import check_rule

    path = Path(path)
    data = rule_file_bytes(path)
    key = content_key(data, trials)
    if key in _SOUND:
        return True
    marker = _marker(key)
    if marker is not None and marker.is_file() and owned_privately(marker):  # the cache's ownership rule
        _SOUND.add(key)
        return True
    bad = []
    for r in parse_rules(data, str(path)):
        ce = check_rule(r, trials=trials)
        if ce is not None:
            bad.append(ce)
    if bad:
        shown = "\n".join("    " + ln for ce in bad for ln in str(ce).splitlines())
        names = ", ".join(dict.fromkeys(ce.rule.name for ce in bad))
        tested = any(ce.max_error is not None or ce.shapes for ce in bad)
        verdict = "unsound" if tested else "cannot be tested"
        raise RuleError(f"{path}: refused: rule{'s' * (len(bad) > 1)} {names} "
                        f"{'are' if len(bad) > 1 else 'is'} {verdict} (both sides in numpy on {trials} random "
                        f"trials, as 'eqfuse check-rules'):\n{shown}",
                        hint="fix or remove the rule; --no-check-rules (check_rules=False in Python) skips this check")
    _SOUND.add(key)
    if marker is not None:
        try:
            marker.parent.mkdir(mode=0o700, exist_ok=True)
            marker.touch()
        except OSError:
            pass  # an unwritable cache only costs a re-check next time
    return False
