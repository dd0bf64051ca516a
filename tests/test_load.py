"""Threads under load (eqfuse.runtime.load): a call uses no more threads than other processes
leave cores free, so a parallel region never waits for a thread the OS has not scheduled."""

import itertools
import subprocess
import sys
import time

import numpy as np
import pytest

import eqfuse
from eqfuse.runtime import load


def test_the_running_count_is_the_fourth_field_of_loadavg():
    assert load.running_total("0.52 0.58 0.59 3/456 12345\n") == 3
    assert load.running_total("1.00 2.00 3.00 17/1024 99") == 17


def test_this_process_counts_its_own_running_threads(tmp_path):
    for tid, state in [(1, "R"), (2, "S"), (3, "R"), (4, "D")]:
        (tmp_path / str(tid)).mkdir()
        # a command name with spaces and parentheses, as /proc writes it
        (tmp_path / str(tid) / "stat").write_text(f"{tid} (python (x) y) {state} 1 2 3\n")
    assert load.running_own(str(tmp_path)) == 2
    assert load.running_own() >= 1  # at least the thread reading it
    # (with `also`, those of the running ones in it: the OpenMP team's workers)
    assert load.running_counts(str(tmp_path), mine={1, 2}, also={2, 3, 4}) == (2, 1, 1)


def test_settle_waits_until_no_other_thread_runs_and_no_longer_than_asked(monkeypatch):
    """load.settle (eqfuse bench and benchmarks/timing.py before a multi-threaded timing): it
    reads the running threads until the caller's is the only one, or until `wait` has passed."""
    counts = iter([3, 2, 2, 1, 5])
    monkeypatch.setattr(load, "running_counts", lambda: (next(counts),))
    load.settle(60.0)
    assert next(counts) == 5  # (returned at the first reading of 1)
    reads = []
    monkeypatch.setattr(load, "running_counts", lambda: reads.append(1) or (2,))
    load.settle(0.05)  # another thread that never stops: settle gives up after `wait`
    assert len(reads) >= 2


def test_bench_settles_before_each_multi_threaded_cell(monkeypatch, capsys, tmp_path):
    """`eqfuse bench` waits for the row before's threads to stop spinning before each cell of more
    than one thread (a peer timed beside them ran its 2-thread calls at its 1-thread time)."""
    from eqfuse.cli import bench
    from eqfuse.cli.main import main

    settled = []
    monkeypatch.setattr(bench, "settle", lambda: settled.append(1) or 0.0)
    monkeypatch.setattr(bench, "SETTLE_PAUSE", 0.0)
    src = "graph g(x: f32[64, 32], w: f32[32, 16]) -> f32[64, 16] {\n  return relu(x @ w)\n}\n"
    (tmp_path / "g.g").write_text(src)
    assert main(["bench", str(tmp_path / "g.g"), "--repeat", "2", "--threads", "1", "--threads", "2",
                 "--peers", "numpy"]) == 0
    assert "numpy op by op" in capsys.readouterr().out
    assert len(settled) == 3  # (threads=2 of eqfuse unfused, eqfuse fused and numpy)


def test_free_cores_leave_out_other_processes(monkeypatch):
    monkeypatch.setattr(load, "cpus", lambda: 2)
    monkeypatch.setattr(load, "_last", [0.0, 0, 0])
    monkeypatch.setattr(load, "running_counts", lambda mine=None: (1, 1))
    real_open = open

    def fake_open(path, *a, **k):  # one other process running
        if path == "/proc/loadavg":
            import io
            return io.StringIO("1.0 1.0 1.0 2/300 1\n")
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", fake_open)
    assert load.free_cores(now=100.0) == 1
    assert load.threads_now(2) == 1
    assert load.threads_now(1) == 1


def test_one_thread_asked_reads_nothing(monkeypatch):
    # the read costs up to 300 µs after a long call; one thread needs no count of the others
    def no_read():
        raise AssertionError("free_cores read /proc for a one-thread call")

    monkeypatch.setattr(load, "free_cores", no_read)
    assert load.threads_now(1) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert load.threads_now(None) == 1


def test_a_module_of_one_thread_kernels_reads_nothing(monkeypatch):
    # every kernel below its parallel bar (GPT-2 tiny's): a 2-thread call runs as a 1-thread one
    # and reads no load, which after another runtime's long call cost more than the call
    src = "graph g(x: f32[8, 16], w: f32[16, 16]) -> f32[8, 16] { return relu(x @ w) + 1 }"
    mod = eqfuse.compile(src, threads=2)
    x, w = np.ones((8, 16), np.float32), np.ones((16, 16), np.float32)

    def no_read(now=None, mine=None):
        raise AssertionError("read /proc for a call whose kernels all run on the calling thread")

    monkeypatch.setattr(load, "free_cores", no_read)
    monkeypatch.setattr(load, "free_cores_beside_peers", no_read)
    np.testing.assert_array_equal(mod(x, w), np.maximum(x @ w, 0) + 1)


def test_region_threads_leave_out_other_processes_only(monkeypatch):
    # the pool's loops: another process's running task takes a core, this process's do not
    monkeypatch.setattr(load, "_last", [0.0, 0, 0])
    monkeypatch.setattr(load, "_local", __import__("threading").local())  # (team_ids' answers: this test's own)
    monkeypatch.setattr(load, "cpus", lambda: 2)
    monkeypatch.setattr(load, "running_counts", lambda mine=None: (3, 1))  # 2 peer threads running
    real_open = open

    def fake_open(path, *a, **k):
        if path == "/proc/loadavg":
            import io
            return io.StringIO("0.5 0.5 0.5 4/300 1")  # 3 of this process's + 1 other process's
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", fake_open)
    assert load.threads_now(2, team=lambda n: [1]) == 1
    assert load.region_threads(2, team=lambda n: [1]) == 1  # the other process's task holds a core
    load._last[:] = [0.0, 0, 0]
    monkeypatch.setattr(load, "running_counts", lambda mine=None: (4, 1))  # 3 peer threads, no other process
    assert load.threads_now(2, team=lambda n: [1]) == 1
    assert load.region_threads(2, team=lambda n: [1]) == 2


def test_a_busy_process_alongside_leaves_results_unchanged():
    # the call runs with fewer threads while another process spins; its result is the same
    src = "graph g(x: f32[64, 256], w: f32[256, 256]) -> f32[64, 256] { return relu(x @ w) }"
    mod = eqfuse.compile(src, threads=2)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((64, 256), np.float32), rng.standard_normal((256, 256), np.float32)
    quiet = mod(x, w)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        load._last[0] = 0.0  # read the system again
        under_load = [mod(x, w) for _ in range(5)]
    finally:
        busy.kill()
        busy.wait()
    for y in under_load:
        np.testing.assert_allclose(y, quiet, rtol=1e-5, atol=1e-5)


def test_only_the_callers_team_counts_as_its_own(tmp_path):
    # with `mine`, a running thread of this process outside it (another runtime's, spinning after
    # its run) is counted as holding a core, as another process's would be
    for tid, state in [(1, "R"), (2, "R"), (3, "R"), (4, "S")]:
        (tmp_path / str(tid)).mkdir()
        (tmp_path / str(tid) / "stat").write_text(f"{tid} (python) {state} 1 2 3\n")
    assert load.running_own(str(tmp_path)) == 3
    assert load.running_own(str(tmp_path), mine={1, 2, 4}) == 2
    assert load.running_own(str(tmp_path), mine={1}) == 1


def test_the_team_is_the_calling_threads_openmp_threads(monkeypatch):
    import os
    import threading

    mod = eqfuse.compile("graph g(x: f32[64, 64]) -> f32[64, 64] { return relu(x @ x) }", threads=2)
    mod(np.ones((64, 64), np.float32))
    runner = mod.g.last.runner
    team = load.team_ids(2, runner._team)
    tasks = {int(t) for t in os.listdir("/proc/self/task")}
    assert threading.get_native_id() in team and team <= tasks and 1 <= len(team) <= 2
    assert load.team_ids(2, lambda n: 1 / 0) is team  # asked once per Python thread and size
    other = []
    t = threading.Thread(target=lambda: other.append((threading.get_native_id(), load.team_ids(2, runner._team))))
    t.start()
    t.join()
    assert other[0][0] in other[0][1] and threading.get_native_id() not in other[0][1]
    seen = []
    monkeypatch.setattr(load, "free_cores", lambda now=None, mine=None: seen.append(mine and mine()) or 1)
    assert load.threads_now(2, runner._team, lambda: [7]) == 1 and seen == [team | {7}]  # and the pool's workers
    assert load.threads_now(2) == 1 and seen[-1] is None  # no team: the whole process is the call's
    assert runner._pool is not None and set(runner._pool()) <= tasks  # (none started: no few-rows GEMM ran)


def _reading(monkeypatch, total, process: int, own: int, awake: int = 0):
    """/proc faked: `total` tasks running system-wide (or a list: what each read of /proc/loadavg
    gives in turn), `process` of this process's threads, `own` of them the call's (its team and
    pool), `awake` of them the team's OpenMP workers, on 2 CPUs."""
    import io

    totals = iter(total) if isinstance(total, list) else itertools.repeat(total)

    monkeypatch.setattr(load, "cpus", lambda: 2)
    monkeypatch.setattr(load, "_local", __import__("threading").local())
    monkeypatch.setattr(load, "running_counts",
                        lambda mine=None, also=None: (process, own) if also is None else (process, own, awake))
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: io.StringIO(f"0.5 0.5 0.5 {next(totals)}/300 1")
                        if path == "/proc/loadavg" else real_open(path, *a, **k))


def test_each_call_picks_openmp_the_pool_or_the_caller_for_its_loops(monkeypatch):
    team = lambda n: [1]  # noqa: E731
    monkeypatch.setattr(load, "_last", [0.0, 0, 0])
    _reading(monkeypatch, total=1, process=1, own=1)  # quiet: the loops as OpenMP's split
    assert load.call_threads(2, team) == (2, load.OPENMP)
    load._last[0] = 0.0
    _reading(monkeypatch, total=3, process=3, own=1)  # two peer threads spinning: the pool, 2 threads
    assert load.call_threads(2, team) == (1, 2)
    load._last[0] = 0.0
    _reading(monkeypatch, total=2, process=1, own=1)  # another process: the caller alone
    assert load.call_threads(2, team) == (1, 1)
    assert load.call_threads(1, team) == (1, 1)  # (one thread asked: nothing read)


def test_a_graph_without_openmp_kernels_runs_its_loops_on_the_pool_when_every_core_is_free(monkeypatch):
    # (docs/backend.md "Threads": a single conv between calls from Python finds OpenMP's worker
    # asleep; the pool's caller starts at once and its worker lingers after the call)
    team = lambda n: [1]  # noqa: E731
    monkeypatch.setattr(load, "_last", [0.0, 0, 0])
    _reading(monkeypatch, total=1, process=1, own=1)  # quiet
    assert load.call_threads(2, team, openmp_kernels=False) == (2, 2)
    assert load.call_threads(2, team, openmp_kernels=True) == (2, load.OPENMP)
    load._last[0] = 0.0
    # the team's OpenMP worker running (torch's, spinning after its run): it is awake, OpenMP's split
    monkeypatch.setattr(load, "_local", __import__("threading").local())
    _reading(monkeypatch, total=2, process=2, own=2, awake=1)
    assert load.call_threads(2, lambda n: [1, 2], openmp_kernels=False) == (2, load.OPENMP)
    load._last[0] = 0.0
    _reading(monkeypatch, total=3, process=3, own=1)  # peer threads spinning: the pool, as before
    assert load.call_threads(2, team, openmp_kernels=False) == (1, 2)
    load._last[0] = 0.0
    _reading(monkeypatch, total=2, process=1, own=1)  # another process: the caller alone, as before
    assert load.call_threads(2, team, openmp_kernels=False) == (1, 1)
    assert load.call_threads(1, team, openmp_kernels=False) == (1, 1)


@pytest.mark.parametrize("total, process, first", [
    (3, 3, (1, 2)),  # another runtime's threads spinning in this process: the pool
    # another process's task (a kernel thread's brief turn on a quiet machine: kept for INTERVAL,
    # it ran the next calls' loops on one thread; benchmarks/bench_load.py --kind peers)
    (2, 1, (1, 1)),
])
def test_a_reading_that_found_a_core_taken_is_kept_a_short_while(monkeypatch, total, process, first):
    team = lambda n: [1]  # noqa: E731
    monkeypatch.setattr(load, "_last", [0.0, 0, 0])
    now = [100.0]
    monkeypatch.setattr(load.time, "monotonic", lambda: now[0])
    _reading(monkeypatch, total=total, process=process, own=1)
    assert load.call_threads(2, team) == first
    _reading(monkeypatch, total=1, process=1, own=1)  # the other thread stopped
    now[0] += load.PEERS_INTERVAL / 2
    assert load.call_threads(2, team) == first  # (kept)
    now[0] += load.PEERS_INTERVAL
    assert load.call_threads(2, team) == (2, load.OPENMP)  # read again well before INTERVAL
    _reading(monkeypatch, total=total, process=process, own=1)
    now[0] += load.PEERS_INTERVAL * 2
    assert load.call_threads(2, team) == (2, load.OPENMP)  # a quiet reading is kept for INTERVAL
    assert load.PEERS_INTERVAL * 2 < load.INTERVAL


def test_a_thread_that_stops_during_the_reading_takes_no_core(monkeypatch):
    # another runtime's worker ending its spin between the read of /proc/loadavg and the pass over
    # this process's threads: counted running system-wide, and not in this process
    team = lambda n: [1]  # noqa: E731
    monkeypatch.setattr(load, "_last", [0.0, 0, 0])
    _reading(monkeypatch, total=[2, 1], process=1, own=1)  # (before the pass, after it)
    assert load.call_threads(2, team) == (2, load.OPENMP)
    load._last[0] = 0.0
    _reading(monkeypatch, total=[1, 2], process=1, own=1)  # one that starts during it
    assert load.call_threads(2, team) == (2, load.OPENMP)
    load._last[0] = 0.0
    _reading(monkeypatch, total=[2, 2], process=1, own=1)  # running at both: another process's
    assert load.call_threads(2, team) == (1, 1)


def _bench_load():
    """benchmarks/bench_load.py as a module."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import bench_load

    return bench_load


def test_the_peers_table_has_the_one_thread_call_beside_each_peer():
    # benchmarks/bench_load.py --kind peers: the 1-thread call beside a peer is measured, and each
    # 2-thread row beside a peer is compared with it (/1t-beside: the target's reading)
    bench_load = _bench_load()
    kinds = bench_load.peer_kinds(["onnxruntime", "torch"])
    assert kinds == ["alone", "1 thread", "with onnxruntime", "with torch", "1 thread with onnxruntime",
                     "1 thread with torch"]
    ms = {"alone": 1.0, "1 thread": 2.0, "with onnxruntime": 1.2, "with torch": 3.0,
          "1 thread with onnxruntime": 2.4, "1 thread with torch": 2.0}
    times = {k: [v / 1e3] * 4 for k, v in ms.items()}
    rows = bench_load.peer_rows("mlp", kinds, times, {k: [1e-3] * 4 for k in kinds}, dict.fromkeys(kinds, 0))
    cols = {r[18:52].strip(): r[52:].split() for r in rows}
    assert set(cols) == set(kinds)
    # ms, iqr%, /alone, /1-thread, /1t-beside, pool%, peer ms
    assert cols["with onnxruntime"][2:5] == ["1.20", "0.60", "0.50"]
    assert cols["with torch"][4] == "1.50"  # above 1: slower than the 1-thread call beside torch
    assert cols["1 thread with onnxruntime"][2:4] == ["1.20", "1.20"] and len(cols["1 thread with onnxruntime"]) == 6
    assert "/1t-beside at most 1" in bench_load.PEER_LEGEND.replace("\n", " ")


def test_a_row_alone_waits_for_the_peers_threads(monkeypatch):
    # benchmarks/bench_load.py: a row alone starts once no other thread of the process runs (the
    # peers' threads spin after their runs); here two readings see one, the third none
    bench_load = _bench_load()

    counts = iter([(3, 1), (2, 1), (1, 1)])
    monkeypatch.setattr(load, "running_counts", lambda *a, **k: next(counts))
    naps = []
    monkeypatch.setattr(bench_load.time, "sleep", naps.append)
    bench_load.settle()
    assert naps == [0.005, 0.005] and next(counts, None) is None
