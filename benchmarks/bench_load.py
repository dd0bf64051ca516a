"""Calls under load: `python benchmarks/bench_load.py [--kind processes|peers|cpu|all] [--whole-process] [--repeat 200] [--rounds 3] [--no-spin]`.

The MLP 784-1024-1024-10 at batch 8 (one ONNX model, random weights) run by eqfuse and by
onnxruntime (ORT_ENABLE_ALL, the same thread count), interleaved in one process, on 1 and 2
threads, on a quiet machine and with another process spinning on a core alongside. Quiet and
busy alternate --rounds times (a shared VM drifts from minute to minute), the samples pooled per
row. Median ms, the spread (IQR as % of the median), and the busy rows' ratio to the quiet ones.
With --no-spin onnxruntime's threads sleep after a run (session.intra_op.allow_spinning=0); by
default they spin, and hold a core during eqfuse's next call: a load of their own beside the
busy process.

The third load kind, in-process peers (`--kind peers`, or `all`): another runtime in the same
process, as an application that runs onnxruntime, OpenVINO or torch beside eqfuse (a
torch.compile graph with breaks always does). On GPT-2 tiny (2 layers of 64, 2 x 16 tokens),
ResNet-18's stem and first two stages on one 224x224 image, and the MLP at batch 8
(tests/model_exports.py), eqfuse's 2-thread call alternates with a call of the peer on the same
inputs (the peer at 2 threads and f32, its own settings otherwise: onnxruntime's threads spin after a
run, OpenVINO's and torch's as they do by default), against eqfuse's 2-thread call alone and its
1-thread call alone; eqfuse's 1-thread call alternates with each peer too (the rows "1 thread
with ..."). The kinds alternate within each of --rounds rounds; the table gives eqfuse's median,
spread, its ratio to the same thread count alone (for a 1-thread row beside a peer: what the
peer's use of caches and memory costs a call that has its core), to the 1-thread call alone, and
(`/1t-beside`) a 2-thread row's ratio to the 1-thread call beside the same peer; and the peer's
median. The targets: interleaved at most 1.3x alone, and never above the 1-thread call, read as
"never above the 1-thread call under the same load": 2 threads beside a peer never slower than
1 thread beside it (`/1t-beside` at most 1). A row alone starts once no other thread of the process
is running (`settle`: the peers' threads spin on after the previous row). `--whole-process` adds rows
with the rule before in-process peers counted (every thread of the process the call's own), in
the same rounds. The `pool%` column: the share of the row's calls whose conv and pooling loops
ran on the claim-based pool at 2 threads (another runtime's threads seen running), not as
OpenMP's split or on the calling thread alone.

`--kind cpu`: each model's 2-thread call alone with two threads forced whatever the load, and its
1-thread call, with the CPU time per call of the calling thread and of the process's other
threads (from /proc/self/task): a parallel loop that waits for a thread with no core spins the
waiting one, which the CPU time shows where the wall time mostly shows the machine's load.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import model_exports as me  # noqa: E402

import eqfuse  # noqa: E402
from eqfuse.runtime import load, program  # noqa: E402
from eqfuse.runtime.load import OPENMP, call_threads, threads_now  # noqa: E402
from timing import settle  # noqa: E402


def mlp_onnx(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    dims = [784, 1024, 1024, 10]
    inits, nodes, x = [], [], "x"
    for i in range(3):
        w = (rng.standard_normal((dims[i], dims[i + 1])) / np.sqrt(dims[i])).astype(np.float32)
        b = (0.1 * rng.standard_normal(dims[i + 1])).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        x = f"a{i}"
        if i < 2:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"]))
            x = f"r{i}"
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 784])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [8, 10])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def stats(ts: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(ts, n=4)
    med = statistics.median(ts)
    return med * 1e3, 100 * (q[2] - q[0]) / med


def session(ort, path: Path, threads: int, no_spin: bool):
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if no_spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


PEER_MODELS = {"gpt2": "GPT-2 tiny", "resnet_stages": "ResNet-18 stages", "mlp": "MLP batch 8"}
PEERS = ("onnxruntime", "openvino", "torch")


def peer_calls(name: str, feeds: dict, peers, threads: int = 2) -> dict:
    """A call of each peer runtime on the model's ONNX export (onnxruntime, OpenVINO) or on the
    torch module it came from, at `threads` threads, its settings otherwise its own defaults."""
    calls = {}
    path = me.export(name, "torchscript")
    if "onnxruntime" in peers:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        calls["onnxruntime"] = lambda: sess.run(None, feeds)[0]
    if "openvino" in peers:
        import openvino as ov

        # f32, as the others (on a CPU with AVX512_BF16 OpenVINO's default is bf16 inference)
        compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                              "INFERENCE_PRECISION_HINT": "f32"})
        request = compiled.create_infer_request()
        calls["openvino"] = lambda: next(iter(request.infer(feeds).values()))
    if "torch" in peers:
        import torch

        torch.set_num_threads(threads)
        model, names = me.torch_model(name)
        args = [torch.from_numpy(feeds[n]) for n in names]

        def run():
            with torch.no_grad():
                out = model(*args)
            return getattr(out, "last_hidden_state", out).numpy()
        calls["torch"] = run
    return calls


WHOLE = " (whole process own)"
ONE = "1 thread "  # the prefix of a row of eqfuse's 1-thread call ("1 thread with onnxruntime")


def peer_of(kind: str) -> str | None:
    """The peer runtime a row's calls alternate with ("with torch", "1 thread with torch", "with
    torch (whole process own)": torch), None for a row alone."""
    k = kind.removeprefix(ONE)
    return k[5:].removesuffix(WHOLE) if k.startswith("with ") else None


def whole_process(requested, *own):
    """The rule before in-process peers counted: every thread of the process is the call's own,
    and the loops run as OpenMP's split."""
    return threads_now(requested), OPENMP


def on_pool(mod) -> int:
    """1 when the module's last call ran its eqf_region loops on the claim-based pool."""
    f = next(iter(mod.functions.values()))
    t = f.last.runner.last_threads() if f.last is not None else None
    return int(t is not None and t["regions"] == "pool")


def peers_main(args) -> None:
    """The in-process peers table (the module docstring)."""
    if "torch" in args.peers:
        import torch  # noqa: F401  (loaded first, as in a torch application: its libgomp is the process's)
    print(f"load average (1 min) at the start: {os.getloadavg()[0]:.2f}")
    print(f"{'model':<17} {'eqfuse call':<34} {'ms':>7} {'iqr%':>5} {'/alone':>7} {'/1-thread':>9} "
          f"{'/1t-beside':>10} {'pool%':>6} {'peer ms':>8}")
    for name in args.models:
        feeds = me.inputs(name)
        path = me.export(name, "torchscript")
        two, one = eqfuse.compile(str(path), threads=2), eqfuse.compile(str(path), threads=1)
        gc.collect()  # the optimizer's e-graphs, before a peer forks a helper (egglog's are unsendable)
        calls = peer_calls(name, feeds, args.peers)
        ref = two(**feeds)
        for who, call in calls.items():
            np.testing.assert_allclose(call(), ref, rtol=2e-3, atol=2e-3, err_msg=who)
        np.testing.assert_allclose(one(**feeds), ref, rtol=1e-4, atol=1e-4)
        kinds = peer_kinds(list(calls), args.whole_process)
        times = {k: [] for k in kinds}
        peer_times = {k: [] for k in kinds}
        pooled = {k: 0 for k in kinds}
        for _ in range(args.rounds):
            for k in kinds:
                mod = one if k.startswith("1 thread") else two
                peer = calls.get(peer_of(k))
                program.call_threads = whole_process if k.endswith(WHOLE) else call_threads
                if peer is None:
                    settle()
                load._last[0] = 0.0  # the next call reads /proc again
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    mod(**feeds)
                    t1 = time.perf_counter()
                    times[k].append(t1 - t0)
                    pooled[k] += on_pool(mod)
                    if peer is not None:
                        peer()
                        peer_times[k].append(time.perf_counter() - t1)
                program.call_threads = call_threads
        print("\n".join(peer_rows(name, kinds, times, peer_times, pooled)))
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}; {args.rounds} rounds, {args.repeat} calls "
          f"per row and round; each peer at 2 threads, its other settings its own.\n{PEER_LEGEND}")


PEER_LEGEND = ("/alone: to the same thread count's call alone; /1-thread: to the 1-thread call alone; /1t-beside:\n"
               "a 2-thread row to the 1-thread call beside the same peer. Targets: /alone at most 1.3, and\n"
               "/1t-beside at most 1 (2 threads beside a peer never worse than 1 beside it).")


def peer_kinds(peers: list[str], whole: bool = False) -> list[str]:
    """The rows of a model in the peers table, in the order they run in each round: eqfuse's
    2-thread and 1-thread calls alone, its 2-thread call beside each peer, its 1-thread call
    beside each peer, and with `whole` (--whole-process) the former rule's rows."""
    kinds = ["alone", "1 thread"] + [f"with {p}" for p in peers] + [f"{ONE}with {p}" for p in peers]
    return kinds + ([f"with {p}{WHOLE}" for p in peers] if whole else [])


def peer_rows(name: str, kinds: list[str], times: dict, peer_times: dict, pooled: dict) -> list[str]:
    """The table's lines of one model from its samples (seconds per call, per row)."""
    med = {k: stats(times[k])[0] for k in kinds}
    rows = []
    for k in kinds:
        iqr = stats(times[k])[1]
        peer = f"{stats(peer_times[k])[0]:>8.3f}" if peer_of(k) else ""
        share = 100 * pooled[k] / len(times[k])
        # (each row against its own thread count alone; a 2-thread row beside a peer also
        # against the 1-thread call beside the same peer: the target's reading)
        alone = med["1 thread" if k.startswith(ONE) else "alone"]
        beside = f"{med[k] / med[ONE + 'with ' + peer_of(k)]:>10.2f}" if k.startswith("with ") else f"{'':>10}"
        rows.append(f"{PEER_MODELS.get(name, name):<17} {k:<34} {med[k]:>7.3f} {iqr:>5.0f} {med[k] / alone:>7.2f} "
                    f"{med[k] / med['1 thread']:>9.2f} {beside} {share:>6.0f} {peer}")
    return rows


def task_ticks() -> dict[int, int]:
    """CPU time (clock ticks, user + system) of each thread of this process so far."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = int(fields[11]) + int(fields[12])
    return out


def cpu_main(args) -> None:
    """The CPU kind: each model's 2-thread call with two threads whatever the load (the rule of
    eqfuse/runtime/load.py bypassed), alone, against its 1-thread call. On a loaded machine a
    parallel region that waits at a barrier for a thread with no core spins the waiting thread:
    the CPU time per call of the calling thread and of the process's other threads shows it,
    where wall times mostly show the load."""
    load.free_cores = load.free_cores_beside_peers = lambda now=None, mine=None: 2
    hz = os.sysconf("SC_CLK_TCK")
    me_ = __import__("threading").get_native_id()
    print(f"load average (1 min) at the start: {os.getloadavg()[0]:.2f}")
    print(f"{'model':<17} {'threads':>7} {'wall ms':>8} {'iqr%':>5} {'caller CPU ms':>14} {'others CPU ms':>14}")
    for name in args.models:
        feeds = me.inputs(name)
        path = me.export(name, "torchscript")
        mods = {t: eqfuse.compile(str(path), threads=t) for t in (2, 1)}
        times = {t: [] for t in mods}
        ticks = {t: [0, 0] for t in mods}
        for _ in range(args.rounds):
            for t, mod in mods.items():
                mod(**feeds)
                a = task_ticks()
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    mod(**feeds)
                    times[t].append(time.perf_counter() - t0)
                b = task_ticks()
                ticks[t][0] += b.get(me_, 0) - a.get(me_, 0)
                ticks[t][1] += sum(v - a.get(k, 0) for k, v in b.items() if k != me_)
        for t in mods:
            med, iqr = stats(times[t])
            n = args.rounds * args.repeat
            print(f"{PEER_MODELS.get(name, name):<17} {t:>7} {med:>8.3f} {iqr:>5.0f} "
                  f"{1e3 * ticks[t][0] / hz / n:>14.3f} {1e3 * ticks[t][1] / hz / n:>14.3f}")
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}; {args.rounds} rounds, {args.repeat} calls "
          f"per row and round; CPU time from /proc/self/task (clock ticks of {1e3 / hz:.0f} ms), per call.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=["processes", "peers", "cpu", "all"], default="all",
                    help="processes: quiet and a busy process (the MLP); peers: other runtimes in this process; "
                         "cpu: CPU time per call with two threads forced (not part of all)")
    ap.add_argument("--repeat", type=int, default=200, help="interleaved pairs of calls per row and round")
    ap.add_argument("--rounds", type=int, default=3,
                    help="the load kinds alternate this many times (a shared VM drifts; every row sees each phase)")
    ap.add_argument("--no-spin", action="store_true", help="onnxruntime's threads sleep after a run")
    ap.add_argument("--models", nargs="+", default=list(PEER_MODELS), help="the peers kind's models")
    ap.add_argument("--peers", nargs="+", default=list(PEERS), choices=PEERS, help="the peers kind's runtimes")
    ap.add_argument("--whole-process", action="store_true",
                    help="peers: also rows with the former rule (every thread of the process the call's own)")
    args = ap.parse_args()
    if args.kind == "cpu":
        cpu_main(args)
    if args.kind in ("peers", "all"):
        peers_main(args)
    if args.kind in ("processes", "all"):
        processes_main(args)


def processes_main(args) -> None:
    """The quiet and busy table (the module docstring)."""
    import onnxruntime as ort

    path = Path(tempfile.mkdtemp()) / "mlp.onnx"
    mlp_onnx(path)
    x = np.random.default_rng(1).standard_normal((8, 784)).astype(np.float32)
    runs = {t: (eqfuse.compile(str(path), threads=t), session(ort, path, t, args.no_spin)) for t in (1, 2)}
    for mod, sess in runs.values():
        np.testing.assert_allclose(mod(x), sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
    times = {(busy, t, who): [] for busy in (False, True) for t in (1, 2) for who in ("eqfuse", "ort")}
    for _ in range(args.rounds):
        for busy in (False, True):
            proc = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
            try:
                time.sleep(0.5 if busy else 0.1)
                for threads, (mod, sess) in runs.items():
                    te, to = times[busy, threads, "eqfuse"], times[busy, threads, "ort"]
                    for _ in range(args.repeat):  # interleaved
                        t0 = time.perf_counter()
                        mod(x)
                        t1 = time.perf_counter()
                        sess.run(None, {"x": x})
                        t2 = time.perf_counter()
                        te.append(t1 - t0)
                        to.append(t2 - t1)
            finally:
                if proc is not None:
                    proc.kill()
                    proc.wait()
    print("load       thr  eqfuse ms  iqr%   ORT ms  iqr%  ORT/eqfuse  busy/quiet: eqfuse  ORT")
    for (busy, threads, who), ts in times.items():
        if who != "eqfuse":
            continue
        (me, ie), (mo, io) = stats(ts), stats(times[busy, threads, "ort"])
        line = f"{'busy' if busy else 'quiet':<10} {threads:>3} {me:>10.3f} {ie:>5.0f} {mo:>8.3f} {io:>5.0f} {mo / me:>11.2f}"
        if busy:
            qe, qo = stats(times[False, threads, "eqfuse"])[0], stats(times[False, threads, "ort"])[0]
            line += f" {me / qe:>19.2f} {mo / qo:>4.2f}"
        print(line)
    print(f"{args.rounds} rounds of quiet then busy, {args.repeat} interleaved pairs of calls per row and round; "
          "busy: one other process spinning on a core alongside (python -c 'while True: pass')"
          + ("; onnxruntime's threads do not spin (--no-spin)" if args.no_spin else "") + ".")


if __name__ == "__main__":
    main()
