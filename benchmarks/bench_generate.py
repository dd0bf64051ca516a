"""Greedy generation with a KV cache: eqfuse against onnxruntime, OpenVINO, torch eager and
torch.compile, prefill and decode apart, against the machine's memory bandwidth.

    flock /tmp/eqfuse-bench.lock python benchmarks/bench_generate.py --model gpt2 --threads 1
        [--batch 1 --batch 4] [--prompt 128] [--new 128]
        [--peers eqfuse,eqfuse-bf16,ort,ov,ov-default,torch,compile] [--capacity 2048] [--rounds 5]
    flock /tmp/eqfuse-bench.lock python benchmarks/bench_generate.py --model gpt2 --peers eqfuse,eqfuse-loaded
    flock /tmp/eqfuse-bench.lock python benchmarks/bench_generate.py --model llama --first [--rounds 2]

Models (random weights, tests/decoder_exports.py, the TorchScript export with past key values):
`gpt2`, GPT-2-small-sized (12 layers, 768 wide, 12 heads, 50257 tokens, 1024 positions, the LM
head tied to the token table); `llama`, Llama-style of about 300M parameters (20 layers, 1024
wide, 16 heads, 4 key/value heads, MLP 2816, 32000 tokens, untied head); `--layers/--width` for a
smaller quick run. One process per thread count (each library's threads set once, at start).

Each peer generates `--new` tokens greedily from the same prompt: the prefill (the prompt in one
call, giving token 1) and `--new - 1` decode steps, each timed. eqfuse runs eqfuse.generate's
Decoder (the prompt in chunks and the decode step over its cache in place, docs/generation.md;
until 2026-11-30 this benchmark prefilled eqfuse's prompt whole, not as generate does), in f32 and with
precision="bf16" (`eqfuse-bf16`: its weight stream is half the bytes); onnxruntime and OpenVINO
run the same .onnx as their users do (the presents fed back as the next past, the past growing);
torch eager and torch.compile(dynamic=True) run the transformers module with its DynamicCache.
The first generation of each peer compiles and warms up and is not timed.

`--rounds R` (default 1) times R generations per peer, interleaved between the peers (every peer's
first, then every peer's second, ...), and takes each decode step's median over the rounds before
the medians below: a single generation's time per token moves by +-25% on a shared VM (another
process takes a core for some milliseconds), which is more than the 10% the flatness figure is
held to; the median over rounds of each position keeps a burst out of the first or last 8 tokens.
Prefill is the median over the rounds; the ids compared are the first round's. At more than one
thread each generation starts once the other peers' threads have stopped spinning
(benchmarks/timing.py's `settle`): until 2026-11-30 eqfuse's prefill right after onnxruntime's
generation ran beside onnxruntime's spinning pool, on one thread's share (Llama-style 2-thread
prefill 141 tokens/s so, 241 with the process quiet); bench_load.py `--kind peers` measures that case.

Printed per peer: prefill tokens/s, decode tokens/s (median step), ms per token at the first 8
decode steps (tokens 2-9) and the last 8 (tokens 121-128 at --new 128), `flat`: the last 8's
median against the first 8's (issue 31 holds it within 10%), and at batch 1 the
weight stream's GB/s (the bytes of the weights one decode step reads: every matrix, the lm head,
not the embedding tables it only gathers a row from) and its fraction of STREAM triad bandwidth,
measured in this process at the same thread count (a[i] = b[i] + s * c[i] over float32 arrays of
128 MiB each: 12 bytes an element, the bytes STREAM counts, without the write's allocating read.
Until 2026-11-28 this counted 24, STREAM's bytes for doubles: it printed twice the bandwidth, and
the fractions of triad in the RESULTS.md sections before then are half the true ones). Then
eqfuse's decode step profiled per kernel (top 10, at the last live length).

`--first` times what the table above leaves out: the first generation of `--new` tokens in a new
process, from the model's file to the last token. eqfuse: `eqfuse.generate(path, ...)` with its
caches empty (`cold`: the import, the optimizer, the C builds, the panels) and then filled by that
run (`warm`: a later process on the same machine); onnxruntime: its session's creation and the
same greedy generation; OpenVINO f32: read_model, compile_model and the generation. Each a child
process (`--child-first`), the peers interleaved over `--rounds`; printed per peer, its median and
range over the rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from timing import settle  # noqa: E402

MODELS = {  # name -> (export_decoder's model, layers, width, heads, sizes)
    "gpt2": ("gpt2", 12, 768, 12, {"vocab": 50257}),
    "llama": ("llama", 20, 1024, 16, {"vocab": 32000, "ff": 2816, "kv_heads": 4}),
}
GATHERED = ("wpe", "embed_tokens")  # tables a decode step reads one row of (GPT-2's wte is also its lm head)

TRIAD_C = r"""
void triad(float* restrict a, const float* restrict b, const float* restrict c, float s, long n)
{
    #pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}
"""


def triad_gbs(threads: int, repeat: int = 15) -> float:
    """STREAM triad GB/s at `threads` (the best of `repeat`, as STREAM reports)."""
    from eqfuse.backend.cbuild import COMMON_C, COMMON_CDEF, build

    built = build(COMMON_C + TRIAD_C, COMMON_CDEF + "void triad(float* a, const float* b, const float* c, "
                  "float s, long n);", "bench_triad")
    lib, ffi = built.lib, built.ffi
    n = 32 << 20
    a, b, c = np.zeros(n, np.float32), np.ones(n, np.float32), np.full(n, 2, np.float32)
    p = lambda x: ffi.cast("float *", x.ctypes.data)  # noqa: E731
    lib.eqf_set_threads(threads)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        lib.triad(p(a), p(b), p(c), 3.0, n)
        best = min(best, time.perf_counter() - t)
    assert a[0] == 7.0 and a[-1] == 7.0
    return 12 * n / best / 1e9  # (three float32 arrays: 12 bytes an element)


def greedy(prefill, step, ids: np.ndarray, new: int) -> tuple[float, list[float], np.ndarray]:
    """(prefill seconds, seconds of each decode step, the generated ids [B, new])."""
    t = time.perf_counter()
    logits = prefill(ids)
    first = time.perf_counter() - t
    toks, steps = [logits.argmax(-1)], []
    for _ in range(new - 1):
        tok = toks[-1][:, None].astype(np.int64)
        t = time.perf_counter()
        logits = step(tok)
        steps.append(time.perf_counter() - t)
        toks.append(logits.argmax(-1))
    return first, steps, np.stack(toks, 1)


class Chunked:
    """eqfuse.generate's prefill and decode steps: the prompt in chunks over the cache in place
    (generation.prefill_in_chunks: the chunk's rows at run time, as generate runs it; until
    2026-12-01 afternoon, the chunk compiled at the length chunk_plan picks), then the decode step;
    a model without chunk steps (an artifact saved without them) prefills whole (Decoder.prefill)."""

    def __init__(self, dec, model, sig):
        self.dec, self.model, self.sig = dec, model, sig
        self.step = dec.step

    def prefill(self, ids):
        from eqfuse.errors import ChunkRefused
        from eqfuse.generation import prefill_in_chunks

        try:
            return prefill_in_chunks(self.dec, self.model, ids)
        except ChunkRefused:
            return self.dec.prefill(ids)


class Growing:
    """An ONNX runtime fed as its users do: the presents come back as the next past."""

    def __init__(self, run, past_names: list[str], kv: int, head: int):
        self.run, self.past_names, self.kv, self.head = run, past_names, kv, head

    def prefill(self, ids):
        b, s = ids.shape
        self.past = [np.zeros((b, self.kv, 0, self.head), np.float32) for _ in self.past_names]
        self.n = 0
        return self._call(ids)

    def step(self, tok):
        return self._call(tok)

    def _call(self, ids):
        b, s = ids.shape
        feeds = {"input_ids": ids, "attention_mask": np.ones((b, self.n + s), np.int64),
                 "position_ids": np.tile(np.arange(self.n, self.n + s), (b, 1))}
        feeds.update(zip(self.past_names, self.past))
        outs = self.run(feeds)
        self.past, self.n = outs[1:], self.n + s
        return outs[0][:, -1]


class Torch:
    """The transformers module (or its torch.compile) with a DynamicCache."""

    def __init__(self, fn):
        self.fn = fn

    def prefill(self, ids):
        import torch

        with torch.inference_mode():
            ids = torch.from_numpy(ids)
            self.n = ids.shape[1]
            out = self.fn(input_ids=ids, position_ids=torch.arange(self.n).expand(ids.shape), use_cache=True)
            self.cache = out.past_key_values
            return out.logits[:, -1].float().numpy()

    def step(self, tok):
        import torch

        with torch.inference_mode():
            tok = torch.from_numpy(tok)
            out = self.fn(input_ids=tok, position_ids=torch.full(tok.shape, self.n), past_key_values=self.cache,
                          use_cache=True)
            self.n += 1
            self.cache = out.past_key_values
            return out.logits[:, -1].float().numpy()


def export_path(a):
    """(the export's path, its model's sizes) for --model, --layers, --width, --exporter."""
    import decoder_exports as de

    kind, layers, width, heads, sizes = MODELS[a.model]
    layers, width = a.layers or layers, a.width or width
    positions = 1024 if kind == "gpt2" else 2048
    return de.export_decoder(kind, a.exporter, layers, width, heads, positions, **sizes), layers, heads, sizes


FIRST_PEERS = ("eqfuse cold", "eqfuse warm", "onnxruntime", "OpenVINO f32")


def first_generation(a) -> None:
    """--first: each peer's first generation in a child process (module docstring)."""
    import shutil
    import subprocess
    import tempfile

    export_path(a)  # (made here, once: the children find it cached)
    times: dict[str, list[float]] = {p: [] for p in FIRST_PEERS}
    for r in range(a.rounds):
        cache = Path(tempfile.mkdtemp(prefix="bench-first-")) / "cache"
        try:
            for peer in FIRST_PEERS:  # (warm after cold: the cold child fills the cache)
                env = {**os.environ, "EQFUSE_CACHE_DIR": str(cache)}
                out = subprocess.run([sys.executable, __file__, "--child-first", peer, "--model", a.model,
                                      "--exporter", a.exporter,
                                      "--threads", str(a.threads), "--prompt", str(a.prompt), "--new", str(a.new)]
                                     + (["--layers", str(a.layers)] if a.layers else [])
                                     + (["--width", str(a.width)] if a.width else []),
                                     env=env, capture_output=True, text=True, check=False)
                line = next((x for x in out.stdout.splitlines() if x.startswith("FIRST ")), None)
                if line is None:
                    print(f"  {peer}: failed: {(out.stderr.strip().splitlines() or ['?'])[-1][:200]}")
                    continue
                times[peer].append(float(line.split()[1]))
                print(f"  round {r}: {peer} {times[peer][-1]:.1f} s", flush=True)
        finally:
            shutil.rmtree(cache.parent, ignore_errors=True)
    print(f"{a.model} ({a.exporter} export): the first generation of {a.new} tokens after a prompt of {a.prompt}, in a new process, "
          f"{a.threads} thread(s), {a.rounds} round(s); load average {os.getloadavg()[0]:.1f}")
    print(f"  {'':16} {'median s':>9} {'range s':>14}")
    for peer, ts in times.items():
        if ts:
            print(f"  {peer:16} {statistics.median(ts):9.1f} {min(ts):6.1f}-{max(ts):<7.1f}")


def child_first(a) -> None:
    """One peer's first generation, from the file (--first's child): prints FIRST <seconds>."""
    warnings.simplefilter("ignore")
    import decoder_exports as de

    path, layers, heads, sizes = export_path(a)
    past_names, _, _ = de.names(layers)
    kv, head = sizes.get("kv_heads", heads), (a.width or MODELS[a.model][2]) // heads
    ids = np.random.default_rng(0).integers(0, sizes["vocab"], (1, a.prompt)).astype(np.int64)
    peer = a.child_first
    if peer.startswith("eqfuse"):
        import eqfuse

        t = time.perf_counter()
        eqfuse.generate(str(path), ids, max_new_tokens=a.new)
    elif peer == "onnxruntime":
        import onnxruntime as ort

        t = time.perf_counter()
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = a.threads, 1
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        r = Growing(lambda f: sess.run(None, f), past_names, kv, head)
        greedy(r.prefill, r.step, ids, a.new)
    else:
        import openvino as ov

        t = time.perf_counter()
        core = ov.Core()
        cm = core.compile_model(core.read_model(str(path)), "CPU", {
            "INFERENCE_NUM_THREADS": a.threads, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"})
        req = cm.create_infer_request()

        def ov_run(feeds):
            res = req.infer(feeds)
            return [np.array(res[o]) for o in cm.outputs]
        r = Growing(ov_run, past_names, kv, head)
        greedy(r.prefill, r.step, ids, a.new)
    print(f"FIRST {time.perf_counter() - t:.3f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    ap.add_argument("--exporter", choices=["torchscript", "dynamo"], default="torchscript",
                    help="the torch exporter that makes the .onnx every ONNX peer runs")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--width", type=int)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--batch", type=int, action="append")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--capacity", type=int, help="eqfuse's cache capacity (default: the power of two that holds "
                    "the prompt and the new tokens); the decode step's time should not depend on it")
    ap.add_argument("--rounds", type=int, default=1, help="generations per peer, interleaved between the peers; "
                    "each position's time is its median over the rounds")
    ap.add_argument("--peers", default="eqfuse,eqfuse-bf16,ort,ov,ov-default,torch,compile",
                    help="also eqfuse-loaded: the f32 Module saved and loaded back (eqfuse.load), after eqfuse")
    ap.add_argument("--first", action="store_true", help="the first generation in a new process, cold and warm "
                    "(see above) instead")
    ap.add_argument("--child-first", help=argparse.SUPPRESS)
    a = ap.parse_args()
    os.environ["EQFUSE_NUM_THREADS"] = str(a.threads)
    if a.first:
        first_generation(a)
        return
    if a.child_first:
        child_first(a)
        return
    warnings.simplefilter("ignore")  # (transformers' deprecation notes on past_key_values)
    import torch
    import transformers

    transformers.logging.set_verbosity_error()

    torch.set_num_threads(a.threads)
    import decoder_exports as de

    import eqfuse
    from eqfuse.generation import Decoder, capacity_for, onnx_signature, step_maker

    kind, _, width, heads, sizes = MODELS[a.model]
    width = a.width or width
    positions = 1024 if kind == "gpt2" else 2048
    t = time.perf_counter()
    path, layers, heads, sizes = export_path(a)
    module = de.MODELS[kind][0](layers, width, heads, positions, **sizes)
    weights = sum(p.numel() for p in module.parameters())
    streamed = 4 * sum(  # (named_parameters lists GPT-2's tied wte / lm head once)
        p.numel() for n, p in module.named_parameters() if not any(g in n for g in GATHERED))
    vocab = sizes["vocab"]
    past_names, _, _ = de.names(layers)
    kv = sizes.get("kv_heads", heads)
    head = width // heads
    triad = triad_gbs(a.threads)
    load = os.getloadavg()
    print(f"{a.model}: {layers} layers x {width}, {weights / 1e6:.0f}M parameters, decode weight stream "
          f"{streamed / 1e6:.0f} MB f32; prompt {a.prompt}, {a.new} new tokens, {a.threads} thread(s); "
          f"triad {triad:.1f} GB/s; load average {load[0]:.1f} {load[1]:.1f}; export {time.perf_counter() - t:.0f} s")

    peers = a.peers.split(",")
    cap = a.capacity or capacity_for(a.prompt + a.new - 1)
    if cap < a.prompt + a.new - 1:
        ap.error(f"--capacity {cap} does not hold the prompt and the new tokens ({a.prompt + a.new - 1})")
    makers = {}
    mods = {}
    for peer, name, precision in (("eqfuse", "eqfuse", "f32"), ("eqfuse-bf16", "eqfuse bf16", "bf16")):
        if peer not in peers:
            continue
        t = time.perf_counter()
        mod = mods[name] = eqfuse.compile(path, threads=a.threads, precision=precision)
        sig = onnx_signature(path)
        live = step_maker(mod, sig)
        makers[name] = lambda mod=mod, live=live, sig=sig: Chunked(Decoder(sig, lambda f: mod(**f), cap, live), mod, sig)
        print(f"  {name} compile (the prefill and decode step compile at the first generation) "
              f"{time.perf_counter() - t:.0f} s")
    if "eqfuse-loaded" in peers and "eqfuse" in mods:
        # the f32 Module saved after its own generation at this batch (so the artifact holds its
        # prefill and decode step) and loaded back: eqfuse.load's Module, its weights mapped from
        # the file and its skinny panels copied into huge pages at the first call (docs/deploy.md)
        import atexit
        import shutil
        import tempfile

        where = Path(tempfile.mkdtemp(prefix="bench-generate-"))
        atexit.register(shutil.rmtree, where, True)

        def loaded_decoder(sig=onnx_signature(path)):
            saved = mods["eqfuse"].save(where / "decoder.eqf")
            t = time.perf_counter()
            lm = eqfuse.load(saved)
            print(f"  eqfuse.load of the saved decoder ({saved.stat().st_size / 1e6:.0f} MB): "
                  f"{1e3 * (time.perf_counter() - t):.1f} ms")
            return Chunked(Decoder(sig, lambda f: lm(**f), cap, step_maker(lm, sig)), lm, sig)
        makers["eqfuse loaded"] = loaded_decoder
    if "ort" in peers:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = a.threads, 1
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        makers["onnxruntime"] = lambda: Growing(lambda f: sess.run(None, f), past_names, kv, head)
    for name, hint in (("OpenVINO f32", "f32"), ("OpenVINO default", None)):
        if ("ov" if hint else "ov-default") not in peers:
            continue
        import openvino as ov

        core = ov.Core()
        cfg = {"INFERENCE_NUM_THREADS": a.threads, "PERFORMANCE_HINT": "LATENCY"}
        if hint:
            cfg["INFERENCE_PRECISION_HINT"] = hint
        cm = core.compile_model(core.read_model(str(path)), "CPU", cfg)
        name = f"{name} ({cm.get_property('INFERENCE_PRECISION_HINT').get_type_name()})" if not hint else name

        def ov_run(feeds, cm=cm, req=cm.create_infer_request()):
            res = req.infer(feeds)
            return [np.array(res[o]) for o in cm.outputs]  # (the request reuses its output buffers)
        makers[name] = lambda ov_run=ov_run: Growing(ov_run, past_names, kv, head)
    if "torch" in peers:
        makers["torch eager"] = lambda: Torch(module)
    if "compile" in peers:
        compiled = torch.compile(module, dynamic=True)
        makers["torch.compile"] = lambda: Torch(compiled)

    for batch in a.batch or [1]:
        ids = np.random.default_rng(0).integers(0, vocab, (batch, a.prompt)).astype(np.int64)
        print(f"batch {batch} (eqfuse's cache capacity {cap}; {a.rounds} round(s), each step's median over them):")
        print(f"  {'':24} {'prefill tok/s':>13} {'decode tok/s':>12} {'ms/tok 2-9':>11} {'ms/tok last 8':>13} "
              f"{'flat':>6} {'weights GB/s':>12} {'of triad':>8} {'warm-up s':>9}")
        ref, ready, runs = None, {}, {}
        for name, make in makers.items():  # each peer made and warmed up, then the timed rounds
            try:
                t = time.perf_counter()
                r = make()
                greedy(r.prefill, r.step, ids, 3)  # compiles (eqfuse: the prefill and the decode step)
                ready[name], runs[name] = (r, time.perf_counter() - t), []
            except Exception as e:  # a peer that cannot run this model: said, and the others go on
                print(f"  {name:24} failed: {type(e).__name__}: {str(e).splitlines()[0][:150]}")
        for _ in range(a.rounds):  # (interleaved: a change in the machine's load falls on every peer)
            for name, (r, _) in list(ready.items()):
                if a.threads > 1:
                    settle()  # each peer as its own process would run it (benchmarks/timing.py)
                try:
                    runs[name].append(greedy(r.prefill, r.step, ids, a.new))
                except Exception as e:
                    print(f"  {name:24} failed: {type(e).__name__}: {str(e).splitlines()[0][:150]}")
                    del ready[name], runs[name]
        for name, (r, warm) in ready.items():
            pre = statistics.median(x[0] for x in runs[name])
            toks = runs[name][0][2]
            # each decode step's median over the rounds, then the medians over the positions
            steps = [statistics.median(x[1][i] for x in runs[name]) for i in range(a.new - 1)]
            med = statistics.median(steps)
            first, last = statistics.median(steps[:8]), statistics.median(steps[-8:])
            gbs = streamed / (2 if name == "eqfuse bf16" else 1) / med / 1e9  # (its panels hold bf16)
            bw = f"{gbs:12.1f} {gbs / triad:8.0%}" if batch == 1 else f"{'':12} {'':8}"
            same = "" if ref is None else f"  ids {'=' if (toks == ref).all() else '!='} first peer's"
            ref = toks if ref is None else ref
            print(f"  {name:24} {batch * a.prompt / pre:13.0f} {batch / med:12.2f} {1e3 * first:11.2f} "
                  f"{1e3 * last:13.2f} {last / first - 1:+6.0%} {bw} {warm:9.0f}{same}", flush=True)
            if name in mods and batch == 1:
                profile_step(mods[name], r.dec, onnx_signature(path))
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


def profile_step(mod, dec, sig) -> None:
    """eqfuse's decode step per kernel (eqfuse.runtime.profile), at the live length the
    generation ended at."""
    from eqfuse.runtime.profile import profile, table

    b = dec.cache[0].shape[0]
    dims = {sig.shapes[sig.ids][0]: b, sig.shapes[sig.ids][1]: 1, sig.pasts[0][1][2]: dec.capacity,
            sig.shapes[sig.mask][1]: dec.capacity + 1}
    step = mod.default.live_module(dims, sig.pasts[0][1][2])
    feeds = {sig.ids: np.zeros((b, 1), np.int64), sig.mask: np.ones((b, dec.capacity + 1), np.int64),
             sig.positions: np.full((b, 1), dec.length, np.int64), "past_length": np.array([dec.length])}
    feeds.update({n: c for (n, _), c in zip(sig.pasts, dec.cache)})
    print("\n".join("    " + line for line in table(profile(step, repeat=10, **feeds), top=10).splitlines()))


if __name__ == "__main__":
    main()
