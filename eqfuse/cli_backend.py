"""`eqfuse emit`, `eqfuse lower --uops` and `eqfuse bench`: the backend's commands."""

from __future__ import annotations

from pathlib import Path

from .cli import UsageError, parse_dims, pick_graph
from .errors import EqfuseError


def _bound_graphs(args):
    from .frontend import load

    graphs = load(args.model)
    if args.graph is not None:
        graphs = [pick_graph(graphs, args.graph)]
    dims = parse_dims(args.dim)
    for g in graphs:
        missing = [d for d in g.dims() if d not in dims]
        if missing:
            raise UsageError(f"graph {g.name} has unbound dimension{'s' * (len(missing) > 1)} "
                             f"{', '.join(missing)}: bind {'them' if len(missing) > 1 else 'it'} with "
                             + " ".join(f"--dim {d}=INT" for d in missing))
    return graphs, dims


def cmd_emit(args) -> int:
    from .compiler import lower, optimize
    from .emit import emit_graph

    graphs, dims = _bound_graphs(args)
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise EqfuseError(f"{out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    for g in graphs:
        gd = {k: v for k, v in dims.items() if k in g.dims()}
        opt, _ = optimize(g, dims=gd)
        _, _, plans = lower(opt, gd)
        emitted = emit_graph(plans)
        path = out / f"{g.name}.c"
        path.write_text(emitted.source)
        (out / f"{g.name}.cdef.h").write_text(emitted.cdef + "\n")
        print(f"{path}: {len(emitted.kernel_sources)} kernels ({', '.join(emitted.kernel_sources)})")
    return 0


def cmd_lower(args) -> int:
    from .compiler import uops_text

    graphs, dims = _bound_graphs(args)
    print(uops_text(args.model, dims=dims, graph=args.graph))
    return 0


def cmd_bench(args) -> int:
    from .bench import bench_model

    graphs, dims = _bound_graphs(args)
    threads = args.threads or [1, 2]
    if any(t < 1 for t in threads) or args.repeat < 1:
        raise UsageError("--threads and --repeat must be positive")
    for g in graphs if args.graph else graphs[:1]:
        print(bench_model(args.model, dims={k: v for k, v in dims.items() if k in g.dims()}, graph=g.name,
                          repeat=args.repeat, threads=threads))
    return 0
