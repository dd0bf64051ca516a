"""Comparing compiled results with the numpy reference (rtol 1e-4, atol 1e-5).

Each element of an output is within atol + rtol |reference| of the reference's element, except in
a graph that runs a Winograd conv (`scale_for`): there each element is within atol + rtol
max|reference| over its output. Winograd F(2x2, 3x3) rounds the transformed input and weights and
sums their products, so its error is bounded relative to the transforms' magnitudes, which follow
the size of the map's values, not each output element's own (docs/precision.md: the bound, with
u = 0 for f32): an output element near zero among large ones can miss the elementwise rule by
many times a direct conv's rounding while the whole output is as close as the direct conv's
(tests/test_conv_winograd.py::test_rounding_is_close_to_the_direct_kernels: max|error| /
max|output| within 8x the direct kernel's and below 2e-6). `eqfuse run --verify`, compile's
verify= and the example of `eqfuse export` (`make check`) use this one rule.
"""

from __future__ import annotations

import numpy as np

RTOL, ATOL = 1e-4, 1e-5
ELEMENT, OUTPUT = "element", "output"  # what rtol is relative to: each element, or its output's largest


def scale_for(plans) -> str:
    """OUTPUT for the kernels of a graph that runs a Winograd conv, else ELEMENT (module docstring)."""
    return OUTPUT if any(getattr(p.detail, "winograd", 0) for p in plans or ()) else ELEMENT


def compare(got, want, rtol: float = RTOL, atol: float = ATOL, scale: str = ELEMENT) -> list[str]:
    """One line per output that differs; empty when all match."""
    bad = []
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape:
            bad.append(f"output {i}: shape {list(g.shape)}, reference {list(w.shape)}")
            continue
        if scale == OUTPUT and w.size and w.dtype.kind == "f":
            top = float(np.nanmax(np.abs(w), initial=0.0))
            ok = np.isclose(g, w, rtol=0.0, atol=atol + rtol * top, equal_nan=True)
            rule = f" (within {atol:g} + {rtol:g} x max|reference| {top:.3g}: a Winograd conv)"
        else:
            ok = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
            rule = ""
        if not ok.all():
            idx = np.unravel_index(np.argmin(ok), ok.shape)
            err = np.max(np.abs(g.astype(np.float64) - w))
            bad.append(f"output {i}: {int((~ok).sum())} of {ok.size} elements differ "
                       f"(first at {list(map(int, idx))}: {g[idx]} vs {w[idx]}; max abs error {err:.3g}){rule}")
    return bad
