"""Stage `emit`: kernel plans -> one C translation unit and its cdef.

Each plan's kind writes its C (eqfuse.backend.kinds: `Kind.emit`, from its skeletons in
csrc_templates/, with the C expressions of eqfuse.backend.cexpr) and decides nothing: every tile
and decision is the plan's. Generated names are deterministic: eqf_<graph>_k<counter>_<kind>.
"""

from __future__ import annotations

from dataclasses import dataclass

from eqfuse.backend.cbuild import COMMON_C, COMMON_CDEF, HEADER_C, HEADER_CDEF, header_c
from eqfuse.backend.cexpr import ctypes_of
from eqfuse.backend.kinds import KIND
from eqfuse.backend.plan import K, KernelPlan


@dataclass
class Emitted:
    source: str  # the whole translation unit
    cdef: str
    kernel_sources: dict[str, str]  # plan name -> its C


def prototype(plan: KernelPlan) -> str:
    """The kernel's cdef (and its B prepacking functions when it has them; call after emitting)."""
    ins, out = ctypes_of(plan)
    ps = [f"const {t}* in{k}" for k, t in enumerate(ins)] + [f"{out}* out"]
    ret = "long" if plan.kind == K.INDEX else "void"  # index kernels count bad indices
    cdef = f"{ret} {plan.name}({', '.join(ps)});"
    pre = plan.prepack
    if pre:
        cdef += f"\nlong {pre.floats}(void);\nvoid {pre.fn}(const float* B, float* P);"
    return cdef


def emit_kernel(plan: KernelPlan) -> str:
    return KIND[plan.kind].emit(plan)


def emit_graph(plans: list[KernelPlan]) -> Emitted:
    header = header_c()
    parts, cdefs, per = [COMMON_C, header, HEADER_C], [COMMON_CDEF, HEADER_CDEF], {}
    for p in plans:
        if p.kind == K.VIEW:
            continue
        c = emit_kernel(p)
        per[p.name] = c
        parts.append(c)
        cdefs.append(prototype(p))
    return Emitted("\n".join(parts), "\n".join(cdefs), per)
