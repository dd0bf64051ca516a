"""Progress lines for long work (the optimizer, building the C, each benchmark row, exports), on
stderr and only when it is a terminal (EQFUSE_QUIET=1 silences them): stdout stays the command's
output, whatever it is piped to.

Kept here rather than taken from tqdm or rich: a step is one line of text that is rewritten while
it runs and ends with its time, which needs no total for a bar; this module is a base of the
package (every stage may report a step) and imports nothing, where rich costs a tenth of a second
to import and neither is a dependency of eqfuse.
"""

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


_open: list[Line] = []  # the steps running now, outermost first (a step may run inside another)


@contextlib.contextmanager
def step(what: str):
    """`with step("compiling 3 kernels") as line:` shows `what ...`, `line.update(...)` details
    it while it runs, and the end shows `what: 1.2 s` on a line of its own. A step inside another
    leaves the outer one's line as it was and ends on its own line; the outer one ends after it."""
    line = Line(what, enabled())
    if not line.shown:
        yield line
        return
    if _open:  # the outer step's line stays as it is: the inner one starts below it
        sys.stderr.write("\n")
    sys.stderr.write(f"\r\x1b[2K{what} ...")
    sys.stderr.flush()
    _open.append(line)
    try:
        yield line
    finally:
        _open.remove(line)
        sys.stderr.write(f"\r\x1b[2K{what}: {seconds(time.perf_counter() - line.t0)}\n")
        sys.stderr.flush()


def seconds(s: float) -> str:
    """A duration in the unit a reader expects: microseconds below a millisecond, milliseconds
    below a second, else seconds."""
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"
