"""Kernels built with EQFUSE_SANITIZE=address,undefined run clean on odd shapes, on 1 and 2 threads.

An ASan library loads only into a process that started with the ASan runtime, so each check
runs in a child Python with LD_PRELOAD of the compiler's libasan. Sanitizer findings abort the
child (-fno-sanitize-recover=all). A small set of kernel kinds runs every time; every case of
tests/test_kernels_c.py runs under the sanitizers with `-m extended`.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eqfuse.backend.cbuild import compiler

ROOT = Path(__file__).resolve().parent.parent

# Odd sizes everywhere: vector remainders, partial tiles, partial GEMM panels.
PARAMS = {"x": (7, 37), "r": (37,), "g": (37,), "bt": (37,), "x3": (3, 11, 5), "a": (13, 29), "b": (29, 19),
          "c": (19,), "q": (1, 13, 16), "k": (1, 21, 16), "v": (1, 21, 8), "img": (1, 3, 7, 9), "w": (5, 3, 3, 3),
          "dy": (1, 13, 8), "q64": (2, 64, 16), "k64": (2, 64, 16), "v64": (2, 64, 32), "dy64": (2, 64, 32)}
CASES = [
    ("pointwise", "sigmoid(x * 2 + r) - x"),
    ("softmax", "softmax(x * 0.5 + r)"),
    ("layernorm", "layernorm(x + r, g, bt)"),
    ("row-max", "max(x, axis=-1)"),
    ("reduce", "sum(x3, axis=[0, 2], keepdims=true)"),
    ("gemm-epilogue", "relu(a @ b + c)"),
    ("attention", "softmax(q @ transpose(k, perm=[0, 2, 1]) * 0.25) @ v"),
    ("conv2d", "conv2d(img, w, padding=1)"),
    ("softmax-grad", "softmax_grad(x * 2 + r, x)"),
    ("layernorm-grad", "layernorm_grad(x * 2 - r, x, g)"),
    ("attention-dq", "attention_dq(q, k, v, dy, scale=0.25)"),
    ("attention-dk", "attention_dk(q, k, v, dy, scale=0.25)"),
    ("attention-dv", "attention_dv(q, k, dy, scale=0.25)"),
    ("attention-dk-blocks", "attention_dk(q64, k64, v64, dy64, scale=0.25)"),  # 4-row blocks, micro-kernels
]

SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, "tests")
    from eqfuse import machine
    machine.pin("zen4")
    import test_kernels_c as t
    from test_sanitize import CASES, PARAMS
    for threads in (1, 2):
        res, mod = t.run_cases("sanitized", PARAMS, CASES, threads=threads)
        for cid in res:
            t.check(res, cid)
    # the sanitized kernels pulled in the UBSan runtime (LD_PRELOAD brings only ASan's)
    assert "libubsan" in open("/proc/self/maps").read()
    print("ok", " ".join(sorted({k.kind for k in mod.kernels})))
""")


def sanitized_env(tmp_path) -> dict[str, str]:
    libasan = subprocess.run(compiler().split() + ["-print-file-name=libasan.so"], capture_output=True,
                             text=True).stdout.strip()
    assert os.path.isabs(libasan), f"no libasan for {compiler()}: {libasan!r}"
    return {**os.environ, "EQFUSE_SANITIZE": "address,undefined", "EQFUSE_CACHE_DIR": str(tmp_path),
            "LD_PRELOAD": libasan, "ASAN_OPTIONS": "detect_leaks=0", "EQFUSE_WERROR": "1"}


@pytest.mark.extended  # (with the pass over every kernel case below: CI's extended step; the 8-minute budget)
def test_kernel_kinds_under_sanitizers(tmp_path):
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=sanitized_env(tmp_path),
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split()[:1] == ["ok"]
    assert {"pointwise", "row", "reduce", "contraction", "attention", "attention_grad"} <= set(p.stdout.split()[1:]), p.stdout


@pytest.mark.extended
def test_every_kernel_case_under_sanitizers(tmp_path):
    p = subprocess.run([sys.executable, "-m", "pytest", "tests/test_kernels_c.py", "-q", "-x", "-p", "no:cacheprovider"],
                       cwd=ROOT, env=sanitized_env(tmp_path), capture_output=True, text=True, timeout=3600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
