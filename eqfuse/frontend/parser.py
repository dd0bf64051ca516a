"""Stage 1: text -> syntax tree. Lark (LALR) with the grammar in grammar/graph.lark."""

from __future__ import annotations

import functools
import math
import threading
from pathlib import Path

import numpy as np
from lark import Lark, Token
from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)
from lark.visitors import Transformer_NonRecursive

from eqfuse.errors import EqfuseError, Pos
from eqfuse.frontend import syntax as S
from eqfuse.ir.dtypes import f32_literal, f32_of_decimal, round_f32, same_f32

MAX_DEPTH = 200  # expression nesting; deeper input is refused with a clear error, not a crash


def data_dir(name: str) -> Path:
    """grammar/ and csrc_templates/ sit beside the package when installed, at the top of a checkout."""
    package = Path(__file__).parent.parent
    installed = package / name
    return installed if installed.is_dir() else package.parent / name


# Parsers are built one at a time: building a lark grammar reads its string literals with
# ast.literal_eval, and CPython before 3.11.8 and 3.12.1 keeps the AST validator's recursion depth
# per interpreter, not per thread, so two threads building at once may fail with "AST constructor
# recursion depth mismatch" (CPython gh-106905; tests/test_reliability.py's two compiling threads).
_BUILDING = threading.Lock()


def per_thread(make):
    """functools.cache with one cache per thread: a lark parser's post-lexer keeps state while it
    parses (the brackets still open), so two threads parsing at once must not share one. Built
    under _BUILDING."""
    local = threading.local()

    @functools.wraps(make)
    def get(*args):
        cache = local.__dict__.setdefault("cache", {})
        if args not in cache:
            with _BUILDING:
                cache[args] = make(*args)
        return cache[args]
    return get


@per_thread
def lark_parser(grammar: str, start: str = "module") -> Lark:
    text = (data_dir("grammar") / grammar).read_text()
    return Lark(text, parser="lalr", start=start, postlex=NewlinePostLexer(), maybe_placeholders=False,
                cache=_lark_cache(grammar, start, text))


def _lark_cache(grammar: str, start: str, text: str) -> str | bool:
    """Where lark keeps this parser's tables (building them was a third of `eqfuse check`'s
    time): a file under eqfuse's cache directory, named by the grammar's digest (lark also checks
    the grammar and its own version inside it); False, no cache, when that directory is unusable."""
    import hashlib

    from eqfuse.cache import usable_cache_dir

    try:
        where = usable_cache_dir() / "parsers"
        where.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return False
    digest = hashlib.sha256(f"{grammar}\0{start}\0{text}".encode()).hexdigest()[:32]
    return str(where / f"{Path(grammar).stem}-{digest}.lark")


class NewlinePostLexer:
    """Makes newlines end statements only where that is meant.

    Drops newlines inside (...) and [...], after '{' and ',' and after another newline, and
    inserts one before every '}' so a block's last line needs no trailing newline.
    """

    # RBRACE too: the contextual lexer would refuse a "}" where the grammar wants the _NL we insert.
    always_accept = ("_NL", "RBRACE")

    def __init__(self):
        self.open: list[Token] = []  # the brackets still open where lexing stopped, for error hints

    def process(self, stream):
        stack: list[str] = []
        self.open = []
        prev = None
        for tok in stream:
            t = tok.type
            if t == "_NL":
                if (stack and stack[-1] != "{") or prev in (None, "_NL", "LBRACE", "COMMA"):
                    continue
            elif t in ("LPAR", "LSQB", "LBRACE"):
                stack.append({"LPAR": "(", "LSQB": "[", "LBRACE": "{"}[t])
                self.open.append(tok)
            elif t in ("RPAR", "RSQB", "RBRACE"):
                if stack:
                    stack.pop()
                    self.open.pop()
                if t == "RBRACE" and prev not in ("_NL", "LBRACE"):
                    yield Token.new_borrow_pos("_NL", "\n", tok)
            prev = t
            yield tok


TOKEN_NAMES = {
    "NAME": "a name", "NUMBER": "a number", "INT": "an integer", "STRING": "a string", "_NL": "end of line",
    "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'", "LBRACE": "'{'", "RBRACE": "'}'",
    "COMMA": "','", "COLON": "':'", "EQUAL": "'='", "PLUS": "'+'", "MINUS": "'-'", "STAR": "'*'",
    "SLASH": "'/'", "AT": "'@'", "POW": "'**'", "CMP": "a comparison", "RETURN": "'return'", "KERNEL": "'kernel'",
    "GRAPH": "'graph'", "__ANON_0": "'->'", "$END": "end of file", "TRUE": "'true'", "FALSE": "'false'",
    "QMARK": "'?'", "VAR": "a ?variable", "RULE": "'rule'", "ARROW": "'=>'", "BIARROW": "'<=>'",
}


LITERALS = {"TRUE", "FALSE", "INF", "NAN"}  # where a number may stand, these literals may too


def describe_expected(expected) -> str:
    expected = set(expected)
    if "NUMBER" in expected:
        expected -= LITERALS
    names = sorted({TOKEN_NAMES.get(e, f"'{e.lower()}'" if e.isupper() else e) for e in expected})
    if len(names) > 8:
        names = names[:8] + ["..."]
    return ", ".join(names)


class SourceText:
    def __init__(self, text: str, file: str):
        self.file = file
        self.lines = text.split("\n")

    def pos(self, line: int, col: int, width: int = 1) -> Pos:
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return Pos(self.file, line, col, text, max(1, width))

    def end(self) -> Pos:
        """The position just after the last non-blank line (where an unexpected EOF happened)."""
        line = max((i + 1 for i, ln in enumerate(self.lines) if ln.strip()), default=1)
        return self.pos(line, len(self.lines[line - 1].rstrip()) + 1)

    def at(self, tok: Token) -> Pos:
        return self.pos(tok.line, tok.column, len(tok.value) if tok.type != "_NL" else 1)


def decode_source(data: bytes | str, file: str) -> str:
    """Refuse binary and empty inputs with a clear message before the parser sees them."""
    if isinstance(data, bytes):
        if b"\0" in data[:8192]:
            raise EqfuseError(f"{file} is a binary file, not a .g text file")
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise EqfuseError(f"{file} is not UTF-8 text (byte {e.start} cannot be decoded)") from None
    if "\0" in data:
        raise EqfuseError(f"{file} contains NUL characters; it is not a text file")
    return data.removeprefix("\ufeff")  # a UTF-8 byte order mark, as some editors write


def unclosed_hint(open_brackets, line: int) -> str | None:
    """A note about the innermost '(' or '[' left open on an earlier line than the error."""
    for tok in reversed(open_brackets):
        if tok.type in ("LPAR", "LSQB"):
            if tok.line < line:
                return f"the '{tok.value}' at line {tok.line}, column {tok.column} is never closed"
            return None
    return None


def syntax_error(e: UnexpectedInput, src: SourceText, open_brackets=()) -> EqfuseError:
    if isinstance(e, UnexpectedToken):
        tok = e.token
        expected = e.expected
        if e.interactive_parser is not None:  # the parser's own view is exact; e.expected may
            expected = e.interactive_parser.accepts()  # include the post-lexer's always_accept
        if tok.type == "$END":
            return EqfuseError(f"unexpected end of file, expected {describe_expected(expected)}", src.end())
        shown = "end of line" if tok.type == "_NL" else repr(str(tok))
        hint = unclosed_hint(open_brackets, tok.line)
        if tok.type in ("KERNEL", "RETURN") and "NAME" in expected:
            hint = f"'{tok}' is a keyword; it cannot be used as a name"
        return EqfuseError(f"unexpected {shown}, expected {describe_expected(expected)}", src.at(tok), hint)
    if isinstance(e, UnexpectedCharacters):
        ch = src.lines[e.line - 1][e.column - 1] if e.line <= len(src.lines) else "?"
        if ch in "\"'":
            return EqfuseError(f"unterminated string: no closing {ch} on this line", src.pos(e.line, e.column))
        return EqfuseError(f"unexpected character {ch!r}", src.pos(e.line, e.column))
    if isinstance(e, UnexpectedEOF):
        return EqfuseError(f"unexpected end of file, expected {describe_expected(e.expected)}", src.end())
    return EqfuseError(str(e))


class ToAst(Transformer_NonRecursive):
    """Builds syntax dataclasses; non-recursive so long chains like a+b+c+... cannot blow the stack."""

    def __init__(self, src: SourceText):
        super().__init__()
        self.src = src

    def _depth(self, node, *kids):
        depth = 1 + max((k.depth for k in kids), default=0)
        if depth > MAX_DEPTH:
            raise EqfuseError(f"expression nested too deeply (more than {MAX_DEPTH} levels)", node.pos)
        return type(node)(**{**node.__dict__, "depth": depth})

    # expressions
    def _finite(self, text: str, tok: Token) -> float:
        """The value of a number literal: a decimal means the f32 nearest to it (ties to even), so
        3.4028235e+38 (the shortest text of FLT_MAX, and a little above it) is FLT_MAX; only a number
        that rounds to inf is refused. The value kept is the double of the text (exact for integers,
        which i64 uses need) unless numpy's rounding of that double to f32 would differ (the double
        lies exactly halfway between two f32s, the decimal does not): then the f32's shortest text."""
        f = f32_of_decimal(text)
        if np.isinf(f):
            raise EqfuseError(f"number {text} is too large for f32", self.src.at(tok),
                              "the largest f32 is 3.4028235e+38; write inf for infinity")
        v = float(text)
        return v if same_f32(round_f32(v), f) else f32_literal(f)

    def number(self, c):
        return S.Num(self._finite(str(c[0]), c[0]), self.src.at(c[0]))

    def name(self, c):
        return S.Name(str(c[0]), self.src.at(c[0]))

    # true and false are the scalar literals 1 and 0, weakly typed like every literal: next to a
    # bool tensor they are bool (eqfuse/ir/dtypes.py)
    def true(self, c):
        return S.Num(1.0, self.src.at(c[0])) if c else S.Num(1.0, None)

    def false(self, c):
        return S.Num(0.0, self.src.at(c[0])) if c else S.Num(0.0, None)

    # inf and nan: the float literals an export's masks and guards need (-inf is neg of inf,
    # folded to the constant -inf like every negative literal)
    def inf(self, c):
        return S.Num(float("inf"), self.src.at(c[0])) if c else S.Num(float("inf"), None)

    def nan(self, c):
        return S.Num(float("nan"), self.src.at(c[0])) if c else S.Num(float("nan"), None)

    def binop(self, c):
        lhs, op, rhs = c
        return self._depth(S.BinOp(str(op), lhs, rhs, self.src.at(op)), lhs, rhs)

    def neg(self, c):
        return self._depth(S.Neg(c[1], self.src.at(c[0])), c[1])

    def call(self, c):
        args = tuple(a for a in c[1:] if not isinstance(a, S.KwArg))
        kwargs = tuple(a for a in c[1:] if isinstance(a, S.KwArg))
        return self._depth(S.Call(str(c[0]), args, kwargs, self.src.at(c[0])), *args)

    def kwarg(self, c):
        return S.KwArg(str(c[0]), c[1], self.src.at(c[0]))

    def kernel(self, c):
        assigns, result = tuple(c[1:-1]), c[-1]
        return self._depth(S.Kernel(assigns, result, self.src.at(c[0])), result, *(a.expr for a in assigns))

    # attribute values
    def signed(self, c):
        text = "".join(str(t) for t in c)
        v = self._finite(text, c[-1])
        return int(text) if not any(ch in text for ch in ".eE") else v  # int(text): exact beyond 2^53

    def signed_inf(self, c):
        return -math.inf if c else math.inf

    def signed_nan(self, c):
        return math.nan

    def attr_num(self, c):
        return c[0]

    def attr_list(self, c):
        return tuple(c)

    def attr_str(self, c):
        return str(c[0])[1:-1]

    def attr_true(self, c):
        return True

    def attr_false(self, c):
        return False

    # statements and graphs
    def assign(self, c):
        return S.Assign(str(c[0]), c[1], self.src.at(c[0]))

    def ret(self, c):
        return S.Return(tuple(c[1:]), self.src.at(c[0]))

    def int_dim(self, c):
        return int(c[0])

    def name_dim(self, c):
        return str(c[0])

    def type(self, c):
        tok = c[0]
        dims = tuple(c[1:]) if len(c) > 1 or self._has_brackets(tok) else None
        return S.TypeAst(str(tok), dims, self.src.at(tok))

    def _has_brackets(self, tok: Token) -> bool:
        line = self.src.lines[tok.line - 1]
        rest = line[tok.column - 1 + len(tok.value):].lstrip()
        return rest.startswith("[")

    def param(self, c):
        return S.Param(str(c[0]), c[1], self.src.at(c[0]))

    def one_result(self, c):
        return (c[0],)

    def many_results(self, c):
        return tuple(c)

    def graph(self, c):
        name, rest = c[0], c[1:]
        params = tuple(x for x in rest if isinstance(x, S.Param))
        results = next((x for x in rest if isinstance(x, tuple)), None)
        body = tuple(x for x in rest if isinstance(x, (S.Assign, S.Return)))
        end = next((x for x in reversed(rest) if isinstance(x, Token)), name)
        return S.GraphAst(str(name), params, results, body, self.src.at(name), self.src.at(end))

    def module(self, c):
        return list(c)


def parse(text: str | bytes, file: str = "<string>") -> S.ModuleAst:
    text = decode_source(text, file)
    src = SourceText(text, file)
    if not text.strip() or all(not ln.strip() or ln.lstrip().startswith("#") for ln in src.lines):
        raise EqfuseError(f"{file} is empty: expected at least one 'graph NAME(...) {{ ... }}'",
                          src.pos(1, 1) if text else None)
    parser = lark_parser("graph.lark")
    try:
        tree = parser.parse(text)
    except UnexpectedInput as e:
        raise syntax_error(e, src, parser.options.postlex.open) from None
    try:
        graphs = ToAst(src).transform(tree)
    except VisitError as e:  # lark wraps what a callback raises; ours are already user-facing
        if isinstance(e.orig_exc, EqfuseError):
            raise e.orig_exc from None
        raise
    return S.ModuleAst(tuple(graphs), file)
