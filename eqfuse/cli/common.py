"""What the commands share: the model's graphs a command processes, --dim bindings, the
optimizer's options, .npz inputs."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

from eqfuse.cli.args import UsageError
from eqfuse.errors import EqfuseError

# what np.load raises for a file that is not an .npz archive: text or pickled data (ValueError),
# an empty file (EOFError), a broken zip (BadZipFile), a directory or unreadable file (OSError)
NOT_AN_ARCHIVE = (ValueError, EOFError, zipfile.BadZipFile, OSError)

def parse_dims(items: list[str] | None) -> dict[str, int]:
    dims = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier() or not value.strip().isdigit() or int(value) <= 0:
            raise UsageError(f"--dim expects NAME=POSITIVE_INT, got '{item}'")
        dims[name] = int(value)
    return dims

def check_dim_names(graphs, dims: dict[str, int], model: str) -> None:
    """A --dim for a name no graph has is a typo, not something to ignore silently."""
    have = [d for g in graphs for d in g.dims()]
    for name in dims:
        if name not in have:
            known = ", ".join(dict.fromkeys(have)) or "none"
            raise UsageError(f"--dim {name}: {model} has no dimension named '{name}' (its named dimensions: {known})")

def pick_graph(graphs, name):
    if name is None:
        return graphs[0]
    for g in graphs:
        if g.name == name:
            return g
    raise UsageError(f"--graph {name}: no graph named '{name}' (the file has: {', '.join(g.name for g in graphs)})",
                     hint=_did_you_mean(name, [g.name for g in graphs]))

def _did_you_mean(word, options):
    from eqfuse.errors import did_you_mean

    return did_you_mean(word, options)

def selected_graphs(args, one_graph: bool = False):
    """(the graphs a command processes, the --dim bindings): every graph of the model (the first
    for run, bench and grad: `one_graph`) or the one --graph names; each --dim must name a
    dimension of them."""
    from eqfuse.frontend.load import load

    dims = parse_dims(args.dim)
    if str(args.model).endswith(".onnx") and dims:
        # an ONNX model's dims are bound at import, where its shape arithmetic folds with them
        from eqfuse.frontend.onnx_cache import input_dims

        have = input_dims(args.model)
        for name in dims:
            if name not in have:
                raise UsageError(f"--dim {name}: {args.model} has no dimension named '{name}' "
                                 f"(its named dimensions: {', '.join(have) or 'none'})")
        graphs = load(args.model, dims)
    else:  # (a .g model's --dim only give a concat along named dims its length, frontend.builder)
        graphs = load(args.model, dims)
    if one_graph and args.graph is None and len(graphs) > 1:  # (docs/README.md: which graphs of a file)
        print(f"note: graph {graphs[0].name}, the first of {len(graphs)} in {args.model} "
              f"({', '.join(g.name for g in graphs)}); --graph NAME picks another", file=sys.stderr)
    if one_graph or args.graph is not None:
        graphs = [pick_graph(graphs, args.graph)]
    left = {k: v for k, v in dims.items() if k in {d for g in graphs for d in g.dims()}}
    if not str(args.model).endswith(".onnx"):
        check_dim_names(graphs, dims, args.model)
    check_dim_sizes(graphs, left)
    return graphs, dims

def fuse_mode(g) -> bool | str:
    """How run, lower and emit compile graph g: kernel blocks written by hand are kept as written
    (eqfuse.compile's fuse="manual", every other op its own kernel); else the optimizer fuses."""
    return "manual" if any(n.op == "kernel" for n in g.nodes) else True

def optimizer_opts(args) -> dict:
    """cost=, rules=, disable= from the shared options, after the user rule files were checked
    for soundness (unless --no-check-rules): an unsound rule is a RuleError, exit status 2."""
    from eqfuse.optimizer.rulecheck import check_rule_files

    check_rule_files(args.rules, enabled=not args.no_check_rules)
    from eqfuse.optimizer.optimize import cached_rules

    cached_rules(tuple(args.rules), tuple(args.disable))  # a misspelt --disable fails before any output is written
    from eqfuse.pipeline import check_precision

    precision = check_precision(args.precision, "--precision")  # (exit status 2 when unknown)
    return dict(cost=args.cost, rules=list(args.rules), disable=list(args.disable), precision=precision)

def check_dim_sizes(graphs, dims: dict[str, int]) -> None:
    from eqfuse.ir.graph import oversized

    for g in graphs:
        why = oversized(g, dims)
        if why:
            raise UsageError(f"--dim {why}")

def require_dims(graphs, dims: dict[str, int]) -> None:
    """Lowering needs sizes: every named dimension of the graphs processed must be bound."""
    for g in graphs:
        missing = [d for d in g.dims() if d not in dims]
        if missing:
            raise UsageError(f"graph {g.name} has unbound dimension{'s' * (len(missing) > 1)} "
                             f"{', '.join(missing)}: bind {'them' if len(missing) > 1 else 'it'} with "
                             + " ".join(f"--dim {d}=INT" for d in missing))

def fitting_graph(args, g, npz, dims) -> str | None:
    """When --inputs do not fit graph g but fit another graph of the file: which one."""
    from eqfuse.ir.reference import bind_arrays

    if args.graph is not None or str(args.model).endswith(".onnx"):
        return None  # a graph named on purpose; an ONNX model has one
    from eqfuse.frontend.load import load

    for h in load(args.model):
        if h.name == g.name or not all(n in npz.files for n, _ in h.params):
            continue
        try:
            bind_arrays(h, [npz[n] for n, _ in h.params], {k: v for k, v in dims.items() if k in h.dims()})
        except EqfuseError:
            continue
        return f"the inputs fit graph '{h.name}' of {args.model}: did you mean --graph {h.name}?"
    return None

def read_npz(path: str, option: str, example: str = "w1=w1, b1=b1, ...") -> dict:
    """The arrays of an .npz archive, or one clear error."""
    import numpy as np

    p = Path(path)
    if not p.exists():
        raise UsageError(f"{option} {p}: no such file")
    try:
        npz = np.load(p, allow_pickle=False)
    except NOT_AN_ARCHIVE:
        npz = None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise EqfuseError(f"{p}: not a readable .npz file: {option} expects a numpy .npz archive with one "
                          f"array per parameter, named like it (numpy.savez('{p.name}', {example}))")
    return {k: npz[k] for k in npz.files}
