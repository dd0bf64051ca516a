"""eqfuse: a fusion compiler for tensor graphs on the CPU.

    options -> load -> bind -> fold -> optimize (e-graph, extraction) -> lower -> build (C) -> Module

The stages are the functions of eqfuse.pipeline; `compile` composes them. `load` reads a saved
Module (Module.save) without any of them: the compiler's modules (the parser's grammar, the
e-graph, the C build) are imported at the first use of `compile`, `optimize`, `reference`, `jit`
or `generate`, so a process that only loads artifacts never imports them (eqfuse.runtime.artifact).
"""

from eqfuse import numpy  # noqa: F401  (eqfuse.numpy fills the traced-array API, trace.tracer.API)
from eqfuse.errors import ArgumentError, CheckFailed, EqfuseError, RuleError
from eqfuse.runtime.artifact import load
from eqfuse.trace import indexing  # noqa: F401  (x[...] on traced arrays)
from eqfuse.version import __version__

__all__ = ["compile", "optimize", "reference", "jit", "generate", "load", "EqfuseError", "CheckFailed",
           "ArgumentError", "RuleError", "__version__"]

_LAZY = ("compile", "reference", "optimize", "jit", "generate")


def __getattr__(name: str):
    """The compiler's entry points, imported at their first use."""
    if name in ("compile", "reference"):
        from eqfuse import pipeline as where
    elif name == "optimize":  # the optimizer's graphs, its kernels counted as `eqfuse opt` counts them
        from eqfuse.pipeline import optimize_model as value

        globals()[name] = value
        return value
    elif name == "jit":
        from eqfuse.trace import jit as where
    elif name == "generate":
        from eqfuse import generation as where
    else:
        raise AttributeError(f"module 'eqfuse' has no attribute '{name}'")
    value = getattr(where, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
