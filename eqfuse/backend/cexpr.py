"""C expressions of kernel bodies, shared by every kind's emitter.

`Space` walks an index space with C loop variables (numpy broadcasting as strides, index
arithmetic from eqfuse.backend.indexing); `Exprs` writes the statements computing body values at
one element of it from the op table's C expressions; `render` fills a csrc_templates/ skeleton.
Generated names are deterministic: values v<node id>, offsets off<k>.
"""

from __future__ import annotations

from typing import Iterator

from eqfuse.backend.cbuild import render as cb_render
from eqfuse.backend.indexing import bstrides, offset
from eqfuse.backend.plan import KernelPlan
from eqfuse.ir.graph import Graph, Node
from eqfuse.ir.kernels import range_scalar
from eqfuse.ir.ops import OPS, OpKind, flit
from eqfuse.ir.shapes import C_TYPE, INT_DTYPES


class Space:
    """An index space (a shape) walked by C loop variables, each over a set of its dims.

    Hoisted variables are fixed in an enclosing loop: their part of each offset is declared
    once (in `decls`, as off<k>); the others are computed where the element is read.
    `ids` numbers those declarations: one counter per kernel, shared by all of the kernel's
    spaces, because templates put the declarations of several spaces (a row reduction's
    prologue and epilogue, attention's scores and output) in one C scope.
    """

    def __init__(self, shape, groups: list[tuple[str, list[int], bool]], indent: str, ids: Iterator[int]):
        self.shape = tuple(shape)
        self.groups = groups
        self.indent = indent
        self.decls: list[str] = []
        self._names: dict[tuple, str] = {}
        self._ids = ids

    def access(self, ptr: str, view, strides=None) -> str:
        st = bstrides(view, self.shape, strides)
        parts = []
        hoisted = []
        for var, dims, hoist in self.groups:
            off = offset(var, [self.shape[d] for d in dims], [st[d] for d in dims])
            if off == "0":
                continue
            (hoisted if hoist else parts).append(off)
        if hoisted:
            key = (ptr, tuple(hoisted))
            if key not in self._names:
                name = f"off{next(self._ids)}"
                self._names[key] = name
                self.decls.append(f"{self.indent}const long {name} = {' + '.join(hoisted)};")
            parts.insert(0, self._names[key])
        return f"{ptr}[{' + '.join(parts) or '0'}]"


CHANNEL_C = {  # ops of kind "channel": parameters broadcast along axis 1
    "batchnorm": lambda a: "(({0} - {1}) / sqrtf({2} + " + flit(a["eps"]) + ") * {3} + {4})",
}


def has_fast_form(body: Graph) -> bool:
    """Whether an op of the body has a fast C form (the op table's c_fast): a pointwise kernel
    then computes each tile in two passes (csrc_templates/pointwise.c)."""
    return any(n.op in OPS and OPS[n.op].c_fast for n in body.nodes)


class Exprs:
    """Statements computing body values at one element of a Space (one `const float` per node).
    With `fast`, ops use their fast C form (the op table's c_fast) and `guards` collects the
    conditions under which those are exact."""

    def __init__(self, body: Graph, space: Space, ptrs: dict[int, str], preset: dict[int, str],
                 indent: str, forbid: set[int] = frozenset(), prefix: str = "v", strides: dict | None = None,
                 fast: bool = False):
        self.body, self.space, self.ptrs, self.preset = body, space, ptrs, preset
        self.fast, self.guards = fast, []
        self.strides = strides or {}  # body input -> the strides of the view it is read through
        self.prefix = prefix
        self.indent, self.forbid = indent, forbid
        self.stmts: list[str] = []
        self.memo: dict[tuple, str] = {}
        self.qfloat: dict[str, str] = {}  # a quantize_linear's variable -> its integer as a float (see value)

    def value(self, i: int, chan: int | None = None) -> str:
        if i in self.preset:
            return self.preset[i]
        key = (i, chan)
        if key in self.memo:
            return self.memo[key]
        # kinds' match refuses bodies that would get here (the one lowerability decision)
        assert i not in self.forbid, f"match let through an epilogue reading prologue value {i}"
        n = self.body.nodes[i]
        if n.op == "const":
            return flit(n.value)  # the one literal form: C's conversions give it each use's type
        var = f"{self.prefix}{i}" + (f"_c{chan}" if chan is not None else "")
        if n.op == "input":
            view = tuple(n.type.shape)
            if chan is not None and len(view) == 1:
                view = view + (1,) * (chan - 2)
            expr = self.space.access(self.ptrs[i], view, self.strides.get(i) if chan is None else None)
            if n.type.dtype == "bool":  # (read as its byte: gcc 12 vectorizes no loop that loads a _Bool and
                expr = f"(*(const unsigned char*)&{expr} != 0)"  # selects on it, such as a mask's where)
        elif range_scalar(self.body, i):  # DynamicQuantizeLinear's scale or zero point of a range's two floats
            expr = range_scalar_c(n.op, self.ptrs[n.args[0]])
        else:
            op = OPS[n.op]
            if op.kind == OpKind.CHANNEL:
                xr = self.body.nodes[n.args[0]].type.rank
                args = [self.value(n.args[0], chan)] + [self.value(a, xr) for a in n.args[1:]]
                expr = CHANNEL_C[n.op](n.attr).format(*args)
            elif op.kind == OpKind.POINTWISE:
                args = [self._operand(n, a, chan) for a in n.args]
                if self.fast and op.c_fast:
                    expr = op.c_fast.format(*args)
                    self.guards.append(op.c_fast_guard.format(*args))
                elif n.op == "dequantize_linear" and args[0] in self.qfloat:
                    # dequantize_linear(quantize_linear(x, s, z), s2, z2), a QDQ model's fake
                    # quantization inside a kernel: the integer is still the float eqf_quantize
                    # returned (integral, within the dtype's range), so (q - z2) s2 is computed
                    # from it in floats. Exact: q - z2 is an integer of at most 255 in size, the
                    # same float as the int32 difference; the conversions to the integer type and
                    # back, which gcc vectorizes at half the width, are left out.
                    expr = f"(({self.qfloat[args[0]]} - (float)({args[2]})) * ({args[1]}))"
                else:
                    expr = op.c_expr(n.attr).format(*args)
                if n.op == "quantize_linear":  # (its integer, unused when only a dequantize reads it)
                    self.stmts.append(f"{self.indent}const float {var}q = {expr};")
                    self.qfloat[var] = f"{var}q"
                    self.stmts.append(f"{self.indent}__attribute__((unused)) const {C_TYPE[n.type.dtype]} {var} = {var}q;")
                    self.memo[key] = var
                    return var
            else:
                raise AssertionError(f"match let through {n.op} inside a kernel's loop")
        self.stmts.append(f"{self.indent}const {C_TYPE[n.type.dtype]} {var} = {expr};")
        self.memo[key] = var
        return var

    def _operand(self, n: Node, a: int, chan: int | None) -> str:
        """Operand a of op n: a literal next to integer operands is written as an integer (so
        that `ids + 1` is integer arithmetic in C, exact beyond 2^24)."""
        an = self.body.nodes[a]
        if an.op == "const" and float(an.value).is_integer() and abs(an.value) < 2 ** 62:
            others = [self.body.nodes[b].type.dtype for b in n.args if self.body.nodes[b].op != "const"]
            if others and all(d in INT_DTYPES or d == "bool" for d in others):
                return f"((int64_t){int(an.value)})"
        return self.value(a, chan)

    def text(self) -> str:
        return "\n".join(self.stmts)

    def guard(self) -> str:
        """The C condition that every fast form used was exact (1 without any)."""
        return " && ".join(f"({g})" for g in dict.fromkeys(self.guards)) or "1"

    def expression(self, i: int) -> str:
        """One C expression (a GNU statement expression when statements are needed)."""
        v = self.value(i)
        if not self.stmts:
            return v
        return "({ " + " ".join(s.strip() for s in self.stmts) + f" {v}; }})"


def range_scalar_c(op: str, r: str) -> str:
    """The C of dynamic_scale or dynamic_zero_point of the two floats at r (eqfuse.ir.kernels.
    range_scalar; common.h's eqf_range_scale and eqf_range_zero_point)."""
    return f"eqf_range_{op.removeprefix('dynamic_')}({r}[0], {r}[1])"


def render(template: str, **values) -> str:
    return cb_render(template, **{k: str(v) for k, v in values.items()})


def ctypes_of(plan: KernelPlan) -> tuple[list[str], str]:
    """The C element types of the kernel's inputs and of its output."""
    body = plan.body
    return [C_TYPE[body.nodes[i].type.dtype] for i in body.inputs], C_TYPE[body.nodes[body.outputs[0]].type.dtype]


def kernel_params(plan: KernelPlan) -> tuple[str, dict[int, str]]:
    ptrs = {i: f"in{k}" for k, i in enumerate(plan.body.inputs)}
    ins, out = ctypes_of(plan)
    ps = [f"const {t}* restrict in{k}" for k, t in enumerate(ins)] + [f"{out}* restrict out"]
    return ", ".join(ps), ptrs


def param_job(params: str) -> dict[str, str]:
    """The kernel's parameters (kernel_params' C text) carried into the chunks of a parallel loop
    on the claim-based pool (common_pool.h, eqf_region): PARAM_FIELDS, the members of the job
    struct; PARAM_INIT, its initializer's values; PARAM_UNPACK, a chunk's locals of the same names
    read from `jb` (the job), so the template's expressions read them as in the kernel."""
    decls = [p.strip() for p in params.split(",")]
    names = [d.split()[-1] for d in decls]
    return {"PARAM_FIELDS": " ".join(f"{d};" for d in decls),
            "PARAM_INIT": ", ".join(names),
            "PARAM_UNPACK": " ".join(f"{d} = jb->{n}; (void){n};" for d, n in zip(decls, names))}


I1, I2, I3, I4 = " " * 8, " " * 12, " " * 16, " " * 20


