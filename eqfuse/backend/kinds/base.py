"""The `Kind` interface every kernel kind implements, and the facts about a body that `match`
reads.

A kind answers three questions about one fused kernel body:

- `match(body, facts, machine)`: is the body this kind? None when it is not (another kind may
  be); its typed `KernelShape` when it is; `Unsupported` with the reason when it is this kind's
  shape but cannot be lowered, or `Split` when this backend lowers it only as separate
  single-op kernels (on this machine, when `machine` is given). This is the one lowerability
  decision: `plan` and `emit` never refuse a body that `match` accepted.
- `plan(plan, caches)`: fill the plan (kinds' detail dataclass, tiles, uops, cache check, the
  thread rule) with every tile and decision the C will use;
- `emit(plan)`: its C, from the kind's templates in csrc_templates/, deciding nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from eqfuse.backend.plan import K, KernelPlan, KernelShape, Split, Unsupported
from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.ops import OPS

# Elements (row kernels: a quarter of it) below which a pointwise, row, reduce or layout kernel
# runs on the calling thread, with no parallel region.
PARALLEL_MIN = 1 << 15


class Kind:
    """One kernel kind (see the module docstring). `kinds` are the plan kinds it produces."""

    kinds: tuple[K, ...] = ()
    supported: str = ""  # its kernel shape, for the message naming the supported shapes
    # whether its C writes the result through any element strides (plan.out_strides), so that
    # eqfuse.backend.views can make it write a layout copy's storage in place
    writes_strided: bool = False

    def match(self, body: Graph, facts: Facts, machine=None) -> KernelShape | None:
        raise NotImplementedError

    def plan(self, plan: KernelPlan, caches) -> None:
        raise NotImplementedError

    def after_views(self, plan: KernelPlan, caches) -> None:
        """Decisions that depend on the strides its inputs are read through, known once
        eqfuse.backend.views has placed the views (plan.in_strides): none by default."""

    def writes_through(self, plan: KernelPlan, strides: tuple[int, ...]) -> bool:
        """Whether its C can write this plan's result at these element strides (plan.out_strides)."""
        return self.writes_strided

    def emit(self, plan: KernelPlan) -> str:
        raise NotImplementedError


def op_kind(n: Node) -> str:
    """The kind of a body node as kernels see it: input, const, kernel, or the op's kind in the
    op table (a channel op such as batchnorm is pointwise for kernels)."""
    if n.op in ("input", "const", "kernel"):
        return n.op
    k = OPS[n.op].kind
    return "pointwise" if k == "channel" else k


@dataclass(frozen=True)
class Facts:
    """What every kind's match reads: the non-pointwise ops (`heavy`), each op's kind, the
    kernel inputs and the output."""

    heavy: list[int]
    kinds: dict[int, str]
    inputs: set[int]
    out: int

    @staticmethod
    def of(body: Graph) -> Facts:
        ops = [(i, n) for i, n in enumerate(body.nodes) if n.op not in ("input", "const")]
        if not ops:
            raise Unsupported("the kernel computes nothing")
        kinds = {i: op_kind(n) for i, n in ops}
        if "kernel" in kinds.values():
            raise Unsupported("kernel blocks cannot be nested")
        heavy = [i for i, k in kinds.items() if k != "pointwise"]
        return Facts(heavy, kinds, set(body.inputs), body.outputs[0])

    def single(self, *op_kinds: str) -> int | None:
        """The one non-pointwise op when there is exactly one and its kind is among op_kinds."""
        if len(self.heavy) == 1 and self.kinds[self.heavy[0]] in op_kinds:
            return self.heavy[0]
        return None


def swaps_last_two(n: Node) -> bool:
    if n.op != "transpose" or n.type.rank < 2:
        return False
    perm = n.attr["perm"] or tuple(reversed(range(n.type.rank)))
    r = n.type.rank
    return tuple(perm) == tuple(range(r - 2)) + (r - 1, r - 2)


def check_epilogue(body: Graph, anchor: int, out: int) -> None:
    """Every op after the anchor must be pointwise and lie on the way to the output."""
    if anchor not in body.ancestors(out):
        raise Unsupported("the kernel's result does not depend on its main op")


def check_no_broadcast(body: Graph, anchor: int, result: int, what: str) -> None:
    """The epilogue runs over the main op's index space: it must not broadcast its result."""
    if tuple(body.nodes[anchor].type.shape) != tuple(body.nodes[result].type.shape):
        raise Split(f"its epilogue would broadcast the {what} result to a larger shape")


def check_computable(body: Graph, root: int, stops: set[int], forbid: set[int] = frozenset()) -> None:
    """The values an emitter computes element by element for `root` (cexpr.Exprs, starting
    again at the `stops` it is given) are pointwise ops over inputs and constants, none of them
    in `forbid` (values of another index space)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        i = stack.pop()
        if i in seen or i in stops:
            continue
        seen.add(i)
        if i in forbid:
            raise Split("the epilogue reads a value of the prologue's index space")
        n = body.nodes[i]
        if n.op in ("input", "const"):
            continue
        if op_kind(n) != "pointwise":
            raise Split(f"{n.op} cannot be computed inside this kernel's loop")
        stack.extend(n.args)


def view_source(body: Graph, i: int) -> int | None:
    """The kernel input that node i reads in place through layout ops, or None.

    A view is an input under reshapes and transposes, the reshapes first (a reshape of a
    contiguous buffer is free; a transpose only permutes strides), e.g. the head split
    transpose(reshape(x, shape=[-1, S, H, D]), perm=[0, 2, 1, 3]).
    """
    n = body.nodes[i]
    if n.op == "input":
        return i
    if n.op == "transpose":
        return view_source(body, n.args[0])
    if n.op == "reshape":
        src = n.args[0]
        return view_source(body, src) if body.nodes[src].op in ("input", "reshape") else None
    return None


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
