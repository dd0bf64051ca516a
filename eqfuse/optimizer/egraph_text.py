"""The egglog program text of a graph: canonical values, the declarations (sorts, constructors
per op, shape-fact and heavy-weight rules) and one graph as facts. The encoding is described in
eqfuse/optimizer/egraph.py."""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

from eqfuse.errors import EqfuseError
from eqfuse.ir.graph import Graph
from eqfuse.ir.ops import OPS
from eqfuse.ir.ops_quant import RANGE_SCALARS

RULESET = "eqf"


# ---------------------------------------------------------------- canonical text of values


def num_text(v: float) -> str:
    """The shortest text of v rounded to float32 (integers without a point)."""
    f = np.float32(v)
    if np.isnan(f):
        return "nan"
    if np.isinf(f):
        return "inf" if f > 0 else "-inf"
    s = np.format_float_positional(f, unique=True, trim="-") if abs(f) >= 1e-4 or f == 0 else \
        np.format_float_scientific(f, unique=True, trim="-")
    if s in ("-0", "-0."):
        return "-0"
    return s


def text_num(s: str) -> float:
    return float(s)


NONE = "null"  # an attribute left at None (not the string "none", gelu's approximate="none")


def attr_text(kind: str, v: Any) -> str:
    if v is None:
        return NONE
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(attr_text("int", x) for x in v) + "]"
    if kind == "float":
        return num_text(v)
    return str(int(v))


def text_attr(kind: str, s: str) -> Any:
    if s == NONE:
        return None
    if kind == "bool":
        return s == "true"
    if kind == "str":
        return s
    if kind == "float":
        return float(s)
    if s.startswith("["):
        inner = s[1:-1].strip()
        return tuple(int(x) for x in inner.split(",")) if inner else ()
    return int(s)


def dim_text(d) -> str:
    return str(d)


def shape_text(shape) -> str:
    return "[" + ", ".join(dim_text(d) for d in shape) + "]"


def q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _variadic(op: str) -> bool:
    lo, hi = OPS[op].arity
    return lo != hi


def t_ctor(op: str, nargs: int) -> str:
    return f"o_{op}__{nargs}" if _variadic(op) else f"o_{op}"


def s_ctor(op: str, nargs: int) -> str:
    return f"s_{op}__{nargs}" if _variadic(op) else f"s_{op}"


# ---------------------------------------------------------------- the declarations


def declarations(concat_arities: Iterable[int] = (), t_ops=None, s_ops=None) -> str:
    """The sorts, the constructors and the `facts` rules (shape facts, heavy weights) of the
    tensor ops in `t_ops` and the kernel-body ops in `s_ops` (default: every op). Those of ops no
    e-node can have are left out (eqfuse.optimizer.egraph.reachable_ops)."""
    lines = [
        "(datatype T (In String) (Cn String))",
        "(datatype S (L T) (Cs String))",
        "(constructor K (S) T)",
        "(datatype R (Out i64 T))",
        "(function orig (T) i64 :merge (min old new))",
        "(function nd (i64) T :merge old)",
        "(function rank (T) i64 :merge old)",
        "(function dim (T i64) String :merge old)",
        "(function dimn (T i64) i64 :merge old)",
        "(function shape (T) String :merge old)",
        "(function size (T) String :merge old)",
        "(function sizen (T) i64 :merge old)",
        "(function cval (T) f64 :merge old)",
        "(function hv (S) i64 :merge (min old new))",
        "(relation vw (S))",
        "(ruleset facts)",
    ]
    for op in OPS.values():
        na = len(op.attrs)
        arities = sorted(set(concat_arities) | {1, 2}) if op.name == "concat" else \
            range(op.arity[0], op.arity[1] + 1)
        for n in arities:
            targs = " ".join(["T"] * n + ["String"] * na)
            sargs = " ".join(["S"] * n + ["String"] * na)
            if t_ops is None or op.name in t_ops:
                lines.append(f"(constructor {t_ctor(op.name, n)} ({targs}) T)")
            if s_ops is None or op.name in s_ops:
                lines.append(f"(constructor {s_ctor(op.name, n)} ({sargs}) S)")
    lines += _fact_rules(t_ops) + _heavy_rules(concat_arities, s_ops)
    return "\n".join(lines)


# (RANGE_SCALARS: DynamicQuantizeLinear's scale and zero point of dynamic_range's two floats, C
# expressions of those two floats that the kernel reading them computes, eqfuse.ir.kernels.range_scalar)
def heavy_weight(op: str) -> int:
    """1 for an op that is not pointwise (a kernel body may hold one), else 0."""
    return 0 if OPS[op].kind in ("pointwise", "channel") or op in RANGE_SCALARS else 1


# A candidate kernel body may hold at most one heavy op, except on the way to attention
# (softmax(q @ k^T ...) @ v holds three). A view -- a tensor in memory read through transposes
# and reshapes (vw) -- is a way of reading it (x @ transpose(w)), not a heavy op. These are the backend's kernel shapes
# (eqfuse.ir.kernels.classify), applied while rules grow kernels so illegal bodies are not grown
# further; extraction checks every candidate with classify itself.
HEAVY_LIMIT = 1
HEAVY_LIMIT_ATTENTION = 3  # when the kernel's root op is softmax or matmul
# layernorm / rmsnorm at the root: a matmul may be its prologue (a GEMM with a row epilogue). Such
# a kernel still weighs two, so pointwise ops after the row op do not join it here (letting a row
# op over a GEMM weigh one grew BERT-base x12's e-graph from 3.5k e-nodes to the node limit);
# they do in a hand-written kernel block.
HEAVY_LIMIT_ROW = 2
# a conv2d reading a kernel body (rules fuse_dw_pw, fuse_pw_dw): the whole inverted residual, its
# expand 1x1 conv, depthwise conv and projection 1x1 conv, weighs three (fuse_pw_dw joins only a
# depthwise conv to the kernel it reads, so a chain of three convs forms only around one)
HEAVY_LIMIT_PROLOGUE = 3
# a layernorm over the NHWC transpose of a conv2d inside the body (rules fuse_dw_ln_mm*: ConvNeXt's
# depthwise conv, permute, layernorm and Linear) weighs four
HEAVY_LIMIT_CONVNORM = 4
VIEW_OPS = ("transpose", "reshape")


def _heavy_rules(concat_arities, s_ops=None) -> list[str]:
    out = ["(rule ((= ?e (L ?t))) ((set (hv ?e) 0) (vw ?e)) :ruleset facts)",
           "(rule ((= ?e (Cs ?c))) ((set (hv ?e) 0)) :ruleset facts)"]
    if s_ops is None or {"matmul", "softmax"} <= set(s_ops):
        # a whole attention softmax(...) @ v weighs one, so a pointwise epilogue may join it
        out.append(f"(rule ((= ?e ({s_ctor('matmul', 2)} ?p ?v)) (= ?p ({s_ctor('softmax', 1)} ?x ?a ?z)) (vw ?v)) "
                   "((set (hv ?e) 1)) :ruleset facts)")
    for op in OPS.values():
        if s_ops is not None and op.name not in s_ops:
            continue
        na = len(op.attrs)
        arities = sorted(set(concat_arities) | {1, 2}) if op.name == "concat" else \
            range(op.arity[0], op.arity[1] + 1)
        w = heavy_weight(op.name)
        for n in arities:
            if op.name == "concat" and n > 2:  # a wide concat: no join over n hv facts (slow to plan, huge for n in the thousands);
                # it weighs more than any kernel may hold, so no kernel grows over it
                args = " ".join(f"?x{i}" for i in range(n + na))
                out.append(f"(rule ((= ?e ({s_ctor(op.name, n)} {args}))) ((set (hv ?e) {HEAVY_LIMIT_ATTENTION + 1})) "
                           ":ruleset facts)")
                continue
            xs = [f"?x{i}" for i in range(n)]
            hs = [f"?h{i}" for i in range(n)]
            attrs = [f"?a{i}" for i in range(na)]
            pat = f"({s_ctor(op.name, n)} {' '.join(xs + attrs)})"
            facts = " ".join(f"(= {h} (hv {x}))" for h, x in zip(hs, xs))
            total = f"(+ {w} {' '.join(hs)})" if n else str(w)
            if n == 0:  # an op without inputs (range)
                total = str(w)
            elif n == 1:
                total = f"(+ {w} {hs[0]})"
            elif n > 2:
                total = str(w)
                for h in hs:
                    total = f"(+ {total} {h})"
            else:
                total = f"(+ {w} (+ {hs[0]} {hs[1]}))"
            out.append(f"(rule ((= ?e {pat}) {facts}) ((set (hv ?e) {total})) :ruleset facts)")
            if op.name in VIEW_OPS:
                lp = f"({s_ctor(op.name, n)} ?x {' '.join(attrs)})".replace(" )", ")")
                out.append(f"(rule ((= ?e {lp}) (vw ?x)) ((set (hv ?e) 0) (vw ?e)) :ruleset facts)")
    return out


def _copy_facts(dst: str, src: str) -> str:
    return f"(set (rank {dst}) (rank {src})) (set (shape {dst}) (shape {src})) (set (size {dst}) (size {src}))"


SHAPE_CHANGING = ("expand",)  # pointwise ops whose result is not their operand's shape


def _fact_rules(t_ops=None) -> list[str]:
    """Shape facts for classes that rules create: pointwise ops keep their operand's shape."""
    out = []
    for op in OPS.values():
        if op.kind != "pointwise" or op.name in SHAPE_CHANGING or (t_ops is not None and op.name not in t_ops):
            continue
        na = len(op.attrs)
        attrs = " ".join(f"?a{i}" for i in range(na))
        if op.arity == (1, 1):
            pats = [(f"(o_{op.name} ?x {attrs})".replace("  ", " ").replace(" )", ")"), "?x", "")]
        elif op.arity == (3, 3):  # where(c, x, y): x's shape when nothing broadcasts
            pats = [(f"(o_{op.name} ?c ?x ?y)", "?x", "(= (shape ?x) (shape ?y)) (= (shape ?x) (shape ?c))"),
                    (f"(o_{op.name} ?c ?x (Cn ?k))", "?x", "(= (shape ?x) (shape ?c))")]
        else:
            pats = [(f"(o_{op.name} ?x ?y)", "?x", "(= (shape ?x) (shape ?y))"),
                    (f"(o_{op.name} ?x (Cn ?c))", "?x", ""),
                    (f"(o_{op.name} (Cn ?c) ?y)", "?y", "")]
        for pat, src, extra in pats:
            q_ = f"(= ?e {pat}) (= ?r (rank {src})) (= ?s (shape {src})) (= ?z (size {src})) {extra}"
            out.append(f"(rule ({q_}) ((set (rank ?e) ?r) (set (shape ?e) ?s) (set (size ?e) ?z)) :ruleset facts)")
            out.append(f"(rule ((= ?e {pat}) (= ?d (dim {src} ?i)) {extra}) ((set (dim ?e ?i) ?d)) :ruleset facts)")
            out.append(f"(rule ((= ?e {pat}) (= ?d (dimn {src} ?i)) {extra}) ((set (dimn ?e ?i) ?d)) :ruleset facts)")
            out.append(f"(rule ((= ?e {pat}) (= ?d (sizen {src})) {extra}) ((set (sizen ?e) ?d)) :ruleset facts)")
    return out


# ---------------------------------------------------------------- the graph as facts


def graph_program(g: Graph) -> list[str]:
    """One `(set (nd i) ...)` per node (a DAG stays a DAG), its shape facts, and the outputs."""
    lines = []
    for i, n in enumerate(g.nodes):
        v = _let_name(i)
        if n.op == "input":
            e = f"(In {q(n.name)})"
        elif n.op == "const":
            e = f"(Cn {q(num_text(n.value))})"
            if math.isfinite(float(n.value)):  # its value, for ordering guards (?s > 0 where const(?s))
                lines.append(f"(set (cval {e}) {float(n.value)!r})")
        elif n.op == "kernel":
            raise EqfuseError("internal: kernel blocks are inlined before loading the e-graph")
        else:
            op = OPS[n.op]
            args = " ".join(_let_name(a) for a in n.args)
            attrs = " ".join(q(attr_text(s.kind, n.attr[s.name])) for s in op.attrs)
            e = f"({t_ctor(n.op, len(n.args))} {args} {attrs})".replace(" )", ")")
        lines.append(f"(set {v} {e})")
        lines.append(f"(set (orig {v}) {i})")
        lines += fact_lines(v, n.type.shape)
    for k, o in enumerate(g.outputs):
        lines.append(f"(Out {k} {_let_name(o)})")
    return lines


def _let_name(i: int) -> str:
    """Node i of the graph: `(nd i)`, a function from the node index to its e-class. (Not one
    egglog global per node: loading those took time quadratic in their number; and with `$n1` and `$n11`, egglog 13.2 resolved `$n1` to the value of `$n11`.)"""
    return f"(nd {i})"


def fact_lines(v: str, shape) -> list[str]:
    r = len(shape)
    out = [f"(set (rank {v}) {r})", f"(set (shape {v}) {q(shape_text(shape))})"]
    ints = [d for d in shape if isinstance(d, int)]
    names = sorted(d for d in shape if isinstance(d, str))
    size = math.prod(ints)
    out.append(f"(set (size {v}) {q(str(size) if not names else '*'.join([str(size)] + names))})")
    if not names:
        out.append(f"(set (sizen {v}) {size})")
    for i, d in enumerate(shape):
        for idx in (i, i - r):
            out.append(f"(set (dim {v} {idx}) {q(dim_text(d))})")
            if isinstance(d, int):
                out.append(f"(set (dimn {v} {idx}) {d})")
    return out


