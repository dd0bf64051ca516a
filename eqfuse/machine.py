"""What this machine is: cache sizes, SIMD width and cores, read from the system.

Overridable with EQFUSE_L1 / EQFUSE_L2 / EQFUSE_L3 (bytes) and EQFUSE_SIMD (floats per vector).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Machine:
    l1: int  # L1 data cache, bytes per core
    l2: int  # bytes per core
    l3: int  # bytes, shared
    simd_floats: int  # float32 lanes per vector register
    cores: int


def _size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * mult


def cache_sizes() -> dict[int, int]:
    """{level: bytes} for data and unified caches of cpu0."""
    sizes: dict[int, int] = {}
    for idx in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (idx / "type").read_text().strip() not in ("Data", "Unified"):
                continue
            sizes[int((idx / "level").read_text())] = _size((idx / "size").read_text())
        except (OSError, ValueError):
            continue
    return sizes


def simd_width_floats() -> int:
    try:
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        flags = ""
    words = set(flags.split())
    return 16 if "avx512f" in words else 8 if "avx2" in words else 4


def num_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=None)
def machine() -> Machine:
    c = cache_sizes()
    env = lambda name, default: int(os.environ.get(name, default))  # noqa: E731
    return Machine(l1=env("EQFUSE_L1", c.get(1, 32 << 10)), l2=env("EQFUSE_L2", c.get(2, 1 << 20)),
                   l3=env("EQFUSE_L3", c.get(3, 8 << 20)), simd_floats=env("EQFUSE_SIMD", simd_width_floats()),
                   cores=num_cores())


def gemm_blocking(m: Machine | None = None, mr: int = 8, nr: int = 32) -> tuple[int, int, int, int, int]:
    """BLIS blocking (MC, NC, KC, MR, NR): a KC x NR panel of B in half of L1, an MC x KC block of A
    in half of L2, a KC x NC panel of B in a quarter of L3 (capped)."""
    m = m or machine()
    kc = max(64, (m.l1 // 2) // (nr * 4) // 8 * 8)
    mc = max(mr, (m.l2 // 2) // (kc * 4) // mr * mr)
    nc = max(nr, min(4096, (m.l3 // 4) // (kc * 4)) // nr * nr)
    assert kc > 0 and mc % mr == 0 and nc % nr == 0, (mc, nc, kc)
    return mc, nc, kc, mr, nr
