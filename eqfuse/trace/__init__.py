"""Tracing: a Python function over eqfuse.numpy (or numpy) run on traced arrays becomes a graph."""

from eqfuse import numpy  # noqa: F401  (registers the traced-array API)
from eqfuse.trace import indexing  # noqa: F401  (registers x[...])
