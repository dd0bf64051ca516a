"""Stage `load` + `saturate`: Graph -> egglog e-graph, .rw rules -> egglog rules, bounded runs.

Encoding (written down because extraction and every rule depend on it):

- Two sorts. `T` is a tensor: `(In "x")` a parameter, `(Cn "0.5")` a scalar constant, one
  constructor per op of the op table, `o_<op>` (`o_add`, `o_matmul`, ...; variadic concat gets
  `o_concat__<n>`), and `(K body)`: the tensor computed by one fused kernel. `S` is a value
  inside a kernel, never written to memory: `(L t)` reads the materialized tensor t,
  `(Cs "0.5")` is a constant and `s_<op>` computes an op in place. So kernel boundaries are
  e-nodes: the e-class of `relu(x @ w + b)` holds the unfused op and every candidate kernel
  (`K(s_relu(s_add(s_matmul(L x, L w), L b)))`, `K(s_relu(L t))`, ...), and extraction chooses.
- Attributes are arguments, one String each, in op-table order, in a canonical text form
  (`attr_text`): numbers in their shortest float32 form, lists as `[1, 0]`, None as `null`.
  Constants use the same number form, so a literal in a rule matches a constant equal in float32.
- Shapes are computed in Python and seeded as facts on the e-classes of the input graph:
  `rank` (i64), `dim` (String per axis, both signs of index), `dimn` (i64, concrete dims only),
  `shape` and `size` (String), `sizen` (i64). Pointwise ops propagate them to e-classes that
  rules create; a condition on a class with no facts simply does not hold (rules stay sound).
- A rule (eqfuse.rules.Rule) becomes one egglog `rule` in its own ruleset: the left side is the
  query (its root bound to a fresh variable), conditions are extra facts, the right side is
  unioned with the root. Inside a kernel pattern a variable is an S value; a variable that also
  occurs outside a kernel is a tensor, read inside the kernel with `(L ?x)`.
- Saturation runs one iteration per `run` call and checks the limits between iterations:
  egglog has no node limit, so the size is read back (`print-size`) after each iteration.
  Commutativity and associativity are not in the built-in rules (extra/comm.rw is opt-in).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from .edata import ANALYSES, FACTS, EData, ENode, ctor_op  # noqa: F401 -- ENode, ctor_op: re-exported
from .errors import EqfuseError
from .graph import Graph
from .ops import OPS
from .rules import AttrVar, Cond, PKernel, PNum, POp, PVar, Rule, Test

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


def declarations(concat_arities: Iterable[int] = ()) -> str:
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
        "(function hv (S) i64 :merge (min old new))",
        "(relation vw (S))",
        f"(ruleset {RULESET})",
        "(ruleset facts)",
    ]
    for op in OPS.values():
        na = len(op.attrs)
        arities = sorted(set(concat_arities) | {1, 2}) if op.name == "concat" else \
            range(op.arity[0], op.arity[1] + 1)
        for n in arities:
            targs = " ".join(["T"] * n + ["String"] * na)
            sargs = " ".join(["S"] * n + ["String"] * na)
            lines.append(f"(constructor {t_ctor(op.name, n)} ({targs}) T)")
            lines.append(f"(constructor {s_ctor(op.name, n)} ({sargs}) S)")
    lines += _fact_rules() + _heavy_rules(concat_arities)
    return "\n".join(lines)


def heavy_weight(op: str) -> int:
    """1 for an op that is not pointwise (a kernel body may hold one), else 0."""
    return 0 if OPS[op].kind in ("pointwise", "channel") else 1


# A candidate kernel body may hold at most one heavy op, except on the way to attention
# (softmax(q @ k^T ...) @ v holds three). A view -- a tensor in memory read through transposes
# and reshapes (vw) -- is a way of reading it (x @ transpose(w)), not a heavy op. These are the backend's kernel shapes
# (eqfuse.kernels.classify), applied while rules grow kernels so illegal bodies are not grown
# further; extraction checks every candidate with classify itself.
HEAVY_LIMIT = 1
HEAVY_LIMIT_ATTENTION = 3  # when the kernel's root op is softmax or matmul
# layernorm / rmsnorm at the root: a matmul may be its prologue (a GEMM with a row epilogue). Such
# a kernel still weighs two, so pointwise ops after the row op do not join it here (letting a row
# op over a GEMM weigh one grew BERT-base x12's e-graph from 3.5k e-nodes to the node limit);
# they do in a hand-written kernel block.
HEAVY_LIMIT_ROW = 2
VIEW_OPS = ("transpose", "reshape")


def _heavy_rules(concat_arities) -> list[str]:
    out = ["(rule ((= ?e (L ?t))) ((set (hv ?e) 0) (vw ?e)) :ruleset facts)",
           # a whole attention softmax(...) @ v weighs one, so a pointwise epilogue may join it
           f"(rule ((= ?e ({s_ctor('matmul', 2)} ?p ?v)) (= ?p ({s_ctor('softmax', 1)} ?x ?a)) (vw ?v)) "
           "((set (hv ?e) 1)) :ruleset facts)",
           "(rule ((= ?e (Cs ?c))) ((set (hv ?e) 0)) :ruleset facts)"]
    for op in OPS.values():
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
            if n == 1:
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


def _fact_rules() -> list[str]:
    """Shape facts for classes that rules create: pointwise ops keep their operand's shape."""
    out = []
    for op in OPS.values():
        if op.kind != "pointwise":
            continue
        na = len(op.attrs)
        attrs = " ".join(f"?a{i}" for i in range(na))
        if op.arity == (1, 1):
            pats = [(f"(o_{op.name} ?x {attrs})".replace("  ", " ").replace(" )", ")"), "?x", "")]
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
    egglog global per node: loading those took time quadratic in their number, ~2 s for 5000
    nodes; and with `$n1` and `$n11`, egglog 13.2 resolved `$n1` to the value of `$n11`.)"""
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


# ---------------------------------------------------------------- rules -> egglog


class RuleError(Exception):
    """A rule the e-graph cannot express (it is skipped and listed in the report)."""


@dataclass
class _Ctx:
    tvars: set[str]  # variables with an occurrence outside a kernel (tensors)
    facts: list[str] = field(default_factory=list)
    fresh: int = 0
    attr_ops: dict[str, str] = field(default_factory=dict)  # attr var -> attribute kind


def _vars(p, inside: bool, out: dict[str, set[bool]]) -> None:
    if isinstance(p, PVar):
        out.setdefault(p.name, set()).add(inside)
    elif isinstance(p, POp):
        for a in p.args:
            _vars(a, inside, out)
    elif isinstance(p, PKernel):
        _vars(p.result, True, out)


def _tvars(p) -> set[str]:
    occ: dict[str, set[bool]] = {}
    _vars(p, False, occ)
    return {v for v, where in occ.items() if False in where}


def _pat(p, inside: bool, ctx: _Ctx, rhs: bool) -> str:
    if isinstance(p, PVar):
        v = f"?{p.name}"
        if inside and p.name in ctx.tvars:
            return f"(L {v})"
        if not inside and p.name not in ctx.tvars:
            if rhs:
                return f"(K {v})"
            raise RuleError(f"?{p.name} is a kernel body on one side and a tensor on the other")
        return v
    if isinstance(p, PNum):
        return f"({'Cs' if inside else 'Cn'} {q(num_text(p.value))})"
    if isinstance(p, PKernel):
        if inside:
            raise RuleError("kernel blocks cannot be nested")
        return f"(K {_pat(p.result, True, ctx, rhs)})"
    if isinstance(p, POp):
        op = OPS[p.op]
        args = [_pat(a, inside, ctx, rhs) for a in p.args]
        attrs = []
        for (name, val), spec in zip(p.attrs, op.attrs):
            if isinstance(val, AttrVar):
                ctx.attr_ops.setdefault(val.name, spec.kind)
                if rhs and val.name in ctx.tvars:  # a const tensor's value used as an attribute
                    attrs.append(f"?{val.name}__v")
                else:
                    attrs.append(f"?{val.name}")
            else:
                attrs.append(q(attr_text(spec.kind, val)))
        ctor = (s_ctor if inside else t_ctor)(p.op, len(p.args))
        return f"({ctor} {' '.join(args + attrs)})"
    raise RuleError(f"unknown pattern {p!r}")


_CMP = {"==": "=", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def _term(t, ctx: _Ctx, numeric: bool) -> str:
    if isinstance(t, bool):
        return q("true" if t else "false")
    if isinstance(t, (int, float)):
        if numeric:
            if float(t).is_integer():
                return str(int(t))
            raise RuleError("ordering comparisons need integers")
        return q(num_text(t) if isinstance(t, float) and not float(t).is_integer() else str(int(t)))
    if isinstance(t, tuple) and (not t or not isinstance(t[0], str)):
        if numeric:
            raise RuleError("a list cannot be ordered")
        return q(attr_text("ints", t))
    kind = t[0]
    if kind == "rank":
        if not numeric:
            raise RuleError("rank is compared with numbers")
        return f"(rank ?{t[1]})"
    if kind == "dim":
        return f"(dimn ?{t[1]} {t[2]})" if numeric else f"(dim ?{t[1]} {t[2]})"
    if kind == "size":
        return f"(sizen ?{t[1]})" if numeric else f"(size ?{t[1]})"
    if kind == "shape":
        if numeric:
            raise RuleError("a shape cannot be ordered")
        return f"(shape ?{t[1]})"
    if kind == "attr":
        if numeric:
            raise RuleError("attributes and constants are compared with == and != only")
        return f"?{t[1]}__v" if t[1] in ctx.tvars else f"?{t[1]}"
    raise RuleError(f"unknown condition term {t!r}")


def _is_rank_only(c: Cond) -> bool:
    def r(t):
        return isinstance(t, (int, float)) and not isinstance(t, bool) or (isinstance(t, tuple) and t and t[0] == "rank")
    return r(c.lhs) and r(c.rhs)


def _cond(c, ctx: _Ctx, consts: set[str]) -> list[str]:
    if isinstance(c, Test):
        return []  # const(?x) is folded into the query (see compile_rule)
    numeric = c.op not in ("==", "!=") or _is_rank_only(c)
    lhs, rhs = _term(c.lhs, ctx, numeric), _term(c.rhs, ctx, numeric)
    if c.op == "==":
        return [f"(= {lhs} {rhs})"]
    return [f"({_CMP[c.op]} {lhs} {rhs})"]


def compile_rule(rule: Rule, ruleset: str = RULESET) -> str:
    """The egglog text of one rule (raises RuleError for what the e-graph cannot express)."""
    if not isinstance(rule.lhs, (POp, PKernel)):
        raise RuleError("the left side must be an operation")
    ctx = _Ctx(_tvars(rule.lhs))
    rhs_t = _tvars(rule.rhs)
    consts = {c.var for c in rule.conds if isinstance(c, Test)}
    for v in rhs_t - ctx.tvars:
        # bound inside a kernel on the left, used as a tensor on the right: K(?v) materializes it
        pass
    lhs = _pat(rule.lhs, False, ctx, rhs=False)
    query = [f"(= ?root__ {lhs})"]
    for v in sorted(consts):
        if v in ctx.tvars:
            query.append(f"(= ?{v} (Cn ?{v}__v))")
        else:
            query.append(f"(= ?{v} (Cs ?{v}__v))")
    for c in rule.conds:
        query += _cond(c, ctx, consts)
    # A const variable used as an attribute on the right takes the constant's text.
    rctx = _Ctx(ctx.tvars, attr_ops=ctx.attr_ops)
    rhs = _pat(rule.rhs, False, rctx, rhs=True)
    for name in rctx.attr_ops:
        if name in ctx.tvars and name not in consts:
            raise RuleError(f"?{name} is a tensor used as an attribute without const(?{name})")
    query += _heavy_guard(rule.rhs, ctx.tvars)
    name = rule_key(rule)
    return f"(rule ({' '.join(query)}) ((union ?root__ {rhs})) :ruleset {ruleset} :name {q(name)})"


def _heavy_guard(p, tvars: set[str]) -> list[str]:
    """For each kernel the right side builds: its heavy ops (written + those of the S variables
    it embeds) stay within the limit."""
    out: list[str] = []

    def kernels(x):
        if isinstance(x, PKernel):
            yield x
        elif isinstance(x, POp):
            for a in x.args:
                yield from kernels(a)

    for k in kernels(p):
        svars: list[str] = []
        written = 0

        def walk(x, parent_loads_only=False):
            nonlocal written
            if isinstance(x, PVar):
                if x.name not in tvars and x.name not in svars:
                    svars.append(x.name)
            elif isinstance(x, POp):
                written += 0 if is_view(x) else heavy_weight(x.op)
                for a in x.args:
                    walk(a)

        def is_view(x) -> bool:  # a tensor variable under transposes and reshapes
            if isinstance(x, PVar):
                return x.name in tvars
            return isinstance(x, POp) and x.op in VIEW_OPS and is_view(x.args[0])

        top = k.result
        while isinstance(top, POp) and top.op in VIEW_OPS and not is_view(top):
            top = top.args[0]  # layout ops over the result write it in another layout: not heavy
        walk(top)
        if not svars and written <= HEAVY_LIMIT:
            continue
        root = top.op if isinstance(top, POp) else ""
        limit = (HEAVY_LIMIT_ATTENTION if root in ("softmax", "matmul")
                 else HEAVY_LIMIT_ROW if root in ("layernorm", "rmsnorm") else HEAVY_LIMIT)
        total = str(written)
        for v in svars:
            out.append(f"(= ?{v}__hv (hv ?{v}))")
            total = f"(+ {total} ?{v}__hv)"
        out.append(f"(<= {total} {limit})")
    return out


def rule_key(rule: Rule) -> str:
    return rule.name + ("__rev" if rule.reverse else "")


# ---------------------------------------------------------------- the e-graph


@dataclass
class SaturationStats:
    iterations: int = 0
    stop_reason: str = "saturated"
    rules_fired: dict[str, int] = field(default_factory=dict)
    egraph_nodes: int = 0
    seconds: float = 0.0
    skipped_rules: dict[str, str] = field(default_factory=dict)
    grown_by: dict[str, float] = field(default_factory=dict)  # rule -> e-nodes its matches added (estimated)
    limit_note: str = ""  # when a limit stopped the search: which, and the rules that grew the e-graph most


DEFAULT_ITER_LIMIT = 30
DEFAULT_NODE_LIMIT = 200_000
DEFAULT_TIME_LIMIT = 10.0


class _Base:
    """An egglog e-graph with the declarations and the compiled rules, and no graph."""

    def __init__(self, rules: list[Rule], phase_of, arities):
        from egglog import bindings

        self.eg = bindings.EGraph()
        self.in_use = False
        self.eg.run_program(*self.eg.parse_program(declarations(arities)))
        self.skipped: dict[str, str] = {}
        self.rulesets: dict[str, list[str]] = {}  # ruleset -> rule keys in it
        texts = []
        for r in rules:
            rs = phase_of(r) if phase_of else RULESET
            if rs not in self.rulesets and rs != RULESET:
                self.eg.run_program(*self.eg.parse_program(f"(ruleset {rs})"))
            try:
                texts.append(compile_rule(r, rs))
            except RuleError as e:
                self.skipped[rule_key(r)] = str(e)
                continue
            self.rulesets.setdefault(rs, []).append(rule_key(r))
        self.rule_names = {rule_key(r): r.name for r in rules}
        for t in texts:
            try:
                self.eg.run_program(*self.eg.parse_program(t))
            except bindings.EggSmolError as e:  # a rule egglog refuses: skipped, reported
                name = t.rsplit(":name ", 1)[-1].rstrip(")").strip('"')
                self.skipped[name] = str(e).splitlines()[0]


_BASES: dict[tuple, _Base] = {}


class EGraph:
    """An egglog e-graph holding one Graph, with the rules compiled into it."""

    def __init__(self, graph: Graph, rules: Iterable[Rule], phase_of=None):
        """`phase_of(rule)` names the ruleset each rule goes into (default: all in one, RULESET).
        The declarations and compiled rules are kept (_BASES) and reused for the next graph with
        the same rules: the graph goes in above an egglog `push`, and `close()` pops it."""
        rules = list(rules)
        arities = frozenset(len(n.args) for n in graph.nodes if n.op == "concat")
        key = (tuple((rule_key(r), r.text, phase_of(r) if phase_of else RULESET) for r in rules), arities)
        base = _BASES.get(key)
        if base is None or base.in_use:
            base = _Base(rules, phase_of, arities)
            if key not in _BASES or not _BASES[key].in_use:
                _BASES[key] = base
                while len(_BASES) > 8:
                    _BASES.pop(next(iter(_BASES)))
        base.in_use = True
        self._base = base
        self.eg = base.eg
        self.graph = graph
        self.skipped, self.rulesets, self.rule_names = dict(base.skipped), base.rulesets, base.rule_names
        self._run("(push)")
        lines = graph_program(graph)
        for i in range(0, len(lines), 100):  # egglog parses a long program in superlinear time
            self._run("\n".join(lines[i:i + 100]))
        self._run("(run facts 1)")

    def close(self) -> None:
        """Drop the graph, keep the rules for the next one."""
        if self._base.in_use:
            self._run("(pop)")
            self._base.in_use = False

    def _run(self, text: str):
        return self.eg.run_program(*self.eg.parse_program(text))

    def size(self) -> int:
        out = self._run("(print-size)")[0]
        sizes = _sizes(out)
        return sum(v for k, v in sizes.items() if k not in FACTS and k not in ANALYSES)

    def step(self, ruleset: str = RULESET, match_limit: int | None = None) -> tuple[bool, dict[str, int]]:
        """One iteration of `ruleset`, then the shape facts to saturation. With `match_limit`, a
        rule with more matches than that in this iteration is not applied in it (egglog's back-off
        scheduler, created inside the one run-schedule call): this bounds what one iteration adds.
        Returns (whether anything changed, matches per rule name)."""
        if match_limit is None:
            prog = f"(run-schedule (seq (run {ruleset}) (saturate (run facts))))"
        else:
            prog = (f"(run-schedule (let-scheduler bo (back-off :match-limit {int(match_limit)})) "
                    f"(run-with bo {ruleset}) (saturate (run facts)))")
        rep = self._run(prog)[-1].report
        fired: dict[str, int] = {}
        for k, v in rep.num_matches_per_rule.items():
            if v and k in self.rule_names:
                name = self.rule_names[k]
                fired[name] = fired.get(name, 0) + v
        return bool(rep.updated), fired

    def saturate(self, iter_limit: int | None = None, node_limit: int | None = None,
                 time_limit: float | None = None, progress=None) -> SaturationStats:
        """Every rule in one ruleset, to saturation or a limit (eqfuse.schedule runs the phases)."""
        from .schedule import Limits, run_phase

        st = SaturationStats(skipped_rules=dict(self.skipped))
        lim = Limits.make(iter_limit, node_limit, time_limit)
        run_phase(self, RULESET, st, lim, progress=progress)
        return st

    def serialize(self) -> "EData":
        ser = self.eg.serialize([])
        return EData.from_json(json.loads(ser.to_json()))

    def dot(self) -> str:
        return self.eg.serialize([]).to_dot()


def _sizes(out) -> dict[str, int]:
    for attr in ("sizes", "_0"):
        if hasattr(out, attr):
            return dict(getattr(out, attr))
    try:
        return dict(out[0])
    except Exception:  # the binding's repr is the fallback: PrintAllFunctionsSize([('In', 2), ...])
        import ast

        text = repr(out)
        return dict(ast.literal_eval(text[text.index("["):text.rindex("]") + 1]))


