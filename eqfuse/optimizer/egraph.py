"""The e-graph: a Graph loaded into egglog, the rules as egglog rewrites, and the saturation schedule that runs them under limits.

Stage `load` + `saturate`: Graph -> egglog e-graph, .rw rules -> egglog rules, bounded runs.

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
- A rule (eqfuse.optimizer.rules.Rule) becomes one egglog `rule` in its own ruleset: the left side is the
  query (its root bound to a fresh variable), conditions are extra facts, the right side is
  unioned with the root. Inside a kernel pattern a variable is an S value; a variable that also
  occurs outside a kernel is a tensor, read inside the kernel with `(L ?x)`.
- Each rule is in a ruleset of its own, and a phase's ruleset combines them. Saturation steps one
  iteration at a time (EGraph.run_rules) and eqfuse/optimizer/egraph.py checks the limits
  between steps; since egglog has no node limit, a step runs under back-off match limits sized so
  that the e-nodes the applied matches can add (EGraph.growth per match) fit in the node budget
  left (schedule.bounded_step). Commutativity and associativity are not in the built-in rules
  (extra/comm.rw is opt-in).
- The egglog program text (values, declarations, the graph as facts) is eqfuse/optimizer/egraph_text.py.

The saturation schedule: which rules run when, and the limits that hold while they run.

Rules fall into three phases by their shape (`rule_phase`), never by their name:

- `simplify`: rules with no kernel on either side that do not only grow the e-graph (algebra,
  pattern recognition: a layernorm, GELU or softmax spelled in primitive ops becomes the op);
- `grow`: rules whose right side has every op of the left side and maybe more (commutativity,
  associativity, distribution, `x / c => x * (1 / c)`): they never shrink a term, and together
  they grow an e-graph without end;
- `fuse`: rules with a kernel block on either side (fusion.rw).

The optimizer (eqfuse.optimizer.optimize) runs them on two e-graphs:

1. a recognition e-graph: `simplify` to saturation, then up to GROW_ROUNDS single iterations of
   `grow` (each followed by `simplify` to saturation again), under GROW_NODE_SHARE of the node
   limit. It stays small (no kernel candidates). The smallest term is then extracted from it
   (eqfuse.optimizer.simplify: recognized ops are one node where their spelling was many, constants fold);
2. a fusion e-graph loaded with that term, where `fuse` runs to saturation.

So fusion never sees the primitive spelling of an op it has recognized: the kernel candidates of
a spelled-out layernorm's eight ops (and their combinations with everything around them) are
never built. The cost is that fusion cannot undo a recognition; every recognition rule here
turns several ops into one the backend has a fused kernel for, which no cost model prefers less.

Limits (`Limits`): every phase steps one iteration at a time and checks the limits between
steps. The node limit is a hard total, inside an iteration too: a step (`bounded_step`) adds at
most the remaining node budget, because each rule's matches are applied only when the e-nodes
they can add (matches x the constructors of its right side) fit in what is left; a rule whose
matches do not fit is not applied and the others go on. So the e-graph never has more e-nodes
than the limit (one exception: the graph as loaded, before any rule runs). The time limit covers the
whole optimize: a step is not started when it (estimated from the last one) plus extracting an
e-graph of the current size (EXTRACT_SECONDS_PER_NODE) would pass the deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

from eqfuse.ir.graph import Graph
from eqfuse.ir.ops import OPS
from eqfuse.optimizer.edata import ANALYSES, FACTS, EData
from eqfuse.optimizer.egraph_text import (  # the encoding's text (eqfuse/optimizer/egraph_text.py)
    HEAVY_LIMIT,
    HEAVY_LIMIT_ATTENTION,
    HEAVY_LIMIT_CONVNORM,
    HEAVY_LIMIT_PROLOGUE,
    HEAVY_LIMIT_ROW,
    RULESET,
    VIEW_OPS,
    attr_text,
    declarations,
    graph_program,
    heavy_weight,
    num_text,
    q,
    s_ctor,
    t_ctor,
)
from eqfuse.optimizer.rules import AttrVar, Cond, PKernel, PNum, POp, PVar, Rule, Test

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


def _is_const_value(t, ctx: _Ctx) -> bool:
    return isinstance(t, tuple) and len(t) == 2 and t[0] == "attr" and t[1] in ctx.tvars


def _f64(t) -> str:
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        raise RuleError("a constant's value is ordered against a number only")
    return repr(float(t))


def _is_rank_only(c: Cond) -> bool:
    def r(t):
        return isinstance(t, (int, float)) and not isinstance(t, bool) or (isinstance(t, tuple) and t and t[0] == "rank")
    return r(c.lhs) and r(c.rhs)


def _cond(c, ctx: _Ctx) -> list[str]:
    if isinstance(c, Test):
        return []  # const(?x) is folded into the query (see compile_rule)
    if c.op not in ("==", "!=") and any(_is_const_value(t, ctx) for t in (c.lhs, c.rhs)):
        # a constant's value ordered (?s > 0 where const(?s)): the f64 fact cval of the constant's
        # class, seeded where the graph is loaded (a constant a rule creates has none: no match)
        lhs, rhs = (f"(cval ?{t[1]})" if _is_const_value(t, ctx) else _f64(t) for t in (c.lhs, c.rhs))
        return [f"({_CMP[c.op]} {lhs} {rhs})"]
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
    consts = {c.var for c in rule.conds if isinstance(c, Test)}
    lhs = _pat(rule.lhs, False, ctx, rhs=False)
    query = [f"(= ?root__ {lhs})"]
    for v in sorted(consts):
        if v in ctx.tvars:
            query.append(f"(= ?{v} (Cn ?{v}__v))")
        else:
            query.append(f"(= ?{v} (Cs ?{v}__v))")
    for c in rule.conds:
        query += _cond(c, ctx)
    # A const variable used as an attribute on the right takes the constant's text.
    rctx = _Ctx(ctx.tvars, attr_ops=ctx.attr_ops)
    rhs = _pat(rule.rhs, False, rctx, rhs=True)
    for name in rctx.attr_ops:
        if name in ctx.tvars and name not in consts:
            raise RuleError(f"?{name} is a tensor used as an attribute without const(?{name})")
    query += _heavy_guard(rule.rhs, ctx.tvars)
    name = rule_key(rule)
    return f"(rule ({' '.join(query)}) ((union ?root__ {rhs})) :ruleset {ruleset} :name {q(name)})"


def _pops(x):
    """Every op of a pattern, x's own first."""
    if isinstance(x, (POp, PKernel)):
        if isinstance(x, POp):
            yield x
        for a in (x.args if isinstance(x, POp) else (x.result,)):
            yield from _pops(a)


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

        def walk(x):
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
        under = top  # a rule that writes an activation over a normalization (epilogue_layernorm_gelu)
        while isinstance(under, POp) and len(under.args) == 1 and heavy_weight(under.op) == 0:
            under = under.args[0]
        row = isinstance(under, POp) and under.op in ("layernorm", "rmsnorm")
        # a conv2d reading a kernel body (rules fuse_dw_pw, fuse_pw_dw): a depthwise conv may be
        # its prologue, and an expand 1x1 conv the depthwise conv's
        prologue = any(isinstance(x, POp) and x.op == "conv2d" and isinstance(x.args[0], PVar)
                       and x.args[0].name in svars for x in _pops(k.result))
        convnorm = any(isinstance(x, POp) and x.op == "layernorm" and isinstance(x.args[0], POp)
                       and x.args[0].op == "transpose" and isinstance(x.args[0].args[0], POp)
                       and x.args[0].args[0].op == "conv2d" for x in _pops(k.result))
        limit = (HEAVY_LIMIT_CONVNORM if convnorm
                 else HEAVY_LIMIT_ATTENTION if root in ("softmax", "matmul")
                 else HEAVY_LIMIT_PROLOGUE if prologue
                 else HEAVY_LIMIT_ROW if root in ("layernorm", "rmsnorm") or row else HEAVY_LIMIT)
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


@dataclass
class RuleRun:
    """What one EGraph.run_rules call did, by rule key."""

    changed: bool
    applied: dict[str, int]  # matches applied
    found: dict[str, int]  # matches found (more than applied for a rule over the match limit)


DEFAULT_ITER_LIMIT = 30
DEFAULT_NODE_LIMIT = 200_000
DEFAULT_TIME_LIMIT = 10.0


class _Base:
    """An egglog e-graph with the declarations and the compiled rules, and no graph."""

    def __init__(self, rules: list[Rule], phase_of, arities, t_ops=None, s_ops=None):
        bindings = egglog_bindings()
        self.eg = bindings.EGraph()
        self.thread = threading.get_ident()  # (the one thread that may drop it: _before_fork)
        _ALL.add(self)
        self.in_use = False
        # One command per run_program: egglog's time and memory for one program grow with the
        # square of its commands (benchmarks/bench_opt.py measures the load; the figures are in
        # benchmarks/RESULTS.md, 2026-11-28).
        for line in declarations(arities, t_ops, s_ops).splitlines():
            self.eg.run_program(*self.eg.parse_program(line))
        self.skipped: dict[str, str] = {}
        self.rulesets: dict[str, list[str]] = {}  # ruleset -> rule keys in it
        self.solo: dict[str, str] = {}  # rule key -> the ruleset holding it alone
        self.growth: dict[str, int] = {}  # rule key -> e-nodes one match can add (its right side's constructors)
        texts = []
        for r in rules:
            rs = phase_of(r) if phase_of else RULESET
            sub = f"{rs}__{len(self.solo)}"
            try:
                text = compile_rule(r, sub)
            except RuleError as e:
                self.skipped[rule_key(r)] = str(e)
                continue
            self.eg.run_program(*self.eg.parse_program(f"(ruleset {sub})"))
            texts.append(text)
            self.rulesets.setdefault(rs, []).append(rule_key(r))
            self.solo[rule_key(r)] = sub
            self.growth[rule_key(r)] = constructors(text[text.index("((union ?root__ "):])
        # a phase's ruleset runs every rule of it; each rule is also in a ruleset of its own, so
        # that eqfuse.optimizer.egraph can run it alone under the node budget
        for rs, keys in self.rulesets.items():
            subs = " ".join(self.solo[k] for k in keys)
            self.eg.run_program(*self.eg.parse_program(f"(unstable-combined-ruleset {rs} {subs})"))
        self.rule_names = {rule_key(r): r.name for r in rules}
        for t in texts:
            try:
                self.eg.run_program(*self.eg.parse_program(t))
            except bindings.EggSmolError as e:  # a rule egglog refuses: skipped, reported
                name = t.rsplit(":name ", 1)[-1].rstrip(")").strip('"')
                self.skipped[name] = str(e).splitlines()[0]


def egglog_bindings():
    """egglog's Rust extension module, `egglog.bindings`, the only part of egglog used here.

    Loaded from its file without running the egglog package's __init__, which builds egglog's
    Python DSL and took more time than the rest of `eqfuse opt examples/mlp.g`'s start
    (python -X importtime -c "import egglog.bindings"). It goes into sys.modules under its own
    name, so a later `import egglog` reuses it (an extension module is initialized once per
    process). Anything unexpected: the ordinary import."""
    import sys

    mod = sys.modules.get("egglog.bindings")
    if mod is not None:
        return mod
    try:
        import importlib.machinery
        import importlib.util
        from pathlib import Path

        spec = importlib.util.find_spec("egglog")
        where = spec.submodule_search_locations if spec else None
        path = next(str(f) for d in (where or ()) for f in sorted(Path(d).glob("bindings.*"))
                    if any(str(f).endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES))
        loader = importlib.machinery.ExtensionFileLoader("egglog.bindings", path)
        mod = importlib.util.module_from_spec(importlib.util.spec_from_file_location("egglog.bindings", path,
                                                                                    loader=loader))
        loader.exec_module(mod)
        sys.modules["egglog.bindings"] = mod
        return mod
    except (ImportError, OSError, StopIteration, AttributeError):
        from egglog import bindings

        return bindings


_ERRORS: dict[tuple[str, str], str] = {}  # (rule key, rule text) -> why the e-graph cannot express it, or ""


def _compile_error(r: Rule) -> str:
    key = (rule_key(r), r.text)
    if key not in _ERRORS:
        try:
            compile_rule(r)
            _ERRORS[key] = ""
        except RuleError as e:
            _ERRORS[key] = str(e)
    return _ERRORS[key]


def _side_ops(p, inside: bool, t: set, s: set) -> None:
    """The ops of pattern p: those outside a kernel block into t (tensor e-nodes, `o_<op>`),
    those inside one into s (kernel-body values, `s_<op>`)."""
    if isinstance(p, POp):
        (s if inside else t).add(p.op)
        for a in p.args:
            _side_ops(a, inside, t, s)
    elif isinstance(p, PKernel):
        _side_ops(p.result, True, t, s)


def reachable_ops(graph_ops: set[str], rules: list[Rule]) -> tuple[frozenset, frozenset, list[Rule]]:
    """(tensor ops, kernel-body ops, rules) that an e-graph loaded with a graph of `graph_ops` can
    ever hold or fire. An e-node is made by loading the graph or by a rule's right side (the
    `facts` rules only set functions), so a rule whose left side has an op that neither the
    graph nor a rule that can fire makes never matches: it is left out, and so are the fact rules
    of those ops. A fixed point over the rules, in their order."""
    t, s = set(graph_ops), set()
    sides = []
    for r in rules:
        lt, ls, rt, rs = set(), set(), set(), set()
        _side_ops(r.lhs, False, lt, ls)
        _side_ops(r.rhs, False, rt, rs)
        sides.append((lt, ls, rt, rs))
    live = [False] * len(rules)
    changed = True
    while changed:
        changed = False
        for i, (lt, ls, rt, rs) in enumerate(sides):
            if not live[i] and lt <= t and ls <= s:
                live[i] = changed = True
                t |= rt
                s |= rs
    return frozenset(t), frozenset(s), [r for r, ok in zip(rules, live) if ok]


def constructors(text: str) -> int:
    """The applications in an egglog expression (its opening parentheses outside strings), minus
    the `(union ...)` and the list around it: the e-nodes one match of a rule can add at most."""
    n, quoted, esc = 0, False, False
    for ch in text:
        if quoted:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch == "(":
            n += 1
    return max(0, n - 2)


# The bases of this thread: an egglog e-graph may only be used, and dropped, by the thread that
# made it (pyo3 panics otherwise: "EGraph is unsendable, but is being dropped on another thread"),
# so two threads compiling at once each keep their own, and only the main thread keeps them after
# its optimize returns (own_thread).
_LOCAL = threading.local()


def _bases() -> dict[tuple, _Base]:
    if not hasattr(_LOCAL, "bases"):
        _LOCAL.bases = {}
    return _LOCAL.bases


# Every base of the process, whatever its thread (weakly: a thread's own references decide when it
# goes). os.fork in one thread while another holds bases: the child clears the other threads'
# states, their thread-locals with them, in the forking thread, which would drop those e-graphs
# there. So before a fork the forking thread takes one more reference to each of them, and the
# child keeps it for good (they go with the child's process, never dropped); the parent lets it
# go after the fork (not the last reference: their threads still hold theirs). This is what
# happens when a library forks from its own worker thread after a compile in the main thread
# (OpenVINO's compile_model, multiprocessing's fork from a pool's thread).
_ALL: "weakref.WeakSet[_Base]" = weakref.WeakSet()
_AT_FORK: list = []


def _before_fork() -> None:
    me = threading.get_ident()
    _AT_FORK[:] = [b.eg for b in list(_ALL) if b.thread != me]


def _after_fork_in_parent() -> None:
    _AT_FORK.clear()


def _after_fork_in_child() -> None:
    import ctypes

    for eg in _AT_FORK:  # another thread's e-graph: one reference the child never gives back
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(eg))
    _AT_FORK.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def own_thread():
    """Around an optimize: on leaving the outermost one, a thread other than the main one drops
    its e-graphs (the kept bases), here, in the thread that made them. Kept, they would be dropped
    wherever the thread's state is cleared last: a pool's worker that outlives the compile holds
    them until the process forks, and the fork's child clears every other thread's state, its
    thread-locals with it, in the forking thread (pyo3's "unsendable" panic, printed from
    os.fork()). The main thread keeps them for its next graph."""
    depth = getattr(_LOCAL, "depth", 0)
    _LOCAL.depth = depth + 1
    try:
        yield
    finally:
        _LOCAL.depth = depth
        if depth == 0 and threading.current_thread() is not threading.main_thread():
            _LOCAL.__dict__.pop("bases", None)  # (the last references: the e-graphs end here)


class EGraph:
    """An egglog e-graph holding one Graph, with the rules compiled into it."""

    def __init__(self, graph: Graph, rules: Iterable[Rule], phase_of=None):
        """`phase_of(rule)` names the ruleset each rule goes into (default: all in one, RULESET).
        The declarations and compiled rules are kept (_bases()) and reused for the next graph with
        the same rules: the graph goes in above an egglog `push`, and `close()` pops it."""
        rules = list(rules)
        arities = frozenset(len(n.args) for n in graph.nodes if n.op == "concat")
        # only the rules that can match in this graph's e-graph, and the facts of the ops it can
        # hold, go into egglog: declaring all of them was most of a small graph's optimize
        t_ops, s_ops, live = reachable_ops({n.op for n in graph.nodes if n.op in OPS}, rules)
        key = (tuple((rule_key(r), r.text) for r in rules),
               tuple(phase_of(r) if phase_of else RULESET for r in live), arities, t_ops, s_ops)
        bases = _bases()
        base = bases.get(key)
        if base is None or base.in_use:
            base = _Base(live, phase_of, arities, t_ops, s_ops)
            kept = {id(r) for r in live}
            for r in rules:  # a rule left out is still reported when the e-graph cannot express it
                if id(r) not in kept and _compile_error(r):
                    base.skipped[rule_key(r)] = _compile_error(r)
            if key not in bases or not bases[key].in_use:
                bases[key] = base
                while len(bases) > 8:
                    bases.pop(next(iter(bases)))
        base.in_use = True
        self._base = base
        self.eg = base.eg
        self.graph = graph
        self.skipped, self.rulesets, self.rule_names = dict(base.skipped), base.rulesets, base.rule_names
        self.solo, self.growth = base.solo, base.growth
        self._run("(push)")
        lines = graph_program(graph)
        for i in range(0, len(lines), 20):  # egglog's time for one program grows faster than its length
            self._run("\n".join(lines[i:i + 20]))
        self._run("(run facts 1)")

    def close(self) -> None:
        """Drop the graph, keep the rules for the next one (in _bases(); this object lets go of
        the e-graph, so that where it is dropped is decided there: own_thread)."""
        if self._base is not None and self._base.in_use:
            self._run("(pop)")
            self._base.in_use = False
        self._base = self.eg = None

    def _run(self, text: str):
        return self.eg.run_program(*self.eg.parse_program(text))

    def size(self) -> int:
        out = self._run("(print-size)")[0]
        sizes = _sizes(out)
        return sum(v for k, v in sizes.items() if k not in FACTS and k not in ANALYSES)

    def run_rules(self, ruleset: str, match_limit: int | None = None) -> "RuleRun":
        """One iteration of `ruleset` (a phase's or a rule's own, `solo`), then the shape facts to
        saturation. With `match_limit`, a rule with more matches than that in this iteration is
        not applied in it (egglog's back-off scheduler, created inside the one run-schedule call;
        `found` still counts its matches)."""
        if match_limit is None:
            prog = f"(run-schedule (seq (run {ruleset}) (saturate (run facts))))"
        else:
            prog = (f"(run-schedule (let-scheduler bo (back-off :match-limit {int(match_limit)})) "
                    f"(run-with bo {ruleset}) (saturate (run facts)))")
        rep = self._run(prog)[-1].report
        applied = {k: v for k, v in rep.num_matches_per_rule.items() if v and k in self.growth}
        found: dict[str, int] = {}
        changed = False
        for it in rep.iterations:  # the back-off scheduler's search reports the matches of banned rules too
            rs = it.rule_set_report
            changed = changed or bool(rs.changed)
            for k, reports in rs.rule_reports.items():
                if k in self.growth:
                    found[k] = max(found.get(k, 0), max((r.num_matches for r in reports), default=0))
        for k, v in applied.items():
            found[k] = max(found.get(k, 0), v)
        return RuleRun(changed, applied, found)

    def saturate(self, iter_limit: int | None = None, node_limit: int | None = None,
                 time_limit: float | None = None, progress=None) -> SaturationStats:
        """Every rule in one ruleset, to saturation or a limit (eqfuse.optimizer.egraph runs the phases)."""
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
    except (TypeError, KeyError, IndexError):  # the binding's repr is the fallback: PrintAllFunctionsSize([('In', 2), ...])
        # (read with a pattern, not ast.literal_eval, which races with a parser built in another
        # thread: eqfuse.frontend.parser._BUILDING)
        return {name: int(n) for name, n in re.findall(r"\('([^']*)', (\d+)\)", repr(out))}


SIMPLIFY, GROW, FUSE = "simplify", "grow", "fuse"
GROW_ROUNDS = 2
GROW_NODE_SHARE = 0.25  # of the node limit, for the recognition e-graph
# The optimizer's time estimates for its limits, measured by `benchmarks/bench_opt.py --layers 48`:
EXTRACT_SECONDS_PER_NODE = 150e-6  # serialize + candidates + greedy, per e-node
LOAD_SECONDS_PER_FACT = 25e-6  # loading a graph into an e-graph: per node, 6 facts + 4 per axis
EXTRACT_SECONDS_PER_GRAPH_NODE = 700e-6  # extracting an e-graph that fusion did not get to grow


def load_seconds(g) -> float:
    """Estimated seconds to load graph g into an e-graph."""
    return LOAD_SECONDS_PER_FACT * sum(6 + 4 * len(n.type.shape) for n in g.nodes)


def fusion_seconds(g) -> float:
    """Seconds to keep, at least, for fusing g: loading the fusion e-graph and extracting from it."""
    return load_seconds(g) + EXTRACT_SECONDS_PER_GRAPH_NODE * len(g.nodes)


def _ops(p, out: Counter, kernel: list) -> None:
    if isinstance(p, PKernel):
        kernel.append(True)
        _ops(p.result, out, kernel)
    elif isinstance(p, POp):
        out[p.op] += 1
        for a in p.args:
            _ops(a, out, kernel)


def rule_phase(rule: Rule) -> str:
    lhs, rhs, k = Counter(), Counter(), []
    _ops(rule.lhs, lhs, k)
    _ops(rule.rhs, rhs, k)
    if k:
        return FUSE
    if isinstance(rule.rhs, PVar) or lhs - rhs:  # a variable, or some op of the left side goes
        return SIMPLIFY
    return GROW


@dataclass
class Limits:
    iters: int
    nodes: int
    deadline: float  # time.perf_counter() value

    @staticmethod
    def make(iter_limit=None, node_limit=None, time_limit=None, t0: float | None = None) -> "Limits":
        t0 = time.perf_counter() if t0 is None else t0
        return Limits(DEFAULT_ITER_LIMIT if iter_limit is None else iter_limit,
                      DEFAULT_NODE_LIMIT if node_limit is None else node_limit,
                      t0 + (DEFAULT_TIME_LIMIT if time_limit is None else time_limit))

    def left(self) -> float:
        return self.deadline - time.perf_counter()


@dataclass
class Step:
    changed: bool
    fired: dict[str, int]  # rule name -> matches applied
    starved: dict[str, int]  # rule key -> e-nodes its matches need, more than the budget left


def bounded_step(eg, ruleset: str, budget: int) -> Step:
    """One iteration of `ruleset` that adds at most `budget` e-nodes to the e-graph.

    A match of rule r adds at most g(r) e-nodes (the constructors of its right side, eg.growth).
    Every rule first runs together under a match limit L = budget // sum(g): a rule with more
    matches than L is not applied (egglog's back-off), so together they add at most L * sum(g).
    Each rule held back is then run alone, fewest e-nodes needed first, under the limit
    (budget left) // g(r) that its matches must fit; one whose matches do not fit is not applied
    (`starved`). So the e-graph never passes its node limit, not even inside an iteration: egglog
    applies all of a rule's matches in an iteration or none, and none is applied past the budget."""
    keys = eg.rulesets[ruleset]
    total = sum(eg.growth[k] for k in keys)
    size0 = eg.size()
    run = eg.run_rules(ruleset, budget // total if total else None)
    applied = dict(run.applied)
    changed = run.changed
    held = {k: n for k, n in run.found.items() if n and k not in applied}
    starved: dict[str, int] = {}
    size = eg.size() if held else size0
    for k in sorted(held, key=lambda k: held[k] * eg.growth[k]):
        g = eg.growth[k]
        cap = (budget - (size - size0)) // g if g else None
        if cap is not None and held[k] > cap:
            starved[k] = held[k] * g
            continue
        solo = eg.run_rules(eg.solo[k], cap)
        changed = changed or solo.changed
        if k in solo.applied:
            applied[k] = solo.applied[k]
            size = eg.size()
        elif solo.found.get(k, 0):  # more matches than before (the rules before it made them)
            starved[k] = solo.found[k] * g
    fired: dict[str, int] = {}
    for k, v in applied.items():
        name = eg.rule_names[k]
        fired[name] = fired.get(name, 0) + v
    return Step(changed, fired, starved)


def run_phase(eg, ruleset: str, st, lim: Limits, *, node_limit: int | None = None, max_steps: int | None = None,
              reserve: float = 0.0, progress=None) -> bool:
    """Step `ruleset` until nothing changes (True) or a limit or max_steps stops it (False; a
    limit sets st.stop_reason and st.limit_note). A rule whose matches would pass the node limit
    is not applied (bounded_step); the others go on to saturation, and the node limit is the
    stop reason. The same for the e-nodes the time left can extract (EXTRACT_SECONDS_PER_NODE
    each, after the step): past them the time limit is the stop reason."""
    if ruleset not in eg.rulesets:
        return True
    nodes = lim.nodes if node_limit is None else node_limit
    size = eg.size()
    st.egraph_nodes = size
    last = 0.0
    steps = 0
    starved: dict[str, int] = {}
    while True:
        if max_steps is not None and steps >= max_steps:
            return False
        reason = None
        if st.iterations >= lim.iters:
            reason = "iter_limit"
        elif size >= nodes:
            reason = "node_limit"
        elif time.perf_counter() + 2 * last + EXTRACT_SECONDS_PER_NODE * size + reserve > lim.deadline:
            reason = "time_limit"
        if reason:
            _stop(st, reason, lim, nodes, starved)
            return False
        t = time.perf_counter()
        # nor grows the e-graph past what the time left can extract: a larger one would leave
        # extraction part of its candidates (docs/optimizing.md, "Limits")
        room = int((lim.deadline - t - 2 * last - reserve) / EXTRACT_SECONDS_PER_NODE) - size
        timed = room < nodes - size
        step = bounded_step(eg, ruleset, max(0, min(nodes - size, room)))
        last = time.perf_counter() - t
        steps += 1
        st.iterations += 1
        new = eg.size()
        starved = {eg.rule_names[k]: v for k, v in step.starved.items()}
        # A step's scheduler is new, so it finds every match again (not only those on new
        # e-nodes): a rule's matches are its largest count in one step, its new matches the rise.
        fired = step.fired
        rise = {k: v - st.rules_fired.get(k, 0) for k, v in fired.items() if v > st.rules_fired.get(k, 0)}
        total = sum(rise.values())
        for name, v in rise.items():
            st.rules_fired[name] = fired[name]
            if new > size and total:
                st.grown_by[name] = st.grown_by.get(name, 0.0) + (new - size) * v / total
        size = st.egraph_nodes = new
        if progress:
            progress(st)
        if not step.changed:
            if starved:
                _stop(st, "time_limit" if timed else "node_limit", lim, nodes, starved)
                return False
            return True


def _stop(st, reason: str, lim: Limits, nodes: int, starved: dict[str, int] | None = None) -> None:
    st.stop_reason = reason
    what = {"iter_limit": f"iteration limit: {lim.iters} iterations",
            "node_limit": f"node limit: {nodes} e-nodes",
            "time_limit": "time limit (the rest is left for extraction)"}[reason]
    total = sum(st.grown_by.values())
    top = sorted(st.grown_by.items(), key=lambda kv: -kv[1])[:3]
    if total > 0 and top:
        what += ", " + ", ".join(f"{100 * v / total:.0f}% from rule {k}" for k, v in top)
    if reason == "node_limit" and starved:
        held = sorted(starved.items(), key=lambda kv: -kv[1])[:3]
        what += "; not applied (their matches would pass the limit): " + ", ".join(
            f"rule {k} (up to {v} e-nodes)" for k, v in held)
    st.limit_note = what


def recognize(eg, st, lim: Limits, reserve: float = 0.0, progress=None) -> None:
    """The recognition e-graph's schedule: simplify to saturation, then bounded rounds of grow."""
    grow_nodes = max(1, int(lim.nodes * GROW_NODE_SHARE))
    kw = dict(reserve=reserve, progress=progress)
    if not run_phase(eg, SIMPLIFY, st, lim, **kw) and st.stop_reason != "saturated":
        return
    for _ in range(GROW_ROUNDS if GROW in eg.rulesets else 0):
        if eg.size() >= grow_nodes:
            break
        n = eg.size()
        run_phase(eg, GROW, st, lim, node_limit=grow_nodes, max_steps=1, **kw)
        if st.stop_reason != "saturated":
            return
        if eg.size() == n:
            break
        if not run_phase(eg, SIMPLIFY, st, lim, **kw) and st.stop_reason != "saturated":
            return
