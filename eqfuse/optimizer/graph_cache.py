"""The optimized-graph cache: a graph optimized once is not optimized again.

optimize_graph looks here first. The key is everything the fused graph depends on: the graph's
canonical text (eqfuse.ir.printer.graph_text), the rules in force (each rule's name, direction and
text, built-in and user files alike, after --disable), the cost model, the bound dims, the limits,
the machine model (the planner's machine, and the measured speeds for the time cost model), eqfuse's
version and a digest of eqfuse's own sources (an edited checkout never reads an entry of another).
The value is the fused graph's text and its report, as JSON.

Entries live beside the kernel cache, in `<cache dir>/graphs/<key>.json`, under the same rule
(eqfuse.cache.usable_cache_dir: this user's directory, no one else can write to it), written
whole and read back only when their digest matches (eqfuse.cache.write_entry / read_entry).
EQFUSE_NO_CACHE=1 (the `--no-cache` flag of the commands that optimize) neither reads nor writes
them; `eqfuse cache info|clear` shows and empties them with the kernel cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

SUBDIR = "graphs"
ENABLED = True  # False turns the cache off in this process (the test suite does, but in its cache tests)


def enabled() -> bool:
    from eqfuse.cache import no_cache

    return ENABLED and not no_cache()


@functools.lru_cache(maxsize=None)
def _code_digest() -> str:
    """eqfuse's version and every source file of the package, read once per process."""
    from eqfuse.version import __version__

    h = hashlib.sha256(__version__.encode() + b"\0")
    package = Path(__file__).parent.parent
    for f in sorted(package.rglob("*")):
        if f.suffix in (".py", ".rw", ".lark") and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(package)).encode() + b"\0")
            try:
                h.update(f.read_bytes())
            except OSError:
                pass
    return h.hexdigest()


def key(graph_text: str, rules, disable, cost: str, dims, limits, perf=None, machine=None) -> str:
    """The entry's name: a sha256 over everything the optimized graph depends on (`machine`: the
    planner's machine model extraction was given)."""
    h = hashlib.sha256(b"eqfuse optimized graph\0")
    h.update(_code_digest().encode())
    for r in rules:
        h.update(f"{r.name}\0{int(r.reverse)}\0{r.text}\0".encode())
    parts = {"disable": sorted(disable), "cost": cost, "dims": sorted((dims or {}).items()),
             "limits": list(limits), "machine": repr(machine), "perf": repr(perf)}
    h.update(json.dumps(parts, sort_keys=True, default=str).encode())
    h.update(graph_text.encode())
    return h.hexdigest()


def _path(k: str) -> Path | None:
    from eqfuse.cache import usable_cache_dir

    try:
        return usable_cache_dir() / SUBDIR / f"{k}.json"
    except OSError:
        return None


def get(k: str) -> tuple[str, dict] | None:
    """(the optimized graph's text, its report) stored under k, or None."""
    from eqfuse.cache import read_entry

    path = _path(k)
    payload = read_entry(path) if path is not None else None
    if payload is None:
        return None
    try:
        value = json.loads(payload)
        return value["graph"], value["report"]
    except (ValueError, KeyError, TypeError):
        return None


def put(k: str, text: str, report: dict) -> bool:
    from eqfuse.cache import write_entry

    path = _path(k)
    if path is None:
        return False
    try:
        payload = json.dumps({"graph": text, "report": report}, default=str).encode()
    except (TypeError, ValueError):  # a report value JSON cannot hold: not cached
        return False
    return write_entry(path, payload)
