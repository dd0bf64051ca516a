"""The package's import graph follows the pipeline (docs/design.md): every module belongs to a
stage, imports only from its own stage or the stages below, takes part in no import cycle, and
imports no private name (`_x`) of another module. Every import statement counts, including those
inside functions: a lazy import hides a dependency, it does not remove it. Only third-party
modules (torch, onnx, ...) may be imported lazily, and they are not eqfuse's."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "eqfuse"

# The stages, bottom to top. A module belongs to the stage with a prefix of its name ("=name": that
# module alone, not the modules below it).
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("eqfuse.errors", "eqfuse.progress", "eqfuse.version", "eqfuse.machine", "eqfuse.cache")),
    ("ir", ("eqfuse.ir",)),
    ("frontend", ("eqfuse.frontend",)),
    ("optimizer", ("eqfuse.optimizer", "eqfuse.grad")),
    ("backend", ("eqfuse.backend",)),
    ("runtime", ("eqfuse.runtime",)),
    ("drivers", ("eqfuse.pipeline", "eqfuse.cli", "eqfuse.torch_backend",
                 "eqfuse.trace", "eqfuse.numpy", "eqfuse.export", "eqfuse.export_c", "eqfuse.onnx_backend", "eqfuse.__main__",
                 "eqfuse.generation",
                 "=eqfuse")),
]


def stage_of(module: str) -> int | None:
    for level, (_, prefixes) in enumerate(STAGES):
        for p in prefixes:
            if module == p.lstrip("=") or (not p.startswith("=") and module.startswith(p + ".")):
                return level
    return None


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


@functools.cache
def parsed(text: str) -> tuple[ast.AST, ...]:
    """The import statements and attribute reads of a source file, in ast.walk's order: parsed and
    walked once for the tests that read every module's (none changes a node)."""
    return tuple(n for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.Import, ast.ImportFrom, ast.Attribute)))


def imports(module: str, path: Path, known: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) for every eqfuse import in the file."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in parsed(path.read_text()):
        if isinstance(node, ast.Import):
            found += [(a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] == "eqfuse"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "eqfuse":
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                found.append((sub, "", node.lineno) if sub in known else (target, a.name, node.lineno))
    return found


def graph() -> tuple[dict[str, set[str]], list[str]]:
    known = modules()
    edges: dict[str, set[str]] = {m: set() for m in known}
    problems: list[str] = []
    for m, path in known.items():
        if stage_of(m) is None:
            problems.append(f"{m} belongs to no stage (tests/test_imports.py STAGES)")
        for target, name, line in imports(m, path, known):
            where = f"{path.relative_to(PACKAGE.parent)}:{line}"
            if target not in known:
                problems.append(f"{where}: imports {target}, which is not a module")
                continue
            if target != m:
                edges[m].add(target)
            if name.startswith("_") and not name.startswith("__") and target != m:
                problems.append(f"{where}: imports the private name {name} of {target}")
            sm, st = stage_of(m), stage_of(target)
            if sm is not None and st is not None and st > sm:
                problems.append(f"{where}: {m} ({STAGES[sm][0]}) imports {target} ({STAGES[st][0]}), "
                                "a later stage")
    return edges, list(dict.fromkeys(problems))


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_imports_point_down_the_pipeline():
    _, problems = graph()
    assert not problems, "\n".join(problems)


def test_no_import_cycles():
    edges, _ = graph()
    found = cycles(edges)
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def test_the_checker_sees_an_upward_import_a_cycle_and_a_private_name(tmp_path, monkeypatch):
    """The checks above can fail: a fake package with one of each."""
    pkg = tmp_path / "eqfuse"
    (pkg / "ir").mkdir(parents=True)
    (pkg / "backend").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ir" / "__init__.py").write_text("")
    (pkg / "backend" / "__init__.py").write_text("")
    (pkg / "ir" / "a.py").write_text("def f():\n    from eqfuse.backend.b import _g\n")
    (pkg / "backend" / "b.py").write_text("from eqfuse.ir import a\n")
    (pkg / "stray.py").write_text("")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", pkg)
    edges, problems = graph()
    text = "\n".join(problems)
    assert "eqfuse.ir.a (ir) imports eqfuse.backend.b (backend)" in text
    assert "private name _g" in text
    assert "eqfuse.stray belongs to no stage" in text
    assert cycles(edges) == [["eqfuse.backend.b", "eqfuse.ir.a"]]


# ------------------------------------------------------------------ the machine model is passed down
#
# The machine model (eqfuse.machine) is read by the drivers (pipeline, cli, export: the stages that
# build it or pin it) and passed down as an argument: `lower_graph(g, m)`, each kind's `plan(plan,
# m)`, `optimize_graph(..., machine=m)`, emit_gemm's `blocking`. No module of these stages reads it.
PASSED_DOWN = ("eqfuse.ir", "eqfuse.frontend", "eqfuse.optimizer", "eqfuse.grad", "eqfuse.backend", "eqfuse.runtime")
READERS = {"machine", "host_machine", "pinned", "pin"}  # eqfuse.machine's functions that read or set it
# ... except, each with the reason:
READS_THE_MACHINE = {
    # The C build stage: every library (kernels, an artifact's per-level builds, the tests' and
    # benchmarks' helper code) is compiled with the -march of the model in force, the one the plans
    # were made for (the drivers select it with `pinned`), and the kernel cache keys on it.
    "eqfuse.backend.cbuild",
    # mod.save(targets=...): builds the machine model of each target level the artifact holds (this
    # host's, with that level's vector width) and pins it while the functions are built again.
    "eqfuse.runtime.artifact",
}


def machine_reads(module: str, path: Path) -> list[str]:
    """Where `module` reads the machine model: a reader imported from eqfuse.machine, or one
    called through the module (`from eqfuse import machine; machine.machine()`)."""
    text = path.read_text()
    if "machine" not in text and "pin" not in text:
        return []
    found, modules_named, attributes = [], set(), []
    for node in parsed(text):
        if isinstance(node, ast.ImportFrom) and node.module == "eqfuse.machine":
            found += [f"{module}:{node.lineno} imports {a.name}" for a in node.names if a.name in READERS]
        elif isinstance(node, ast.ImportFrom) and node.module == "eqfuse":
            modules_named |= {a.asname or a.name for a in node.names if a.name == "machine"}
        elif isinstance(node, ast.Import):
            modules_named |= {a.asname or a.name for a in node.names if a.name == "eqfuse.machine"}
        elif isinstance(node, ast.Attribute) and node.attr in READERS:
            attributes.append(node)
    found += [f"{module}:{node.lineno} calls {ast.unparse(node)}" for node in attributes
              if ast.unparse(node.value) in modules_named]
    return found


def test_the_machine_model_is_read_by_the_drivers_and_passed_down():
    found = [r for module, path in sorted(modules().items())
             if module.startswith(PASSED_DOWN) and module not in READS_THE_MACHINE
             for r in machine_reads(module, path)]
    assert not found, "\n".join(found)
    assert all(machine_reads(m, modules()[m]) for m in READS_THE_MACHINE)  # (an exception still needed)


def test_the_machine_check_sees_a_read(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from eqfuse.machine import Machine, machine\nfrom eqfuse import machine as M\n"
                 "def plan(m: Machine):\n    return M.host_machine()\n")
    assert machine_reads("eqfuse.backend.x", f) == ["eqfuse.backend.x:1 imports machine",
                                                    "eqfuse.backend.x:4 calls M.host_machine"]
