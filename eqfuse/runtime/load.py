"""How many threads a call may use now: the cores that other processes leave free.

An OpenMP parallel region ends at a barrier that waits for every thread of the team. When
another process keeps a core busy, the thread that should run there waits for the scheduler's
next time slice (milliseconds), and a call of a few dozen parallel regions that takes a tenth
of a millisecond on a quiet machine takes hundreds of times as long beside another process's
spinning threads (`benchmarks/bench_load.py` times calls quiet and busy). So each call asks how many cores are free and
uses no more threads than that:

- others = tasks running system-wide (the 4th field of /proc/loadavg, the kernel's count at
  the moment of reading) minus this process's own running threads (/proc/self/task/*/stat,
  state R: the calling thread and any OpenMP worker still spinning). The system-wide count is
  the smaller of two readings, one before the pass over the threads and one after: a thread
  that stops running (another runtime's worker ending its spin) or starts during the pass is
  then counted by neither, where one reading before the pass counted it running system-wide
  and not in this process, as a core another process held (the call then ran its loops on one
  thread: benchmarks/bench_load.py --kind peers, ResNet-18's stages beside onnxruntime);
- free = the CPUs this process may run on minus others, at least 1.

Other runtimes in this process count as other processes do. onnxruntime's threads spin for a
while after each of its runs, OpenVINO's (TBB's) too: a 2-thread call right after one of theirs
found its OpenMP worker sharing a core with a spinning thread, and each region's barrier waited
for the scheduler to give the worker a turn (a call several times as long as alone, and longer
than on one thread: benchmarks/bench_load.py --kind peers). So the threads of this process that
count as its own are the calling thread, its OpenMP team (`eqf_team_tids` of the library, once
per Python thread and team size) and the library's claim-based pool workers (`eqf_pool_tids`):
every other thread of the process in state R is a peer that holds a core. (torch shares eqfuse's libgomp: its OpenMP workers are the calling thread's team,
and spinning after torch's run they take eqfuse's next region at once.)

The claim-based pool of the few-rows GEMM (csrc_templates/common_pool.h) is not limited so: its
caller never waits for a worker that has not started, so it gets the threads asked for
(`threads_requested`), and its worker shares the busy core.

The convs' and pooling's parallel loops (eqf_region ranges, written once) run in a mode each call
picks from the same reading (`call_threads`): OpenMP's static split when every core is free (the
fastest alone, and beside torch, whose spinning OpenMP workers are the call's team); the
claim-based pool with the threads other processes leave free when another runtime's threads are
running (not one thread: the caller claims what the worker does not reach, so a spinning peer
costs at most what one thread costs, and one that stops gives its core back mid-call); the
calling thread alone when other processes hold the cores.

The count is read at most every `INTERVAL` seconds, and `PEERS_INTERVAL` after a reading that
found a core taken: another runtime's spinning ends soon, and a task of another process can be
as brief (a kernel thread's turn on a quiet machine: one such reading kept for `INTERVAL` ran
the next calls' loops on one thread, benchmarks/bench_load.py --kind peers). It is Linux only;
elsewhere every CPU counts as free. A read costs tens of microseconds on a quiet machine and several times that
right after a long call has pushed /proc's data out of the caches, so a call that asks for one thread does not read it at all.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection, Sequence

INTERVAL = 0.05  # seconds between two reads of the running tasks: a load that comes and goes
# faster than this is not followed; a read's cost, once per INTERVAL, stays small against the calls'
PEERS_INTERVAL = 0.005  # seconds a reading that found a core taken is kept: another runtime's
# spinning ends soon after its run (OpenVINO's within a millisecond, onnxruntime's within tens),
# another process's task may be as brief, and a call that finds every core free again runs its
# loops as OpenMP's static split

_lock = threading.Lock()
# (time of the last read, free cores then with this process's other running threads counted as
# holding cores, and with them counted as the call's own: `free_cores`, `free_cores_beside_peers`;
# the OpenMP team's workers then running, when the reading asked: `call_threads`)
_last = [0.0, 0, 0, 0]


def cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def running_total(text: str) -> int:
    """Tasks running now, from the text of /proc/loadavg ("0.52 0.58 0.59 3/456 12345")."""
    return int(text.split()[3].split("/")[0])


def running_counts(task_dir: str = "/proc/self/task", mine: Collection[int] | None = None,
                   also: Collection[int] | None = None) -> tuple[int, ...]:
    """(this process's threads in state R, running or runnable; those of them whose thread ids are
    in `mine`, all of them without it), in one pass over the task directory; with `also`, a third
    count: those whose ids are in it."""
    n = own = other = 0
    for tid in os.listdir(task_dir):
        try:
            with open(f"{task_dir}/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        if stat[stat.rindex(")") + 2] == "R":  # the state follows the command name "(...)"
            n += 1
            own += mine is None or int(tid) in mine
            other += also is not None and int(tid) in also
    return (n, own) if also is None else (n, own, other)


# `settle`'s waits: a pause (above onnxruntime's spinning after a run, tens of milliseconds:
# benchmarks/timing.py probes it), then at most SETTLE_MAX until no other thread runs
SETTLE_PAUSE, SETTLE_MAX = 0.1, 0.5


def settle(wait: float = SETTLE_MAX) -> float:
    """Wait until no thread of this process but the calling one is running, at most `wait`
    seconds; the seconds waited. Another runtime's threads spin on after its run (onnxruntime's
    for tens of milliseconds, OpenBLAS's and OpenMP's too), and a runtime timed right after it
    shares the cores with them: `eqfuse bench` and benchmarks/timing.py time each runtime's
    multi-threaded calls after this."""
    t0 = time.perf_counter()
    while running_counts()[0] > 1 and time.perf_counter() - t0 < wait:
        time.sleep(0.005)
    return time.perf_counter() - t0


def running_own(task_dir: str = "/proc/self/task", mine: Collection[int] | None = None) -> int:
    """This process's threads in state R (running or runnable); with `mine`, only those whose
    thread ids are in it (the calling thread and its OpenMP team: the others are peers)."""
    return running_counts(task_dir, mine)[1]


def _read(now: float | None, mine: Callable[[], Collection[int]] | None,
          workers: Callable[[], Collection[int]] | None = None) -> list:
    """`_last`, read again from /proc when it is INTERVAL old (PEERS_INTERVAL when it found a core
    taken: `_last[1] < cpus()`); with `workers` (the OpenMP team's threads
    but the caller), `_last[3]` counts those of them running."""
    now = time.monotonic() if now is None else now
    if now - _last[0] < (INTERVAL if _last[1] == cpus() else PEERS_INTERVAL) and _last[1]:
        return _last
    with _lock:
        awake = 0
        try:
            with open("/proc/loadavg") as f:
                before = running_total(f.read())
            if workers is None:
                process, own = running_counts(mine=mine() if mine is not None else None)
            else:
                process, own, awake = running_counts(mine=mine() if mine is not None else None, also=workers())
            with open("/proc/loadavg") as f:
                total = min(before, running_total(f.read()))
        except (OSError, ValueError, IndexError):  # no /proc: every CPU is free
            total = process = own = 0
        _last[:] = [now, max(1, cpus() - max(0, total - own)), max(1, cpus() - max(0, total - process)), awake]
        return _last


def free_cores(now: float | None = None, mine: Callable[[], Collection[int]] | None = None) -> int:
    """The cores not taken by other processes, or by threads of this one not in mine() (see the
    module docstring; asked only when /proc is read), at least 1."""
    return _read(now, mine)[1]


def free_cores_beside_peers(now: float | None = None, mine: Callable[[], Collection[int]] | None = None) -> int:
    """The cores not taken by other processes, every thread of this one counted as the call's own
    (another runtime's included), at least 1: the parallel loops of the claim-based pool (see
    `region_threads`)."""
    return _read(now, mine)[2]


def threads_requested(requested: int | None) -> int:
    """The threads a call asks for: `requested`, by default OMP_NUM_THREADS, else every CPU.
    The claim-based pool (csrc_templates/common_pool.h) gets this many, busy cores or not."""
    if requested:
        return requested
    v = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(v) if v.isdigit() and int(v) > 0 else cpus()


_local = threading.local()  # per Python thread: team size -> the thread ids of its OpenMP team


def team_ids(n: int, team: Callable[[int], Sequence[int]]) -> frozenset[int]:
    """The calling thread and its OpenMP team of n threads (team(n): eqf_team_tids of a library),
    asked once per Python thread and size (libgomp keeps a thread's team)."""
    teams = _local.__dict__.setdefault("teams", {})
    ids = teams.get(n)
    if ids is None:
        ids = teams[n] = frozenset(team(n)) | {threading.get_native_id()}
    return ids


def threads_now(requested: int | None, team: Callable[[int], Sequence[int]] | None = None,
                pool: Callable[[], Sequence[int]] | None = None) -> int:
    """The threads an OpenMP region of a call uses: what was asked (`threads_requested`), no
    more than are free. With `team` (see team_ids) the process's other running threads count
    as taking cores, except the claim-based pool's workers (pool(): their thread ids); without
    it, the whole process is the call's own."""
    requested = threads_requested(requested)
    if requested == 1:  # nothing to take away: skip the read
        return 1
    if team is None:
        return max(1, min(requested, free_cores()))
    return max(1, min(requested, free_cores(mine=lambda: team_ids(requested, team) | set(pool() if pool else ()))))


def region_threads(requested: int | None, team: Callable[[int], Sequence[int]] | None = None,
                   pool: Callable[[], Sequence[int]] | None = None) -> int:
    """The threads of the claim-based pool's parallel loops (common_pool.h, eqf_region) when they
    run there: what was asked, no more than other processes leave free; this process's other
    runtimes do not count. Its caller never waits for a worker that has not started, so beside
    another runtime's spinning threads the worker takes what share of the other core it gets and
    the caller the rest; beside another process's steady load a worker stopped by the scheduler
    in the middle of its range holds the caller up for a time slice (the 2-thread call took longer
    than the 1-thread one: benchmarks/bench_load.py --kind peers, under load).
    (team and pool as for `threads_now`: one read of /proc serves both counts.)"""
    requested = threads_requested(requested)
    if requested == 1:
        return 1
    mine = (lambda: team_ids(requested, team) | set(pool() if pool else ())) if team is not None else None
    return max(1, min(requested, free_cores_beside_peers(mine=mine)))


OPENMP = 0  # the mode of the eqf_region loops when every core is free: OpenMP's static split


def call_threads(requested: int | None, team: Callable[[int], Sequence[int]] | None = None,
                 pool: Callable[[], Sequence[int]] | None = None, openmp_kernels: bool = True) -> tuple[int, int]:
    """(OpenMP's threads, the mode of the eqf_region loops: OPENMP or the claim-based pool's
    threads) for one call, from one reading (team and pool as for `threads_now`):

    - every core free (`threads_now` gives what was asked), in a graph with OpenMP kernels
      (`openmp_kernels`: GEMMs, row kernels, ...): the loops run as OpenMP's static split on its
      team, the fastest split when each thread has a core, and one team for the whole call;
      torch's OpenMP workers are that team (one libgomp), so a call beside torch runs so too;
    - every core free in a graph whose parallel loops are all eqf_region or pool loops (a single
      conv, a chain of convs and pooling): the loops on the claim-based pool with the threads
      asked. Between two calls from Python OpenMP's worker has gone to sleep (GOMP_SPINCOUNT,
      docs/backend.md "Threads"), and a static split waits at its end for a worker that comes
      late; the pool's caller starts at once and claims what the worker does not reach, and the
      worker lingers a few hundred microseconds after the call (common_pool.h,
      EQF_POOL_LINGER_NS), so that the next call finds it awake
      (benchmarks/bench_conv.py --set convnext --threads 1 --threads 2). But when the team's
      OpenMP workers are running at the reading (torch's, spinning after its run: one libgomp),
      they are awake: OpenMP's split, as in a graph with OpenMP kernels (a pool worker would
      share a core with them: benchmarks/bench_load.py --kind peers, beside torch);
    - another runtime's threads running in this process (onnxruntime's, OpenVINO's): not one
      thread, but the loops on the claim-based pool with the threads other processes leave free
      (`region_threads`): the caller claims whatever the worker does not reach, so a spinning peer
      costs at most what one thread costs, and one that stops gives its core back mid-call;
    - cores taken by other processes: the free ones (one thread: the loops on the caller).

    OpenMP's own kernels (GEMMs, row kernels, ...) get `threads_now`'s count in every case."""
    requested = threads_requested(requested)
    if requested == 1:
        return 1, 1
    # (the reading that counts the team's workers first: threads_now's then finds it kept)
    awake = not openmp_kernels and team is not None and team_running(requested, team, pool) > 0
    omp = threads_now(requested, team, pool)
    if omp == requested:
        return omp, OPENMP if openmp_kernels or awake else requested
    return omp, region_threads(requested, team, pool)


def team_running(requested: int, team: Callable[[int], Sequence[int]],
                 pool: Callable[[], Sequence[int]] | None = None, now: float | None = None) -> int:
    """The calling thread's OpenMP team's workers (team_ids but the caller) running at the reading
    (read now when the last reading is old, with the call's own threads as `threads_now` counts
    them). The first reading of a Python thread can find them spinning after `eqf_team_tids`'s
    own region: its call then runs as OpenMP's split, as before this rule."""
    return _read(now, lambda: team_ids(requested, team) | set(pool() if pool else ()),
                 lambda: team_ids(requested, team) - {threading.get_native_id()})[3]
