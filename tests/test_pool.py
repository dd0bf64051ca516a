"""The claim-based thread pool of csrc_templates/common_pool.h, alone: two threads submit 20000
jobs each (1 to 37 chunks, 3 threads per job), and every chunk of every job must run exactly once.
The second caller finds the pool busy and runs its chunks itself; the first one's jobs race the
workers' claims. With `-m extended` the same program runs under ThreadSanitizer."""

from __future__ import annotations

import subprocess

import pytest

from eqfuse.backend.cbuild import compiler, header_c

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
    long want[64] = {0};
    for (int it = 0; it < 20000; it++)
        for (long k = 0; k < 1 + (it * 7) % 37; k++)
            want[k]++;
    for (int k = 0; k < 64; k++)
        if (a[k] != want[k] || b[k] != want[k]) {
            printf("chunk %d ran %ld and %ld times, not %ld\n", k, a[k], b[k], want[k]);
            return 1;
        }
    printf("ok\n");
    return 0;
}
"""


def _run(tmp_path, *flags):
    src = tmp_path / "pool.c"
    src.write_text(header_c() + HARNESS)
    exe = tmp_path / "pool"
    subprocess.run(compiler().split() + ["-O2", "-std=gnu11", *flags, str(src), "-o", str(exe), "-lpthread", "-lm"],
                   check=True, capture_output=True, text=True)
    return subprocess.run([str(exe)], check=False, capture_output=True, text=True, timeout=300)


def test_every_chunk_runs_once(tmp_path):
    p = _run(tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr


@pytest.mark.extended
def test_no_data_race_under_thread_sanitizer(tmp_path):
    p = _run(tmp_path, "-fsanitize=thread", "-g", "-Wno-tsan")
    assert p.returncode == 0 and p.stdout.strip() == "ok" and "WARNING: ThreadSanitizer" not in p.stderr, p.stderr[-3000:]
