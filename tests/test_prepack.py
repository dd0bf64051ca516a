"""Weights bound by params= are packed once: a GEMM whose B is a bound input reads panels that
its NAME_prepack made on the first call, not B (SPEC 4). Every case is checked against the
numpy reference of the graph with the same arrays."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from helpers import one_graph

import eqfuse

RNG = np.random.default_rng(11)


def arr(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def prepacked(mod) -> list[bool]:
    """Per kernel, whether its GEMM was built to read prepacked panels (gemm.c's header comment
    gives the template's PREPACKED_B value; gemm_skinny.c, the few-rows path, always does)."""
    return ["With PREPACKED_B (1;" in k.c_source or "C = epilogue(A @ B) for few rows" in k.c_source
            for k in mod.kernels]


def check(src, params, free, threads=None, calls=2):
    mod = eqfuse.compile(src, params=params, fuse="manual", threads=threads)
    ref = eqfuse.reference(src)
    names = [n for n, _ in one_graph(src).params]
    for call in range(calls):  # the second call reuses the panels of the first
        xs = {k: v * (call + 1) for k, v in free.items()}
        got = mod(*xs.values())
        full = {**params, **xs}
        want = ref(*[full[n] for n in names])
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)
    return mod


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m", [5, 70, 300])  # B read in place, packed, several row chunks
def test_bound_weight_is_prepacked(threads, m):
    src = (f"graph f(x: f32[{m}, 97], w: f32[97, 130], b: f32[130]) -> f32[{m}, 130] "
           "{ return kernel { relu(x @ w + b) } }")
    mod = check(src, {"w": arr(97, 130)}, {"x": arr(m, 97), "b": arr(130)}, threads)
    assert prepacked(mod) == [True]


def test_unbound_weight_is_not_prepacked():
    src = "graph f(x: f32[9, 33], w: f32[33, 20]) -> f32[9, 20] { return kernel { x @ w } }"
    mod = check(src, {}, {"x": arr(9, 33), "w": arr(33, 20)})
    assert prepacked(mod) == [False]
    mod = check(src, {"x": arr(9, 33)}, {"w": arr(33, 20)})  # A bound, B free
    assert prepacked(mod) == [False]


def test_transposed_bound_weight():
    src = ("graph f(x: f32[2, 13, 40], w: f32[67, 40]) -> f32[2, 13, 67] "
           "{ return kernel { x @ transpose(w) * 0.5 } }")
    mod = check(src, {"w": arr(67, 40)}, {"x": arr(2, 13, 40)}, threads=2)
    assert prepacked(mod) == [True]


def test_batched_bound_weight_differs_per_batch_and_is_not_prepacked():
    src = ("graph f(x: f32[3, 11, 20], w: f32[3, 20, 17]) -> f32[3, 11, 17] "
           "{ return kernel { x @ w } }")
    mod = check(src, {"w": arr(3, 20, 17)}, {"x": arr(3, 11, 20)})
    assert prepacked(mod) == [False]


def test_bound_weight_read_by_two_kernels_and_returned():
    src = ("graph f(x: f32[6, 24], w: f32[24, 24]) -> (f32[6, 24], f32[24, 24]) {\n"
           "    h = kernel { tanh(x @ w) }\n"
           "    y = kernel { h @ w + 1 }\n"
           "    return y, w\n}\n")
    mod = check(src, {"w": arr(24, 24)}, {"x": arr(6, 24)})
    assert prepacked(mod) == [True, True]


def test_row_epilogue_with_bound_weight():
    src = ("graph f(x: f32[20, 48], w: f32[48, 64], b: f32[64], g: f32[64], be: f32[64]) -> f32[20, 64] "
           "{ return kernel { layernorm(x @ w + b, g, be) } }")
    mod = check(src, {"w": arr(48, 64), "g": arr(64), "be": arr(64)}, {"x": arr(20, 48), "b": arr(64)}, threads=2)
    assert [k.kind for k in mod.kernels] == ["contraction_row"] and prepacked(mod) == [True]


@pytest.mark.heavy
def test_optimized_mlp_with_bound_weights():
    w1, b1, w2, b2 = arr(784, 1024) * 0.05, arr(1024), arr(1024, 10) * 0.05, arr(10)
    mod = eqfuse.compile("examples/mlp.g", params={"w1": w1, "w2": w2}, verify=True, dims={"B": 37})  # 37 rows exactly
    x = arr(37, 784)
    got = mod(x, b1, b2)  # verify=True compares with the reference inside the call
    want = eqfuse.reference("examples/mlp.g")(x, w1, b1, w2, b2)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert prepacked(mod) == [True, True]


def test_non_contiguous_bound_weight():
    """A transposed view bound as a weight is made contiguous once, at compile time: the second
    call uses the panels of the first (and both match the reference)."""
    w = arr(40, 33).T  # a view: 33 x 40, column-major
    src = "graph f(x: f32[7, 33], w: f32[33, 40]) -> f32[7, 40] { return kernel { x @ w } }"
    mod = check(src, {"w": w}, {"x": arr(7, 33)}, calls=3)
    assert prepacked(mod) == [True]
    assert mod.f.params["w"].flags.c_contiguous


def vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_panels_of_a_streamed_weight_start_on_a_huge_page():
    """A weight's panels of 2 MiB or more start on a 2 MiB boundary of a mapping advised as huge
    pages (eqfuse.runtime.program.panel_floats: a decode step streams them from memory, and
    4 KiB pages halve the stream), and the GEMM over them is still right."""
    w, b, x = arr(768, 768), arr(768), arr(1, 768)
    mod = eqfuse.compile("graph f(x: f32[1, 768], w: f32[768, 768], b: f32[768]) -> f32[1, 768] { return x @ w + b }",
                         params={"w": w, "b": b}, threads=1)
    got = mod(x)
    np.testing.assert_allclose(got, x.astype(np.float64) @ w + b, rtol=1e-4, atol=1e-4)
    (P,) = mod.default.compiled({}).runner.packed().values()
    assert P.nbytes >= 2 << 20 and P.ctypes.data % (2 << 20) == 0
    if sys.platform == "linux" and os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
        assert "hg" in vm_flags(P.ctypes.data)  # (MADV_HUGEPAGE: the kernel's policy decides the rest)
