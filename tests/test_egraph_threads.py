"""An egglog e-graph ends in the thread that made it (eqfuse.optimizer.egraph.own_thread).

pyo3 refuses to drop an egglog EGraph in another thread than its own ("EGraph is unsendable,
but is being dropped on another thread", printed as a traceback from os.fork()). A thread keeps
its e-graphs in its thread-local state; when the process forked, the child cleared every other
thread's state, and so dropped their e-graphs, in the forking thread: a compile in a pool's
worker then a fork from the main thread, or (benchmarks/bench_models.py --precision bf16) a
compile in the main thread then OpenVINO's compile_model, which forks from a worker thread of
its own. Run in a fresh process: the message goes to stderr."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import ROOT

SCRIPT = r"""
import gc, multiprocessing, sys
from concurrent.futures import ThreadPoolExecutor

from eqfuse.frontend.load import load
from eqfuse.optimizer.optimize import optimize_graph

(g,) = load(sys.argv[1])

def child():
    gc.collect()
    print("in the child", flush=True)

def fork():
    p = multiprocessing.get_context("fork").Process(target=child)
    p.start()
    p.join()

pool = ThreadPoolExecutor(max_workers=1)  # its worker outlives the compile, as a server's would
r = pool.submit(optimize_graph, g, dims={"B": 4}).result()
assert r.report["kernels_after"] == 2, r.report["kernels_after"]
fork()  # from the main thread, the worker alive
r = optimize_graph(g, dims={"B": 4})  # the main thread keeps its e-graphs for its next graph
pool.submit(fork).result()  # from the worker thread (as OpenVINO's compile_model does)
pool.shutdown()
gc.collect()
"""


def test_a_fork_from_any_thread_after_a_compile_in_any_thread_drops_no_egraph_in_another_thread():
    env = {**os.environ, "EQFUSE_NO_CACHE": "1", "PYTHONPATH": str(ROOT)}  # (the graph cache would skip the e-graphs)
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "examples" / "mlp.g")], capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("in the child") == 2
    assert "unsendable" not in p.stderr and "Traceback" not in p.stderr, p.stderr
