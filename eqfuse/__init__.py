"""eqfuse: a fusion compiler for tensor graphs on the CPU.

    parse -> build -> load into the e-graph -> saturate -> extract -> lower -> emit C -> build -> Module
"""

from eqfuse.compiler import compile
from eqfuse.errors import ArgumentError, CheckFailed, EqfuseError, RuleError
from eqfuse.ir.reference import reference
from eqfuse.optimizer.optimize import optimize
from eqfuse.trace.jit import jit
from eqfuse.version import __version__  # noqa: E402

__all__ = ["compile", "optimize", "reference", "jit", "EqfuseError", "CheckFailed", "ArgumentError", "RuleError",
           "__version__"]
