"""The claim-based thread pool of csrc_templates/common_pool.h and runtime.c, alone: two threads submit 20000
jobs each (1 to 37 chunks, 3 threads per job), and every chunk of every job must run exactly once;
the same with the chunks' items in one run per thread (eqf_runs_claim).
A worker whose core another thread spins on sleeps between jobs.
The second caller finds the pool busy and runs its chunks itself; the first one's jobs race the
workers' claims. A worker that stalls in its chunks is waited for, and freed to run anywhere. With `-m extended` the same program runs under ThreadSanitizer."""

from __future__ import annotations

import os
import platform
import re
import subprocess

import pytest

from eqfuse.backend.cbuild import compiler, runtime_source

# The counts both callers' histograms must hold after their 20000 jobs of 1 + (it * 7) % 37 chunks
# (HARNESS and RUNS): item k ran once in every job longer than k.
COUNTS = r"""
#include <stdio.h>
static inline int counts_match(const long* a, const long* b)
{
    long want[64] = {0};
    for (int it = 0; it < 20000; it++)
        for (long k = 0; k < 1 + (it * 7) % 37; k++)
            want[k]++;
    for (int k = 0; k < 64; k++)
        if (a[k] != want[k] || b[k] != want[k]) {
            printf("item %d ran %ld and %ld times, not %ld\n", k, a[k], b[k], want[k]);
            return 0;
        }
    return 1;
}
"""

HARNESS = r"""
#include <stdio.h>
static void chunk(void* ctx, long k) { long* h = ctx; __atomic_fetch_add(&h[k], 1, __ATOMIC_RELAXED); }
static void* caller(void* arg)
{
    long* h = arg;
    for (int it = 0; it < 20000; it++)
        eqf_parallel_for(1 + (it * 7) % 37, chunk, h, 3);
    return NULL;
}
int main(void)
{
    static long a[64], b[64];
    pthread_t t1, t2;
    pthread_create(&t1, NULL, caller, a);
    pthread_create(&t2, NULL, caller, b);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    if (!counts_match(a, b))
        return 1;
    printf("ok\n");
    return 0;
}
"""


# A worker stopped in the middle of a chunk (here: it sleeps 2 ms in each chunk it claims): once
# the chunk has run EQF_POOL_STALL times the caller's mean chunk, the caller takes the worker to
# its own CPU and naps until it is done (eqf_pool_pull, counted in eqf_pool_freed).
STALLED = r"""
#include <stdio.h>
static pthread_t the_caller;
static void chunk(void* ctx, long k)
{
    long* h = ctx;
    if (!pthread_equal(pthread_self(), the_caller)) {
        const struct timespec ms2 = {0, 2000000};
        nanosleep(&ms2, NULL);
    } else { /* 200 us of work: time for the worker to wake and claim a chunk */
        const long t0 = eqf_pool_now_ns();
        while (eqf_pool_now_ns() - t0 < 200000)
            eqf_pause();
    }
    __atomic_fetch_add(&h[k], 1, __ATOMIC_RELAXED);
}
int main(void)
{
    static long h[8];
    the_caller = pthread_self();
    for (int it = 0; it < 50; it++)
        eqf_parallel_for(8, chunk, h, 2);
    for (int k = 0; k < 8; k++)
        if (h[k] != 50) {
            printf("chunk %d ran %ld times, not 50\n", k, h[k]);
            return 1;
        }
    printf(eqf_pool_freed > 0 ? "ok\n" : "the caller never freed the workers\n");
    return 0;
}
"""


# The same jobs with their items in runs (eqf_runs_claim, the skinny GEMM's plan field `runs`):
# each chunk the pool runs claims one item, from the front of its thread's own run or from the
# back of another's; every item of every job must run exactly once, and a thread's own items in
# order (a run is one sequential stream).
RUNS = r"""
#include <stdio.h>
typedef struct { eqf_runs_t runs; long* h; long n; int bad; } job_t;
static void chunk(void* ctx, long k)
{
    job_t* j = ctx;
    (void)k;
    const long i = eqf_runs_claim(&j->runs);
    if (i < 0 || i >= j->n)
        __atomic_store_n(&j->bad, 1, __ATOMIC_RELAXED);
    else
        __atomic_fetch_add(&j->h[i], 1, __ATOMIC_RELAXED);
}
static void* caller(void* arg)
{
    long* h = arg;
    for (int it = 0; it < 20000; it++) {
        job_t j;
        j.h = h, j.n = 1 + (it * 7) % 37, j.bad = 0;
        eqf_runs_init(&j.runs, j.n, 3);
        eqf_parallel_for(j.n, chunk, &j, 3);
        if (j.bad)
            return (void*)1;
    }
    return NULL;
}
int main(void)
{
    static long a[64], b[64];
    pthread_t t1, t2;
    void *r1, *r2;
    pthread_create(&t1, NULL, caller, a);
    pthread_create(&t2, NULL, caller, b);
    pthread_join(t1, &r1);
    pthread_join(t2, &r2);
    if (r1 || r2) {
        printf("a claim found no item\n");
        return 1;
    }
    if (!counts_match(a, b))
        return 1;
    /* one thread alone (the caller, no worker) takes its own run in order, then the others' from their backs */
    eqf_runs_t r;
    eqf_runs_init(&r, 10, 3);
    long order[10];
    for (int k = 0; k < 10; k++)
        order[k] = eqf_runs_claim(&r);
    const long expect[10] = {0, 1, 2, 5, 4, 3, 9, 8, 7, 6};
    for (int k = 0; k < 10; k++)
        if (order[k] != expect[k]) {
            printf("claim %d took item %ld, not %ld\n", k, order[k], expect[k]);
            return 1;
        }
    printf(eqf_runs_claim(&r) == -1 ? "ok\n" : "a claim past the last item\n");
    return 0;
}
"""


# A worker whose core another thread spins on without yielding (another runtime's pool after its
# run): it finds its core shared (eqf_pool_shared_seen), sleeps between jobs and is woken by
# each, and every chunk still runs once. The caller holds the pool (as a graph's run function
# does) on the first CPU the process may use; the spinner and the worker on the second. Prints the worker's time slice
# request (sched_getattr's runtime) after "ok".
SHARED = r"""
#include <stdio.h>
static volatile int stop;
static void* spinner(void* arg)
{
    (void)arg;
    while (!stop)
        eqf_pause();
    return NULL;
}
static void chunk(void* ctx, long k)
{
    long* h = ctx;
    const long t0 = eqf_pool_now_ns();
    while (eqf_pool_now_ns() - t0 < 20000)
        eqf_pause();
    __atomic_fetch_add(&h[k], 1, __ATOMIC_RELAXED);
}
static void pin(int cpu)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
}
int main(void)
{
    static long h[8];
    cpu_set_t mine;
    int cpus[2], found = 0;
    sched_getaffinity(0, sizeof mine, &mine);
    for (int c = 0; c < CPU_SETSIZE && found < 2; c++)
        if (CPU_ISSET(c, &mine))
            cpus[found++] = c;
    eqf_parallel_for(8, chunk, h, 2); /* (the workers start with the process's CPUs) */
    pin(cpus[0]);
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[1], &one);
    pthread_attr_setaffinity_np(&at, sizeof one, &one);
    pthread_create(&t, &at, spinner, NULL);
    int held = 0;
    eqf_pool_request = 2; /* (as the run function sets it) */
    eqf_pool_hold(&held, 1);
    for (int it = 0; it < 200; it++) {
        eqf_parallel_for(8, chunk, h, 2);
        const long t0 = eqf_pool_now_ns(); /* the caller's own work between two loops */
        while (eqf_pool_now_ns() - t0 < 50000)
            eqf_pause();
    }
    eqf_pool_hold(&held, 0);
    stop = 1;
    pthread_join(t, NULL);
    for (int k = 0; k < 8; k++)
        if (h[k] != 201) {
            printf("chunk %d ran %ld times, not 201\n", k, h[k]);
            return 1;
        }
    if (eqf_pool_shared_seen == 0) {
        printf("the worker never found its core shared\n");
        return 1;
    }
    struct { uint32_t size, policy; uint64_t flags; int32_t nice; uint32_t priority; uint64_t runtime, deadline, period; } a;
    memset(&a, 0, sizeof a);
    syscall(SYS_sched_getattr, eqf_pool_tid[0], &a, (unsigned)sizeof a, 0);
    printf("ok %lu\n", (unsigned long)a.runtime);
    return 0;
}
"""


def _run(tmp_path, *flags, harness=HARNESS):
    src = tmp_path / "pool.c"
    src.write_text(runtime_source() + COUNTS + harness)  # (the header, then csrc_templates/runtime.c)
    exe = tmp_path / "pool"
    subprocess.run(compiler().split() + ["-O2", "-std=gnu11", *flags, str(src), "-o", str(exe), "-lpthread", "-lm"],
                   check=True, capture_output=True, text=True)
    return subprocess.run([str(exe)], check=False, capture_output=True, text=True, timeout=300)


def test_every_chunk_runs_once(tmp_path):
    p = _run(tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr


def test_every_item_of_runs_is_claimed_once(tmp_path):
    p = _run(tmp_path, harness=RUNS)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr


def test_a_stalled_worker_is_waited_for_and_freed(tmp_path):
    p = _run(tmp_path, harness=STALLED)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr


# (a process on one CPU has no core for its worker to share with the spinner: nothing to test there;
# the suite's machines have two or more, so it runs in CI)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs: the caller on one, a spinning thread and the worker on the other")
def test_a_worker_beside_a_spinning_thread_sleeps_between_jobs(tmp_path):
    p = _run(tmp_path, harness=SHARED)
    words = p.stdout.split()
    assert p.returncode == 0 and words[:1] == ["ok"], p.stdout + p.stderr
    release = tuple(int(x) for x in re.findall(r"\d+", platform.release())[:2])
    if release >= (6, 12):  # (EEVDF's slice request: sched_attr.sched_runtime of a fair thread)
        assert int(words[1]) == 100000, "the worker's time slice request did not take"


@pytest.mark.extended
def test_no_data_race_under_thread_sanitizer(tmp_path):
    p = _run(tmp_path, "-fsanitize=thread", "-g", "-Wno-tsan")
    assert p.returncode == 0 and p.stdout.strip() == "ok" and "WARNING: ThreadSanitizer" not in p.stderr, p.stderr[-3000:]
