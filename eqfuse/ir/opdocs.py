"""The op reference: one line of meaning per op of the op table, and its text for `eqfuse ops [NAME]`
(and for the README's language reference, eqfuse/cli/langref.py).

The meanings live here, not in eqfuse/ir/ops.py, so that the table stays a table; `ops._op` copies
them into `Op.doc`. An op without an entry here fails tests/test_opdocs.py. This module imports
nothing from eqfuse at the top: ops.py imports DOCS from it.
"""

from __future__ import annotations

# name -> (the inputs as written in a call, one line of meaning)
DOCS: dict[str, tuple[str, str]] = {
    "neg": ("x", "-x"),
    "abs": ("x", "|x|"),
    "relu": ("x", "max(x, 0)"),
    "sigmoid": ("x", "1 / (1 + exp(-x))"),
    "tanh": ("x", "hyperbolic tangent"),
    "exp": ("x", "e to the power x"),
    "log": ("x", "natural logarithm"),
    "sqrt": ("x", "square root"),
    "rsqrt": ("x", "1 / sqrt(x)"),
    "erf": ("x", "the Gauss error function"),
    "silu": ("x", "x * sigmoid(x) (swish)"),
    "gelu": ("x", 'x * Phi(x), Phi the normal CDF: through erf ("none") or the tanh approximation ("tanh")'),
    "add": ("a, b", "a + b, numpy broadcasting"),
    "sub": ("a, b", "a - b, numpy broadcasting"),
    "mul": ("a, b", "a * b, numpy broadcasting"),
    "div": ("a, b", "a / b, numpy broadcasting; integers truncate toward 0, an integer divided by 0 gives 0"),
    "pow": ("a, b", "a to the power b, numpy broadcasting"),
    "maximum": ("a, b", "the larger of a and b, elementwise, numpy broadcasting"),
    "minimum": ("a, b", "the smaller of a and b, elementwise, numpy broadcasting"),
    "floordiv": ("a, b", "a / b rounded down (numpy's floor_divide); an integer divided by 0 gives 0"),
    "mod": ("a, b", "a - floordiv(a, b) * b, with the sign of b (numpy's remainder); an integer mod 0 gives 0"),
    "matmul": ("a, b", "numpy.matmul: [..., M, K] @ [..., K, N] -> [..., M, N], rank >= 2, batch dims broadcast"),
    "conv2d": ("x, w[, b]", "2-D convolution (cross-correlation): x NCHW, w OIHW, bias b[O]; "
                            "stride and padding an int or [h, w]"),
    "sum": ("x", "sum over `axis` (every axis when omitted); keepdims=true keeps them as size 1"),
    "mean": ("x", "mean over `axis` (every axis when omitted); keepdims=true keeps them as size 1"),
    "max": ("x", "maximum over `axis` (every axis when omitted); keepdims=true keeps them as size 1"),
    "softmax": ("x", "exp(x - max) / sum(exp(x - max)) along `axis`"),
    "layernorm": ("x, gamma, beta", "(x - mean) / sqrt(var + eps) * gamma + beta over the dims from `axis` "
                                    "to the end (gamma, beta have their shape)"),
    "rmsnorm": ("x, gamma", "x / sqrt(mean(x * x) + eps) * gamma over the last axis"),
    "batchnorm": ("x, mean, var, gamma, beta", "inference batch norm over channel axis 1: "
                                               "(x - mean) / sqrt(var + eps) * gamma + beta"),
    "transpose": ("x", "permute the axes by `perm` (omitted: reverse them)"),
    "reshape": ("x", "the same elements in a new shape; one -1 is inferred (free: a view)"),
    "slice": ("x", "x[start:stop:step] along `axis`, Python's rules for negative bounds (stop omitted: the end; step >= 1)"),
    "concat": ("x0, x1, ...", "join the inputs along `axis`; every other dimension must agree"),
    # masks, indices and the ops exporters write
    "eq": ("a, b", "a == b elementwise (bool); also written a == b"),
    "ne": ("a, b", "a != b elementwise (bool); also written a != b"),
    "lt": ("a, b", "a < b elementwise (bool); also written a < b"),
    "le": ("a, b", "a <= b elementwise (bool); also written a <= b"),
    "gt": ("a, b", "a > b elementwise (bool); also written a > b"),
    "ge": ("a, b", "a >= b elementwise (bool); also written a >= b"),
    "logical_and": ("a, b", "a and b, of bool tensors"),
    "logical_or": ("a, b", "a or b, of bool tensors"),
    "logical_not": ("a", "not a, of a bool tensor"),
    "isnan": ("x", "whether x is NaN (bool)"),
    "where": ("cond, a, b", "a where the bool cond is true, else b (numpy broadcasting)"),
    "cast": ("x", 'x converted to the dtype to= ("f32", "i64", "i32", "bool"; nonzero is true)'),
    "expand": ("x", "x broadcast to shape= (numpy broadcasting of x with that shape)"),
    "clip": ("x", "x limited to [min, max] (either bound optional); NaN stays NaN"),
    "leaky_relu": ("x", "x where x >= 0, else alpha * x"),
    "hard_sigmoid": ("x", "clip(alpha * x + beta, 0, 1)"),
    "hard_swish": ("x", "x * clip(x / 6 + 1 / 2, 0, 1)"),
    "softplus": ("x", "log(1 + exp(x)), without overflow"),
    "min": ("x", "the smallest element over axis= (all axes by default)"),
    "prod": ("x", "the product of the elements over axis= (all axes by default)"),
    "gather": ("data, indices", "data's slices at the integer indices along axis= (an embedding lookup); "
                                "negative indices count from the end"),
    "scatter_add": ("x, indices, updates", "x with each slice of updates added at its index along axis= "
                                           "(repeated indices add up): the inverse of gather, its gradient"),
    "gather_elements": ("data, indices", "out[i][j] = data[i][indices[i][j]] along axis= (take_along_axis)"),
    "cumsum": ("x", "running sum along axis= (exclusive=, reverse= as in ONNX CumSum)"),
    "argmax": ("x", "the index (i64) of the largest element along axis=; the first NaN wins"),
    "range": ("", "start, start + step, ... below stop (dtype= i64, i32 or f32): position ids"),
    "tril": ("x", "x with the elements above diagonal k= set to 0 (last two axes)"),
    "triu": ("x", "x with the elements below diagonal k= set to 0 (last two axes)"),
    "pad": ("x", "x padded with value= by pads= (every axis's begin, then every axis's end)"),
    "max_pool2d": ("x", "the largest of each kernel_size window of NCHW x (stride=, padding=)"),
    "avg_pool2d": ("x", "the mean of each kernel_size window of NCHW x (count_include_pad=)"),
    "pool2d_grad": ("x, dy", "the gradient of max_pool2d (mode=\"max\": dy to each window's first largest "
                             "element) or avg_pool2d (mode=\"avg\") with respect to x"),
    "scatter_elements_add": ("x, indices, updates", "x with each element of updates added at its index along "
                                                    "axis= (repeated indices add up): the gradient of gather_elements"),
    "softmax_grad": ("dy, y", "the gradient of y = softmax(x, axis=) with respect to x: y * (dy - sum(dy * y))"),
    "layernorm_grad": ("dy, x, gamma", "the gradient of layernorm(x, gamma, beta, axis=, eps=) with respect to x"),
    "attention_dq": ("q, k, v, dy[, mask]", "the gradient of softmax(q @ k^T * scale= + mask) @ v with respect "
                                            "to q, the probabilities recomputed (never stored)"),
    "attention_dk": ("q, k, v, dy[, mask]", "the gradient of softmax(q @ k^T * scale= + mask) @ v with respect "
                                            "to k, the probabilities recomputed"),
    "attention_dv": ("q, k, dy[, mask]", "the gradient of softmax(q @ k^T * scale= + mask) @ v with respect to v: "
                                         "softmax(...)^T @ dy, the probabilities recomputed"),
    "squeeze": ("x", "x without the size-1 axes axis= (all size-1 axes by default); a reshape"),
    "unsqueeze": ("x", "x with size-1 axes inserted at axis=; a reshape"),
    "flatten": ("x", "x as a matrix: the axes before axis= times the rest; a reshape"),
}

_KIND_OF_ATTR = {"int": "int", "float": "float", "bool": "bool", "str": "string", "ints": "[int, ...]",
                 "int_or_ints": "int or [int, int]", "axes": "int or [int, ...]"}


def _table():
    from eqfuse.ir.ops import OPS

    return OPS


def literal(v) -> str:
    """A value as it is written in a .g file."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(literal(x) for x in v) + "]"
    return f"{v:g}" if isinstance(v, float) else str(v)


def inputs(op) -> str:
    if op.name in DOCS:
        return DOCS[op.name][0]
    lo, hi = op.arity
    if hi == -1:
        return ", ".join(f"x{i}" for i in range(max(lo, 2))) + ", ..."
    names = ["x"] if hi == 1 else [f"x{i}" for i in range(hi)]
    return ", ".join(names[:lo]) + "".join(f"[, {n}]" for n in names[lo:])


def attr_type(a) -> str:
    return " or ".join(f'"{c}"' for c in a.choices) if a.choices else _KIND_OF_ATTR.get(a.kind, a.kind)


def attr_text(a) -> str:
    """`eps=1e-05`; a required attribute `axis=int`; one whose default means 'omitted' `[perm=[int, ...]]`."""
    from eqfuse.ir.ops import REQUIRED

    if a.default is REQUIRED:
        return f"{a.name}={attr_type(a)}"
    if a.default is None:
        return f"[{a.name}={attr_type(a)}]"
    return f"{a.name}={literal(a.default)}"


def signature(op) -> str:
    return f"{op.name}({', '.join([inputs(op)] + [attr_text(a) for a in op.attrs])})"


def infix_note(op) -> str:
    if not op.infix:
        return ""
    return "prefix `-x`" if op.arity == (1, 1) else f"infix `a {op.infix} b`"


def summary() -> str:
    """`eqfuse ops`: every op, two lines each."""
    ops = _table()
    width = max(len(signature(op)) for op in ops.values())
    lines = []
    for op in ops.values():
        lines.append(f"{signature(op):{width}}  {op.kind}")
        lines.append(f"    {op.doc}" + (f" ({infix_note(op)})" if op.infix else ""))
    lines.append(f"{len(ops)} ops; 'eqfuse ops NAME' for one")
    return "\n".join(lines)


def detail(name: str) -> str:
    """`eqfuse ops NAME`: one op in full."""
    op = _table()[name]
    lo, hi = op.arity
    count = str(lo) if lo == hi else f"{lo} or more" if hi == -1 else f"{lo} to {hi}"
    lines = [signature(op), f"  {op.doc}", f"  kind:       {op.kind}", f"  inputs:     {count} ({inputs(op)})"]
    if op.infix:
        lines.append(f"  written:    {infix_note(op)}")
    if not op.attrs:
        lines.append("  attributes: none")
    for i, a in enumerate(op.attrs):
        from eqfuse.ir.ops import REQUIRED

        default = "required" if a.default is REQUIRED else "default: omitted" if a.default is None \
            else f"default {literal(a.default)}"
        lines.append(f"  {'attributes:' if i == 0 else '':11} {a.name}= {attr_type(a)}, {default}")
    return "\n".join(lines)
