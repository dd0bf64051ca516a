"""Comparing compiled results with the numpy reference (rtol 1e-4, atol 1e-5).

Each element of an output is within atol + rtol |reference| of the reference's element, except in
a graph with a kernel that sums products (a matmul, a conv, an attention: `scale_for`): there each
element is within atol + rtol max|reference| over its output. The rounding of a sum of K products
is bounded relative to the sum of the products' magnitudes, not to the sum itself, and so is the
numpy reference's own f32 rounding: an element that cancels to near zero among large ones can
differ from the reference by more than rtol x its own value although both are as close to the
exact result as f32 sums get. Winograd F(2x2, 3x3) also rounds the transformed input and weights,
whose magnitudes follow the map's values (docs/precision.md: the bound, with u = 0 for f32;
tests/test_conv_winograd.py::test_rounding_is_close_to_the_direct_kernels: max|error| /
max|output| within 8x the direct kernel's and below 2e-6). `eqfuse run --verify`, compile's
verify= and the example of `eqfuse export` (`make check`) use this one rule.
"""

from __future__ import annotations

import numpy as np

from eqfuse.ir.kernels import GEMM_KINDS, K

RTOL, ATOL = 1e-4, 1e-5
ELEMENT, OUTPUT = "element", "output"  # what rtol is relative to: each element, or its output's largest


SUMS_OF_PRODUCTS = (*GEMM_KINDS, K.ATTENTION, K.ATTENTION_GRAD)


def scale_for(plans) -> str:
    """OUTPUT for the kernels of a graph with a kernel that sums products, else ELEMENT (module
    docstring)."""
    return OUTPUT if any(p.kind in SUMS_OF_PRODUCTS for p in plans or ()) else ELEMENT


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
            rule = f" (within {atol:g} + {rtol:g} x max|reference| {top:.3g}: a sum of products)"
        else:
            ok = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
            rule = ""
        if not ok.all():
            idx = np.unravel_index(np.argmin(ok), ok.shape)
            err = np.max(np.abs(g.astype(np.float64) - w))
            bad.append(f"output {i}: {int((~ok).sum())} of {ok.size} elements differ "
                       f"(first at {list(map(int, idx))}: {g[idx]} vs {w[idx]}; max abs error {err:.3g}){rule}")
    return bad
