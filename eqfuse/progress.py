"""Progress lines for long work (saturation, C compilation, benchmarks), on a terminal only."""

from __future__ import annotations

import contextlib
import os
import sys
import time


def enabled() -> bool:
    return sys.stderr.isatty() and not os.environ.get("EQFUSE_QUIET")


@contextlib.contextmanager
def step(what: str):
    """`with step("compiling 3 kernels"):` shows `what ...` then `what: done in 1.2 s`."""
    if not enabled():
        yield
        return
    t0 = time.perf_counter()
    sys.stderr.write(f"\r\x1b[2K{what} ...")
    sys.stderr.flush()
    try:
        yield
    finally:
        sys.stderr.write(f"\r\x1b[2K{what}: {time.perf_counter() - t0:.2f} s\n")
        sys.stderr.flush()
