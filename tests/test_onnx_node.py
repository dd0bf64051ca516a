"""onnx's own backend node tests, run through eqfuse's ONNX backend, for every supported op.

Every node test of a supported op runs (onnx builds them in memory from onnx.backend.test.case),
through eqfuse.compile when it works (eqfuse.onnx_backend.engine()); the cases excluded below
are outside what eqfuse supports, each for the reason given next to it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import subprocess
import sys
import warnings
from unittest import mock

import numpy as np
import pytest

pytest.importorskip("onnx")

import onnx.backend.test  # noqa: E402

from eqfuse.onnx_backend import EqfuseBackend  # noqa: E402

SUPPORTED = [
    "add", "sub", "mul", "div", "pow", "matmul", "gemm", "relu", "gelu", "sigmoid", "tanh", "erf",
    "exp", "sqrt", "softmax", "layer_normalization", "reduce_mean", "reduce_sum", "reduce_sum_square", "reduce_max",
    "transpose", "reshape", "slice", "concat", "conv", "convtranspose", "batchnorm", "constant", "identity",
    # masks, indices and what exporters write around them
    "where", "equal", "less", "less_equal", "greater", "greater_equal", "and", "or", "not", "xor", "isnan",
    "gather", "gather_elements", "gathernd", "expand", "squeeze", "unsqueeze", "flatten",
    "split", "maxpool", "averagepool", "globalaveragepool", "globalmaxpool", "clip",
    "leakyrelu", "hardsigmoid", "hardswish", "softplus", "reduce_min", "reduce_prod", "reduce_l2", "argmax",
    "tril", "triu", "tile", "instancenorm", "scatternd", "scatter_elements", "scatter", "logsoftmax", "argmin",
    "attention", "rms_normalization", "rotary_embedding", "group_normalization",
    # activations written with the op table's, rounding and trigonometry
    "elu", "selu", "celu", "thresholdedrelu", "softsign", "mish", "shrink", "round", "tan", "asin", "acos", "atan",
    "sinh", "cosh", "asinh", "acosh", "atanh", "isinf", "reduce_l1", "reduce_log_sum", "top_k",
]
# Cast (f32 <-> i64/i32/bool), Einsum, CumSum, Range, Pad: onnx's cases use other dtypes or runtime
# attributes (see EXCLUDED); tests/test_onnx_import.py checks them on the cases exporters write.

EXCLUDED = {
    # unsigned, 8/16-bit and float64/float16 tensors: eqfuse has f32, i64, i32 and bool
    r"_uint(8|16|32|64)|_int(8|16)": "unsigned or narrow integer dtype",
    r"test_pow_types_": "integer operands of pow",
    r"test_matmulinteger|test_convinteger": "integer ops (different ONNX ops)",
    # empty tensors: eqfuse dimensions are positive
    r"_empty_set": "empty tensor (a 0-sized dimension)",
    r"test_reshape_allowzero_reordered": "empty tensor (a 0-sized dimension)",
    r"test_slice_start_out_of_bounds|test_slice_end_out_of_bounds": "empty slice result",
    # training-mode batchnorm computes batch statistics and extra outputs
    r"test_batchnorm_.*_training_mode": "training mode's running mean and variance outputs",
    r"test_convtranspose_(1d|3d|dilations|autopad_same|output_shape|kernel_shape)":
        "ConvTranspose 1-D/3-D, dilated, auto_pad SAME or output_shape",
    # other ops that share a prefix with a supported one
    r"test_constantofshape": "ConstantOfShape of a runtime shape",
    # the mask and index ops' cases outside what eqfuse computes
    r"_select_last_index": "ArgMax select_last_index",
    r"pool_3d|pool_2d_dilations|pool_with_argmax": "3-D pooling, dilations or the indices output (1-D and 2-D "
    "pooling with any pads, auto_pad and ceil_mode are supported)",
    r"test_cast_.*(FLOAT16|BFLOAT16|DOUBLE|FLOAT8|FLOAT4|INT4|INT2|UINT4|UINT2|e8m0)": "a dtype eqfuse does not have",
    r"test_reduce_log_sum_exp_": "float64 data (tests/test_random_onnx.py checks ReduceLogSumExp in f32)",
    r"test_cumsum_|test_einsum_(batch_matmul|inner_prod|sum|transpose|scalar)_cpu": "float64 data",
    r"test_einsum_batch_diagonal|test_einsum_.*bfloat16|test_einsum_scalar|test_einsum_inner_prod|test_einsum_sum":
        "einsum beyond the two-operand matmul forms exporters write",
    r"test_range_": "Range over runtime bounds (a data-dependent shape); constant bounds fold at import",
    r"test_split_to_sequence|test_split_zero_size": "sequence outputs or zero-size parts",
    r"test_tril_zero|test_triu_zero": "empty tensor (a 0-sized dimension)",
    r"test_constant_pad(_axes|_negative_axes)?_cpu": "Pad with a runtime constant_value (a constant one is supported)",
    r"test_identity_sequence|test_identity_opt": "sequence / optional values",
    r"test_celu_(b?float16)": "float16 and bfloat16 tensors",
    # Attention (opset 23 and later) outside what eqfuse computes, with their `_expanded` twins (the
    # same cases as ONNX functions of plain ops, which onnx makes from the same generators: the
    # narrowed generation below skips both)
    r"test_attention_.*(fp16|bf16|float16)": "float16 and bfloat16 tensors",
    r"test_attention_.*qk_matmul": "the qk_matmul_output output",
    r"test_attention_.*(nonpad|padded_kv|ext_cache)": "nonpad_kv_seqlen (opset 24: run-time lengths per batch)",
    r"test_attention_.*window": "the sliding-window attributes of opset 25",
}

INCLUDE = re.compile(rf"^test_({'|'.join(SUPPORTED)})(_.*)?_cpu$")
EXCLUDE = re.compile("|".join(EXCLUDED))

# onnx makes its node cases in memory by importing a generator module per ONNX op and running
# every `export_*` function in it: all of them take 10 s of each xdist worker's collection, most
# of it in the 3-D pooling references. Only the modules of the supported ops run here, and in
# them not the generators whose case is excluded by name. The heavy
# test_the_narrowed_generation_selects_what_the_full_one_does checks that nothing is lost.
RENAMED = {"batchnorm": "batch_normalization", "tril": "trilu", "triu": "trilu", "less_equal": "less_or_equal",
           "greater_equal": "greater_or_equal", "and": "and_", "or": "or_", "not": "not_",
           "instancenorm": "instance_normalization", "reduce_log_sum": "reduce_log_sum",
           "top_k": "topk"}  # op: its module
CASE_MODULES = sorted({RENAMED.get(op, op.replace("_", "")) for op in SUPPORTED})


def _selected(name: str) -> bool:
    return bool(INCLUDE.match(name)) and not EXCLUDE.search(name)


@contextlib.contextmanager
def _narrowed_generation():
    import onnx.backend.test.case.base as case_base
    import onnx.backend.test.case.node as case_node
    import onnx.backend.test.loader as loader

    def run_exports(cls, name, bases, dct):  # onnx's _Exporter.__init__ without the excluded exports
        for key in dct:
            if key.startswith("export") and not EXCLUDE.search(f"test_{key[len('export_'):]}_cpu"):
                np.random.seed(seed=0)
                getattr(cls, key)()
        type.__init__(cls, name, bases, dct)

    with mock.patch.object(case_base._Exporter, "__init__", run_exports):
        for mod in CASE_MODULES:
            importlib.import_module(f"{case_node.__name__}.{mod}")
    with mock.patch.object(loader, "import_recursive", lambda package: None):
        yield


def backend_cases(narrowed: bool = True):
    """onnx's BackendTest with eqfuse's backend (every case of every op unless `narrowed`)."""
    with warnings.catch_warnings():  # onnx's case generators overflow casts on purpose
        warnings.simplefilter("ignore")
        with _narrowed_generation() if narrowed else contextlib.nullcontext():
            return onnx.backend.test.BackendTest(EqfuseBackend, __name__)


# EQFUSE_TEST_ONNX_CASES=all: every generator runs (the heavy test below compares the two)
backend_test = backend_cases(narrowed=os.environ.get("EQFUSE_TEST_ONNX_CASES") != "all")
backend_test.include(INCLUDE.pattern)
for pattern in EXCLUDED:
    backend_test.exclude(pattern)


# Only the selected cases become tests (not thousands of skipped ones).
for _name, _case in backend_test.test_cases.items():
    for _attr in [a for a in vars(_case) if a.startswith("test_") and not _selected(a)]:
        delattr(_case, _attr)
    if any(a.startswith("test_") for a in vars(_case)):
        globals()[_name] = _case


def selected_names() -> list[str]:
    return [a for v in list(globals().values()) if isinstance(v, type) and v.__name__.startswith("OnnxBackend")
            for a in vars(v) if a.startswith("test_")]


def test_selection_covers_every_supported_op():
    names = selected_names()
    for op in SUPPORTED:
        assert any(re.match(rf"test_{op}(_.*)?_cpu$", n) for n in names), op


# (the suite's budget: a check of the tests' own case selection; test_selection_covers_every_supported_op
# runs by default)
@pytest.mark.extended
def test_the_narrowed_generation_selects_what_the_full_one_does():
    """Every case generator of every ONNX op, run in a fresh process, selects the same tests."""
    code = "import test_onnx_node as t; print('\\n'.join(sorted(t.selected_names())))"
    out = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(__file__), capture_output=True,
                         text=True, check=True, env={**os.environ, "EQFUSE_TEST_ONNX_CASES": "all"}).stdout.split()
    assert len(out) > 100
    assert out == sorted(selected_names())
