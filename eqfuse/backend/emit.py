"""Stage `emit`: kernel plans -> one C translation unit and its cdef.

Each plan's kind writes its C (eqfuse.backend.kinds: `Kind.emit`, from its skeletons in
csrc_templates/, with the C expressions of eqfuse.backend.cexpr) and decides nothing: every tile
and decision is the plan's. Generated names are deterministic: eqf_<graph>_k<counter>_<kind>.

With `share=True` a kernel whose C is another's but for its name is not emitted again: the
run function calls the first one (`Emitted.alias`). The layers of a transformer are the same
kernels 12 times over: BERT-base's 91 kernels are 12 different ones, and the C compiler's time
is most of a cold compile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eqfuse.backend.cbuild import COMMON_C, COMMON_CDEF, HEADER_CDEF, header_c
from eqfuse.backend.cexpr import ctypes_of
from eqfuse.backend.kinds import KIND
from eqfuse.backend.plan import KernelPlan
from eqfuse.ir.kernels import K


@dataclass
class Emitted:
    source: str  # the whole translation unit
    cdef: str
    kernel_sources: dict[str, str]  # plan name -> its C (a shared kernel's: the C it runs)
    alias: dict[str, str] = field(default_factory=dict)  # plan name -> the kernel function it calls

    def symbol(self, name: str) -> str:
        """The C function that runs the plan of this name."""
        return self.alias.get(name, name)


def prototype(plan: KernelPlan) -> str:
    """The kernel's cdef (and its B prepacking functions when it has them; call after emitting)."""
    ins, out = ctypes_of(plan)
    ps = [f"const {t}* in{k}" for k, t in enumerate(ins)] + [f"{out}* out"] + ([plan.live.params[2:]] if plan.live else [])
    ret = "long" if plan.kind == K.INDEX else "void"  # index kernels count bad indices
    cdef = f"{ret} {plan.name}({', '.join(ps)});"
    pre = plan.prepack
    if pre:
        cdef += f"\nlong {pre.floats}(void);\nvoid {pre.fn}(const float* B, float* P);"
    return cdef


def emit_kernel(plan: KernelPlan) -> str:
    c = KIND[plan.kind].emit(plan)
    if plan.fp_contract:
        return c
    # the plan's fp_contract: gcc's options for these functions only (helpers inlined into them too)
    return f'#pragma GCC push_options\n#pragma GCC optimize("fp-contract=off")\n{c}\n#pragma GCC pop_options\n'


def emit_graph(plans: list[KernelPlan], share: bool = False) -> Emitted:
    """The translation unit of the plans' kernels; `share` emits kernels with the same C once
    (`alias`: the run function and the runtime call the first one's kernel and prepack functions)."""
    parts, cdefs, per, alias = [], [COMMON_CDEF, HEADER_CDEF], {}, {}
    first: dict[str, str] = {}  # a kernel's C with its name taken out -> the first plan's name
    for p in plans:
        if p.kind == K.VIEW:
            continue
        c = emit_kernel(p)
        if share:
            same = first.setdefault(c.replace(p.name, "\0"), p.name)
            if same != p.name:
                alias[p.name], per[p.name] = same, per[same]
                continue
        per[p.name] = c
        parts.append(c)
        cdefs.append(prototype(p))
    kernels = "\n".join(parts)  # (the run function, added after them, uses no intrinsics)
    return Emitted("\n".join([COMMON_C, header_c(kernels), kernels]), "\n".join(cdefs), per, alias)
