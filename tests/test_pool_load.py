"""The claim-based pool (csrc_templates/common_pool.h) beside other processes: it gets the
threads asked for while OpenMP gets only the free cores, its worker runs off the caller's CPU,
and results stay right with another process busy alongside."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import eqfuse
from eqfuse.runtime import load

# 8 rows over bound weights: the few-rows GEMMs, whose panels the pool's threads claim
MLP = """graph mlp(x: f32[8, 784], w1: f32[784, 1024], b1: f32[1024], w2: f32[1024, 512]) -> f32[8, 512] {
    return relu(x @ w1 + b1) @ w2
}"""


def mlp(threads=2):
    rng = np.random.default_rng(0)
    params = {"w1": (rng.standard_normal((784, 1024)) / 28).astype(np.float32),
              "b1": rng.standard_normal(1024).astype(np.float32),
              "w2": (rng.standard_normal((1024, 512)) / 32).astype(np.float32)}
    mod = eqfuse.compile(MLP, params=params, threads=threads)
    x = rng.standard_normal((8, 784)).astype(np.float32)
    want = np.maximum(x @ params["w1"] + params["b1"], 0) @ params["w2"]
    return mod, x, want


def check(mod, x, want, calls):
    for _ in range(calls):
        np.testing.assert_allclose(mod(x), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def allowed(tid) -> set[int]:
    with open(f"/proc/self/task/{tid}/status") as f:
        text = next(line for line in f if line.startswith("Cpus_allowed_list:")).split(":")[1].strip()
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus |= set(range(int(lo), int(hi or lo) + 1))
    return cpus


def test_the_pool_gets_the_threads_asked_for_openmp_the_free_ones(monkeypatch):
    monkeypatch.setattr(load, "free_cores", lambda now=None, mine=None: 1)  # another process holds a core
    assert load.threads_requested(2) == 2 and load.threads_now(2) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert load.threads_requested(None) == 3 and load.threads_now(None) == 1


needs_two = pytest.mark.skipif(not sys.platform.startswith("linux") or load.cpus() < 2,
                               reason="the worker's placement needs Linux and two CPUs")


@needs_two
def test_the_worker_runs_off_the_callers_cpu():
    before = set(os.listdir("/proc/self/task"))
    mod, x, want = mlp()
    process = set(os.sched_getaffinity(0))
    for _ in range(50):  # (a call whose worker was slow to finish a chunk leaves it free: see test_pool)
        check(mod, x, want, 1)
        moved = [t for t in set(os.listdir("/proc/self/task")) - before if allowed(t) != process]
        if moved:
            break
    assert len(moved) == 1  # the pool's one worker, on every CPU but one: the caller's of its last job
    assert len(process - allowed(moved[0])) == 1
    assert int(moved[0]) in mod.mlp.last.runner._pool()  # a thread of the call's own (runtime.load)


@needs_two
def test_results_stay_right_beside_a_busy_process(monkeypatch):
    """Two threads with a process spinning alongside: OpenMP gets one, the pool two, and its
    worker shares the busy core. (A worker stopped in the middle of a chunk: tests/test_pool.py.)"""
    monkeypatch.setattr(load, "free_cores", lambda now=None, mine=None: 1)
    mod, x, want = mlp()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        check(mod, x, want, 40)
    finally:
        busy.kill()
        busy.wait()
