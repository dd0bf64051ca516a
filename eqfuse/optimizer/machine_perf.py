"""This machine's measured FLOP/s and memory bandwidth for the time cost model.

Measured once with numpy (a 512x512 matmul, a 32 MiB copy) and cached as JSON under
$EQFUSE_CACHE_DIR or ~/.cache/eqfuse.
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

OVERHEAD_S = 2e-6  # per kernel launch (a call through cffi plus loop setup)


def _cache_file() -> Path:
    root = os.environ.get("EQFUSE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "eqfuse")
    return Path(root) / "machine_perf.json"


def _measure() -> dict:
    import numpy as np

    a = np.random.default_rng(0).standard_normal((512, 512), dtype=np.float32)
    a @ a
    t = min(_timed(lambda: a @ a) for _ in range(5))
    flops = 2 * 512**3 / t
    x = np.ones(8 * 1024 * 1024, np.float32)
    y = np.empty_like(x)
    t = min(_timed(lambda: np.copyto(y, x)) for _ in range(5))
    bandwidth = 2 * x.nbytes / t
    return {"flops": flops, "bandwidth": bandwidth, "overhead": OVERHEAD_S}


def _timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


@functools.lru_cache(maxsize=1)
def perf() -> dict:
    """{"flops": FLOP/s, "bandwidth": bytes/s, "overhead": s per kernel}."""
    path = _cache_file()
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    p = _measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(p))
        os.replace(tmp, path)
    except OSError:
        pass
    return p
