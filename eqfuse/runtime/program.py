"""The whole-graph runtime: one C function per compiled graph, called once per graph call.

`plan_memory` lays out, at compile time, where every tensor of the kernel sequence lives:

- a graph input, a top-level constant or a prepacked weight: a slot of the `in` array;
- a view (reshape and kin): the storage of the tensor it views (no code, no call);
- a layout copy written in place (eqfuse.backend.stores): storage of its own, alive from the
  step of its first operand's writer; each writer's result is that storage at its element offset
  (at its out_strides), and the views of a writer's result are views of that storage;
- a kernel's result that is a graph output (the first output that is it, or a view of it): the
  caller's output buffer `out[k]`, written in place;
- every other kernel result: an offset in one arena. Its lifetime is the interval of kernel
  steps from the one that writes it to the last one that reads it (through any views); buffers
  whose lifetimes are disjoint share memory. Offsets are assigned greedily by size, largest
  first, each at the lowest 64-byte aligned offset that overlaps no placed buffer alive at the
  same time (the static memory planners of TVM and XLA). A kernel's result never shares memory
  with its own inputs (their lifetimes meet at its step).

Outputs that are no kernel's own result (an input or a constant returned as is, or a tensor
returned twice) are copied in Python after the call, so no output aliases an input or another
output.

`emit_run` writes `long eqf_<graph>_run(void* const* in, void* const* out, char* arena, int
threads, int pool_threads, int region_threads, long* failed)`: it sets OpenMP's thread count
(threads > 0), the claim-based pool's for the few-rows GEMMs (pool_threads > 0; else OpenMP's)
and the mode of the eqf_region loops of the convs and pooling (region_threads: 0 OpenMP's static
split, k > 0 the claim-based pool with k threads; eqfuse.runtime.load.call_threads picks it per
call), calls every kernel in order
and returns 0, or the count of bad indices of the first index kernel that met any, or EQF_NOMEM
(-1) when a kernel could not allocate its scratch buffer, or EQF_NO_AMX (-3) when an AMX GEMM
found the tile state refused (the plan index of that kernel in *failed; the kernels after it do
not run). `eqf_<graph>_run_profile(1)` makes it add each
kernel's wall time to a table that `eqf_<graph>_run_times` copies out (eqfuse.runtime.profile).

`Runner` makes the one cffi call per graph call. Each Python thread has its own arena, pointer
arrays and output pool (cffi releases the GIL during the call: concurrent calls never share
memory they write); they go with the thread's `threading.local`. The kernels' scratch buffers
(GEMM packing, attention's k^T, conv2d's columns) are per thread in C, freed by a pthread key
destructor when the thread exits; a kernel that cannot allocate one makes the run function return
EQF_NOMEM, and the call raises MemoryError (never abort()).
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import compress
from operator import is_not

import numpy as np

from eqfuse.backend.plan import KernelPlan, size
from eqfuse.errors import ArgumentError, EqfuseError
from eqfuse.ir.graph import Graph
from eqfuse.ir.kernels import K
from eqfuse.ir.shapes import C_TYPE, NUMPY_DTYPE
from eqfuse.runtime.load import OPENMP, call_threads, threads_requested

ALIGN = 64  # bytes: every arena buffer starts on a cache line
_POOL_ONLY = 3  # references to a pooled output held by the pool itself, a local and getrefcount


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass
class MemoryPlan:
    """Where each tensor of one compiled graph lives (see the module's docstring)."""

    root: dict[int, tuple[str, int]]  # kg node -> ("in", slot) | ("out", k) | ("arena", offset)
    inputs: int  # graph inputs, the first slots of `in`
    consts: list[int]  # top-level const nodes, in their `in` slots after the graph inputs
    prepacks: list[tuple[int, int]]  # (kernel step, graph input position of its bound B), slots after the consts
    copies: dict[int, tuple[str, int]]  # output k made in Python: ("in", input position) | ("const", node) | ("out", j)
    arena_bytes: int
    lifetimes: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # arena node -> (bytes, first, last step)
    view_offsets: dict[int, int] = field(default_factory=dict)  # view node -> element offset in its root's storage
    storage: dict[int, int] = field(default_factory=dict)  # kg node -> the node whose storage holds it (views followed)

    @property
    def slots(self) -> int:
        return self.inputs + len(self.consts) + len(self.prepacks)


def _nbytes(kg: Graph, i: int) -> int:
    t = kg.nodes[i].type
    return size(t.shape) * np.dtype(NUMPY_DTYPE[t.dtype]).itemsize


def plan_memory(kg: Graph, plans: list[KernelPlan]) -> MemoryPlan:
    """The static memory plan of a kernelized graph and its kernel plans."""
    src: dict[int, int] = {}  # node -> the node owning its storage (views followed)
    for i in kg.inputs:
        src[i] = i
    consts = [i for i, n in enumerate(kg.nodes) if n.op == "const"]
    for i in consts:
        src[i] = i
    voff: dict[int, int] = {}  # view node -> its element offset in its root (eqfuse.backend.views)
    stores = {p.into[0] for p in plans if p.into is not None}  # layout copies written in place
    for p in plans:  # in order: a view's root is placed before the view
        if p.into is not None:  # the copy (after it in order) owns its storage: src of itself
            src[p.node], voff[p.node] = p.into
        elif p.live is not None and p.live.what == "append":  # written in its cache input's storage
            src[p.node] = p.live.buffer
        elif p.kind == K.VIEW and p.view is not None:
            root, off, _ = p.view
            src[p.node], voff[p.node] = src[root], voff.get(root, 0) + off
        elif p.kind == K.VIEW and p.node not in stores:
            src[p.node], voff[p.node] = src[p.args[0]], voff.get(p.args[0], 0)
        else:
            src[p.node] = p.node
    kernels = [p for p in plans if p.kind != K.VIEW]
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for s, p in enumerate(kernels):
        r = src[p.node]  # the kernel's own result, or a concat's storage from its first writer on
        if not (src.get(r) == r and kg.nodes[r].op == "input"):  # (an append writes its cache input's storage)
            first.setdefault(r, s)
            last[r] = s
        for a in p.args:  # (an append's too: the new rows it reads stay alive until it has run)
            r = src[a]
            if r in last:
                last[r] = max(last[r], s)
    ins = {n: k for k, n in enumerate(kg.inputs)}
    cslot = {n: len(kg.inputs) + k for k, n in enumerate(consts)}
    owner: dict[int, int] = {}  # kernel result -> the output it is written into
    copies: dict[int, tuple[str, int]] = {}
    appends = {p.node for p in plans if p.live is not None and p.live.what == "append"}
    for k, o in enumerate(kg.outputs):
        r = src[o]
        if o in appends:  # a KV cache's present: the cache buffer the call was given, as is
            copies[k] = ("alias", ins[r])
        elif r in first and r not in owner:
            owner[r] = k
        elif r in owner:
            copies[k] = ("out", owner[r])
        elif r in ins:
            copies[k] = ("in", ins[r])
        else:
            copies[k] = ("const", r)
    # greedy by size: the largest buffer first, at the lowest offset free over its lifetime
    bufs = sorted((n for n in first if n not in owner), key=lambda n: (-_nbytes(kg, n), first[n]))
    placed: list[tuple[int, int, int, int]] = []  # (offset, bytes, first, last)
    offsets: dict[int, int] = {}
    lifetimes = {}
    for n in bufs:
        nb, a, z = max(_nbytes(kg, n), 1), first[n], last[n]
        off = 0
        for lo, hi in sorted((o, o + b) for o, b, pa, pz in placed if pa <= z and a <= pz):
            if off + nb <= lo:
                break
            off = max(off, _align(hi))
        placed.append((off, nb, a, z))
        offsets[n], lifetimes[n] = off, (nb, a, z)
    arena = max((_align(o + b) for o, b, _, _ in placed), default=0)
    prepacks = [(s, kernels[s].args[kernels[s].prepack.arg]) for s in range(len(kernels))
                if kernels[s].prepack]
    # (a weight read through a view of a bound input: the input's own elements, at offset 0,
    # eqfuse.backend.lower._bound_inputs)
    assert all(voff.get(a, 0) == 0 for _, a in prepacks)
    prepacks = [(s, ins[src[a]]) for s, a in prepacks]
    root: dict[int, tuple[str, int]] = {}
    for n, r in src.items():
        root[n] = (("in", ins[r]) if r in ins else ("in", cslot[r]) if r in cslot
                   else ("out", owner[r]) if r in owner else ("arena", offsets[r]))
    return MemoryPlan(root, len(kg.inputs), consts, prepacks, copies, arena, lifetimes,
                      {n: o for n, o in voff.items() if o}, src)


# Kernel kinds whose C takes a scratch buffer (eqf_scratch in csrc_templates/common.h): the run
# function checks after each of them that it got its buffers.
SCRATCH_KINDS = frozenset({K.CONTRACTION, K.CONTRACTION_ROW, K.CONV2D, K.ATTENTION, K.ATTENTION_GRAD})


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """An f32 array rounded to bf16 as common.h's eqf_bf16 rounds (to nearest even; a zero or
    denormal to a zero of its sign, a NaN to a quiet NaN), as uint16 bits: a bf16 KV cache."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7fff) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r = np.where((u & 0x7f800000) == 0, ((u >> 16) & 0x8000).astype(np.uint16), r)
    return np.where((u & 0x7fffffff) > 0x7f800000, ((u >> 16) | 0x40).astype(np.uint16), r).astype(np.uint16)


def bf16_widen(b: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) widened to f32 (exact)."""
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def run_name(graph: str) -> str:
    return f"eqf_{graph}_run"


RUN_CDEF = ("long {name}(void* const* in, void* const* out, char* arena, int threads, int pool_threads, "
            "int region_threads, long* failed);")
PROFILE_CDEF = "\nvoid {name}_profile(int on);\nvoid {name}_times(double* ns);"


def emit_run(kg: Graph, plans: list[KernelPlan], mem: MemoryPlan, symbol=lambda name: name) -> tuple[str, str]:
    """(C, cdef) of the graph's run function (see the module's docstring); `symbol` gives the C
    function that runs a plan (eqfuse.backend.emit.Emitted.symbol: kernels with the same C are
    emitted once)."""
    name = run_name(kg.name)
    kernels = [p for p in plans if p.kind != K.VIEW]
    prepack_slot = {s: mem.slots - len(mem.prepacks) + k for k, (s, _) in enumerate(mem.prepacks)}

    def ctype(i: int) -> str:
        return C_TYPE[kg.nodes[i].type.dtype]

    def ptr(i: int) -> str:
        where, at = mem.root[i]
        off = f" + {mem.view_offsets[i]}" if i in mem.view_offsets else ""
        if where == "arena":
            return f"(({ctype(i)}*)(arena + {at}){off})"
        return f"(({ctype(i)}*){where}[{at}]{off})"

    nk = max(len(kernels), 1)
    lines = [f"/* {kg.name}'s kernel times while profiling ({name}_profile, eqfuse.runtime.profile) */",
             f"static double {name}_ns[{nk}];", f"static int {name}_profiling;",
             f"void {name}_profile(int on)", "{", f"    {name}_profiling = on;",
             f"    memset({name}_ns, 0, sizeof {name}_ns);", "}",
             f"void {name}_times(double* ns)", "{", f"    memcpy(ns, {name}_ns, sizeof {name}_ns);", "}",
             f"/* {kg.name}: {len(kernels)} kernels in order; arena {mem.arena_bytes} bytes (static memory plan) */",
             f"static long {name}_kernels(void* const* in, void* const* out, char* arena, long* failed, int* held)",
             "{", "    long bad = 0;", "    (void)in; (void)out; (void)arena; (void)bad; (void)failed; (void)held;",
             f"    const int prof = {name}_profiling;", "    struct timespec t0, t1;", "    (void)t0; (void)t1;"]
    live = [p.live for p in kernels if p.live is not None]
    # the run-time lengths' C names: a KV cache's live length (eqfuse.backend.live) or a named dim's
    # (eqfuse.backend.runtime_dim) `live`; a chunk step's new rows beside a cache `live_new`
    names = {b.new_length: "live_new" for b in live if b.new_length >= 0}
    names.update({b.length: "live" for b in live if b.length not in names})
    for at, var in names.items():  # each refused outside 0 .. its top (the buffers' rows past it)
        slot = kg.inputs.index(at)
        assert kg.nodes[at].type.shape == (1,), "a live length is an i64[1] input"
        top = min(_top(b, at) for b in live if at in (b.length, b.new_length))
        lines += [f"    const long {var} = *(const long*)in[{slot}];",
                  f"    if ({var} < 0 || {var} > {top}) {{", f"        *failed = {var};",
                  f"        return {BAD_LENGTH};", "    }"]
    if len(names) > 1:  # (the cache's live rows and the new ones fit its buffers)
        top = min(b.rows for b in live if b.new_length >= 0)
        lines += [f"    if (live + live_new > {top}) {{", "        *failed = live + live_new;",
                  f"        return {BAD_LENGTH};", "    }"]
    # whether the pool may be held before the kernel (see `hold_pool`); None before the first
    # kernel that says, so that its call is always written (eqf_pool_hold(held, 0) also ends the
    # pool workers' linger after the last call: an OpenMP kernel's threads want the cores)
    held = None
    for s, p in enumerate(kernels):
        hold = hold_pool(p)
        if hold is not None and hold != held:
            lines.append(f"    eqf_pool_hold(held, {hold if isinstance(hold, str) else int(hold)});")
            held = hold
        lines.append("    if (prof) clock_gettime(CLOCK_MONOTONIC, &t0);")
        args = ["NULL" if k in p.unread else ptr(a) for k, a in enumerate(p.args)]
        pre = p.prepack
        if pre:
            args[pre.arg] = f"(void*)in[{prepack_slot[s]}]"  # (panels: float or int8 elements)
        call = f"{symbol(p.name)}({', '.join(args + [ptr(p.node)] + _lengths(p, names))})"
        if p.kind == K.INDEX:
            lines += [f"    if ((bad = {call}) != 0) {{", f"        *failed = {s};", "        return bad;", "    }"]
        else:
            lines.append(f"    {call};")
        lines += ["    if (prof) {", "        clock_gettime(CLOCK_MONOTONIC, &t1);",
                  f"        {name}_ns[{s}] += (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);", "    }"]
        if p.kind in SCRATCH_KINDS:
            lines += ["    if ((bad = eqf_nomem_take()) != 0) {", f"        *failed = {s};", "        return bad;", "    }"]
    lines += ["    return 0;", "}"]
    # The calling thread's OpenMP thread count is set for the call and given back at its end:
    # libgomp is the process's, shared with torch (whose get_num_threads reads this very count,
    # and whose dynamo guards on it) and any other OpenMP code.
    lines += [f"long {name}(void* const* in, void* const* out, char* arena, int threads, int pool_threads, "
              "int region_threads, long* failed)",
              "{", "    const int before = omp_get_max_threads();", "    const int set = threads > 0 && threads != before;",
              "    if (set)", "        omp_set_num_threads(threads);",
              "    __atomic_store_n(&eqf_pool_request, pool_threads, __ATOMIC_RELAXED);",
              "    __atomic_store_n(&eqf_region_request, region_threads, __ATOMIC_RELAXED);",
              "    eqf_parallel_team = region_threads == 0 && omp_get_max_threads() > 1;", "    int held = 0;",
              f"    const long r = {name}_kernels(in, out, arena, failed, &held);", "    eqf_pool_hold(&held, 0);",
              "    eqf_pool_linger();",
              "    if (set)", "        omp_set_num_threads(before);", "    return r;"]
    lines.append("}")
    return "\n".join(lines) + "\n", RUN_CDEF.format(name=name) + PROFILE_CDEF.format(name=name)


HOLD_REGIONS = "eqf_region_on_pool()"  # (held over a kernel of eqf_region loops when they run on the pool with a worker)


def hold_pool(p: KernelPlan) -> bool | str | None:
    """Whether the run function holds the claim-based pool's workers (common_pool.h,
    eqf_pool_hold) when it calls this kernel: True for a skinny GEMM or another kernel whose
    detail says its parallel work runs on the pool (`pool`: the integer GEMM); HOLD_REGIONS,
    held when the call runs the eqf_region loops on the pool with more than one thread, for a
    kernel whose loops are those (`regions`: the direct and Winograd convs, pooling, dynamic_range,
    pointwise kernels, the layernorm, rmsnorm and softmax rows; released when
    they run as OpenMP's split, whose threads want the cores, or all on the caller, where a
    spinning worker would only take a core from others);
    False for a kernel that may open an OpenMP region (its thread would find the pool's worker
    spinning on the core it wants), None for one that runs on the calling thread (the hold
    stays as it is). In OpenMP's mode the pool kernels run their chunks on OpenMP's team
    (eqf_parallel_team, set by the run function) and eqf_pool_hold holds nothing."""
    d = p.detail
    par = may_run_parallel(p)
    if getattr(d, "path", None) == "skinny" or getattr(d, "pool", False):
        return True if par else None
    if getattr(d, "regions", False):
        return HOLD_REGIONS if par else None
    return False if par else None


def may_run_parallel(p: KernelPlan) -> bool:
    """Whether a kernel may use more than one thread: its detail's `parallel` (a layout's, one per
    copy block: any of them); a detail without one may."""
    par = getattr(p.detail, "parallel", True)
    return any(par) if isinstance(par, tuple) else bool(par)


POOL_MAX = 64  # EQF_POOL_MAX of common_pool.h: the pool's most workers
NOMEM = -1  # EQF_NOMEM of common.h: a kernel could not allocate its scratch buffer
NO_AMX = -3  # EQF_NO_AMX of common.h: the operating system refused an AMX GEMM the tile state
def _lengths(p: KernelPlan, names: dict[int, str]) -> list[str]:
    """The run-time lengths kernel p takes after its result (LiveBound.params), by their C names."""
    if p.live is None:
        return []
    if p.live.what == "dim":
        return [names[p.live.length]]
    return ["live", "live_new"] if p.live.new_length >= 0 else ["live"]


def _top(b, at: int) -> int:
    """The largest value bound b lets its run-time length input `at` take: a cache's live length
    past rows - new overflows its buffers (with its new rows at run time too: checked with them),
    a chunk step's new rows are at most new, a named dim's value at most its capacity."""
    if at == b.new_length:
        return b.new
    return b.rows if b.new_length >= 0 else b.rows - b.new


BAD_LENGTH = -2  # the live length of a KV cache is past its buffers (eqfuse.backend.live)
_scratch_key: int | None = None  # the process's one pthread key of per-thread scratch buffers
_scratch_lock = threading.Lock()


def share_scratch_key(lib) -> None:
    """Give a module the process's scratch key, before its first call (see common.h)."""
    global _scratch_key
    with _scratch_lock:
        if _scratch_key is None:
            k = lib.eqf_scratch_key_get()
            _scratch_key = k if k >= 0 else None
        else:
            lib.eqf_scratch_key_adopt(_scratch_key)


class PanelPool:
    """Prepacked weights shared by the runners of one graph's batch buckets
    (eqfuse.runtime.buckets): the buckets' GEMMs of one weight often pack it the same way, and
    a packed copy per bucket would multiply the model's weight memory. A new packing that equals
    one already held for the same weight is dropped for it."""

    def __init__(self):
        self._held: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._lock = threading.Lock()

    def share(self, b: np.ndarray, P: np.ndarray) -> np.ndarray:
        with self._lock:
            held = self._held.setdefault(id(b), [])
            for w, Q in held:
                if w is b and Q.shape == P.shape and np.array_equal(Q, P):
                    return Q
            held.append((b, P))
            return P


class SharedArrays:
    """Bound arrays and packed panels shared by the compiles of one padded model
    (eqfuse.runtime.padded): each bucket of its sequence dim is a compile of its own, which imports
    the model's weights, folds them and packs its GEMMs' panels again. BERT-base at 4 buckets held
    3.0 GB that way; an array equal to one an earlier bucket holds under the same name is that
    array, and one PanelPool serves every bucket, so equal weights are held and packed once."""

    def __init__(self):
        self.panels = PanelPool()
        self.precision: dict = {}  # report["precision"] of every bucket's kernels (eqfuse.pipeline)
        self._held: dict[tuple, list[np.ndarray]] = {}
        self._lock = threading.Lock()
        # The buckets compile on two threads (eqfuse.runtime.padded): their optimizers take turns,
        # so that one's C compiler overlaps the other's optimizer, and no optimizer's time limit
        # (wall clock) is spent waiting for the other's.
        self.optimizing = threading.Lock()
        # Their imports take turns too: an import is Python under the GIL, so two at once end
        # together, late, where one after the other lets the first bucket's optimizer and C
        # compiler start while the second imports (benchmarks/RESULTS.md, 2026-11-29 afternoon).
        self.importing = threading.Lock()

    def arrays(self, named: dict) -> dict:
        """`named` with each array replaced by an equal one held already (name, shape and dtype
        alike), else held from now on."""
        out = {}
        with self._lock:
            for k, a in named.items():
                if not isinstance(a, np.ndarray):
                    out[k] = a
                    continue
                held = self._held.setdefault((k, a.shape, a.dtype.str), [])
                out[k] = next((h for h in held if h is a or np.array_equal(h, a)), None)
                if out[k] is None:
                    held.append(a)
                    out[k] = a
        return out


def aligned_floats(n: int) -> np.ndarray:
    """An empty float32 array of n that starts on a cache line (numpy's start 16 bytes past one,
    and a kernel's 64-byte vector loads of packed weights then each touch two lines)."""
    raw = np.empty(n + ALIGN // 4, dtype=np.float32)
    shift = (-raw.ctypes.data % ALIGN) // 4
    return raw[shift:shift + n]


# Packed panels of a weight the import cache maps (eqfuse.frontend.onnx_cache) are kept beside it,
# memory-mapped like it: a warm compile packs nothing. Their name is a digest of where the weight's
# bytes are (eqfuse.cache.origin_of: the weights file, named by the ONNX file's digest, an offset
# and a length), the library (its module name is the kernel cache's key: the C source and every
# flag, so the packing code and the plan's tiles) and the packing function.


def _panels_path(lib, fn: str, b: np.ndarray, n: int):
    from eqfuse.cache import no_cache, origin_of, usable_cache_dir

    origin = origin_of(b)
    module = getattr(lib, "__name__", None)
    if origin is None or module is None or no_cache():
        return None
    import hashlib

    h = hashlib.sha256(f"eqfuse panels\0{origin}\0{module}\0{fn}\0{n}".encode()).hexdigest()
    # (named after the weights file's entry, which removes them when it is replaced)
    return usable_cache_dir() / "imports" / f"{origin.split('-')[0]}-{h[:32]}.panels"


def cached_panels(lib, fn: str, b: np.ndarray, n: int) -> np.ndarray | None:
    """The panels `fn` packs of b, read-only from the cache, or None."""
    from eqfuse.cache import read_mapped

    path = _panels_path(lib, fn, b, n)
    mm = read_mapped(path, 4 * n) if path is not None else None
    return np.frombuffer(mm, dtype=np.float32, count=n) if mm is not None else None  # (page-aligned)


def keep_panels(lib, fn: str, b: np.ndarray, P: np.ndarray) -> None:
    from eqfuse.cache import write_mapped

    path = _panels_path(lib, fn, b, P.size)
    if path is not None:
        write_mapped(path, [P.data])


HUGE_PAGE = 2 << 20  # bytes of an x86-64 transparent huge page
HUGE_MIN = 1 << 20  # bytes of panels from which they take huge pages (panel_floats)


def panel_floats(n: int) -> np.ndarray:
    """An empty float32 array of n for a bound weight's packed panels, in transparent huge pages
    where the system allows them (Linux's madvise(MADV_HUGEPAGE); elsewhere aligned_floats).

    A decode step streams every weight once from memory, and with 4 KiB pages the stream is cut
    every 4 KiB: a TLB miss (a nested page walk in a VM) and the hardware prefetcher, which stops
    at a page's end, starting over. In 2 MiB pages a plain read of the same bytes ran at twice
    the bandwidth (`benchmarks/bench_skinny.py --pages 4k` against `--pages huge`). numpy asks
    for huge pages only for arrays of 4 MiB or more, and then only over the 2 MiB blocks inside
    them: a 768 x 768 weight (2.4 MB) got none. So panels of HUGE_MIN bytes or more start on a
    2 MiB boundary of their own anonymous mapping, advised as huge pages over their whole 2 MiB
    blocks and over the last, partial one when it is at least HUGE_MIN long (less than HUGE_MIN
    unused: a weight of 1 to 2 MiB takes one whole huge page); a shorter tail stays in 4 KiB
    pages, resident only as far as the panels fill it. The mapping, 2 MiB longer than the array,
    is unmapped with the last array that views it. Smaller panels stay in cache between calls."""
    nbytes = 4 * n
    if nbytes < HUGE_MIN or not hasattr(mmap, "MADV_HUGEPAGE"):
        return aligned_floats(n)
    try:
        mm = mmap.mmap(-1, nbytes + 2 * HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError):
        return aligned_floats(n)
    raw = np.frombuffer(mm, dtype=np.uint8)
    shift = -raw.ctypes.data % HUGE_PAGE
    whole = nbytes // HUGE_PAGE + (nbytes % HUGE_PAGE >= HUGE_MIN)
    try:
        mm.madvise(mmap.MADV_HUGEPAGE, shift, whole * HUGE_PAGE)
    except OSError:  # (a kernel without transparent huge pages: 4 KiB pages, as before)
        pass
    return raw[shift:shift + nbytes].view(np.float32)


_THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_pages() -> bool:
    """Whether madvise(MADV_HUGEPAGE) gets transparent huge pages here: Linux with THP in mode
    `always` or `madvise` (the selected mode is the bracketed word of the sysfs file)."""
    global _huge
    if _huge is None:
        try:
            with open(_THP) as fh:
                mode = fh.read()
        except OSError:
            mode = ""
        _huge = hasattr(mmap, "MADV_HUGEPAGE") and ("[always]" in mode or "[madvise]" in mode)
    return _huge


_huge: bool | None = None


def skinny_panels(plan: KernelPlan, P: np.ndarray) -> bool:
    """Whether a memory-mapped copy of these panels is worth copying into huge pages: the
    few-rows GEMM's (a decode step streams them from memory at every call, gemm_skinny.c), of
    HUGE_MIN bytes or more, where the system has transparent huge pages (panel_floats). A file
    mapping (an artifact's, the import cache's panels) is in 4 KiB pages."""
    return getattr(plan.detail, "path", None) == "skinny" and P.nbytes >= HUGE_MIN and huge_pages()


class HugeCopies:
    """Huge-page copies of memory-mapped panels (skinny_panels), made at their first use and once
    per array, so that the runners of several buckets that adopted the same mapped panels (an
    artifact's: eqfuse.runtime.artifact) share one copy."""

    def __init__(self):
        self._copies: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._lock = threading.Lock()

    def of(self, P: np.ndarray) -> np.ndarray:
        with self._lock:
            got = self._copies.get(id(P))
            if got is None or got[0] is not P:
                flat = P.reshape(-1).view(np.uint8)
                Q = panel_floats(-(-flat.size // 4)).view(np.uint8)[:flat.size]
                Q[:] = flat
                got = self._copies[id(P)] = (P, Q.view(P.dtype).reshape(P.shape))
            return got[1]


def give_back_memory() -> None:
    """Return the C heap's free memory to the system (glibc's malloc_trim; elsewhere nothing).
    Importing an ONNX model frees its protobuf and its intermediate arrays, and glibc keeps the
    freed pages: BERT-base compiled at 4 sequence buckets held 2.97 GB after its first call, and
    1.71 GB after the trim (a trim takes a few ms)."""
    global _trim
    if _trim is None:
        try:
            _trim = ctypes.CDLL(None).malloc_trim
        except (AttributeError, OSError):  # not glibc
            _trim = False
    if _trim:
        _trim(0)


_trim = None


class Runner:
    """Calls a graph's run function: one cffi call per graph call."""

    def __init__(self, kg: Graph, plans: list[KernelPlan], mem: MemoryPlan, lib, ffi, panels: PanelPool | None = None,
                 alias: dict[str, str] | None = None):
        self.kg, self.mem, self.lib, self.ffi = kg, mem, lib, ffi
        self.shared_panels = panels
        self.alias = alias or {}  # plan name -> the kernel whose C it runs (eqfuse.backend.emit, share=True)
        self.kernels = [p for p in plans if p.kind != K.VIEW]
        # every kernel on the calling thread (GPT-2 tiny): a call sets no thread count and reads no
        # load (eqfuse.runtime.load; right after another runtime's long call, a read of /proc
        # cost more than such a whole call: benchmarks/bench_load.py --kind peers)
        self._serial = not any(may_run_parallel(p) for p in plans)
        # whether a kernel may open an OpenMP region: without one, a call on a quiet machine runs
        # its eqf_region loops on the claim-based pool (eqfuse.runtime.load.call_threads)
        self._openmp = any(hold_pool(p) is False for p in self.kernels)
        self.fn = getattr(lib, run_name(kg.name)) if lib is not None and self.kernels else None
        if self.fn is not None:
            share_scratch_key(lib)
        # the calling thread's OpenMP team, told from the process's other threads (runtime.load;
        # None for a library built before eqf_team_tids)
        self._team = self._team_of if self.fn is not None and hasattr(lib, "eqf_team_tids") else None
        self._pool_tids = lib.eqf_pool_tids() if self._team is not None and hasattr(lib, "eqf_pool_tids") else None
        self._pool = self._pool_of if self._pool_tids is not None else None
        self.in_dtypes = [NUMPY_DTYPE[kg.nodes[i].type.dtype] for i in kg.inputs]
        self.consts = [np.array(kg.nodes[i].value, dtype=np.float32) for i in mem.consts]
        self.out_shapes = [(tuple(kg.nodes[o].type.shape), NUMPY_DTYPE[kg.nodes[o].type.dtype]) for o in kg.outputs]
        # bf16 KV caches (eqfuse.backend.live.cache_bf16): the buffer is uint16 (bf16 bits); an f32
        # array given for it is rounded (to nearest even) into a new buffer, which the call
        # returns as the present (its "alias" output)
        self.bf16_slots = frozenset(kg.inputs.index(p.live.buffer) for p in self.kernels
                                    if p.live is not None and p.live.what == "append" and p.live.bf16)
        for k in self.bf16_slots:
            self.in_dtypes[k] = np.dtype(np.uint16)
        for k, (where, at) in mem.copies.items():
            if where == "alias" and at in self.bf16_slots:
                self.out_shapes[k] = (self.out_shapes[k][0], np.dtype(np.uint16))
        # the outputs the kernels write, those that are an input buffer itself, those copied
        self._written = [k for k in range(len(kg.outputs)) if k not in mem.copies]
        self._aliases = [(k, at) for k, (where, at) in mem.copies.items() if where == "alias"]
        self._copied = [k for k, (where, _) in mem.copies.items() if where != "alias"]
        self._prepack_pos = [pos for _, pos in mem.prepacks]  # the input each packed B comes from
        self._packed: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # plan index -> (bound B, its panels)
        self._to_huge: dict[int, HugeCopies] = {}  # adopted mapped panels still to copy (adopt_packed)
        self._pack_lock = threading.Lock()
        self._local = threading.local()

    def _panels(self, s: int, b: np.ndarray) -> np.ndarray:
        # A B bound by params= is the same array at every call: pack it once (kept with the
        # array it came from, and redone should a different array ever arrive).
        got = self._packed.get(s)
        if got is None or got[0] is not b or s in self._to_huge:
            with self._pack_lock:
                got = self._packed.get(s)
                if got is not None and got[0] is b and s in self._to_huge:  # adopted, mapped: copied at first use
                    got = self._packed[s] = (b, self._to_huge.pop(s).of(got[1]))
                if got is None or got[0] is not b:
                    p = self.kernels[s]
                    pre, own = p.prepack, self.alias.get(p.name, p.name)
                    n, fn = getattr(self.lib, pre.floats.replace(p.name, own))(), pre.fn.replace(p.name, own)
                    P = cached_panels(self.lib, fn, b, n)  # (mapped from the import cache: 4 KiB pages)
                    if P is not None and skinny_panels(p, P):
                        P = HugeCopies().of(P)
                    if P is None:
                        P = panel_floats(n)
                        getattr(self.lib, fn)(self.ffi.cast("float *", b.ctypes.data),
                                              self.ffi.cast("float *", P.ctypes.data))
                        keep_panels(self.lib, fn, b, P)
                    if self.shared_panels is not None:
                        P = self.shared_panels.share(b, P)
                    got = self._packed[s] = (b, P)
        return got[1]

    def packed(self) -> dict[int, np.ndarray]:
        """{kernel step: its bound weight's panels} of the weights packed so far (Module.save)."""
        return {s: P for s, (_, P) in self._packed.items()}

    def adopt_packed(self, s: int, b: np.ndarray, P: np.ndarray, huge: HugeCopies | None = None) -> None:
        """Use P as kernel step s's panels of the bound weight b (an artifact's, packed when it
        was saved: eqfuse.runtime.artifact). With `huge`, panels that skinny_panels chooses are
        copied into huge pages at their first use, not now (a load stays a few ms)."""
        with self._pack_lock:
            self._packed[s] = (b, P)
            if huge is not None and skinny_panels(self.kernels[s], P):
                self._to_huge[s] = huge

    def warm(self, arrays: list[np.ndarray]) -> None:
        """Pack the bound weights among `arrays` (the call's, in input order) and make this
        thread's arena now, not at this runner's first call (eqfuse.runtime.buckets warms every
        bucket at the first call, so the first call at a new batch size finds them ready)."""
        if self.fn is None:
            return
        self._state()
        self.pack(arrays)

    def pack(self, arrays: list[np.ndarray | None]) -> None:
        """Pack the bound weights among `arrays` (in input order; None for one passed per call)
        now, in this thread, for the calls to find their panels ready."""
        for s, pos in self.mem.prepacks:
            a = arrays[pos]
            if isinstance(a, np.ndarray) and a.flags.c_contiguous and a.dtype == self.in_dtypes[pos]:
                self._panels(s, a)

    def _team_of(self, n: int) -> list[int]:
        """The thread ids of the calling thread's OpenMP team of n threads (cbuild.COMMON_C)."""
        out = self.ffi.new("long[]", n)
        return list(out[0:self.lib.eqf_team_tids(n, out)])

    def _pool_of(self) -> list[int]:
        """The thread ids of the library's claim-based pool workers (csrc_templates/runtime.c: read from
        its array, no call into C)."""
        return [t for t in self._pool_tids[0:POOL_MAX] if t]

    def last_threads(self) -> dict | None:
        """The threads the calling Python thread's last call used (None before its first):
        `openmp`, OpenMP's count (0: left as it was, no region opens); `pool`, the few-rows
        GEMMs'; `regions`, how the eqf_region loops of the convs and pooling ran: "openmp"
        (OpenMP's static split, every core free), "pool" (the claim-based pool with
        `region_threads` threads: another runtime's threads running in the process) or "caller"
        (the calling thread alone: one thread asked, or other processes holding the cores)."""
        t = self._local.__dict__.get("threads")
        if t is None:
            return None
        omp, pool, regions = t
        mode = "openmp" if regions == OPENMP else "pool" if regions > 1 else "caller"
        return {"openmp": omp, "pool": pool, "regions": mode, "region_threads": omp if regions == OPENMP else regions}

    def _state(self):
        st = self._local.__dict__
        if "ins" not in st:  # this thread's first call: its own arena and pointer arrays
            ffi = self.ffi
            raw = np.empty(self.mem.arena_bytes + ALIGN, dtype=np.uint8)
            shift = -raw.ctypes.data % ALIGN
            st["arena_array"] = raw[shift:shift + self.mem.arena_bytes]
            st["arena"] = ffi.cast("char *", raw.ctypes.data + shift)
            st["ins"] = ffi.new("void *[]", max(self.mem.slots, 1))
            st["outs"] = ffi.new("void *[]", max(len(self.kg.outputs), 1))
            st["failed"] = ffi.new("long *")
            st["pool"] = [None] * len(self.kg.outputs)
            st["spare"] = [None] * len(self.kg.outputs)  # (the buffer before pool's: _run)
            st["held"] = [None] * len(self.kg.inputs)  # the arrays `ins` points into (kept alive)
            st["held_packs"] = [None] * len(self.mem.prepacks)  # the weights whose panels it points to
            for k, c in enumerate(self.consts):
                st["ins"][len(self.kg.inputs) + k] = ffi.from_buffer(c)
        return st

    def __call__(self, arrays: list[np.ndarray], threads: int | None,
                 into: list[np.ndarray | None] | None = None) -> list[np.ndarray]:
        """The outputs for the inputs; `into[k]`, when given and not None, is a C-contiguous array of
        output k's shape and dtype that the call writes (eqfuse.runtime.buckets: a chunk's rows
        of the whole batch's result)."""
        if self.fn is None:  # no kernel: every output is an input or a constant, copied
            arrays = [np.ascontiguousarray(a, dtype=dt) for a, dt in zip(arrays, self.in_dtypes)]
            return [self._copy(k, arrays, []) for k in range(len(self.kg.outputs))]
        st = self._state()
        return self._run(st, self._bind(st, arrays), threads, into)

    def prepared(self, arrays: list[np.ndarray], threads: int | None) -> Callable[[], list[np.ndarray]] | None:
        """A call of this runner over these very arrays, again and again: `run()` gives what
        `self(arrays, threads)` would, reading the arrays' contents at each call (their shapes,
        dtypes and memory stay: a caller writes new values into them). None when an array is
        not passed to C as it is (a copy, a conversion: a later write to it would not be seen)
        or the graph has no kernel.

        What it saves is Python: the repeat call still looks at every array (is it the last
        call's?) and every output, and after a long call, such as a decode step streaming its
        weights, none of the objects it touches is in any cache, so each costs a trip to memory
        (about a tenth of a millisecond a step for GPT-2's 28 arrays, more than the Python's
        own time: benchmarks/bench_generate.py --model gpt2, benchmarks/RESULTS.md). The pointers are set once here; a call checks that no other call of this
        Python thread set others since (then it sets them again) and runs."""
        if self.fn is None or not all(type(a) is np.ndarray and a.flags.c_contiguous and a.dtype == dt
                                      for a, dt in zip(arrays, self.in_dtypes)):
            return None
        st = self._state()
        bound = self._bind(st, arrays)
        token = st["bound_by"] = object()
        owner, get_ident = threading.get_ident(), threading.get_ident
        # the outputs that are the arrays given (a KV cache's presents) filled in once
        template: list = [None] * len(self.out_shapes)
        for k, at in self._aliases:
            template[k] = bound[at]
        if self._copied or len(self._written) != 1:
            return lambda: self._run(st, bound, threads, None) if get_ident() == owner else self(bound, threads)
        # one output the kernels write (a decode step's logits): the pool's buffer or the one
        # before it, as _run takes them
        (k,) = self._written
        shape, dt = self.out_shapes[k]
        outs_p, pool, spare, getrefcount, fb = st["outs"], st["pool"], st["spare"], sys.getrefcount, self.ffi.from_buffer

        def run() -> list[np.ndarray]:
            if get_ident() != owner:  # (another thread: its own state, the whole call)
                return self(bound, threads)
            if st["bound_by"] is not token:  # another call of this thread set other pointers
                self._bind(st, bound)
                st["bound_by"] = token
            o = pool[k]
            if o is None or getrefcount(o) > _POOL_ONLY:
                o = spare[k]
                if o is None or getrefcount(o) > _POOL_ONLY:
                    o = np.empty(shape, dtype=dt)
                spare[k], pool[k] = pool[k], o
            outs_p[k] = fb(o)
            self._call(st, threads)
            outs = template.copy()
            outs[k] = o
            return outs
        return run

    def _bind(self, st: dict, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The arrays as passed to C (contiguous, of the input's dtype), their pointers (and the
        panels of the bound weights among them) set in this thread's state."""
        ins, fb = st["ins"], self.ffi.from_buffer
        # An array that is the one of the last call (a weight bound by params=) keeps its pointer
        # and its packed panels: per call, only the arrays that changed are looked at. `held`
        # keeps arrays as passed to C (contiguous, of the input's dtype): one that is the same
        # object as the last call's needed no copy then and needs none now.
        # (`compress` and `map` find the changed ones at C speed: a ResNet-18 passes 43 arrays,
        # 42 of them bound, and a loop over them in Python cost a few microseconds a call.)
        held = st["held"]
        arrays = list(arrays)
        changed = False
        for k in compress(range(len(arrays)), map(is_not, arrays, held)):
            if k in self.bf16_slots and arrays[k].dtype != np.uint16:
                arrays[k] = bf16_bits(arrays[k])
            a = arrays[k] = np.ascontiguousarray(arrays[k], dtype=self.in_dtypes[k])
            if a is not held[k]:
                ins[k] = fb(a)
                held[k] = a
                changed = True
        prepacks = self.mem.prepacks
        if prepacks:
            base = self.mem.slots - len(prepacks)
            packs = st["held_packs"]
            for k in compress(range(len(prepacks)), map(is_not, map(arrays.__getitem__, self._prepack_pos), packs)):
                s, pos = prepacks[k]
                ins[base + k] = fb(self._panels(s, arrays[pos]))
                packs[k] = arrays[pos]
                changed = True
        if changed:
            st["bound_by"] = None  # (a prepared call's pointers replaced)
        return arrays

    def _run(self, st: dict, arrays: list[np.ndarray], threads: int | None,
             into: list[np.ndarray | None] | None) -> list[np.ndarray]:
        """The C call over the arrays _bind set, and the outputs."""
        outs_p, pool, spare, fb = st["outs"], st["pool"], st["spare"], self.ffi.from_buffer
        outs: list = [None] * len(self.out_shapes)
        getrefcount = sys.getrefcount
        for k in self._written:
            shape, dt = self.out_shapes[k]
            if into is not None and into[k] is not None:
                outs[k] = into[k]
                outs_p[k] = fb(into[k])
                continue
            # Reuse last call's buffer when nobody else holds it (a fresh one costs page faults),
            # else the one before it: a caller that keeps the last result while it calls again
            # (a decode loop's logits) gets two buffers in turn, not a new one at every call.
            o = pool[k]
            if o is None or getrefcount(o) > _POOL_ONLY:
                o = spare[k]
                if o is None or getrefcount(o) > _POOL_ONLY:  # (held: the caller's from now on)
                    o = np.empty(shape, dtype=dt)
                spare[k], pool[k] = pool[k], o
            outs[k] = o
            outs_p[k] = fb(o)
        # OpenMP gets the cores other processes and other runtimes' running threads leave free
        # (its regions wait at their end for every thread); the claim-based pool gets what was
        # asked for the few-rows GEMMs (its caller takes the chunks of a worker that is not
        # scheduled, and the worker keeps off the caller's CPU: common_pool.h, eqf_pool_place);
        # the eqf_region loops run as OpenMP's split when every core is free, else on the pool
        # (eqfuse.runtime.load.call_threads)
        self._call(st, threads)
        for k, at in self._aliases:  # (a KV cache's present: the buffer given, backend.live)
            outs[k] = arrays[at]
        for k in self._copied:
            outs[k] = self._copy(k, arrays, outs)
        return outs

    def _call(self, st: dict, threads: int | None) -> None:
        """The C call over the pointers in st, its failures raised."""
        if self._serial:  # (OpenMP's count left as it is: no region opens)
            st["threads"] = (0, 1, 1)
        else:
            want = threads_requested(threads)
            omp, regions = call_threads(want, self._team, self._pool, self._openmp)
            st["threads"] = (omp, want, regions)
        bad = self.fn(st["ins"], st["outs"], st["arena"], *st["threads"], st["failed"])
        if bad == BAD_LENGTH:
            bounds = [p.live for p in self.kernels if p.live is not None]
            if any(b.new_length >= 0 for b in bounds):  # (a chunk step's: the cache's live rows and the new)
                rows, new = max(b.rows for b in bounds), max(b.new for b in bounds)
                raise ArgumentError(f"{self.kg.name}(): the KV cache's live length and new rows ({st['failed'][0]} "
                                    f"or their sum) pass its buffers: at most {new} new rows, {rows} rows in all")
            top = min(p.live.rows - p.live.new for p in self.kernels if p.live is not None)
            if any(p.live.what == "dim" for p in self.kernels if p.live is not None):  # (backend.runtime_dim)
                raise ArgumentError(f"{self.kg.name}(): the run-time length {st['failed'][0]} is not in 0 .. {top} "
                                    f"(the capacity the dim was compiled at)")
            raise ArgumentError(f"{self.kg.name}(): the KV cache's live length {st['failed'][0]} is not in 0 .. {top} "
                                f"(its buffers hold {top} past rows and the new ones)")
        if bad == NOMEM:
            p = self.kernels[st["failed"][0]]
            raise MemoryError(f"eqfuse: kernel {p.name} ({p.kind}) could not allocate its scratch buffer")
        if bad == NO_AMX:
            p = self.kernels[st["failed"][0]]
            int8 = p.precision_path == "amx_int8"
            raise EqfuseError(f"eqfuse: kernel {p.name} multiplies on AMX-{'INT8' if int8 else 'BF16'} tiles, but the "
                              "operating system refused this process the tile state (Linux: arch_prctl("
                              "ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) failed: it needs Linux 5.16 or later, and "
                              "sigaltstacks large enough for the tile state); with EQFUSE_AMX=0 in the environment "
                              f"eqfuse plans {'vpdpbusd' if int8 else 'vdpbf16ps'} instead")
        if bad:  # an index kernel met indices outside the axis it reads
            p = self.kernels[st["failed"][0]]
            raise ArgumentError(f"{bad} index value(s) out of range in {p.detail.op} (kernel {p.name})")

    def _copy(self, k: int, arrays, outs) -> np.ndarray:
        shape, dt = self.out_shapes[k]
        where, at = self.mem.copies[k]
        if where == "alias":  # a KV cache's present: the buffer given (backend.live)
            return arrays[at]
        srcs = {"in": arrays, "out": outs}
        a = srcs[where][at] if where in srcs else np.array(self.kg.nodes[at].value, dtype=np.float32)
        return np.array(a, dtype=dt).reshape(shape)
