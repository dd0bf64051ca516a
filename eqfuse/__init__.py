"""eqfuse: a fusion compiler for tensor graphs on the CPU.

    options -> load -> bind -> fold -> optimize (e-graph, extraction) -> lower -> build (C) -> Module

The stages are the functions of eqfuse.pipeline; `compile` composes them.
"""

from eqfuse import numpy  # noqa: F401  (eqfuse.numpy fills the traced-array API, trace.tracer.API)
from eqfuse.errors import ArgumentError, CheckFailed, EqfuseError, RuleError
from eqfuse.generate import generate
from eqfuse.optimizer.optimize import optimize
from eqfuse.pipeline import compile, reference
from eqfuse.trace import indexing  # noqa: F401  (x[...] on traced arrays)
from eqfuse.trace.jit import jit
from eqfuse.version import __version__

__all__ = ["compile", "optimize", "reference", "jit", "generate", "EqfuseError", "CheckFailed", "ArgumentError", "RuleError",
           "__version__"]
