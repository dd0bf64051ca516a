"""The kernel kinds of the backend, one module each: how a kernel of each kind is planned and
written as C. Which kind a fused body is, or why it cannot be lowered, is decided once, by
eqfuse.ir.kernels.classify; `KIND` maps each plan kind to the `Kind` that plans and emits it.
"""

from __future__ import annotations

from eqfuse.backend.kinds.attention import Attention
from eqfuse.backend.kinds.attention_grad import AttentionGrad
from eqfuse.backend.kinds.base import Kind
from eqfuse.backend.kinds.contraction import Contraction
from eqfuse.backend.kinds.index import Index
from eqfuse.backend.kinds.layout import Layout
from eqfuse.backend.kinds.pointwise import Pointwise
from eqfuse.backend.kinds.reduce import Reduce
from eqfuse.backend.kinds.row import Row
from eqfuse.ir.kernels import K

KINDS: tuple[Kind, ...] = (Pointwise(), Layout(), Index(), Contraction(), Row(), Reduce(), Attention(), AttentionGrad())
KIND: dict[K, Kind] = {k: kind for kind in KINDS for k in kind.kinds}
