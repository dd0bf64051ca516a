"""Kernels per exported model after fusion: `python benchmarks/kernel_counts.py`.

For each model of tests/model_exports.py and both torch exporters: the kernels the compiled
graph runs (views, which are pointers into other buffers, not counted), the views, and the
layout kernels (copies) left. For GPT-2 and the MLP-Mixer also the kernels per layer (block):
the kernels of the 2-layer export minus those of the 1-layer export.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import model_exports as me  # noqa: E402

import eqfuse  # noqa: E402


def counts(path) -> tuple[int, int, int]:
    kinds = [k.kind for k in eqfuse.compile(str(path)).kernels]
    return sum(k != "view" for k in kinds), kinds.count("view"), kinds.count("layout")


def main() -> None:
    print("| model | exporter | kernels | views | layout copies | kernels per layer |")
    print("|---|---|---|---|---|---|")
    for name in me.MODELS:
        for exporter in me.EXPORTERS:
            k, v, lay = counts(me.export(name, exporter))
            per = ""
            if name in ("gpt2", "mixer"):
                per = str(k - counts(me.export(name, exporter, layers=1))[0])
            print(f"| {name} | {exporter} | {k} | {v} | {lay} | {per} |", flush=True)


if __name__ == "__main__":
    main()
