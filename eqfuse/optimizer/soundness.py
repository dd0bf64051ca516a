"""Numeric soundness of rewrite rules: both sides evaluated in numpy on random inputs.

How inputs are drawn (`eqfuse check-rules` and the test suite use this module):

- Shapes: per trial, one random base shape (rank 0-4, sizes 1-5); each tensor variable takes
  the base shape, a suffix of it, a broadcast of it (some sizes set to 1) or an unrelated random
  shape. The draw is rejected and repeated until shape inference of the left side and every
  condition succeed; after SQUARE_AFTER rejections every other draw is square (one size on
  every axis, every variable the base shape, one axis, a suffix or a broadcast of it), which meets
  patterns of several matmuls over one batch (attention's gradient). A variable tested with
  `const(?c)` is a scalar. A condition `?v == TERM` (an attribute variable or a constant compared
  with a shape term) sets ?v directly, and a condition rank(?v) == 0 makes ?v a scalar, as
  const(?v) does (a per-tensor scale or zero point beside a rank-4 conv input is then met as
  often as the conv's operands are); rank(?v) == k keeps the last k axes of ?v's draw (adds
  leading ones of its first size to a draw of fewer), and
  dim(?v, i) == n sets its axis i (shape_conds: one draw in four that fails is followed by such a
  shaped draw, from a generator of its own).
- Attribute variables take values the left side admits, drawn when the op that reads them is
  evaluated: a permutation of the input's axes for perm=, a reshape target of the same size
  (sometimes with -1) for shape=, an axis or axis set of the input's rank, true/false, one of a
  string attribute's choices, a small eps; a conv's stride and dilation 1 or 2, its padding 0 or
  1, its group mostly 1, else a divisor of the input's channels.
- Values: even trials draw from +-[0.25, 3] (both signs, away from 0 so a quotient stays
  finite), odd trials from [0.25, 3] (the domain of log, sqrt, rsqrt and fractional pow, so
  those ops are compared on real numbers too). A NaN must appear at the same places on both
  sides: a rule that is true only on a domain (exp(log x) => x) is unsound, because the reference
  would give NaN where the rewritten graph gives a number.
- Both sides run the op table's numpy implementations in float64 (inputs drawn as float32
  values), so float32 rounding does not hide or fake a difference; they must agree within
  rtol 1e-4, atol 1e-5 (|l - r| <= atol + rtol * max(|l|, |r|)). OP_TOLERANCE loosens this per
  op where a side's formula is an approximation by design (none today: both sides of a rule use
  the same numpy implementations, and GELU's tanh form differs from its erf form by up to
  4.7e-4, which must be -- and is -- reported unsound).
- A kernel block evaluates as its result expression (a kernel block is semantically transparent).
- Quantized ops (the op table's dtype rules quantize, dequantize, matmul_integer): per trial one
  dtype, u8 or i8, is drawn; a variable in an integer position (the data of dequantize_linear, a
  zero point, an operand of matmul_integer) takes integers over that dtype's whole range, kept in
  that dtype (a zero point is a scalar in three draws of four, per tensor), and a variable in a
  scale position is half the time an f32 edge value (0, a subnormal, 1e36, a value whose
  products overflow), so that a rule true only for ordinary scales gets a counterexample. u8 / i8 results keep their dtype; the sides must then
  have the same dtype and be equal integer for integer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eqfuse.errors import ShapeError
from eqfuse.ir.ops import OPS, REQUIRED
from eqfuse.ir.shapes import NUMPY_DTYPE, QUANT_DTYPES, TType, dtype_of_numpy
from eqfuse.optimizer.rules import AttrVar, Cond, PKernel, PNum, POp, PVar, Rule, Test

RTOL, ATOL = 1e-4, 1e-5
OP_TOLERANCE: dict[str, tuple[float, float]] = {}  # op name -> (rtol, atol) when a rule uses it
# The roles of a quantized op's operands, by the op's dtype rule (eqfuse.ir.dtypes).
QUANT_ROLES: dict[str, dict[int, str]] = {
    "quantize": {1: "scale", 2: "zp"},
    "dequantize": {0: "int", 1: "scale", 2: "zp"},
    "matmul_integer": {0: "int", 1: "int", 2: "zp", 3: "zp"},
}
EDGE_SCALES = (0.0, 1e-44, 1e36, 3e38)  # zero, a subnormal, the largest whose 255 multiple is finite, overflowing
ATTEMPTS = 400  # shape draws per trial before giving up
CONV_OPS = ("conv2d", "conv_integer")  # ops whose group= and dilation= are drawn as a conv's (draw_attr)
SQUARE_AFTER = 200  # then every other draw is square (draw_shapes)


class Reject(Exception):
    """This draw does not satisfy the left side's shape rules or the conditions."""


class RightFails(Exception):
    """The right side cannot be evaluated where the left side can."""


@dataclass
class Counterexample:
    rule: Rule
    reason: str
    shapes: dict[str, tuple] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    max_error: float | None = None
    detail: str = ""

    def __str__(self) -> str:
        r = self.rule
        arrow = " (right to left)" if r.reverse else ""
        lines = [f"{r.name}{arrow} at {r.file}:{r.line}: {self.reason}"]
        if self.shapes:
            lines.append("  shapes: " + ", ".join(f"?{k}={list(v)}" for k, v in self.shapes.items()))
        if self.attrs:
            lines.append("  attributes: " + ", ".join(f"?{k}={_show(v)}" for k, v in self.attrs.items()))
        if self.inputs:
            lines.append("  inputs: " + ", ".join(f"?{k} {v}" for k, v in self.inputs.items()))
        if self.max_error is not None:
            lines.append(f"  max error: {self.max_error:.3g} (rtol {RTOL:g}, atol {ATOL:g})")
        if self.detail:
            lines.append("  " + self.detail)
        return "\n".join(lines)


def _show(v) -> str:
    if isinstance(v, tuple):
        return "[" + ", ".join(str(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return str(v)


# ---------------------------------------------------------------- rule structure


def walk(p):
    yield p
    if isinstance(p, POp):
        for a in p.args:
            yield from walk(a)
        for _, v in p.attrs:
            if isinstance(v, AttrVar):
                yield v
    elif isinstance(p, PKernel):
        yield from walk(p.result)


def tensor_vars(p) -> list[str]:
    out: list[str] = []
    for q in walk(p):
        if isinstance(q, PVar) and q.name not in out:
            out.append(q.name)
    return out


def ops_used(p) -> set[str]:
    return {q.op for q in walk(p) if isinstance(q, POp)}


# ---------------------------------------------------------------- drawing inputs


def roles(p, out: dict[str, str] | None = None) -> dict[str, str]:
    """Tensor variable -> "int", "zp" (an integer that is a zero point) or "scale", where a
    quantized op reads it (the first such use)."""
    out = {} if out is None else out
    for q in walk(p):
        if isinstance(q, POp):
            for i, a in enumerate(q.args):
                role = QUANT_ROLES.get(OPS[q.op].dtype, {}).get(i)
                if role and isinstance(a, PVar):
                    out.setdefault(a.name, role)
    return out


class Env:
    def __init__(self, rng: np.random.Generator, positive: bool, consts: set[str],
                 roles: dict[str, str] | None = None):
        self.rng = rng
        self.positive = positive
        self.consts = consts
        self.roles = roles or {}
        self.qdtype = str(rng.choice(QUANT_DTYPES)) if self.roles else None  # this trial's u8 or i8
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.tensors: dict[str, np.ndarray] = {}
        self.attrs: dict[str, Any] = {}

    def values(self, shape, role: str | None = None) -> np.ndarray:
        if role in ("int", "zp"):
            info = np.iinfo(NUMPY_DTYPE[self.qdtype])
            return self.rng.integers(info.min, info.max + 1, size=shape).astype(info.dtype)
        if role == "scale" and self.rng.random() < 0.5:
            v = self.rng.choice(EDGE_SCALES, size=shape)
            return np.asarray(v.astype(np.float32), dtype=np.float64)
        v = self.rng.uniform(0.25, 3.0, size=shape)
        if not self.positive:
            v = v * self.rng.choice([-1.0, 1.0], size=shape)
        return np.asarray(v.astype(np.float32), dtype=np.float64)

    def attr(self, name: str, op: str, attr: str, args: list[np.ndarray]):
        """The value of an attribute variable, drawn the first time an op reads it."""
        if name in self.attrs:
            return self.attrs[name]
        if name in self.tensors:  # a constant bound on the left, used as an attribute value
            return float(self.tensors[name])
        v = draw_attr(self.rng, OPS[op].attr_spec(attr), op, args[0] if args else None)
        self.attrs[name] = v
        return v


def draw_shapes(rng: np.random.Generator, names: list[str], consts: set[str],
                square: bool = False) -> dict[str, tuple[int, ...]]:
    if square:  # one size on every axis, and mostly exactly the base shape, so that a pattern of
        # several matmuls over one batch (attention's gradient) can be met
        base = (int(rng.integers(1, 6)),) * int(rng.integers(0, 5))
        vectors = float(rng.choice([0.0, 0.5]))  # how often a variable is one axis of it (a per-channel parameter)
        return {n: () if n in consts else _square(rng, base, vectors) for n in names}
    base = tuple(int(d) for d in rng.integers(1, 6, size=int(rng.integers(0, 5))))
    pool = [1, *(int(d) for d in rng.integers(2, 6, size=2))]
    out = {}
    for n in names:
        if n in consts:
            out[n] = ()
            continue
        k = rng.choice(6, p=[0.35, 0.2, 0.15, 0.05, 0.15, 0.1])
        if k == 0:
            s = base
        elif k == 1:
            s = base[int(rng.integers(0, len(base) + 1)):]
        elif k == 2:
            s = tuple(1 if rng.random() < 0.4 else d for d in base)
        elif k == 3:
            s = ()
        elif k == 4:
            s = tuple(int(rng.choice(pool)) for _ in range(int(rng.integers(0, 5))))
        else:
            s = tuple(int(d) for d in rng.integers(1, 6, size=int(rng.integers(0, 5))))
        out[n] = s
    return out


def _square(rng: np.random.Generator, base: tuple[int, ...], vectors: float) -> tuple[int, ...]:
    """A variable's shape in a square draw: the base, one axis of it, a suffix, or a broadcast."""
    if base and rng.random() < vectors:
        return base[:1]
    k = rng.random()
    if k < 0.7:
        return base
    if k < 0.9:
        return base[int(rng.integers(0, len(base) + 1)):]
    return tuple(1 if rng.random() < 0.4 else d for d in base)


def _factor_shape(rng, size: int) -> tuple[int, ...]:
    dims: list[int] = []
    n = size
    for p in (2, 3, 5, 7, 11, 13):
        while n % p == 0:
            dims.append(p)
            n //= p
    if n > 1:
        dims.append(n)
    rank = int(rng.integers(1, 5))
    out = [1] * rank
    for d in dims:
        out[int(rng.integers(0, rank))] *= d
    if rng.random() < 0.3:
        out[int(rng.integers(0, rank))] = -1
    return tuple(out)


def draw_attr(rng, spec, op: str, x: np.ndarray | None):
    rank = x.ndim if x is not None else 0
    if spec.name == "perm":
        return tuple(int(i) for i in rng.permutation(rank))
    if spec.name == "shape":
        return _factor_shape(rng, x.size if x is not None else 1)
    if spec.kind == "axes":
        if rank == 0 or rng.random() < 0.2:
            return None
        k = int(rng.integers(1, rank + 1))
        axes = sorted(int(a) for a in rng.choice(rank, size=k, replace=False))
        return tuple(a - rank if rng.random() < 0.5 else a for a in axes)
    if spec.name == "group" and op in CONV_OPS:  # (one group, or a divisor of x's channels)
        c = x.shape[1] if x is not None and x.ndim == 4 else 1
        return 1 if rng.random() < 0.6 else int(rng.choice([g for g in range(1, c + 1) if c % g == 0]))
    if spec.name == "dilation" and op in CONV_OPS:
        return int(rng.integers(1, 3))
    if spec.kind == "int":
        if spec.name in ("start", "stop"):
            return int(rng.integers(-3, 4))
        return int(rng.integers(-rank, rank)) if rank else 0
    if spec.kind == "bool":
        return bool(rng.random() < 0.5)
    if spec.kind == "float":
        return float(rng.choice([1e-6, 1e-5, 1e-3, 0.1]))
    if spec.kind == "str":
        return str(rng.choice(list(spec.choices)))
    if spec.kind == "int_or_ints":
        return int(rng.integers(1, 3)) if spec.name == "stride" else int(rng.integers(0, 2))
    if spec.kind == "pads2d":
        return int(rng.integers(0, 2))
    if spec.kind == "ints":
        return tuple(int(i) for i in rng.permutation(rank))
    return None if spec.default is REQUIRED else spec.default


# ---------------------------------------------------------------- evaluation


def evaluate(p, env: Env, fail=Reject) -> np.ndarray:
    """One side of a rule in numpy; a shape rule that refuses the inputs raises `fail`."""
    if isinstance(p, PVar):
        return env.tensors[p.name]
    if isinstance(p, PNum):
        return np.asarray(p.value, dtype=np.float64)
    if isinstance(p, PKernel):
        return evaluate(p.result, env, fail)
    if isinstance(p, POp):
        args = [evaluate(a, env, fail) for a in p.args]
        attrs = {k: env.attr(v.name, p.op, k, args) if isinstance(v, AttrVar) else v for k, v in p.attrs}
        op = OPS[p.op]
        try:
            if any(_quantized(a) for a in args):  # u8 / i8 operands: the dtype rule too
                op.infer([TType(tuple(a.shape), dtype_of_numpy(a.dtype) if _quantized(a) else "f32") for a in args],
                         attrs)
            # shapes only: every value here is a float64 (a mask is "nonzero", an index is truncated)
            op.shape_rule([TType(tuple(a.shape)) for a in args], attrs)
        except (ShapeError, TypeError, ValueError, IndexError) as e:
            raise fail(f"{p.op}: {e}") from None
        with np.errstate(all="ignore"):
            try:
                out = op.numpy(args, attrs)
            except (ValueError, TypeError, IndexError) as e:
                raise fail(f"{p.op}: {e}") from None
        out = np.asarray(out)
        return out if _quantized(out) else np.asarray(out, dtype=np.float64)
    raise TypeError(p)


def _quantized(a: np.ndarray) -> bool:
    return a.dtype in (np.uint8, np.int8)


def term_value(t, env: Env):
    if not isinstance(t, tuple) or not t or not isinstance(t[0], str):
        return t  # a number or a tuple of numbers
    kind, name = t[0], t[1]
    if kind == "attr":
        if name in env.attrs:
            return env.attrs[name]
        return float(env.tensors[name])
    shape = env.shapes[name]
    if kind == "rank":
        return len(shape)
    if kind == "shape":
        return tuple(shape)
    if kind == "size":
        return math.prod(shape)
    if kind == "dim":
        i = t[2]
        if not -len(shape) <= i < len(shape):
            raise Reject(f"dim {i} of a rank-{len(shape)} tensor")
        return shape[i]
    raise ValueError(t)


_CMP = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def holds(c: Cond, env: Env) -> bool:
    a, b = term_value(c.lhs, env), term_value(c.rhs, env)
    if isinstance(a, list):
        a = tuple(a)
    if isinstance(b, list):
        b = tuple(b)
    try:
        return bool(_CMP[c.op](a, b))
    except TypeError:
        return False


def scalar_vars(conds) -> set[str]:
    """The tensor variables a condition rank(?v) == 0 makes scalars (drawn of shape ())."""
    out = set()
    for c in conds:
        if isinstance(c, Cond) and c.op == "==":
            for a, b in ((c.lhs, c.rhs), (c.rhs, c.lhs)):
                if isinstance(a, tuple) and len(a) == 2 and a[0] == "rank" and b == 0:
                    out.add(a[1])
    return out


def shape_conds(conds, shapes: dict[str, tuple[int, ...]]) -> None:
    """Conditions `rank(?v) == k` (k > 0) and `dim(?v, i) == n` (a number) shape a drawn tensor
    directly: its last k axes (or, with fewer, leading axes of its first size added: in a square
    draw every axis has one size, so a conv's x, w (rank 4) and bias (rank 1) then agree), its
    axis i set to n (when it has that many axes), so that a pattern
    of several such conditions (ConvNeXt's depthwise conv, layernorm and matmul: rules
    fuse_dw_ln_mm*) is met as often as its shapes are, not as often as random draws satisfy each."""
    for c in conds:
        if not isinstance(c, Cond) or c.op != "==":
            continue
        for a, b in ((c.lhs, c.rhs), (c.rhs, c.lhs)):
            if not (isinstance(a, tuple) and a and a[0] in ("rank", "dim") and isinstance(b, int)
                    and not isinstance(b, bool) and a[1] in shapes):
                continue
            s = shapes[a[1]]
            if a[0] == "rank" and 0 < b <= len(s):
                shapes[a[1]] = s[len(s) - b:]
            elif a[0] == "rank" and 0 < b:  # too few axes: more in front, of its first size
                shapes[a[1]] = (s[0] if s else 2,) * (b - len(s)) + s
            elif a[0] == "dim" and -len(s) <= a[2] < len(s):
                shapes[a[1]] = s[:a[2] % len(s)] + (b,) + s[a[2] % len(s) + 1:]


def _solve(conds, env: Env) -> None:
    """Conditions `?v == TERM` set an attribute variable or a constant directly."""
    for c in conds:
        if not isinstance(c, Cond) or c.op != "==":
            continue
        for var, other in ((c.lhs, c.rhs), (c.rhs, c.lhs)):
            if not (isinstance(var, tuple) and var and var[0] == "attr"):
                continue
            name = var[1]
            if name in env.attrs or (name in env.tensors and name not in env.consts):
                continue
            if isinstance(other, tuple) and other and other[0] == "attr":
                continue
            value = term_value(other, env)
            if name in env.consts:
                env.tensors[name] = np.asarray(float(value), dtype=np.float64)
            else:
                env.attrs[name] = value
            break


def _draw(rule: Rule, rng, positive: bool) -> tuple[Env, np.ndarray] | None:
    consts = {c.var for c in rule.conds if isinstance(c, Test) and c.fn == "const"}
    scalars = consts | scalar_vars(rule.conds)
    names = tensor_vars(rule.lhs)
    kinds = roles(rule.rhs, roles(rule.lhs))
    shaped = _shaping(rule.conds)

    def attempt_with(g, attempt: int, force: bool) -> tuple[Env, np.ndarray] | None:
        env = Env(g, positive, consts, kinds)
        # (a zero point is per tensor in most draws, as quantizers write activations' zero points)
        zps = {n for n, r in kinds.items() if r == "zp" and g.random() < 0.75}
        env.shapes = draw_shapes(g, names, scalars | zps, square=attempt >= SQUARE_AFTER and attempt % 2 == 1)
        if force:
            shape_conds(rule.conds, env.shapes)
        env.tensors = {n: env.values(s, kinds.get(n)) for n, s in env.shapes.items()}
        try:
            _solve(rule.conds, env)
            left = evaluate(rule.lhs, env)
            if all(holds(c, env) for c in rule.conds if isinstance(c, Cond)):
                return env, left
        except Reject:
            pass
        return None

    for attempt in range(ATTEMPTS):
        found = attempt_with(rng, attempt, False)
        if found is None and shaped and attempt % 4 == 3:
            # a draw shaped by the conditions (shape_conds), from a generator of its own so that
            # the draws above stay what they are without it
            found = attempt_with(np.random.default_rng([attempt, *rule.name.encode()]), attempt, True)
        if found is not None:
            return found
    return None


def _shaping(conds) -> bool:
    """Whether shape_conds acts on some condition of a rule."""
    return any(isinstance(c, Cond) and c.op == "==" and any(
        isinstance(a, tuple) and a and a[0] in ("rank", "dim") and isinstance(b, int) and not isinstance(b, bool)
        and (a[0] == "dim" or b > 0) for a, b in ((c.lhs, c.rhs), (c.rhs, c.lhs))) for c in conds)


def tolerance(rule: Rule) -> tuple[float, float]:
    rtol, atol = RTOL, ATOL
    for op in ops_used(rule.lhs) | ops_used(rule.rhs):
        r, a = OP_TOLERANCE.get(op, (0.0, 0.0))
        rtol, atol = max(rtol, r), max(atol, a)
    return rtol, atol


def check_rule(rule: Rule, trials: int = 5, seed: int = 0) -> Counterexample | None:
    """None if both sides agree on `trials` random draws; else the first counterexample."""
    rng = np.random.default_rng([seed, *rule.name.encode()])
    rtol, atol = tolerance(rule)
    tested = 0
    for t in range(trials):
        drawn = _draw(rule, rng, positive=bool(t % 2))
        if drawn is None:
            continue
        tested += 1
        env, left = drawn
        ce = Counterexample(rule, "", dict(env.shapes), dict(env.attrs),
                            {n: _summary(v, n in env.consts) for n, v in env.tensors.items()})
        try:
            right = evaluate(rule.rhs, env, fail=RightFails)
        except RightFails as e:
            ce.reason = "the right side cannot be computed where the left side can"
            ce.detail = f"right side: {e}"
            return ce
        if left.shape != right.shape:
            ce.reason = f"the sides have different shapes: left {list(left.shape)}, right {list(right.shape)}"
            return ce
        if (_quantized(left) or _quantized(right)) and left.dtype != right.dtype:
            ce.reason = f"the sides have different dtypes: left {left.dtype}, right {right.dtype}"
            return ce
        if _quantized(left) and not np.array_equal(left, right):
            idx = tuple(int(i) for i in np.argwhere(left != right)[0])
            ce.reason = "the sides differ (integers)"
            ce.detail = f"first difference{f' at index {list(idx)}' if idx else ''}: left {left[idx]}, right {right[idx]}"
            return ce
        left, right = left.astype(np.float64), right.astype(np.float64)
        with np.errstate(all="ignore"):
            diff = np.abs(left - right)
            ok = (diff <= atol + rtol * np.maximum(np.abs(left), np.abs(right))) | (left == right)
            ok |= np.isnan(left) & np.isnan(right)
        if not ok.all():
            idx = tuple(int(i) for i in np.argwhere(~ok)[0])
            ce.reason = "the sides differ"
            bad = diff[~ok]
            ce.max_error = float(np.nanmax(bad)) if np.isfinite(bad).any() else float("nan")
            where = f" at index {list(idx)}" if idx else ""
            ce.detail = f"first difference{where}: left {left[idx]:.6g}, right {right[idx]:.6g}"
            return ce
    if tested == 0:
        return Counterexample(rule, f"no random inputs satisfy the left side's shape rules and the conditions "
                                    f"({ATTEMPTS} draws per trial); the rule cannot be tested")
    return None


def _summary(v: np.ndarray, const: bool) -> str:
    if v.ndim == 0:
        return f"= {float(v):.6g}" + (" (constant)" if const else "")
    return f"in [{v.min():.3g}, {v.max():.3g}]"
