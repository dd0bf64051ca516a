"""Named dims that a model's graph cannot hold unbound, taken at run time by padding.

An ONNX export with dynamic batch and sequence axes computes shapes from both (BERT slices its
position ids to the sequence; GPT-2 flattens batch x sequence). The IR's shapes hold one named dim
through such arithmetic, so the model imports only with the sequence bound (DimsNeeded), and each
new sequence length would run the optimizer and the C compiler again. `eqfuse.compile` returns a
PaddedFunction for such a model instead:

- the leading named dim of the inputs (the batch) stays a batch dim of each compiled graph: any
  batch size runs on its buckets (eqfuse.runtime.buckets);
- every other named dim is *padded*: the graph is compiled at a few bucket values of it, and a call
  pads its inputs with zeros at the end of that axis up to the smallest bucket that holds the
  call's value, and crops the outputs back.

Padding is exact only when no output at a real position reads a padded one, and the outputs at
the positions a caller's own mask pads do not depend on the length either. A causal mask
(GPT-2), or an attention mask whose zeros mark the padding as absent (BERT: its keys get the mask's
-3.4e38, so their softmax weight is exactly 0), make it so; a sum or mean over the sequence does
not, nor DeBERTa's relative positions (its outputs at padded positions change with the length).
The first call checks it on the numpy reference of the imported graph, with the call's own
inputs: the outputs at the first r positions (r = 3/4 of the call's length), computed at length
r, against those computed at the call's length, the inputs at positions from 3/4 of r on padded
with zeros in both (so that the positions a caller's mask pads are compared too). A dim that
fails the check is compiled per value instead (the compiler runs at each new value), and
`padding` says why.

Bucket values: `buckets={"sequence": [32, 64, 128]}`, or by default the powers of two from 16 up
to the first call's value rounded up to one, and at least to 128 (`pad_sizes`). The first call
compiles every bucket (times the batch dim's buckets), and drops one the model refuses (BERT
with 64 positions at 128). A value above the largest bucket compiles one more, its power of two.

The one padded dim of a model (a .g graph's, an ONNX export's sequence beside its batch dim or with
its batch bound by dims=) is first tried as a dim taken at run time by the loops (compile's live=,
eqfuse.backend.runtime_dim): one module at a capacity runs every length up to it with no work past
the length, its arrays at the call's length (`_runtime`), the batch dim on that module's buckets
(the dim behind the batch: each GEMM one per batch over its first rows). Where a kernel cannot
take it (RuntimeDimRefused, kept in `runtime_refused`), the dim is padded as above. A default
capacity past the model's positions (BERT's 512 at 1024) is halved; a call past every capacity
compiles the next one, or, where the model refuses that, a module at the call's length itself
(`_grow`).

A model whose export folds the batch into another dim ([batch * heads, ...]: ConvBERT, WavLM)
imports only with the batch bound too: each bucket's module then compiles its batch per value
(eqfuse.pipeline.padded_module), and the check imports the reference with its two samples bound.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from eqfuse.errors import ArgumentError, ChunkRefused, DimsNeeded, EqfuseError, RuntimeDimRefused
from eqfuse.ir.graph import Graph
from eqfuse.ir.reference import bind_arrays, call_arrays, evaluate
from eqfuse.runtime.load import cpus
from eqfuse.runtime.program import give_back_memory
from eqfuse.runtime.verify import compare

Shape = tuple  # of ints and dim names


DEFAULT_TOP = 128  # the default buckets reach at least this length (a transformer's usual range)
RUNTIME = "run-time"  # `padding` of a dim taken at run time by the loops, not padded (`PaddedFunction._runtime`)
CAPACITY_TRIES = 8  # capacities tried for an ONNX model's run-time dim, each one more when an extent is it


def pad_sizes(first: int) -> list[int]:
    """Bucket values of a padded dim first bound to `first`: the powers of two from 16 up to
    `first` rounded up to one, and at least up to 128 (100 -> 16, 32, 64, 128; 300 -> 16 ... 512;
    5 -> 8, 16, 32, 64, 128). A length pads to less than twice itself (or to 16), and their count
    is what the first call compiles: BERT's 7 and 20 at powers of four (16, 64) ran 2.1-2.3x the
    time of their own compile (benchmarks/bench_sequence.py), where a power of two costs at most
    2x. A bucket the model cannot take (BERT's 64 positions at 128) is dropped at the first call."""
    top = max(_pow2(first), DEFAULT_TOP)
    sizes, b = {top, _pow2(first)}, top
    while b // 2 >= 16:
        b //= 2
        sizes.add(b)
    return sorted(sizes)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


class PaddedFunction:
    """`mod.<graph>` of a model compiled per bucket of its padded dims (see the module docstring).

    `build(dims)` compiles the model with those dims bound (a Module); `source(dims)` is the
    imported graph and its bound arrays at those dims, for the exactness check."""

    def __init__(self, name: str, inputs: list[tuple[str, Shape]], fixed: Mapping[str, int], batch: str | None,
                 buckets: Mapping[str, list[int]], build: Callable, source: Callable):
        self.name = name
        self.inputs = inputs  # (parameter name, shape with dim names), in parameter order
        self.free = [n for n, _ in inputs]
        named = list(dict.fromkeys(d for _, s in inputs for d in s if isinstance(d, str) and d not in fixed))
        self.batch_dim = batch  # left unbound: each compiled graph takes it at any size (runtime.buckets)
        self.padded = [d for d in named if d != batch]
        self.sizes = {d: sorted({int(v) for v in buckets[d]}) for d in self.padded if d in buckets}
        self.chosen = set(self.sizes)  # the dims whose sizes buckets= gave (the others': the defaults)
        # the batch dim's sizes buckets= gives (eqfuse.generate then compiles its decode step on them)
        self.batch_buckets = {batch: sorted({int(v) for v in buckets[batch]})} if batch in buckets else {}
        self._build, self._source = build, source
        self.modules: dict[tuple[int, ...], object] = {}  # bucket values of the padded dims -> Module
        self.padding: dict[str, str] = {}  # padded dim -> "exact", or why it is compiled per value
        self.limits: dict[str, str] = {}  # padded dim -> the first default bucket the model refused
        self.out_axes: dict[str, list[tuple[int, ...]]] = {}  # padded dim -> its axes in each output
        self.live_modules: dict[tuple, object] = {}  # (dims, live dim, pick) -> Module of a decoder step (live_module)
        self._building: dict[tuple, Future] = {}  # live_module's keys being built, by one thread each
        self._refused: dict[tuple, ChunkRefused] = {}  # live_module's keys whose chunk step cannot be built
        # a .g graph's result shapes with their dim names, and its fixed extents: a padded dim may
        # then be taken at run time instead (`_runtime`); None for an ONNX model (its dims are numbers)
        self.results: list[Shape] | None = None
        self.extents: frozenset[int] = frozenset()
        self.runtime_refused: str | None = None  # why the padded dim is not taken at run time
        self.per_value: set[tuple[int, ...]] = set()  # a run-time dim's modules compiled at one value (`_grow`)
        self.last = None  # the GraphFunction of the last call's bucket (Module.kernels reads it)
        self.last_module = None
        self._ready = False
        self._lock = threading.Lock()

    @classmethod
    def restored(cls, name: str, inputs, batch: str | None, padded: list[str], sizes, padding, limits, out_axes,
                 modules: dict, last, build: Callable) -> PaddedFunction:
        """One whose first call is done and whose buckets are compiled (an artifact's:
        eqfuse.runtime.artifact); `build` is asked for a bucket not among them."""
        f = cls(name, inputs, {}, batch, {}, build, build)
        f.padded, f.sizes, f.padding = list(padded), dict(sizes), dict(padding)
        f.limits, f.out_axes = dict(limits), dict(out_axes)
        f.modules = dict(modules)
        if last is not None:
            f.last_module = f.modules[last]
            f.last = f.last_module.default.last
        f._ready = True
        return f

    def __call__(self, *arrays, **keywords):
        named = call_arrays(self.name, self.free, arrays, keywords)
        values = self._values(named)
        with self._lock:
            if not self._ready:
                self._first(named, values)
                self._ready = True
            key = tuple(self._bucket(d, values[d]) for d in self.padded)
            if key not in self.modules and self._runtime_dim():
                key = self._grow(key, named, values)
            mod = self._module(key, named, values)
        lengths = [np.array([values[d]], dtype=np.int64) for d in self.padded
                   if self.padding[d] == RUNTIME and key not in self.per_value]
        outs = mod(*(self._fit(named[n], s, dict(zip(self.padded, key)), values) for n, s in self.inputs), *lengths)
        one = not isinstance(outs, tuple)
        outs = (outs,) if one else outs
        outs = tuple(self._crop(k, o, values) for k, o in enumerate(outs))
        return outs[0] if one else outs

    def live_module(self, dims: Mapping[str, int], live: str, pick: str | None = None, new: str | None = None):
        """The model compiled with every dim bound by `dims` and `live` a KV cache's run-time length
        (compile's live=, eqfuse.generate's decode step), compiled once per dims; it shares the
        weights of the buckets. With `pick`, its first result is the one row along its second axis
        that its input of that name gives at run time (eqfuse.ir.live.pick_row: generate's prompt
        chunks). With `new`, the dim of the rows it appends is taken at run time too (one more input,
        its length: a prompt's chunk of any length up to them; the key has it as a fourth item).
        Two threads may compile two of them at once (eqfuse.generate's chunk and decode
        steps: one's C compiler runs while the other imports and optimizes, as _first's buckets
        do); a thread asking for one being compiled waits for it. A step refused once (ChunkRefused,
        RuntimeDimRefused) is refused again without a compile."""
        key = (tuple(sorted(dims.items())), live, pick) + ((new,) if new is not None else ())
        with self._lock:
            if key in self.live_modules:
                return self.live_modules[key]
            if key in self._refused:  # (refused once: not imported and optimized again to learn it)
                raise self._refused[key]
            building = self._building.get(key)
            mine = building is None
            if mine:  # built outside the lock: another thread may build another step meanwhile
                building = self._building[key] = Future()
        if not mine:
            return building.result()  # (the thread building it raises its error here too)
        try:
            mod = self._build(dict(dims), live=live, pick=pick, **({"live_new": new} if new is not None else {}))
            pack = getattr(getattr(mod, "default", None), "pack_bound", None)
            if pack is not None:  # (its weights' panels: packed in this thread too)
                pack()
        except BaseException as e:
            with self._lock:
                del self._building[key]
                if isinstance(e, (ChunkRefused, RuntimeDimRefused)):
                    self._refused[key] = e
            building.set_exception(e)
            raise
        with self._lock:
            self.live_modules[key] = mod
            del self._building[key]
        building.set_result(mod)
        return mod

    # ------------------------------------------------------------ dims and buckets

    def _values(self, named: Mapping[str, np.ndarray]) -> dict[str, int]:
        """Each named dim's value in this call, checked to agree between the inputs."""
        values: dict[str, int] = {}
        for n, shape in self.inputs:
            a = named[n]
            if not isinstance(a, np.ndarray):
                raise ArgumentError(f"{self.name}(): '{n}' expects a numpy array, got {type(a).__name__}")
            if a.ndim != len(shape):
                raise ArgumentError(f"{self.name}(): '{n}' expects rank {len(shape)} {list(shape)}, got shape {list(a.shape)}")
            for d, v in zip(shape, a.shape):
                if isinstance(d, str) and d in self.padded + [self.batch_dim]:
                    if v == 0:
                        raise ArgumentError(f"{self.name}(): '{n}' has an empty dimension {d}: eqfuse computes no "
                                            "zero-size tensor (a decoder's first step over an empty cache: "
                                            "eqfuse.generate, whose prefill gives the cache one masked row, "
                                            "docs/generation.md)")
                    if values.setdefault(d, v) != v:
                        raise ArgumentError(f"{self.name}(): dimension {d} is {values[d]} in one input and {v} in '{n}'")
        return values

    def _bucket(self, d: str, v: int) -> int:
        """The bucket value a call with d = v runs at: the smallest that holds v, or v's power of
        two above them all (compiled by _module, and then one of them); for a dim taken at run time
        the smallest capacity compiled that holds v, or a new one (`_capacity`)."""
        if self.padding[d] == RUNTIME:
            return next((s for s in self.sizes[d] if s >= v), self._capacity(_pow2(v)))
        if self.padding[d] != "exact":
            return v
        return next((s for s in self.sizes[d] if s >= v), _pow2(v))

    def _runtime_dim(self) -> bool:
        return any(self.padding.get(d) == RUNTIME for d in self.padded)

    def _grow(self, key: tuple[int, ...], named, values) -> tuple[int, ...]:
        """A call past every capacity of the run-time dim: the module at the next capacity (key),
        or, where the model refuses it (its positions end at the call's length: BERT's 512, whose
        position table is also an extent of 512), the module at the call's length itself, whose
        loops are not bounded (in `per_value`, called with no length)."""
        try:
            self._module(key, named, values)
            return key
        except EqfuseError as e:
            exact = tuple(values[d] for d in self.padded)
            if exact in self.modules:
                return exact
            self.modules[exact] = self._build(dict(zip(self.padded, exact)))
            self.per_value.add(exact)
            self.limits.setdefault(self.padded[0], f"{self.padded[0]}={key[0]}: {e.message}")
            for d, v in zip(self.padded, exact):
                self.sizes[d] = sorted(set(self.sizes[d]) | {v})
            return exact

    def _capacity(self, at_least: int) -> int:
        """A run-time dim's capacity: `at_least`, or the next number that is no fixed extent of the
        graph (eqfuse.backend.runtime_dim finds the dim's axes by their extent)."""
        c = at_least
        while c in self.extents:
            c += 1
        return c

    def _make(self, key: tuple[int, ...], named, values):
        """The Module of one bucket, with its batch buckets compiled (by a call on the inputs)."""
        bucket = dict(zip(self.padded, key))
        runtime = [d for d in self.padded if self.padding.get(d) == RUNTIME]
        mod = self._build(bucket, live=runtime[0]) if runtime else self._build(bucket)
        lengths = [np.array([values[d]], dtype=np.int64) for d in runtime]
        mod(*(self._fit(named[n], s, bucket, values) for n, s in self.inputs), *lengths)
        return mod

    def _runtime(self, named, values) -> bool:
        """Compile the one padded dim of a model as a dim taken at run time by the loops (compile's
        live=, eqfuse.backend.runtime_dim), a batch dim beside it on each module's buckets: one
        module at a capacity (the largest bucket buckets= gives, else 128 or the first call's power
        of two above: halved while the model refuses it, that is, while its positions end
        before), run at any length up to it with no work past the length; a longer call compiles the
        next power of two (`_grow`).
        A .g graph's before any check (exact by construction); an ONNX model's once `_check` has
        found the dim's axes in the outputs (and its import, that an extent of the capacity is the
        dim alone: eqfuse.frontend.onnx_dims.check_onnx_dim). False, and `runtime_refused` says why, when a
        kernel cannot take it or the model refuses the capacity: the dim is then padded."""
        if len(self.padded) != 1:
            return False
        d = self.padded[0]
        if (d not in self.out_axes) if self.results is None else (d in self.padding):
            return False  # (ONNX: its outputs' axes not found; .g: buckets={} or a dim buckets= does not name)
        given, state = self.sizes.get(d), self.padding.get(d)  # (kept for the padding when refused)
        # (an ONNX dim whose padding is not exact, DeBERTa's: the graph at each length is exact all the same)
        top = given if state in (None, "exact") else self.sizes.get(d) if d in self.chosen else None
        cap = self._capacity(max(max(top or pad_sizes(values[d])), _pow2(values[d])))
        mod, why, down = None, "", False
        for _ in range(CAPACITY_TRIES):
            self.padding[d], self.sizes[d] = RUNTIME, [cap]
            try:
                mod = self._make((cap,), named, values)
                break
            except EqfuseError as e:  # (RuntimeDimRefused, or a capacity past the model's positions)
                why = e.message
                if isinstance(e, RuntimeDimRefused) and "also a fixed extent" in why:
                    # (an ONNX model's extent equal to the capacity, its import says so: the next
                    # number, or the one before once a larger capacity was past its positions)
                    cap += -1 if down else 1
                elif not isinstance(e, RuntimeDimRefused) and cap > _pow2(values[d]) and d not in self.chosen:
                    self.limits[d] = f"{d}={cap}: {why}"  # (a default capacity past the model's positions:
                    cap, down = max(_pow2(values[d]), 1 << ((cap - 1).bit_length() - 1)), True  # the one below)
                else:
                    break
                if cap < values[d]:
                    break
        if mod is None:
            del self.padding[d], self.sizes[d]
            self.limits.pop(d, None)
            if state is not None:
                self.padding[d] = state
            if given:
                self.sizes[d] = given
            self.runtime_refused = why
            return False
        if self.results is not None:
            self.out_axes[d] = [tuple(k for k, x in enumerate(shape) if x == d) for shape in self.results]
        self._module((cap,), named, values, mod)
        return True

    def _module(self, key: tuple[int, ...], named, values, made=None):
        mod = self.modules.get(key)
        if mod is None:
            mod = self.modules[key] = made if made is not None else self._make(key, named, values)
            for d, v in zip(self.padded, key):
                if self.padding[d] in ("exact", RUNTIME) and v not in self.sizes[d]:
                    self.sizes[d] = sorted(self.sizes[d] + [v])
        self.last_module, self.last = mod, mod.default.last
        return mod

    def _first(self, named, values) -> None:
        """Check each padded dim's exactness, then compile every combination of bucket values.
        A bucket above the call's own that the model refuses (it imports or runs only up to its
        number of positions) is dropped, and `limits` says why.

        The buckets compile on two threads: one's C compiler (a subprocess) runs while the other
        imports and optimizes (the optimizers take turns: program.SharedArrays.optimizing), so
        the C compiles, a third of the time, overlap the rest."""
        if self._runtime(named, values):  # (a .g graph: exact by construction, no check)
            return
        for d in self.padded:
            why = self.padding.get(d) or self._check(d, named, values)  # (preset: padding is off)
            self.padding[d] = why or "exact"
            self.sizes[d] = self.sizes.get(d) or pad_sizes(values[d]) if not why else [values[d]]
        if self.results is None and self._runtime(named, values):  # (an ONNX model: its outputs' axes checked)
            return
        needed = {d: self._bucket(d, values[d]) for d in self.padded}
        keys = list(itertools.product(*(list(self.sizes[d]) for d in self.padded)))
        with ThreadPoolExecutor(max_workers=max(1, min(2, cpus(), len(keys)))) as pool:
            made = [pool.submit(self._make, key, named, values) for key in keys]
            try:
                self._keep(keys, made, named, values, needed)
            except BaseException:
                for f in made:  # a bucket failed: the ones not started are not compiled
                    f.cancel()
                raise
        give_back_memory()  # the imports' freed memory (see there)

    def _keep(self, keys, made, named, values, needed) -> None:
        """The buckets compiled by _first, in order; a refused one drops itself and those above."""
        for key, future in zip(keys, made):
            if any(k not in self.sizes[d] for d, k in zip(self.padded, key)):
                continue  # a dropped bucket
            try:
                self._module(key, named, values, future.result())
            except EqfuseError as e:
                over = [(d, k) for d, k in zip(self.padded, key) if k > needed[d]]
                if not over:
                    raise
                d, k = over[-1]
                self.sizes[d] = [s for s in self.sizes[d] if s < k]
                self.limits[d] = f"{d}={k}: {e.message}"

    # ------------------------------------------------------------ padding

    def _fit(self, a: np.ndarray, shape: Shape, to: Mapping[str, int], values: Mapping[str, int]) -> np.ndarray:
        """`a` with each padded axis cropped or zero-padded at its end to its value in `to`."""
        axes = {k: to[d] for k, d in enumerate(shape) if d in to and to[d] != values[d]}
        if not axes:
            return a
        crop = tuple(slice(0, min(axes.get(k, n), n)) for k, n in enumerate(a.shape))
        out = np.zeros(tuple(axes.get(k, n) for k, n in enumerate(a.shape)), dtype=a.dtype)
        out[crop] = a[crop]
        return out

    def _crop(self, k: int, out: np.ndarray, values: Mapping[str, int]) -> np.ndarray:
        """Output k at the call's values of its padded axes."""
        idx = [slice(None)] * out.ndim
        for d in self.padded:
            for ax in self.out_axes[d][k] if d in self.out_axes else ():
                idx[ax] = slice(0, values[d])
        return out if all(s == slice(None) for s in idx) else np.ascontiguousarray(out[tuple(idx)])

    def _check(self, d: str, named, values) -> str | None:
        """None when padding d is exact on the reference (module docstring), else why not. Also
        finds d's axes in the outputs: the ones whose size follows it."""
        s = values[d]
        r, s = (s - max(1, s // 4), s) if s > 1 else (1, 2)
        real = max(1, r - max(1, r // 4))  # positions real .. r are padding in both runs
        base = {k: v for k, v in values.items() if k in self.padded}
        if self.batch_dim:  # two samples are enough (and BERT-base's reference at 8 x 128 takes seconds)
            two = min(2, values[self.batch_dim])
            named = {n: self._fit(named[n], shape, {self.batch_dim: two}, values) for n, shape in self.inputs}
        runs = []
        for at, to in ((r, {d: r}), (s, {d: s})):
            try:
                try:
                    g, params = self._source({**base, d: at})
                except DimsNeeded:  # a batch folded into other dims (its modules compile it per value)
                    if not self.batch_dim:
                        raise
                    g, params = self._source({**base, d: at, self.batch_dim: two})
            except Exception as e:  # noqa: BLE001  (a length the model refuses: not paddable)
                return f"the model does not import at {d}={at} ({e})"
            ins = {n: self._fit(self._fit(named[n], shape, {d: real}, values), shape, to, {**values, d: real})
                   for n, shape in self.inputs}
            free = [(i, n) for i, (n, _) in zip(g.inputs, g.params) if n not in params]
            bind_arrays(Graph(g.name, list(g.nodes), [i for i, _ in free], []), [ins[n] for _, n in free], {})
            try:
                runs.append(evaluate(g, [params[n] if n in params else ins[n] for n, _ in g.params]))
            except (IndexError, ValueError, FloatingPointError) as e:
                if self._runs(named, values):  # padding d alone breaks the model (a decoder's
                    return f"padding {d} alone fails in the model ({type(e).__name__}: {e})"  # past vs mask)
                raise ArgumentError(f"{self.name}(): the model's numpy reference fails on this call's inputs "
                                    f"({type(e).__name__}: {e})") from None  # e.g. a token id past the vocabulary
        axes = []
        for k, (a, b) in enumerate(zip(*runs)):
            if a.ndim != b.ndim:
                return f"output {k} changes rank with {d}"
            ax = tuple(i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y)
            if any((a.shape[i], b.shape[i]) != (r, s) for i in ax):
                return f"output {k}'s shape {list(b.shape)} is no copy of {d} along an axis"
            axes.append(ax)
        self.out_axes[d] = axes  # (found: the run-time path needs them, padding exact or not)
        for k, (a, b) in enumerate(zip(*runs)):
            bad = compare([b[tuple(slice(0, r) if i in axes[k] else slice(None) for i in range(b.ndim))]], [a])
            if bad:
                return (f"padding {d} from {r} to {s} with zeros changes output {k} at its first {r} positions "
                        f"({bad[0].split(': ', 1)[1]})")
        return None

    def _runs(self, named, values) -> bool:
        """Whether the numpy reference runs on the call's own inputs, unpadded."""
        try:
            g, params = self._source({k: v for k, v in values.items() if k in self.padded})
            evaluate(g, [params[n] if n in params else named[n] for n, _ in g.params])
        except Exception:  # noqa: BLE001  (any failure: the inputs are at fault, not the padding)
            return False
        return True

    # ------------------------------------------------------------ display

    def __repr__(self) -> str:
        parts = [f"batch dim {self.batch_dim} at any size"] if self.batch_dim else []
        for d in self.padded:
            state = self.padding.get(d)
            limit = f" (not {self.limits[d].split(':')[0]}: the model refuses it)" if d in self.limits else ""
            parts.append(f"{d} at run time up to {max(self.sizes[d])}{limit}" if state == RUNTIME else
                         f"{d} padded to {', '.join(map(str, self.sizes[d]))}{limit}" if state == "exact" else
                         f"{d} compiled per value ({state})" if state else f"{d} padded to buckets chosen at the first call")
        return f"<eqfuse function {self.name}({', '.join(self.free)}): {'; '.join(parts)}>"


__all__ = ["PaddedFunction", "pad_sizes"]
