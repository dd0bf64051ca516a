"""Timing runtimes side by side in one process: calls interleaved, or blocks of calls with the
others' threads asleep.

At one thread every runtime calls on the caller's thread alone, so calls are interleaved one by
one and a disturbance of the machine hits every runtime alike.

At more threads a runtime's worker threads keep running for a while after its call: onnxruntime's
intra-op threads spin for tens of milliseconds, OpenVINO's for under a millisecond (probed by
sampling /proc/self/task/*/stat after a run). A call that follows another runtime's at once then
shares the cores with those spinning threads. eqfuse notices them and calls on fewer threads
(eqfuse/runtime/load.py); the others do not notice, and their barriers wait. That is the
in-process-peers case, which `benchmarks/bench_load.py --kind peers` measures. A comparison of
runtimes instead measures each as its own process would see it, alone. So at more than one thread
each runtime's calls come in blocks: the other runtimes' threads are given `SETTLE` seconds to
sleep, and then as long as it takes until none runs (`settle`, at most `SETTLE_MAX`: until
2026-11-30 the blocks waited `SETTLE` alone, and eqfuse's 2-thread GEMMs of 128 rows after torch's
MKL and oneDNN calls in bench_gemm.py `--peers` ran at their 1-thread time beside those runtimes'
still spinning threads), one untimed call warms the runtime's own threads, then `BLOCK` timed calls. The blocks
rotate through the runtimes, round after round, so slow drifts of the machine still hit all alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# seconds before a block (above onnxruntime's spinning after a run: the probe above), and the
# longest `settle` then waits for the other runtimes' threads to stop spinning: `eqfuse bench`
# waits the same, so both take them from the one place
from eqfuse.runtime.load import SETTLE_MAX, SETTLE_PAUSE as SETTLE

BLOCK = 10  # timed calls per block


def settle() -> float:
    """Wait until no thread of this process but the calling one is running (the other runtimes'
    threads spin for tens of milliseconds after their last run: onnxruntime's and torch's), at most
    SETTLE_MAX; the seconds waited. A call right after torch's ran beside its spinning OpenMP
    threads (the MLP's 2-thread call then took its 1-thread time: bench_load.py), and a prefill
    right after onnxruntime's generation beside its spinning pool (bench_generate.py)."""
    from eqfuse.runtime import load

    return load.settle(SETTLE_MAX)


def alternate(runs: dict[str, Callable[[], object]], repeat: int, threads: int,
              inner: int = 1, cpu_time: bool = False) -> dict[str, list[float]]:
    """`repeat` samples of seconds per call for each run (each sample the mean of `inner` calls):
    interleaved call by call at one thread, in blocks after a settle at more (module docstring).
    `cpu_time` (one thread only): the process's CPU seconds rather than wall-clock seconds, so that
    the time slices other processes take from a shared core are not counted (their effect on the
    caches still is)."""
    if cpu_time and threads != 1:
        raise ValueError("cpu_time counts every thread of the process: one thread only")
    clock = time.process_time if cpu_time else time.perf_counter
    times: dict[str, list[float]] = {k: [] for k in runs}

    def sample(run) -> float:
        t = clock()
        for _ in range(inner):
            run()
        return (clock() - t) / inner

    if threads <= 1:
        for _ in range(repeat):
            for k, run in runs.items():
                times[k].append(sample(run))
        return times
    while any(len(v) < repeat for v in times.values()):
        for k, run in runs.items():
            n = min(BLOCK, repeat - len(times[k]))
            if n <= 0:
                continue
            time.sleep(SETTLE)
            settle()  # (a pool that spins longer than SETTLE: torch's MKL and OpenMP threads)
            run()
            times[k].extend(sample(run) for _ in range(n))
    return times
