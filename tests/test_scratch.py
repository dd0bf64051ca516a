"""Per-thread scratch buffers (issue 13 item 6): freed when the thread exits, and a failed
allocation raises MemoryError instead of aborting the process.

The GEMM, attention and conv2d kernels keep a scratch buffer per thread (csrc_templates/common.h,
eqf_scratch). EQFUSE_SCRATCH_LIMIT=BYTES makes a buffer larger than that fail as malloc failing
would; it is read when a thread's buffer grows, so the failing calls run on fresh threads.
"""

import os
import threading

import numpy as np
import pytest

import eqfuse
from eqfuse.frontend.load import load
from eqfuse.pipeline import lower

RNG = np.random.default_rng(7)


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def on_fresh_thread(fn):
    """fn() on a new thread (its scratch buffers and its OpenMP team are new): (result, exception)."""
    got = {}

    def run():
        try:
            got["value"] = fn()
        except BaseException as e:  # noqa: BLE001  (handed to the test)
            got["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=120)
    assert not t.is_alive(), "the call hung"
    return got.get("value"), got.get("error")


MLP = """graph mlp(x: f32[64, 784], w1: f32[784, 1024], b1: f32[1024], w2: f32[1024, 10], b2: f32[10]) -> f32[64, 10] {
    h = relu(x @ w1 + b1)
    return h @ w2 + b2
}
"""


@pytest.mark.extended  # (a soak of thread churn: the whole suite's time)
def test_short_lived_threads_do_not_grow_rss():
    # Before the fix each thread left its GEMM packing buffers behind (about 120 KB per thread
    # and thread count): 200 threads a round grew RSS by 20-50 MB every round, without bound.
    args = [RNG.standard_normal(s, dtype=np.float32) * 0.05 for s in [(64, 784), (784, 1024), (1024,), (1024, 10), (10,)]]
    mod = eqfuse.compile(MLP)
    want = mod(*args).copy()
    bad = []

    def work():
        for _ in range(3):
            if not np.array_equal(mod(*args), want):
                bad.append(1)

    sizes = []
    for _ in range(4):
        for _ in range(25):
            ts = [threading.Thread(target=work) for _ in range(8)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
        sizes.append(rss_mb())
    assert not bad
    # after the first round (malloc arenas, thread stacks cached), three more rounds of 200 threads
    growth = sizes[-1] - sizes[0]
    assert growth < 12, f"RSS grew {growth:.1f} MB over 3 rounds of 200 short-lived threads: {sizes}"


CASES = {
    # a GEMM split by columns (M small against N) and one split by rows (the threads pack B
    # together, with barriers: a failure must stop all of them, not leave one at a barrier)
    "gemm-cols": ("graph g(x: f32[64, 784], w: f32[784, 1024]) -> f32[64, 1024] {\n return relu(x @ w)\n}\n",
                  [(64, 784), (784, 1024)]),
    "gemm-rows": ("graph g(x: f32[1024, 512], w: f32[512, 128]) -> f32[1024, 128] {\n return x @ w + 1.0\n}\n",
                  [(1024, 512), (512, 128)]),
    "attention": ("graph g(q: f32[4, 128, 64], k: f32[4, 128, 64], v: f32[4, 128, 64]) -> f32[4, 128, 64] {\n"
                  " return softmax(q @ transpose(k, perm=[0, 2, 1]) * 0.125) @ v\n}\n",
                  [(4, 128, 64)] * 3),
    "conv2d": ("graph g(x: f32[2, 8, 16, 16], w: f32[16, 8, 3, 3]) -> f32[2, 16, 14, 14] {\n"
               " return relu(conv2d(x, w))\n}\n",
               [(2, 8, 16, 16), (16, 8, 3, 3)]),
    "attention-dk": ("graph g(q: f32[2, 64, 16], k: f32[2, 64, 16], v: f32[2, 64, 16], dy: f32[2, 64, 16]) "
                     "-> f32[2, 64, 16] {\n return attention_dk(q, k, v, dy, scale=0.25)\n}\n",
                     [(2, 64, 16)] * 4),
}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", sorted(CASES))
def test_failed_scratch_allocation_raises_memory_error(case, threads, monkeypatch):
    src, shapes = CASES[case]
    mod = eqfuse.compile(src, threads=threads)
    kinds = {k.kind for k in mod.kernels}
    assert kinds & {"contraction", "contraction_row", "attention", "conv2d", "attention_grad"}, kinds
    args = [RNG.standard_normal(s, dtype=np.float32) for s in shapes]
    monkeypatch.setenv("EQFUSE_SCRATCH_LIMIT", "1")
    _, err = on_fresh_thread(lambda: mod(*args))
    assert isinstance(err, MemoryError), err
    assert "scratch buffer" in str(err)
    # the thread's state is not damaged: the next call, on the same kind of fresh thread, computes
    monkeypatch.delenv("EQFUSE_SCRATCH_LIMIT")
    y, err = on_fresh_thread(lambda: mod(*args))
    assert err is None, err
    np.testing.assert_allclose(y, eqfuse.reference(src)(*args), rtol=2e-4, atol=2e-4)


def test_limit_above_the_buffers_changes_nothing(monkeypatch):
    # a cap larger than every buffer the kernels ask for: same result, no error
    src, shapes = CASES["gemm-cols"]
    mod = eqfuse.compile(src, threads=2)
    args = [RNG.standard_normal(s, dtype=np.float32) for s in shapes]
    monkeypatch.setenv("EQFUSE_SCRATCH_LIMIT", str(1 << 30))
    y, err = on_fresh_thread(lambda: mod(*args))
    assert err is None, err
    np.testing.assert_allclose(y, eqfuse.reference(src)(*args), rtol=2e-4, atol=2e-4)


def test_run_function_checks_scratch_kernels_only():
    # the generated run function tests the out-of-memory flag after the kernels that take scratch
    from eqfuse.runtime.program import SCRATCH_KINDS, emit_run, plan_memory

    g = load(CASES["gemm-cols"][0])[0]
    _, kg, plans = lower(g, {})
    c, _ = emit_run(kg, plans, plan_memory(kg, plans))
    scratch = [p for p in plans if p.kind in SCRATCH_KINDS]
    assert scratch and c.count("eqf_nomem_take()") == len(scratch)
