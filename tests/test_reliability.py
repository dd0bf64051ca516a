"""Reliability: results never alias a caller's memory; bad input gets a clear error."""

import os
import tempfile

os.environ.setdefault("EQFUSE_CACHE_DIR", tempfile.mkdtemp(prefix="eqfuse-test-cache-"))

import numpy as np

import eqfuse

RESHAPE = "graph g(x: f32[4, 4]) -> f32[16] {\n return reshape(x, shape=[16])\n}\n"


def test_output_never_aliases_a_view_of_the_callers_array():
    base = np.zeros(32, np.float32)
    y = eqfuse.compile(RESHAPE)(base[:16].reshape(4, 4))
    assert not np.shares_memory(y, base)
    y[0] = 1
    assert base[0] == 0


def test_output_never_aliases_the_callers_array_or_another_output():
    mod = eqfuse.compile("graph g(x: f32[4, 4]) -> (f32[16], f32[4, 4], f32[16]) {\n"
                         " y = reshape(x, shape=[16])\n return y, x, y\n}\n")
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    outs = mod(x)
    for i, a in enumerate(outs):
        assert not np.shares_memory(a, x), i
        for b in outs[i + 1:]:
            assert not np.shares_memory(a, b), i
    np.testing.assert_array_equal(outs[1], x)

