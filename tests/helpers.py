"""Small helpers shared by the test files: loading graphs from text, random inputs, running them.

    g = one_graph("graph f(x: f32[B, 3]) -> f32[B, 3] { return relu(x) }")
    xs = rand_inputs(g, {"B": 5}, seed=0)
    (y,) = run(g, xs)
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from eqfuse.frontend.builder import build_module
from eqfuse.frontend.parser import parse
from eqfuse.ir.graph import Graph
from eqfuse.ir.printer import module_text
from eqfuse.ir.reference import evaluate
from eqfuse.ir.shapes import NUMPY_DTYPE

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.g"))
GOOD = sorted((ROOT / "tests" / "good").glob("*.g"))
BAD = sorted((ROOT / "tests" / "bad").glob("*.g"))
DEFAULT_DIM = 3  # the size given to a named dimension that a test does not bind


def load_text(text: str, file: str = "<test>") -> list[Graph]:
    """Parse and check every graph of a source text."""
    return build_module(parse(text, file))


def one_graph(text: str) -> Graph:
    graphs = load_text(text)
    assert len(graphs) == 1, f"expected one graph, got {len(graphs)}"
    return graphs[0]


def reprint(text: str) -> str:
    """print(parse(text)): the canonical text of a source."""
    return module_text(load_text(text))


def shape_of(t, dims: Mapping[str, int] | None = None) -> tuple[int, ...]:
    """A TType's shape with named dimensions looked up in dims (DEFAULT_DIM when absent)."""
    dims = dims or {}
    return tuple(d if isinstance(d, int) else dims.get(d, DEFAULT_DIM) for d in t.shape)


def rand_inputs(graph: Graph, dims: Mapping[str, int] | None = None, seed: int = 0,
                low: float | None = None, high: float | None = None) -> list[np.ndarray]:
    """Arrays for every parameter of graph: f32 standard normal, or uniform in [low, high);
    integers (u8 and i8 too) in [0, 4) (valid indices of any axis of 4 or more); bools half true."""
    rng = np.random.default_rng(seed)
    out = []
    for _, t in graph.params:
        shape = shape_of(t, dims)
        if t.dtype in ("i64", "i32", "u8", "i8"):
            out.append(rng.integers(0, 4, shape).astype(NUMPY_DTYPE[t.dtype]))
        elif t.dtype == "bool":
            out.append(rng.random(shape) < 0.5)
        else:
            a = rng.standard_normal(shape) if low is None else rng.uniform(low, high, shape)
            out.append(np.asarray(a, dtype=np.float32))
    return out


def run(graph: Graph, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The reference outputs of graph (always a list)."""
    return evaluate(graph, list(arrays))


def assert_same_values(got: Sequence[np.ndarray], want: Sequence[np.ndarray], exact: bool = False) -> None:
    """Equal shapes and values (NaN equals NaN); exact, or within the SPEC tolerance."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert g.dtype == w.dtype
        if exact or g.dtype != np.float32:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, equal_nan=True)


def assert_reads_alive(module) -> None:
    """Every arena buffer each kernel of each graph's last compiled binding reads is alive at that
    kernel's step in the memory plan (eqfuse.runtime.program.plan_memory): no kernel between its
    writer and its last reader may reuse its memory."""
    from eqfuse.ir.kernels import K

    for f in module.functions.values():
        c = f.last
        kernels = [p for p in c.plans if p.kind != K.VIEW]
        for s, p in enumerate(kernels):
            for a in p.args:
                r = c.memory.storage[a]
                if r in c.memory.lifetimes:
                    _, first, last = c.memory.lifetimes[r]
                    assert first <= s <= last, f"{p.name} reads node {r} outside its lifetime {first}..{last}"


def tree(graph: Graph, i: int | None = None):
    """A node as a nested tuple: ("add", "x", ("neg", 2.0)); params by name, constants as floats."""
    i = graph.outputs[0] if i is None else i
    n = graph.nodes[i]
    if n.op == "input":
        return n.name
    if n.op == "const":
        return float(n.value)
    kids = tuple(tree(graph, a) for a in n.args)
    attrs = tuple((k, v) for k, v in n.attrs)
    return (n.op, *kids, *((dict(attrs),) if attrs else ()))


def skip_unless_installed(*names: str, reason: str | None = None) -> None:
    """pytest.importorskip at a test module's top, without the import: the module is skipped
    unless each named package is installed. Collection imports every test module in every xdist
    worker, also in a tier that runs none of its tests, and transformers costs seconds there."""
    import importlib.util

    import pytest

    for name in names:
        if importlib.util.find_spec(name) is None:
            pytest.skip(reason or f"could not import {name!r}", allow_module_level=True)


@functools.cache
def compile_once(src: str, model: str | None = None, **kw):
    """`eqfuse.compile(src, **kw)` (planned for the machine model `model` when given, as
    `machine.pinned(model)`), once per process: the module is kept for every later test that asks
    for the same source. (Hashable keywords only: dims as a tuple of pairs.)"""
    import eqfuse
    from eqfuse import machine

    kw = {k: dict(v) if k == "dims" else v for k, v in kw.items()}
    if model is None:
        return eqfuse.compile(src, **kw)
    with machine.pinned(model):
        return eqfuse.compile(src, **kw)


class Compiled:
    """Graphs compiled when a test first reads one, each as a module of its own (`compile_once`):
    `Compiled({"f": src}).f` is the function of graph f. It stands where a module fixture compiled
    every case into one module, which every xdist worker built whole (each collects every test)
    and a selection of a few cases built whole too: a worker now builds only the cases it runs,
    and no case's graph is compiled twice."""

    def __init__(self, sources: Mapping[str, str], model: str | None = None, **kw):
        self._sources, self._model, self._kw = dict(sources), model, kw

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in self._sources:
            raise AttributeError(name)
        return getattr(compile_once(self._sources[name], self._model, **self._kw), name)


def selected_params(request, test: str, name: str, **given) -> list:
    """The values of the parameter `name` of the test function `test` (in the requesting fixture's
    module) that this run selected, among its cases whose other parameters equal `given`; in
    collection order. A module fixture that compiles every case into one module compiles only
    these: the fast tier runs the first case of a test, and the rest of the module is wasted
    compile time there (the whole suite selects every case: the same module as before)."""
    out = []
    for item in request.session.items:
        if item.module is request.module and getattr(item, "originalname", None) == test:
            p = item.callspec.params
            if all(p.get(k) == v for k, v in given.items()) and p[name] not in out:
                out.append(p[name])
    return out


def covering(*axes, ids=None) -> list:
    """pytest params of every combination of the axes' values (a value that is a tuple gives
    several arguments: a tuple argument is written as a 1-tuple of it), the combinations beyond a covering set marked `extended` (the suite's time,
    docs/testing.md): the default run takes the cases i = (each axis's value i mod its length)
    for i below the longest axis's length, so every value of every axis runs there, and
    `-m extended` runs the rest of the product.

        @pytest.mark.parametrize("op,H", covering(["max", "avg"], [3, 5, 7]))  # 3 cases, 3 extended
    """
    import itertools

    import pytest

    longest = max(len(a) for a in axes)
    default = {tuple(a[i % len(a)] for a in axes) for i in range(longest)}
    out = []
    for combo in itertools.product(*axes):
        args = [x for v in combo for x in (v if isinstance(v, tuple) else (v,))]
        marks = [] if combo in default else [pytest.mark.extended]
        out.append(pytest.param(*args, marks=marks, id=ids(combo) if ids else None))
    return out


def nearest_f32(text: str) -> np.float32:
    """The oracle: the f32 nearest to the exact rational value of a decimal, ties to the even
    significand, inf from the overflow threshold on (IEEE 754 round to nearest, with 2^128 as the
    even neighbour above FLT_MAX). Independent of the parser's shortcut through a double."""
    x = Fraction(text)
    if x == 0:
        return np.float32(-0.0 if text.lstrip().startswith("-") else 0.0)
    sign, x = (-1 if x < 0 else 1), abs(x)
    # every finite positive f32 is m * 2^e with m < 2^24, e >= -149; find the two around x
    e = max(-149, x.numerator.bit_length() - x.denominator.bit_length() - 24)  # about log2(x) - 23
    while x < Fraction(2) ** (e + 23) and e > -149:
        e -= 1
    while x >= Fraction(2) ** (e + 24):
        e += 1
    unit = Fraction(2) ** e
    m = math.floor(x / unit)
    lo, hi = m * unit, (m + 1) * unit
    if x - lo < hi - x or (x - lo == hi - x and m % 2 == 0):
        v = lo
    else:
        v = hi
    if v >= Fraction(2) ** 128:
        return np.float32(sign * math.inf)
    return np.float32(sign * float(v))  # v is an f32 value: exact in a double


def assembly_for(code: str, tmp_path: Path, isa: Sequence[str]) -> str:
    """The assembly of kernel C `code` (after eqfuse's header) built for x86-64-v4 and the extra
    ISA flags `isa` (compiled only: this CPU may lack them); skips the test when there is no C
    compiler or it does not know the flags."""
    import shutil
    import subprocess

    import pytest

    from eqfuse.backend.cbuild import COMMON_C, compiler, header_c

    cc = compiler().split()
    # (a machine without the compiler builds no kernel at all: the suite's other tests fail there,
    # this one says why it cannot run)
    if not shutil.which(cc[0]):
        pytest.skip(f"no C compiler {cc[0]}")
    src = tmp_path / "kernels.c"
    src.write_text(header_c(code) + COMMON_C + code)
    flags = ["-O1", "-fopenmp", "-std=gnu11", "-Wall", "-Werror", "-march=x86-64-v4", *isa, "-S", "-o",
             str(tmp_path / "kernels.s"), str(src)]
    out = subprocess.run(cc + flags, capture_output=True, text=True)
    # (a gcc older than the ISA flags, -mamx-int8 before gcc 11, cannot emit the instructions this
    # check looks for; any other failure to compile fails the test below)
    if out.returncode and "unrecognized" in out.stderr:
        pytest.skip(f"{cc[0]} does not know {' '.join(isa)}: {out.stderr.strip()[:200]}")
    assert out.returncode == 0, out.stderr[:4000]
    return (tmp_path / "kernels.s").read_text()
