"""The `eqfuse` command line. Bad input: one clear message on stderr and exit 2, never a traceback."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

from eqfuse.cli.args import ArgParser, UsageError, make_parser, parse  # noqa: F401 (used by the cli_* modules)
from eqfuse.errors import CheckFailed, EqfuseError

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
        from eqfuse.frontend.onnx_import import input_dims

        have = input_dims(args.model)
        for name in dims:
            if name not in have:
                raise UsageError(f"--dim {name}: {args.model} has no dimension named '{name}' "
                                 f"(its named dimensions: {', '.join(have) or 'none'})")
        graphs = load(args.model, dims)
    else:
        graphs = load(args.model)
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


def cmd_check(args) -> int:
    from eqfuse.ir.graph import bind_dims

    graphs, dims = selected_graphs(args)
    for g in graphs:
        if dims:
            g = bind_dims(g, {k: v for k, v in dims.items() if k in g.dims()})
        print(g.signature())
    return 0


def cmd_ops(args) -> int:
    from eqfuse.errors import did_you_mean
    from eqfuse.ir import opref
    from eqfuse.ir.ops import OPS

    if args.name is None:
        print(opref.summary())
    elif args.name in OPS:
        print(opref.detail(args.name))
    else:
        raise UsageError(f"unknown op '{args.name}' (see 'eqfuse ops' for the list)",
                         hint=did_you_mean(args.name, OPS))
    return 0


def cmd_run(args) -> int:
    import numpy as np

    from eqfuse.ir.reference import bind_arrays, evaluate
    from eqfuse.ir.shapes import dtype_of_numpy

    (g,), dims = selected_graphs(args, one_graph=True)
    opts = optimizer_opts(args)
    if args.verify and opts["precision"] != "f32":
        raise UsageError(f"--verify compares at f32 tolerances and cannot be combined with --precision "
                         f"{opts['precision']} (docs/precision.md gives the bf16 error bound)")
    path = Path(args.inputs)
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    try:
        npz = np.load(path, allow_pickle=False)
    except NOT_AN_ARCHIVE:
        npz = None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        example = ", ".join([f"{n}={n}" for n, _ in g.params[:2]] + ["..."] * (len(g.params) > 2))
        raise EqfuseError(f"{path}: not a readable .npz file: --inputs expects a numpy .npz archive with one "
                          f"array per parameter, named like it (numpy.savez('in.npz', {example}))")
    # An .onnx model's initializers are bound as compile binds them: --inputs holds the runtime
    # inputs only, each under the model's own input name (or the parameter name it became).
    from eqfuse.frontend.load import input_aliases, model_weights

    weights = model_weights(args.model, dims)
    aliases = input_aliases(args.model, dims)
    runtime = [n for n, _ in g.params if n not in weights]
    key = {n: aliases.get(n, n) if aliases.get(n, n) in npz.files else n for n in runtime}
    missing = [aliases.get(n, n) for n in runtime if key[n] not in npz.files]
    if missing:
        raise EqfuseError(f"{path} has no array for input{'s' * (len(missing) > 1)} {', '.join(missing)} "
                          f"(it has: {', '.join(npz.files) or 'nothing'})", hint=_fitting_graph(args, g, npz, dims))
    given = {n: npz[key[n]] for n in runtime}
    arrays = [given[n] if n in given else weights[n] for n, _ in g.params]
    try:
        dims = bind_arrays(g, arrays, dims)  # every dim fixed: one run needs no batch buckets
    except EqfuseError as e:
        e.hint = e.hint or _fitting_graph(args, g, npz, dims)
        raise
    if args.reference:
        outs = evaluate(g, arrays)
    else:
        from eqfuse import compile as eq_compile

        mod = eq_compile(args.model, dims=dims or None, check_rules=False, fuse=fuse_mode(g), **opts)
        res = getattr(mod, g.name)(**given)
        outs = list(res) if isinstance(res, tuple) else [res]
        if args.verify:
            from eqfuse.runtime.verify import compare

            bad = compare(outs, evaluate(g, arrays))
            if bad:
                raise CheckFailed("verification failed: " + "; ".join(bad))
            print("verified: every output matches the numpy reference", file=sys.stderr)
    names = g.output_names()
    if args.output:
        try:
            np.savez(args.output, **dict(zip(names, outs)))
        except OSError as e:
            raise EqfuseError(f"{args.output}: cannot write ({e.strerror or e})") from None
    for name, o in zip(names, outs):
        dt = dtype_of_numpy(o.dtype) or str(o.dtype)
        with np.errstate(all="ignore"):  # the mean of inf and -inf is nan, silently
            print(f"{name}: {dt}{list(o.shape)}  min {o.min():.6g}  max {o.max():.6g}  "
                  f"mean {o.astype(np.float64).mean():.6g}")
    return 0


def _fitting_graph(args, g, npz, dims) -> str | None:
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


def cmd_cache(args) -> int:
    from eqfuse import cache

    def line(what: str, d: dict) -> str:
        return f"{what}: {d['entries']} entr{'y' if d['entries'] == 1 else 'ies'}, {d['bytes'] / 1e6:.1f} MB"

    if args.action == "info":
        i = cache.info()
        print(f"cache directory: {i['dir']}")
        print(line("compiled kernels", i["kernels"]))
        print(line("optimized graphs", i["graphs"]))
    else:
        i = cache.clear()
        print(f"cleared {i['dir']}: {i['kernels']['entries']} compiled kernels, {i['graphs']['entries']} optimized graphs")
    return 0


def cmd_export(args) -> int:
    from eqfuse.export import export

    graphs, dims = selected_graphs(args)
    opts = optimizer_opts(args)
    weights = read_npz(args.weights, "--weights") if args.weights else {}
    example = read_npz(args.example_inputs, "--example-inputs", "x=x") if args.example_inputs else None
    written = export(args.model, args.output, weights=weights, dims=dims, target=args.target,
                     embed_weights=args.embed_weights, name=args.name, inputs=args.input, graph=args.graph,
                     example_inputs=example, **opts)
    lib = next(p.stem for p in written if p.suffix == ".h" and p.name != "eqf_common.h" and p.name != "eqf_omp.h")
    print(f"wrote {len(written)} files to {args.output}: lib{lib} ({', '.join(p.name for p in written)})")
    print(f"build: make -C {args.output}   (lib{lib}.so, lib{lib}.a; `make -C {args.output} check` runs the example)")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(argv)
        if args.version:
            from eqfuse.version import __version__

            print(f"eqfuse {__version__}")
            return 0
        if args.command is None:
            raise UsageError("a command is needed (see 'eqfuse --help')")
        if getattr(args, "no_cache", False):  # read by eqfuse.cache.no_cache, wherever a cache is used
            os.environ["EQFUSE_NO_CACHE"] = "1"
        handler = COMMANDS[args.command]
        return handler(args)
    except EqfuseError as e:
        print(str(e), file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except RecursionError:
        print("error: the input is nested too deeply to process", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except Exception as e:  # an eqfuse bug: still one line, with a way to get the traceback
        if os.environ.get("EQFUSE_DEBUG"):
            raise
        print(f"eqfuse: internal error: {type(e).__name__}: {e} (set EQFUSE_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 3


def _lazy(module: str, func: str):
    def run(args):
        import importlib

        return getattr(importlib.import_module(f"eqfuse.{module}"), func)(args)

    return run


COMMANDS = {
    "check": cmd_check,
    "run": _lazy("cli.deploy_cmd", "cmd_run_any"),  # a model, or an artifact (run without the compiler)
    "ops": cmd_ops,
    "opt": _lazy("cli.opt_cmd", "cmd_opt"),
    "rules": _lazy("cli.rules_cmd", "cmd_rules"),
    "check-rules": _lazy("cli.rules_cmd", "cmd_check_rules"),
    "grad": _lazy("cli.grad_cmd", "cmd_grad"),
    "check-grads": _lazy("cli.grad_cmd", "cmd_check_grads"),
    "emit": _lazy("cli.backend_cmds", "cmd_emit"),
    "lower": _lazy("cli.backend_cmds", "cmd_lower"),
    "bench": _lazy("cli.backend_cmds", "cmd_bench"),
    "export": cmd_export,
    "cache": cmd_cache,
    "compile": _lazy("cli.deploy_cmd", "cmd_compile"),
}

if __name__ == "__main__":
    sys.exit(main())
