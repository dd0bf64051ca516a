"""`x[key]` on a traced array: numpy's basic indexing as slice, squeeze and unsqueeze ops.

Supported: integers (negative count from the end), slices with a positive step, `...`, `None`
(a new axis of size 1), and one integer array (a traced one or a numpy one), which is a gather
along its axis as in numpy. Negative steps and several integer arrays are errors naming the line.
"""

from __future__ import annotations

import numpy as np

from eqfuse.errors import EqfuseError
from eqfuse.trace.tracer import API, Traced, apply, user_pos


def _is_index_array(k) -> bool:
    if isinstance(k, Traced):
        return True
    return isinstance(k, (np.ndarray, list)) and np.asarray(k).dtype.kind in "iu"


def getitem(x: Traced, key):
    key = key if isinstance(key, tuple) else (key,)
    if any(isinstance(k, Traced) and k.dtype == np.bool_ for k in key) or any(
            isinstance(k, (np.ndarray, list)) and np.asarray(k).dtype == np.bool_ for k in key):
        raise EqfuseError("indexing by a boolean mask gives a shape that depends on the values; "
                          "use enp.where(mask, x, 0) instead", user_pos())
    if sum(_is_index_array(k) for k in key) > 1:
        raise EqfuseError("only one integer array may index a traced array", user_pos())
    consumed = sum(1 for k in key if k is not None and k is not Ellipsis)
    if sum(k is Ellipsis for k in key) > 1:
        raise EqfuseError("an index can only have a single ellipsis ('...')", user_pos())
    if consumed > x.ndim:
        raise EqfuseError(f"too many indices for an array of rank {x.ndim}: {consumed} were indexed", user_pos())
    if any(k is Ellipsis for k in key):
        at = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:at] + (slice(None),) * (x.ndim - consumed) + key[at + 1:]
    cur, axis = x, 0
    for k in key:
        if k is None:
            cur = apply("unsqueeze", [cur], {"axis": axis})
            axis += 1
        elif isinstance(k, slice):
            n = cur.shape[axis]
            start, stop, step = k.indices(n)
            if step < 1:
                raise EqfuseError("slices with a negative step are not supported on traced arrays", user_pos())
            if (start, stop, step) != (0, n, 1):
                if len(range(start, stop, step)) == 0:
                    raise EqfuseError(f"the slice {_fmt(k)} of an axis of size {n} is empty", user_pos())
                cur = apply("slice", [cur], {"axis": axis, "start": start, "stop": stop, "step": step})
            axis += 1
        elif _is_index_array(k):
            idx = k if isinstance(k, Traced) else np.asarray(k, dtype=np.int64)
            cur = apply("gather", [cur, idx], {"axis": axis})
            axis += idx.ndim
        elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            n, i = cur.shape[axis], int(k)
            if not -n <= i < n:
                raise EqfuseError(f"index {i} is out of bounds for an axis of size {n}", user_pos())
            i %= n
            cur = apply("slice", [cur], {"axis": axis, "start": i, "stop": i + 1})
            cur = apply("squeeze", [cur], {"axis": axis})
        else:
            raise EqfuseError(f"cannot index a traced array with {type(k).__name__} (integers, slices, ..., "
                              "None and one integer array are supported)", user_pos())
    return cur


def _fmt(k: slice) -> str:
    return ":".join("" if v is None else str(v) for v in (k.start, k.stop, k.step)).rstrip(":") or ":"


API["getitem"] = getitem
