"""An egglog e-graph ends in the thread that made it (eqfuse.optimizer.egraph.own_thread).

pyo3 refuses to drop an egglog EGraph in another thread than its own ("EGraph is unsendable,
but is being dropped on another thread", printed as a traceback). A compile in a pool's worker
kept its e-graphs in the worker's thread-local state; when the process then forked (a
multiprocessing pool, a benchmark's reference run), the child cleared the live worker's state,
and so dropped them, in the forking thread. Run in a fresh process: the message goes to stderr."""

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
pool = ThreadPoolExecutor(max_workers=1)  # its worker outlives the compile, as a server's would
r = pool.submit(optimize_graph, g, dims={"B": 4}).result()
assert r.report["kernels_after"] == 2, r.report["kernels_after"]
r = optimize_graph(g, dims={"B": 4})  # and one in the main thread, which keeps its e-graphs

def child():
    gc.collect()

p = multiprocessing.get_context("fork").Process(target=child)
p.start()
p.join()
pool.shutdown()
gc.collect()
print("child exit", p.exitcode)
"""


def test_a_compile_in_a_worker_thread_then_a_fork_drops_no_egraph_in_another_thread():
    env = {**os.environ, "EQFUSE_NO_CACHE": "1", "PYTHONPATH": str(ROOT)}  # (the graph cache would skip the e-graphs)
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "examples" / "mlp.g")], capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "child exit 0" in p.stdout
    assert "unsendable" not in p.stderr and "Traceback" not in p.stderr, p.stderr
