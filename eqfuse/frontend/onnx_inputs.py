"""An ONNX model file before its graph is imported: reading it, its inputs and their named dims,
and the names the importer gives them (eqfuse.frontend.onnx_import)."""

from __future__ import annotations

import keyword
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from eqfuse.errors import EqfuseError
from eqfuse.ir.graph import Graph

if TYPE_CHECKING:
    import onnx

RESERVED = {"graph", "kernel", "return", "true", "false", "f32"}


def input_shapes(model) -> list[tuple[str, str, tuple[int | str, ...]]]:
    """(ONNX name, parameter name, dims) of each model input that is not a weight, a named dim
    as the importer names it (its dim_param sanitized, else '<input>_<axis>'); no graph import."""
    proto = load_model(model)
    init = {t.name for t in proto.graph.initializer}
    return [(vi.name, sanitize(vi.name), tuple(
        d.dim_value if d.HasField("dim_value") else sanitize(d.dim_param) if d.dim_param else f"{sanitize(vi.name)}_{a}"
        for a, d in enumerate(vi.type.tensor_type.shape.dim)))
        for vi in proto.graph.input if vi.name not in init and vi.type.HasField("tensor_type")]


def graph_name(model) -> str:
    return sanitize(load_model(model).graph.name or "model") or "model"


def input_dims(model) -> list[str]:
    """The named dims of an ONNX model's inputs as the importer names them, and the dim_params they
    came from (what `dims=` may bind), without importing the graph."""
    proto = load_model(model)
    init = {t.name for t in proto.graph.initializer}
    raw = [d.dim_param for vi in proto.graph.input if vi.name not in init for d in vi.type.tensor_type.shape.dim]
    named = [d for _, _, shape in input_shapes(proto) for d in shape if isinstance(d, str)]
    return list(dict.fromkeys(named + [d for d in raw if d]))


# the ops an input's values pass through unchanged on their way to index a table (tables())
_PASSES = ("Cast", "Reshape", "Unsqueeze", "Squeeze", "Identity", "Flatten", "Expand")


def tables(model) -> dict[str, int]:
    """ONNX input name -> the rows of the initializer that input indexes (the first Gather, in
    topological order, whose indices are the input, perhaps through a Cast or a reshape): a
    decoder's position ids index its position table (GPT-2's wpe), whose rows bound them."""
    proto = load_model(model)
    inits = {t.name: tuple(t.dims) for t in proto.graph.initializer}
    origin = {vi.name: vi.name for vi in proto.graph.input if vi.name not in inits}
    rows: dict[str, int] = {}
    for node in proto.graph.node:
        if node.op_type in _PASSES and node.input and node.input[0] in origin:
            origin.update(dict.fromkeys(node.output, origin[node.input[0]]))
        elif (node.op_type == "Gather" and len(node.input) == 2 and node.input[1] in origin
              and node.input[0] in inits and inits[node.input[0]]):
            rows.setdefault(origin[node.input[1]], int(inits[node.input[0]][0]))
    return rows


def windows(model) -> dict[str, int]:
    """ONNX output name -> the rows the output keeps of the end of its axis 2, for each output
    that is a Slice of it from a constant negative start to the end: a sliding-window layer's
    cache (Gemma2's and Gemma3's sliding layers return the last sliding_window - 1 rows of
    their past and new keys and values)."""
    proto = load_model(model)
    slices = _window_slices(proto)
    return {o.name: slices[o.name] for o in proto.graph.output if o.name in slices}


def window_slices(model) -> dict[str, str]:
    """What a sliding-window layer's export computes to keep the last rows of its cache, each
    output name with how to import it to keep the cache whole instead (import_model's
    whole_windows): "identity" for the Slices that keep those rows, the present's (windows())
    and the past's, which such an export slices before appending the new rows (a Slice of a
    graph input, perhaps through an Identity or a Concat of one operand); "zero" for the rows it
    drops as the dynamo exporter computes them, Max(0, past - k), which the shapes of its
    attention's operands subtract. Imported so, the layer's cache is its past and new rows
    whole, and its attention reads them all: the export's band mask, computed from the positions
    over the whole cache, then leaves out the keys past the window."""
    proto = load_model(model)
    slices = _window_slices(proto)
    outputs = {o.name for o in proto.graph.output}
    producer = {o: n for n in proto.graph.node for o in n.output}
    inputs = {i.name for i in proto.graph.input}

    def from_input(name: str) -> bool:
        n = producer.get(name)
        while n is not None and n.op_type in ("Identity", "Concat") and len(n.input) == 1:
            name, n = n.input[0], producer.get(n.input[0])
        return n is None and name in inputs

    found = {out: "identity" for out, n in ((o, producer[o]) for o in slices)
             if out in outputs or from_input(n.input[0])}
    kept = set(slices[o] for o in found)
    const = _scalar_const(proto)
    for n in proto.graph.node:
        if n.op_type == "Max" and len(n.input) == 2 and 0 in map(const, n.input):
            add = producer.get(next((i for i in n.input if const(i) != 0), ""))
            if add is not None and add.op_type == "Add" and -min(map(const, add.input)) in kept:
                found[n.output[0]] = "zero"
    return found


def _scalar_const(proto):
    """name -> the value of a constant integer scalar (a Constant node's or an initializer), else a large number."""
    from onnx import TensorProto, numpy_helper

    consts = {n.output[0]: n.attribute[0].t for n in proto.graph.node
              if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value"}
    consts.update({t.name: t for t in proto.graph.initializer})

    def value(name: str) -> int:
        t = consts.get(name)
        if t is None or t.data_type != TensorProto.INT64 or int(np.prod(t.dims)) != 1:
            return 2 ** 63
        return int(numpy_helper.to_array(t).reshape(-1)[0])
    return value


def _window_slices(proto) -> dict[str, int]:
    """Output name -> rows kept, of each Slice along axis 2 from a constant negative start to the end."""
    from onnx import TensorProto, numpy_helper

    consts = {n.output[0]: n.attribute[0].t for n in proto.graph.node
              if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value"}
    consts.update({t.name: t for t in proto.graph.initializer})

    def ints(name: str) -> list[int] | None:
        t = consts.get(name)
        if t is None or t.data_type != TensorProto.INT64:
            return None
        return [int(v) for v in numpy_helper.to_array(t).reshape(-1)]

    kept: dict[str, int] = {}
    for n in proto.graph.node:
        if n.op_type != "Slice" or len(n.input) < 4:
            continue
        starts, ends, axes = ints(n.input[1]), ints(n.input[2]), ints(n.input[3])
        steps = ints(n.input[4]) if len(n.input) > 4 and n.input[4] else [1]
        if (starts and len(starts) == 1 and starts[0] < 0 and ends and ends[0] >= 2 ** 62
                and axes in ([2], [-2]) and steps == [1]):
            kept[n.output[0]] = -starts[0]
    return kept


@dataclass(frozen=True)
class Header:
    """What the stages read of an ONNX model before importing its graph, from one parse of it
    (onnx_cache.header keeps it per file: parsing a decoder's protobuf reads all of its weights)."""

    name: str  # graph_name
    inputs: tuple[tuple[str, str, tuple[int | str, ...]], ...]  # input_shapes
    dims: tuple[str, ...]  # input_dims
    tables: Mapping[str, int]  # tables
    windows: Mapping[str, int]  # windows


def header(model) -> Header:
    proto = load_model(model)
    return Header(graph_name(proto), tuple(input_shapes(proto)), tuple(input_dims(proto)), tables(proto),
                  windows(proto))


@dataclass
class Imported:
    """An imported ONNX model (eqfuse.frontend.onnx_import, or its cache: onnx_cache)."""

    graph: Graph
    params: dict[str, np.ndarray]  # parameter name -> array, in parameter order
    inputs: list[str]  # ONNX names of the runtime inputs, in parameter order
    outputs: list[str]  # ONNX names of the outputs


def load_model(model, where: str | None = None) -> "onnx.ModelProto":
    """A ModelProto from a path, the file's bytes (`where`: the file they were read from, for
    messages) or a ModelProto. onnx is imported here, not with this module: a model served by the
    import cache (eqfuse.frontend.onnx_cache) never needs it."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    what = where if isinstance(model, bytes) and where else model
    try:
        proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(os.fspath(model))
    except FileNotFoundError:
        raise EqfuseError(f"{model}: no such file") from None
    except Exception as e:  # a protobuf DecodeError or an unreadable external-data file
        raise EqfuseError(f"{what}: not a readable ONNX model ({type(e).__name__}: {e})") from None
    # (checked where the bytes are parsed: the importer passes the parsed model on, and walks it once)
    bad = _not_utf8(proto)
    if bad:
        raise EqfuseError(f"{what if isinstance(what, str) else os.fspath(what)}: not a readable ONNX model "
                          f"(its {bad} is not UTF-8 text)")
    return proto


def _not_utf8(msg, path: str = "") -> str | None:
    """The first string field of the message (recursively) that is not UTF-8, as a path such as
    'graph.input[0].type.tensor_type.shape.dim[0].dim_param'; None when there is none. (ONNX's
    protobuf is proto2, whose parser leaves such a field as bytes, not str: every name would be
    read as bytes further on.)"""
    for field, value in msg.ListFields():
        if field.type not in (field.TYPE_MESSAGE, field.TYPE_STRING):
            continue
        name = f"{path}.{field.name}" if path else field.name
        # (protobuf 5.28 added is_repeated, and later versions drop label)
        repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
        for k, item in enumerate(value if repeated else [value]):
            at = f"{name}[{k}]" if repeated else name
            bad = _not_utf8(item, at) if field.type == field.TYPE_MESSAGE else at if isinstance(item, bytes) else None
            if bad:
                return bad
    return None


DIMS_HINT = ("bind the named dims: --dim NAME=N on the command line; eqfuse.compile without dims= binds them "
             "per call (README: \"Any batch size and sequence length\")")


def sanitize(name: str) -> str:
    """An ONNX name as a .g identifier: '/layer1/Conv_output_0' -> 'layer1_Conv_output_0'."""
    s = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_")
    s = re.sub(r"__+", "_", s)
    if not s or s[0].isdigit():
        s = "v" + ("_" + s if s else "")
    if s in RESERVED or keyword.iskeyword(s):
        s += "_"
    return s
