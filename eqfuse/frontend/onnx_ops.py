"""ONNX handlers for masks, indices, pooling and the activations exporters write.

Registered into eqfuse.frontend.onnx_import.HANDLERS; each turns one ONNX node into ops of the op table
(eqfuse/ir/ops_index.py). Nodes whose inputs are all constants never reach a handler: the
importer folds them (Range, ConstantOfShape and the shape arithmetic of an export).
"""

from __future__ import annotations

import math

import numpy as np

from eqfuse.frontend import onnx_symbolic as sy
from eqfuse.frontend import onnx_symbolic_ops as so
from eqfuse.frontend import pooling
from eqfuse.frontend.onnx_handlers import axes_of
from eqfuse.frontend.onnx_registry import NeedsDims, Unsupported, handles, pair
from eqfuse.ir.shapes import NUMPY_DTYPE


def _rank(imp, v) -> int:
    return v.ndim if imp.is_const(v) else imp.type(v).rank


_COMPARE = {"Equal": "eq", "Less": "lt", "LessOrEqual": "le", "Greater": "gt", "GreaterOrEqual": "ge",
            "And": "logical_and", "Or": "logical_or"}


@handles(*_COMPARE)
def _compare(imp, ins, at):
    return imp.binary(_COMPARE[imp.node.op_type], ins[0], ins[1], tuple(imp.node.input))


@handles("Xor")
def _xor(imp, ins, at):
    return imp.binary("ne", ins[0], ins[1], tuple(imp.node.input))


@handles("Not", "IsNaN")
def _not(imp, ins, at):
    name = {"Not": "logical_not", "IsNaN": "isnan"}[imp.node.op_type]
    return imp.op(name, [imp.data(ins[0], imp.node.input[0])])


def _infinite(imp, x: int) -> int:
    """Where x is +-inf: x - x is NaN there and where x is NaN."""
    return imp.op("logical_and", [imp.op("isnan", [imp.op("sub", [x, x])]), imp.op("logical_not", [imp.op("isnan", [x])])])


@handles("IsInf", attrs=("detect_negative", "detect_positive"))
def _isinf(imp, ins, at):
    """x - x is NaN where x is infinite or NaN: infinite where it is and x is not NaN (then of the
    sign asked for)."""
    x = imp.data(ins[0], imp.node.input[0])
    inf = _infinite(imp, x)
    neg, pos = at.get("detect_negative", 1), at.get("detect_positive", 1)
    if neg and pos:
        return inf
    if not (neg or pos):
        return imp.op("logical_and", [inf, imp.op("isnan", [x])])  # false everywhere, in x's shape
    return imp.op("logical_and", [inf, imp.op("lt" if neg else "gt", [x, imp.const(0.0)])])


@handles("Where")
def _where(imp, ins, at):
    r = max(_rank(imp, v) for v in ins)
    args = [imp.operand(v, n, r) if k else imp.data(v, n) for k, (v, n) in enumerate(zip(ins, imp.node.input))]
    return imp.op("where", args)


@handles("Expand")
def _expand(imp, ins, at):
    x = so.typed_data(imp, ins[0], imp.node.input[0])
    shape = tuple(imp.ints(ins[1], "shape"))
    if tuple(imp.type(x).shape) == shape:
        return x
    return imp.op("expand", [x], shape=shape)


@handles("Tile")
def _tile(imp, ins, at):
    """x repeated repeats[a] times along each axis a: the axis split in two, [.., 1, n, ..],
    expanded to [.., r, n, ..] and merged back (copy k of x at k * n); where the shape has a named
    dim, r copies of x joined along the axis."""
    x = imp.data(ins[0], imp.node.input[0])
    ds = tuple(imp.type(x).shape)
    reps = imp.ints(ins[1], "repeats")
    if len(reps) != len(ds):
        raise Unsupported(f"repeats {reps} for a tensor of rank {len(ds)}")
    if any(r < 1 for r in reps):
        raise Unsupported(f"repeats {reps} (a repeat below 1: zero-size tensors)")
    for a, r in enumerate(reps):
        if r == 1:
            continue
        cur = tuple(imp.type(x).shape)
        if any(isinstance(d, str) for d in cur):
            x = imp.op("concat", [x] * r, axis=a)
            continue
        split = imp.reshape_to(x, cur[:a] + (1,) + cur[a:])
        wide = imp.op("expand", [split], shape=cur[:a] + (r,) + cur[a:])
        x = imp.reshape_to(wide, cur[:a] + (r * cur[a],) + cur[a + 1:])
    return x


@handles("Gather", attrs=("axis",))
def _gather(imp, ins, at):
    data = imp.data(ins[0], imp.node.input[0])
    ds = imp.type(data).shape
    ax = at.get("axis", 0) % len(ds)
    if imp.is_const(ins[1]):
        idx = np.asarray(ins[1]).astype(np.int64)
        if idx.ndim == 0:  # x[..., i, ...]: a slice of one, its axis dropped
            i = int(idx) + (ds[ax] if idx < 0 and isinstance(ds[ax], int) else 0)
            one = imp.op("slice", [data], axis=ax, start=i, stop=i + 1)
            return imp.reshape_to(one, ds[:ax] + ds[ax + 1:])
        index = imp.new_param(imp.node.input[1] or "index", idx)
    else:
        index = ins[1]
        if imp.type(index).rank == 0:  # a scalar index drops the axis: gather one, then reshape it away
            one = imp.op("gather", [data, imp.op("reshape", [index], shape=(1,))], axis=ax)
            return imp.reshape_to(one, ds[:ax] + ds[ax + 1:])
    return imp.op("gather", [data, index], axis=ax)


@handles("GatherElements", attrs=("axis",))
def _gather_elements(imp, ins, at):
    return imp.op("gather_elements", [imp.data(ins[0], imp.node.input[0]), imp.data(ins[1], imp.node.input[1])],
                  axis=at.get("axis", 0))


def _flat_index(imp, idx: int, ds) -> tuple[int, int | None]:
    """The row of each index tuple idx[..., :k] (k = idx's last dim) in data's first k axes
    flattened, negative indices counting from the end of their axis; and the rows' count, None
    when a named dim is among them."""
    ishape = imp.type(idx).shape
    flat, stride = None, 1
    for i in reversed(range(ishape[-1])):
        part = imp.reshape_to(imp.op("slice", [idx], axis=-1, start=i, stop=i + 1), ishape[:-1])
        if isinstance(ds[i], int):  # a negative index counts from the end of its own axis
            part = imp.op("where", [imp.op("lt", [part, imp.const(0)]), imp.op("add", [part, imp.const(ds[i])]), part])
        term = part if stride == 1 else imp.op("mul", [part, imp.const(stride)])
        flat = term if flat is None else imp.op("add", [flat, term])
        stride = stride * ds[i] if isinstance(ds[i], int) else None
    return flat, stride


@handles("GatherND", attrs=("batch_dims",))
def _gather_nd(imp, ins, at):
    """data[idx[..., 0], ..., idx[..., k-1]] as one gather over the first k axes flattened (the
    first may be a named dim: the flattened table is then a Merged one, see onnx_symbolic)."""
    if at.get("batch_dims", 0):
        raise Unsupported("batch_dims")
    data, idx = imp.data(ins[0], imp.node.input[0]), imp.data(ins[1], imp.node.input[1])
    ds, ishape = imp.type(data).shape, imp.type(idx).shape
    k = ishape[-1]
    if not isinstance(k, int) or not all(isinstance(d, int) for d in ds[1:k]):
        raise NeedsDims("named dims in the indexed axes (but the first)")
    flat, rows = _flat_index(imp, idx, ds)
    if rows is None:
        table = sy.reshape(imp, data, [sy.product(ds[:k])] + list(ds[k:]))
        if isinstance(table, sy.Merged):
            return so.gather(imp, table, flat, 0)
    else:
        table = imp.reshape_to(data, (rows,) + tuple(ds[k:]))
    return imp.op("gather", [table, flat], axis=0)


def _reduction(at) -> str:
    """A scatter's `reduction` attribute, checked."""
    reduction = at.get("reduction", "none")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction not in SCATTER_COMBINE:
        raise Unsupported(f"reduction '{reduction}'")
    return reduction


SCATTER_COMBINE = {"none": None, "add": "add", "mul": "mul", "max": "maximum", "min": "minimum"}


@handles("ScatterND", attrs=("reduction",))
def _scatter_nd(imp, ins, at):
    """data with the slices data[idx[..., 0], ..., idx[..., k-1]] replaced by the rows of updates,
    or combined with them (`reduction`): the dynamo exporter's `index_put` and slice assignments.
    The first k axes of data must be constant; the rest may hold named dims (`_scatter`)."""
    reduction = _reduction(at)
    indices = imp.sym_nodes.get(ins[1], ins[1]) if isinstance(ins[1], int) else ins[1]
    if isinstance(indices, (sy.Sym, sy.Merged)):
        raise NeedsDims("indices computed from named dims (bind them with dims=)")
    data, updates = imp.data(ins[0], imp.node.input[0]), imp.data(ins[2], imp.node.input[2])
    ds = imp.type(data).shape
    ishape = np.shape(indices) if imp.is_const(indices) else imp.type(indices).shape
    k = ishape[-1] if ishape else 0
    if not isinstance(k, int) or not 1 <= k <= len(ds):
        raise Unsupported(f"indices of shape {list(ishape)} into data of rank {len(ds)}")
    if not all(isinstance(d, int) for d in tuple(ds[:k]) + tuple(ishape[:-1])):
        raise NeedsDims("named dims in the indexed axes or the indices")
    want = tuple(ishape[:-1]) + tuple(ds[k:])
    if tuple(imp.type(updates).shape) != want:
        raise Unsupported(f"updates of shape {list(imp.type(updates).shape)}, not {list(want)}")
    if imp.is_const(indices):
        return _scatter(imp, data, np.asarray(indices).astype(np.int64).reshape(-1, k), updates, k, reduction)
    flat, size = _flat_index(imp, indices, ds)
    return _scatter(imp, data, imp.reshape_to(flat, (math.prod(ishape[:-1]),)), updates, k, reduction)


@handles("ScatterElements", "Scatter", attrs=("axis", "reduction"))
def _scatter_elements(imp, ins, at):
    """data with each element data[i0, .., idx[i0, .., ir], .., ir] (idx along `axis`) replaced by
    updates[i0, .., ir], or combined with it (`reduction`): the exporters' `scatter` and
    `scatter_add` (a mixture of experts' gates written at their top-k experts); Scatter is its name
    before opset 11. A scatter over every axis of data (`_scatter`), whose index tuples take the
    indices along `axis` and each element's own position along the others; data's and the
    indices' shapes must be constant."""
    reduction = _reduction(at)
    data, updates = imp.data(ins[0], imp.node.input[0]), imp.data(ins[2], imp.node.input[2])
    ds = imp.type(data).shape
    indices = ins[1] if imp.is_const(ins[1]) else imp.data(ins[1], imp.node.input[1])
    ishape = np.shape(indices) if imp.is_const(indices) else imp.type(indices).shape
    ax = at.get("axis", 0) % len(ds)
    if len(ishape) != len(ds) or tuple(imp.type(updates).shape) != tuple(ishape):
        raise Unsupported(f"indices of shape {list(ishape)} and updates of shape {list(imp.type(updates).shape)} "
                          f"into data of shape {list(ds)}")
    if not all(isinstance(d, int) for d in tuple(ds) + tuple(ishape)):
        raise NeedsDims("named dims in the data or the indices")
    if any(i > d for a, (i, d) in enumerate(zip(ishape, ds)) if a != ax):
        raise Unsupported(f"indices of shape {list(ishape)} beyond data of shape {list(ds)}")
    pos = np.indices(ishape).reshape(len(ds), -1).T  # each element's own index tuple
    if imp.is_const(indices):
        pos[:, ax] = np.asarray(indices).astype(np.int64).reshape(-1)
        return _scatter(imp, data, pos, updates, len(ds), reduction)
    pos[:, ax] = 0
    strides = np.array([math.prod(ds[a + 1:]) for a in range(len(ds))])
    idx = imp.op("where", [imp.op("lt", [indices, imp.const(0)]), imp.op("add", [indices, imp.const(ds[ax])]),
                           indices])  # (a negative index counts from the end of the axis)
    flat = imp.op("add", [imp.op("mul", [idx, imp.const(int(strides[ax]))]),
                          imp.new_param("scatter_at", (pos @ strides).reshape(ishape))])
    return _scatter(imp, data, imp.reshape_to(flat, (math.prod(ishape),)), updates, len(ds), reduction)


def _scatter(imp, data, idx, updates, k: int, reduction: str):
    """data with its slices over the first k axes at idx replaced by the rows of updates (one per
    index tuple, in order), or combined with them by `reduction`:
    - idx constant (an [n, k] array, the exports' usual case): a map over the first k axes, built
      here, names the updates' row each position takes, so the result is a gather of those rows
      and a where over data, exact for every reduction. A position written twice takes the last
      write, as onnxruntime does, or combines the writes in their order (the reductions).
    - idx computed at run time (a node: the n positions in the first k axes flattened): a
      scatter_add of the rows into data, after a where has zeroed the rows written (none) or not
      (add); mul, max and min are refused there."""
    ds = imp.type(data).shape
    lead = tuple(int(d) for d in ds[:k])
    n = len(idx) if isinstance(idx, np.ndarray) else imp.type(idx).shape[0]
    rows = imp.reshape_to(updates, (n,) + tuple(ds[k:]))
    if not isinstance(idx, np.ndarray):
        if reduction not in ("none", "add"):
            raise Unsupported(f"reduction '{reduction}' with indices computed at run time")
        size = math.prod(lead)
        table = imp.reshape_to(data, (size,) + tuple(ds[k:]))
        if reduction == "none":
            count = imp.op("scatter_add", [imp.new_param("scatter_count", np.zeros(size, np.float32)), idx,
                                           imp.new_param("scatter_one", np.ones(n, np.float32))], axis=0)
            written = imp.reshape_to(imp.op("gt", [count, imp.const(0)]), (size,) + (1,) * (len(ds) - k))
            table = imp.op("where", [written, imp.const(0), table])
        return imp.reshape_to(imp.op("scatter_add", [table, idx, rows], axis=0), tuple(ds))
    idx = np.where(idx < 0, idx + np.array(lead), idx)
    if ((idx < 0) | (idx >= np.array(lead))).any():
        raise Unsupported(f"indices outside the indexed axes {list(lead)}")
    pos = np.ravel_multi_index(tuple(idx.T), lead)
    # a reduction's writes to one position combine in their order: round r takes each position's
    # r-th write (none: one round, of each position's last write)
    order = np.argsort(pos, kind="stable")
    first = np.searchsorted(pos[order], pos[order])
    nth = np.empty(n, np.int64)
    nth[order] = np.arange(n) - first
    rounds = [np.arange(n)] if SCATTER_COMBINE[reduction] is None else [np.flatnonzero(nth == r) for r in range(nth.max() + 1)]
    for writes in rounds:
        row = np.full(math.prod(lead), -1, np.int64)
        np.maximum.at(row, pos[writes], writes)  # the last write wins
        written = (row >= 0).reshape(lead + (1,) * (len(ds) - k))
        taken = imp.op("gather", [rows, imp.new_param("scatter_rows", np.maximum(row, 0).reshape(lead))], axis=0)
        if SCATTER_COMBINE[reduction] is not None:
            taken = imp.op(SCATTER_COMBINE[reduction], [data, taken])
        data = imp.op("where", [imp.new_param("scatter_written", written), taken, data])
    return data


@handles("CumSum", attrs=("exclusive", "reverse"))
def _cumsum(imp, ins, at):
    (axis,) = imp.ints(ins[1], "axis")
    return imp.op("cumsum", [imp.data(ins[0], imp.node.input[0])], axis=axis,
                  exclusive=bool(at.get("exclusive", 0)), reverse=bool(at.get("reverse", 0)))


@handles("ArgMax", "ArgMin", attrs=("axis", "keepdims", "select_last_index"))
def _argmax(imp, ins, at):
    """ArgMin as the argmax of -x: the first of the smallest, as the first of the largest."""
    if at.get("select_last_index", 0):
        raise Unsupported("select_last_index")
    x = imp.data(ins[0], imp.node.input[0])
    if imp.node.op_type == "ArgMin":
        x = imp.op("neg", [x])
    return imp.op("argmax", [x], axis=at.get("axis", 0), keepdims=bool(at.get("keepdims", 1)))


@handles("TopK", attrs=("axis", "largest", "sorted"))
def _topk(imp, ins, at):
    """Values and indices of the k largest (smallest) along the axis, in order (sorted=0 allows any
    order: this one is as good as any); equal values in index order, as the ONNX spec asks."""
    x = imp.data(ins[0], imp.node.input[0])
    (k,) = imp.ints(ins[1], "K")
    kw = dict(k=k, axis=at.get("axis", -1), largest=bool(at.get("largest", 1)))
    return [imp.op("topk", [x], **kw), imp.op("topk", [x], **kw, indices=True)]


@handles("ReduceProd", "ReduceL2", "ReduceL1", "ReduceLogSum", "ReduceLogSumExp",
         attrs=("axes", "keepdims", "noop_with_empty_axes"))
def _reduce_more(imp, ins, at):
    """The reductions written with the op table's: L1 as sum(abs), L2 as sqrt(sum(x * x)), LogSum
    as log(sum), LogSumExp as onnxruntime computes it, shifted by the maximum (the maximum taken as
    0 where it is infinite, so that a row of -inf gives -inf and one holding +inf gives +inf)."""
    x = imp.data(ins[0], imp.node.input[0])
    axes = axes_of(imp, ins, at, 1)
    if not axes and at.get("noop_with_empty_axes", 0):
        return x
    axis = tuple(axes) if axes else None
    keep = bool(at.get("keepdims", 1))
    t = imp.node.op_type
    if t == "ReduceProd":
        return imp.op("prod", [x], axis=axis, keepdims=keep)
    if t == "ReduceL2":
        return imp.op("sqrt", [imp.op("sum", [imp.op("mul", [x, x])], axis=axis, keepdims=keep)])
    if t == "ReduceL1":
        return imp.op("sum", [imp.op("abs", [x])], axis=axis, keepdims=keep)
    if t == "ReduceLogSum":
        return imp.op("log", [imp.op("sum", [x], axis=axis, keepdims=keep)])
    def finite_max(keepdims: bool) -> int:
        m = imp.op("max", [x], axis=axis, keepdims=keepdims)
        return imp.op("where", [_infinite(imp, m), imp.const(0.0), m])

    m = finite_max(True)
    total = imp.op("sum", [imp.op("exp", [imp.op("sub", [x, m])])], axis=axis, keepdims=keep)
    return imp.op("add", [imp.op("log", [total]), m if keep else finite_max(False)])


@handles("Trilu", attrs=("upper",))
def _trilu(imp, ins, at):
    k = imp.ints(ins[1], "k")[0] if len(ins) > 1 and ins[1] is not None else 0
    return imp.op("triu" if at.get("upper", 1) else "tril", [imp.data(ins[0], imp.node.input[0])], k=k)


@handles("Pad", attrs=("mode", "pads", "value"))
def _pad(imp, ins, at):
    if at.get("mode", "constant") != "constant":
        raise Unsupported(f"mode '{at['mode']}'")
    x = imp.data(ins[0], imp.node.input[0])
    rank = imp.type(x).rank
    pads = list(at["pads"]) if "pads" in at else imp.ints(ins[1], "pads")
    value, computed = at.get("value", 0.0), None
    if len(ins) > 2 and ins[2] is not None:
        if imp.is_const(ins[2]):
            value = float(np.asarray(ins[2]).reshape(()))
        else:  # a value computed in the graph (a quantized model's: the zero point dequantized)
            computed = imp.data(ins[2], imp.node.input[2])
            if math.prod(imp.type(computed).shape) != 1:
                raise Unsupported("constant_value of more than one element")
            computed = imp.reshape_to(computed, ())
    if len(ins) > 3 and ins[3] is not None:  # axes: pads only for those
        axes = [a % rank for a in imp.ints(ins[3], "axes")]
        full = [0] * (2 * rank)
        for j, a in enumerate(axes):
            full[a], full[rank + a] = pads[j], pads[len(axes) + j]
        pads = full
    if min(pads) < 0:
        raise Unsupported("negative pads (cropping)")
    if not any(pads):
        return x
    if computed is None:
        return imp.op("pad", [x], pads=tuple(pads), value=float(value))
    # zeros padded, then the value where the pads are: a mask over the padded axes only
    shape = imp.type(x).shape
    padded = [a for a in range(rank) if pads[a] or pads[rank + a]]
    if not all(isinstance(shape[a], int) for a in padded):
        raise NeedsDims("padding along a named dim with a computed constant_value")
    border = np.ones([shape[a] + pads[a] + pads[rank + a] if a in padded else 1 for a in range(rank)], bool)
    border[tuple(slice(pads[a], pads[a] + shape[a]) if a in padded else slice(None) for a in range(rank))] = False
    return imp.op("where", [imp.new_param("pad_border", border), computed,
                            imp.op("pad", [x], pads=tuple(pads), value=0.0)])


@handles("MaxPool", "AveragePool", attrs=("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides",
                                          "storage_order", "count_include_pad"))
def _pool(imp, ins, at):
    """1-D and 2-D pooling with any pads, auto_pad and ceil_mode (eqfuse.frontend.pooling)."""
    x = imp.data(ins[0], imp.node.input[0])
    shape = imp.type(x).shape
    nd = len(shape) - 2
    if nd not in (1, 2):
        raise Unsupported(f"{nd}-d pooling")
    if any(d != 1 for d in at.get("dilations", [1] * nd)) or len([o for o in imp.node.output if o]) > 1:
        raise Unsupported("dilations or the indices output")
    if not all(isinstance(d, int) for d in shape[2:]):
        raise NeedsDims(f"pooling over the named dims {list(shape[2:])} (bind them with dims=)")
    kernel = list(at["kernel_shape"])
    stride = list(at.get("strides", [1] * nd))
    auto = at.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        got = [pooling.same_pads(n, k, s, auto == "SAME_UPPER") for n, k, s in zip(shape[2:], kernel, stride)]
        begins, ends = [b for b, _ in got], [e for _, e in got]
    elif auto in ("NOTSET", "VALID"):
        pads = list(at.get("pads", [0] * 2 * nd)) if auto == "NOTSET" else [0] * 2 * nd
        begins, ends = pads[:nd], pads[nd:]
    else:
        raise Unsupported(f"auto_pad '{auto}'")
    if len(kernel) != nd or len(stride) != nd or len(begins) != nd or len(ends) != nd:
        raise ValueError(f"a {nd}-d pool with kernel_shape {kernel}, strides {stride}, pads {begins + ends}")
    dtype = imp.type(x).dtype
    # (QOperator's MaxPool on u8 / i8: on them, as ONNX's; its padding their least value)
    least = float(np.iinfo(NUMPY_DTYPE[dtype]).min) if dtype in ("u8", "i8") else float("-inf")
    kind = "max" if imp.node.op_type == "MaxPool" else "avg"
    return pooling.pool(lambda name, args, **attrs: imp.op(name, args, **attrs),
                        lambda shp: imp.new_param("pool_ones", np.ones(shp, np.float32)), x, shape, kind, kernel,
                        stride, begins, ends, bool(at.get("ceil_mode", 0)), bool(at.get("count_include_pad", 0)),
                        least)


@handles("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(imp, ins, at):
    x = imp.data(ins[0], imp.node.input[0])
    axis = tuple(range(2, imp.type(x).rank))
    return imp.op("mean" if imp.node.op_type == "GlobalAveragePool" else "max", [x], axis=axis, keepdims=True)


@handles("Clip", attrs=("min", "max"))
def _clip(imp, ins, at):
    x = imp.data(ins[0], imp.node.input[0])
    given = [ins[k] if len(ins) > k else None for k in (1, 2)]
    if any(v is not None and not imp.is_const(v) for v in given):  # bounds computed at run time
        for k, (v, name) in enumerate(zip(given, ("maximum", "minimum"))):
            if v is not None:
                x = imp.binary(name, x, v, ("", imp.node.input[k + 1]))
        return x
    lo, hi = (float(np.asarray(v).reshape(())) if v is not None else at.get(n) for v, n in zip(given, ("min", "max")))
    return imp.op("clip", [x], min=lo, max=hi)


@handles("LeakyRelu", attrs=("alpha",))
def _leaky(imp, ins, at):
    return imp.op("leaky_relu", [imp.data(ins[0], imp.node.input[0])], alpha=at.get("alpha", 0.01))


@handles("HardSigmoid", attrs=("alpha", "beta"))
def _hard_sigmoid(imp, ins, at):
    return imp.op("hard_sigmoid", [imp.data(ins[0], imp.node.input[0])], alpha=at.get("alpha", 0.2),
                  beta=at.get("beta", 0.5))


@handles("HardSwish", "Softplus")
def _unary_act(imp, ins, at):
    name = {"HardSwish": "hard_swish", "Softplus": "softplus"}[imp.node.op_type]
    return imp.op(name, [imp.data(ins[0], imp.node.input[0])])


SELU_ALPHA, SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875  # ONNX's defaults


@handles("Elu", "Selu", "Celu", "ThresholdedRelu", "Softsign", "Mish", "Shrink",
         attrs=("alpha", "gamma", "lambd", "bias"))
def _composed_act(imp, ins, at):
    """The activations onnxruntime computes in one op, written with the op table's (the optimizer
    fuses each into the pointwise kernel around it), as the ONNX spec defines them."""
    x, op, c = imp.data(ins[0], imp.node.input[0]), imp.node.op_type, imp.const

    def f(name, *args):
        return imp.op(name, list(args))

    if op in ("Elu", "Selu"):
        alpha = at.get("alpha", 1.0 if op == "Elu" else SELU_ALPHA)
        y = f("where", f("gt", x, c(0.0)), x, f("mul", c(alpha), f("sub", f("exp", x), c(1.0))))
        return y if op == "Elu" else f("mul", y, c(at.get("gamma", SELU_GAMMA)))
    if op == "Celu":  # max(0, x) + min(0, alpha * (exp(x / alpha) - 1))
        alpha = at.get("alpha", 1.0)
        return f("add", f("relu", x), f("minimum", c(0.0), f("mul", c(alpha), f("sub", f("exp", f("div", x, c(alpha))),
                                                                              c(1.0)))))
    if op == "ThresholdedRelu":
        return f("where", f("gt", x, c(at.get("alpha", 1.0))), x, c(0.0))
    if op == "Softsign":
        return f("div", x, f("add", f("abs", x), c(1.0)))
    if op == "Mish":
        return f("mul", x, f("tanh", f("softplus", x)))
    lambd, bias = at.get("lambd", 0.5), at.get("bias", 0.0)  # Shrink
    return f("where", f("lt", x, c(-lambd)), f("add", x, c(bias)),
             f("where", f("gt", x, c(lambd)), f("sub", x, c(bias)), c(0.0)))


@handles("Einsum", attrs=("equation",))
def _einsum(imp, ins, at):
    """Two explicit operands and an output, as models write them ("bhid,bhjd->bhij",
    "td,dnh->tnh", "ij,kj->ik", "bi,bj->bij"): one batched matmul. The indices in both operands
    and the output are its batch; those in both and not the output are contracted (several
    flattened into one); those of one operand are its rows or columns (several flattened); an
    index of one operand alone that the output drops is summed first."""
    eq = at["equation"].replace(" ", "")
    if "->" not in eq or "." in eq or len(ins) != 2:
        raise Unsupported(f"equation '{eq}' (two explicit operands and an output are supported)")
    lhs, out = eq.split("->")
    a_s, b_s = lhs.split(",")
    if any(len(set(t)) != len(t) for t in (a_s, b_s, out)) or not set(out) <= set(a_s) | set(b_s):
        raise Unsupported(f"equation '{eq}' (a repeated index, or an output index of no operand)")
    a = imp.data(ins[0], imp.node.input[0])
    b = imp.data(ins[1], imp.node.input[1])
    a, a_s = _sum_alone(imp, a, a_s, b_s + out)
    b, b_s = _sum_alone(imp, b, b_s, a_s + out)
    batch = [c for c in out if c in a_s and c in b_s]
    k = [c for c in a_s if c in b_s and c not in out]
    m = [c for c in a_s if c not in b_s]
    n = [c for c in b_s if c not in a_s]
    dims = {**dict(zip(b_s, imp.type(b).shape)), **dict(zip(a_s, imp.type(a).shape))}
    a = _grouped(imp, _permuted(imp, a, a_s, batch + m + k), batch, [m, k], dims, eq)
    b = _grouped(imp, _permuted(imp, b, b_s, batch + k + n), batch, [k, n], dims, eq)
    y = imp.op("matmul", [a, b])
    y = imp.reshape_to(y, tuple(imp.type(y).shape[:len(batch)]) + tuple(dims[c] for c in m + n))
    return _permuted(imp, y, "".join(batch + m + n), list(out))


def _sum_alone(imp, x: int, have: str, others: str):
    """x summed over the indices no other operand nor the output has; (x, its indices)."""
    alone = [i for i, c in enumerate(have) if c not in others]
    if not alone:
        return x, have
    return imp.op("sum", [x], axis=tuple(alone), keepdims=False), "".join(c for c in have if c in others)


def _grouped(imp, x: int, batch: list[str], groups: list[list[str]], dims: dict, eq: str) -> int:
    """x (batch then the groups' indices in order) reshaped to batch + one dim per group (the
    product of its dims; 1 for an empty group)."""
    shape = imp.type(x).shape
    want = list(shape[:len(batch)])
    for g in groups:
        if len(g) == 1:
            want.append(dims[g[0]])
        elif all(isinstance(dims[c], int) for c in g):
            want.append(math.prod(dims[c] for c in g))
        else:
            raise NeedsDims(f"equation '{eq}' flattens the named dims of {''.join(g)} (bind them with dims=)")
    return imp.reshape_to(x, tuple(want))


def _permuted(imp, x, have: str, want: list[str]):
    perm = tuple(have.index(c) for c in want)
    return x if perm == tuple(range(len(perm))) else imp.op("transpose", [x], perm=perm)


# Resize's coordinate transforms (x_resized -> x_original) and nearest roundings, in float32 as
# onnxruntime computes them (upsamplebase.h), so the indices and weights are the ones it uses.
_RESIZE_COORDS = {
    "half_pixel": lambda xr, s, n_in, n_out: (xr + np.float32(0.5)) / s - np.float32(0.5),
    "pytorch_half_pixel": lambda xr, s, n_in, n_out: ((xr + np.float32(0.5)) / s - np.float32(0.5)
                                                      if n_out > 1 else np.zeros_like(xr)),
    "align_corners": lambda xr, s, n_in, n_out: (xr * np.float32(n_in - 1) / np.float32(n_out - 1)
                                                 if n_out > 1 else np.zeros_like(xr)),
    "asymmetric": lambda xr, s, n_in, n_out: xr / s,
}


def _round_half_away(x):
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))


_RESIZE_NEAREST = {
    "round_prefer_floor": lambda x: np.where(x == np.trunc(x) + np.float32(0.5), np.floor(x), _round_half_away(x)),
    "round_prefer_ceil": lambda x: np.where(x == np.trunc(x) + np.float32(0.5), np.ceil(x), _round_half_away(x)),
    "floor": np.floor,
    "ceil": np.ceil,
}


def resize_axis(mode: str, coord: str, nearest: str, n_in: int, n_out: int, scale: float,
                cubic_a: float = -0.75, exclude_outside: bool = False):
    """One axis of a resize: for "nearest" the input index of each output position; for "linear"
    and "cubic" its taps, [(index, weight), ...]: output position k is the sum of x[index[k]]
    weight[k] over the taps. The coordinate of an output position in the input is `coord`'s
    transform at `scale` (float32): nearest rounds it by `nearest`, then clamps; linear clamps it
    into the input and takes its two neighbours; cubic takes the four around it (indices past
    the edge read the edge element, or with `exclude_outside` weigh 0, the others renormalized),
    weighted by Keys' cubic convolution with coefficient `cubic_a` (ONNX's reference resize)."""
    xr = np.arange(n_out, dtype=np.float32)
    x = _RESIZE_COORDS[coord](xr, np.float32(scale), n_in, n_out).astype(np.float32)
    if mode == "nearest":
        return np.clip(_RESIZE_NEAREST[nearest](x), 0, n_in - 1).astype(np.int64)
    if mode == "cubic":
        lo = np.floor(x)
        t = (x - lo).astype(np.float64)
        a = cubic_a
        near = lambda d: ((a + 2) * d - (a + 3)) * d * d + 1  # noqa: E731  |d| <= 1
        far = lambda d: ((a * d - 5 * a) * d + 8 * a) * d - 4 * a  # noqa: E731  1 < |d| < 2
        w = np.stack([far(1 + t), near(t), near(1 - t), far(2 - t)])
        idx = lo.astype(np.int64)[None, :] + np.arange(-1, 3)[:, None]
        if exclude_outside:
            w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
            w = w / w.sum(axis=0, keepdims=True)
        idx = np.clip(idx, 0, n_in - 1)
        return [(i, wt.astype(np.float32)) for i, wt in zip(idx, w)]
    x = np.clip(x, np.float32(0), np.float32(n_in - 1))
    i0 = np.minimum(np.trunc(x), n_in - 1).astype(np.int64)
    i1 = np.minimum(i0 + 1, n_in - 1)
    w1 = np.abs(x - i0.astype(np.float32))
    w0 = np.abs(x - i1.astype(np.float32))
    same = i0 == i1  # (at the last input position both weights are 1/2 of the same element)
    w0, w1 = np.where(same, np.float32(0.5), w0), np.where(same, np.float32(0.5), w1)
    return [(i0, w0.astype(np.float32)), (i1, w1.astype(np.float32))]


def resize(imp, x: int, axes_sizes: list[tuple[int, int, float]], mode: str, coord: str, nearest: str,
           new_param, cubic_a: float = -0.75, exclude_outside: bool = False) -> int:
    """x resized along each (axis, output size, scale) by gathers along the axis: nearest, one
    gather of the indices resize_axis gives; linear and cubic, a gather per tap, weighted and
    added (bilinear and bicubic are the two axes one after the other). `new_param(base, array)`
    makes a constant input of the graph (the index and weight vectors). An axis that keeps its
    size and positions is left out."""
    for a, n_out, scale in axes_sizes:
        shape = imp.type(x).shape
        n_in, rank = shape[a], len(shape)
        got = resize_axis(mode, coord, nearest, n_in, n_out, scale, cubic_a, exclude_outside)
        ident = np.arange(n_in)
        if mode == "nearest":
            if n_out == n_in and np.array_equal(got, ident):
                continue
            x = imp.op("gather", [x, new_param("resize_index", got)], axis=a)
            continue
        taps = [(i, w) for i, w in got if w.any()]
        if n_out == n_in and len(taps) == 1 and np.array_equal(taps[0][0], ident) and np.all(taps[0][1] == 1):
            continue
        bshape = (n_out,) + (1,) * (rank - 1 - a)
        terms = [imp.op("mul", [imp.op("gather", [x, new_param("resize_index", i)], axis=a),
                                new_param("resize_weight", w.reshape(bshape))]) for i, w in taps]
        x = terms[0]
        for term in terms[1:]:
            x = imp.op("add", [x, term])
    return x


@handles("Resize", attrs=("mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a",
                          "exclude_outside", "extrapolation_value", "antialias", "axes",
                          "keep_aspect_ratio_policy"))
def _resize(imp, ins, at):
    """Resize in modes nearest, linear and cubic, the coordinate transforms half_pixel, asymmetric,
    align_corners and pytorch_half_pixel and every nearest_mode, with constant scales or sizes
    (eqfuse.frontend.onnx_ops.resize): what upsampling heads export. Anything else is refused
    by name."""
    if imp.opset < 11:
        raise Unsupported(f"Resize of opset {imp.opset} (its coordinates before opset 11)")
    mode = at.get("mode", "nearest")
    coord = at.get("coordinate_transformation_mode", "half_pixel")
    nearest = at.get("nearest_mode", "round_prefer_floor")
    if mode not in ("nearest", "linear", "cubic"):
        raise Unsupported(f"mode '{mode}'")
    if coord not in _RESIZE_COORDS:
        raise Unsupported(f"coordinate_transformation_mode '{coord}'")
    if nearest not in _RESIZE_NEAREST:
        raise Unsupported(f"nearest_mode '{nearest}'")
    if at.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise Unsupported(f"keep_aspect_ratio_policy '{at['keep_aspect_ratio_policy']}'")
    x = imp.data(ins[0], imp.node.input[0])
    shape = imp.type(x).shape
    rank = len(shape)
    axes = [a % rank for a in at.get("axes", range(rank))]
    scales_in = ins[2] if len(ins) > 2 and imp.node.input[2] else None
    sizes_in = ins[3] if len(ins) > 3 and imp.node.input[3] else None
    if sizes_in is not None:
        sizes = imp.ints(sizes_in, "sizes")
        if len(sizes) != len(axes):
            raise ValueError(f"sizes {sizes} for {len(axes)} axes")
        scales = None
    elif scales_in is not None and imp.is_const(scales_in) and np.asarray(scales_in).size:
        scales = [float(s) for s in np.asarray(scales_in, np.float32).reshape(-1)]
        if len(scales) != len(axes):
            raise ValueError(f"scales {scales} for {len(axes)} axes")
    elif scales_in is not None and not imp.is_const(scales_in):
        raise Unsupported("non-constant input scales")
    else:
        raise ValueError("neither scales nor sizes given")
    plan = []
    for k, a in enumerate(axes):
        if not isinstance(shape[a], int):
            raise NeedsDims(f"resizing the named dim '{shape[a]}' (bind it with dims=)")
        if scales is None:
            n_out, scale = sizes[k], float(np.float32(sizes[k]) / np.float32(shape[a]))
        else:
            scale = scales[k]
            n_out = int(np.float32(shape[a]) * np.float32(scale))
        if n_out < 1 or scale <= 0:
            raise ValueError(f"axis {a} resized from {shape[a]} to {n_out} (scale {scale})")
        if at.get("antialias", 0) and mode != "nearest" and n_out < shape[a]:
            raise Unsupported("antialias=1 when downsampling")
        plan.append((a, n_out, scale))
    return resize(imp, x, plan, mode, coord, nearest, imp.new_param, float(at.get("cubic_coeff_a", -0.75)),
                  bool(at.get("exclude_outside", 0)))
