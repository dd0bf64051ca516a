"""Benchmarks: numpy op by op vs compiled unfused vs compiled fused (vs peers when installed).

Times are medians over repeats; every ratio compares runs made in the same process, one
after another, at the same thread count.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from eqfuse.ir.kernels import K
from eqfuse.runtime.load import SETTLE_PAUSE, settle

NOISY_IQR = 20  # percent: a row whose spread is wider gets a warning under the table


def spread(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(median seconds, interquartile range as % of the median) of fn() over `repeat` runs."""
    ts = sample_times(fn, repeat)
    if len(ts) < 2:
        return ts[0], 0.0
    q = statistics.quantiles(ts, n=4)
    med = statistics.median(ts)
    return med, 100 * (q[2] - q[0]) / med


def median_time(fn: Callable[[], object], repeat: int, warmup: int = 2, min_time: float = 0.0) -> float:
    """Median seconds of fn() over `repeat` runs (after warm-up)."""
    return statistics.median(sample_times(fn, repeat, warmup, min_time))


def sample_times(fn: Callable[[], object], repeat: int, warmup: int = 2, min_time: float = 0.0) -> list[float]:
    """Seconds of each of `repeat` runs of fn() (after warm-up; more while min_time has not passed,
    up to 10 x repeat)."""
    for _ in range(warmup):
        fn()
    times = []
    t_end = time.perf_counter() + min_time
    while len(times) < repeat or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 10 * repeat:
            break
    return times


_blas_setters: dict[str, object] = {}  # library path -> its set_num_threads (None: has none)


def blas_threads(n: int) -> bool:
    """Set the BLAS (OpenBLAS) thread count of this process; False if none can be found.

    Every OpenBLAS mapped in gets the count: numpy's and scipy's each bring their own (scipy
    is loaded by the optimizer), and setting only one of them leaves numpy's at all cores.
    """
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "openblas" in line.lower() and ".so" in line.split()[-1]}
    except OSError:
        libs = set()
    for path in sorted(libs - set(_blas_setters)):
        _blas_setters[path] = None
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sym in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                    "openblas_set_num_threads", "scipy_openblas_set_num_threads"):
            if hasattr(lib, sym):
                _blas_setters[path] = getattr(lib, sym)
                break
    setters = [s for s in _blas_setters.values() if s is not None]
    for setter in setters:
        setter(ctypes.c_int(n))
    return bool(setters)


def random_inputs(graph, dims: Mapping[str, int], seed: int = 0) -> list[np.ndarray]:
    from eqfuse.ir.shapes import resolve

    rng = np.random.default_rng(seed)
    out = []
    for _, t in graph.params:
        shape = tuple(resolve(d, dims) for d in t.shape)
        if t.dtype == "bool":
            out.append(rng.random(shape) < 0.5)
        elif t.dtype in ("i64", "i32", "u8", "i8"):  # 0 and 1: a valid index of any axis, a mask of both kinds
            out.append(rng.integers(0, 2, shape).astype({"i64": np.int64, "i32": np.int32, "u8": np.uint8, "i8": np.int8}[t.dtype]))
        else:
            out.append(rng.standard_normal(shape).astype(np.float32))
    return out


# numpy op by op is always measured: the ratios' baseline. OpenVINO (on .onnx models, in f32 and in
# its default precision) only when asked for: its first compile takes seconds
DEFAULT_PEERS = ("numpy", "torch", "torch.compile", "onnxruntime")
PEERS = DEFAULT_PEERS + ("openvino",)


def bench_model(src, dims: Mapping[str, int] | None = None, graph: str | None = None, repeat: int = 20,
                threads: Sequence[int] = (1, 2), peers: Sequence[str] = DEFAULT_PEERS, profile: bool = False, **opts) -> str:
    """The table `eqfuse bench` prints; `opts` (cost=, rules=, disable=, check_rules=) go to the
    fused compile. `profile` adds each fused kernel's time at the first thread count
    (eqfuse.runtime.profile)."""
    from eqfuse import compile as eq_compile
    from eqfuse import progress
    from eqfuse.frontend.load import is_onnx, load
    from eqfuse.ir.reference import evaluate

    graphs = load(src, dims if is_onnx(src) else None)  # (an ONNX model's dims bound at import)
    onnx_dims = dict(dims or {}) if is_onnx(src) else None
    g = graphs[0] if graph is None else next(x for x in graphs if x.name == graph)
    dims = dict(dims or {})
    missing = [d for d in g.dims() if d not in dims]
    for d in missing:
        dims[d] = 64
    from eqfuse.frontend.load import model_weights

    weights = model_weights(src, onnx_dims)  # an .onnx model's initializers: bound, as compile binds them
    arrays = [weights.get(n, a) for (n, _), a in zip(g.params, random_inputs(g, dims))]
    runtime = [a for (n, _), a in zip(g.params, arrays) if n not in weights]
    fused = eq_compile(src, dims=dims, **{"check_rules": False, **opts})
    unfused = eq_compile(src, dims=dims, fuse=False)
    f_fn, u_fn = getattr(fused, g.name), getattr(unfused, g.name)
    f_fn(*runtime)
    u_fn(*runtime)
    nk_f = len([k for k in f_fn.last.kernels if k.kind != K.VIEW])
    prec = f", {opts['precision']}" if opts.get("precision", "f32") != "f32" else ""  # (the unfused graph: f32)
    nk_u = len([k for k in u_fn.last.kernels if k.kind != K.VIEW])
    rows: list[tuple[str, list[tuple[float, float]]]] = [("numpy op by op", []), (f"eqfuse unfused ({nk_u} kernels)", []),
                                          (f"eqfuse fused ({nk_f} kernels{prec})", [])]
    # eqfuse first, for every thread count, with numpy's BLAS threads parked (their spin-wait
    # would take a core); then numpy; torch last: once its OpenMP threads have run they keep
    # spinning between calls and halved eqfuse's 2-thread speed when measured after them.
    blas_threads(1)
    time.sleep(0.2)

    def measured(row: str, t: int, fn) -> tuple[float, float]:  # one cell of the table, under a progress line
        with progress.step(f"bench {g.name}: {row}, threads={t}, {repeat} calls"):
            if t > 1:  # (the row before's threads may spin on: OpenVINO's 2-thread calls right after
                # numpy's and onnxruntime's ran at their 1-thread time)
                time.sleep(SETTLE_PAUSE)
                settle()
            return spread(fn, repeat)

    for t in threads:
        f_fn.threads = u_fn.threads = t
        rows[1][1].append(measured("eqfuse unfused", t, lambda: u_fn(*runtime)))
        rows[2][1].append(measured("eqfuse fused", t, lambda: f_fn(*runtime)))
    for t in threads:
        blas_threads(t)
        rows[0][1].append(measured("numpy op by op", t, lambda: evaluate(g, arrays)))
    rt_names = [n for n, _ in g.params if n not in weights]
    feeds = dict(zip(rt_names, runtime))
    chosen, peers = peers, (_peers(g, arrays, peers) + _ort_peer(src, feeds, peers, onnx_dims)
                            + _openvino_peers(src, feeds, peers, onnx_dims))
    for name, fn in peers:
        rows.append((name, [measured(name, t, lambda: fn(t)) if fn else (float("nan"), float("nan")) for t in threads]))
    blas_threads(max(threads))
    head = f"{g.name} ({', '.join(f'{k}={v}' for k, v in dims.items()) or 'static shapes'}), median of {repeat}"
    lines = [head, f"{'':34}" + "".join(f"{'threads=' + str(t):>30}" for t in threads)]
    noisy = []
    for name, ts in rows:
        cells = "".join(f"{m * 1e3:>12.3f} ms {iqr:>4.0f}% {rows[0][1][k][0] / m:>6.2f}x  " for k, (m, iqr) in enumerate(ts))
        lines.append(f"{name:<34}{cells}")
        noisy += [f"{name}, threads={t}: {iqr:.0f}%" for t, (m, iqr) in zip(threads, ts) if iqr > NOISY_IQR]
    lines.append("ms = median; % = interquartile range / median (the spread); ratio = numpy time / this time "
                 "(higher is faster), measured in this run")
    if noisy:
        lines.append(f"warning: spread over {NOISY_IQR}% (the machine was busy? more --repeat): " + "; ".join(noisy))
    lines.append(peer_note(src, chosen, peers))
    if profile:
        from eqfuse.runtime.profile import profile as kernel_times
        from eqfuse.runtime.profile import table

        f_fn.threads = threads[0]
        lines += ["", f"the fused graph's kernels, threads={threads[0]}, mean of {repeat} calls:",
                  table(kernel_times(f_fn, *runtime, repeat=repeat))]
    return "\n".join(lines)


def _peers(g, arrays, chosen: Sequence[str] = DEFAULT_PEERS) -> list[tuple[str, Callable | None]]:
    """The chosen peer runtimes on the same graph and inputs (torch eager, torch.compile) when torch
    is installed; torch.compile compiles here, under a progress line."""
    if "torch" not in chosen and "torch.compile" not in chosen:
        return []
    from eqfuse import progress
    from eqfuse.cli.peers import torch_peers

    compiled = "torch.compile" in chosen
    with progress.step("compiling the graph with torch.compile" if compiled else "preparing torch"):
        peers = torch_peers(g, arrays, compiled=compiled)
    return [p for p in peers if "torch" in chosen or p[0] != "torch eager"]


def _feeds(src, runtime: dict[str, np.ndarray], dims) -> dict[str, np.ndarray]:
    """The runtime inputs under the .onnx model's own input names."""
    from eqfuse.frontend.load import input_aliases

    aliases = input_aliases(src, dims)
    return {aliases.get(n, n): a for n, a in runtime.items()}


def _openvino_peers(src, runtime: dict[str, np.ndarray], chosen: Sequence[str], dims=None) -> list[tuple[str, Callable]]:
    """OpenVINO on the .onnx model itself, in f32 (INFERENCE_PRECISION_HINT f32) and in its default
    precision (bf16 on a CPU with AVX512_BF16 or AMX; the row's name says which), each compiled per
    thread count (INFERENCE_NUM_THREADS, the LATENCY hint)."""
    from eqfuse.frontend.load import is_onnx

    if "openvino" not in chosen or not is_onnx(src) or not _has("openvino"):
        return []
    import openvino as ov

    feeds = _feeds(src, runtime, dims)
    core = ov.Core()

    models: dict[tuple[int, str | None], Any] = {}

    def compiled(t: int, hint: str | None):  # (once per thread count and hint: the probe below is reused)
        if (t, hint) not in models:
            cfg = {"INFERENCE_NUM_THREADS": t, "PERFORMANCE_HINT": "LATENCY",
                   **({"INFERENCE_PRECISION_HINT": hint} if hint else {})}
            models[t, hint] = core.compile_model(str(src), "CPU", cfg)
        return models[t, hint]

    default = str(compiled(1, None).get_property("INFERENCE_PRECISION_HINT")).lower()
    rows = []
    for name, hint in (("OpenVINO f32", "f32"), (f"OpenVINO default ({'bf16' if 'bf' in default else default})", None)):
        requests: dict[int, Any] = {}

        def run(t: int, hint=hint, requests=requests):
            if t not in requests:
                requests[t] = compiled(t, hint).create_infer_request()
                requests[t].infer(feeds)
            return requests[t].infer(feeds)
        rows.append((name, run))
    return rows


def _ort_peer(src, runtime: dict[str, np.ndarray], chosen: Sequence[str], dims=None) -> list[tuple[str, Callable]]:
    """onnxruntime on the .onnx model itself (all graph optimizations, intra-op threads = the row's)."""
    from eqfuse.frontend.load import is_onnx

    if "onnxruntime" not in chosen or not is_onnx(src) or not _has("onnxruntime"):
        return []
    import onnxruntime as ort

    feeds = _feeds(src, runtime, dims)
    sessions: dict[int, Any] = {}

    def run(t: int):
        if t not in sessions:
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            so.intra_op_num_threads, so.inter_op_num_threads = t, 1
            sessions[t] = ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
            sessions[t].run(None, feeds)
        return sessions[t].run(None, feeds)
    return [("onnxruntime (ORT_ENABLE_ALL)", run)]


def _runtime_note(src, chosen, pkg: str = "onnxruntime") -> str:
    """What the row of an ONNX runtime (onnxruntime, openvino) measures, or why there is none."""
    from eqfuse.frontend.load import is_onnx

    if not _has(pkg):
        return "not installed"
    if pkg not in chosen:
        return "not chosen (--peers)"
    return "measured on the .onnx model" if is_onnx(src) else "runs .onnx models only (this is a .g model)"


def _has(pkg: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(pkg) is not None


def peer_note(src, chosen: Sequence[str], rows: Sequence[tuple[str, Callable | None]]) -> str:
    """The table's last line: what each chosen peer's rows measure, or why it has none."""
    if not set(chosen) - {"numpy"}:
        return "peers: numpy only (--peers)"
    parts = []
    if {"torch", "torch.compile"} & set(chosen):
        parts.append("torch rows: the same graph op by op in torch (eager) and through torch.compile"
                     if any(n.startswith("torch") for n, _ in rows) else
                     "torch eager / torch.compile: " + ("unavailable" if _has("torch") else "not installed"))
    for pkg, name in (("onnxruntime", "onnxruntime"), ("openvino", "OpenVINO")):
        if pkg in chosen:
            parts.append(f"{name}: " + _runtime_note(src, chosen, pkg))
    return "; ".join(parts)
