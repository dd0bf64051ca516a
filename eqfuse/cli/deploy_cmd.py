"""`eqfuse compile MODEL -o FILE.eqf` and `eqfuse run FILE.eqf`: artifacts (eqfuse.runtime.artifact)."""

from __future__ import annotations

import sys
from pathlib import Path

from eqfuse.cli.args import UsageError
from eqfuse.cli.common import parse_dims, read_npz
from eqfuse.cli.model_cmds import cmd_run
from eqfuse.errors import CheckFailed, EqfuseError
from eqfuse.runtime.artifact import MAGIC, load


def parse_buckets(text: str | None) -> dict[str, list[int]] | None:
    if text is None:
        return None
    name, sep, sizes = text.partition("=")
    values = [v.strip() for v in sizes.split(",")]
    if not sep or not name.isidentifier() or not all(v.isdigit() and int(v) > 0 for v in values):
        raise UsageError(f"--buckets expects NAME=N1,N2,... (positive integers), got '{text}'")
    return {name: [int(v) for v in values]}


def cmd_compile(args) -> int:
    from eqfuse.pipeline import compile as eq_compile

    dims = parse_dims(args.dim)
    out = Path(args.output)
    if not out.parent.is_dir():
        raise UsageError(f"-o {out}: no such directory {out.parent}")
    targets = [t.strip() for t in args.targets.split(",") if t.strip()] if args.targets is not None else None
    mod = eq_compile(args.model, dims=dims or None, buckets=parse_buckets(args.buckets), precision=args.precision)
    mod.save(out, targets=targets)
    size = out.stat().st_size
    print(f"wrote {out}: {', '.join(mod.functions)} ({size / 1e6:.1f} MB)")
    return 0


def is_artifact(path: str) -> bool:
    """FILE.eqf, or any file that starts as an artifact does."""
    if str(path).endswith(".eqf"):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def cmd_run_any(args) -> int:
    """`eqfuse run`: an artifact without the compiler, else the model compiled (cli.main.cmd_run)."""
    return cmd_run_artifact(args) if is_artifact(args.model) else cmd_run(args)


def cmd_run_artifact(args) -> int:
    """`eqfuse run FILE.eqf --inputs IN.npz`: the artifact's first graph (or --graph) on the inputs."""
    import numpy as np

    from eqfuse.ir.reference import evaluate
    from eqfuse.ir.shapes import dtype_of_numpy

    for flag, given in (("--dim", args.dim), ("--rules", args.rules), ("--disable", args.disable)):
        if given:
            raise UsageError(f"{flag} does not apply to an artifact: it is compiled already (eqfuse compile)")
    mod = load(args.model)
    name = args.graph or next(iter(mod.functions))
    if name not in mod.functions:
        raise UsageError(f"--graph {name}: no graph named '{name}' (the artifact has: {', '.join(mod.functions)})")
    f = mod.functions[name]
    arrays = read_npz(args.inputs, "--inputs", ", ".join(f"{n}={n}" for n in f.free[:2]))
    missing = [n for n in f.free if n not in arrays]
    if missing:
        raise EqfuseError(f"{args.inputs} has no array for input{'s' * (len(missing) > 1)} {', '.join(missing)} "
                          f"(it has: {', '.join(arrays) or 'nothing'})")
    given = {n: arrays[n] for n in f.free}
    named = {**f.params, **given}
    if args.reference:
        outs = evaluate(f.source, [named[n] for n, _ in f.source.params])
    else:
        res = f(**given)
        outs = list(res) if isinstance(res, tuple) else [res]
        if args.verify:
            from eqfuse.runtime.verify import compare, scale_for

            bad = compare(outs, evaluate(f.source, [named[n] for n, _ in f.source.params]),
                          scale=scale_for(getattr(getattr(f, "last", None), "plans", ())))
            if bad:
                raise CheckFailed("verification failed: " + "; ".join(bad))
            print("verified: every output matches the numpy reference", file=sys.stderr)
    names = f.source.output_names()
    if args.output:
        try:
            np.savez(args.output, **dict(zip(names, outs)))
        except OSError as e:
            raise EqfuseError(f"{args.output}: cannot write ({e.strerror or e})") from None
    for n, o in zip(names, outs):
        dt = dtype_of_numpy(o.dtype) or str(o.dtype)
        print(f"{n}: {dt}{list(o.shape)}  min {o.min():.6g}  max {o.max():.6g}  mean {o.astype(np.float64).mean():.6g}")
    return 0
