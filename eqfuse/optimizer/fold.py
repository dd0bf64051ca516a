"""Folding bound constants: an inference batchnorm after a conv2d becomes the conv's weights and bias.

Runs in `eqfuse.compile` after `params=` are bound and before the optimizer. Batchnorm is, per
output channel o, an affine map y -> (y - mean) * s + beta with s = gamma / sqrt(var + eps), and
conv2d is linear in each output channel's weights (conv2d(x, w)[:, o] * s[o] = conv2d(x, w * s)[:, o]), so

    batchnorm(conv2d(x, w[, b]) [+ c], mean, var, gamma, beta, eps)
        = conv2d(x, w * s[:, None, None, None], (b + c - mean) * s + beta)

where b is the conv's own bias and c a constant added after it that is the same within a channel
(a scalar, or shaped [C, 1, 1] / [1, C, 1, 1]). It folds only when w, b, c, mean, var, gamma and
beta are all bound (params= or ONNX initializers) and the conv (and the add) feed nothing else;
otherwise the graph is left as it is. The new weight and bias are computed once here in float64,
stored as float32, and join the bound params under fresh names (`w_bn`, `w_bn_bias`); params
that nothing reads any more leave the graph, so the compiled callable still takes only the
unbound inputs. The optimizer then sees an ordinary conv2d with a bias.

Why a Python pass and not a `.rw` rule: the rewrite makes new arrays out of the params' values,
and the e-graph knows tensors by name and shape only, never by value (a rule's `const(?x)` is a
scalar literal). A rule that spelled out the algebra (`?w * reshape(?g * rsqrt(?v + ?eps), ...)`)
would leave that arithmetic in the compiled graph, to run on every call.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

import numpy as np

from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.ops import OPS, OpKind
from eqfuse.ir.shapes import TType
from eqfuse.optimizer.cost import unfused


@dataclass
class Folded:
    graph: Graph
    params: dict[str, np.ndarray]  # the bound arrays: the source graph's and the folded graph's
    notes: list[str]  # one line per fold, for the report


@dataclass(frozen=True)
class _ConvBN:
    """A batchnorm node whose input is a conv2d with every constant bound."""

    bn: int
    conv: int
    w: np.ndarray
    bias: np.ndarray  # the conv's bias plus the per-channel constant added after it ([C])
    bias_names: tuple[str, ...]  # where the bias came from, for the report


def fold_params(g: Graph, params: Mapping[str, np.ndarray]) -> Folded:
    """Fold every batchnorm after a conv2d whose constants are all bound (repeated: bn(bn(conv)) folds
    too), and every gather whose bound indices select each element once, in order (a reshape)."""
    g = unfused(g)  # see through hand-written kernel blocks, as the optimizer that runs next does
    params, notes = dict(params), []
    while (m := _find_conv_bn(g, params)) is not None:
        g, note = _fold(g, params, m)
        notes.append(note)
    g, gathers = _identity_gathers(g, params)
    g, quantized = _quantized_constants(g, params)
    return Folded(g, params, notes + gathers + quantized)


QUANT_OPS = ("quantize_linear", "dequantize_linear")


def _quantized_constants(g: Graph, params: dict[str, np.ndarray]) -> tuple[Graph, list[str]]:
    """g with each quantize_linear and dequantize_linear of bound operands (params, literals, or
    nodes folded before it) that no contraction reads replaced by a bound param of its value,
    computed once here by the op table's numpy implementation (the f32 steps the kernel's C takes:
    ir.ops_quant, onnxruntime's semantics), so that it runs on no call.

    quantize_static writes a Gemm's bias as DequantizeLinear of an int32 initializer, an Add's
    constant operand and a LayerNorm's weight and bias as DequantizeLinear of u8, i8 or int32
    initializers (and a Mul's or Add's literal as QuantizeLinear of it, then DequantizeLinear):
    each was a kernel of its own, run on every call, or an operand a kernel dequantized per
    element. The dequantization of a weight that a matmul or conv reads (directly or through a
    transpose) stays when it is per tensor: the rules matmul_dequantized, gemm_dequantized and
    conv_dequantized turn that contraction into the integer GEMM of its integers. A per-channel
    one, which those rules do not take, folds too: its contraction runs in f32 on the bound f32
    weight instead of dequantizing it on every call. Found here and not by a rule for
    fold_params' reason: the e-graph knows a tensor by name, not by value."""
    readers: list[list[int]] = [[] for _ in g.nodes]
    for i, n in enumerate(g.nodes):
        for a in n.args:
            readers[a].append(i)
    values: dict[int, np.ndarray] = {}
    for i, n in enumerate(g.nodes):
        if n.op not in QUANT_OPS or i in g.outputs or not all(isinstance(d, int) for d in n.type.shape):
            continue
        args = [values[a] if a in values else _bound(g, a, params) for a in n.args]
        per_tensor = all(g.nodes[a].type.rank == 0 for a in n.args[1:])
        if any(a is None for a in args) or (per_tensor and any(_reads_as_operand(g, r, readers) for r in readers[i])):
            continue
        values[i] = np.ascontiguousarray(OPS[n.op].numpy(args, n.attr))
    keep = {i for i in values if any(r not in values for r in readers[i])}  # (the others feed only folded nodes)
    if not keep:
        return g, []
    out, ids, notes = Graph(g.name, pos=g.pos), {}, []
    for i in g.inputs:
        ids[i] = out.add(g.nodes[i])
    new = []
    for i in sorted(keep):
        n = g.nodes[i]
        first = g.nodes[n.args[0]]
        name = _fresh(f"{first.name if first.op == 'input' else 'q'}_{'dq' if n.op == 'dequantize_linear' else 'q'}",
                      g, params)
        params[name] = values[i]
        new.append(out.add(Node("input", type=TType(tuple(values[i].shape), n.type.dtype), name=name)))
        ids[i] = new[-1]
        args = ", ".join(_label(g, a) if g.nodes[a].op in ("input", "const") else g.nodes[a].op for a in n.args)
        notes.append(f"{n.op}({args}) -> {name} (bound: computed once)")
    out.inputs = [ids[i] for i in g.inputs] + new
    for i, n in enumerate(g.nodes):
        if i not in ids and i not in values and n.op != "input":  # (a folded node not kept is dead)
            ids[i] = out.add(replace(n, args=tuple(ids[a] for a in n.args)))
    out.outputs = [ids[o] for o in g.outputs]
    return drop_unused_params(out, params), notes


def _reads_as_operand(g: Graph, r: int, readers: list[list[int]]) -> bool:
    """Whether node r is a contraction, or a view (transpose, reshape) that one reads."""
    n = g.nodes[r]
    if n.op in OPS and OPS[n.op].kind == OpKind.CONTRACTION:
        return True
    return n.op in ("transpose", "reshape") and any(_reads_as_operand(g, u, readers) for u in readers[r])


def _identity_gathers(g: Graph, params: Mapping[str, np.ndarray]) -> tuple[Graph, list[str]]:
    """g with each gather(x, idx, axis) whose idx is bound and, flattened, is 0 .. n - 1 (n the
    axis's length, negative indices counted from its end) replaced by reshape(x) to the gather's
    shape: that gather reads every element once, in order, so it is a view.

    An exported attention mask reads its padding mask so: transformers' `mask[batch_idx, kv_idx]`
    becomes a gather of the flattened [B x total] mask at the indices b x total + j, computed from
    the shapes and bound once the dims are (a decoder step's). As a gather it is an index kernel
    over the whole mask at every call; as a view the mask's cast fuses into its reader, the
    attention, which over a KV cache reads only the live keys' (eqfuse.backend.live). Found here
    and not by a rule for fold_params' reason: the e-graph knows the indices by name, not value."""
    notes, swap = [], {}
    for i, n in enumerate(g.nodes):
        if n.op != "gather":
            continue
        x, idx = (g.nodes[a] for a in n.args)
        ax = n.attr["axis"] % x.type.rank
        v = _bound(g, n.args[1], params)
        size = x.type.shape[ax]
        if v is None or not isinstance(size, int) or not np.issubdtype(np.asarray(v).dtype, np.integer) \
                or np.asarray(v).size != size or not all(isinstance(d, int) for d in n.type.shape):
            continue
        flat = np.asarray(v).ravel()
        if np.array_equal(np.where(flat < 0, flat + size, flat), np.arange(size)):
            swap[i] = Node("reshape", (n.args[0],), (("shape", tuple(n.type.shape)),), n.type, n.name, n.pos)
            notes.append(f"gather({_label(g, n.args[0]) if x.op == 'input' else 'x'}, {idx.name}) -> reshape "
                         f"(its indices are 0 .. {size - 1} in order)")
    if not swap:
        return g, notes
    nodes = [swap.get(i, n) for i, n in enumerate(g.nodes)]
    return drop_unused_params(Graph(g.name, nodes, list(g.inputs), list(g.outputs), g.pos), params), notes


def _bound(g: Graph, i: int, params: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """The value of node i when it is known at compile time: a bound param or a scalar literal."""
    n = g.nodes[i]
    if n.op == "input" and n.name in params:
        return params[n.name]
    if n.op == "const":
        return np.float32(n.value)
    return None


def _channel_vector(c: np.ndarray, channels: int) -> np.ndarray | None:
    """c as a [C] vector when adding it to an NCHW tensor adds one number per channel, else None."""
    if c.ndim > 4:
        return None
    c4 = c.reshape((1,) * (4 - c.ndim) + c.shape)
    if c4.shape[0] != 1 or c4.shape[2:] != (1, 1) or c4.shape[1] not in (1, channels):
        return None
    return np.broadcast_to(c4[0, :, 0, 0], (channels,))


def _find_conv_bn(g: Graph, params: Mapping[str, np.ndarray]) -> _ConvBN | None:
    users = g.users()
    for i, n in enumerate(g.nodes):
        if n.op == "batchnorm" and all(_bound(g, a, params) is not None for a in n.args[1:]):
            conv = _conv_source(g, n.args[0], params, users)
            if conv is not None:
                return _ConvBN(i, *conv)
    return None


def _conv_source(g: Graph, i: int, params: Mapping[str, np.ndarray], users: list[int]):
    """(conv node, w, bias [C], bias labels) when node i is conv2d(x, w[, b]) or conv2d(...) + c
    with w, b and c bound and every node on the way read only once; else None."""
    n = g.nodes[i]
    if users[i] != 1:
        return None
    if n.op == "conv2d":
        w, *own = (_bound(g, a, params) for a in n.args[1:])
        if w is None or any(b is None for b in own):
            return None
        return i, w, sum(own, np.zeros(w.shape[0])), tuple(_label(g, b) for b in n.args[2:])
    if n.op == "add":
        for a, c in (n.args, n.args[::-1]):
            conv = _conv_source(g, a, params, users) if g.nodes[a].op == "conv2d" else None
            cv = _bound(g, c, params)
            vec = None if conv is None or cv is None else _channel_vector(cv, conv[1].shape[0])
            if vec is not None:
                return conv[0], conv[1], conv[2] + vec, conv[3] + (_label(g, c),)
    return None


def _fold(g: Graph, params: dict[str, np.ndarray], m: _ConvBN) -> tuple[Graph, str]:
    """The graph with batchnorm node m.bn replaced by conv2d(x, w', b'); w' and b' join params."""
    bn, conv = g.nodes[m.bn], g.nodes[m.conv]
    mean, var, gamma, beta = (np.asarray(_bound(g, a, params), np.float64) for a in bn.args[1:])
    scale = gamma / np.sqrt(var + bn.attr["eps"])
    w_name = g.nodes[conv.args[1]].name
    new = {
        _fresh(f"{w_name}_bn", g, params): m.w * scale[:, None, None, None],
        _fresh(f"{w_name}_bn_bias", g, params): (m.bias - mean) * scale + beta,
    }
    params.update({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in new.items()})

    out, ids = Graph(g.name, pos=g.pos), {}
    for i in g.inputs:
        ids[i] = out.add(g.nodes[i])
    w_id, b_id = (out.add(Node("input", type=TType(params[k].shape), name=k)) for k in new)
    out.inputs = [ids[i] for i in g.inputs] + [w_id, b_id]
    for i, n in enumerate(g.nodes):
        if i == m.bn:
            ids[i] = out.add(replace(conv, args=(ids[conv.args[0]], w_id, b_id), type=bn.type,
                                     name=bn.name, pos=bn.pos))
        elif n.op != "input":
            ids[i] = out.add(replace(n, args=tuple(ids[a] for a in n.args)))
    out.outputs = [ids[o] for o in g.outputs]
    stats = ", ".join(_label(g, a) for a in bn.args[1:])
    bias = "".join(f" + {b}" for b in m.bias_names)
    note = f"batchnorm(conv2d(..., {w_name}){bias}, {stats}) -> conv2d(..., {', '.join(new)})"
    return drop_unused_params(out, params), note


def _label(g: Graph, i: int) -> str:
    n = g.nodes[i]
    return n.name if n.op == "input" else repr(float(n.value))


def _fresh(base: str, g: Graph, taken: Mapping[str, object]) -> str:
    names = {n.name for _, _, n in g.walk()} | set(taken)
    name, k = base, 1
    while name in names:
        k += 1
        name = f"{base}{k}"
    return name


def drop_unused_params(g: Graph, params: Mapping[str, np.ndarray]) -> Graph:
    """g without dead nodes and without the bound params nothing reads (free inputs all stay)."""
    live = [False] * len(g.nodes)
    for o in g.outputs:
        live[o] = True
    for i in reversed(range(len(g.nodes))):
        if live[i]:
            for a in g.nodes[i].args:
                live[a] = True
    keep = [i for i, n in enumerate(g.nodes) if live[i] or (n.op == "input" and n.name not in params)]
    ids = {old: new for new, old in enumerate(keep)}
    nodes = [replace(g.nodes[i], args=tuple(ids[a] for a in g.nodes[i].args)) for i in keep]
    return Graph(g.name, nodes, [ids[i] for i in g.inputs if i in ids], [ids[o] for o in g.outputs], g.pos)
