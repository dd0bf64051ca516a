"""Stage `lower`: fused graph -> kernel plans, as data (eqfuse.backend.plan).

Every kernel is classified by the kinds registry (eqfuse.backend.kinds, the one lowerability
decision) and planned by its kind: every tile the C will use, chosen here from the planner's
machine and checked against its caches, the rule of its thread split, its micro-op schedule and
its bytes moved and FLOPs. A kernel block whose kind lowers it only as separate kernels (Split)
is split into single-op kernels. `emit` turns plans into C and chooses nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

from eqfuse.backend.kinds import KIND
from eqfuse.backend.kinds.contraction import mark_bound_b
from eqfuse.backend.kinds.contraction.blocked import block_between_convs
from eqfuse.backend.kinds.contraction.conv_amx import copy_between_amx_convs, pool_into_amx_conv
from eqfuse.backend.literals import lift_literals
from eqfuse.backend.live import mark_live
from eqfuse.backend.plan import KernelPlan, rounds_as_written, size
from eqfuse.backend.runtime_dim import mark_dim
from eqfuse.backend.stores import place_stores, store_uop
from eqfuse.backend.views import is_contiguous, place_views
from eqfuse.errors import EqfuseError
from eqfuse.ir.conv_forms import expand_convs
from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.kernels import (
    F32,
    SUPPORTED,
    K,
    Split,
    Unsupported,
    classify,
    peel_transposes,
)
from eqfuse.machine import Machine

# ------------------------------------------------------------------ the machine


# ------------------------------------------------------------------ graph -> kernels only


def _single_op_kernel(out: Graph, ids: dict[int, int], n: Node) -> int:
    """Add op n (its args given as ids of nodes already in `out`) as a one-op kernel of `out`."""
    body = Graph("kernel")
    args: list[int] = []
    body_args = []
    seen: dict[int, int] = {}
    for a in (ids[x] for x in n.args):
        an = out.nodes[a]
        if an.op == "const":
            body_args.append(body.add(Node("const", attrs=an.attrs, type=an.type)))
        elif a not in seen:
            seen[a] = body.add(Node("input", type=an.type, name=an.name or f"t{a}"))
            body.inputs.append(seen[a])
            args.append(a)
            body_args.append(seen[a])
        else:
            body_args.append(seen[a])
    body.outputs = [body.add(Node(n.op, tuple(body_args), n.attrs, n.type, pos=n.pos))]
    return out.add(Node("kernel", tuple(args), (), n.type, name=n.name, pos=n.pos, body=body))


def kernelize(g: Graph, fuse: bool = True, split: frozenset[int] = frozenset(),
              origins: dict[int, int] | None = None) -> Graph:
    """The graph with only input/const/kernel nodes at top level.

    Kernel blocks stay (unless fuse=False or their id is in `split`: then their bodies are
    inlined); every other op becomes a kernel of its own. A GEMM kernel between transposes
    (eqfuse.ir.kernels.peel_transposes) becomes the transposes and the GEMM's kernel, whose node
    `origins` maps to the kernel block it came from.
    """
    origins = {} if origins is None else origins
    out = Graph(g.name, pos=g.pos)
    mapping: dict[int, int] = {}
    for i, n in enumerate(g.nodes):
        if n.op in ("input", "const"):
            mapping[i] = out.add(n)
        elif n.op == "kernel" and fuse and i not in split and (p := peel_transposes(n.body)) is not None:
            # a GEMM between transposes: the transposes as layout ops around the GEMM's kernel
            # (the one it reads a view, the one after it a copy it writes in place: place_views,
            # place_stores)
            args = []
            for k, perm in p.sources:
                a = mapping[n.args[k]]
                if perm is not None:
                    a = _single_op_kernel(out, {a: a}, Node("transpose", (a,), (("perm", perm),),
                                                             p.body.nodes[p.body.inputs[len(args)]].type))
                args.append(a)
            k = out.add(replace(n, args=tuple(args), body=p.body, type=p.body.nodes[p.body.outputs[0]].type))
            origins[k] = i
            mapping[i] = _single_op_kernel(out, {k: k}, Node("transpose", (k,), (("perm", p.out_perm),), n.type,
                                                             name=n.name, pos=n.pos))
        elif n.op == "kernel" and fuse and i not in split:
            mapping[i] = out.add(replace(n, args=tuple(mapping[a] for a in n.args)))
        elif n.op == "kernel":
            inner = {bi: mapping[a] for bi, a in zip(n.body.inputs, n.args)}
            for bi, bn in enumerate(n.body.nodes):
                if bn.op == "const":
                    inner[bi] = out.add(bn)
                elif bn.op != "input":
                    inner[bi] = _single_op_kernel(out, inner, bn)
            mapping[i] = inner[n.body.outputs[0]]
        else:
            mapping[i] = _single_op_kernel(out, mapping, n)
    out.inputs = [mapping[i] for i in g.inputs]
    out.outputs = [mapping[o] for o in g.outputs]
    return out


# ------------------------------------------------------------------ planning


def _reads(plan_body: Graph) -> int:
    return sum(size(plan_body.nodes[i].type.shape) for i in plan_body.inputs)


# Why a kernel of these kinds computes in f32 under precision="bf16" (docs/precision.md)
F32_UNDER_BF16 = "only GEMMs multiply in bf16; epilogues, norms, softmax and reductions stay f32"


def plan_kernel(g: Graph, node_id: int, name: str, m: Machine, precision: str = "f32") -> KernelPlan:
    n = g.nodes[node_id]
    body = n.body
    for _, _, bn in body.walk():
        if not bn.type.concrete:
            raise EqfuseError(f"kernel {name} has unbound dimensions ({bn.type}); bind them with dims=", n.pos)
    try:
        ks = classify(body, m)
    except Split:
        raise
    except Unsupported as why:
        raise EqfuseError(f"this kernel block cannot be lowered: {why}", n.pos,
                          f"supported kernel shapes: {SUPPORTED}") from None
    out_shape = tuple(body.nodes[body.outputs[0]].type.shape)
    plan = KernelPlan(name, ks.kind, node_id, tuple(n.args), body, ks, out_shape, wanted_precision=precision,
                      fp_contract=not rounds_as_written(body))
    plan.bytes = F32 * (_reads(body) + size(out_shape))
    KIND[ks.kind].plan(plan, m)
    if precision != "f32" and plan.precision == "f32" and not plan.precision_note:
        plan.precision_note = f"a {ks.kind} kernel computes in f32: {F32_UNDER_BF16}"
    return plan


# ------------------------------------------------------------------ the whole graph


def lower_graph(g: Graph, m: Machine, fuse: bool = True, params: frozenset[str] = frozenset(),
                precision: str = "f32", live: str | None = None, arrays=None,
                capacity: int | None = None, beside: tuple[str, int] | None = None) -> tuple[Graph, list[KernelPlan]]:
    """(the kernelized graph, one plan per kernel) for a graph with concrete shapes, planned for
    machine m. `params` names the inputs bound by params=: a GEMM whose B is one of them is marked
    b_bound (emit then prepacks it, when B is one matrix shared by every batch). `precision` is
    compile's precision=: each plan records what its kernel computes in and by which instruction
    path (KernelPlan.precision, .precision_path). `live` names the input that holds a KV cache's
    live length (compile's live=): its appends and attentions take it at run time
    (eqfuse.backend.live); `arrays` the bound inputs' values, which it may read (an
    integer GEMM's bound weights, whose range chooses its instruction path: qgemm.mark_bound).
    With `capacity` (the live dim's bound value) and no KV cache, `live` is instead a named dim's
    run-time value: the kernels over it loop to its value (eqfuse.backend.runtime_dim). `beside`
    (the name of its length input, its capacity) is such a dim beside the KV cache: a chunk step's
    new rows (eqfuse.generate)."""
    g = expand_convs(g)  # (conv1d, conv_transpose2d as conv2d, when the optimizer did not run)
    # (GEMM rows a dim's at run time: mark_bound_b)
    rows = beside[1] if beside is not None else capacity if live is not None else None
    split: set[int] = set()
    while True:
        origins: dict[int, int] = {}
        kg0 = kernelize(g, fuse=fuse, split=frozenset(split), origins=origins)
        kg, ids = lift_literals(kg0)  # (twin kernels apart only by literals: one C)
        origins = {ids[k]: v for k, v in origins.items()}
        for i, j in ids.items():  # (a body with literals lifted is a new one: _origin finds it no more)
            if kg.nodes[j].body is not kg0.nodes[i].body and j not in origins:
                origins[j] = _origin(g, kg0, i)
        plans: list[KernelPlan] = []
        retry = False
        count = 0
        for i, n in enumerate(kg.nodes):
            if n.op != "kernel":
                continue
            try:
                plan = plan_kernel(kg, i, "", m, precision)
            except Split:
                orig = origins.get(i, _origin(g, kg, i))
                if orig is None or orig in split:
                    raise
                split.add(orig)
                retry = True
                break
            plan.name = f"eqf_{g.name}_k{count}_{plan.kind}"
            count += 1
            mark_bound_b(plan, _bound_inputs(plan, kg, params), m, _bound_values(plan, kg, params, arrays), rows)
            plans.append(plan)
        if not retry:
            place_views(kg, plans)
            cache = live is not None and mark_live(kg, plans, live)  # (a KV cache's length, else a dim's)
            place_stores(kg, plans)
            for p in plans:  # decisions that depend on the strides the inputs are read through
                if p.kind != K.VIEW:
                    KIND[p.kind].after_views(p, m)
                    if p.kind in (K.CONTRACTION, K.CONTRACTION_ROW) and p.in_strides:  # planned again
                        mark_bound_b(p, _bound_inputs(p, kg, params), m, _bound_values(p, kg, params, arrays), rows)
                if p.into is not None:  # after any planning again, which writes the uops anew
                    p.uops = p.uops + [store_uop(p)]
            pool_into_amx_conv(kg, plans, m)  # (a conv on AMX tiles and the max pool after it: one kernel)
            copy_between_amx_convs(kg, plans)  # (convs on AMX tiles: the next one's copy written by the one before)
            block_between_convs(kg, plans, m)  # (direct convs, convs on AMX tiles: the blocked layout between them)
            # a 1x1 conv planned again as a direct conv, and a conv whose bound weights it reads
            # through a view (a conv1d's, reshaped to a conv2d's): their weights blocked once too
            for p in plans:
                if p.kind == K.CONV2D and p.prepack is None:
                    mark_bound_b(p, _bound_inputs(p, kg, params, plans), m, _bound_values(p, kg, params, arrays, plans), rows)
            dim = (live, capacity) if live is not None and capacity is not None and not cache else beside if cache else None
            if dim is not None:  # (on the plans as they are emitted)
                mark_dim(kg, plans, *dim, m)
                for p in plans:  # (a pointwise kernel's loops split at the dim: planned again)
                    if p.kind == K.POINTWISE and p.live is not None:
                        KIND[p.kind].after_views(p, m)
                        if p.into is not None:
                            p.uops = p.uops + [store_uop(p)]
            return kg, plans


def _bound_inputs(plan: KernelPlan, kg: Graph, params: frozenset[str], plans: list[KernelPlan] = ()) -> set[int]:
    """The body inputs of a plan that read graph inputs bound by params=: directly or, with the
    views placed (`plans`), through a view that is the input's elements in their own order (offset
    0, contiguous strides: a reshape, such as a conv1d's weights seen as a conv2d's), which a
    prepack then reads from the bound array itself (eqfuse.runtime.program's memory plan)."""
    return set(_bound_names(plan, kg, params, plans))


def _bound_names(plan: KernelPlan, kg: Graph, params: frozenset[str], plans: list[KernelPlan] = ()) -> dict[int, str]:
    """_bound_inputs, each with the name of the graph input it reads."""
    whole = {p.node: p.view[0] for p in plans if p.kind == K.VIEW and p.view is not None and p.view[1] == 0
             and is_contiguous(kg.nodes[p.node].type.shape, p.view[2])}
    return {i: kg.nodes[whole.get(a, a)].name for i, a in zip(plan.body.inputs, plan.args)
            if kg.nodes[whole.get(a, a)].op == "input" and kg.nodes[whole.get(a, a)].name in params}


def _bound_values(plan: KernelPlan, kg: Graph, params: frozenset[str], arrays, plans: list[KernelPlan] = ()) -> dict:
    """The bound inputs of a plan whose values `arrays` holds: body input -> the array (an integer
    GEMM chooses its instruction path by its bound weights' range, qgemm.mark_bound)."""
    if not arrays:
        return {}
    return {i: arrays[n] for i, n in _bound_names(plan, kg, params, plans).items() if n in arrays}


def _origin(g: Graph, kg: Graph, i: int) -> int | None:
    """The kernel node of g that became node i of kg (kernels keep their order and body)."""
    body = kg.nodes[i].body
    for j, n in enumerate(g.nodes):
        if n.op == "kernel" and n.body is body:
            return j
    return None


def plan_decisions(p: KernelPlan) -> dict[str, object]:
    """The choices of a plan's detail that its C is written with (flags, algorithm, vector width,
    block sizes): the detail's scalar fields, as `eqfuse lower` prints them."""
    d = p.detail
    if not dataclasses.is_dataclass(d):
        return {}
    out = {}
    for f in dataclasses.fields(d):
        v = getattr(d, f.name)
        if isinstance(v, bool):
            out[f.name] = int(v)
        elif isinstance(v, (int, str)) and not isinstance(v, bool):
            out[f.name] = v
    for name in getattr(type(d), "DERIVED", ()):
        v = getattr(d, name)
        out[name] = int(v) if isinstance(v, bool) else v
    if hasattr(d, "prepack"):
        out["prepacked_b"] = int(d.prepack is not None)
    return out


def format_uops(plans: list[KernelPlan], uops: bool = True) -> str:
    """Each kernel's plan: kind, shape, bytes, FLOPs, tiles, cache constraints and the rule of
    its thread split; with `uops`, then its tile-level schedule. Last, the total uop count."""
    lines = []
    for p in plans:
        lines.append(f"{p.name}: {p.kind} -> {list(p.out_shape)}  bytes {p.bytes}  flops {p.flops}")
        if p.tiles:
            lines.append("  tiles: " + ", ".join(f"{k}={v}" for k, v in p.tiles.items()))
        if p.cache_check:
            lines.append(f"  cache: {p.cache_check}")
        if p.wanted_precision != "f32" or p.precision != "f32":
            lines.append(f"  precision: {p.precision}, path: {p.precision_path}"
                         + (f" ({p.precision_note})" if p.precision_note else ""))
        if not p.fp_contract:
            lines.append("  rounding: each multiply and add as written (fp_contract=0: a quantized model's integer path)")
        if p.threads:
            lines.append(f"  threads (decided at run time): {p.threads}")
        if p.live is not None:  # a KV cache's run-time length (eqfuse.backend.live)
            lines.append(f"  live: {p.live}")
        decisions = plan_decisions(p)
        if decisions:
            lines.append("  plan: " + ", ".join(f"{k}={v}" for k, v in decisions.items()))
        if uops:
            lines += [f"  {'  ' * u.depth}{u.op:<5} {u.what}  x{u.count}" for u in p.uops]
        else:
            lines.append(f"  uops: {sum(u.count for u in p.uops)} ({len(p.uops)} kinds; --uops lists them)")
    lines.append(f"total: {sum(u.count for p in plans for u in p.uops)} uops "
                 f"({'the x counts above' if uops else 'the counts above'}, summed)")
    return "\n".join(lines)
