"""What this machine is: cache sizes, SIMD width, the ISA kernels are built for, and cores.

Read from the system, overridable with EQFUSE_L1 / EQFUSE_L2 / EQFUSE_L3 (bytes) and EQFUSE_SIMD
(floats per vector). `pin(model)` replaces the whole description, for tests: every planning
decision and the compiler's -march then follow the pinned model, not the host (MODELS holds
the machines the project has run on).

The GEMM's per-CPU choices (register tiles, blocking) are derived from this description, not
searched by measurement: the register file (from the vector width) gives the micro-kernel shape
(`register_tile`, `skinny_tile`: the tile with the fewest loads per FMA whose accumulators fit),
the L1 and L2 sizes give KC, NC and MC (`gemm_blocking`) and the skinny path's bound. Why not a
measured search cached per CPU model: on the shared 2-vCPU VMs eqfuse runs on, a search reads the
load of the moment (numpy's own 1024^3 SGEMM, timed ten minutes apart, read rates almost a
factor of two apart), and a cached answer would freeze that noise into every later
plan, and make the same CPU model plan (and cache kernels) differently from one machine to the
next; a derivation is deterministic, costs no compile-time measurement, and extends to CPUs never
seen (BLIS's analytical model, Low et al. 2016, reaches the tuned parameters' speed the same way).
The derivations were checked against measured neighbours (benchmarks/RESULTS.md), and
`benchmarks/bench_gemm.py --tiles` measures them again on any machine. One choice is a table by
microarchitecture instead, of what was measured: whether the few-rows GEMM prefetches its weight
stream in software (`stream_prefetch`), which depends on the hardware prefetchers, which nothing
in /sys describes.
"""

from __future__ import annotations

import functools
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from eqfuse.cache import owned_privately, usable_cache_dir


@dataclass(frozen=True)
class Machine:
    l1: int  # L1 data cache, bytes per core
    l2: int  # bytes per core
    l3: int  # bytes, shared
    simd_floats: int  # float32 lanes per vector register
    cores: int
    # Whether the few-rows GEMM prefetches its weight stream in software (`stream_prefetch`)
    prefetch: bool = True
    # ISA extensions the planner chooses kernels by (the /proc/cpuinfo flags of the same names):
    # vdpbf16ps / vcvtne2ps2bf16 (a bf16 GEMM's instruction path), AMX-BF16 tiles, vpdpbusd on
    # zmm (AVX512_VNNI) and on ymm in its VEX form (AVX-VNNI: an AVX2-level extension, the int8
    # GEMM's instruction path, plan_gemm.int8_path)
    avx512_bf16: bool = False
    amx_bf16: bool = False
    # vdpbf16ps's multiply-adds per cycle over the f32 FMA's (bf16_peak_ratio of the avx512_bf16
    # path): 2 where it issues as often as the FMA, each doing two multiply-adds a lane; less
    # where it issues more rarely (host_bf16_dot_ratio). At 1 or below, a compute-bound kernel
    # gains nothing from it and keeps f32 under precision="bf16" (plan_gemm.bf16_pays)
    bf16_dot_ratio: float = 2.0
    avx512_vnni: bool = False
    avx_vnni: bool = False
    # AMX-INT8 tiles (tdpbusd: u8 x s8 K-groups of four into int32), the integer GEMM's path
    # qgemm.int8_path "amx_int8"
    amx_int8: bool = False
    # Planner policy, not hardware: on a CPU without a bf16 multiply (the bf16 "fallback" path),
    # precision="bf16" keeps the compute-bound kernels in f32 (plan_gemm.bf16_pays); set, they
    # multiply in bf16 there too. Tests pin it to run the fallback's kernels on any CPU.
    bf16_fallback_all: bool = False
    # An x86-64 level (LEVELS) the kernels are built for instead of this host's own ISA: an
    # artifact (eqfuse.runtime.artifact) must run on every CPU of its level, and -march=native
    # could use an extension that other CPUs of that level lack
    target: str | None = None

    @property
    def march(self) -> tuple[str, ...]:
        """The compiler's target flags: the level of `target` when set; the host's own ISA when
        it is the vector width planned for, else the x86-64 level of that width (AVX2 kernels on
        an AVX-512 host really run the AVX2 code paths)."""
        if self.target is not None:  # the level, and the extensions beyond it the plans use
            return (f"-march={self.target}", *(f for k, fs in EXTENSION_FLAGS.items() if getattr(self, k) for f in fs),
                    "-mtune=native")
        if self.simd_floats >= host_simd_floats():
            return ("-march=native",)
        return ("-march=x86-64-v3", "-mtune=native") if self.simd_floats == 8 else ("-march=x86-64-v2",)


# The ISA extension fields of Machine and the compiler flags that enable each beyond an x86-64
# level (none of the levels has them): an artifact built for a level with one of them runs only on
# a CPU that has it (eqfuse.runtime.artifact)
EXTENSION_FLAGS: dict[str, tuple[str, ...]] = {"avx512_bf16": ("-mavx512bf16",), "amx_bf16": ("-mamx-tile", "-mamx-bf16"),
                                               "avx512_vnni": ("-mavx512vnni",), "amx_int8": ("-mamx-tile", "-mamx-int8")}


# The machines eqfuse has run on (2 vCPUs each), for tests that pin what the planner sees.
MODELS: dict[str, Machine] = {
    "zen4": Machine(l1=32 << 10, l2=1 << 20, l3=32 << 20, simd_floats=16, cores=2, prefetch=False,
                    avx512_bf16=True, avx512_vnni=True),
    "xeon-spr": Machine(l1=48 << 10, l2=2 << 20, l3=105 << 20, simd_floats=16, cores=2,
                        avx512_bf16=True, amx_bf16=True, avx512_vnni=True, amx_int8=True, bf16_dot_ratio=0.5),
    "avx2": Machine(l1=32 << 10, l2=512 << 10, l3=16 << 20, simd_floats=8, cores=2),
}


def _size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * mult


# The x86-64 micro-architecture levels an artifact is built for, lowest first: the cpuinfo flags
# each needs beyond the one below (the psABI's list; lzcnt shows as abm), and its float32 lanes.
LEVELS: dict[str, tuple[frozenset[str], int]] = {
    "x86-64-v2": (frozenset({"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}), 4),
    "x86-64-v3": (frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}), 8),
    "x86-64-v4": (frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}), 16),
}


def level_of_flags(flags: set[str]) -> str | None:
    """The highest level whose flags (and those of every level below) are all in `flags`."""
    best, need = None, set()
    for name, (more, _) in LEVELS.items():
        need |= more
        if not need <= flags:
            break
        best = name
    return best


@functools.cache
def host_level() -> str | None:
    """This CPU's x86-64 level (None: below x86-64-v2, or not x86-64)."""
    try:
        line = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        line = ""
    return level_of_flags(set(line.partition(":")[2].split()))


def level_of(m: Machine) -> str | None:
    """The level kernels planned for `m` need: its `target`, else the level of its vector width."""
    if m.target is not None:
        return m.target
    return next((name for name, (_, lanes) in reversed(LEVELS.items()) if m.simd_floats >= lanes), None)


def level_rank(name: str | None) -> int:
    """0 for None (below every level), then 1, 2, 3 for x86-64-v2, -v3, -v4."""
    return 0 if name is None else list(LEVELS).index(name) + 1


def usable_level() -> str | None:
    """The highest level whose code may run here: the host's, lowered to the machine model's when
    one is pinned (tests pin a lower model to see what a CPU without AVX-512 does)."""
    host, model = host_level(), level_of(machine())
    return host if level_rank(host) <= level_rank(model) else model


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


@functools.cache
def host_simd_floats() -> int:
    return simd_width_floats()


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The flags of /proc/cpuinfo (empty when it cannot be read)."""
    try:
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        flags = ""
    return frozenset(flags.partition(":")[2].split())


def simd_width_floats() -> int:
    words = cpu_flags()
    return 16 if "avx512f" in words else 8 if "avx2" in words else 4


def host_isa() -> dict[str, bool]:
    """The Machine's ISA extension fields for this host (its /proc/cpuinfo flags). EQFUSE_AMX=0
    turns the AMX tiles off, BF16 and INT8 (a Linux kernel that refuses the tile state:
    docs/precision.md)."""
    words = cpu_flags()
    tiles = "amx_tile" in words and os.environ.get("EQFUSE_AMX") != "0"
    return {"avx512_bf16": "avx512_bf16" in words, "amx_bf16": tiles and "amx_bf16" in words,
            "avx512_vnni": "avx512_vnni" in words, "avx_vnni": "avx_vnni" in words,
            "amx_int8": tiles and "amx_int8" in words}


# The multiply-adds per cycle of one core's bf16 instruction paths, against its f32 FMA peak
# (FMA_UNITS vector FMAs of simd_floats lanes per cycle), for the fraction of the peak that
# `benchmarks/bench_gemm.py --precision bf16` prints:
# - vdpbf16ps does two multiply-adds per 32-bit lane at the FMA's throughput: twice the f32 peak;
# - one tdpbf16ps multiplies a 16 x 32 A tile by a 32 x 16 B tile (16 x 16 x 32 = 8192
#   multiply-adds) and the tile unit issues one every AMX_TDP_CYCLES cycles (Intel's optimization
#   manual): 512 multiply-adds, 1024 FLOPs, per cycle, 16 times the f32 peak of two 16-lane FMAs.
FMA_UNITS = 2
AMX_TDP_FMAS = 16 * 16 * 32
AMX_TDP_CYCLES = 16


def bf16_peak_ratio(m: Machine, path: str) -> float:
    """The peak of a bf16 instruction path (plan_gemm's precision_path) over the f32 FMA peak."""
    if path == "amx_bf16":
        return AMX_TDP_FMAS / AMX_TDP_CYCLES / (FMA_UNITS * m.simd_floats)
    return m.bf16_dot_ratio if path == "avx512_bf16" else 1.0


def bf16_dot_ratio(cpuinfo: str) -> float:
    """Machine.bf16_dot_ratio of a CPU (the text of /proc/cpuinfo). Not derivable from the flags:
    it is how often the core issues vdpbf16ps, so it is a table by vendor, of what was measured
    (the vdpbf16ps loop of `benchmarks/bench_gemm.py --precision bf16`, against its f32 FMA loop;
    the figures are in benchmarks/RESULTS.md):
    - Intel: 0.5 (the loop ran at half the f32 FMA peak's FLOPs: one vdpbf16ps every other cycle
      where two FMAs issue each cycle);
    - everything else: 2 (AMD's cores issue it as often as the FMA).
    EQFUSE_BF16_DOT overrides."""
    env = os.environ.get("EQFUSE_BF16_DOT")
    if env:
        return float(env)
    vendor = next((ln.partition(":")[2].strip() for ln in cpuinfo.splitlines() if ln.startswith("vendor_id")), "")
    return 0.5 if vendor == "GenuineIntel" else 2.0


# The ISA extensions that need AVX-512 kernels (zmm, EVEX): off in a model narrower than 16 floats.
# AVX-VNNI is VEX-encoded on ymm and needs only AVX2 (8 floats).
ISA_LANES = {"avx512_bf16": 16, "amx_bf16": 16, "avx512_vnni": 16, "avx_vnni": 8, "amx_int8": 16}


def stream_prefetch(cpuinfo: str) -> bool:
    """Whether software prefetch pays on a sequential weight stream on this CPU (the text of
    /proc/cpuinfo). Not derivable from the caches or the vector width: it is how well the
    hardware prefetchers keep lines in flight, so it is a table by microarchitecture, of what was
    measured (plan_gemm.skinny; `benchmarks/bench_gemm.py --small`, kernel column):
    - AMD family 0x19: off (the 1-row GEMM ran faster without it);
    - everything else: on (faster with it on AMD family 0x1a; Intel not measured).
    The figures are in benchmarks/RESULTS.md. EQFUSE_PREFETCH=0|1 overrides."""
    fields = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("vendor_id", "cpu family") and key.strip() not in fields:
            fields[key.strip()] = value.strip()
        if len(fields) == 2:
            break
    return not (fields.get("vendor_id") == "AuthenticAMD" and fields.get("cpu family") == "25")


def host_prefetch() -> bool:
    env = os.environ.get("EQFUSE_PREFETCH")
    if env in ("0", "1"):
        return env == "1"
    try:
        return stream_prefetch(Path("/proc/cpuinfo").read_text())
    except OSError:
        return True


def openmp_spin_count(cpuinfo: str) -> int:
    """GOMP_SPINCOUNT for eqfuse's OpenMP workers on a CPU (the text of /proc/cpuinfo): how many
    pauses a worker spins after a region before it sleeps (eqfuse.backend.cbuild.SPIN_VAR says why
    briefly). A table by vendor, of what was measured: 2000 (2-thread rows in blocks of calls,
    `benchmarks/bench_rows.py --threads 1 2`); on Intel's cores, whose pause is shorter, 20000:
    ResNet-18 in bf16, its convs short GEMM regions on AMX tiles between one-thread kernels, ran at
    two threads several times slower than at one with 2000 and faster with 20000 (`python
    benchmarks/bench_models.py --precision bf16 --model resnet18`; benchmarks/RESULTS.md)."""
    vendor = next((ln.partition(":")[2].strip() for ln in cpuinfo.splitlines() if ln.startswith("vendor_id")), "")
    return 20000 if vendor == "GenuineIntel" else 2000


def host_openmp_spin_count() -> int:
    try:
        return openmp_spin_count(Path("/proc/cpuinfo").read_text())
    except OSError:
        return openmp_spin_count("")


def host_bf16_dot_ratio() -> float:
    try:
        return bf16_dot_ratio(Path("/proc/cpuinfo").read_text())
    except OSError:
        return bf16_dot_ratio("")


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
    if clamp:
        if m.simd_floats > host_simd_floats():
            m = replace(m, simd_floats=host_simd_floats())
        # nor an instruction the host lacks (its kernels could not run here), nor an AVX-512
        # extension once the vectors are narrower (the kernels are built for x86-64-v3 or less)
        host = host_isa()
        m = replace(m, **{k: getattr(m, k) and host[k] and m.simd_floats >= ISA_LANES[k] for k in host})
    _PINNED.append(m)


@contextmanager
def pinned(model: Machine | str, clamp: bool = True):
    """`with pinned("avx2"): ...` plans for that machine, then restores the previous one."""
    before = list(_PINNED)
    pin(model, clamp)
    try:
        yield machine()
    finally:
        _PINNED[:] = before


def machine() -> Machine:
    return _PINNED[0] if _PINNED else host_machine()


@functools.cache
def host_machine() -> Machine:
    c = cache_sizes()
    env = lambda name, default: int(os.environ.get(name, default))
    simd = env("EQFUSE_SIMD", simd_width_floats())
    return Machine(l1=env("EQFUSE_L1", c.get(1, 32 << 10)), l2=env("EQFUSE_L2", c.get(2, 1 << 20)),
                   l3=env("EQFUSE_L3", c.get(3, 8 << 20)), simd_floats=simd,
                   cores=num_cores(), prefetch=host_prefetch(), bf16_dot_ratio=host_bf16_dot_ratio(),
                   # (AVX-512 extensions only for kernels built for AVX-512: see Machine.march)
                   **{k: v and simd >= ISA_LANES[k] for k, v in host_isa().items()})


def register_tile(simd_floats: int, n: int | None = None) -> tuple[int, int]:
    """(MR, NR) of the GEMM micro-kernel.

    MR x NR/simd accumulators plus one row of B must fit the vector registers (32 zmm with
    AVX-512). Among the tiles that do, the widest won when measured (1024^3, one thread:
    `benchmarks/bench_gemm.py --tiles`), because each
    A element is one broadcast load and a wide tile needs fewer of them per FMA (6 per 24
    FMAs instead of 12). A problem with few columns (n) gets a narrower tile so that less of
    it is zero padding.

    The wide tile is derived from the register file (`fewest_loads_tile` with two registers
    to spare: the A broadcast, or the product without FMA, or headroom): 6x64 with 32 zmm, 6x16
    with 16 ymm, 6x8 with 16 xmm. Checked at 1024^3 against 7x64 (all 32 registers) and 9x48;
    AVX2: 4x24 measured the same as 6x16; SSE: 6x8 and 4x8 the same, the mulps+addps ceiling,
    4x16 (spills) slower (`benchmarks/bench_gemm.py --tiles`).
    """
    if simd_floats >= 16:
        if n is not None and n <= 16:
            return 14, 16
        if n is not None and n <= 32:
            return 12, 32
    elif simd_floats == 8:
        if n is not None and n <= 8:  # 512 x 8 x 512: faster than 6x16 (benchmarks/RESULTS.md)
            return 12, 8
    elif n is not None and n <= 4:  # 512 x 4 x 512: faster than 6x8 and 12x4 (RESULTS.md)
        return 8, 4
    return fewest_loads_tile(simd_floats, vector_registers(simd_floats) - 2)


def fewest_loads_tile(simd_floats: int, budget: int) -> tuple[int, int]:
    """The MR x NR (NR = V vectors, V <= SKINNY_MAX_V) whose MR x V accumulators and V B vectors
    fit `budget` registers and that issues the fewest loads per FMA, (MR + V) / (MR V): a k step
    loads V vectors of B and broadcasts MR elements of A for MR x V FMAs. Ties go to more
    accumulators (more independent FMAs in flight)."""
    best = None
    for v in range(1, SKINNY_MAX_V + 1):
        mr = (budget - v) // v
        if mr < 1:
            continue
        key = ((mr + v) / (mr * v), -mr * v)
        if best is None or key < best[0]:
            best = (key, mr, v * simd_floats)
    assert best is not None, (simd_floats, budget)
    return best[1], best[2]


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


def vector_registers(simd_floats: int) -> int:
    """Architectural vector registers on x86-64: 32 zmm with AVX-512, else 16 (ymm or xmm)."""
    return 32 if simd_floats >= 16 else 16


SKINNY_MAX_V = 4  # at most 4 vectors per row of the skinny tile (an NR of 64 floats with AVX-512)
# The loads the skinny micro-kernel may issue per FMA (the B vectors and the A broadcasts of a k
# step over its FMAs): the general micro-kernel's 6 x 64 tile issues (6 + 4) / 24 = 0.42.
SKINNY_LOADS_PER_FMA = 0.5


def skinny_tile(simd_floats: int, M: int) -> tuple[int, int]:
    """(MR, NR) of the few-rows micro-kernel (csrc_templates/gemm_skinny.c), derived from the
    register file, for M rows in ceil(M / MR) groups of MR.

    A group's MR x NR/simd accumulators, the NR/simd vectors of the B row and the spare
    registers must fit the vector registers (AVX-512 broadcasts A inside the FMA; AVX2 needs one
    register for it; SSE one more for the product, having no FMA); NR is as wide as then fits,
    up to SKINNY_MAX_V vectors. Each group streams all of B through the FMAs (the first from
    memory, the others from L2), so fewer groups are better, as long as a k step issues at most
    SKINNY_LOADS_PER_FMA loads per FMA (MR broadcasts + NR/simd vectors over MR x NR/simd FMAs):
    beyond that the load ports, not the FMA units, set the pace. Measured with B in L3 (16 x 768
    x 3072, `benchmarks/bench_gemm.py --tiles`): 8 x 48 in two groups (0.46 loads per FMA) beat
    16 x 16 in one (1.06). With no tile under the bound (M = 1..3), the one with the fewest loads per FMA.
    """
    regs = vector_registers(simd_floats)
    spare = (0 if simd_floats >= 16 else 1) + (1 if simd_floats < 8 else 0)
    best = None
    # The tiles in order of fewer groups: each MR that ceil(M / groups) takes for some count of
    # groups, from the tallest whose accumulators and B row fit (an MR of regs - spare - 1 rows of
    # one vector) down to 1. Walking the MRs, not the counts of groups, keeps the search to a few
    # dozen steps for any M (a loop over the counts ran M steps, and an ONNX input may say M = 2^31).
    for mr in range(min(M, regs - spare - 1), 0, -1):
        if -(-M // -(-M // mr)) != mr:
            continue  # (no count of groups gives this MR: ceil(M / groups) jumps over it)
        v = min(SKINNY_MAX_V, (regs - spare) // (mr + 1))
        loads = (mr + v) / (mr * v)
        if loads <= SKINNY_LOADS_PER_FMA:
            return mr, v * simd_floats
        if best is None or loads < best[0]:
            best = (loads, mr, v * simd_floats)
    return best[1], best[2]


# ---------------------------------------------------------------- measured speed (the time cost model)

OVERHEAD_S = 2e-6  # per kernel launch (a call through cffi plus loop setup)


def _cache_file() -> Path:
    """Under the cache directory's ownership rule (eqfuse.cache): a file another user could
    write is never read."""
    return usable_cache_dir() / "machine_perf.json"


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
        if owned_privately(path):  # (the file too, not only its directory: nobody else wrote it)
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
