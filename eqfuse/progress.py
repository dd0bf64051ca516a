"""Progress lines for long work (saturation, C compilation, benchmarks), on a terminal only."""

from __future__ import annotations

import contextlib
import os
import sys
import time


def enabled() -> bool:
    return sys.stderr.isatty() and not os.environ.get("EQFUSE_QUIET")


class Line:
    """One progress line; `update(detail)` rewrites it as `what: detail, 1.2 s`."""

    def __init__(self, what: str, shown: bool):
        self.what, self.shown, self.t0 = what, shown, time.perf_counter()

    def update(self, detail: str) -> None:
        if self.shown:
            sys.stderr.write(f"\r\x1b[2K{self.what}: {detail}, {time.perf_counter() - self.t0:.1f} s")
            sys.stderr.flush()


@contextlib.contextmanager
def step(what: str):
    """`with step("compiling 3 kernels") as line:` shows `what ...`, `line.update(...)` details
    it while it runs, and the end shows `what: done in 1.2 s`."""
    line = Line(what, enabled())
    if not line.shown:
        yield line
        return
    sys.stderr.write(f"\r\x1b[2K{what} ...")
    sys.stderr.flush()
    try:
        yield line
    finally:
        sys.stderr.write(f"\r\x1b[2K{what}: {time.perf_counter() - line.t0:.2f} s\n")
        sys.stderr.flush()


def seconds(s: float) -> str:
    """A duration in the unit a reader expects: 412.3 us, 9.4 ms, 1.95 s."""
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"
