"""eqfuse: a fusion compiler for tensor graphs on the CPU.

    parse -> build -> load into the e-graph -> saturate -> extract -> lower -> emit C -> build -> Module
"""

from .errors import ArgumentError, CheckFailed, EqfuseError, RuleError
from .compiler import compile
from .reference import reference
from .optimize import optimize

__version__ = "0.1.0"
__all__ = ["compile", "optimize", "reference", "EqfuseError", "CheckFailed", "ArgumentError", "RuleError",
           "__version__"]
