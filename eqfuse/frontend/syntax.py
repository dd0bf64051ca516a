"""The abstract syntax of .g files: small frozen dataclasses that keep their source position.

The parser's Transformer only builds these; all checking happens in the graph builder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from eqfuse.errors import Pos

AttrValue = Union[int, float, str, bool, tuple]


@dataclass(frozen=True)
class Name:
    id: str
    pos: Pos
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True)
class Num:
    value: float
    pos: Pos
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True)
class BinOp:
    op: str  # the infix symbol: + - * / @ **
    lhs: "Expr"
    rhs: "Expr"
    pos: Pos  # of the operator
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True)
class Neg:
    x: "Expr"
    pos: Pos
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True)
class KwArg:
    name: str
    value: AttrValue
    pos: Pos


@dataclass(frozen=True)
class Call:
    op: str
    args: tuple["Expr", ...]
    kwargs: tuple[KwArg, ...]
    pos: Pos  # of the op name
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True)
class Assign:
    name: str
    expr: "Expr"
    pos: Pos  # of the name


@dataclass(frozen=True)
class Kernel:
    assigns: tuple[Assign, ...]
    result: "Expr"
    pos: Pos  # of the 'kernel' keyword
    depth: int = field(default=1, compare=False)


Expr = Union[Name, Num, BinOp, Neg, Call, Kernel]


@dataclass(frozen=True)
class Return:
    exprs: tuple[Expr, ...]
    pos: Pos


@dataclass(frozen=True)
class TypeAst:
    dtype: str
    dims: tuple[Union[int, str], ...] | None  # None: a bare scalar type
    pos: Pos


@dataclass(frozen=True)
class Param:
    name: str
    type: TypeAst
    pos: Pos


@dataclass(frozen=True)
class GraphAst:
    name: str
    params: tuple[Param, ...]
    results: tuple[TypeAst, ...] | None
    body: tuple[Union[Assign, Return], ...]
    pos: Pos  # of the graph's name
    end: Pos  # of the closing brace


@dataclass(frozen=True)
class ModuleAst:
    graphs: tuple[GraphAst, ...]
    file: str
