"""`eqfuse emit`, `eqfuse lower [--uops]` and `eqfuse bench`: the backend's commands."""

from __future__ import annotations

from pathlib import Path

from eqfuse.cli.args import UsageError
from eqfuse.cli.common import fuse_mode, optimizer_opts, require_dims, selected_graphs
from eqfuse.errors import EqfuseError


def _bound_graphs(args, one_graph: bool = False):
    graphs, dims = selected_graphs(args, one_graph)
    require_dims(graphs, dims)
    return graphs, dims


def cmd_emit(args) -> int:
    from eqfuse.backend.emit import emit_graph
    from eqfuse.pipeline import lower, optimize

    graphs, dims = _bound_graphs(args)
    opts = optimizer_opts(args)
    precision = opts.pop("precision")
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise EqfuseError(f"{out} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise EqfuseError(f"{out}: cannot create the output directory ({e.strerror or e})") from None
    for g in graphs:
        gd = {k: v for k, v in dims.items() if k in g.dims()}
        opt, _ = optimize(g, dims=gd, fuse=fuse_mode(g), **opts)
        _, _, plans = lower(opt, gd, precision=precision)
        emitted = emit_graph(plans)
        path = out / f"{g.name}.c"
        for p, text in ((path, emitted.source), (out / f"{g.name}.cdef.h", emitted.cdef + "\n")):
            try:
                p.write_text(text)
            except OSError as e:
                raise EqfuseError(f"{p}: cannot write ({e.strerror or e})") from None
        print(f"{path}: {len(emitted.kernel_sources)} kernels ({', '.join(emitted.kernel_sources)})")
    return 0


def cmd_lower(args) -> int:
    from eqfuse.pipeline import uops_text

    graphs, dims = _bound_graphs(args)
    opts = optimizer_opts(args)
    # one graph at a time: each with its own fuse mode (hand-written kernel blocks kept)
    if args.live is not None and args.live not in dims:
        raise UsageError(f"--live {args.live}: bind it to the cache's capacity with --dim {args.live}=INT")
    print("\n\n".join(uops_text(args.model, dims=dims, graph=g.name, uops=args.uops, fuse=fuse_mode(g),
                                 live=args.live, **opts)
                       for g in graphs))
    return 0


def cmd_bench(args) -> int:
    from eqfuse.cli.bench import bench_model

    threads = args.threads or [1, 2]
    if any(t < 1 for t in threads) or args.repeat < 1:
        raise UsageError("--threads and --repeat must be positive")
    peers = _peer_list(args.peers)
    (g,), dims = _bound_graphs(args, one_graph=True)
    opts = optimizer_opts(args)
    print(bench_model(args.model, dims=dims, graph=g.name, repeat=args.repeat, threads=threads, peers=peers,
                      profile=args.profile, **opts))
    return 0


def _peer_list(text: str) -> list[str]:
    from eqfuse.cli.bench import PEERS
    from eqfuse.errors import did_you_mean

    peers = [p.strip() for p in text.split(",") if p.strip()]
    for p in peers:
        if p not in PEERS:
            raise UsageError(f"--peers: unknown peer '{p}' (known: {', '.join(PEERS)})", hint=did_you_mean(p, PEERS))
    return peers
