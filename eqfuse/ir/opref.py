"""The op reference as text: `eqfuse ops [NAME]` and the rows of the language reference
(eqfuse/cli/langref.py), from the op table and its meanings (eqfuse.ir.opdocs)."""

from __future__ import annotations

from eqfuse.ir.opdocs import DOCS
from eqfuse.ir.ops import OPS, REQUIRED

_KIND_OF_ATTR = {"int": "int", "float": "float", "bool": "bool", "str": "string", "ints": "[int, ...]",
                 "int_or_ints": "int or [int, int]",
                 "pads2d": "int, [int, int] or [top, left, bottom, right]", "axes": "int or [int, ...]"}


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
    ops = OPS
    width = max(len(signature(op)) for op in ops.values())
    lines = []
    for op in ops.values():
        lines.append(f"{signature(op):{width}}  {op.kind}")
        lines.append(f"    {op.doc}" + (f" ({infix_note(op)})" if op.infix else ""))
    lines.append(f"{len(ops)} ops; 'eqfuse ops NAME' for one")
    return "\n".join(lines)


def detail(name: str) -> str:
    """`eqfuse ops NAME`: one op in full."""
    op = OPS[name]
    lo, hi = op.arity
    count = str(lo) if lo == hi else f"{lo} or more" if hi == -1 else f"{lo} to {hi}"
    lines = [signature(op), f"  {op.doc}", f"  kind:       {op.kind}", f"  inputs:     {count} ({inputs(op)})"]
    if op.infix:
        lines.append(f"  written:    {infix_note(op)}")
    if not op.attrs:
        lines.append("  attributes: none")
    for i, a in enumerate(op.attrs):
        default = "required" if a.default is REQUIRED else "default: omitted" if a.default is None \
            else f"default {literal(a.default)}"
        lines.append(f"  {'attributes:' if i == 0 else '':11} {a.name}= {attr_type(a)}, {default}")
    return "\n".join(lines)
