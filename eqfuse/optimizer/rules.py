"""Rewrite rules: the .rw language (README: "Writing rules"), parsed into plain data the optimizer compiles.

The pattern dataclasses below are the contract with the e-graph half of the optimizer. Notes
on their meaning beyond the field comments:

- PNum matches a "const" node whose value equals it in float32 (np.float32(a) == np.float32(b)),
  so 0.7978845608 and 0.7978845608028654 are the same literal.
- A variable tested with const(?c) may also appear as an attribute value on the other side
  (`... + ?eps => layernorm(..., eps=?eps) where const(?eps)`): the attribute takes the
  constant's value. In a condition, ("attr", "c") of such a variable is that value.
- A variable repeated in a pattern must meet the same e-class (the Python matcher `match`
  below: structurally equal nodes).
- Rule.text is the rule's source with comments removed and lines joined.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from lark import Token
from lark.exceptions import UnexpectedInput, VisitError

from eqfuse.errors import EqfuseError, Pos
from eqfuse.frontend import syntax as S
from eqfuse.frontend.parser import (
    NewlinePostLexer,
    SourceText,
    ToAst,
    decode_source,
    per_thread,
    syntax_error,
)
from eqfuse.ir.ops import INFIX, OPS, REQUIRED, normalize_attr


@dataclass(frozen=True)
class PVar:
    name: str  # ?x  (name without '?')


@dataclass(frozen=True)
class PNum:
    value: float  # a literal: matches a scalar constant of that value


@dataclass(frozen=True)
class AttrVar:
    name: str  # ?p used as an attribute value (perm=?p)


@dataclass(frozen=True)
class POp:
    op: str
    args: tuple
    attrs: tuple[tuple[str, object], ...]
    # attrs: EVERY attribute of the op in op-table order; unwritten ones hold the op's default
    # (a pattern `softmax(?x)` matches only axis=-1); values are normalized like
    # ops.complete_attrs does, or an AttrVar


@dataclass(frozen=True)
class PKernel:
    result: object  # kernel { ... } in a pattern; local `t = ...` lines inlined


@dataclass(frozen=True)
class Cond:
    lhs: object
    op: str  # == != < <= > >=
    rhs: object
    # terms: ("rank", "x") | ("shape", "x") | ("dim", "x", i) | ("size", "x") | ("attr", "p")
    #        | number | tuple of numbers


@dataclass(frozen=True)
class Test:
    fn: str
    var: str  # const(?x)

    __test__ = False  # not a pytest test class


@dataclass(frozen=True)
class Rule:
    name: str
    lhs: object
    rhs: object
    conds: tuple
    file: str
    line: int
    text: str
    reverse: bool = False  # the right-to-left half of a `<=>` rule (same name)
    pos: Pos | None = field(default=None, compare=False)  # of the name, for errors


# ---------------------------------------------------------------- parsing


CMPS = ("==", "!=", "<", "<=", ">", ">=")
SHAPE_FNS = {"rank": 1, "shape": 1, "size": 1, "dim": 2}  # condition functions -> argument count
TESTS = ("const",)
RULES_DIR = Path(__file__).parent / "rules"


@dataclass(frozen=True)
class VarAst:
    name: str
    pos: Pos
    depth: int = 1


@dataclass(frozen=True)
class AttrVarAst:
    name: str
    pos: Pos


@dataclass(frozen=True)
class TermAst:
    kind: str  # fn | var | num | list
    value: object  # fn: (name, args) ; var: name ; num: number ; list: tuple
    pos: Pos


@dataclass(frozen=True)
class CondAst:
    lhs: TermAst
    op: str | None
    rhs: TermAst | None
    pos: Pos


@dataclass(frozen=True)
class RuleAst:
    name: str
    lhs: object
    arrow: str
    rhs: object
    conds: tuple
    pos: Pos  # of the name
    line: int  # of the 'rule' keyword
    text: str


def _where_calls(stream):
    """`where(` is the where op, not the keyword that starts a rule's guard."""
    prev = None
    for tok in stream:
        if prev is not None:
            if prev.type == "WHERE" and tok.type == "LPAR":
                prev = Token.new_borrow_pos("NAME", str(prev), prev)
            yield prev
        prev = tok
    if prev is not None:
        yield prev


class RulesPostLexer(NewlinePostLexer):
    """The graph language's newline handling, plus continuation lines.

    Outside kernel blocks a newline ends a rule only when the next line starts another rule,
    so a long rule continues on as many lines as it needs. Inside a kernel block newlines end
    its statements as in .g files, except after an operator.
    """

    AFTER = ("PLUS", "MINUS", "STAR", "SLASH", "AT", "POW", "COLON", "ARROW", "BIARROW", "WHERE", "AND",
             "CMP", "EQUAL")

    def process(self, stream):
        pending = None
        prev = None
        depth = 0  # kernel braces
        for tok in super().process(_where_calls(stream)):
            if tok.type == "_NL":
                if depth and prev in self.AFTER:
                    continue
                pending = tok
                continue
            if pending is not None:
                if depth or tok.type == "RULE":
                    yield pending
                pending = None
            depth += {"LBRACE": 1, "RBRACE": -1}.get(tok.type, 0)
            prev = tok.type
            yield tok
        if pending is not None and depth:
            yield pending


class RulesToAst(ToAst):
    def var(self, c):
        return VarAst(str(c[0])[1:], self.src.at(c[0]))

    def attr_var(self, c):
        return AttrVarAst(str(c[0])[1:], self.src.at(c[0]))

    def assign(self, c):
        return S.Assign(str(c[0]), c[1], self.src.at(c[0]))

    def arrow(self, c):
        return c[0]

    def fn_term(self, c):
        return TermAst("fn", (str(c[0]), tuple(c[1:])), self.src.at(c[0]))

    def var_term(self, c):
        return TermAst("var", str(c[0])[1:], self.src.at(c[0]))

    def num_term(self, c):
        return TermAst("num", c[0], None)

    def list_term(self, c):
        return TermAst("list", tuple(c), None)

    def cond(self, c):
        lhs = c[0]
        if len(c) == 1:
            return CondAst(lhs, None, None, lhs.pos)
        return CondAst(lhs, str(c[1]), c[2], self.src.at(c[1]))

    def rule(self, c):
        kw, name, lhs, arrow, rhs = c[:5]
        conds = tuple(x for x in c[5:] if isinstance(x, CondAst))
        return RuleAst(str(name), lhs, str(arrow), rhs, conds, self.src.at(name), kw.line, "")

    def module(self, c):
        return [x for x in c if isinstance(x, RuleAst)]


@per_thread
def rules_lark():
    from lark import Lark

    from eqfuse.frontend.parser import data_dir

    text = (data_dir("grammar") / "rules.lark").read_text()
    return Lark(text, parser="lalr", start="module", postlex=RulesPostLexer(), maybe_placeholders=False,
                lexer="basic")  # basic: the post-lexer looks one token ahead, past the parser's state


def _did_you_mean(word: str, options) -> str | None:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f"did you mean '{close[0]}'?" if close else None


class Side:
    """Converts one side of a rule to a pattern, recording where each variable is used."""

    def __init__(self):
        self.tensor_vars: dict[str, Pos] = {}
        self.attr_vars: dict[str, Pos] = {}

    def expr(self, e, local: dict | None = None):
        if isinstance(e, VarAst):
            if e.name in self.attr_vars:
                raise EqfuseError(f"?{e.name} is used as an attribute elsewhere in this side; "
                                  "a variable is either a tensor or an attribute value", e.pos)
            self.tensor_vars.setdefault(e.name, e.pos)
            return PVar(e.name)
        if isinstance(e, S.Num):
            return PNum(float(e.value))
        if isinstance(e, S.Name):
            if local is not None and e.id in local:
                return local[e.id]
            raise EqfuseError(f"unknown name '{e.id}' in a pattern", e.pos,
                              f"pattern variables start with '?': write ?{e.id}")
        if isinstance(e, S.Neg):
            if isinstance(e.x, S.Num):
                return PNum(-float(e.x.value))
            return POp("neg", (self.expr(e.x, local),), ())
        if isinstance(e, S.BinOp):
            return POp(INFIX[e.op], (self.expr(e.lhs, local), self.expr(e.rhs, local)), ())
        if isinstance(e, S.Call):
            return self.call(e, local)
        if isinstance(e, S.Kernel):
            if local is not None:
                raise EqfuseError("kernel blocks cannot be nested", e.pos)
            scope: dict = {}
            for a in e.assigns:
                if a.name in scope:
                    raise EqfuseError(f"'{a.name}' is already defined in this kernel block", a.pos)
                scope[a.name] = self.expr(a.expr, scope)
            return PKernel(self.expr(e.result, scope))
        raise TypeError(e)

    def call(self, e: S.Call, local):
        op = OPS.get(e.op)
        if op is None:
            if e.op == "kernel":
                raise EqfuseError("'kernel' is written as kernel { ... }, not called", e.pos)
            raise EqfuseError(f"unknown op '{e.op}'", e.pos, _did_you_mean(e.op, OPS))
        lo, hi = op.arity
        n = len(e.args)
        if n < lo or (hi >= 0 and n > hi):
            want = f"{lo}" if lo == hi else (f"at least {lo}" if hi < 0 else f"{lo} to {hi}")
            raise EqfuseError(f"{e.op} takes {want} tensor argument{'s' if hi != 1 else ''}, got {n}", e.pos)
        given: dict = {}
        for kw in e.kwargs:
            spec = op.attr_spec(kw.name)
            if spec is None:
                valid = ", ".join(a.name for a in op.attrs) or "none"
                raise EqfuseError(f"{e.op} has no attribute '{kw.name}' (its attributes: {valid})", kw.pos)
            if kw.name in given:
                raise EqfuseError(f"attribute '{kw.name}' given twice", kw.pos)
            if isinstance(kw.value, AttrVarAst):
                v = kw.value
                if v.name in self.tensor_vars:
                    raise EqfuseError(f"?{v.name} is used as a tensor elsewhere in this side; "
                                      "a variable is either a tensor or an attribute value", v.pos)
                self.attr_vars.setdefault(v.name, v.pos)
                given[kw.name] = AttrVar(v.name)
                continue
            try:
                given[kw.name] = normalize_attr(spec, kw.value)
            except ValueError as err:
                raise EqfuseError(f"attribute {kw.name}= of {e.op} {err}", kw.pos) from None
        attrs = []
        for spec in op.attrs:
            if spec.name in given:
                attrs.append((spec.name, given[spec.name]))
            elif spec.default is REQUIRED:
                raise EqfuseError(f"{e.op} needs the attribute {spec.name}= (a value or a ?variable)", e.pos)
            else:
                attrs.append((spec.name, spec.default))
        return POp(e.op, tuple(self.expr(a, local) for a in e.args), tuple(attrs))


GUARD_TERMS = ("a condition compares attribute variables (?p), scalar constants tested with const(?c), "
               "numbers, lists and rank/shape/size/dim(?x, AXIS) of a tensor")


def rule_condition(c: CondAst, sides: list[Side], consts: frozenset = frozenset()):
    """A condition of the `where` clause; every variable it names must be bound by each side in
    `sides`. A tensor variable is compared only when const(?x) makes it a scalar constant
    (`consts`): a guard on a tensor's values (?x > 0) holds or not element by element, and the
    optimizer, which sees no values, could not check it where it applies the rule."""

    def bound(name: str, pos: Pos, want: str) -> None:
        for side in sides:
            if want == "tensor" and name not in side.tensor_vars:
                where = "the left side" if side is sides[0] else "the right side (the rule is <=>)"
                raise EqfuseError(f"?{name} in this condition is not a tensor variable of {where}", pos)
            if want == "attr" and name not in side.attr_vars and name not in side.tensor_vars:
                where = "the left side" if side is sides[0] else "the right side (the rule is <=>)"
                raise EqfuseError(f"?{name} in this condition is not bound by {where}", pos)

    def term(t: TermAst):
        if t.kind == "num":
            return t.value
        if t.kind == "list":
            return tuple(t.value)
        if t.kind == "var":
            bound(t.value, t.pos, "attr")
            if t.value in sides[0].tensor_vars and t.value not in consts:
                raise EqfuseError(f"?{t.value} is a tensor, and a rule cannot be guarded by a tensor's values: "
                                  f"{GUARD_TERMS} (a scalar constant: add `where const(?{t.value})`)", t.pos)
            return ("attr", t.value)
        fn, args = t.value
        if fn in TESTS:
            raise EqfuseError(f"{fn}(...) is a test, not a value: write it on its own (where {fn}(?x))", t.pos)
        if fn not in SHAPE_FNS:
            raise EqfuseError(f"unknown condition function '{fn}' (known: {', '.join([*SHAPE_FNS, *TESTS])})",
                              t.pos, _did_you_mean(fn, [*SHAPE_FNS, *TESTS]))
        if len(args) != SHAPE_FNS[fn] or args[0].kind != "var":
            usage = "dim(?x, AXIS)" if fn == "dim" else f"{fn}(?x)"
            raise EqfuseError(f"{fn} is written {usage}", t.pos)
        bound(args[0].value, args[0].pos, "tensor")
        if fn == "dim":
            axis = args[1]
            if axis.kind != "num" or not isinstance(axis.value, int):
                raise EqfuseError("the axis of dim(?x, AXIS) must be an integer", t.pos)
            return ("dim", args[0].value, axis.value)
        return (fn, args[0].value)

    if c.op is None:
        t = c.lhs
        if t.kind == "fn" and t.value[0] in TESTS:
            args = t.value[1]
            if len(args) != 1 or args[0].kind != "var":
                raise EqfuseError(f"{t.value[0]} is written {t.value[0]}(?x)", t.pos)
            bound(args[0].value, args[0].pos, "tensor")
            return Test(t.value[0], args[0].value)
        if t.kind == "fn" and t.value[0] in SHAPE_FNS:
            raise EqfuseError(f"{t.value[0]}(...) is a value, not a test: compare it (e.g. == 2)", t.pos)
        if t.kind == "fn":
            fn = t.value[0]
            raise EqfuseError(f"unknown condition function '{fn}' (known: {', '.join([*SHAPE_FNS, *TESTS])})",
                              t.pos, _did_you_mean(fn, [*SHAPE_FNS, *TESTS]))
        raise EqfuseError("a condition compares two values (== != < <= > >=) or tests const(?x)", c.pos)
    return Cond(term(c.lhs), c.op, term(c.rhs))


def _check_binds(frm: Side, to: Side, tests: set[str], reverse: bool) -> None:
    """Every variable of the side written to must be bound by the side matched."""
    note = " (the rule is <=>, so each side must bind the other's variables)" if reverse else ""
    which = "left" if reverse else "right"
    other = "right" if reverse else "left"
    for name, pos in to.tensor_vars.items():
        if name not in frm.tensor_vars:
            raise EqfuseError(f"?{name} on the {which} is not bound by the {other} side{note}", pos)
    for name, pos in to.attr_vars.items():
        if name in frm.attr_vars:
            continue
        if name in frm.tensor_vars:
            if name not in tests:
                raise EqfuseError(f"?{name} is used as an attribute value but the {other} side binds it to a "
                                  f"tensor{note}", pos, f"add `where const(?{name})` to take a constant's value")
            continue
        raise EqfuseError(f"?{name} on the {which} is not bound by the {other} side{note}", pos)


def rule_texts(src: SourceText, asts: list[RuleAst]) -> list[str]:
    starts = [r.line for r in asts] + [len(src.lines) + 1]
    out = []
    for a, b in zip(starts, starts[1:]):
        parts = [ln.split("#", 1)[0].strip() for ln in src.lines[a - 1:b - 1]]
        out.append(" ".join(p for p in parts if p))
    return out


def parse_rule_asts(text: str | bytes, file: str = "<string>") -> list[tuple[RuleAst, str]]:
    """A .rw text's rules (the grammar's: rewrite rules and derivatives alike), each with its own
    text (rule_texts); a syntax error, or a name defined twice, is a user-facing EqfuseError."""
    text = decode_source(text, file)
    src = SourceText(text, file)
    parser = rules_lark()
    try:
        tree = parser.parse(text)
    except UnexpectedInput as e:
        raise syntax_error(e, src, getattr(parser.options.postlex, "open", ())) from None
    try:
        asts = RulesToAst(src).transform(tree)
    except VisitError as e:  # lark wraps what a callback raises; ours are already user-facing
        if isinstance(e.orig_exc, EqfuseError):
            raise e.orig_exc from None
        raise
    seen: dict[str, int] = {}
    for r in asts:
        if r.name in seen:
            raise EqfuseError(f"rule '{r.name}' is already defined at line {seen[r.name]}", r.pos)
        seen[r.name] = r.line
    return list(zip(asts, rule_texts(src, asts)))


def parse_rules(text: str | bytes, file: str = "<string>") -> list[Rule]:
    """Parse and validate a .rw text; a `<=>` rule yields two Rule objects of the same name."""
    rules: list[Rule] = []
    for r, rtext in parse_rule_asts(text, file):
        lhs_side, rhs_side = Side(), Side()
        lhs = lhs_side.expr(r.lhs)
        rhs = rhs_side.expr(r.rhs)
        both = r.arrow == "<=>"
        for side, pat, e in ((lhs_side, lhs, r.lhs), (rhs_side, rhs, r.rhs)):
            if (side is lhs_side or both) and isinstance(pat, (PVar, PNum)):
                raise EqfuseError("the side a rule matches must be an operation, not a lone "
                                  + ("variable" if isinstance(pat, PVar) else "number"), e.pos)
        consts = frozenset(c.lhs.value[1][0].value for c in r.conds
                           if c.op is None and c.lhs.kind == "fn" and c.lhs.value[0] in TESTS
                           and len(c.lhs.value[1]) == 1 and c.lhs.value[1][0].kind == "var")
        conds = tuple(rule_condition(c, [lhs_side, rhs_side] if both else [lhs_side], consts) for c in r.conds)
        tests = {c.var for c in conds if isinstance(c, Test)}
        _check_binds(lhs_side, rhs_side, tests, False)
        if both:
            _check_binds(rhs_side, lhs_side, tests, True)
        rules.append(Rule(r.name, lhs, rhs, conds, file, r.line, rtext, pos=r.pos))
        if both:
            rules.append(Rule(r.name, rhs, lhs, conds, file, r.line, rtext, reverse=True, pos=r.pos))
    return rules


def rule_files() -> list[Path]:
    """The built-in rule files, in load order (eqfuse/optimizer/rules/*.rw sorted; extra/ is opt-in)."""
    return sorted(RULES_DIR.glob("*.rw"))


def rule_file_bytes(path: Path) -> bytes:
    """A rule file's bytes; a missing or unreadable one is a user-facing EqfuseError."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise EqfuseError(f"{path}: no such rule file") from None
    except OSError as e:
        raise EqfuseError(f"{path}: cannot read ({e.strerror})") from None


def read_rule_file(path) -> list[Rule]:
    path = Path(path)
    return _parsed(rule_file_bytes(path), str(path))


def _parsed(data: bytes, file: str) -> list[Rule]:
    """parse_rules(data, file), kept by content under the cache directory: the built-in rules
    are parsed once per machine, not at every start (parsing them was a fifth of
    `eqfuse opt examples/mlp.g`'s time; python -m cProfile -m eqfuse opt examples/mlp.g). The key
    covers the file's bytes and name, eqfuse's version and the parser's own sources; a file with
    an error is not kept (it fails the same way each time)."""
    import hashlib
    import pickle

    from eqfuse.cache import read_entry, usable_cache_dir, write_entry

    h = hashlib.sha256(b"eqfuse parsed rules\0")
    h.update(_parser_fingerprint())
    h.update(file.encode() + b"\0")
    h.update(data)
    try:
        entry = usable_cache_dir() / "rules" / f"{h.hexdigest()}.parsed"
    except OSError:
        return parse_rules(data, file)
    payload = read_entry(entry)
    if payload is not None:
        try:
            return pickle.loads(payload)
        except Exception:  # written by an incompatible build despite the key: parse again
            pass
    rules = parse_rules(data, file)
    write_entry(entry, pickle.dumps(rules, protocol=pickle.HIGHEST_PROTOCOL))
    return rules


@functools.lru_cache(maxsize=None)
def _parser_fingerprint() -> bytes:
    """What parsed rules depend on besides the file: eqfuse's version and the sources that parse them."""
    import hashlib

    from eqfuse.frontend.parser import data_dir
    from eqfuse.version import __version__

    h = hashlib.sha256(__version__.encode() + b"\0")
    package = Path(__file__).parent.parent
    for f in (Path(__file__), *sorted((package / "ir").glob("ops*.py")), package / "frontend" / "syntax.py",
              package / "frontend" / "parser.py", data_dir("grammar") / "rules.lark"):
        try:
            h.update(f.read_bytes())
        except OSError:
            h.update(str(f).encode())
    return h.digest()


def _file_bytes(path) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except OSError:
        return None  # (read_rule_file says what is wrong with it)


def load_rules(extra_files: Iterable = (), disable: Iterable[str] = ()) -> list[Rule]:
    """Every built-in rule, then the user's files, minus the disabled names. Rule names are
    global: a user's rule named like a built-in one, or like one of another file, is refused
    (`eqfuse check-rules` refuses it too, through this)."""
    rules: list[Rule] = []
    where: dict[str, Rule] = {}
    builtin = rule_files()
    seen_files = {p.resolve() for p in builtin}
    builtin_texts = {p.read_bytes() for p in builtin}
    for path in [*builtin, *extra_files]:
        if path not in builtin and (Path(path).resolve() in seen_files or _file_bytes(path) in builtin_texts):
            continue  # a file given twice, or a built-in file given again (also a copy of it): its rules are in
        seen_files.add(Path(path).resolve())
        for r in read_rule_file(path):
            prev = where.get(r.name)
            if prev is not None and (prev.file, prev.line) != (r.file, r.line):
                kind = "a built-in rule" if Path(prev.file) in builtin else "a rule"
                raise EqfuseError(f"rule '{r.name}' is already defined: {kind} at {prev.file}:{prev.line}", r.pos,
                                  hint="rule names are global (--disable and reports use them); rename yours")
            where[r.name] = r
            rules.append(r)
    disable = list(disable)
    unknown = [d for d in disable if d not in where]
    if unknown:
        raise EqfuseError(f"--disable: no rule named '{unknown[0]}'", hint=_did_you_mean(unknown[0], where))
    off = set(disable)
    return [r for r in rules if r.name not in off]
