"""`eqfuse export`: a model as a standalone C library, built by make with no Python.

    load -> bind weights and dims -> fold -> optimize -> lower and emit for the target ISA
         -> write C sources, header, weights, Makefile, example

Every graph of the model becomes one entry point `long NAME_GRAPH(NAME_model* m, inputs...,
outputs...)` over the same kernels and static memory plan as `eqfuse.compile`
(eqfuse.runtime.program's run function, called from C). Arrays in `weights` (and an .onnx
model's initializers) are the model's weights: written to `weights.bin` (or embedded in the C)
and loaded by `NAME_load`; every other parameter is an input of the entry point. Shapes are
fixed at export: every named dimension must be bound (by the weights or `dims`).

The kernels are planned and compiled for the target: `portable` (x86-64-v2: SSE4.2, no AVX;
on another architecture no -march at all), `x86-64-v3` (AVX2), `x86-64-v4` (AVX-512) or
`native` (the building machine's own ISA, planned for this host's vector width). Every template
has a path without intrinsics (the SIMD ones are under `#if defined(__AVX512F__)` / `__AVX__`
/ `__SSE__`), so `portable` plans 4-float vectors and the compiler auto-vectorizes the loops.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from eqfuse import progress
from eqfuse.errors import EqfuseError
from eqfuse.ir.graph import Graph, bind_dims
from eqfuse.ir.shapes import NUMPY_DTYPE

# target -> (the Makefile's -march, vector width planned for (floats; None: this host's))
TARGETS = {
    "portable": ("-march=x86-64-v2", 4),
    "x86-64-v2": ("-march=x86-64-v2", 4),
    "x86-64-v3": ("-march=x86-64-v3", 8),
    "x86-64-v4": ("-march=x86-64-v4", 16),
    "native": ("-march=native", None),
}

C_KEYWORDS = {"auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum",
              "extern", "float", "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return",
              "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void",
              "volatile", "while", "bool", "m", "in", "out", "bad", "failed"}


@dataclass
class Tensor:
    """One argument of an entry point, one weight, or one example array."""

    name: str  # a C identifier
    dtype: str  # eqfuse dtype
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(NUMPY_DTYPE[self.dtype]).itemsize


@dataclass
class ExportedGraph:
    name: str  # the graph's name in the model
    entry: str  # the C entry point
    inputs: list[Tensor]  # the entry point's input arguments, in parameter order
    outputs: list[Tensor]  # its output arguments
    weights: list[tuple[Tensor, np.ndarray]]  # the weights it reads (blob entries named GRAPH.param)
    slots: list[tuple[str, object]]  # each `in[]` slot of the run function: ("input", k) | ("weight", k) | ("const", v) | ("packed", k)
    packs: list[tuple[str, str, int]]  # (prepack function, floats function, weight index of its B)
    copies: dict[int, tuple[str, object]]  # output k made after the run: ("input", k) | ("output", j) | ("const", v)
    arena_bytes: int
    has_run: bool  # False when the graph has no kernel (every output an input or a constant)
    kernel_c: str  # the kernels and the run function
    dims: dict[str, int]
    signature: str
    example_inputs: list[np.ndarray]
    example_outputs: list[np.ndarray]
    check_scale: str = "element"  # the example's error rule (eqfuse.runtime.verify.scale_for)


def c_name(name: str, taken: set[str]) -> str:
    out = re.sub(r"\W", "_", name) or "t"
    if out[0].isdigit() or out in C_KEYWORDS:
        out = "a_" + out
    base, k = out, 1
    while out in taken:
        k += 1
        out = f"{base}_{k}"
    taken.add(out)
    return out


def target_machine(target: str):
    from eqfuse.machine import host_simd_floats, machine

    if target not in TARGETS:
        raise EqfuseError(f"unknown target '{target}' (known: {', '.join(TARGETS)})")
    simd = TARGETS[target][1] or host_simd_floats()
    m = machine()
    # AVX512_BF16 and VNNI only for "native" (none of the x86-64 levels has them); on a machine that runs
    # make without it, the bf16 kernels stop the build with an #error rather than run f32
    return replace(m, simd_floats=simd, avx512_bf16=m.avx512_bf16 and target == "native" and simd >= 16,
                   amx_bf16=m.amx_bf16 and target == "native", avx512_vnni=m.avx512_vnni and target == "native",
                   avx_vnni=m.avx_vnni and target == "native", amx_int8=m.amx_int8 and target == "native")


def prepare(model: str | os.PathLike, weights: Mapping[str, np.ndarray], lib: str, dims: Mapping[str, int],
            target: str = "portable", inputs: Sequence[str] | None = None, graph: str | None = None,
            example_inputs: Mapping[str, np.ndarray] | None = None, seed: int = 0,
            **opts) -> list[ExportedGraph]:
    """Every graph of the model (or the one named), optimized, lowered and emitted for the target."""
    from eqfuse.frontend.load import input_aliases, load, model_weights
    from eqfuse.machine import pinned
    from eqfuse.pipeline import check_dims

    graphs = load(model)
    if graph is not None:
        graphs = [g for g in graphs if g.name == graph] or _no_graph(graph, load(model))
    weights = {**model_weights(model), **weights}
    names = {n for g in graphs for n, _ in g.params}
    for k in weights:
        if k not in names:
            raise EqfuseError(f"--weights: '{k}' is not a parameter of {model} (parameters: {', '.join(sorted(names))})")
    for k in inputs or ():
        if k not in names:
            raise EqfuseError(f"--input {k}: no parameter named '{k}' (parameters: {', '.join(sorted(names))})")
        if k in weights:
            raise EqfuseError(f"--input {k}: '{k}' has an array in the weights; an input is passed at run time")
    check_dims(graphs, dict(dims))
    example_inputs = dict(example_inputs or {})
    for param, own in input_aliases(model).items():  # an .onnx model's own input names ("input.1")
        if own in example_inputs:
            example_inputs[param] = example_inputs.pop(own)
    for k in example_inputs:
        if k not in names or k in weights:
            raise EqfuseError(f"--example-inputs: '{k}' is not an input of {model} "
                              f"(inputs: {', '.join(sorted(n for n in names if n not in weights))})")
    with pinned(target_machine(target), clamp=False):
        return [_prepare_graph(g, weights, lib, dict(dims), inputs, example_inputs, seed, opts) for g in graphs]


def _no_graph(name, graphs):
    raise EqfuseError(f"--graph {name}: no graph named '{name}' (the model has: {', '.join(g.name for g in graphs)})")


def _prepare_graph(g: Graph, weights, lib, dims, inputs, example_inputs, seed, opts) -> ExportedGraph:
    from eqfuse.optimizer.fold import fold_params
    from eqfuse.pipeline import bind, optimize

    gw = {k: v for k, v in weights.items() if k in dict(g.params)}
    if inputs:
        missing = [n for n, _ in g.params if n not in gw and n not in inputs]
        if missing:
            raise EqfuseError(f"graph {g.name}: no weights for parameter{'s' * (len(missing) > 1)} "
                              f"{', '.join(missing)} (neither in --weights nor named by --input)")
    gd = {k: v for k, v in dims.items() if k in g.dims()}
    gd = bind(g, gw, gd)  # the weights' shapes and dtypes are checked, the dims they fix bound
    missing = [d for d in g.dims() if d not in gd]
    if missing:
        raise EqfuseError(f"graph {g.name} has unbound dimension{'s' * (len(missing) > 1)} {', '.join(missing)}: "
                          "an exported library has fixed shapes; bind " + " ".join(f"--dim {d}=INT" for d in missing))
    folded = fold_params(g, gw)
    opts = dict(opts)
    precision = opts.pop("precision", "f32")
    opt, _ = optimize(folded.graph, dims=gd, **opts)  # (its own progress line)
    with progress.step(f"exporting {g.name}: plans, C and example outputs"):
        return _exported(g, opt, folded, gw, gd, lib, example_inputs, seed, precision)


def _exported(g: Graph, opt: Graph, folded, gw, gd, lib, example_inputs, seed, precision) -> ExportedGraph:
    from eqfuse.backend.emit import emit_graph
    from eqfuse.ir.kernels import K
    from eqfuse.pipeline import lower
    from eqfuse.runtime.program import emit_run, plan_memory
    from eqfuse.runtime.verify import scale_for

    entry = f"{lib}_{g.name}"
    opt = Graph(entry, opt.nodes, opt.inputs, opt.outputs, opt.pos)  # kernel names carry the library's
    _, kg, plans = lower(opt, gd, True, frozenset(folded.params), precision, arrays=folded.params)
    emitted = emit_graph(plans)
    mem = plan_memory(kg, plans)
    kernels = [p for p in plans if p.kind != K.VIEW]
    run_c = emit_run(kg, plans, mem)[0] if kernels else ""
    body = "\n".join(emitted.kernel_sources[p.name] for p in kernels)

    src = bind_dims(g, gd) if g.dims() else g
    taken: set[str] = set()
    ins = [Tensor(c_name(n, taken), t.dtype, tuple(t.shape)) for n, t in src.params if n not in gw]
    in_pos = {n: k for k, (n, _) in enumerate((n, t) for n, t in src.params if n not in gw)}

    outs = [Tensor(c_name(n, taken), src.nodes[o].type.dtype, tuple(src.nodes[o].type.shape))
            for n, o in zip(src.output_names(), src.outputs)]
    kg_params = [n for n, _ in kg.params]
    wlist = [(Tensor(n, t.dtype, tuple(t.shape)), np.ascontiguousarray(folded.params[n], dtype=NUMPY_DTYPE[t.dtype]))
             for n, t in kg.params if n in folded.params]
    windex = {t.name: k for k, (t, _) in enumerate(wlist)}
    slots: list[tuple[str, object]] = []
    for n in kg_params:
        slots.append(("weight", windex[n]) if n in windex else ("input", in_pos[n]))
    slots += [("const", kg.nodes[i].value) for i in mem.consts]
    packs = []
    for k, (s, pos) in enumerate(mem.prepacks):
        pre = kernels[s].prepack
        packs.append((pre.fn, pre.floats, windex[kg_params[pos]]))
        slots.append(("packed", k))
    copies = {}
    for k, (where, at) in mem.copies.items():
        copies[k] = (("output", at) if where == "out" else ("const", kg.nodes[at].value) if where == "const"
                     else ("input", in_pos[kg_params[at]]) if kg_params[at] in in_pos else ("weight", windex[kg_params[at]]))
    ex_in = _example_inputs(src, gw, ins, example_inputs, seed)
    from eqfuse.ir.reference import evaluate

    full = [gw[n] if n in gw else ex_in[in_pos[n]] for n, _ in src.params]
    ex_out = evaluate(src, full)
    return ExportedGraph(g.name, entry, ins, outs, wlist, slots, packs, copies, mem.arena_bytes, bool(kernels),
                         body + "\n" + run_c, gd, src.signature(), ex_in, ex_out, scale_for(plans))


def _example_inputs(src: Graph, gw, ins: list[Tensor], given: Mapping[str, np.ndarray], seed: int) -> list[np.ndarray]:
    """The example's inputs: the arrays of --example-inputs, else random ones (f32 standard normal,
    integers in [0, 4), bools half true)."""
    rng = np.random.default_rng(seed)
    out = []
    free = [(n, t) for n, t in src.params if n not in gw]
    for (n, t), tensor in zip(free, ins):
        dt = NUMPY_DTYPE[t.dtype]
        if n in given:
            a = np.asarray(given[n])
            if a.shape != tuple(t.shape) or a.dtype != dt:
                raise EqfuseError(f"--example-inputs: '{n}' must be {t} ({dt}), got {a.dtype}{list(a.shape)}")
        elif t.dtype in ("i64", "i32", "u8", "i8"):
            a = rng.integers(0, 4, t.shape).astype(dt)
        elif t.dtype == "bool":
            a = rng.random(t.shape) < 0.5
        else:
            a = rng.standard_normal(t.shape).astype(dt)
        out.append(np.ascontiguousarray(a))
    return out


def export(model: str | os.PathLike, outdir: str | os.PathLike, weights: Mapping[str, np.ndarray] | None = None,
           dims: Mapping[str, int] | None = None, target: str = "portable", embed_weights: bool = False,
           name: str | None = None, inputs: Sequence[str] | None = None, graph: str | None = None,
           example_inputs: Mapping[str, np.ndarray] | None = None, **opts) -> list[Path]:
    """Write the library's sources, header, weights, Makefile and example into outdir; the paths written."""
    from eqfuse import export_c
    from eqfuse.pipeline import check_precision

    check_precision(opts.get("precision", "f32"))
    lib = name or Path(str(model)).stem
    lib = re.sub(r"\W", "_", lib)
    if not lib or lib[0].isdigit():
        lib = "m_" + lib
    if target not in TARGETS:
        raise EqfuseError(f"unknown target '{target}' (known: {', '.join(TARGETS)})")
    out = Path(outdir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".eqfuse_write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise EqfuseError(f"{out}: cannot write the library there ({e.strerror or e})") from None
    graphs = prepare(model, dict(weights or {}), lib, dict(dims or {}), target, inputs, graph, example_inputs,
                     **opts)
    with progress.step(f"writing the library {lib} to {out}"):
        return _write(out, export_c.files(lib, graphs, target, TARGETS[target][0], embed_weights, str(model)))


def _write(out: Path, files: Mapping[str, str | bytes]) -> list[Path]:
    written = []
    try:
        for fname, content in files.items():
            p = out / fname
            if isinstance(content, bytes):
                p.write_bytes(content)
            else:
                p.write_text(content)
            written.append(p)
    except OSError as e:
        raise EqfuseError(f"{out}: cannot write the library there ({e.strerror or e})") from None
    return written


__all__ = ["export", "prepare", "TARGETS"]
