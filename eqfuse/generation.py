"""eqfuse.generate: text generation with a decoder exported with its KV cache (docs/generation.md).

A decoder export takes `input_ids`, `attention_mask`, `position_ids` (unless its positions come
from the mask, as BLOOM's ALiBi) and one `past...` input per layer's keys and values ([batch,
heads, past, head size]), and returns the logits then one `present...` output per past input, in
the same order: present = concat(past, new, axis=2).

The decode step over a cache in place. For a model compiled by eqfuse from an ONNX file, the
decode step is the model compiled once with past bound to a capacity C and live="past"
(eqfuse.ir.live, eqfuse.backend.live): each cache is a buffer [B, heads, C + 1, head size] that
the step appends its new row to, at the live length t given as `past_length`, and returns as its
present; its attentions read keys 0 .. t. So a decode step at any t <= C runs the same compiled
code, never reads the rows past t, and copies one row per cache, whatever t. It is compiled
during the prefill: the decode steps run no compiler.

The prefill in chunks. The same model compiled with sequence = n and past = C + 1 - n (the chunk
step: its buffers and mask are the decode step's) appends n rows at rows t .. t + n - 1 and
attends to the rows before them and, causally, to its own (the export's causal mask computed
from the live length: eqfuse.ir.live.causal_from_length). The chunk's rows are a run-time length
too (Options.live_new: one more input, m <= n, eqfuse.backend.runtime_dim beside the cache), so a
prompt runs as chunks of n and a last chunk of its own rows, each computing its live rows only
(Decoder.prefill_chunks, runtime_chunks); where that is refused, as chunks of a compiled n, the
last padded (chunk_plan). Once a model has its chunk and decode steps, a prompt of any length up
to the capacity runs with no compiler; the capacity is the model's position table's length when
it has one (live_capacity).

Without such a step (onnxruntime in the tests, a Module compiled with its dims bound), the driver
falls back to the cache at a fixed capacity described next.

The cache at a fixed capacity. The past length changes at every token, and eqfuse compiles a
model whose concat sums named dims per value of them (pipeline.padded_module), so feeding the
cache at its live length would compile at every token. The driver feeds it instead at a
*capacity* C chosen once per call (the powers of two from 16 that hold the prompt and the new
tokens): rows past the live length hold zeros and the attention mask marks them absent, so their
softmax weight is exactly 0 (the mask adds the most negative float to their scores), and the
positions come from `position_ids`, not from the cache's length. Each decode step runs at
past = C, sequence = 1, and its one new row (present's row C) is copied into the cache at the
live length. A generation thus compiles two bindings: the prefill (past = 1, one masked row:
eqfuse needs positive dims; sequence = the prompt's bucket, the prompt padded to it: prefill_plan)
and the decode step (sequence = 1, past = C). Every later call with a prompt of that bucket and
the same capacity reuses them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import compress
from operator import is_, is_not

import numpy as np

from eqfuse.errors import ArgumentError, ChunkRefused, EqfuseError, RuntimeDimRefused

MIN_CAPACITY = 16  # the smallest cache capacity: a short generation shares one decode compile
PREFILL_MIN = 16  # the shortest prefill compiled: short prompts share one compile (prefill_plan)
# the longest prompt chunk compiled (chunk_plan): a longer prompt runs as chunks of it, or of the
# longest chunk already compiled, with no compile
CHUNK_MAX = 256
# the rows of a chunk step that takes them at run time (Decoder.prefill_chunks): a longer prompt
# runs in chunks of it, each computing its live rows only; the GEMMs over a chunk's rows reach
# their blocked kernel's speed well before it (benchmarks/bench_prefill_chunks.py)
RUNTIME_CHUNK = 256
# the largest position table whose every position the cache holds from the first generation
# (live_capacity): GPT-2's 1024 and models of 2048 or 4096 positions; a longer table's cache
# would take memory for positions few generations reach, so it grows as needed instead
LIVE_CAPACITY_MAX = 4096
# a model without a position table (rotary embeddings from position_ids) has no known maximum:
# its cache starts at this many rows, or fewer if its buffers would pass LIVE_CACHE_BYTES, so that
# the usual prompts and generations run on the steps compiled once (each larger capacity compiles
# the chunk and decode steps again), as a model with a position table of that length does
LIVE_CAPACITY_DEFAULT = 2048
# the input of a prompt chunk's step that picks the row of its logits computed: the chunk's last
# real token's (eqfuse.ir.live.pick_row)
PICK = "logits_row"
LIVE_CACHE_BYTES = 256 << 20  # every layer's keys and values, the whole batch: the memory it may take


def capacity_for(length: int) -> int:
    """The cache capacity that holds `length` rows: the power of two at or above it, at least 16."""
    return max(MIN_CAPACITY, 1 << max(length - 1, 0).bit_length())


def live_capacity(sig: "Signature", length: int, batch: int = 1) -> int:
    """The capacity of a cache in place (the chunk and decode steps, compiled per capacity): every
    position of the model's position table when it has one of at most LIVE_CAPACITY_MAX (so that
    any prompt and generation the model can hold runs on the steps compiled once: a larger
    capacity costs the buffers' memory, not time, docs/generation.md), less one: a step attends
    to its capacity + 1 rows (the new one past them), and those must fit the table's P too, where a
    model slices a P x P causal mask by its key length (GPT-Neo); without a table, the
    power of two that holds `length` rows, doubled up to LIVE_CAPACITY_DEFAULT while the
    buffers of `batch` sequences stay within LIVE_CACHE_BYTES; else capacity_for(length). A
    sliding-window model's caches in place are kept whole (eqfuse.frontend.onnx_inputs.
    window_slices), so its window does not bound the capacity."""
    if sig.max_positions is not None and length <= sig.max_positions <= LIVE_CAPACITY_MAX:
        cap = max(MIN_CAPACITY, sig.max_positions - 1)
    else:
        cap = capacity_for(length)
        if sig.max_positions is None:
            row = batch * sum(4 * h * d for _, (_, h, _, d) in sig.pasts)  # bytes of one row of every cache
            while cap < LIVE_CAPACITY_DEFAULT and 2 * cap * row <= LIVE_CACHE_BYTES:
                cap *= 2
    return cap


class Signature:
    """Where a decoder's inputs and outputs are: the names of its id, mask and position inputs,
    its past inputs in order with their [heads, head size], the number of positions its
    position table holds (None when unknown), and the rows a sliding-window layer's cache keeps
    (`window_rows`, sliding_window - 1; None when no layer slides)."""

    def __init__(self, inputs: Sequence[tuple[str, tuple]], max_positions: int | None = None,
                 window_rows: int | None = None):
        names = [n for n, _ in inputs]
        self.names = names

        def find(*keys: str) -> str:
            hit = next((n for n in names if any(n.lower() == k or n.lower().endswith(k) for k in keys)), None)
            if hit is None:
                raise EqfuseError(f"generate: the model has no input {' or '.join(repr(k) for k in keys)} "
                                  f"(its inputs: {', '.join(names)}); eqfuse.generate needs a decoder export "
                                  "with input_ids, attention_mask, past key values (and position_ids)")
            return hit

        self.ids, self.mask = find("input_ids"), find("attention_mask")
        # (None: a model that derives its positions from the attention mask, as BLOOM's ALiBi)
        self.positions = next((n for n in names if n.lower().endswith("position_ids")), None)
        self.shapes = {n: tuple(s) for n, s in inputs}
        self.pasts = [(n, tuple(s)) for n, s in inputs if "past" in n.lower()]
        if not self.pasts:
            raise EqfuseError(f"generate: the model has no past key value inputs (its inputs: {', '.join(names)})")
        for n, s in self.pasts:
            if len(s) != 4 or not all(isinstance(d, int) for d in (s[1], s[3])):
                raise EqfuseError(f"generate: past input '{n}' has shape {list(s)}; eqfuse.generate needs "
                                  "[batch, heads, past, head size] with heads and head size fixed")
        others = set(names) - {self.ids, self.mask, self.positions} - {n for n, _ in self.pasts}
        if others:
            raise EqfuseError(f"generate: the model has inputs eqfuse.generate does not know how to feed: "
                              f"{', '.join(sorted(others))}")
        self.max_positions = max_positions
        self.window_rows = window_rows

    def feeds(self, ids, mask, positions, past, length=None) -> dict:
        """A step's inputs by name: the ids, the mask, the positions (left out for a model
        without a position input), the past buffers in order, and the live length when given."""
        feeds = {self.ids: ids, self.mask: mask}
        if self.positions is not None:
            feeds[self.positions] = positions
        feeds.update({n: p for (n, _), p in zip(self.pasts, past)})
        if length is not None:
            feeds[LENGTH] = length
        return feeds

    def fits_window(self, past: int, rows: int) -> bool:
        """Whether a step over `past` rows appending `rows` returns its whole cache: a sliding
        layer's present is its past and new rows only while they are within the rows it keeps
        (beyond, it drops the oldest, and the cache in place would no longer be past + new)."""
        return self.window_rows is None or past + rows <= self.window_rows

    def within_window(self, capacity: int) -> int:
        """The capacity, or the most a sliding-window model's cache takes (its chunk and decode
        steps append to C and return C + 1 rows, all within the rows its sliding layers keep;
        generate refuses a prompt and new tokens that need more)."""
        return capacity if self.fits_window(capacity, 1) else self.window_rows - 1


def onnx_signature(path: str | os.PathLike) -> Signature:
    """The Signature of an ONNX decoder export, with its position table's length when position_ids
    index an initializer (GPT-2's wpe), perhaps through a Cast or a reshape."""
    from eqfuse.frontend.onnx_cache import header

    head = header(path)
    sig = Signature([(p, s) for _, p, s in head.inputs])
    onnx_pos = next((o for o, p, _ in head.inputs if p == sig.positions), None)
    sig.max_positions = head.tables.get(onnx_pos)
    sig.window_rows = min(head.windows.values(), default=None)
    return sig


_POSITIONS: dict[tuple, tuple] = {}  # (path, mtime, size) -> (its position table's length, window rows)


def module_signature(model) -> Signature:
    """The Signature of a compiled Module's first graph, with the position limit of the ONNX file
    it was compiled from (read once per file) when it was compiled from one."""
    f = model.default
    inputs = getattr(f, "inputs", None)  # a model bound per call (runtime.padded)
    if inputs is None:
        inputs = [(n, t.shape) for n, t in f.source.params if n in f.free]
    sig = Signature(inputs, getattr(model, "max_positions", None))
    path = getattr(f, "onnx_path", None)
    if path is not None and os.path.isfile(path):
        key = (os.path.realpath(path), os.path.getmtime(path), os.path.getsize(path))
        if key not in _POSITIONS:
            of_file = onnx_signature(path)
            _POSITIONS[key] = (of_file.max_positions, of_file.window_rows)
        positions, sig.window_rows = _POSITIONS[key]
        if sig.max_positions is None:
            sig.max_positions = positions
    return sig


def prompt_mask(real, shape: tuple) -> np.ndarray:
    """The prompt's attention mask as int64 [B, S]: all ones for None."""
    return np.ones(shape, np.int64) if real is None else real


def prompt_positions(real: np.ndarray) -> np.ndarray:
    """The positions of a prompt's tokens under its attention mask [B, S], as transformers'
    generate gives them: a real token's is the number of real tokens before it, a padding
    token's 1 (never attended to, so any position would do)."""
    at = np.cumsum(real, axis=1) - 1
    at[real == 0] = 1
    return at


class Decoder:
    """Runs a decoder export step by step over a cache at a fixed capacity (module docstring).

    `run(feeds: dict) -> list of arrays` calls the model (a compiled Module, or onnxruntime in
    the tests, on the same feeds). prefill(ids) returns the logits of the prompt's last position;
    step(ids [B, 1]) feeds one token per sequence and returns its logits."""

    def __init__(self, sig: Signature, run: Callable[[dict], Sequence[np.ndarray]], capacity: int,
                 step: Callable[[int, int], Callable[[dict], Sequence[np.ndarray]] | None] | None = None):
        self.sig, self.run, self.capacity = sig, run, capacity
        self.make_step = step  # (batch, capacity) -> the decode step over a cache in place, or None
        self.live_step = None
        self.length = 0  # live rows of the cache
        self.cache: list[np.ndarray] = []
        self.mask: np.ndarray | None = None  # [B, capacity + 1]: the live rows, then the new token's
        self.skipped = np.zeros(0, np.int64)  # (the property below)
        self._prepared: PreparedStep | None = None  # the decode step's call over its buffers (PreparedStep)

    @property
    def skipped(self) -> np.ndarray:
        """Per sequence, the masked tokens among its cache's rows (a left-padded prompt's padding):
        a row's next token is at position length - skipped, as transformers counts positions."""
        return self._skipped

    @skipped.setter
    def skipped(self, value) -> None:
        self._skipped = np.asarray(value, np.int64)
        # (as Python ints for the prepared step, whose Python time per step is a few microseconds)
        self._skipped_rows = self._skipped.tolist()
        self._skipped_least = min(self._skipped_rows, default=0)

    def _check_positions(self, last: int) -> None:
        limit = self.sig.max_positions
        if limit is not None and last >= limit:
            raise ArgumentError(f"generate: position {last} is past the model's maximum of {limit} positions "
                                f"({limit - 1} is the last); use fewer new tokens or a shorter prompt")

    def _call(self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, past: list[np.ndarray]):
        outs = self.run(self.sig.feeds(ids, mask, positions, past))
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        if len(outs) != 1 + len(self.sig.pasts):
            raise EqfuseError(f"generate: the model returns {len(outs)} outputs; a decoder export returns the "
                              f"logits and one present per past input ({1 + len(self.sig.pasts)})")
        return outs[0], outs[1:]

    def prefill(self, ids: np.ndarray, length: int | None = None, real: np.ndarray | None = None) -> np.ndarray:
        """The logits of the prompt's last position, the cache filled with its rows (`real`: the
        prompt's attention mask, prompt_mask; None: every token real). `length`
        (at least the prompt's) pads the prompt at its end to that many tokens, the model's
        prefill bucket (prefill_plan): the padded tokens are id 0 at position 0, masked out
        (attention_mask 0), and come after every real one, so a real position's query, which a
        causal model never lets see a later key, and its keys and values are those of the
        prompt alone; the padded rows' results are dropped."""
        b, s = ids.shape
        n = s if length is None else length
        if n < s:
            raise ArgumentError(f"generate: a prefill of {n} tokens cannot hold a prompt of {s}")
        if s + 1 > self.capacity + 1:
            raise ArgumentError(f"generate: a prompt of {s} tokens does not fit a cache of {self.capacity}")
        real = prompt_mask(real, ids.shape)
        at = prompt_positions(real)
        self._check_positions(int(at.max()))
        past = [np.zeros((b, h, 1, d), np.float32) for _, (_, h, _, d) in self.sig.pasts]  # one masked row
        mask = np.zeros((b, 1 + n), np.int64)
        mask[:, 1:1 + s] = real
        positions = np.zeros((b, n), np.int64)
        positions[:, :s] = at
        padded = np.zeros((b, n), np.int64)
        padded[:, :s] = ids
        logits, present = self._call(padded, mask, positions, past)
        # the decode step over a cache in place, compiled now: the decode steps run no compiler
        self.live_step = self.make_step(b, self.capacity) if self.make_step else None
        rows = self.capacity + (self.live_step is not None)  # (its buffers hold the new row too)
        self.cache = []
        for (name, (_, h, _, d)), p in zip(self.sig.pasts, present):
            self._check_present(name, p, (b, h, 1 + n, d))
            buf = np.zeros((b, h, rows, d), np.float32)
            buf[:, :, :s] = p[:, :, 1:1 + s]
            self.cache.append(buf)
        self.length, self.skipped = s, s - real.sum(axis=1)
        self.mask = np.zeros((b, self.capacity + 1), np.int64)
        self.mask[:, :s] = real
        self.mask[:, -1 if self.live_step is None else s] = 1
        return logits[:, s - 1]

    def prefill_chunks(self, ids: np.ndarray, n: int, real: np.ndarray | None = None,
                       runtime: bool = False) -> np.ndarray:
        """prefill's result through the chunk step of n rows (a live step: make_step(batch,
        capacity, n)), the prompt run as successive chunks of n tokens at live lengths 0, n, 2n,
        ...: each appends its rows to the cache in place and attends to the rows before it (the
        earlier chunks') and, causally, to its own. The last chunk is padded at its end to n
        tokens (id 0 at position 0, masked out; its padded rows, written past the live ones, are
        never read: the next token's row overwrites the first). A last chunk whose n rows would
        not fit the buffers runs through the decode step a token at a time.

        runtime=True: the chunk step takes its rows at run time (make_step(batch, capacity, n,
        runtime=True), RuntimeDimRefused where it cannot; chunk_plan, runtime_chunks): the last
        chunk, or a prompt shorter than n, runs as its own rows, with no padded row computed
        (the inputs keep n rows; the step reads the first `m`, given as its length input)."""
        b, s = ids.shape
        cap = self.capacity
        real = prompt_mask(real, ids.shape)
        at = prompt_positions(real)
        if s > cap:
            raise ArgumentError(f"generate: a prompt of {s} tokens does not fit a cache of {cap}")
        # compiled together: one's C compiler runs while the other imports and optimizes
        with ThreadPoolExecutor(max_workers=2) as pool:
            chunk_made, step_made = pool.submit(self.make_step, b, cap, n, runtime), pool.submit(self.make_step, b, cap)
            chunk, self.live_step = chunk_made.result(), step_made.result()
        n = getattr(chunk, "rows", n)  # (run-time rows that were a fixed extent of the model: one fewer)
        new = getattr(chunk, "new", None)
        self.cache = [np.zeros((b, h, cap + 1, d), np.float32) for _, (_, h, _, d) in self.sig.pasts]
        self.mask = np.zeros((b, cap + 1), np.int64)
        t, logits = 0, None
        while t < s and (t + n <= cap + 1 or new is not None):
            m = min(n, s - t)
            self._check_positions(int(at[:, t:t + m].max()))
            part = np.zeros((b, n), np.int64)
            part[:, :m] = ids[:, t:t + m]
            positions = np.zeros((b, n), np.int64)
            positions[:, :m] = at[:, t:t + m]
            self.mask[:, :t + m] = real[:, :t + m]
            self.mask[:, t + m:] = 0
            feeds = self.sig.feeds(part, self.mask, positions, self.cache, np.array([t], np.int64))
            pick = getattr(chunk, "pick", None)
            if pick is not None:  # (the step computes the logits of row m - 1 only: pick_row)
                feeds[pick] = np.array([m - 1], np.int64)
            if new is not None:  # (its rows at run time: the m live ones only)
                feeds[new] = np.array([m], np.int64)
            outs = list(chunk(feeds))
            for k, (p, c) in enumerate(zip(outs[1:], self.cache)):
                if p is not c:
                    self._check_present(self.sig.pasts[k][0], p, c.shape)
                    self.cache[k] = p
            logits = outs[0][:, 0 if pick is not None else m - 1]
            t += m
        self.length, self.skipped = t, t - real[:, :t].sum(axis=1)
        self.mask[:, t + 1:] = 0
        self.mask[:, :t] = real[:, :t]
        self.mask[:, t] = 1  # the next token's row
        for j in range(t, s):  # (a last chunk that would not fit: a token at a time)
            logits = self.step(ids[:, j:j + 1], real[:, j])
        return logits

    def prefill_by_steps(self, ids: np.ndarray, real: np.ndarray | None = None) -> np.ndarray:
        """prefill's result, the prompt fed one token at a time to the decode step (an empty cache
        first): a Module loaded from an artifact holds no prefill at a prompt length it was not
        saved with, and cannot compile one."""
        b, s = ids.shape
        if s > self.capacity:
            raise ArgumentError(f"generate: a prompt of {s} tokens does not fit a cache of {self.capacity}")
        self.live_step = self.make_step(b, self.capacity) if self.make_step else None
        rows = self.capacity + (self.live_step is not None)
        self.cache = [np.zeros((b, h, rows, d), np.float32) for _, (_, h, _, d) in self.sig.pasts]
        self.length, self.skipped = 0, np.zeros(b, np.int64)
        self.mask = np.zeros((b, self.capacity + 1), np.int64)
        self.mask[:, -1 if self.live_step is None else 0] = 1  # the first token's row
        real = prompt_mask(real, ids.shape)
        for j in range(s):
            logits = self.step(ids[:, j:j + 1], real[:, j])
        return logits

    def step(self, ids: np.ndarray, real: np.ndarray | None = None) -> np.ndarray:
        """The logits of one token per sequence, fed at the live length. `real` [B] (a prompt's
        token fed by steps) is its attention mask: 0 for a padding token, which no later token
        attends to; None: every token real."""
        if real is not None and real.all():
            real = None
        if self.live_step is not None:
            return self._step_in_place(ids, real)
        b = ids.shape[0]
        t = self.length
        if t >= self.capacity:
            self._grow()
        positions = (t - self.skipped)[:, None]
        self._check_positions(int(positions.max()))
        if real is not None:
            self.mask[:, -1] = real  # (the new token's column)
        logits, present = self._call(ids, self.mask, positions, self.cache)
        for (n, (_, h, _, d)), p, buf in zip(self.sig.pasts, present, self.cache):
            self._check_present(n, p, (b, h, self.capacity + 1, d))
            buf[:, :, t] = p[:, :, self.capacity]  # the new row, written at the live length
        self.mask[:, t] = 1
        if real is not None:
            self.mask[:, t], self.mask[:, -1] = real, 1
            self.skipped = self.skipped + (1 - real)
        self.length = t + 1
        return logits[:, -1]

    def _step_in_place(self, ids: np.ndarray, real: np.ndarray | None = None) -> np.ndarray:
        """One decode step at live length t: the cache buffers are the step's past inputs and
        come back as its presents, with the new row written at row t (mask row t is the new
        token's, the rows after it are never read)."""
        b, t = ids.shape[0], self.length
        if t > self.capacity:
            self._grow()
        self._check_positions(t - self._skipped_least)
        if real is not None:
            self.mask[:, t] = real  # (the token's own row: a padding token's, masked)
        fast = self._prepared
        if fast is None or not fast.serves(self, ids):
            fast = PreparedStep(self, ids)
            if ids.dtype.kind in "iu":  # (other ids go the checked way, to its message)
                self._prepared = fast
        if fast.run is not None:  # (memoryviews: a numpy call costs more, its code and data cold)
            np.copyto(fast.ids, ids)
            for i, k in enumerate(self._skipped_rows):
                fast.positions[i] = t - k
            fast.length[0] = t
            logits = fast.run()[0]  # (the presents are the buffers given: Runner.prepared)
            if t + 1 <= self.capacity:
                for i in range(b):
                    fast.mask[i * (self.capacity + 1) + t + 1] = 1  # the next token's row
        else:
            outs = list(self.live_step(self.sig.feeds(ids, self.mask, (t - self.skipped)[:, None], self.cache,
                                                      np.array([t], np.int64))))
            presents, logits = outs[1:], outs[0]
            for k in compress(range(len(presents)), map(is_not, presents, self.cache)):
                # (the step returns each buffer as is; a copy would be a model's bug)
                self._check_present(self.sig.pasts[k][0], presents[k], self.cache[k].shape)
                self.cache[k] = presents[k]
            if t + 1 <= self.capacity:
                self.mask[:, t + 1] = 1  # the next token's row
        if real is not None:
            self.skipped = self.skipped + (1 - real)
        self.length = t + 1
        return logits[:, -1]

    def _grow(self) -> None:
        """Grows the capacity to the smallest one above it whose decode step the model holds
        compiled at this batch (no compile), else doubles it (the step then compiles once)."""
        held = getattr(self.make_step, "held", None) if self.live_step is not None else None
        above = sorted(c for c in (held(self.mask.shape[0]) if held else ()) if c > self.capacity)
        cap = above[0] if above else self.capacity * 2
        rows = cap + (self.live_step is not None)
        self.cache = [np.concatenate([c, np.zeros(c.shape[:2] + (rows - c.shape[2],) + c.shape[3:], c.dtype)], axis=2)
                      for c in self.cache]
        mask = np.zeros((self.mask.shape[0], cap + 1), np.int64)
        mask[:, :self.length] = self.mask[:, :self.length]
        mask[:, -1 if self.live_step is None else self.length] = 1
        if self.live_step is not None:
            self.live_step = self.make_step(self.mask.shape[0], cap)
        self.capacity, self.mask = cap, mask

    @staticmethod
    def _check_present(name: str, p: np.ndarray, want: tuple) -> None:
        if tuple(p.shape) != want:
            raise EqfuseError(f"generate: the model's present output for '{name}' has shape {list(p.shape)}, "
                              f"expected {list(want)} (past and new rows along axis 2)")


class PreparedStep:
    """The decode step's call over the Decoder's buffers, made once and run at every step
    (eqfuse.runtime.module.GraphFunction.prepare): the step's token ids, positions and live
    length are arrays of its own, written in place at each step, and the cache buffers and the
    mask are the Decoder's. A step then runs no argument check and builds no feeds: after a
    decode step has streamed its weights, nothing the Python of a call touches is in any cache,
    and each object costs a trip to memory (`benchmarks/bench_generate.py`'s steps: the time
    outside the C call about a fifth of a millisecond a step by keyword, less by position, and
    a few hundredths prepared). `run` is None where the step cannot be prepared (a run
    function without `prepare`, such as onnxruntime's in the tests; a first bf16 step, whose f32
    caches are rounded into new buffers): the Decoder then calls it with feeds, as before.
    Made again when the step, the buffers or the batch change."""

    def __init__(self, dec: Decoder, ids: np.ndarray):
        b = ids.shape[0]
        self.step, self.of_mask, self.cache, self.shape = dec.live_step, dec.mask, list(dec.cache), ids.shape
        self.ids = np.zeros((b, 1), np.int64)
        positions, length = np.zeros((b, 1), np.int64), np.zeros(1, np.int64)
        # the step's inputs written at each step, as flat memoryviews of the arrays it reads
        self.positions, self.length = memoryview(positions.reshape(-1)), memoryview(length)
        self.mask = memoryview(dec.mask.reshape(-1))
        prepare = getattr(dec.live_step, "prepare", None)
        self.run = None
        if prepare is not None and ids.shape == (b, 1) and ids.dtype.kind in "iu" and dec.mask.flags.c_contiguous:
            self.run = prepare(dec.sig.feeds(self.ids, dec.mask, positions, dec.cache, length))

    def serves(self, dec: Decoder, ids: np.ndarray) -> bool:
        """Made for this Decoder's step, buffers and batch (the identity of each), and integer ids."""
        return (self.step is dec.live_step and self.of_mask is dec.mask and ids.shape == self.shape
                and ids.dtype.kind in "iu" and all(map(is_, self.cache, dec.cache)))


# ---------------------------------------------------------------- choosing tokens


def choose(logits: np.ndarray, do_sample: bool, temperature: float, top_k: int, top_p: float,
           rng: np.random.Generator) -> np.ndarray:
    """The next token of each row of logits [B, V]: the argmax, or a sample of the softmax at
    `temperature` over the top_k tokens (0: all) within the smallest set whose probability
    reaches top_p (HF's order: temperature, then top-k, then top-p)."""
    logits = np.asarray(logits, np.float64)
    if not do_sample:
        return logits.argmax(axis=-1)
    z = logits / temperature
    v = z.shape[-1]
    if 0 < top_k < v:
        kth = np.sort(z, axis=-1)[:, -top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    if top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sp = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(sp, axis=-1) - sp  # probability of the tokens ranked above
        keep = np.zeros_like(p, bool)
        np.put_along_axis(keep, order, before < top_p, axis=-1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    u = rng.random((p.shape[0], 1))
    return np.minimum((np.cumsum(p, axis=-1) < u).sum(axis=-1), v - 1)


# ---------------------------------------------------------------- the driver


_MODULES: dict[tuple, object] = {}  # (path, mtime, size) -> (Module, Signature): a path compiled once


def load_decoder(path: str | os.PathLike):
    """(Module, Signature) of an ONNX decoder export, compiled once per file per process (its
    bindings then serve every later generate call on the path)."""
    from eqfuse.pipeline import compile as compile_model

    real = os.path.realpath(os.fspath(path))
    if not os.path.isfile(real):
        raise EqfuseError(f"{path}: no such file")
    key = (real, os.path.getmtime(real), os.path.getsize(real))
    if key not in _MODULES:
        # compiled first: its import keeps the file's header, which onnx_signature then reads
        # without parsing the file again (a non-decoder is refused after its compile)
        module = compile_model(real)
        _MODULES[key] = (module, onnx_signature(real))
    return _MODULES[key]


LENGTH = "past_length"  # the decode step's live length input (compile's live="past": pipeline.length_input)


def step_dims(sig: Signature, capacity: int, batch: int | None = None, rows: int = 1) -> dict[str, int]:
    """The dims of the decode step over a cache of `capacity` rows (one new token, the mask over
    the capacity and the new row), with the batch when it is given (a step compiled per batch
    size) and left a batch dim when not (a step compiled on the batch buckets). With `rows` > 1,
    the chunk step of that many new tokens over the same buffers: past = capacity + 1 - rows,
    so that its buffers [.., past + rows, ..] and mask are the decode step's."""
    ids, mask, past = sig.shapes[sig.ids], sig.shapes[sig.mask], sig.pasts[0][1]
    dims = {ids[0]: batch, ids[1]: rows, past[2]: capacity + 1 - rows, mask[1]: capacity + 1}
    return {k: v for k, v in dims.items() if isinstance(k, str) and v is not None}


def step_maker(module, sig: Signature):
    """(batch, capacity) -> the decode step over a cache in place (module docstring), for a model
    bound per call (an ONNX decoder compiled by eqfuse.compile); None for another Module.

    The step is compiled once per capacity and batch size; once per capacity when the model was
    compiled with buckets= for its batch dim (`eqfuse.compile(path, buckets={"batch": [1, 4]})`),
    the step then compiled at those batch sizes and any batch running on them (eqfuse.runtime.
    buckets), as the prefill does. A loaded artifact's step on its buckets serves every batch."""
    f = module.default
    if not hasattr(f, "live_module"):
        return None
    live = sig.pasts[0][1][2]

    def make(batch: int, capacity: int, rows: int = 1, runtime: bool = False, tries: int = 4):
        any_batch = step_dims(sig, capacity, rows=rows)
        pick = PICK if rows > 1 else None  # a chunk's logits at its last real token only (Decoder.prefill_chunks)
        # a chunk step whose rows are a dim at run time (any chunk up to `rows`): RuntimeDimRefused if not
        new = sig.shapes[sig.ids][1] if runtime else None
        key = (tuple(sorted(any_batch.items())), live, pick) + ((new,) if new is not None else ())
        bucketed = key in f.live_modules or (f.batch_dim is not None and f.batch_dim in getattr(f, "batch_buckets", {}))
        try:
            step = f.live_module(any_batch if bucketed else step_dims(sig, capacity, batch, rows), live, pick, new)
        except RuntimeDimRefused as e:  # (rows that are a fixed extent of the model too: one fewer)
            if new is None or not _extent(e) or rows <= 2 or tries <= 1:
                raise
            return make(batch, capacity, rows - 1, runtime, tries - 1)
        free = tuple(step.default.free)

        def run(feeds: dict):
            # by position when the feeds are the step's parameters: a call with the last call's
            # shapes and dtypes then goes straight to its run function (Function.__call__), where
            # by keyword each step matched every name and checked every array again
            if len(feeds) == len(free) and all(map(feeds.__contains__, free)):
                return step(*map(feeds.__getitem__, free))
            return step(**feeds)

        def prepare(feeds: dict):
            # the call over these very arrays, made once (GraphFunction.prepare; PreparedStep)
            if len(feeds) == len(free) and all(map(feeds.__contains__, free)):
                return step.default.prepare(*map(feeds.__getitem__, free))
            return None
        run.prepare, run.pick = prepare, pick
        run.new = None if new is None else f"{new}_length"  # (its live new rows' input: pipeline.length_input)
        run.rows = rows
        return run

    def held(batch: int) -> set[int]:
        """The capacities of the decode steps compiled at `batch` (or on batch buckets)."""
        return {d[live] for d in compiled_steps(f, sig, batch) if live in d}
    make.held = held
    return make


def compiled_steps(f, sig: Signature, batch: int | None = None, chunks: bool = False) -> list[dict]:
    """The dims of the steps over a cache in place (step_maker) that a function bound per call
    (runtime.padded, `f.live_modules`) holds compiled: its decode steps (one token), or with
    chunks=True its chunk steps; with `batch`, those at that batch or on batch buckets."""
    seq, past, batch_dim = sig.shapes[sig.ids][1], sig.pasts[0][1][2], sig.shapes[sig.ids][0]
    steps = (dict(key) for key, live, *_ in f.live_modules if live == past)
    return [d for d in steps if (d.get(seq, 1) > 1) == chunks
            and (batch is None or d.get(batch_dim, batch) == batch)]


def held_chunks(model, sig: Signature, batch: int, capacity: int) -> list[int]:
    """The lengths of the chunk steps (step_dims' rows > 1) a model bound per call holds compiled
    over a cache of `capacity` rows at `batch` (or on batch buckets), shortest first."""
    f = model.default
    if not hasattr(f, "live_modules"):
        return []
    seq, past = sig.shapes[sig.ids][1], sig.pasts[0][1][2]
    return sorted({d[seq] for d in compiled_steps(f, sig, batch, chunks=True) if d[past] + d[seq] == capacity + 1})


def _at(key: tuple, sig: Signature, batch: int, capacity: int) -> bool:
    """Whether live_module's key is a chunk step with its rows at run time over a cache of
    `capacity` rows at `batch` (or on batch buckets)."""
    seq, past, batch_dim = sig.shapes[sig.ids][1], sig.pasts[0][1][2], sig.shapes[sig.ids][0]
    d = dict(key[0])
    return len(key) == 4 and key[1] == past and d.get(past, 0) + d.get(seq, 0) == capacity + 1 \
        and d.get(batch_dim, batch) == batch


def _extent(e: EqfuseError) -> bool:
    """Whether a run-time chunk step was refused for its rows only: a fixed extent of the model
    too (step_maker then tries one row fewer)."""
    return "fixed extent" in e.message


def runtime_chunks(model, sig: Signature, batch: int, capacity: int) -> bool:
    """Whether a prompt's chunk steps over a cache of `capacity` rows take their rows at run time
    (Decoder.prefill_chunks with runtime=True: one step of RUNTIME_CHUNK rows runs a chunk of
    any length up to them, computing its live rows only): when the model holds one, or can
    compile one (not a loaded artifact) and has not had it refused (RuntimeDimRefused: a kernel
    that cannot take the bound, or an export whose chunk at one more row is not the same graph; a
    ChunkRefused step, refused again without a compile, prefills the prompt whole)."""
    f = model.default
    if not hasattr(f, "live_modules"):
        return False
    if any(_at(key, sig, batch, capacity) for key in f.live_modules):
        return True
    refused = [k for k in f._refused if _at(k, sig, batch, capacity) and isinstance(f._refused[k], RuntimeDimRefused)
               and not _extent(f._refused[k])]
    return getattr(model, "artifact", None) is None and not refused


def chunk_plan(model, sig: Signature, s: int, batch: int, capacity: int) -> int:
    """The chunk length n a prompt of s tokens is prefilled with (Decoder.prefill_chunks), for a
    model bound per call (an ONNX decoder compiled by eqfuse.compile) at this capacity and batch:
    the shortest chunk step compiled that holds the prompt (one chunk); else the longest compiled
    (the prompt in chunks of it, with no compile); with none, the prompt's bucket, the power of
    two at or above s, at least PREFILL_MIN and at most CHUNK_MAX (and the capacity): compiled
    once, then it serves every prompt up to the capacity. With its rows at run time
    (runtime_chunks), the rows of the step held, else RUNTIME_CHUNK (within the capacity)."""
    if runtime_chunks(model, sig, batch, capacity):
        held = [dict(key[0])[sig.shapes[sig.ids][1]] for key in model.default.live_modules
                if _at(key, sig, batch, capacity)]
        return held[0] if held else min(RUNTIME_CHUNK, capacity)
    held = held_chunks(model, sig, batch, capacity)
    fits = [n for n in held if n >= s]
    if fits:
        return fits[0]
    if held:
        return held[-1]
    return min(max(PREFILL_MIN, 1 << max(s - 1, 0).bit_length()), CHUNK_MAX, capacity)


def prefill_in_chunks(dec: Decoder, model, ids: np.ndarray, real: np.ndarray | None = None) -> np.ndarray:
    """dec.prefill_chunks as generate runs it: with the chunk's rows at run time where the model
    has or can compile such a step (runtime_chunks), else, and where that step is refused (the
    refusal remembered), in chunks of the compiled length chunk_plan picks. ChunkRefused: no
    chunk step at all (generate then prefills the prompt whole)."""
    sig, (b, s), cap = dec.sig, ids.shape, dec.capacity
    if runtime_chunks(model, sig, b, cap):
        try:
            return dec.prefill_chunks(ids, chunk_plan(model, sig, s, b, cap), real, runtime=True)
        except RuntimeDimRefused:
            pass
    return dec.prefill_chunks(ids, chunk_plan(model, sig, s, b, cap), real)


def prefill_plan(model, sig: Signature, s: int) -> tuple[int, int]:
    """(how many of a prompt of s tokens the prefill takes, the length it runs at, the prompt
    padded: Decoder.prefill); the rest goes through the decode step a token at a time. For a
    model without a chunk step (generate prefills in chunks where it can: chunk_plan): a Module
    loaded from an artifact saved before chunked prefill.

    A model bound per call (an ONNX decoder compiled by eqfuse.compile) has its prefill compiled
    per length: the prompt is padded to the smallest length compiled that holds it, so a prompt
    of any length up to it runs without the compiler. With none, the prefill compiles at the
    prompt's bucket: the power of two at or above it, at least PREFILL_MIN (within the model's
    positions), so that a process compiles one prefill per power of two of its prompts' lengths,
    not one per length. A Module loaded from an artifact cannot compile: a prompt longer than every
    prefill it holds runs its first tokens through the longest one, and the rest through the decode
    step. Any other model runs the prompt as it is."""
    f = model.default
    if not hasattr(f, "live_modules"):
        return s, s
    seq, past = sig.shapes[sig.ids][1], sig.pasts[0][1][2]
    held = sorted({b[seq] for b in (dict(zip(f.padded, key)) for key in f.modules) if b.get(past) == 1 and seq in b})
    fits = [n for n in held if n >= s]
    if fits:
        return s, fits[0]
    if getattr(model, "artifact", None) is not None:
        return (held[-1], held[-1]) if held else (0, 0)
    n = max(PREFILL_MIN, 1 << max(s - 1, 0).bit_length())
    if sig.max_positions is not None:  # (the masked past row takes a position too)
        n = max(s, min(n, sig.max_positions - 1))
    if not sig.fits_window(1, n):  # (the masked past row takes one of the window's rows)
        n = max(s, sig.window_rows - 1)
    return s, n


def _model(model):
    """(Module, run, Signature, step maker) of a Module or of the path of an ONNX decoder export."""
    if isinstance(model, (str, os.PathLike)):
        module, sig = load_decoder(model)
    elif hasattr(model, "default") and hasattr(model, "functions"):
        module, sig = model, module_signature(model)
    else:
        raise EqfuseError(f"generate: model must be an eqfuse Module or the path of an ONNX decoder export, "
                          f"not {type(model).__name__}")
    return module, (lambda feeds: module(**feeds)), sig, step_maker(module, sig)


def held_steps(model, sig: Signature, batch: int) -> tuple[set[int], set[int]] | None:
    """(the prompt lengths whose prefill, the capacities whose decode step it holds compiled at
    `batch`) of a Module loaded from an artifact, which cannot compile another; None for any
    other model. The decode step is the step over the cache in place where the model has one
    (step_maker), else the model at sequence 1 and past = the capacity."""
    if getattr(model, "artifact", None) is None:
        return None
    f = model.default
    shapes = sig.shapes
    seq, past = shapes[sig.ids][1], shapes[sig.pasts[0][0]][2]
    if hasattr(f, "live_modules"):  # bound per call (runtime.padded): its buckets and decode steps
        binds = [dict(zip(f.padded, key)) for key in f.modules]
        steps = compiled_steps(f, sig)
    else:
        binds = [dict(key) for key in list(f.cache) + list(f.buckets)]
        steps = [b for b in binds if b.get(seq) == 1]
    batch_dim = shapes[sig.ids][0]
    prompts = {b[seq] for b in binds if b.get(past) == 1 and seq in b}
    return prompts, {b[past] for b in steps if past in b and b.get(batch_dim, batch) == batch}


def run_batch(model, sig: Signature, b: int, need: int) -> int:
    """The batch a generation of b sequences that needs `need` cache rows runs at: b, unless the
    model holds no decode step at b and holds one at a larger batch of at most 2b, over a cache
    it would run at that batch (the capacity live_capacity gives it, for a Module bound per call;
    one of at least `need` rows, for a loaded artifact). The smallest such batch then serves:
    its extra rows repeat the last sequence and are dropped, so a new batch size below a
    compiled one compiles nothing, and a loaded artifact serves it. A decode step is a few rows'
    GEMMs over weights streamed once, so extra rows cost it little; a prompt's chunks, up to
    twice its work. A model on batch buckets (buckets=) runs any batch on them as it is."""
    f = model.default
    if not hasattr(f, "live_modules") or f.batch_buckets:
        return b
    past, batch_dim = sig.pasts[0][1][2], sig.shapes[sig.ids][0]
    loaded = getattr(model, "artifact", None) is not None
    steps = [d for d in compiled_steps(f, sig) if past in d and isinstance(d.get(batch_dim), int)]
    sizes = {d[batch_dim] for d in steps  # (a loaded Module cannot compile: any capacity that holds them)
             if (d[past] >= need if loaded else d[past] == live_capacity(sig, need, d[batch_dim]))}
    if b in sizes:
        return b
    return min((n for n in sizes if b < n <= 2 * b), default=b)


def _check_mask(attention_mask, ids: np.ndarray) -> np.ndarray | None:
    """The attention mask as int64 [B, S] of zeros and ones, each row with a one; None when absent
    or all ones (every token real: the plain prompt's path)."""
    if attention_mask is None:
        return None
    m = np.asarray(attention_mask)
    if m.ndim == 1:
        m = m[None]
    if m.shape != ids.shape or m.dtype.kind not in "biu":
        raise ArgumentError(f"generate: attention_mask must be integers or booleans of input_ids' shape "
                            f"{list(ids.shape)}, got {m.dtype} {list(m.shape)}")
    if not np.isin(m, (0, 1)).all():
        raise ArgumentError("generate: attention_mask must hold 0 (a padding token) and 1 (a real token) only")
    m = m.astype(np.int64)
    empty = np.flatnonzero(m.sum(axis=1) == 0)
    if empty.size:
        raise ArgumentError(f"generate: attention_mask row {int(empty[0])} masks every token of its prompt; "
                            "a prompt needs one real token")
    return None if m.all() else m


def _check_args(input_ids, max_new_tokens, temperature, top_k, top_p) -> np.ndarray:
    ids = np.asarray(input_ids)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[0] == 0 or ids.shape[1] == 0 or ids.dtype.kind not in "iu":
        raise ArgumentError(f"generate: input_ids must be integers of shape [batch, sequence], got "
                            f"{ids.dtype} {list(ids.shape)}")
    if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
        raise ArgumentError(f"generate: max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    if not temperature > 0:
        raise ArgumentError(f"generate: temperature must be positive, got {temperature!r}")
    if not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ArgumentError(f"generate: top_k must be a non-negative integer, got {top_k!r}")
    if not 0 < top_p <= 1:
        raise ArgumentError(f"generate: top_p must be in (0, 1], got {top_p!r}")
    return ids.astype(np.int64)


def check_window(sig: Signature, s: int, max_new_tokens: int) -> None:
    """Refuse a generation past a sliding window on a cache at a fixed capacity: its sliding
    layers' presents are their last window - 1 rows, no longer past + new (the steps over the
    cache in place keep it whole instead: eqfuse.frontend.onnx_inputs.window_slices)."""
    need = s + max_new_tokens - 1
    if not sig.fits_window(need, 1):
        raise ArgumentError(f"generate: a prompt of {s} tokens and {max_new_tokens} new tokens need a cache of {need} "
                            f"rows, and the model's sliding-window layers keep {sig.window_rows} (sliding_window "
                            f"{sig.window_rows + 1}): without its steps over the cache in place, eqfuse.generate "
                            f"runs such a model within its window, up to {sig.window_rows - 1} rows; use fewer new "
                            "tokens or a shorter prompt")


def _start(resolved, ids: np.ndarray, max_new_tokens: int, real: np.ndarray | None = None):
    """(the Decoder over the model's cache, the logits of the prompt's last position): the model
    (`resolved`: _model's tuple) with the capacity chosen and the prompt prefilled (`real`: its
    attention mask, None for all real); (None, None) for no new tokens."""
    model, run, sig, step = resolved
    b, s = ids.shape
    if max_new_tokens == 0:
        return None, None
    longest = s if real is None else int(real.sum(axis=1).max())  # (padding takes rows, not positions)
    if sig.max_positions is not None and longest + max_new_tokens - 1 > sig.max_positions:
        raise ArgumentError(f"generate: a prompt of {longest} tokens and {max_new_tokens} new tokens reach position "
                            f"{longest + max_new_tokens - 2}, past the model's maximum of {sig.max_positions} positions")
    need, held = s + max_new_tokens - 1, held_steps(model, sig, b)
    chunked = held is None and step is not None  # a prompt in chunks over the cache in place
    capacity = live_capacity(sig, need, b) if chunked else sig.within_window(capacity_for(need))
    if held is not None:  # a loaded Module: the smallest capacity it holds that fits
        fits = sorted(c for c in held[1] if c >= need)
        if not fits:
            raise ArgumentError(f"generate: the model's decode step is compiled for caches of "
                                f"{', '.join(map(str, sorted(held[1]))) or 'no'} rows at batch {b}; a prompt of {s} "
                                f"tokens and {max_new_tokens} new tokens need {need}: generate with the compiled "
                                "model at this length and batch once, then save it again")
        capacity = fits[0]
        # (a loaded Module runs its prompt in chunks when it holds a chunk step at that capacity)
        chunked = step is not None and bool(held_chunks(model, sig, b, capacity))
    if not chunked:
        check_window(sig, s, max_new_tokens)
    dec = Decoder(sig, run, capacity, step)
    logits = None
    if chunked:
        try:
            logits = prefill_in_chunks(dec, model, ids, real)
        except ChunkRefused:  # (an export whose mask is computed at run time: the prompt whole)
            check_window(sig, s, max_new_tokens)
    if logits is None:
        first, length = prefill_plan(model, sig, s) if step is not None else (s, s)
        real = prompt_mask(real, ids.shape)
        if first:
            logits = dec.prefill(ids[:, :first], length, real[:, :first])
            for j in range(first, s):  # (a loaded Module's prompt longer than its prefills)
                logits = dec.step(ids[:, j:j + 1], real[:, j])
        else:
            logits = dec.prefill_by_steps(ids, real)
    return dec, logits


def generate(model, input_ids, max_new_tokens: int = 32, do_sample: bool = False, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, seed: int | None = None, eos_token_id: int | None = None,
             attention_mask=None) -> np.ndarray:
    """Generate up to max_new_tokens after input_ids [B, S] (or [S]); returns the ids [B, S + new].

    attention_mask [B, S] (as transformers takes it: 1 a real token, 0 padding) lets prompts of
    different lengths share a batch, padded on the left: padding tokens take cache rows but no
    positions, and no token attends to them.

    do_sample=False takes the most likely token (greedy, as transformers' generate(do_sample=False));
    do_sample=True samples with temperature, top_k (0: no limit) and top_p (1: no limit) from a
    generator seeded by `seed`. A sequence that emits eos_token_id is finished: its later tokens
    are eos_token_id, and generation stops when every sequence is finished (so `new` may be less
    than max_new_tokens)."""
    ids = _check_args(input_ids, max_new_tokens, temperature, top_k, top_p)
    real = _check_mask(attention_mask, ids)
    from eqfuse.frontend.onnx_cache import sharing_parses

    b, s = ids.shape
    with sharing_parses():  # (a path's first compile imports the file three times: one parse)
        resolved = _model(model)  # (a path compiled, a Module checked)
        module, _, sig, _ = resolved
        extra = run_batch(module, sig, b, s + max_new_tokens - 1) - b  # (rows repeating the last sequence)
        dec, logits = _start(resolved, _pad_rows(ids, extra), max_new_tokens,
                             None if real is None else _pad_rows(real, extra))
    if logits is None:
        return ids
    rng = np.random.default_rng(seed)
    out = [ids]
    done = np.zeros(b, bool)
    for k in range(max_new_tokens):
        tok = choose(logits[:b], do_sample, temperature, top_k, top_p, rng).astype(np.int64)
        if eos_token_id is not None:
            tok = np.where(done, eos_token_id, tok)
            done |= tok == eos_token_id
        out.append(tok[:, None])
        if k + 1 == max_new_tokens or done.all():
            break
        logits = dec.step(_pad_rows(tok, extra)[:, None])
    return np.concatenate(out, axis=1)


def _pad_rows(a: np.ndarray, extra: int) -> np.ndarray:
    """a with `extra` more rows, copies of its last (run_batch)."""
    return np.concatenate([a, np.repeat(a[-1:], extra, axis=0)]) if extra else a


__all__ = ["generate", "load_decoder", "Decoder", "held_steps", "prefill_plan", "chunk_plan", "runtime_chunks", "prefill_in_chunks", "live_capacity", "step_dims", "step_maker", "Signature", "onnx_signature", "module_signature", "capacity_for", "choose"]
