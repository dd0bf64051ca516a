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


def is_onnx(src) -> bool:
    """Whether src is the path of an ONNX model (not the text of a .g model)."""
    return isinstance(src, (str, os.PathLike)) and str(src).endswith(".onnx") and "\n" not in str(src)


def model_weights(src, dims: Mapping[str, int] | None = None) -> dict:
    """An .onnx model's initializers, bound as params by default (the user's params= win), as the
    model imports at `dims`; none for a .g model. The command line binds them too (run, bench, opt)."""
    if not is_onnx(src):
        return {}
    from eqfuse.frontend.onnx_cache import import_path

    return import_path(src, dims=dims or None).params


def input_aliases(src, dims: Mapping[str, int] | None = None) -> dict[str, str]:
    """{parameter name: the model's own input name} where they differ (ONNX names such as
    "input.1" are sanitized into parameter names); empty for .g models. `dims` as the model is
    imported with."""
    if not is_onnx(src):
        return {}
    from eqfuse.frontend.onnx_cache import import_path

    imp = import_path(src, dims=dims or None)
    return {imp.graph.nodes[i].name: onnx for i, onnx in zip(imp.graph.inputs, imp.inputs)}


def load_with_weights(src: str | os.PathLike, dims: Mapping[str, int] | None = None,
                      whole_windows: bool = False) -> tuple[list[Graph], dict]:
    """load(), and an ONNX model's weights (its initializers, bound as params by default) from the
    same import: reading BERT-base's 440 MB file and importing it is slow enough to do once
    (and once only, across processes: the import cache, eqfuse.frontend.onnx_cache)."""
    if is_onnx(src):
        from eqfuse.frontend.onnx_cache import import_path

        path = Path(src)
        if path.is_dir():
            raise EqfuseError(f"{path} is a directory, not a model file")
        imp = import_path(path, dims=dims, whole_windows=whole_windows)
        return [imp.graph], imp.params
    return load(src, dims), {}


def load(src: str | os.PathLike, dims: Mapping[str, int] | None = None) -> list[Graph]:
    """Parse and check every graph of a model (a .g path, source text, or an .onnx path). `dims`
    binds an ONNX model's symbolic dims at import (a .g model's are bound later, by compile; they
    only give a concat along named dims its length, frontend.builder)."""
    if is_onnx(src):
        return load_with_weights(src, dims)[0]  # (through the import cache)
    text, file = read_source(src)
    return build_module(parse(text, file), dims)
