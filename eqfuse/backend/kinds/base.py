"""The `Kind` interface every kernel kind implements, and the facts about a body that `match`
reads.

A kind answers three questions about one fused kernel body:

- `match(body, facts, machine)`: is the body this kind? None when it is not (another kind may
  be); its typed `KernelShape` when it is; `Unsupported` with the reason when it is this kind's
  shape but cannot be lowered, or `Split` when this backend lowers it only as separate
  single-op kernels (on this machine, when `machine` is given). This is the one lowerability
  decision: `plan` and `emit` never refuse a body that `match` accepted.
- `plan(plan, m)`: fill the plan, for machine m (kinds' detail dataclass, tiles, uops, cache check, the
  thread rule) with every tile and decision the C will use;
- `emit(plan)`: its C, from the kind's templates in csrc_templates/, deciding nothing.
"""

from __future__ import annotations

from eqfuse.backend.plan import KernelPlan
from eqfuse.ir.kernels import K
from eqfuse.machine import Machine

# Elements (row kernels: a quarter of it) below which a pointwise, row, reduce or layout kernel
# runs on the calling thread, with no parallel region.
PARALLEL_MIN = 1 << 15

# How the parallel loops of a kernel written as eqf_region ranges (common_pool.h: the direct and
# Winograd convs, pooling) are shared: the call picks the mode (eqfuse.runtime.load.region_mode)
REGIONS = ("split evenly among OpenMP's threads when the call finds every core free and its graph has OpenMP "
           "kernels, else in ranges claimed one at a time by the claim-based pool's threads (common_pool.h, "
           "eqf_region: the caller waits for no thread that has not started)")


class Kind:
    """One kernel kind (see the module docstring). `kinds` are the plan kinds it produces."""

    kinds: tuple[K, ...] = ()
    supported: str = ""  # its kernel shape, for the message naming the supported shapes
    # whether its C writes the result through any element strides (plan.out_strides), so that
    # eqfuse.backend.views can make it write a layout copy's storage in place
    writes_strided: bool = False


    def plan(self, plan: KernelPlan, m: Machine) -> None:
        raise NotImplementedError

    def after_views(self, plan: KernelPlan, m: Machine) -> None:
        """Decisions that depend on the strides its inputs are read through, known once
        eqfuse.backend.views has placed the views (plan.in_strides): none by default."""

    def writes_through(self, plan: KernelPlan, strides: tuple[int, ...]) -> bool:
        """Whether its C can write this plan's result at these element strides (plan.out_strides)."""
        return self.writes_strided

    def emit(self, plan: KernelPlan) -> str:
        raise NotImplementedError



def input_names(plan: KernelPlan) -> list[str]:
    return [plan.body.nodes[i].name or f"in{k}" for k, i in enumerate(plan.body.inputs)]


def vectors(n: int, simd: int) -> int:
    """SIMD vectors covering n floats."""
    return max(1, -(-n // simd))


def parallel_rule(parallel: bool, work: str, threshold: int, split: str) -> str:
    """The plan's thread rule for a kernel whose one parallel region opens only above a size."""
    if parallel:
        return f"{split} split evenly among the threads ({work} >= {threshold})"
    return f"one thread, no parallel region ({work} < {threshold})"
