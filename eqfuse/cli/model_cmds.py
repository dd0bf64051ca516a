"""The commands over a model that need neither the optimizer's report nor the backend's plans:
check, ops, run, cache, export."""

from __future__ import annotations

import sys
from pathlib import Path

from eqfuse.cli.args import UsageError
from eqfuse.cli.common import (
    NOT_AN_ARCHIVE,
    fitting_graph,
    fuse_mode,
    optimizer_opts,
    read_npz,
    selected_graphs,
)
from eqfuse.errors import CheckFailed, EqfuseError


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
                          f"(it has: {', '.join(npz.files) or 'nothing'})", hint=fitting_graph(args, g, npz, dims))
    given = {n: npz[key[n]] for n in runtime}
    arrays = [given[n] if n in given else weights[n] for n, _ in g.params]
    try:
        dims = bind_arrays(g, arrays, dims)  # every dim fixed: one run needs no batch buckets
    except EqfuseError as e:
        e.hint = e.hint or fitting_graph(args, g, npz, dims)
        raise
    if args.reference:
        outs = evaluate(g, arrays)
    else:
        from eqfuse import compile as eq_compile

        mod = eq_compile(args.model, dims=dims or None, check_rules=False, fuse=fuse_mode(g), **opts)
        res = getattr(mod, g.name)(**given)
        outs = list(res) if isinstance(res, tuple) else [res]
        if args.verify:
            from eqfuse.runtime.verify import compare, scale_for

            bad = compare(outs, evaluate(g, arrays),
                          scale=scale_for(getattr(getattr(getattr(mod, g.name), "last", None), "plans", ())))
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

def cmd_cache(args) -> int:
    from eqfuse import cache

    def line(what: str, d: dict) -> str:
        return f"{what}: {d['entries']} entr{'y' if d['entries'] == 1 else 'ies'}, {d['bytes'] / 1e6:.1f} MB"

    if args.action == "info":
        i = cache.info()
        print(f"cache directory: {i['dir']}")
        print(line("compiled kernels", i["kernels"]))
        print(line("optimized graphs", i["graphs"]))
        print(line("imported models", i["imports"]))
    else:
        i = cache.clear()
        print(f"cleared {i['dir']}: {i['kernels']['entries']} compiled kernels, {i['graphs']['entries']} optimized graphs, "
              f"{i['imports']['entries']} imported models")
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
