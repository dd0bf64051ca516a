"""The whole-graph runtime (eqfuse.runtime.program): one C call per graph call, a static memory plan
whose buffers never overlap while both are alive, and calls from several threads at once."""

import sys
import threading

import numpy as np
import pytest

import eqfuse
from eqfuse.errors import ArgumentError

MLP3 = "examples/mlp3.g"

# A chain with a branch, a view and two outputs, one of them returned twice: intermediates of
# several sizes and lifetimes.
CHAIN = """
graph chain(x: f32[B, 64], w1: f32[64, 96], w2: f32[96, 64], w3: f32[64, 32]) {
    h = relu(x @ w1)
    g = tanh(h @ w2) + x
    r = reshape(g, shape=[-1, 8, 8])
    s = softmax(g @ w3)
    return s, r, s
}
"""


def arr(*shape, seed=0):
    return np.random.default_rng(seed + len(shape)).standard_normal(shape).astype(np.float32)


def chain_args(B, seed=0):
    return [arr(B, 64, seed=seed), arr(64, 96, seed=seed + 1) * 0.2, arr(96, 64, seed=seed + 2) * 0.2,
            arr(64, 32, seed=seed + 3)]


def library_calls(fn, *args):
    """The calls made from Python into compiled eqfuse libraries while fn(*args) runs."""
    calls = []

    def prof(frame, event, arg):
        if event == "c_call" and str(getattr(arg, "__module__", "")).startswith("_eqf_"):
            calls.append(arg.__name__)

    sys.setprofile(prof)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.heavy
def test_a_multi_kernel_graph_is_one_c_call_per_call():
    mod = eqfuse.compile(MLP3, dims={"B": 8}, threads=2)
    assert len([k for k in mod.kernels if k.kind != "view"]) == 3
    args = [arr(8, 784), arr(784, 512), arr(512), arr(512, 256), arr(256), arr(256, 10), arr(10)]
    mod(*args)  # (a thread's first call also asks once for its OpenMP team's ids: runtime.load)
    for _ in range(3):
        assert library_calls(mod, *args) == ["eqf_mlp3_run"]


def test_the_arena_shares_memory_only_between_buffers_never_alive_together():
    mod = eqfuse.compile(CHAIN, dims={"B": 16}, fuse=False)  # every op its own kernel
    mem = mod.chain.last.memory
    live = [(mem.root[n][1], nb, a, z) for n, (nb, a, z) in mem.lifetimes.items()]
    assert len(live) >= 2
    for i, (o1, b1, a1, z1) in enumerate(live):
        assert o1 % 64 == 0 and o1 + b1 <= mem.arena_bytes
        for o2, b2, a2, z2 in live[i + 1:]:
            if a1 <= z2 and a2 <= z1:  # alive at the same step: disjoint memory
                assert o1 + b1 <= o2 or o2 + b2 <= o1
    # x @ w1 dies once relu has read it: a later buffer reuses its memory
    assert mem.arena_bytes < sum(b for _, b, _, _ in live)


def test_outputs_are_right_distinct_and_the_repeated_one_copied():
    mod = eqfuse.compile(CHAIN, dims={"B": 16}, verify=True, fuse=False)
    args = chain_args(16)
    s, r, s2 = mod(*args)
    np.testing.assert_array_equal(s, s2)
    assert r.shape == (16, 8, 8)
    assert not np.shares_memory(s, s2) and not any(np.shares_memory(o, a) for o in (s, r, s2) for a in args)
    # a second call does not overwrite what the first returned
    s_again = mod(*chain_args(16, seed=5))[0]
    assert not np.array_equal(s, s_again) and not np.shares_memory(s, s_again)
    np.testing.assert_array_equal(s, s2)


@pytest.mark.heavy
def test_concurrent_calls_from_two_threads_each_get_their_own_arena():
    mod = eqfuse.compile(CHAIN, dims={"B": 256}, threads=1)
    inputs = [chain_args(256, seed=10 * t) for t in range(2)]
    want = [mod(*a) for a in inputs]
    errors, arenas = [], {}
    start = threading.Barrier(2)
    runner = mod.chain.last.runner

    def work(t):
        start.wait()
        for _ in range(40):
            got = mod(*inputs[t])
            if not all(np.array_equal(g, w) for g, w in zip(got, want[t])):
                errors.append(t)
        arenas[t] = runner._state()["arena_array"].ctypes.data

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert arenas[0] != arenas[1]


def test_a_bad_index_stops_the_call_with_the_kernel_named():
    src = "graph gi(t: f32[11, 7], ids: i64[5]) { return relu(gather(t, ids)) * 2 }"
    mod = eqfuse.compile(src)
    t = arr(11, 7)
    ids = np.array([0, 3, 10, 2, 1])
    np.testing.assert_allclose(mod(t, ids), np.maximum(t[ids], 0) * 2)
    with pytest.raises(ArgumentError, match=r"2 index value\(s\) out of range in gather \(kernel eqf_gi_k0_index\)"):
        mod(t, np.array([0, 11, 2, -12, 1]))


@pytest.mark.heavy  # (a few seconds: the whole suite runs it, the fast tier not)
def test_profile_times_every_kernel_of_the_call(capsys):
    from eqfuse.cli.main import main
    from eqfuse.runtime.profile import profile, table

    mod = eqfuse.compile(CHAIN, dims={"B": 16}, fuse=False)
    x, w1, w2, w3 = arr(16, 64), arr(64, 96), arr(96, 64), arr(64, 32)
    r = profile(mod, x, w1, w2, w3, repeat=5)
    kernels = [p.name for p in mod.chain.last.runner.kernels]
    assert [k[0] for k in r["kernels"]] == kernels and len(kernels) > 3
    assert all(us > 0 for _, _, us, _ in r["kernels"])
    assert abs(sum(sh for *_, sh in r["kernels"]) - 1) < 1e-9
    assert r["call_us"] >= sum(us for _, _, us, _ in r["kernels"])
    assert "outside the kernels" in table(r)
    # profiling is off again: the counters stay as they were
    c = mod.chain.last
    name = [n for n in dir(c.lib) if n.endswith("_times")][0]
    before, after = np.zeros(len(kernels)), np.zeros(len(kernels))
    getattr(c.lib, name)(c.ffi.cast("double *", before.ctypes.data))
    mod(x, w1, w2, w3)
    getattr(c.lib, name)(c.ffi.cast("double *", after.ctypes.data))
    assert (before == after).all()
    assert main(["bench", "examples/mlp.g", "--dim", "B=8", "--peers", "numpy", "--threads", "1", "--repeat", "3",
                 "--profile"]) == 0
    assert "outside the kernels" in capsys.readouterr().out


def test_arrays_kept_between_calls_are_read_afresh():
    """A call keeps the pointers of the last call's arrays: one changed in place is read with its
    new values, and a strided array (copied for C) is copied again each call."""
    mod = eqfuse.compile(CHAIN, dims={"B": 16})
    ref = eqfuse.reference(CHAIN)
    x, w1, w2, w3 = arr(16, 64), arr(64, 96), arr(96, 64), arr(64, 32)
    mod(x, w1, w2, w3)
    x[:] = arr(16, 64, seed=3)
    w2 *= 2
    np.testing.assert_allclose(mod(x, w1, w2, w3)[0], ref(x, w1, w2, w3)[0], rtol=1e-4, atol=1e-5)
    wide = np.asfortranarray(w1)  # not C-contiguous: copied for C at each call
    mod(x, wide, w2, w3)
    wide[:] = arr(64, 96, seed=5)
    np.testing.assert_allclose(mod(x, wide, w2, w3)[0], ref(x, np.ascontiguousarray(wide), w2, w3)[0],
                               rtol=1e-4, atol=1e-5)


def test_a_repeat_call_takes_the_short_way_and_stays_checked():
    """A call by position, or with every parameter by keyword, with the last call's shapes and
    dtypes goes straight to its run function (GraphFunction._repeat); new values, a new batch
    size, a bad dtype, a bound or unknown keyword still get the result or the error of the full
    path."""
    src = "graph g(x: f32[B, 16], w: f32[16, 8]) -> f32[B, 8] { return relu(x @ w) }"
    ref = eqfuse.reference(src)
    w = arr(16, 8, seed=1)
    mod = eqfuse.compile(src, params={"w": w})
    f = mod.functions["g"]
    for b, seed in ((4, 2), (4, 3), (4, 3), (7, 4), (4, 5)):
        x = arr(b, 16, seed=seed)
        np.testing.assert_allclose(mod(x), ref(x, w), rtol=1e-5, atol=1e-6)
        assert f._repeat is not None and f._repeat[0] == (((b, 16), np.dtype(np.float32)),)
    f.named_arrays = None  # (the full path's first step: a call that took it fails now)
    np.testing.assert_allclose(mod(x=x), ref(x, w), rtol=1e-5, atol=1e-6)  # by keyword: the short way
    del f.named_arrays
    with pytest.raises(ArgumentError, match="no parameter 'y'"):
        mod(y=x)
    with pytest.raises(ArgumentError, match="'w' is bound by params="):
        mod(w=w)
    with pytest.raises(ArgumentError, match="given twice"):
        mod(x, x=x)
    x = arr(5, 16, seed=6)
    np.testing.assert_allclose(mod(x=x), ref(x, w), rtol=1e-5, atol=1e-6)  # a new batch size by keyword
    assert f._repeat[0] == (((5, 16), np.dtype(np.float32)),)
    with pytest.raises(ArgumentError, match="expects dtype float32"):
        mod(x.astype(np.float64))
    with pytest.raises(ArgumentError, match="takes 1 array"):
        mod(x, x)
    np.testing.assert_allclose(mod(np.asfortranarray(x)), ref(x, w), rtol=1e-5, atol=1e-6)  # not C-contiguous


def test_a_prepared_call_reads_its_arrays_afresh_beside_other_calls():
    """GraphFunction.prepare: run() gives the result on the arrays' values at that call, also
    after calls with other arrays on this thread (which set other pointers) and from another
    thread; an array C would get as a copy (not C-contiguous) is not prepared, nor a call on
    batch buckets."""
    src = "graph g(x: f32[B, 16], w: f32[16, 8]) -> f32[B, 8] { return relu(x @ w) }"
    ref = eqfuse.reference(src)
    w = arr(16, 8, seed=1)
    assert eqfuse.compile(src, params={"w": w}).functions["g"].prepare(arr(4, 16)) is None  # (B: a batch dim)
    mod = eqfuse.compile(src, params={"w": w}, dims={"B": 4})
    f = mod.functions["g"]
    x = arr(4, 16, seed=2)
    run = f.prepare(x)
    np.testing.assert_allclose(run(), ref(x, w), rtol=1e-5, atol=1e-6)
    for seed in (3, 4):
        x[:] = arr(4, 16, seed=seed)
        np.testing.assert_allclose(run(), ref(x, w), rtol=1e-5, atol=1e-6)
        other = arr(4, 16, seed=seed + 10)
        np.testing.assert_allclose(mod(other), ref(other, w), rtol=1e-5, atol=1e-6)
    x[:] = arr(4, 16, seed=5)
    got = []
    t = threading.Thread(target=lambda: got.append(run()))
    t.start()
    t.join()
    np.testing.assert_allclose(got[0], ref(x, w), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run(), ref(x, w), rtol=1e-5, atol=1e-6)
    assert f.prepare(np.asfortranarray(x)) is None


def test_a_kept_result_is_never_written_and_two_buffers_take_turns():
    """A caller that keeps each result while it calls again (a decode loop's logits) gets two
    output buffers in turn (Runner._run: the pool's buffer and the one before it), and a result
    still held is never written."""
    src = "graph g(x: f32[4, 16], w: f32[16, 8]) -> f32[4, 8] { return relu(x @ w) }"
    ref = eqfuse.reference(src)
    w = arr(16, 8, seed=1)
    mod = eqfuse.compile(src, params={"w": w})
    last, seen = None, set()
    for seed in range(6):
        x = arr(4, 16, seed=seed)
        kept = None if last is None else (last, last.copy())
        last = mod(x)
        np.testing.assert_allclose(last, ref(x, w), rtol=1e-5, atol=1e-6)
        if kept is not None:
            np.testing.assert_array_equal(kept[0], kept[1])  # the previous result, untouched
        seen.add(last.ctypes.data)
    assert len(seen) == 2
    held = [mod(arr(4, 16, seed=s)) for s in range(3)]  # all three held: three buffers
    assert len({h.ctypes.data for h in held}) == 3
    for s, h in enumerate(held):
        np.testing.assert_allclose(h, ref(arr(4, 16, seed=s), w), rtol=1e-5, atol=1e-6)


def test_the_c_call_releases_the_gil():
    """Another Python thread runs while a call is in its C. The interpreter is made never to take
    the GIL from a thread (a switch interval of 1000 s): the counting thread, which gives the
    GIL up after each count, can then count only while the calling thread has let go of it, and
    between its two reads of the count the caller lets go only in the call (threads=1: the call
    reads no /proc file; the arrays are those of the last call: numpy copies nothing). Held
    through the C, the count could not move; released, it moves as soon as the counting
    thread is scheduled during a call: the calls repeat until it has been."""
    import time

    g = "graph mm(x: f32[256, 512], w: f32[512, 512]) -> f32[256, 512] { return relu(x @ w) }"
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((256, 512), dtype=np.float32), rng.standard_normal((512, 512), dtype=np.float32)
    mod = eqfuse.compile(g, params={"w": w}, threads=1)
    mod(x)
    count, stop, started = [0], [False], threading.Event()

    def counting():
        started.set()
        while not stop[0]:
            count[0] += 1
            time.sleep(0)  # gives the GIL up

    interval = sys.getswitchinterval()
    t = threading.Thread(target=counting)
    sys.setswitchinterval(1000.0)
    try:
        t.start()
        started.wait()
        moved = 0
        for _ in range(1000):
            before = count[0]
            mod(x)
            moved = count[0] - before
            if moved:
                break
    finally:
        stop[0] = True
        sys.setswitchinterval(interval)
        t.join()
    assert moved > 0
