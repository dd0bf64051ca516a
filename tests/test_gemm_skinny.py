"""The few-rows GEMM over a bound B (csrc_templates/gemm_skinny.c) against numpy: every vector
width (AVX-512, AVX2, the portable 4-float one), M = 1..17, N and K that are no multiple of
anything (K = 1), A or B given transposed, C at a row stride wider than N, 1 and 2 threads; and
the planner's choice of it (plan_gemm.skinny) through eqfuse.compile, with epilogues and a row
epilogue, each result checked against the numpy reference."""

import dataclasses
import re

import numpy as np
import pytest
from helpers import one_graph, selected_params

import eqfuse
from eqfuse import machine
from eqfuse.backend.cbuild import COMMON_C, COMMON_CDEF, build, header_c
from eqfuse.backend.kinds.contraction.emit_gemm import emit_gemm_skinny
from eqfuse.backend.kinds.contraction.plan_gemm import SKINNY_MAX_M

SKINNY = "C = epilogue(A @ B) for few rows"  # the header of gemm_skinny.c

WIDTHS = {"avx512": machine.MODELS["zen4"], "avx2": machine.MODELS["avx2"],
          "portable": dataclasses.replace(machine.MODELS["avx2"], simd_floats=4)}
EPILOGUE = "fmaxf(acc + bias[j], 0.0f) + res[i * N + j]"  # reads the row and the column
# (M, N, K, A transposed, B transposed, extra columns of C's row stride, MR or None for the rule)
CASES = [(1, 1, 1, False, False, 0, None), (1, 67, 5, False, False, 0, None), (2, 33, 1, False, True, 0, None),
         (3, 100, 40, True, False, 3, None), (5, 17, 300, False, False, 0, None), (7, 64, 64, False, True, 0, 3),
         (8, 130, 77, False, False, 0, None), (9, 49, 33, True, True, 0, None), (12, 200, 19, False, False, 5, None),
         (16, 31, 100, False, False, 0, None), (17, 90, 65, False, True, 0, None), (13, 20, 9, False, False, 0, 13)]


def tile(m, M, mr):
    rule_mr, nr = machine.skinny_tile(m.simd_floats, M)
    return (mr or rule_mr), nr


def source(name, case, m, parallel):
    M, N, K, at, bt, pad, mr = case
    mr, nr = tile(m, M, mr)
    return emit_gemm_skinny(name, M=M, N=N, K=K, lda=M if at else K, ldb=K if bt else N, ldc=N + pad, mr=mr, nr=nr,
                            pf=64 if M == 8 else 0, a_transposed=at, b_transposed=bt, epilogue=EPILOGUE,
                            extras=[("float", "bias"), ("float", "res")], parallel=parallel,
                            runs=parallel)  # (the panels in runs per thread, skinny_runs, at any count of panels)


@pytest.fixture(scope="module", params=sorted(WIDTHS))
def width(request):
    m = WIDTHS[request.param]
    if m.simd_floats > machine.host_simd_floats():  # (the suite's floor is AVX2: only an older host skips)
        pytest.skip(f"this host has no {m.simd_floats}-float vectors")
    # only the cases this run tests at this width (the fast tier's one: 2.8 -> 0.5 s); all in the whole suite
    chosen = selected_params(request, "test_skinny_gemm_matches_numpy", "n", width=request.param) or range(len(CASES))
    with machine.pinned(m, clamp=False):
        parts = [source(f"s{n}_{p}", c, m, p) for n, c in enumerate(CASES) if n in chosen for p in (False, True)]
        built = build(header_c() + COMMON_C + "\n".join(s for s, _ in parts),
                      COMMON_CDEF + "\n" + "\n".join(c for _, c in parts), f"skinny_{request.param}")
    yield request.param, m, built


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", range(len(CASES)))
def test_skinny_gemm_matches_numpy(width, n, threads):
    _, _, built = width
    M, N, K, at, bt, pad, _ = CASES[n]
    rng = np.random.default_rng(n)
    A, B = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
    bias, res = rng.standard_normal(N, dtype=np.float32), rng.standard_normal((M, N), dtype=np.float32)
    Ain = np.ascontiguousarray(A.T) if at else A
    Bin = np.ascontiguousarray(B.T) if bt else B
    C = np.full((M, N + pad), np.nan, np.float32)  # every element of C written, none of the padding
    ffi, lib = built.ffi, built.lib
    ptr = lambda a: ffi.cast("float*", ffi.from_buffer(a))
    lib.eqf_set_threads(threads)
    want = np.maximum(A.astype(np.float64) @ B + bias, 0) + res
    for parallel in (False, True):
        name = f"s{n}_{parallel}"
        P = np.full(getattr(lib, f"{name}_prepack_floats")(), np.nan, np.float32)
        getattr(lib, f"{name}_prepack")(ptr(Bin), ptr(P))
        assert not np.isnan(P).any()  # the panels are all written, padding as zeros
        C[:] = np.nan
        getattr(lib, name)(ptr(Ain), ptr(P), ptr(C), ptr(bias), ptr(res))
        np.testing.assert_allclose(C[:, :N], want, rtol=1e-4, atol=1e-4 * np.sqrt(K) * max(1.0, np.abs(want).max()))
        assert np.isnan(C[:, N:]).all()


@pytest.mark.parametrize("simd", [16, 8, 4])
def test_the_skinny_tile_fits_the_registers(simd):
    """Every group's accumulators, its B row and the spare registers fit the register file, and
    the groups are as few as the load bound allows (machine.skinny_tile)."""
    regs = machine.vector_registers(simd)
    for M in range(1, SKINNY_MAX_M + 1):
        mr, nr = machine.skinny_tile(simd, M)
        v = nr // simd
        assert nr % simd == 0 and 1 <= mr <= M and v <= machine.SKINNY_MAX_V
        assert mr * v + v + (simd < 16) + (simd < 8) <= regs, (simd, M, mr, nr)
    assert machine.skinny_tile(16, 8) == (8, 48)  # all 8 rows in registers, 27 of 32 zmm
    assert machine.skinny_tile(16, 16) == (8, 48)  # 16 x 16 would issue a load per FMA
    # the blocked GEMM's wide tile, from the same rule with two registers to spare
    assert [machine.register_tile(w) for w in (16, 8, 4)] == [(6, 64), (6, 16), (6, 8)]


def _fewest_groups(simd: int, M: int) -> tuple[int, int]:
    """machine.skinny_tile's rule by its definition: every count of groups, fewest first."""
    regs, spare = machine.vector_registers(simd), (simd < 16) + (simd < 8)
    best = None
    for groups in range(1, M + 1):
        mr = -(-M // groups)
        v = min(machine.SKINNY_MAX_V, (regs - spare) // (mr + 1))
        if v >= 1:
            loads = (mr + v) / (mr * v)
            if loads <= machine.SKINNY_LOADS_PER_FMA:
                return mr, v * simd
            best = min(best or (loads, mr, v * simd), (loads, mr, v * simd), key=lambda t: t[0])
    return best[1], best[2]


@pytest.mark.parametrize("simd", [16, 8, 4])
def test_the_skinny_tile_takes_the_fewest_groups_at_any_m(simd):
    """machine.skinny_tile walks the tiles, not the counts of groups: the same tile as the rule's
    definition, and an answer at M = 2^31 (the fuzzer's ONNX input of 2147483648 rows, whose
    `eqfuse opt` the walk over the counts kept planning for minutes)."""
    for M in range(1, 700):
        assert machine.skinny_tile(simd, M) == _fewest_groups(simd, M), M
    M, regs, spare = 2**31, machine.vector_registers(simd), (simd < 16) + (simd < 8)
    v = lambda r: min(machine.SKINNY_MAX_V, (regs - spare) // (r + 1))  # noqa: E731
    loads = lambda r: (r + v(r)) / (r * v(r))  # noqa: E731
    # the MRs some count of groups gives, tallest (fewest groups) first, of the tiles that fit
    tiles = [r for r in range(regs - spare - 1, 0, -1) if -(-M // -(-M // r)) == r]
    under = [r for r in tiles if loads(r) <= machine.SKINNY_LOADS_PER_FMA]
    want = under[0] if under else min(tiles, key=loads)
    assert machine.skinny_tile(simd, M) == (want, v(want) * simd)


GRAPH = """graph f(x: f32[{M}, {K}], w: f32[{K}, {N}], b: f32[{N}]) -> f32[{M}, {N}] {{
    return kernel {{ relu(x @ w + b) }}
}}"""


def compiled(src, params, free, threads=1):
    mod = eqfuse.compile(src, params=params, fuse="manual", threads=threads)
    ref, names = eqfuse.reference(src), [n for n, _ in one_graph(src).params]
    for call in range(2):  # the second call reuses the panels of the first
        xs = {k: v * (call + 1) for k, v in free.items()}
        want = ref(*[{**params, **xs}[n] for n in names])
        np.testing.assert_allclose(mod(*xs.values()), want, rtol=2e-4, atol=2e-4 * max(1.0, np.abs(want).max()))
    return mod


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("M,N,K", [(1, 70, 33), (8, 130, 1), (16, 47, 200), (SKINNY_MAX_M, 20, 9)])
def test_bound_weight_with_few_rows_takes_the_skinny_path(M, N, K, threads):
    rng = np.random.default_rng(M)
    w = rng.standard_normal((K, N), dtype=np.float32)
    mod = compiled(GRAPH.format(M=M, N=N, K=K), {"w": w},
                   {"x": rng.standard_normal((M, K), dtype=np.float32), "b": rng.standard_normal(N, dtype=np.float32)},
                   threads)
    (k,) = mod.kernels
    assert set(k.tiles) == {"mr", "nr", "groups", "pf"} and SKINNY in k.c_source
    for key, value in k.tiles.items():  # the plan's tiles are the constants of the C
        assert re.search(rf"#define \w+_gemm_{key.upper()} {value}\b", k.c_source), (key, value)


@pytest.mark.parametrize("model,pf", [("zen4", 0), ("xeon-spr", 1024)])
def test_the_weight_stream_is_prefetched_where_the_cpu_gains(model, pf):
    """Software prefetch of B is per CPU (machine.stream_prefetch): off on a Zen 4, on elsewhere;
    either kernel against numpy."""
    rng = np.random.default_rng(5)
    M, N, K = 1, 300, 700
    with machine.pinned(model):
        mod = compiled(GRAPH.format(M=M, N=N, K=K), {"w": rng.standard_normal((K, N), dtype=np.float32)},
                       {"x": rng.standard_normal((M, K), dtype=np.float32),
                        "b": rng.standard_normal(N, dtype=np.float32)})
    (k,) = mod.kernels
    assert k.tiles["pf"] == pf and re.search(rf"#define \w+_PF {pf}\b", k.c_source)  # (#if _PF > 0: the prefetch)


def test_the_prefetch_table_reads_vendor_and_family():
    info = "processor\t: 0\nvendor_id\t: {}\ncpu family\t: {}\nmodel\t\t: 17\n"
    assert not machine.stream_prefetch(info.format("AuthenticAMD", 25))  # Zen 3, Zen 4
    assert machine.stream_prefetch(info.format("AuthenticAMD", 26))  # Zen 5
    assert machine.stream_prefetch(info.format("GenuineIntel", 6))
    assert machine.stream_prefetch("")  # unknown: as measured on the Zen 5


def test_more_rows_or_an_unbound_weight_take_the_blocked_path():
    rng = np.random.default_rng(3)
    K, N = 40, 50
    w, b = rng.standard_normal((K, N), dtype=np.float32), rng.standard_normal(N, dtype=np.float32)
    M = SKINNY_MAX_M + 1
    x = rng.standard_normal((M, K), dtype=np.float32)
    (k,) = compiled(GRAPH.format(M=M, N=N, K=K), {"w": w}, {"x": x, "b": b}).kernels
    assert "kc" in k.tiles and SKINNY not in k.c_source
    (k,) = compiled(GRAPH.format(M=4, N=N, K=K), {}, {"x": x[:4], "w": w, "b": b}).kernels
    assert "kc" in k.tiles and SKINNY not in k.c_source


@pytest.mark.parametrize("model", ["zen4", "avx2"])
def test_the_plan_follows_the_pinned_machine(model):
    """Planned only, never built nor run: each model as it is (zen4's 16-float vectors on any host)."""
    from eqfuse.pipeline import lower, optimize

    with machine.pinned(model, clamp=False) as m:
        g, _ = optimize(one_graph(GRAPH.format(M=8, N=100, K=30)), fuse="manual")
        (p,) = [p for p in lower(g, {}, fuse="manual", params=frozenset({"w"}))[2] if p.kind != "view"]
    mr, nr = machine.skinny_tile(m.simd_floats, 8)
    assert (p.tiles["mr"], p.tiles["nr"]) == (mr, nr) == ((8, 48) if model == "zen4" else (4, 24))


@pytest.mark.heavy  # (the fast tier's time)
def test_row_epilogue_transposed_and_folded_weights():
    """A layernorm over each finished row, a weight read transposed, batches folded into rows."""
    rng = np.random.default_rng(5)
    arr = lambda *s: rng.standard_normal(s).astype(np.float32)
    src = ("graph f(x: f32[5, 48], w: f32[48, 64], b: f32[64], g: f32[64], be: f32[64]) -> f32[5, 64] "
           "{ return kernel { layernorm(x @ w + b, g, be) } }")
    mod = compiled(src, {"w": arr(48, 64), "g": arr(64), "be": arr(64)}, {"x": arr(5, 48), "b": arr(64)}, threads=2)
    assert [k.kind for k in mod.kernels] == ["contraction_row"] and "groups" in mod.kernels[0].tiles
    src = ("graph f(x: f32[2, 3, 40], w: f32[67, 40]) -> f32[2, 3, 67] "
           "{ return kernel { tanh(x @ transpose(w)) * 0.5 } }")
    mod = compiled(src, {"w": arr(67, 40)}, {"x": arr(2, 3, 40)}, threads=2)
    assert "groups" in mod.kernels[0].tiles
    src = ("graph f(x: f32[30, 6], w: f32[30, 50]) -> f32[6, 50] "
           "{ return kernel { transpose(x) @ w + 1 } }")  # A given transposed
    mod = compiled(src, {"w": arr(30, 50)}, {"x": arr(30, 6)})
    assert "groups" in mod.kernels[0].tiles and "A given transposed (K x M)" in mod.kernels[0].c_source


def test_the_threads_share_the_panels_in_runs_from_four_panels():
    """plan_gemm.skinny_runs: a parallel skinny GEMM gives each thread a contiguous run of its
    panels from SKINNY_RUNS_MIN_PANELS panels on; a serial one, or fewer panels, claims in turn."""
    from eqfuse.backend.kinds.contraction.plan_gemm import (
        SKINNY_RUNS_MIN_PANELS,
        skinny_runs,
    )

    assert skinny_runs(True, SKINNY_RUNS_MIN_PANELS) and skinny_runs(True, 786)
    assert not skinny_runs(True, SKINNY_RUNS_MIN_PANELS - 1) and not skinny_runs(False, 786)


def test_a_few_columns_narrow_the_panel():
    """N = 10 (an MLP's last layer): one panel of 16 columns (two AVX2 vectors, one AVX-512),
    not 48 (24 with AVX2) of which most would be padding."""
    rng = np.random.default_rng(9)
    w, b, x = (rng.standard_normal(s, dtype=np.float32) for s in ((64, 10), (10,), (8, 64)))
    (k,) = compiled(GRAPH.format(M=8, N=10, K=64), {"w": w}, {"x": x, "b": b}).kernels
    mr, nr = machine.skinny_tile(machine.machine().simd_floats, 8)
    assert (k.tiles["mr"], k.tiles["nr"]) == (mr, 16) and nr > 16


@pytest.mark.heavy  # (the fast tier's time)
@pytest.mark.parametrize("M", [3, 20])  # one group of rows, three groups
def test_a_counting_build_makes_the_micro_kernel_calls_the_plan_counts(M):
    """The uop schedule of a skinny plan is what runs: its micro-kernel count (panels x groups)
    is the count a -DEQF_COUNT_UKERNEL build of the kernel makes."""
    from eqfuse.backend.emit import emit_graph
    from eqfuse.backend.lower import lower_graph

    _, plans = lower_graph(one_graph(GRAPH.format(M=M, N=70, K=33)), machine.machine(), params=frozenset({"w"}))
    (p,) = [p for p in plans if p.kind == "contraction"]
    assert p.detail.path == "skinny"
    (want,) = [u.count for u in p.uops if u.what.startswith("micro-kernel")]
    assert want == -(-70 // p.tiles["nr"]) * p.tiles["groups"]
    em = emit_graph(plans)
    lib = build(em.source, em.cdef + f"\nlong {p.name}_gemm_ukernel_calls(void);", "count_skinny",
                extra_flags=("-DEQF_COUNT_UKERNEL",))
    buf = np.zeros(1 << 16, dtype=np.float32)  # the count does not depend on the values
    nargs = re.search(rf"void {p.name}\(([^)]*)\)", em.source).group(1).count(",") + 1
    getattr(lib.lib, p.name)(*[lib.ffi.from_buffer("float[]", buf)] * nargs)
    assert getattr(lib.lib, f"{p.name}_gemm_ukernel_calls")() == want


def test_the_pool_under_concurrent_calls():
    """The claim-based pool of common_pool.h serves one job at a time: Python threads calling
    skinny kernels at once (cffi releases the GIL) run the jobs that find it busy on their own
    thread. Every result stays exact, across two modules of different sizes."""
    import threading

    rng = np.random.default_rng(7)
    mods, want = [], []
    for M, N, K in ((8, 300, 64), (4, 1000, 33)):
        w, b = rng.standard_normal((K, N), dtype=np.float32), rng.standard_normal(N, dtype=np.float32)
        x = rng.standard_normal((M, K), dtype=np.float32)
        src = GRAPH.format(M=M, N=N, K=K)
        mods.append((eqfuse.compile(src, params={"w": w}, fuse="manual", threads=2), x, b))
        want.append(eqfuse.reference(src)(x, w, b))
    errors = []

    def worker(k):
        mod, x, b = mods[k % 2]
        for _ in range(200):
            got = mod(x, b)
            if not np.allclose(got, want[k % 2], rtol=2e-4, atol=2e-4 * max(1.0, np.abs(want[k % 2]).max())):
                errors.append(k)
                return
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(SKINNY in k.c_source for mod, _, _ in mods for k in mod.kernels)


CHAIN = """graph f(x: f32[{M}, 768], w1: f32[768, 3072], b1: f32[3072], w2: f32[3072, 768], b2: f32[768],
          g: f32[768], be: f32[768], w3: f32[768, 768]) -> f32[{M}, 768] {{
    h = layernorm(x + (gelu(x @ w1 + b1) @ w2 + b2), g, be)
    return softmax(h * 4.0, axis=-1) @ w3
}}"""


@pytest.mark.parametrize("M", [16, 32])
@pytest.mark.heavy
def test_transformer_sized_gemms_on_two_threads(M, monkeypatch):
    """BERT-base's few-rows GEMMs on two threads, as in a model: A packed in parts by the pool,
    the panels claimed by both threads, the pool held over its run of kernels and released
    before an OpenMP region (softmax), each result against numpy, call after call."""
    import eqfuse.runtime.program as program

    monkeypatch.setattr(program, "call_threads", lambda t, *own: (t, program.OPENMP))  # two threads, however loaded
    rng = np.random.default_rng(M)
    arr = lambda *s: (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)
    params = {"w1": arr(768, 3072), "b1": arr(3072), "w2": arr(3072, 768), "b2": arr(768), "g": arr(768),
              "be": arr(768), "w3": arr(768, 768)}
    mod = compiled(CHAIN.format(M=M), params, {"x": rng.standard_normal((M, 768), dtype=np.float32)}, threads=2)
    skinny = [k for k in mod.kernels if SKINNY in k.c_source]
    assert len(skinny) == 3 and all(re.search(r"_PACK_PARTS [1-9]", k.c_source) for k in skinny)


@pytest.mark.parametrize("M,N,K,parallel", [(1, 768, 768, True), (2, 3000, 96, True), (1, 192, 64, False)])
def test_a_weight_that_streams_from_memory_is_shared_by_the_threads(M, N, K, parallel, monkeypatch):
    """A decode step's few-rows GEMM over a weight of a megabyte or more runs on the pool however
    few its multiply-adds (plan_gemm.skinny_parallel: its time is the stream of the weight);
    a small one stays on the calling thread. Each against numpy, on two threads."""
    import eqfuse.runtime.program as program

    monkeypatch.setattr(program, "call_threads", lambda t, *own: (t, program.OPENMP))  # two threads, however loaded
    rng = np.random.default_rng(N)
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    mod = compiled(GRAPH.format(M=M, N=N, K=K), {"w": w},
                   {"x": rng.standard_normal((M, K), dtype=np.float32), "b": rng.standard_normal(N, dtype=np.float32)},
                   threads=2)
    (k,) = mod.kernels
    assert SKINNY in k.c_source and bool(k.decisions["parallel"]) is parallel
    assert re.search(rf"#define \w+_PARALLEL {int(parallel)}\b", k.c_source)
    # each thread's panels one contiguous run where it shares them (plan_gemm.skinny_runs)
    assert bool(k.decisions["runs"]) is parallel and re.search(rf"#define \w+_RUNS {int(parallel)}\b", k.c_source)
