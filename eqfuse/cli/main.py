"""The `eqfuse` command line. Bad input: one clear message on stderr and exit 2, never a traceback."""

from __future__ import annotations

import os
import sys

from eqfuse.cli.args import UsageError, parse
from eqfuse.errors import EqfuseError


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
        return _command(args.command)(args)
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




def _command(name: str):
    """The function of a command, its module imported when the command runs (so that `eqfuse
    check` does not import the optimizer)."""
    if name in ("check", "ops", "cache", "export"):
        from eqfuse.cli import model_cmds as where
    elif name in ("run", "compile"):
        from eqfuse.cli import (
            deploy_cmd as where,  # (run: a model, or an artifact without the compiler)
        )
    elif name == "opt":
        from eqfuse.cli import opt_cmd as where
    elif name in ("rules", "check-rules"):
        from eqfuse.cli import rules_cmd as where
    elif name in ("grad", "check-grads"):
        from eqfuse.cli import grad_cmd as where
    else:  # emit, lower, bench
        from eqfuse.cli import backend_cmds as where
    return getattr(where, COMMANDS[name])


# command -> the name of its function in its module (_command)
COMMANDS = {"check": "cmd_check", "run": "cmd_run_any", "ops": "cmd_ops", "opt": "cmd_opt", "rules": "cmd_rules",
            "check-rules": "cmd_check_rules", "grad": "cmd_grad", "check-grads": "cmd_check_grads",
            "emit": "cmd_emit", "lower": "cmd_lower", "bench": "cmd_bench", "export": "cmd_export",
            "cache": "cmd_cache", "compile": "cmd_compile"}

if __name__ == "__main__":
    sys.exit(main())
