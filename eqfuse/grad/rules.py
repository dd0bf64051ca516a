"""derivatives.rw: the rule language read as vector-Jacobian products.

`rule NAME: FORWARD => GRADIENT where wrt(?ARG) [and CONDITION ...]` is parsed by the .rw
parser (eqfuse/optimizer/rules.py: same grammar, same positions in errors); what differs is the
checking: ?dy and ?y are bound by the differentiation, not by FORWARD, the right side may call
the structural helpers of eqfuse/grad/helpers.py, and wrt(?ARG) names the argument.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from eqfuse.errors import EqfuseError
from eqfuse.frontend import syntax as S
from eqfuse.grad.helpers import HELPERS
from eqfuse.optimizer.rules import (
    AttrVar,
    AttrVarAst,
    POp,
    PVar,
    Side,
    parse_rule_asts,
    rule_condition,
)

DERIVATIVES = Path(__file__).parent / "derivatives.rw"
BOUND = ("dy", "y")  # variables the differentiation binds: the result's gradient and the result


@dataclass(frozen=True)
class PHelper:
    name: str
    args: tuple
    attrs: tuple[tuple[str, object], ...]


@dataclass(frozen=True)
class Derivative:
    name: str
    op: str
    lhs: POp  # the forward pattern
    wrt: int  # the argument position differentiated (variadic ops: any position)
    rhs: object
    conds: tuple
    file: str
    line: int
    text: str


class _GradSide(Side):
    def call(self, e: S.Call, local):
        if e.op not in HELPERS:
            return super().call(e, local)
        fn, n, names = HELPERS[e.op]
        if len(e.args) != n:
            raise EqfuseError(f"helper {e.op} takes {n} tensor argument{'s' * (n != 1)}, got {len(e.args)}", e.pos)
        attrs = {}
        for kw in e.kwargs:
            if kw.name not in names:
                raise EqfuseError(f"helper {e.op} has no attribute '{kw.name}' (its attributes: "
                                  f"{', '.join(names) or 'none'})", kw.pos)
            v = kw.value
            if isinstance(v, AttrVarAst):
                self.attr_vars.setdefault(v.name, v.pos)
                v = AttrVar(v.name)
            attrs[kw.name] = v
        missing = [a for a in names if a not in attrs]
        if missing:
            raise EqfuseError(f"helper {e.op} needs the attribute {missing[0]}=", e.pos)
        return PHelper(e.op, tuple(self.expr(a, local) for a in e.args), tuple(attrs.items()))


def parse_derivatives(text: str | bytes, file: str = "<string>") -> list[Derivative]:
    out = []
    for r, rtext in parse_rule_asts(text, file):
        if r.arrow != "=>":
            raise EqfuseError("a derivative is written FORWARD => GRADIENT (not <=>)", r.pos)
        lhs_side, rhs_side = Side(), _GradSide()
        lhs = lhs_side.expr(r.lhs)
        if not isinstance(lhs, POp) or not all(isinstance(a, PVar) for a in lhs.args) \
                or len({a.name for a in lhs.args}) != len(lhs.args):
            raise EqfuseError("the forward side is one op applied to distinct ?variables", r.pos)
        rhs = rhs_side.expr(r.rhs)
        wrt, conds = None, []
        for c in r.conds:
            t = c.lhs
            if c.op is None and t.kind == "fn" and t.value[0] == "wrt":
                args = t.value[1]
                if len(args) != 1 or args[0].kind != "var" or args[0].value not in [a.name for a in lhs.args]:
                    raise EqfuseError("wrt(?x) names one argument of the forward op", t.pos)
                wrt = [a.name for a in lhs.args].index(args[0].value)
            else:
                conds.append(rule_condition(c, [lhs_side]))
        if wrt is None:
            raise EqfuseError(f"derivative '{r.name}' does not say which argument it is for: add `where wrt(?x)`",
                              r.pos)
        bound = set(lhs_side.tensor_vars) | set(lhs_side.attr_vars) | set(BOUND)
        for name, pos in {**rhs_side.tensor_vars, **rhs_side.attr_vars}.items():
            if name not in bound:
                raise EqfuseError(f"?{name} is not bound: the gradient reads the forward op's variables, "
                                  "?dy (the result's gradient) and ?y (the result)", pos)
        out.append(Derivative(r.name, lhs.op, lhs, wrt, rhs, tuple(conds), file, r.line, rtext))
    return out


@functools.lru_cache(maxsize=None)
def derivatives() -> tuple[Derivative, ...]:
    return tuple(parse_derivatives(DERIVATIVES.read_bytes(), str(DERIVATIVES)))


def match(d: Derivative, attrs: dict) -> dict | None:
    """The attribute variables of d's forward side bound by a node's attributes, or None when a
    literal attribute of the pattern differs from the node's."""
    env = {}
    for k, v in d.lhs.attrs:
        if isinstance(v, AttrVar):
            env[v.name] = attrs[k]
        elif v != attrs[k]:
            return None
    return env
