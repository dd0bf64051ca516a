"""The GEMM template against numpy: odd sizes, batches, transposed B, fused epilogues, no warnings.

Every GEMM variant the tests run is compiled up front into one of two modules (built at once, in
two processes): one compiler run per variant would make this file take a minute.
"""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import covering

from eqfuse.backend.cbuild import COMMON_C, COMMON_CDEF, build, header_c, warnings_for
from eqfuse.backend.kinds.contraction.emit_gemm import emit_gemm
from eqfuse.backend.kinds.contraction.plan_gemm import blocking as blocking_of
from eqfuse.backend.kinds.contraction.plan_gemm import gemm_tiles
from eqfuse.machine import machine

# compiling every variant's GEMM takes ~25 s on 2 cores with a cold kernel cache
pytestmark = pytest.mark.heavy

HEADER = header_c() + COMMON_C  # as emit_graph puts it before every kernel
# name -> (epilogue, its extra parameters); the residual one uses the kernel's own M, N
EPILOGUES = {
    "acc": ("acc", []),
    "bias_relu": ("fmaxf(acc + bias[j], 0.0f)", [("float", "bias")]),
    "residual": ("acc * 0.5f + res[b * M * N + i * N + j]", [("float", "res")]),
    "bias_res": ("fmaxf(acc + bias[j], 0.0f) + res[b * M * N + i * N + j]", [("float", "bias"), ("float", "res")]),
}

SHAPES = [(1, 1, 1), (7, 13, 5), (33, 17, 65), (100, 257, 129), (128, 128, 128), (13, 40, 400), (5, 70, 3)]
# Tiny blocks force every loop of the template to take several steps: K slices (the partial sums
# kept in C, the epilogue on the last slice only), row chunks, B panels, threads sharing a panel.
BLOCKINGS = [(12, 64, 16, 6, 64), (14, 32, 8, 14, 16), (24, 64, 24, 12, 32)]

# The threads splitting the columns (split="cols"): M < MR, N not a multiple of NR, N < NR x
# threads (a thread with no panel at all), K not a multiple of KC (tiny blocks: several K slices
# and B panels per thread), batches fewer than the threads (3 threads, 2 batches: each batch split).
COL_SHAPES = [(5, 101, 61), (3, 50, 61), (13, 200, 37), (53, 101, 61)]
COL_BLOCKINGS = [None, (12, 64, 16, 6, 64), (14, 32, 8, 14, 16)]

# B read in place (direct_b, the default for small M and B not transposed: only a partial last
# panel packed) or packed (direct=False); a transposed B is always packed.
# (M, N, K, batch, b_transposed, epilogue, blocking, split, direct)
VARIANTS = sorted(
    {(M, N, K, 1, bt, epi, None, "auto", None) for M, N, K in SHAPES for bt in (False, True) for epi in EPILOGUES}
    | {(37, 71, 29, 3, bt, "residual", None, "auto", None) for bt in (False, True)}
    | {(53, 101, 61, b, bt, epi, blk, "rows", d) for blk in BLOCKINGS for bt in (False, True)
       for b, epi in ((2, "bias_relu"), (1, "residual")) for d in (None, False)}
    | {(M, N, K, b, bt, "bias_res", blk, "cols", d) for M, N, K in COL_SHAPES for blk in COL_BLOCKINGS
       for bt, b in ((False, 2), (True, 1)) for d in (None, False)}
    # B bound by params=: packed once by NAME_prepack, shared by every batch ("prepacked")
    | {(M, N, K, 1, bt, "bias_relu", None, "auto", "prepacked") for M, N, K in SHAPES for bt in (False, True)}
    | {(53, 101, 61, 2, bt, "bias_res", blk, split, "prepacked") for blk in BLOCKINGS for bt in (False, True)
       for split in ("rows", "cols")}
    # A given transposed (K x M), packed from there ("a_transposed"); A row-major but packed
    # rather than read in place ("packed_a"; direct_a=False)
    | {(M, N, K, 1, bt, "bias_relu", None, "auto", mode) for M, N, K in SHAPES for bt in (False, True)
       for mode in ("a_transposed", "packed_a")}
    | {(53, 101, 61, 2, bt, "bias_res", blk, split, mode) for blk in BLOCKINGS for bt in (False, True)
       for split in ("rows", "cols") for mode in ("a_transposed", "packed_a")},
    key=repr)


def kernel_name(variant) -> str:
    return f"g{VARIANTS.index(variant)}"


def gemm_source(M, N, K, batch, bt, epi, blocking=None, split="auto", direct=None, name="g"):
    """direct: None (the rule), False (B packed), True (read in place), "prepacked" (B shared by
    the batches and packed once by NAME_prepack), "a_transposed" (A given as K x M) or
    "packed_a" (A packed into MR-row panels rather than read in place)."""
    expr, extras = EPILOGUES[epi]
    pre, at = direct == "prepacked", direct == "a_transposed"
    return emit_gemm(name, M=M, N=N, K=K, batch=batch, a_batch_stride=M * K, b_batch_stride=0 if pre else K * N,
                     c_batch_stride=M * N, lda=M if at else K, ldb=K if bt else N, ldc=N, b_transposed=bt,
                     epilogue=expr, extras=extras, blocking=blocking or blocking_of(gemm_tiles(M, N, K, machine())),
                     split=split, direct_b=direct if direct in (None, False, True) else None, prepacked_b=pre,
                     a_transposed=at, direct_a=False if direct == "packed_a" else None)


def build_many(variants, hint):
    parts = [gemm_source(*v, name=kernel_name(v)) for v in variants]
    return build(HEADER + "\n".join(s for s, _ in parts), COMMON_CDEF + "\n" + "\n".join(c for _, c in parts), hint)


def selected_variants(request) -> list:
    """The variants the selected tests of this module run (`VARIANTS_OF`), in VARIANTS' order: the
    default run takes a covering set of each test's cases (helpers.covering), `-m extended` all."""
    want = set()
    for item in request.session.items:
        if item.module is request.module and getattr(item, "originalname", None) in VARIANTS_OF:
            params = {k: v for k, v in item.callspec.params.items() if k != "threads"} \
                if hasattr(item, "callspec") else {}
            want.update(VARIANTS_OF[item.originalname](**params))
    return [v for v in VARIANTS if v in want]


@pytest.fixture(scope="module")
def modules(tmp_path_factory, request):
    cache = tmp_path_factory.mktemp("gemm-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("EQFUSE_CACHE_DIR", str(cache))
    chosen = selected_variants(request)
    halves = [chosen[: len(chosen) // 2], chosen[len(chosen) // 2:]]
    # One child process builds the second half (into the shared cache) while this one builds the
    # first; the second half is then a cache hit here. The child plans for the machine pinned
    # here (conftest's pin does not run there), else its sources would differ.
    pinned = dataclasses.asdict(machine())
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.path.insert(0, 'tests'); from eqfuse import machine as m; "
                              f"m.pin(m.Machine(**{pinned!r}), clamp=False); import tests.test_gemm as t; "
                              f"t.build_many({halves[1]!r}, 'gemm_test_b')"],
                             cwd=Path(__file__).parent.parent, env={**os.environ, "EQFUSE_CACHE_DIR": str(cache)},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = build_many(halves[0], "gemm_test_a")
    out = child.communicate()[0]
    assert child.returncode == 0, out
    second = build_many(halves[1], "gemm_test_b")
    assert second.cached
    yield {**{v: first for v in halves[0]}, **{v: second for v in halves[1]}}
    mp.undo()


def run(modules, variant, threads=2, seed=0):
    M, N, K, batch, bt, epi, _, _, direct = variant
    built = modules[variant]
    built.lib.eqf_set_threads(threads)
    rng = np.random.default_rng(seed + M * 1000 + N + K)
    A = rng.standard_normal((batch, M, K), dtype=np.float32)
    B = rng.standard_normal((1 if direct == "prepacked" else batch, K, N), dtype=np.float32)
    bias = rng.standard_normal(N, dtype=np.float32)
    res = rng.standard_normal((batch, M, N), dtype=np.float32)
    extra = {"acc": [], "bias_relu": [bias], "residual": [res], "bias_res": [bias, res]}[epi]
    C = np.full((batch, M, N), np.nan, np.float32)  # every element must be written
    Bin = np.ascontiguousarray(B.transpose(0, 2, 1)) if bt else B
    Ain = np.ascontiguousarray(A.transpose(0, 2, 1)) if direct == "a_transposed" else A
    ffi = built.ffi
    ptr = lambda a: ffi.cast("float*", ffi.from_buffer(a))  # noqa: E731
    if direct == "prepacked":  # the panels, packed once, stand in for B; NaN where nothing is written
        name = kernel_name(variant)
        P = np.full(getattr(built.lib, f"{name}_prepack_floats")(), np.nan, np.float32)
        getattr(built.lib, f"{name}_prepack")(ptr(Bin), ptr(P))
        assert not np.isnan(P).any()
        Bin = P
    getattr(built.lib, kernel_name(variant))(*[ptr(Ain), ptr(Bin), ptr(C)] + [ptr(e) for e in extra])
    acc = A.astype(np.float64) @ B
    want = {"acc": acc, "bias_relu": np.maximum(acc + bias, 0), "residual": acc * 0.5 + res,
            "bias_res": np.maximum(acc + bias, 0) + res}[epi]
    # float32 accumulation of K products: the error grows like sqrt(K) times the size of the terms
    tol = 1e-4 * np.sqrt(K) * max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(C, want, rtol=1e-4, atol=tol)


# The variants each test runs, from its parameters (the module fixture builds the selected ones).
VARIANTS_OF = {
    "test_gemm_matches_numpy": lambda M, N, K, bt, epi: [(M, N, K, 1, bt, epi, None, "auto", None)],
    "test_batched": lambda bt: [(37, 71, 29, 3, bt, "residual", None, "auto", None)],
    "test_small_blocks": lambda blocking, bt, direct: [(53, 101, 61, 2, bt, "bias_relu", blocking, "rows", direct),
                                                       (53, 101, 61, 1, bt, "residual", blocking, "rows", direct)],
    "test_column_split": lambda M, N, K, blocking, bt, batch, direct: [
        (M, N, K, batch, bt, "bias_res", blocking, "cols", direct)],
    "test_operand_modes": lambda mode, M, N, K, bt: [(M, N, K, 1, bt, "bias_relu", None, "auto", mode)],
    "test_operand_modes_small_blocks": lambda mode, blocking, bt, split: [
        (53, 101, 61, 2, bt, "bias_res", blocking, split, mode)],
    "test_nan_and_inf_propagate_through_the_epilogue": lambda: [(7, 13, 5, 1, False, "acc", None, "auto", None)],
}


@pytest.mark.parametrize("M,N,K,bt,epi", covering(SHAPES, [False, True], sorted(EPILOGUES)))
def test_gemm_matches_numpy(modules, M, N, K, bt, epi):
    (v,) = VARIANTS_OF["test_gemm_matches_numpy"](M, N, K, bt, epi)
    run(modules, v)


@pytest.mark.parametrize("threads", [2, 1])  # 3 batches on 2 threads: by batch; on 1: serial
@pytest.mark.parametrize("bt", [False, True])
def test_batched(modules, threads, bt):
    (v,) = VARIANTS_OF["test_batched"](bt)
    run(modules, v, threads=threads)


@pytest.mark.parametrize("blocking,bt,threads,direct", covering([(b,) for b in BLOCKINGS], [False, True], [2, 1], [None, False]))
def test_small_blocks(modules, blocking, bt, threads, direct):
    # 2 batches, then 1 batch on 2 threads: the rows split
    for v in VARIANTS_OF["test_small_blocks"](blocking, bt, direct):
        run(modules, v, threads)


@pytest.mark.parametrize("M,N,K,blocking,bt,batch,threads,direct", covering(
    COL_SHAPES, [(b,) for b in COL_BLOCKINGS], [(False, 2), (True, 1)], [1, 2, 3], [None, False]))
def test_column_split(modules, M, N, K, blocking, bt, batch, threads, direct):
    """Threads that split the columns: each its own B panels and packed A, the epilogue reading
    a per-column bias and a full residual; 3 threads on 2 batches split each batch."""
    (v,) = VARIANTS_OF["test_column_split"](M, N, K, blocking, bt, batch, direct)
    run(modules, v, threads)


MODES = ["prepacked", "a_transposed", "packed_a"]


@pytest.mark.parametrize("mode,M,N,K,bt", covering(MODES, SHAPES, [False, True]))
def test_operand_modes(modules, mode, M, N, K, bt):
    """prepacked: B bound by params=, the kernel reads panels packed once by NAME_prepack.
    a_transposed: A given transposed (K x M in memory), packed from there into the same panels.
    packed_a: A row-major, packed into MR-row panels (by default the micro-kernel reads it in place)."""
    (v,) = VARIANTS_OF["test_operand_modes"](mode, M, N, K, bt)
    run(modules, v)


@pytest.mark.parametrize("mode,blocking,bt,split,threads", covering(
    MODES, [(b,) for b in BLOCKINGS], [False, True], ["rows", "cols"], [1, 2, 3]))
def test_operand_modes_small_blocks(modules, mode, blocking, bt, split, threads):
    """Several K slices and column blocks, 2 batches (sharing the prepacked B), the threads
    splitting rows or columns (3 threads on 2 batches split each batch)."""
    (v,) = VARIANTS_OF["test_operand_modes_small_blocks"](mode, blocking, bt, split)
    run(modules, v, threads)


def test_nan_and_inf_propagate_through_the_epilogue(modules):
    v = (7, 13, 5, 1, False, "acc", None, "auto", None)
    built = modules[v]
    A = np.ones((7, 5), np.float32)
    A[0, 0], A[1, 0] = np.nan, np.inf
    B = np.ones((5, 13), np.float32)
    C = np.zeros((7, 13), np.float32)
    getattr(built.lib, kernel_name(v))(*(built.ffi.cast("float*", built.ffi.from_buffer(x)) for x in (A, B, C)))
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(C, A @ B)


def test_generated_gemm_compiles_without_warnings(modules):
    src = HEADER + "\n".join(gemm_source(33, 17, 65, 2, bt, epi, split=split, direct=d, name=f"w{bt:d}{epi}{split}{d}")[0]
                             for bt in (False, True) for epi in EPILOGUES for split in ("auto", "cols")
                             for d in (None, False))
    # (one compile: the build's flags, -Wall among them, and -Wextra beside them)
    assert warnings_for(src, ("-Werror", "-Wextra", "-Wno-unused-parameter")) == ""


def test_emit_gemm_refuses_empty_sizes():
    with pytest.raises(ValueError, match="positive"):
        emit_gemm("g", M=0, N=1, K=1, lda=1, ldb=1, ldc=1, blocking=(1, 1, 1, 1, 1))
    with pytest.raises(ValueError, match="split"):
        emit_gemm("g", M=1, N=1, K=1, lda=1, ldb=1, ldc=1, split="diagonal", blocking=(1, 1, 1, 1, 1))
