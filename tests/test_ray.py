"""examples/ray_batch_inference.py on a Ray head started by its address (localhost, 2 CPUs): every
output matches the numpy reference. Skipped only when ray is not installed (`pip install '.[ray]'`)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import numpy as np
import pytest
from helpers import ROOT

import eqfuse

EXAMPLE = ROOT / "examples" / "ray_batch_inference.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head():
    """The address of a Ray head on localhost with 2 CPUs, started for this test. It is stopped by
    its process group, not with `ray stop`, which stops every Ray process of the machine (other
    users' too)."""
    # (here, not at the module's top: importing ray.data would cost every collection of the suite)
    pytest.importorskip("ray.data")
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # (short: Ray's socket paths have a length limit)
    port = free_port()
    cmd = ["ray", "start", "--head", "--num-cpus", "2", "--port", str(port),
           "--dashboard-agent-listen-port", str(free_port()),
           "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", temp]
    head = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            # (no token authentication: a head of this test only, on this machine)
                            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"})
    try:
        out, _ = head.communicate(timeout=120)  # `ray start` returns once the head runs
        assert head.returncode == 0, out
        yield f"127.0.0.1:{port}"
    finally:
        # every process of the head (its daemons and workers) is in the group `ray start` led
        try:
            os.killpg(head.pid, signal.SIGTERM)
            for _ in range(15):
                time.sleep(0.2)
                os.killpg(head.pid, 0)
            os.killpg(head.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.extended  # (a Ray head starts: .ci/run's Ray step and the extended tier, the suite's time)
def test_batch_inference_on_a_ray_cluster_matches_numpy(ray_head):
    spec = importlib.util.spec_from_file_location("ray_batch_inference", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rows = 2000
    ids, ys, x, w, _ = example.batch_inference(address=ray_head, rows=rows, workers=2, batch=128)
    assert sorted(ids.tolist()) == list(range(rows))  # every input once
    ref = eqfuse.reference(example.MODEL)(x[ids], **w)
    np.testing.assert_allclose(ys, ref, rtol=1e-4, atol=1e-4)
