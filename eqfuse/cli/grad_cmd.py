"""`eqfuse grad` and `eqfuse check-grads`."""

from __future__ import annotations

from eqfuse.errors import CheckFailed, EqfuseError


def cmd_grad(args) -> int:
    """The joint forward + backward graph of one graph, as .g text."""
    from eqfuse.cli.common import require_dims, selected_graphs
    from eqfuse.grad.api import differentiate
    from eqfuse.grad.vjp import check_loss, check_wrt
    from eqfuse.ir.printer import module_text

    (g,), dims = selected_graphs(args, one_graph=True)
    wrt = [w.strip() for w in args.wrt.split(",") if w.strip()]
    check_wrt(g, wrt, "--wrt")
    check_loss(g)
    require_dims([g], dims)
    joint = differentiate(g, wrt, {k: v for k, v in dims.items() if k in g.dims()}, "--wrt")
    text = module_text([joint])
    if args.output:
        try:
            with open(args.output, "w") as f:
                f.write(text)
        except OSError as e:
            raise EqfuseError(f"{args.output}: cannot write ({e.strerror or e})") from None
    else:
        print(text, end="" if text.endswith("\n") else "\n")
    return 0


def cmd_check_grads(args) -> int:
    """Every derivative rule against central finite differences: a line per op and argument."""
    from eqfuse.grad.check import check_derivatives

    results, untested = check_derivatives(seed=args.seed)
    bad = 0
    for r in results:
        bad += not r.ok
        verdict = "OK      " if r.ok else "MISMATCH"
        print(f"{verdict} d/d{r.param:<2} {r.case:48} {', '.join(r.rules) or '-':22} error {r.error:.1e}")
    for name in untested:
        print(f"UNTESTED {name}: no case of eqfuse/grad/check.py reaches this rule")
    if bad or untested:
        raise CheckFailed(f"{bad} of {len(results)} gradients differ from finite differences"
                          + (f", {len(untested)} rules untested" if untested else ""))
    print(f"all {len(results)} gradients ({len({n for r in results for n in r.rules})} rules) match central "
          "finite differences in float64")
    return 0
