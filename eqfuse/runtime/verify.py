"""Comparing compiled results with the numpy reference (tolerance: rtol 1e-4, atol 1e-5)."""

from __future__ import annotations

import numpy as np

RTOL, ATOL = 1e-4, 1e-5


def compare(got, want, rtol: float = RTOL, atol: float = ATOL) -> list[str]:
    """One line per output that differs; empty when all match."""
    bad = []
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape:
            bad.append(f"output {i}: shape {list(g.shape)}, reference {list(w.shape)}")
            continue
        ok = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        if not ok.all():
            idx = np.unravel_index(np.argmin(ok), ok.shape)
            err = np.max(np.abs(g.astype(np.float64) - w))
            bad.append(f"output {i}: {int((~ok).sum())} of {ok.size} elements differ "
                       f"(first at {list(map(int, idx))}: {g[idx]} vs {w[idx]}; max abs error {err:.3g})")
    return bad
