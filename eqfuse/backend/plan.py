"""The plan of one kernel, as data: what `lower` decides and `emit` writes as C.

A plan says how one kernel runs: its kind, the tile sizes and loop order the C uses (every
tile in `tiles` is a constant of the emitted C, nothing is chosen again there), the rules the C
applies at run time (`threads`), the tile-level micro-op schedule (Load / Exec /
Store with counts, printed by `eqfuse lower --uops`), the cache constraints the tiles target
and its bytes moved and FLOPs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from eqfuse.ir.graph import Graph
from eqfuse.ir.kernels import K, KernelShape
from eqfuse.ir.ops import OPS, OpKind


@dataclass(frozen=True)
class UOp:
    depth: int  # nesting level in the printed schedule
    op: str  # Loop | Load | Exec | Store
    what: str
    count: int = 1  # how many times it runs in one call


@dataclass(frozen=True)
class LiveBound:
    """How a kernel over a KV cache follows its live length L at run time (eqfuse.backend.live):
    an "append" writes its new rows at rows L .. L + new - 1 of the cache buffer, an attention
    ("keys") reads keys 0 .. L + new - 1. `rows` is the buffer's length along that axis (the
    compile-time bound: L <= rows - new)."""

    what: str  # "append", "keys", "repeat" (grouped-query attention's copy for the query heads),
    # "rows" (a pointwise kernel over [.., rows] that the attentions read only at their live keys) or
    # "dim" (a named dim no cache holds, its loops to its run-time value: eqfuse.backend.runtime_dim)
    rows: int
    new: int
    buffer: int = -1  # an append's cache input (graph node): its result's storage, returned as is
    axis: int = -1  # a repeat's or a rows kernel's axis of rows
    # the cache held as bf16 (uint16, precision="bf16"): an append rounds its new rows to it, a
    # repeat or the decode attention widens what it reads (eqfuse.backend.live, `cache_bf16`)
    bf16: bool = False
    length: int = -1  # the graph input (node) that holds L at run time: the run function reads it there
    # a chunk step's new rows a dim at run time too (eqfuse.backend.runtime_dim, beside a cache): the
    # graph input that holds how many of the `new` rows are live; an append then writes that many
    # rows, an attention has that many query rows and L + that many keys (C: `long live_new`)
    new_length: int = -1

    @property
    def end(self) -> str:
        """The C of the rows live so far and new: L + new, the keys an attention reads."""
        return "(live + live_new)" if self.new_length >= 0 else f"(live + {self.new})"

    @property
    def params(self) -> str:
        """The C parameters the kernel takes its run-time lengths by."""
        return ", long live, long live_new" if self.new_length >= 0 else ", long live"

    def __str__(self) -> str:
        if self.what == "dim":  # a named dim at run time (eqfuse.backend.runtime_dim)
            return f"loops at run time: the first live of {self.rows} along axis {self.axis}"
        new = f"live_new (at most {self.new})" if self.new_length >= 0 else str(self.new)
        return f"{self.what} at run time: live + {new} of {self.rows} rows" + (", bf16 cache" if self.bf16 else "")


@dataclass
class KernelPlan:
    name: str
    kind: K
    node: int  # the kernel node at the graph's top level
    args: tuple[int, ...]  # top-level node ids read, one per body input
    body: Graph
    shape: KernelShape
    out_shape: tuple[int, ...]
    tiles: dict[str, int] = field(default_factory=dict)
    detail: Any = None  # the kind's frozen detail dataclass (plan_gemm.GemmDetail for the GEMM kinds)
    uops: list[UOp] = field(default_factory=list)
    bytes: int = 0
    flops: int = 0
    cache_check: str = ""
    threads: str = ""  # the rule by which the C shares one call among threads, decided at run time
    # layout in place (eqfuse.backend.views): a view plan's (root node, element offset, strides);
    # the strides of each arg read through a non-contiguous view (arg position -> strides)
    view: tuple | None = None
    in_strides: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # a layout copy written in place (eqfuse.backend.views.place_stores): the (copy's node, element
    # offset) this kernel writes its result into; the copy's plan is then a view plan with `view`
    # None that owns the storage (eqfuse.runtime.program.plan_memory)
    into: tuple[int, int] | None = None
    # the element strides of the result inside the storage it is written into (`into`'s, or its
    # own); None: contiguous. Only kinds whose `writes_strided` is true get one (kinds.base.Kind)
    out_strides: tuple[int, ...] | None = None
    # arg positions the C does not read (a concat's operands that their own kernels wrote in its
    # storage, eqfuse.backend.stores): the run function passes NULL for them
    unread: frozenset[int] = frozenset()
    # a kernel that takes the live length of a KV cache at run time (eqfuse.backend.live): its C
    # gets one more parameter, `long live`, that the run function reads from the length input
    live: "LiveBound | None" = None
    # compile's precision= (`wanted_precision`, set before the kind plans), what the kernel computes
    # in (`precision`) and by which instruction path (`precision_path`: "f32", or for bf16
    # "amx_bf16" (the blocked GEMM only), "avx512_bf16" or "fallback"; an integer GEMM is "int8"
    # whatever was asked, by the path of kinds.contraction.qgemm.int8_path), and for a kernel that
    # computes in f32 under precision="bf16", or that takes another path than the machine's best,
    # why (`precision_note`). `eqfuse lower` prints them; report["precision"] lists them.
    wanted_precision: str = "f32"
    precision: str = "f32"
    precision_path: str = "f32"
    precision_note: str = ""
    # whether the C compiler may fuse a multiply and an add into one FMA (one rounding instead of
    # two); false for a kernel of a quantized model's integer path (`rounds_as_written`), whose
    # C is then compiled with -ffp-contract=off (eqfuse.backend.emit). `eqfuse lower` prints it.
    fp_contract: bool = True

    @property
    def prepack(self):
        """How the runtime prepacks a GEMM's B bound by params= (plan_gemm.Prepack), or None."""
        return getattr(self.detail, "prepack", None)

    def base_strides(self) -> dict[int, tuple[int, ...]]:
        """body input -> the strides it is read through, for the inputs read through views."""
        return {self.body.inputs[k]: st for k, st in self.in_strides.items()}


# The ops of a quantized model's integer path (eqfuse.ir.ops_quant): onnxruntime runs each as its
# own node, rounding every product and every sum in f32.
QUANT_OPS = frozenset({"quantize_linear", "dequantize_linear", "matmul_integer", "conv_integer", "dynamic_scale",
                       "dynamic_zero_point", "dynamic_range"})


def rounds_as_written(body: Graph) -> bool:
    """Whether a kernel must round each multiply and add as written (KernelPlan.fp_contract
    false): it holds a quantize op or reads an integer tensor (an i32 sum to dequantize, u8 / i8
    data). Its f32 steps are onnxruntime's separate nodes (Cast, Mul by the scale, Add of the bias),
    and the value it computes often feeds the next DynamicQuantizeLinear: an FMA's single rounding
    moves it by an ulp, enough to cross a rounding boundary of that quantization and move an integer
    by one step (on a dynamically quantized ResNet-18, 1.3e-3 at the output; exact without)."""
    if any(n.op in QUANT_OPS for _, _, n in body.walk()):
        return True
    return any(body.nodes[i].type.dtype in ("i32", "u8", "i8") for i in body.inputs)


def computes_f32(plan: KernelPlan, why: str = "") -> None:
    """The plan computes in f32 (KernelPlan.precision); under precision="bf16", `why` says why."""
    plan.precision, plan.precision_path = "f32", "f32"
    plan.precision_note = why if plan.wanted_precision != "f32" else ""


def precision_entries(plans) -> dict[str, dict[str, str]]:
    """report["precision"]'s entries for these plans: kernel name -> its precision, instruction
    path and, for a kernel that computes in f32 under precision="bf16", why."""
    out = {}
    for p in plans:
        if p.kind == "view":
            continue
        e = {"precision": p.precision, "path": p.precision_path}
        if p.precision_note:
            e["note"] = p.precision_note
        out[p.name] = e
    return out


def size(shape) -> int:
    return math.prod(shape) if shape else 1


def pointwise_flops(body: Graph, skip: set[int] = frozenset()) -> int:
    total = 0
    for i, n in enumerate(body.nodes):
        if n.op in ("input", "const") or i in skip or n.op not in OPS:
            continue
        op = OPS[n.op]
        if op.kind in (OpKind.POINTWISE, OpKind.CHANNEL):
            total += op.flops * size(n.type.shape)
    return total


def ops_text(body: Graph, skip=()) -> str:
    names = [n.op for i, n in enumerate(body.nodes) if n.op not in ("input", "const") and i not in skip]
    return ", ".join(names)


def not_ancestors(body: Graph, i: int) -> set[int]:
    return set(range(len(body.nodes))) - body.ancestors(i)
