"""The optimized-graph cache: a graph optimized once is not optimized again.

optimize_graph looks here first. The key is everything the fused graph depends on: the graph's
canonical text (eqfuse.ir.printer.graph_text), the rules in force (the bytes of every rule file,
built-in and user files alike, and the --disable names: a hit parses no rule), the cost model, the bound dims, the limits,
the machine model (the planner's machine, and the measured speeds for the time cost model), eqfuse's
version and a digest of eqfuse's own sources (an edited checkout never reads an entry of another).
The value is the fused graph's text and its report, as JSON, and beside it the fused graph
pickled (`<key>.pickle`): read back without parsing the text (a warm compile's cost), and trusted
as the compiled kernels beside it are (same directory rule, same digest check; the key holds the
digest of eqfuse's sources, so the pickle's classes are the ones that wrote it). A missing or
unreadable pickle falls back to the text.

`memo` keeps small derived facts the same way (`<cache dir>/graphs/<key>.memo`): the pipeline's
count of the unfused graph's kernels (eqfuse.pipeline.count_kernels), so that a warm compile does
not lower the unfused graph again only to count it.

Entries live beside the kernel cache, in `<cache dir>/graphs/<key>.json`, under the same rule
(eqfuse.cache.usable_cache_dir: this user's directory, no one else can write to it), written
whole and read back only when their digest matches (eqfuse.cache.write_entry / read_entry).
EQFUSE_NO_CACHE=1 (the `--no-cache` flag of the commands that optimize) neither reads nor writes
them; `eqfuse cache info|clear` shows and empties them with the kernel cache.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

SUBDIR = "graphs"
ENABLED = True  # False turns the cache off in this process (the test suite does, but in its cache tests)


def enabled() -> bool:
    from eqfuse.cache import no_cache

    return ENABLED and not no_cache()


def _code_digest() -> str:
    from eqfuse.cache import code_digest

    return code_digest()


def key(graph_text: str, rules, disable, cost: str, dims, limits, perf=None, machine=None) -> str:
    """The entry's name: a sha256 over everything the optimized graph depends on (`machine`: the
    planner's machine model extraction was given)."""
    h = hashlib.sha256(b"eqfuse optimized graph\0")
    h.update(_code_digest().encode())
    for name, data in rules:  # (eqfuse.optimizer.optimize.rule_sources)
        h.update(f"{name}\0{len(data)}\0".encode() + data)
    parts = {"disable": sorted(disable), "cost": cost, "dims": sorted((dims or {}).items()),
             "limits": list(limits), "machine": repr(machine), "perf": repr(perf)}
    h.update(json.dumps(parts, sort_keys=True, default=str).encode())
    h.update(graph_text.encode())
    return h.hexdigest()


def _path(k: str, suffix: str = ".json") -> Path | None:
    from eqfuse.cache import usable_cache_dir

    try:
        return usable_cache_dir() / SUBDIR / f"{k}{suffix}"
    except OSError:
        return None


def get_graph(k: str):
    """The fused graph pickled under k (an eqfuse.ir.graph.Graph), or None."""
    import pickle

    from eqfuse.cache import read_entry
    from eqfuse.ir.graph import Graph

    path = _path(k, ".pickle")
    payload = read_entry(path) if path is not None else None
    if payload is None:
        return None
    try:
        g = pickle.loads(payload)
    except Exception:  # an entry this build cannot read back: the text is parsed instead
        return None
    return g if isinstance(g, Graph) else None


def put_graph(k: str, graph) -> bool:
    import pickle

    from eqfuse.cache import write_entry

    path = _path(k, ".pickle")
    if path is None:
        return False
    try:
        payload = pickle.dumps(graph, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # a graph pickle cannot hold: the text alone is kept
        return False
    return write_entry(path, payload)


def memo(kind: str, parts, compute):
    """compute()'s JSON value, kept in the cache under (kind, parts, eqfuse's sources): read back
    when present, else computed and stored. Computed every time when the cache is off."""
    from eqfuse.cache import read_entry, write_entry

    if not enabled():
        return compute()
    h = hashlib.sha256(f"eqfuse {kind}\0".encode())
    h.update(_code_digest().encode())
    h.update(json.dumps(parts, sort_keys=True, default=str).encode())
    path = _path(h.hexdigest(), ".memo")
    payload = read_entry(path) if path is not None else None
    if payload is not None:
        try:
            return json.loads(payload)["value"]
        except (ValueError, KeyError, TypeError):
            pass
    value = compute()
    if path is not None:
        write_entry(path, json.dumps({"value": value}).encode())
    return value


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
