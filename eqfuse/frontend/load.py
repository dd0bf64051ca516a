"""Reading models: a path or source text -> parsed, checked graphs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from eqfuse.errors import EqfuseError
from eqfuse.frontend.builder import build_module
from eqfuse.frontend.parser import parse
from eqfuse.ir.graph import Graph


def read_source(src: str | os.PathLike) -> tuple[str | bytes, str]:
    """(text, file name) from a path or from source text itself."""
    if isinstance(src, str) and not src.strip():
        raise EqfuseError("the model is empty: give a .g or .onnx path, or the text of a .g model")
    if isinstance(src, os.PathLike) or (isinstance(src, str) and "\n" not in src and "{" not in src):
        path = Path(src)
        if not path.exists():
            raise EqfuseError(f"{path}: no such file")
        if path.is_dir():
            raise EqfuseError(f"{path} is a directory, not a model file")
        return path.read_bytes(), str(path)
    return src, "<string>"


def load_with_weights(src: str | os.PathLike, dims: Mapping[str, int] | None = None) -> tuple[list[Graph], dict]:
    """load(), and an ONNX model's weights (its initializers, bound as params by default) from the
    same import: reading BERT-base's 440 MB file and importing it cost 0.45 s a time."""
    if isinstance(src, (str, os.PathLike)) and str(src).endswith(".onnx") and "\n" not in str(src):
        from eqfuse.frontend.onnx_import import import_model

        path = Path(src)
        if path.is_dir():
            raise EqfuseError(f"{path} is a directory, not a model file")
        imp = import_model(path, dims=dims)
        return [imp.graph], imp.params
    return load(src, dims), {}


def load(src: str | os.PathLike, dims: Mapping[str, int] | None = None) -> list[Graph]:
    """Parse and check every graph of a model (a .g path, source text, or an .onnx path). `dims`
    binds an ONNX model's symbolic dims at import (a .g model's are bound later, by compile)."""
    text, file = read_source(src)
    if file.endswith(".onnx"):
        from eqfuse.frontend.onnx_import import (
            import_onnx,  # optional dependency, imported only when needed
        )

        return [import_onnx(file, dims=dims)]
    return build_module(parse(text, file))
