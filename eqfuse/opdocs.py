"""The op reference: one line of meaning per op of the op table, and its text for `eqfuse ops [NAME]`
(and for the README's language reference, eqfuse/langref.py).

The meanings live here, not in eqfuse/ops.py, so that the table stays a table; `ops._op` copies
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
    "div": ("a, b", "a / b, numpy broadcasting"),
    "pow": ("a, b", "a to the power b, numpy broadcasting"),
    "maximum": ("a, b", "the larger of a and b, elementwise, numpy broadcasting"),
    "minimum": ("a, b", "the smaller of a and b, elementwise, numpy broadcasting"),
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
    "slice": ("x", "x[start:stop] along `axis`, Python's rules for negative bounds (stop omitted: the end)"),
    "concat": ("x0, x1, ...", "join the inputs along `axis`; every other dimension must agree"),
}

_KIND_OF_ATTR = {"int": "int", "float": "float", "bool": "bool", "str": "string", "ints": "[int, ...]",
                 "int_or_ints": "int or [int, int]", "axes": "int or [int, ...]"}


def _table():
    from .ops import OPS

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
    from .ops import REQUIRED

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
    return f"prefix `-x`" if op.arity == (1, 1) else f"infix `a {op.infix} b`"


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
        from .ops import REQUIRED

        default = "required" if a.default is REQUIRED else "default: omitted" if a.default is None \
            else f"default {literal(a.default)}"
        lines.append(f"  {'attributes:' if i == 0 else '':11} {a.name}= {attr_type(a)}, {default}")
    return "\n".join(lines)
