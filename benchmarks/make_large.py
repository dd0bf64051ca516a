"""The large inputs of the optimizer's scale figures (docs/performance.md, "The optimizer"):

    python benchmarks/make_large.py OUTDIR      # writes concat5000.g, relu20000.g, graphs5000.g
    /usr/bin/time -v taskset -c 0 python -m eqfuse.cli opt OUTDIR/concat5000.g > /dev/null

- concat5000.g: one concat of 5000 operands (15 KB);
- relu20000.g: a chain of 20,000 relus;
- graphs5000.g: 5000 small graphs `relu(x * y + 1.0)` in one file.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def concat(n: int) -> str:
    return f"graph wide(x: f32[2, 3]) -> f32[{2 * n}, 3] {{\n    return concat({', '.join(['x'] * n)}, axis=0)\n}}\n"


def chain(n: int) -> str:
    lines = ["graph chain(x: f32[64]) -> f32[64] {", "    t0 = relu(x)"]
    lines += [f"    t{i} = relu(t{i - 1})" for i in range(1, n - 1)]
    lines += [f"    return relu(t{n - 2})", "}"]
    return "\n".join(lines) + "\n"


def graphs(n: int) -> str:
    return "".join(f"graph g{i}(x: f32[8], y: f32[8]) -> f32[8] {{\n    return relu(x * y + 1.0)\n}}\n" for i in range(n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    a = ap.parse_args()
    a.outdir.mkdir(parents=True, exist_ok=True)
    for name, text in (("concat5000.g", concat(5000)), ("relu20000.g", chain(20000)), ("graphs5000.g", graphs(5000))):
        (a.outdir / name).write_text(text)
        print(a.outdir / name, f"{len(text) / 1e3:.0f} KB")


if __name__ == "__main__":
    main()
