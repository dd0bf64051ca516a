"""The ONNX ops over the values of eqfuse/frontend/onnx_symbolic.py: `sym_op` folds a node with
a Sym input (shape arithmetic over a named dim), `merged_op` imports a node reading a Merged
tensor (a named dim multiplied with others), `gather` reads a Merged table. The importer calls
them before its handlers (eqfuse/frontend/onnx_import.py, import_node).
"""

from __future__ import annotations

import numpy as np

from eqfuse.frontend.onnx_registry import HANDLERS, NeedsDims, Unsupported, tensor_array
from eqfuse.frontend.onnx_symbolic import (
    Merged,
    Sym,
    SymDim,
    arange,
    broadcast_to,
    divide,
    entries,
    is_sym,
    merged,
    product,
    reshape,
    split,
    sym,
)

# ---------------------------------------------------------------- ops on Merged tensors


def merged_op(imp, ins, at):
    """The ops a Merged tensor may flow through; anything else is an error naming its shape."""
    op = imp.node.op_type
    m = next(v for v in ins if isinstance(v, Merged))
    if op in ("Identity", "Dropout"):
        return ins[0]
    if op == "Shape":
        s = m.shape[slice(at.get("start", 0), at.get("end"))]
        return sym(s)
    if op == "Reshape" and ins[0] is m and not isinstance(ins[1], Merged):
        spec = list(at["shape"]) if "shape" in at else entries(ins[1], "shape")[0]
        return reshape(imp, m, spec, bool(at.get("allowzero", 0)))
    if op == "Flatten" and ins[0] is m:
        shape, axis = m.shape, at.get("axis", 1)
        axis = axis + len(shape) if axis < 0 else axis
        return reshape(imp, m, [product(shape[:axis]), product(shape[axis:])])
    if op == "DynamicQuantizeLinear":  # one scale and zero point over all of x: its layout does not matter
        y, scale, zp = HANDLERS[op][0](imp, [m.node], at)
        return [merged(y, m.groups), scale, zp]
    if op in ("Gemm", "MatMul", "MatMulInteger") and ins[0] is m and all(not isinstance(v, Merged) for v in ins[1:]):
        if at.get("transA", 0) or len(m.groups[-1]) != 1:
            raise NeedsDims(f"{op} contracting a dim made of a named dim ({m})")
        y = HANDLERS[op][0](imp, [m.node] + list(ins[1:]), at)
        return merged(y, m.groups[:-1] + ((imp.type(y).shape[-1],),))
    if op == "MatMul" and all(isinstance(v, Merged) for v in ins):
        a, b = ins
        if a.groups[:-2] != b.groups[:-2] or any(len(g) != 1 for g in a.groups[-2:] + b.groups[-2:]):
            raise Unsupported(f"MatMul of tensors of shapes {a} and {b}")
        y = imp.op("matmul", [a.node, b.node])
        return merged(y, a.groups[:-2] + a.groups[-2:-1] + b.groups[-1:])
    if op == "Transpose":
        rank = len(m.groups)
        perm = list(at.get("perm", range(rank - 1, -1, -1)))
        starts = [sum(len(g) for g in m.groups[:k]) for k in range(rank)]
        phys = [starts[p] + j for p in perm for j in range(len(m.groups[p]))]
        y = m.node if phys == sorted(phys) else imp.op("transpose", [m.node], perm=tuple(phys))
        return merged(y, [m.groups[p] for p in perm])
    if op in POINTWISE:
        # elementwise over the physical form: the other operands laid out alike, or broadcasting
        # along its trailing dims that are one physical axis each
        phys = [_physical(imp, v, m) for v in ins]
        if all(p is not False for p in phys):
            return merged(HANDLERS[op][0](imp, phys, at), m.groups)
    if op == "Gather" and ins[0] is m and not isinstance(ins[1], (Merged, Sym)):
        return gather(imp, m, ins[1], at.get("axis", 0))
    raise NeedsDims(f"{op} of a tensor of shape {m} (a named dim multiplied with others; bind it with dims=)")


POINTWISE = {"Cast", "Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Sqrt", "Neg", "Abs", "Log", "Gelu", "Reciprocal",
             "Sin", "Cos", "Sign", "Ceil", "Floor",
             "Add", "Sub", "Mul", "Div", "Pow", "Where", "Not", "IsNaN", "Equal", "Less", "Greater", "And", "Or"}


def _physical(imp, v, m: Merged):
    """v as an operand of an elementwise op with m in m's physical form, or False when it cannot
    be one: None; a Merged of the same groups (its node); a constant or tensor whose dims other
    than 1 are m's trailing dims that are one physical axis each (a scalar, a bias along the last
    axis: quantize_dynamic's computed scale and its bias add after an integer GEMM over batch x
    sequence rows), without its leading 1s, so that it broadcasts against m's physical shape."""
    if v is None:
        return None
    if isinstance(v, Merged):
        return v.node if v.groups == m.groups else False
    if isinstance(v, Sym):
        return False
    shape = tuple(v.shape) if imp.is_const(v) else tuple(imp.type(v).shape)
    lead = next((k for k, d in enumerate(shape) if d != 1), len(shape))
    tail = shape[lead:]
    if len(shape) > len(m.groups) or any(len(g) != 1 for g in m.groups[len(m.groups) - len(tail):]):
        return False
    if not lead:
        return v
    return v.reshape(tail) if imp.is_const(v) else imp.reshape_to(v, tail)


def gather(imp, m: Merged, index, axis: int):
    """Gather along logical axis of a Merged table: along one physical axis when the logical one
    is a single dim; else the flat index i splits into (i // G, i % G) over the group's trailing
    int G (reshape merges consecutive ints, so a group is at most a named dim and one int), and a
    gather then a gather_elements read the physical element."""
    rank = len(m.groups)
    axis %= rank
    idx = imp.data(index, imp.node.input[1])
    ishape = tuple(imp.type(idx).shape)
    pos = sum(len(g) for g in m.groups[:axis])
    group = m.groups[axis]
    if len(group) == 1:
        y = imp.op("gather", [m.node, idx], axis=pos)
        return merged(y, m.groups[:axis] + tuple((d,) for d in ishape) + m.groups[axis + 1:])
    if len(group) != 2 or not isinstance(group[1], int) or imp.type(idx).dtype not in ("i64", "i32"):
        raise NeedsDims(f"Gather along dim {product(group)} of a tensor of shape {m}")
    q, r = _floordiv(imp, idx, group[1])
    pre = tuple(d for g in m.groups[:axis] for d in g)
    post = tuple(d for g in m.groups[axis + 1:] for d in g)
    y = imp.op("gather", [m.node, q], axis=pos)  # pre + ishape + (G,) + post
    e = broadcast_to(imp, imp.reshape_to(r, ishape + (1,) * (1 + len(post))), list(pre + ishape + (1,) + post))
    y = imp.reshape_to(imp.op("gather_elements", [y, e], axis=pos + len(ishape)), pre + ishape + post)
    return merged(y, m.groups[:axis] + tuple((d,) for d in ishape) + m.groups[axis + 1:])


def _floordiv(imp, i: int, G: int) -> tuple[int, int]:
    """(i // G, i % G) of an integer tensor, floored as Python does (a negative flat index counts
    from the end): the op table's floordiv and mod."""
    return imp.op("floordiv", [i, imp.const(G)]), imp.op("mod", [i, imp.const(G)])


# ---------------------------------------------------------------- ops on Sym values

_CMP = {"Equal": lambda a, b: a == b, "Less": lambda a, b: a < b, "Greater": lambda a, b: a > b,
        "LessOrEqual": lambda a, b: a <= b, "GreaterOrEqual": lambda a, b: a >= b}


def _arith(op: str, a: SymDim, b: SymDim):
    """One entry of Mul/Div/Add/Sub; None when the result is no SymDim (batch + 1, batch / 3)."""
    if not is_sym(a) and not is_sym(b):
        a, b = int(a), int(b)
        return {"Mul": a * b, "Add": a + b, "Sub": a - b, "Div": a // b if b and a % b == 0 else None}[op]
    if op in ("Mul", "Div"):
        r = product([a, b]) if op == "Mul" else divide(a, b)
        return r if r is None or not is_sym(r) or split(r)[0] > 0 else None  # -batch: computed at run time
    if op in ("Add", "Sub") and not is_sym(b) and int(b) == 0:
        return a
    if op == "Add" and not is_sym(a) and int(a) == 0:
        return b
    return None


def _compare(op: str, a: SymDim, b: SymDim):
    """A comparison known from dims being positive (batch == -1 is false), else None."""
    if not is_sym(a) and not is_sym(b):
        return _CMP[op](int(a), int(b))
    if a == b:
        return op in ("Equal", "LessOrEqual", "GreaterOrEqual")
    if is_sym(a) and is_sym(b):
        return None
    sym_first = is_sym(a)
    v = int(b if sym_first else a)
    if v >= 1:
        return None  # batch == 16 is not known at import time
    lo = {"Equal": False, "Less": False, "LessOrEqual": False, "Greater": True, "GreaterOrEqual": True}
    hi = {"Equal": False, "Less": True, "LessOrEqual": True, "Greater": False, "GreaterOrEqual": False}
    return (lo if sym_first else hi)[op]


def _zip(ins, what):
    (a, sa), (b, sb) = entries(ins[0], what), entries(ins[1], what)
    n = max(len(a), len(b))
    if len(a) not in (1, n) or len(b) not in (1, n):
        raise ValueError(f"cannot broadcast {len(a)} with {len(b)} entries")
    return [(a[k % len(a)], b[k % len(b)]) for k in range(n)], sa and sb


def sym_op(imp, ins, at):
    """The node's outputs with a Sym among its inputs, or None: then the importer computes the
    Sym at run time (materialize) and imports the node as ops."""
    op = imp.node.op_type
    v = ins[0]
    # a Sym read as a shape, by an op over data
    if op == "Reshape" and isinstance(ins[1], Sym):
        return reshape(imp, imp.data(v, imp.node.input[0]) if not isinstance(v, Merged) else v,
                       list(ins[1].vals), bool(at.get("allowzero", 0)))
    if op == "Expand" and isinstance(ins[1], Sym) and not isinstance(v, (Sym, Merged)):
        return broadcast_to(imp, typed_data(imp, v, imp.node.input[0]), list(ins[1].vals))
    if op == "ConstantOfShape" and isinstance(v, Sym):
        value = at.get("value")
        arr = np.zeros((), np.float32) if value is None else tensor_array(value, "the value of ConstantOfShape").reshape(())
        return broadcast_to(imp, imp.data(arr) if arr.dtype.kind == "f" else _int_scalar(imp, arr), list(v.vals))
    if op == "Range" and isinstance(ins[1], Sym):
        if not (imp.is_const(ins[0]) and imp.is_const(ins[2])):
            raise Unsupported(f"Range up to {ins[1]} from a start or with a step not known at import time")
        if np.asarray(ins[0]).ndim or np.asarray(ins[2]).ndim or not ins[1].scalar:
            raise ValueError("Range needs scalar start, limit and delta")
        start, delta = int(np.asarray(ins[0])), int(np.asarray(ins[2]))
        if start != 0 or delta != 1:
            raise NeedsDims(f"Range({start}, {ins[1]}, {delta}) (only Range(0, n, 1) up to a named dim)")
        return arange(imp, ins[1].vals[0], "i64" if np.asarray(ins[0]).dtype != np.int32 else "i32")
    # Dropout, Identity and Cast pass a Sym on; every other op folds only over Syms and constants
    if op in ("Identity", "Dropout"):
        return v
    if any(x is not None and not isinstance(x, Sym) and not imp.is_const(x) for x in ins):
        return None
    if op == "Cast":
        return v if isinstance(v, Sym) and at.get("to") in (6, 7) else None
    if op == "Shape" and isinstance(v, Sym):
        return np.asarray([len(v.vals)] if not v.scalar else [], np.int64)[slice(at.get("start", 0), at.get("end"))]
    if op == "Gather" and isinstance(v, Sym) and not isinstance(ins[1], Sym):
        idx = np.asarray(ins[1]).astype(np.int64)
        if not all(-len(v.vals) <= i < len(v.vals) for i in idx.reshape(-1)):
            raise ValueError(f"index {idx.tolist()} out of range for {len(v.vals)} entries")
        picked = [v.vals[int(i)] for i in idx.reshape(-1)]
        return sym(picked, idx.ndim == 0) if idx.ndim <= 1 else None
    if op == "Slice" and isinstance(v, Sym) and len(ins) >= 3 and all(not isinstance(x, Sym) for x in ins[1:]):
        lo, hi = int(np.asarray(ins[1]).reshape(-1)[0]), int(np.asarray(ins[2]).reshape(-1)[0])
        step = int(np.asarray(ins[4]).reshape(-1)[0]) if len(ins) > 4 and ins[4] is not None else 1
        return sym(v.vals[lo:hi:step], False)
    if op in ("Unsqueeze", "Squeeze") and isinstance(v, Sym):
        axes = list(at["axes"]) if "axes" in at else (entries(ins[1], "axes")[0] if len(ins) > 1 and ins[1] is not None else None)
        if op == "Unsqueeze" and v.scalar and axes in ([0], [-1]):
            return Sym(v.vals)
        if op == "Squeeze" and not v.scalar and len(v.vals) == 1 and axes in (None, [0], [-1]):
            return Sym(v.vals, True)
        return None
    if op == "Expand" and isinstance(v, Sym) and not isinstance(ins[1], Sym):
        shape = entries(ins[1], "shape")[0]
        if len(shape) > 1 or (shape and shape[0] != 1 and len(v.vals) not in (1, shape[0])):
            return None
        n = max([len(v.vals)] + shape) if not v.scalar or shape else 1
        return Sym(tuple(v.vals[k % len(v.vals)] for k in range(n)), v.scalar and not shape)
    if op == "Concat" and all(isinstance(x, Sym) or np.asarray(x).ndim == 1 for x in ins):
        return sym([d for x in ins for d in entries(x, "a Concat input")[0]])
    if op == "Reshape" and isinstance(v, Sym):
        spec = list(at["shape"]) if "shape" in at else entries(ins[1], "shape")[0]
        if isinstance(ins[1], Sym) or len(spec) > 1:
            return None
        return Sym(v.vals, True) if not spec and len(v.vals) == 1 else Sym(v.vals)
    # a constant of more than one axis beside a shape value (a mask's batch positions, arange(batch)
    # with the batch bound, times the sequence length): not a shape, computed at run time
    many = any(not isinstance(x, (Sym, Merged)) and x is not None and np.asarray(x).ndim > 1 for x in ins)
    if op in ("Mul", "Div", "Add", "Sub") and not any(isinstance(x, Merged) for x in ins):
        if many or any(not isinstance(x, Sym) and np.asarray(x).dtype.kind not in "iu" for x in ins):
            return None
        pairs, scalar = _zip(ins, op)
        out = [_arith(op, a, b) for a, b in pairs]
        return None if any(o is None for o in out) else sym(out, scalar)
    if op in _CMP and not many:
        pairs, scalar = _zip(ins, op)
        out = [_compare(op, a, b) for a, b in pairs]
        if any(o is None for o in out):
            return None
        arr = np.asarray(out, bool)
        return arr.reshape(()) if scalar else arr
    if op == "Where" and not isinstance(ins[0], Sym) and all(not isinstance(x, Merged) for x in ins):
        cond = np.asarray(ins[0])
        if cond.ndim > 1:
            return None
        (a, _), (b, _) = entries(ins[1], "Where"), entries(ins[2], "Where")
        n = max(len(a), len(b), cond.size)
        c = np.broadcast_to(cond.reshape(-1), (n,))
        return sym([a[k % len(a)] if c[k] else b[k % len(b)] for k in range(n)], cond.ndim == 0 and len(a) == len(b) == 1)
    return None


def _int_scalar(imp, arr: np.ndarray) -> int:
    """An integer or bool scalar as a node of its dtype (a weak const would compute in float)."""
    one = imp.new_param("fill", arr.reshape(1))
    return imp.op("reshape", [one], shape=())


def typed_data(imp, v, name: str) -> int:
    """imp.data(v), but an integer or bool scalar constant keeps its dtype (the dynamo exporter's
    token type ids: an i64 zero expanded to [batch, sequence], then a Gather's indices)."""
    if imp.is_const(v) and np.asarray(v).ndim == 0 and np.asarray(v).dtype.kind in "iub":
        return _int_scalar(imp, np.asarray(v))
    return imp.data(v, name)
