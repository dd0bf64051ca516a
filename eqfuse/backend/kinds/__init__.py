"""The kernel kinds, one module each, and the registry that every lowerability question asks.

`classify(body, machine)` is the one decision whether a fused kernel body is lowered as one
kernel: the frontend asks it for hand-written kernel blocks (without a machine), extraction for
every candidate kernel, `eqfuse opt --explain` for why a fusion was not taken, and `lower` for
the kind that plans and emits it. Each kind is a `Kind` (kinds.base) with `match`, `plan` and
`emit`; `KINDS` is the order in which they are asked (the shapes are disjoint, the order only
decides which reason a body that no kind takes gets).
"""

from __future__ import annotations

from eqfuse.backend.kinds.attention import Attention
from eqfuse.backend.kinds.attention_grad import AttentionGrad
from eqfuse.backend.kinds.base import Facts, Kind
from eqfuse.backend.kinds.contraction import Contraction
from eqfuse.backend.kinds.index import Index
from eqfuse.backend.kinds.layout import Layout
from eqfuse.backend.kinds.pointwise import Pointwise
from eqfuse.backend.kinds.reduce import Reduce
from eqfuse.backend.kinds.row import Row
from eqfuse.backend.plan import K, KernelShape, Split, Unsupported

KINDS: tuple[Kind, ...] = (Pointwise(), Layout(), Index(), Contraction(), Row(), Reduce(), Attention(), AttentionGrad())
KIND: dict[K, Kind] = {k: kind for kind in KINDS for k in kind.kinds}

SUPPORTED = "; ".join(k.supported for k in (KIND[K.POINTWISE], KIND[K.CONTRACTION], KIND[K.ROW],
                                            KIND[K.REDUCE], KIND[K.ATTENTION], KIND[K.ATTENTION_GRAD], KIND[K.LAYOUT],
                                            KIND[K.INDEX]))


def classify(body, machine=None) -> KernelShape:
    """The kernel shape of a kernel body; Unsupported with the reason when no kind lowers it,
    Split when its kind lowers it only as separate kernels (on `machine`, when given: the
    planner's caches, eqfuse.backend.machine)."""
    facts = Facts.of(body)
    for kind in KINDS:
        shape = kind.match(body, facts, machine)
        if shape is not None:
            return shape
    names = ", ".join(body.nodes[i].op for i in facts.heavy)
    raise Unsupported(f"the kernel mixes {names}; it must have at most one non-pointwise op")


__all__ = ["KIND", "KINDS", "SUPPORTED", "K", "KernelShape", "Kind", "Split", "Unsupported", "classify"]
