"""What this machine is: cache sizes, SIMD width, the ISA kernels are built for, and cores.

Read from the system, overridable with EQFUSE_L1 / EQFUSE_L2 / EQFUSE_L3 (bytes) and EQFUSE_SIMD
(floats per vector). `pin(model)` replaces the whole description, for tests: every planning
decision and the compiler's -march then follow the pinned model, not the host (MODELS holds
the machines the project has run on).
"""

from __future__ import annotations

import functools
import os
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Machine:
    l1: int  # L1 data cache, bytes per core
    l2: int  # bytes per core
    l3: int  # bytes, shared
    simd_floats: int  # float32 lanes per vector register
    cores: int

    @property
    def march(self) -> tuple[str, ...]:
        """The compiler's target flags: the host's own ISA when it is the vector width planned
        for, else the x86-64 level of that width (AVX2 kernels on an AVX-512 host really run
        the AVX2 code paths)."""
        if self.simd_floats >= host_simd_floats():
            return ("-march=native",)
        return ("-march=x86-64-v3", "-mtune=native") if self.simd_floats == 8 else ("-march=x86-64-v2",)


# The machines eqfuse has run on (2 vCPUs each), for tests that pin what the planner sees.
MODELS: dict[str, Machine] = {
    "zen4": Machine(l1=32 << 10, l2=1 << 20, l3=32 << 20, simd_floats=16, cores=2),
    "xeon-spr": Machine(l1=48 << 10, l2=2 << 20, l3=105 << 20, simd_floats=16, cores=2),
    "avx2": Machine(l1=32 << 10, l2=512 << 10, l3=16 << 20, simd_floats=8, cores=2),
}


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


@functools.lru_cache(maxsize=None)
def host_simd_floats() -> int:
    return simd_width_floats()


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


_PINNED: list[Machine] = []


def pin(model: Machine | str | None, clamp: bool = True) -> None:
    """Make `machine()` return this model (a name of MODELS or a Machine) instead of the host;
    None unpins. A model wider than the host's vectors is narrowed to the host's (its kernels
    could not run here) unless clamp=False (`eqfuse export` plans for another machine)."""
    _PINNED.clear()
    if model is None:
        return
    m = MODELS[model] if isinstance(model, str) else model
    if clamp and m.simd_floats > host_simd_floats():
        m = replace(m, simd_floats=host_simd_floats())
    _PINNED.append(m)


@contextmanager
def pinned(model: Machine | str, clamp: bool = True):
    """`with pinned("xeon-spr"): ...` plans for that machine, then restores the previous one."""
    before = list(_PINNED)
    pin(model, clamp)
    try:
        yield machine()
    finally:
        _PINNED[:] = before


def machine() -> Machine:
    return _PINNED[0] if _PINNED else host_machine()


@functools.lru_cache(maxsize=None)
def host_machine() -> Machine:
    c = cache_sizes()
    env = lambda name, default: int(os.environ.get(name, default))  # noqa: E731
    return Machine(l1=env("EQFUSE_L1", c.get(1, 32 << 10)), l2=env("EQFUSE_L2", c.get(2, 1 << 20)),
                   l3=env("EQFUSE_L3", c.get(3, 8 << 20)), simd_floats=env("EQFUSE_SIMD", simd_width_floats()),
                   cores=num_cores())


def register_tile(simd_floats: int, n: int | None = None) -> tuple[int, int]:
    """(MR, NR) of the GEMM micro-kernel.

    MR x NR/simd accumulators plus one row of B must fit the vector registers (32 zmm with
    AVX-512). Among the tiles that do, the widest won when measured on a Sapphire Rapids core
    (1024^3, one thread): 6x64 ~145 GFLOP/s, 8x48 ~125, 12x32 ~120, 28x16 ~108, because each
    A element is one broadcast load and a wide tile needs fewer of them per FMA (6 per 24
    FMAs instead of 12). A problem with few columns (n) gets a narrower tile so that less of
    it is zero padding.
    """
    if simd_floats >= 16:
        if n is not None and n <= 16:
            return 14, 16
        if n is not None and n <= 32:
            return 12, 32
        return 6, 64
    if simd_floats == 8:  # AVX2: 16 ymm registers, 12 accumulators + 2 B + 1 broadcast
        return 6, 16
    return 4, 16


def gemm_blocking(m: Machine | None = None, mr: int | None = None, nr: int | None = None,
                  kc: int | None = None) -> tuple[int, int, int, int, int]:
    """BLIS blocking (MC, NC, KC, MR, NR) for the loop order of csrc_templates/gemm.c.

    There the micro-kernel walks one MR x KC micro-panel of A (kept in L1) across a whole
    KC x NC panel of B (kept in L2). So: KC is as deep as lets the A micro-panel fill a
    quarter of L1 (deep slices mean fewer passes over C; measured best at 384-512 here),
    capped at 512; NC makes the B panel half of L2. The A block MC x KC need not stay in any
    cache (each micro-panel is read once per B panel); MC only bounds the packing buffer and
    how often B is repacked, so it is allowed two L2s' worth (the L3 holds it).
    `kc` fixes KC (a problem with K a bit above KC is done in one slice) and derives the rest.
    """
    m = m or machine()
    dmr, dnr = register_tile(m.simd_floats)
    mr, nr = mr or dmr, nr or dnr
    if kc is None:
        kc = max(64, min(512, (m.l1 // 4) // (mr * 4) // 8 * 8))
    nc = max(nr, (m.l2 // 2) // (kc * 4) // nr * nr)
    mc = max(mr, (2 * m.l2) // (kc * 4) // mr * mr)
    assert kc > 0 and mc > 0 and nc > 0 and mc % mr == 0 and nc % nr == 0, (mc, nc, kc, mr, nr)
    return mc, nc, kc, mr, nr
