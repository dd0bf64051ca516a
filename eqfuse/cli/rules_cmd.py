"""`eqfuse rules` and `eqfuse check-rules`."""

from __future__ import annotations

import os

from eqfuse.errors import CheckFailed, EqfuseError
from eqfuse.optimizer.rules import load_rules, read_rule_file


def cmd_rules(args) -> int:
    """Every active rule: name, file:line and its text (a <=> rule is listed once)."""
    rules = load_rules(args.rules, args.disable)
    cwd = os.getcwd()
    shown = set()
    for r in rules:
        if (r.name, r.file, r.line) in shown:
            continue
        shown.add((r.name, r.file, r.line))
        where = os.path.relpath(r.file, cwd) if os.path.isabs(r.file) and r.file.startswith(cwd) else r.file
        print(f"{r.name:32} {where}:{r.line}")
        print(f"    {r.text}")
    print(f"{len(shown)} rules")
    return 0


def cmd_check_rules(args) -> int:
    """Test each rule of the files on random inputs: one line per rule, exit 1 if any is unsound."""
    from eqfuse.optimizer.soundness import check_rule

    if args.trials < 1:
        raise EqfuseError("--trials must be at least 1")
    load_rules(args.files)  # the names, as opt --rules takes them: none may repeat a built-in's
    bad = 0
    total = 0
    for path in args.files:
        for r in read_rule_file(path):
            total += 1
            label = r.name + (" (right to left)" if r.reverse else "")
            ce = check_rule(r, trials=args.trials, seed=getattr(args, "seed", 0))
            if ce is None:
                print(f"OK       {label}  {r.file}:{r.line}")
            else:
                bad += 1
                verdict = "UNSOUND " if ce.max_error is not None or ce.shapes else "UNTESTED"
                print(f"{verdict} {label}  {r.file}:{r.line}")
                print("\n".join("    " + ln for ln in str(ce).splitlines()))
    if bad:
        raise CheckFailed(f"{bad} of {total} rules unsound or untestable")
    print(f"all {total} rules sound on {args.trials} random trials each")
    return 0
