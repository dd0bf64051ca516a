"""An `onnx.backend.base.Backend` running ONNX models through eqfuse.

    rep = EqfuseBackend.prepare(model)      # import (initializers bound as params) and compile
    outputs = rep.run([x, ...])             # numpy in, numpy out, in the model's output order

ENGINE is the one switch: "compile" (the default) runs eqfuse.compile (C kernels), "reference"
the numpy reference of the imported graph, only when asked for with EQFUSE_ONNX_ENGINE=reference
or engine("reference"): a model that does not compile is an error, never a silent fallback.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, namedtupledict

from eqfuse.errors import ArgumentError, EqfuseError
from eqfuse.frontend.onnx_import import import_model
from eqfuse.ir.graph import Graph
from eqfuse.ir.printer import graph_text
from eqfuse.ir.reference import bind_arrays, evaluate

_ENGINE: str | None = None


def engine() -> str:
    """"compile" or "reference" (decided once per process)."""
    global _ENGINE
    if _ENGINE is None:
        forced = os.environ.get("EQFUSE_ONNX_ENGINE", "").strip()
        if forced not in ("", "compile", "reference"):
            raise EqfuseError(f"EQFUSE_ONNX_ENGINE must be 'compile' or 'reference', got '{forced}'")
        _ENGINE = forced or "compile"  # the reference runs only when asked for: never a silent fallback
    return _ENGINE


def set_engine(name: str | None) -> None:
    """Force an engine ("compile" or "reference"), or None to decide again."""
    global _ENGINE
    if name not in (None, "compile", "reference"):
        raise ValueError(f"engine must be 'compile' or 'reference', got {name!r}")
    _ENGINE = name


class _Prepared:
    """One imported (and, with the compile engine, compiled) graph."""

    def __init__(self, graph: Graph, params: dict[str, np.ndarray], engine_name: str):
        self.graph, self.params = graph, params
        self.inputs = [(n, t) for n, t in graph.params if n not in params]
        self.module = None
        if engine_name == "compile":
            import eqfuse

            self.module = eqfuse.compile(graph_text(graph), params=params)

    def run(self, arrays: list) -> list[np.ndarray]:
        arrays = [_as_declared(a, t) for a, (_, t) in zip(arrays, self.inputs)] + list(arrays[len(self.inputs):])
        if self.module is not None:
            out = self.module(*arrays)
            return list(out) if isinstance(out, tuple) else [out]
        if len(arrays) != len(self.inputs):
            names = ", ".join(n for n, _ in self.inputs)
            raise ArgumentError(f"{self.graph.name}() takes {len(self.inputs)} arrays ({names}), got {len(arrays)}")
        it = iter(arrays)
        full = [self.params[n] if n in self.params else next(it) for n, _ in self.graph.params]
        bind_arrays(self.graph, full)
        return evaluate(self.graph, full)


def _prepare(model, values: dict, engine_name: str) -> _Prepared:
    imp = import_model(model, values=values)
    return _Prepared(imp.graph, imp.params, engine_name)


def _as_declared(a, t) -> Any:
    """A float32 contiguous array; a [1]-shaped array where the model declares a scalar is reshaped."""
    a = np.asarray(a)
    if a.dtype == np.float32 and a.ndim != t.rank and t.concrete and a.size == t.size():
        a = a.reshape(t.shape)
    return a


class EqfuseRep(BackendRep):
    """A prepared model. Inputs that are not float32 (shapes, axes, slice bounds fed as inputs)
    are folded into the graph: the model is imported again for each new value of them."""

    def __init__(self, model, engine_name: str):
        from onnx import TensorProto

        self.model, self.engine = model, engine_name
        inits = {i.name for i in model.graph.initializer}
        self.input_names = [vi.name for vi in model.graph.input if vi.name not in inits]
        self.fixed = [vi.name for vi in model.graph.input if vi.name not in inits
                      and vi.type.tensor_type.elem_type != TensorProto.FLOAT]
        self.output_names = [o.name for o in model.graph.output]
        self._cache: dict[bytes, _Prepared] = {}
        if not self.fixed:
            self._cache[b""] = _prepare(model, {}, engine_name)

    def _prepared(self, values: dict[str, np.ndarray]) -> _Prepared:
        key = b"".join(np.asarray(values[n]).tobytes() + str(np.asarray(values[n]).shape).encode()
                       for n in self.fixed)
        if key not in self._cache:
            consts = {n: np.asarray(values[n]) for n in self.fixed}
            self._cache[key] = _prepare(self.model, consts, self.engine)
        return self._cache[key]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, dict):
            values = dict(inputs)
        else:
            arrays = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            if len(arrays) != len(self.input_names):
                raise ArgumentError(f"the model takes {len(self.input_names)} inputs "
                                    f"({', '.join(self.input_names)}), got {len(arrays)}")
            values = dict(zip(self.input_names, arrays))
        missing = [n for n in self.input_names if n not in values]
        if missing:
            raise ArgumentError(f"missing model input{'s' * (len(missing) > 1)}: {', '.join(missing)}")
        prep = self._prepared(values)
        outs = prep.run([values[n] for n in self.input_names if n not in self.fixed])
        return namedtupledict("Outputs", self.output_names)(*outs)


class EqfuseBackend(Backend):
    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs: Any) -> bool:
        try:
            import_model(model)
            return True
        except EqfuseError:
            return False

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs: Any) -> EqfuseRep:
        # No onnx.checker pass (Backend.prepare's default): it refuses outputs without a shape,
        # which run_node's models have; the importer reports what it cannot use.
        if not isinstance(model, onnx.ModelProto):  # a path or serialized bytes
            model = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(os.fspath(model))
        return EqfuseRep(model, kwargs.get("engine") or engine())

    @classmethod
    def run_model(cls, model, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs: Any, device: str = "CPU", outputs_info: Sequence | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        from onnx import helper

        ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype),
                                             np.asarray(a).shape) for n, a in zip(node.input, inputs)]
        outs = [helper.make_empty_tensor_value_info(n) for n in node.output]
        model = helper.make_model(helper.make_graph([node], "node", ins, outs))
        return cls.run_model(model, inputs, device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper().startswith("CPU")


prepare = EqfuseBackend.prepare
run_model = EqfuseBackend.run_model
run_node = EqfuseBackend.run_node
supports_device = EqfuseBackend.supports_device
