"""The `eqfuse` command's options and their help (units and defaults), and the usage errors that
argparse would otherwise print its own way: a misspelt option gets a suggestion and a pointer to
the subcommand's --help, exit status 2."""

from __future__ import annotations

import argparse
import difflib

from eqfuse.errors import EqfuseError

EMIT_DIR = "eqfuse_c"

COST_HELP = (
    "what extraction minimizes: memory = bytes read and written by all kernels (a tensor written "
    "once, read once by each kernel that reads it); launches = the number of kernels; time = a "
    "roofline estimate per kernel (max of FLOPs / this machine's FLOP/s and bytes / its bandwidth) "
    "plus a per-kernel overhead. They differ when a bigger kernel would reread or recompute data "
    "(launches still fuses it) and when FLOPs, not bytes, bound a kernel (only time sees it). "
    "Default: memory")


class UsageError(EqfuseError):
    pass


class ArgParser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: same format and exit status as ours
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _rule_options(c) -> None:
    c.add_argument("--rules", action="append", default=[], metavar="F.rw",
                   help="add the rules of this file to the built-in ones (repeatable)")
    c.add_argument("--disable", action="append", default=[], metavar="NAME",
                   help="turn a rule off by name, see 'eqfuse rules' (repeatable)")


def _optimizer_options(c) -> None:
    """What every command that optimizes takes: opt, run, emit, lower, bench."""
    c.add_argument("--cost", choices=["memory", "launches", "time"], default="memory", help=COST_HELP)
    _rule_options(c)
    c.add_argument("--precision", default="f32", metavar="P",
                   help="what the GEMMs (matmuls, convs through im2col) and attention multiply in: f32, or "
                        "bf16 (operands rounded to bf16, products accumulated in f32, epilogues, norms and "
                        "softmax in f32; vdpbf16ps on CPUs with AVX512_BF16, else a fallback that widens bf16 weights; "
                        "docs/precision.md gives the error bound) (default: f32)")
    c.add_argument("--no-check-rules", action="store_true",
                   help="use the --rules files without first checking each rule's soundness on random "
                        "inputs (default: check, as 'eqfuse check-rules' does, once per file content; "
                        "an unsound rule is refused, exit status 2)")
    c.add_argument("--no-cache", action="store_true",
                   help="neither read nor keep optimized graphs, imported models and compiled kernels in the cache directory "
                        "(as EQFUSE_CACHE_DIR or ~/.cache/eqfuse; the same as EQFUSE_NO_CACHE=1; default: use it)")


def make_parser() -> argparse.ArgumentParser:
    p = ArgParser(prog="eqfuse", description="A fusion compiler for tensor graphs on the CPU.",
                  epilog="Exit status: 0 success, 1 a check failed (verification, an unsound rule), "
                         "2 bad input or usage, 3 an internal error. 'eqfuse COMMAND --help' for a command.")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command", parser_class=ArgParser, metavar="COMMAND")
    p.commands = sub.choices  # name -> subparser, for usage errors

    def model_cmd(name, help, one_graph=False):
        c = sub.add_parser(name, help=help, description=help)
        c.add_argument("model", help="a .g file (or .onnx)")
        c.add_argument("--dim", action="append", metavar="NAME=INT",
                       help="bind a named dimension of the graphs processed, e.g. --dim B=256 (repeatable)")
        c.add_argument("--graph", metavar="NAME", help="the graph of the file to " + (
            "use (default: the first)" if one_graph else "process (default: every graph)"))
        return c

    c = model_cmd("opt", "optimize: print the fused graph and a report")
    _optimizer_options(c)
    c.add_argument("--iter-limit", type=int, default=None, metavar="N",
                   help="stop saturating after N rounds of rule application (default: 30)")
    c.add_argument("--node-limit", type=int, default=None, metavar="N",
                   help="stop saturating once the e-graph holds more than N e-nodes (default: 200000)")
    c.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="seconds for the whole optimize of each graph: saturation stops when they are "
                        "used up (checked between rounds) and the ILP extraction gets what is left, "
                        "within its own 1 s limit (default: 10 s of saturation, then the ILP's 1 s)")
    c.add_argument("-o", "--output", metavar="OUT.g",
                   help="write the optimized graph to this file instead of stdout (the report still prints)")
    c.add_argument("--report", choices=["text", "json"], default="text",
                   help="text: '#' lines after the graph; json: the report alone as one JSON object on stdout, "
                        "keyed by graph name when several graphs are processed (default: text)")
    c.add_argument("--explain", action="store_true",
                   help="after the report, say why each tensor passed between two kernels is stored (no rule "
                        "joins them; the backend cannot lower the joined body, and which condition fails; the "
                        "cost model chose to store it, with both choices' bytes and time; a limit stopped the "
                        "search) and what each fused kernel saves (also the report's 'boundaries' and "
                        "'fused_kernels' keys)")
    c.add_argument("--dot", metavar="OUT.dot",
                   help="also write the fused graph as Graphviz DOT to this file: one box per kernel, "
                        "edges are tensors (default: none)")
    c.add_argument("--onnx-out", metavar="OUT.onnx",
                   help="also write the optimized graph as ONNX, each kernel an ONNX local function named "
                        "after its kind (opens in Netron, runs in onnxruntime); one graph, every dim bound "
                        "(default: none)")

    model_cmd("check", "parse and shape-check; print each graph's signature")

    c = model_cmd("run", "run a model (or an artifact, FILE.eqf, without the compiler) on inputs from an .npz file",
                  one_graph=True)
    _optimizer_options(c)
    c.add_argument("--inputs", required=True, metavar="IN.npz",
                   help="an .npz archive (numpy.savez) holding one float32 array per parameter, "
                        "named like the parameter (required)")
    c.add_argument("-o", "--output", metavar="OUT.npz",
                   help="write the outputs to this .npz, named like the returned values (else out0, out1, ...)")
    c.add_argument("--verify", action="store_true",
                   help="compare with the numpy reference (rtol 1e-4, atol 1e-5); exit 1 on a mismatch")
    c.add_argument("--reference", action="store_true", help="run the numpy reference only (no C)")

    c = sub.add_parser("compile", help="compile a model into one artifact file that `eqfuse run` and eqfuse.load "
                                        "read without the compiler",
                       description="compile a model into one artifact file (.eqf): its libraries for each target, "
                                   "its weights prepacked, its graphs and dims; eqfuse.load(path) and `eqfuse run "
                                   "FILE.eqf` read it without the compiler (docs/deploy.md)")
    c.add_argument("model", help="a .g file (or .onnx)")
    c.add_argument("--dim", action="append", metavar="NAME=INT",
                   help="bind a named dimension, e.g. --dim B=256 (repeatable); a batch dim left unbound is "
                        "compiled at its buckets (--buckets)")
    c.add_argument("--buckets", metavar="NAME=N1,N2,...",
                   help="the bucket sizes of a batch dim left unbound, e.g. --buckets B=1,8,32 (default: a graph "
                        "whose dims are not all bound by --dim is refused: an artifact holds compiled code only)")
    c.add_argument("--precision", choices=["f32"], default="f32", help="the precision the kernels run in (default: f32)")
    c.add_argument("--targets", metavar="LEVEL,LEVEL", default=None,
                   help="the x86-64 levels to build the libraries for, comma-separated: x86-64-v2, x86-64-v3, "
                        "x86-64-v4, each at most this machine's; eqfuse.load picks the highest its CPU runs "
                        "(default: this machine's level)")
    c.add_argument("-o", "--output", metavar="OUT.eqf", required=True, help="the artifact file to write (required)")

    c = model_cmd("emit", "write the generated C sources")
    _optimizer_options(c)
    c.add_argument("-o", "--output", metavar="DIR", default=EMIT_DIR,
                   help=f"directory for GRAPH.c and GRAPH.cdef.h, created if needed (default: ./{EMIT_DIR})")

    c = model_cmd("lower", "print every kernel's plan: tiles, cache constraints, thread rule")
    _optimizer_options(c)
    c.add_argument("--uops", action="store_true",
                   help="print the tile-level micro-op schedule the C runs, with a total uop count")
    c.add_argument("--live", metavar="DIM",
                   help="lower a decoder step whose past inputs concatenate along DIM (bound by --dim to the "
                        "cache's capacity) with DIM's live length a run-time value (compile's live=, "
                        "docs/generation.md)")

    c = model_cmd("bench", "numpy op by op vs compiled unfused vs compiled fused", one_graph=True)
    _optimizer_options(c)
    c.add_argument("--repeat", type=int, default=20, metavar="N",
                   help="timed calls per cell after 2 warm-up calls; a cell is their median (default: 20)")
    c.add_argument("--threads", type=int, action="append", metavar="N",
                   help="a thread count to measure, one column each (repeatable; default: 1 and 2)")
    c.add_argument("--peers", metavar="LIST", default="numpy,torch,torch.compile,onnxruntime",
                   help="comma-separated peers to measure besides eqfuse: numpy (op by op; always "
                        "measured, the ratios' baseline), torch (eager), torch.compile (inductor), "
                        "onnxruntime (ORT_ENABLE_ALL, on .onnx models), openvino (on .onnx models: two rows, f32 and its "
                        "default precision, bf16 on a CPU with AVX512_BF16 or AMX); each needs its package installed "
                        "(default: numpy,torch,torch.compile,onnxruntime)")
    c.add_argument("--profile", action="store_true",
                   help="also print each fused kernel's time inside the graph's call, in microseconds per call "
                        "(mean of --repeat calls at the first --threads), largest first, and the time spent "
                        "outside the kernels (default: off)")

    c = model_cmd("export", "write a standalone C library: C sources, a header with one entry point per "
                            "graph, the weights, a Makefile (libNAME.so, libNAME.a; no Python) and an example")
    _optimizer_options(c)
    c.add_argument("-o", "--output", metavar="DIR", required=True,
                   help="the library's directory, created if needed (required)")
    c.add_argument("--weights", metavar="W.npz",
                   help="an .npz archive of the model's weights, one array per parameter named like it: "
                        "written to DIR/weights.bin (or embedded) and loaded by NAME_load; every parameter "
                        "without an array is an input of the entry point (an .onnx model's initializers are "
                        "weights too)")
    c.add_argument("--input", action="append", metavar="NAME",
                   help="a parameter passed at run time (repeatable); when given, every other parameter "
                        "must have weights (default: every parameter without weights is an input)")
    c.add_argument("--target", choices=["portable", "x86-64-v2", "x86-64-v3", "x86-64-v4", "native"],
                   default="portable",
                   help="the ISA the Makefile builds for and the kernels are planned for: portable = "
                        "x86-64-v2 (SSE4.2, no AVX; no -march on other architectures: every kernel "
                        "template has a path without intrinsics), x86-64-v3 (AVX2), x86-64-v4 (AVX-512), "
                        "native (-march=native of the machine that runs make, planned for this host's "
                        "vector width) (default: portable)")
    c.add_argument("--embed-weights", action="store_true",
                   help="compile the weights into the library (DIR/NAME_weights.c) instead of weights.bin")
    c.add_argument("--name", metavar="NAME",
                   help="the library's name: libNAME.so, NAME.h, the NAME_ prefix of every symbol "
                        "(default: the model file's name)")
    c.add_argument("--example-inputs", metavar="IN.npz",
                   help="inputs for DIR/example.c, named like the parameters (default: random ones: "
                        "float32 standard normal, integers in [0, 4), bools half true); the expected "
                        "outputs are the numpy reference's")

    c = sub.add_parser("cache", help="show or empty the cache of compiled kernels, optimized graphs and imported models",
                       description="show (info) or empty (clear) the cache directory's compiled kernels, "
                                   "optimized graphs and imported ONNX models: $EQFUSE_CACHE_DIR, else $XDG_CACHE_HOME/eqfuse, else "
                                   "~/.cache/eqfuse")
    c.add_argument("action", choices=["info", "clear"],
                   help="info: the directory, and the entries and bytes of each kind; clear: remove them all")

    c = sub.add_parser("rules", help="list every active rule", description="list every active rule")
    _rule_options(c)

    c = sub.add_parser("ops", help="the op reference: every op's signature, attributes, kind and meaning")
    c.add_argument("name", nargs="?", metavar="NAME", help="show one op in full (default: list every op)")

    c = sub.add_parser("check-rules", help="test each rule's soundness on random inputs",
                       description="test each rule's soundness on random inputs; exit 1 if one is unsound")
    c.add_argument("files", nargs="+", metavar="F.rw")
    c.add_argument("--trials", type=int, default=5, metavar="N",
                   help="random draws of shapes and values per rule; both sides must agree on all (default: 5)")
    c = model_cmd("grad", "write the joint forward + backward graph as .g text", one_graph=True)
    c.add_argument("--wrt", required=True, metavar="P1,P2",
                   help="comma-separated f32 parameters to differentiate the loss (the graph's first "
                        "result, a scalar) by; the graph returns its results, then these gradients in "
                        "this order (required)")
    c.add_argument("-o", "--output", metavar="OUT.g",
                   help="write the graph to this file instead of stdout (it parses back as it prints)")

    c = sub.add_parser("check-grads", help="check every op's derivative against finite differences",
                       description="check every derivative rule of eqfuse/grad/derivatives.rw against "
                                   "central finite differences in float64 on random inputs, one line per "
                                   "op and argument; exit 1 if one differs or a rule is never exercised")
    c.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the random inputs (default: 0)")
    return p


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line; leftover words are a usage error naming the nearest option."""
    p = make_parser()
    args, extra = p.parse_known_args(argv)
    if extra:
        raise unknown_arguments(p, args.command, extra)
    return args


def unknown_arguments(p, command: str | None, extra: list[str]) -> UsageError:
    parser = p.commands[command] if command else p
    options = [s for s in parser._option_string_actions if s.startswith("--")]
    word = next((w for w in extra if w.startswith("-")), None)
    if word is None:
        return UsageError(f"unexpected argument '{extra[0]}' (see '{parser.prog} --help')")
    name = word.split("=", 1)[0]
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    elsewhere = [c for c, sp in p.commands.items() if name in sp._option_string_actions]
    if close:
        hint = f"did you mean '{close[0]}'?"
    elif elsewhere:
        hint = f"{name} is an option of {', '.join(elsewhere)}"
    else:
        hint = None
    return UsageError(f"{parser.prog}: unknown option '{name}' (see '{parser.prog} --help')", hint=hint)
