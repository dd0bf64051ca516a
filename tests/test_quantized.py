"""Quantized ONNX models as onnxruntime's own quantizers write them load in eqfuse and match
onnxruntime on the same quantized file.

The models: an MLP, a tiny BERT-like encoder and a small CNN written here; GPT-2, ViT and a
ResNet-18 from tests/model_exports.py (small configs, random weights, no download). Each f32
export is quantized with onnxruntime.quantization (with 7-bit weights, reduce_range=True, on a CPU
where onnxruntime's u8 x s8 GEMM saturates: ORT_EXACT_S8):
  - dynamic: quantize_dynamic, int8 weights: DynamicQuantizeLinear + MatMulInteger (ConvInteger
    for convs) + scale multiply;
  - static: quantize_static in the QDQ format, u8 activations, i8 weights, calibrated on a few
    random inputs: QuantizeLinear / DequantizeLinear pairs around MatMul, Gemm and Conv;
  - qoperator: quantize_static in the QOperator format (QLinearConv), per-channel weights; only
    for the CNN (a ResNet's residual adds and pools become com.microsoft contrib ops).
GPT-2, ViT and ResNet-18 are quantized statically and dynamically (see MATRIX); GPT-2 also as
deployed, through onnxruntime's transformer optimizer first (gpt2-ort: ort_optimized).
Each is compiled with eqfuse.compile and run beside onnxruntime on the same file. onnxruntime
runs it twice: literally (graph optimizations off: each node as written, the file's meaning) and
as deployed (its default optimizations fuse QDQ groups into integer kernels that requantize
once, which rounds differently from the file's float steps). The bounds:
  - node by node: every node with integer outputs (QuantizeLinear, DynamicQuantizeLinear,
    MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv), fed onnxruntime's own inputs, gives
    the same integers (and the same dynamic scale and zero point) in eqfuse's reference, eqfuse's
    C and onnxruntime;
  - whole model against the literal run: |diff| <= one quantization step of the output. When a
    DequantizeLinear writes the output (static, qoperator), the step is its scale (the largest
    one, per channel). A dynamic model's output is float, computed after exact integer matmuls by
    float ops (scale multiply, bias, layernorm), so its step is the f32 rounding of that tail,
    1e-5 * max|output|;
  - whole model against the deployed run: that bound plus onnxruntime's own deviation between its
    two runs on the same input (its fused integer kernels' rounding, not eqfuse's).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
quant = pytest.importorskip("onnxruntime.quantization")

import model_exports as me  # noqa: E402

import eqfuse  # noqa: E402
from eqfuse.backend.kinds.contraction import qgemm  # noqa: E402
from eqfuse.frontend.onnx_import import onnx_params  # noqa: E402
from eqfuse.ir.ops import OPS  # noqa: E402
from eqfuse.machine import cpu_flags, machine  # noqa: E402
from eqfuse.pipeline import uops_text  # noqa: E402


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))


class TinyBert(torch.nn.Module):
    """One encoder layer: self-attention (2 heads) and a GELU feed-forward, post-norm, as BERT."""

    def __init__(self, d=32, heads=2):
        super().__init__()
        self.h, self.d = heads, d
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))
        self.f1, self.f2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.n1, self.n2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)

    def forward(self, x):
        B, S, D = x.shape
        split = lambda t: t.reshape(B, S, self.h, D // self.h).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        a = torch.softmax(q @ k.transpose(-1, -2) / (D // self.h) ** 0.5, -1) @ v
        x = self.n1(x + self.o(a.transpose(1, 2).reshape(B, S, D)))
        return self.n2(x + self.f2(torch.nn.functional.gelu(self.f1(x))))


def _cnn():
    """Convs only (padded, strided, grouped, 1x1) with ReLUs: QOperator's QLinearConv throughout."""
    c = torch.nn.Conv2d
    return torch.nn.Sequential(c(3, 8, 3, padding=1), torch.nn.ReLU(), c(8, 16, 3, 2, 1), torch.nn.ReLU(),
                               c(16, 16, 3, padding=1, groups=4), c(16, 4, 1))


class ResCNN(torch.nn.Module):
    """A ResNet in miniature: stem conv, max pool, a basic block, a strided block with a 1x1
    shortcut, global average pool and a linear head (QOperator: QLinearConv, MaxPool on u8,
    QLinearAdd, QLinearGlobalAveragePool, Flatten on u8, QGemm)."""

    def __init__(self):
        super().__init__()
        c = torch.nn.Conv2d
        self.stem, self.pool = c(3, 8, 3, padding=1), torch.nn.MaxPool2d(3, 2, 1)
        self.a1, self.a2 = c(8, 8, 3, padding=1), c(8, 8, 3, padding=1)
        self.b1, self.b2, self.bs = c(8, 16, 3, 2, 1), c(16, 16, 3, padding=1), c(8, 16, 1, 2)
        self.gap, self.fc = torch.nn.AdaptiveAvgPool2d(1), torch.nn.Linear(16, 10)

    def forward(self, x):
        r = torch.relu
        x = self.pool(r(self.stem(x)))
        x = r(x + self.a2(r(self.a1(x))))
        x = r(self.bs(x) + self.b2(r(self.b1(x))))
        return self.fc(torch.flatten(self.gap(x), 1))


class Mobile(torch.nn.Module):
    """MobileNet-style pieces: a depthwise conv, a squeeze-and-excitation gate (global pool, 1x1
    convs, sigmoid, multiply), leaky ReLU, an average pool and a channel concat (QOperator:
    QLinearLeakyRelu, QLinearGlobalAveragePool, QLinearSigmoid, QLinearMul, QLinearAveragePool,
    QLinearConcat)."""

    def __init__(self):
        super().__init__()
        c = torch.nn.Conv2d
        self.stem, self.dw = c(3, 8, 3, padding=1), c(8, 8, 3, padding=1, groups=8)
        self.se1, self.se2, self.head = c(8, 4, 1), c(4, 8, 1), c(16, 6, 1)
        self.gap, self.avg = torch.nn.AdaptiveAvgPool2d(1), torch.nn.AvgPool2d(2)

    def forward(self, x):
        x = torch.nn.functional.leaky_relu(self.stem(x), 0.1)
        d = self.dw(x)
        d = d * torch.sigmoid(self.se2(torch.relu(self.se1(self.gap(d)))))
        return self.head(self.avg(torch.cat([x, d], 1)))


LOCAL = {"mlp": (MLP, (8, 32)), "bert": (TinyBert, (2, 8, 32)), "cnn": (_cnn, (2, 3, 12, 12)),
         "rescnn": (ResCNN, (2, 3, 16, 16)), "mobile": (Mobile, (2, 3, 12, 12))}


def _inputs(name, seed):
    if name in ZOO:
        import zoo_models

        return zoo_models.inputs(name, seed)
    if name in LOCAL:
        return {"x": np.random.default_rng(seed).standard_normal(LOCAL[name][1]).astype(np.float32)}
    return me.inputs(name.removesuffix("-ort"), seed)


def ort_optimized(f32, tag: str, heads: int = 4, hidden: int = 64):
    """The GPT-2 export `f32` as onnxruntime's transformer optimizer writes it (optimize_model,
    model_type="gpt2", its default options), cached as tests/model_exports.py caches exports.
    Its fusions: SkipLayerNormalization (the residual add and the next LayerNormalization),
    FastGelu (bias and GELU), Gemm to MatMul + Add; it writes no Attention for transformers'
    GPT-2 of today (tests/test_quantized_gpt2.py). Every float initializer of one value along
    its one axis (transformers starts norms at 1 and biases at 0) is redrawn at random for each
    node that reads it, so that an operand taken in the wrong place shows."""
    from onnxruntime.transformers.optimizer import optimize_model

    def write(path):
        model = optimize_model(str(f32), model_type="gpt2", num_heads=heads, hidden_size=hidden).model
        rng, inits = np.random.default_rng(0), {i.name: i for i in model.graph.initializer}
        for node in model.graph.node:
            for k, name in enumerate(node.input):
                t = inits.get(name)
                a = onnx.numpy_helper.to_array(t) if t is not None and t.data_type == F32T and len(t.dims) == 1 else None
                if a is not None and a.size > 1 and np.all(a == a[0]):
                    node.input[k] = f"{name}.{node.name}"
                    model.graph.initializer.append(onnx.numpy_helper.from_array(
                        (a + rng.uniform(-0.5, 0.5, a.shape)).astype(np.float32), node.input[k]))
        onnx.save(model, str(path))
    return me.cached(f"{tag}-ort{ort.__version__}-optimized", write)


def _f32_export(name):
    if name == "gpt2-ort":
        return ort_optimized(me.export("gpt2", "torchscript"), "gpt2-torchscript")
    if name in ZOO:
        import zoo_models

        return zoo_models.export(name, "torchscript")
    if name not in LOCAL:
        return me.export(name, "torchscript")

    def write(path):
        torch.manual_seed(0)
        make, shape = LOCAL[name]
        torch.onnx.export(make().eval(), (torch.randn(*shape),), str(path), input_names=["x"], output_names=["y"],
                          opset_version=17, dynamo=False)
    return me.cached(f"quant-{name}-torchscript", write)


# onnxruntime's u8 x s8 integer GEMM (MLAS) sums in int32 on a CPU with VNNI or AMX (vpdpbusd,
# tdpbusd); without them (AVX2, or AVX-512 without VNNI) it multiplies with vpmaddubsw, which
# saturates the int16 sum of two u8 x s8 products, so there its integers are wrong wherever two
# full 8-bit weights meet large activations. For such CPUs onnxruntime advises 7-bit weights
# (reduce_range=True): 2 x 255 x 64 < 2^15 cannot saturate. So on them the tests that compare
# integers with onnxruntime's quantize with reduce_range and draw their own s8 weights in
# [-64, 64], where its integers are exact; eqfuse's integer GEMM is exact with full 8-bit weights
# on every path, against numpy (test_the_integer_gemm_is_exact_on_every_path). The same where the
# machine pinned for the planner has no VNNI (EQFUSE_TEST_MACHINE=avx2 on a VNNI host), as a user
# there would quantize: bound 7-bit weights then take the avx2_maddubs path the tests expect,
# where full 8-bit ones take the exact fallback (qgemm.CORRECTED_PAIRS_MAX).
ORT_EXACT_S8 = bool({"avx512_vnni", "avx_vnni", "amx_int8"} & cpu_flags()) and \
    qgemm.int8_path(machine()) in ("avx512_vnni", "avx_vnni")


def _s8_weights(rng, shape):
    """Random s8 weights onnxruntime's integer GEMM computes exactly on this CPU (ORT_EXACT_S8)."""
    return (rng.integers(-128, 128, shape) if ORT_EXACT_S8 else rng.integers(-64, 65, shape)).astype(np.int8)


# the scale of _s8_weights' weights: of 7 bits, twice the scale (the same real weights, the same
# spread of requantized outputs)
S8_WEIGHT_SCALE = 1 if ORT_EXACT_S8 else 2


class _Reader(quant.CalibrationDataReader):
    """A few random inputs of the model's shapes (the calibration of quantize_static)."""

    def __init__(self, name):
        self.batches = iter([_inputs(name, 100 + k) for k in range(4)])

    def get_next(self):
        return next(self.batches, None)


def _quantize(name, how, f32, q):
    # (a copy beside q: the quantizer writes its shape inference's "<model>-inferred.onnx" beside the
    # model it reads and deletes it after, so two workers quantizing one cached export collided)
    f32 = Path(shutil.copy(f32, Path(q).parent / f"f32-{Path(f32).name}"))
    if how == "dynamic":
        ops = ["MatMul"] if name in ("mlp", "bert") else None  # None: every op quantize_dynamic knows (Conv too)
        # (DefaultTensorType: the type of the tensors onnx's shape inference leaves untyped after
        # a contrib op, as onnxruntime's own error for them advises)
        quant.quantize_dynamic(str(f32), str(q), weight_type=quant.QuantType.QInt8, op_types_to_quantize=ops,
                               reduce_range=not ORT_EXACT_S8, extra_options={"DefaultTensorType": F32T})
    else:
        fmt = quant.QuantFormat.QDQ if how == "static" else quant.QuantFormat.QOperator
        quant.quantize_static(str(f32), str(q), _Reader(name), quant_format=fmt, per_channel=how == "qoperator",
                              activation_type=quant.QuantType.QUInt8, weight_type=quant.QuantType.QInt8,
                              reduce_range=not ORT_EXACT_S8)


# One cheap case per format in the default tier; the model matrix runs in the extended tier
# (-m extended, a step of .ci/run): exporting, calibrating and compiling those would take the
# whole suite past its budget.
CHEAP = [("mlp", "dynamic"), ("mlp", "static"), ("cnn", "qoperator")]
MATRIX = [("bert", "dynamic"), ("bert", "static"), ("cnn", "dynamic"), ("gpt2", "dynamic"), ("gpt2", "static"),
          ("gpt2-ort", "dynamic"),  # (GPT-2 through onnxruntime's transformer optimizer first: ort_optimized)
          ("vit", "dynamic"), ("vit", "static"), ("resnet18", "dynamic"), ("resnet18", "static"),
          ("rescnn", "qoperator"), ("mlp", "qoperator"), ("mobile", "qoperator"), ("bert", "qoperator"), ("resnet18", "qoperator"),
          ("vit", "qoperator"),
          # transformers' convnets with explicit pads (TensorFlow's SAME): a quantized Pad's value is
          # its zero point dequantized (tests/zoo_models.py's families)
          ("mobilenet-v2", "static"), ("mobilenet-v2", "qoperator"), ("efficientnet", "static"),
          ("mobilevit", "static"),  # (its patch counts computed in floats, quantized: a shape of Q and DQ)
          ("mobilevit", "qoperator"),  # (the same through com.microsoft's QLinearMul: folded at import)
          ("convbert", "qoperator"),  # (a QLinearSoftmax over axis 1 of three)
          ("falcon", "qoperator")]  # (multi-query attention: a QLinearMatMul whose batch dims broadcast)
ZOO = {"mobilenet-v2", "efficientnet", "mobilevit", "convbert", "falcon"}
# the com.microsoft ops each QOperator model must hold (the contrib ops its quantization writes)
QOPERATOR_OPS = {"cnn": {"QLinearConv"}, "rescnn": {"QLinearConv", "QLinearAdd", "QLinearGlobalAveragePool", "QGemm"},
                 "mlp": {"QGemm"}, "resnet18": {"QLinearConv", "QLinearAdd", "QLinearGlobalAveragePool", "QGemm"},
                 "mobile": {"QLinearLeakyRelu", "QLinearGlobalAveragePool", "QLinearSigmoid", "QLinearMul",
                            "QLinearAveragePool", "QLinearConcat"},
                 "bert": {"QLinearMatMul", "QLinearAdd", "QLinearSoftmax"}, "vit": {"QLinearMatMul", "QLinearAdd"},
                 "convbert": {"QLinearMatMul", "QLinearSoftmax", "QLinearConcat"}, "falcon": {"QLinearMatMul"}}


@pytest.fixture(scope="module", params=CHEAP + [pytest.param(c, marks=pytest.mark.extended) for c in MATRIX],
                ids=lambda p: "-".join(p))
def quantized(request, tmp_path_factory):
    name, how = request.param
    q = tmp_path_factory.mktemp(f"{name}_{how}") / "q.onnx"
    _quantize(name, how, _f32_export(name), q)
    return name, how, onnx.load(str(q)), q, eqfuse.compile(str(q))


def _session(model, level=None):
    so = ort.SessionOptions()
    if level is not None:
        so.graph_optimization_level = level
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _ort(model, feeds):
    return _session(model).run(None, feeds)


def _literal(model, feeds):
    return _session(model, ort.GraphOptimizationLevel.ORT_DISABLE_ALL).run(None, feeds)


def _exposed(model, names):
    """The model with the tensors `names` added as graph outputs."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.value_info[:]
    have = {o.name for o in m.graph.output} | {i.name for i in m.graph.input}
    m.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)
    return m


def _nodes_model(model, nodes, values):
    """One model of `nodes` side by side, each reading its run-time inputs from graph inputs of its
    own (n<k>_in<i>, shaped and typed as values[name]) and writing graph outputs of its own; the
    initializers (weights, scales, zero points) are the quantized file's. Returns the model and
    its feeds."""
    inits = {i.name: i for i in model.graph.initializer}
    used, inputs, feeds, outputs, out_nodes = set(), [], {}, [], []
    for k, node in enumerate(nodes):
        n = onnx.NodeProto()
        n.CopyFrom(node)
        for i, name in enumerate(node.input):
            if not name or name in inits:
                used.add(name)
                continue
            v = np.asarray(values[name])
            n.input[i] = f"n{k}_in{i}"
            feeds[n.input[i]] = v
            inputs.append(onnx.helper.make_tensor_value_info(n.input[i], onnx.helper.np_dtype_to_tensor_dtype(v.dtype),
                                                             v.shape))
        for j, name in enumerate(node.output):
            if name:
                n.output[j] = f"n{k}_out{j}"
                outputs.append(onnx.ValueInfoProto(name=n.output[j]))
        out_nodes.append(n)
    g = onnx.helper.make_graph(out_nodes, "nodes", inputs, outputs, [inits[u] for u in sorted(used) if u])
    return onnx.helper.make_model(g, opset_imports=list(model.opset_import), ir_version=model.ir_version), feeds


def _output(got):
    return got[0] if isinstance(got, (list, tuple)) else got


def _one_step_origins(model, exposed, tracer, feeds) -> bool:
    """Every tensor of `model` (exposed as outputs, compiled into `tracer`) against onnxruntime's
    literal run: an integer tensor may differ only where its node is an op of ONE_STEP, by one
    step, or where one of its node's inputs already differs (a float tensor differs by f32
    rounding, an integer one by such a step, upstream). True when every integer tensor agrees."""
    outs = [o.name for o in exposed.graph.output]
    want = dict(zip(outs, _literal(exposed, feeds)))
    got = dict(zip(outs, (np.asarray(g) for g in tracer(**feeds))))
    differs = {n for n in outs if not np.array_equal(want[n], got[n])}
    ints = set()
    for node in model.graph.node:
        for o in node.output:
            if o in differs and want[o].dtype != np.float32:
                ints.add(o)
                d = int(np.max(np.abs(got[o].astype(np.int32) - want[o].astype(np.int32))))
                upstream = any(i in differs for i in node.input)
                assert upstream or (node.op_type in ONE_STEP and d <= 1), \
                    f"{node.op_type} {node.name}: its integers differ by {d} with its inputs equal"
    return not ints


def test_quantized_model_matches_onnxruntime(quantized, tmp_path):
    name, how, model, path, module = quantized
    ops = {n.op_type for n in model.graph.node}
    want_ops = {"dynamic": {"DynamicQuantizeLinear", "MatMulInteger"} if name not in ("cnn",) else
                {"DynamicQuantizeLinear", "ConvInteger"}, "static": {"QuantizeLinear", "DequantizeLinear"},
                "qoperator": {"QuantizeLinear", "DequantizeLinear"} | QOPERATOR_OPS.get(name, set())}[how]
    assert want_ops <= ops, ops
    integer = ("MatMulInteger", "ConvInteger", "QLinearConv", "QLinearMatMul", "QGemm")
    if ops & set(integer):  # each integer matmul and conv one integer GEMM, on this machine's instruction path
        # (weights packed once take avx2_maddubs on a CPU without VNNI)
        prepacked = {k.name: bool(k.decisions.get("prepacked_b")) for k in module.kernels}
        int8 = [(v["path"], prepacked[k]) for k, v in module.report["precision"].items() if v["precision"] == "int8"]
        assert len(int8) == sum(n.op_type in integer for n in model.graph.node)
        # (on a machine with AMX-INT8 the larger matmuls take the tiles: qgemm.amx_fits)
        assert all(path in (qgemm.int8_path(machine(), packed), qgemm.int8_path(machine(), packed, amx=True))
                   for path, packed in int8), int8
    if how == "dynamic":  # each integer GEMM and conv quantizes its A itself: no u8 tensor, no kernel
        quantizing = [k.name for k in module.kernels if k.decisions.get("quantize_a")]
        assert len(quantizing) == sum(n.op_type in ("MatMulInteger", "ConvInteger") for n in model.graph.node), quantizing
        assert not any(k.kind == "pointwise" and "eqf_quantize(" in k.c_source for k in module.kernels)
        # and computes the scale and zero point from the two floats of its A's range: the only
        # other kernel of each DynamicQuantizeLinear is that range's pass over x, and no kernel
        # is a scalar's (the scale, the zero point, x_scale * w_scale)
        ranges = [k for k in module.kernels if k.kind == "index" and k.decisions.get("op") == "dynamic_range"]
        assert len(ranges) == sum(n.op_type == "DynamicQuantizeLinear" for n in model.graph.node), ranges
        assert {k.name for k in module.kernels if "dynamic_scale(" in k.body} == set(quantizing), module.kernels
        scalars = [k.body for k in module.kernels if 0 < k.bytes <= 16]  # (two floats in, one out: 12 bytes; a view: 0)
        assert not scalars, scalars
    made = {o: n for n in model.graph.node for o in n.output}
    if any(n.op_type == "IsNaN" and made[n.input[0]].op_type == "DequantizeLinear" for n in model.graph.node):
        # torch's where(isnan(p), 0, p) after a QDQ pair (rule where_isnan_dequantized): no kernel
        assert not any("isnan(" in k.body for k in module.kernels), [k.body for k in module.kernels if "isnan(" in k.body]
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    (last,) = [n for n in model.graph.node if model.graph.output[0].name in n.output]
    tracer = None
    if ops & ONE_STEP:  # every tensor an output, to find where a difference starts
        # (a Constant's output is the same in both, and ConvBERT's empty shape constant is no output
        # eqfuse gives: a zero-size tensor)
        exposed = _exposed(model, [o for n in model.graph.node if n.op_type != "Constant" for o in n.output if o])
        onnx.save(exposed, str(tmp_path / "exposed.onnx"))
        tracer = eqfuse.compile(str(tmp_path / "exposed.onnx"))
    for seed in range(3):
        feeds = _inputs(name, seed)
        literal, deployed = _output(_literal(model, feeds)), _output(_ort(model, feeds))
        got = _output(module(**feeds))
        assert got.shape == literal.shape
        if last.op_type != "DequantizeLinear":  # float ops after the integers: their f32 rounding
            step = 1e-5 * float(np.max(np.abs(literal)))
        else:
            step = float(np.max(inits[last.input[1]]))
        if tracer is not None and not _one_step_origins(model, exposed, tracer, feeds):
            continue  # (a one-step difference at a QLinearAdd, ... has moved the values after it)
        diff = float(np.max(np.abs(got - literal)))
        assert diff <= step, f"{name} {how} seed {seed}: max|diff| {diff} > one step {step} (literal run)"
        own = float(np.max(np.abs(deployed - literal)))
        diff = float(np.max(np.abs(got - deployed)))
        assert diff <= step + own, f"{name} {how} seed {seed}: max|diff| {diff} > {step} + {own} (deployed run)"


INTEGER_NODES = ("QuantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv",
                 "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearAveragePool",
                 "QLinearGlobalAveragePool", "QLinearConcat", "QLinearSoftmax", "QGemm")


@pytest.mark.heavy  # (the fast tier's time)
def test_every_integer_node_matches_onnxruntime_integer_for_integer(quantized, tmp_path):
    """Node by node: each node with integer outputs fed onnxruntime's own inputs (exposed as
    outputs of the quantized model, run literally), its outputs (integers, and the dynamic scale
    and zero point) equal in eqfuse's reference, in eqfuse's compiled C and in onnxruntime. Fed the
    same inputs, not eqfuse's: the float ops before a node (layernorm, softmax) round differently
    by an ulp, which may move a value across a rounding boundary. The nodes run side by side in
    one model (_nodes_model), compiled once."""
    name, how, model, path, _ = quantized
    nodes = [n for n in model.graph.node if n.op_type in INTEGER_NODES]
    assert nodes
    inits = {i.name for i in model.graph.initializer}
    runtime = sorted({i for n in nodes for i in n.input if i and i not in inits})
    exposed = _exposed(model, runtime)
    f = tmp_path / "nodes.onnx"
    compiled = ref = None
    for seed in range(2):
        feeds = _inputs(name, seed)
        values = {**feeds, **dict(zip([o.name for o in exposed.graph.output], _literal(exposed, feeds)))}
        one, node_feeds = _nodes_model(model, nodes, values)
        want = _literal(one, node_feeds)
        if compiled is None:
            onnx.save(one, str(f))
            compiled, ref = eqfuse.compile(str(f)), eqfuse.reference(str(f))
        got_c = compiled(**node_feeds)
        got_ref = ref(**node_feeds, **onnx_params(str(f)))
        outs = [o.name for o in one.graph.output]
        for got in (got_ref, got_c):
            got = got if isinstance(got, (list, tuple)) else [got]
            assert len(got) == len(want)
            for out, w, g in zip(outs, want, got):
                node = nodes[int(out[1:out.index("_")])]
                g = np.asarray(g)
                assert g.dtype == w.dtype and g.shape == w.shape, (node.name, g.dtype, w.dtype, g.shape, w.shape)
                if node.op_type in ONE_STEP:  # (onnxruntime's own f32 steps: one step of the output apart at most)
                    d = np.abs(g.astype(np.int32) - w.astype(np.int32))
                    assert d.max() <= 1, f"{node.op_type} {node.name}: max {d.max()}, {int(np.sum(d > 0))} of {w.size} differ"
                    continue
                assert np.array_equal(g, w), f"{node.op_type} {node.name}: {int(np.sum(g != w))} of {w.size} differ"


@pytest.mark.parametrize("zp_dtype, axis", [(np.uint8, None), (np.int8, None), (np.int8, 1), (np.uint8, 0)])
def test_quantize_and_dequantize_ties_saturation_and_channels_match_onnxruntime(zp_dtype, axis, tmp_path):
    """Halfway values (x / scale = k + 0.5 exactly: scale 0.5, x a multiple of 0.25) round to even,
    values past the type's range saturate, per tensor and per channel (axis=), exactly as onnxruntime."""
    x = np.array([[0.25, 0.75, 1.25, -0.25, -0.75, 300.0], [-300.0, 2.0, 63.25, -64.25, 0.0, 1e30]], np.float32)
    C = x.shape[axis] if axis is not None else 1
    scale = np.full(C, 0.5, np.float32) if axis is not None else np.asarray(0.5, np.float32)
    zp = (np.arange(C) * 3).astype(zp_dtype) if axis is not None else np.asarray(3, zp_dtype)
    attrs = {"axis": axis} if axis is not None else {}
    nodes = [onnx.helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q", **attrs),
             onnx.helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="d", **attrs)]
    inits = [onnx.numpy_helper.from_array(scale, "s"), onnx.numpy_helper.from_array(zp, "z")]
    g = onnx.helper.make_graph(nodes, "qd", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                               [onnx.ValueInfoProto(name="q"), onnx.ValueInfoProto(name="d")], inits)
    model = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)])
    f = tmp_path / "qd.onnx"
    onnx.save(model, str(f))
    want = _ort(model, {"x": x})
    got = eqfuse.compile(str(f))(x)
    for w, g_ in zip(want, got):
        assert g_.dtype == w.dtype and np.array_equal(g_, w), (w, g_)
    assert set(np.unique(want[0])) & {np.iinfo(zp_dtype).min, np.iinfo(zp_dtype).max}  # the saturation was reached


def test_an_unsupported_zero_point_type_is_refused_naming_the_node(tmp_path):
    node = onnx.helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quant_16")
    inits = [onnx.numpy_helper.from_array(np.asarray(0.5, np.float32), "s"), onnx.numpy_helper.from_array(np.asarray(0, np.int16), "z")]
    g = onnx.helper.make_graph([node], "q16", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
                               [onnx.ValueInfoProto(name="q")], inits)
    f = tmp_path / "q16.onnx"
    onnx.save(onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 21)]), str(f))
    with pytest.raises(eqfuse.EqfuseError) as info:
        eqfuse.compile(str(f))
    msg = str(info.value)
    assert "zero point type int16" in msg and "'quant_16'" in msg and "QuantizeLinear" in msg, msg


def test_the_opt_output_of_a_quantized_model_parses_back(quantized, capsys, tmp_path):
    """`eqfuse opt` prints the quantized model with its u8 / i8 tensors and quantize ops; that text
    is a .g program the parser reads back."""
    from eqfuse.cli.main import main

    name, how, model, path, _ = quantized
    assert main(["opt", str(path)]) == 0
    text = capsys.readouterr().out
    # (a dynamic model's only u8 tensors may be computed ones: its zero points, dynamic_zero_point's)
    assert ("u8" in text or "dynamic_zero_point(" in text) and "i8" in text and "quantize_linear(" in text
    if how == "static" and name in ("gpt2", "vit"):  # the quantizer's redundant DQ -> Q pairs are removed
        assert "dequantize_quantize x" in text
    if (name, how) == ("mlp", "dynamic"):  # the quantization of A, its scale and zero point from the range's
        # two floats, the dequantization (x_scale * w_scale), bias and activation in the integer GEMM's kernel
        assert re.search(r"kernel \{\s*(t\d+) = dynamic_scale\((\w+)\)\s*(t\d+) = dynamic_zero_point\(\2\)\s*"
                         r"relu\(cast\(matmul_integer\(quantize_linear\(\w+, \1, \3\), \w+, \3, \w+\), "
                         r"to=\"f32\"\) \* \(\1 \* [-\d.e]+\) \+ \w+\)\s*\}", text), text
    if how == "dynamic":  # each DynamicQuantizeLinear: its range one op, its scale and zero point one op
        # each in every integer GEMM that quantizes by them (computed from the range there)
        dql = sum(n.op_type == "DynamicQuantizeLinear" for n in model.graph.node)
        gemms = sum(n.op_type in ("MatMulInteger", "ConvInteger") for n in model.graph.node)
        assert text.count("dynamic_range(") == dql, text
        assert text.count("dynamic_scale(") == text.count("dynamic_zero_point(") == gemms, text
    g = tmp_path / "q.g"
    g.write_text(text)
    assert list(eqfuse.reference(str(g)).graphs)


SCALES_G = """graph scales(x: f32[8, 16], a: u8[8, 16], w: i8[16, 16], az: u8, wz: i8, s: f32) -> f32[8, 16] {
    return cast(matmul_integer(a, w, az, wz), to="f32") * (s * 0.5) + x
}
"""


def _opt(tmp_path, capsys, src: str, name: str) -> tuple[str, str]:
    """`eqfuse opt` of the .g text src: (its whole output, the graph before the report)."""
    from eqfuse.cli.main import main

    g = tmp_path / name
    g.write_text(src)
    assert main(["opt", str(g)]) == 0
    text = capsys.readouterr().out
    return text, text[:text.index("# report")]


def test_a_product_of_scalars_starts_no_kernel(tmp_path, capsys):
    """Must not rewrite: quantize_dynamic's x_scale * w_scale (two scalars) is a kernel of its own
    that the integer GEMM's epilogue reads, not also a body every reader may take in (each residual
    add of a dynamically quantized transformer would double the candidate kernels)."""
    _, body = _opt(tmp_path, capsys, SCALES_G, "scales.g")
    assert re.search(r"(\w+) = kernel \{ s \* 0\.5 \}", body), body
    assert re.search(r"kernel \{ cast\(matmul_integer\(a, w, az, wz\), to=\"f32\"\) \* \w+ \+ x \}", body), body


def _pairs_model():
    """x -> Q -> DQ -> Q -> DQ -> relu -> Q -> DQ -> Q -> DQ: the first DQ -> Q pair has one scale
    and zero point (a second initializer of the same value: equal zero points are one parameter),
    the last pair requantizes to another scale."""
    h = onnx.helper
    chain = [("q1", "x", "s", "z"), ("d1", "q1", "s", "z"), ("q2", "d1", "s", "z2"), ("d2", "q2", "s", "z2")]
    nodes = [h.make_node("QuantizeLinear" if n[0] == "q" else "DequantizeLinear", list(a), [n], name=n)
             for n, *a in chain]
    nodes += [h.make_node("Relu", ["d2"], ["r"], name="relu")]
    chain = [("q3", "r", "t", "z"), ("d3", "q3", "t", "z"), ("q4", "d3", "s", "z"), ("y", "q4", "s", "z")]
    nodes += [h.make_node("QuantizeLinear" if n[0] == "q" else "DequantizeLinear", list(a), [n], name=n)
              for n, *a in chain]
    inits = [onnx.numpy_helper.from_array(np.asarray(v, dt), n)
             for n, v, dt in (("s", 0.05, np.float32), ("t", 0.07, np.float32), ("z", 100, np.uint8), ("z2", 100, np.uint8))]
    g = h.make_graph(nodes, "pairs", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 8])],
                     [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 8])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_a_dequantize_quantize_pair_of_one_scale_and_zero_point_is_removed(tmp_path, capsys):
    """The rule dequantize_quantize (rules/quant.rw) removes the pair with equal scale and zero
    point, not the one that requantizes to another scale; the result is onnxruntime's, exactly."""
    from eqfuse.cli.main import main

    model = _pairs_model()
    f = tmp_path / "pairs.onnx"
    onnx.save(model, str(f))
    assert main(["opt", str(f)]) == 0
    text = capsys.readouterr().out
    assert "dequantize_quantize x1" in text
    assert text.count("quantize_linear(") - text.count("dequantize_linear(") == 3  # of 4
    # the pair that requantizes to another scale stays: its dequantize's result quantized by s
    (d,) = re.findall(r"(\w+) = kernel \{ dequantize_linear\(\w+, 0\.07, \w+\) \}", text)
    assert f" quantize_linear({d}, 0.05, " in text, text
    x = np.random.default_rng(0).uniform(-8, 8, (4, 8)).astype(np.float32)
    want, got = _literal(model, {"x": x})[0], eqfuse.compile(str(f))(x)
    assert np.array_equal(got, want)


def _maxpool_model(dt, shape=(2, 3, 9, 10)):
    """quantize_static's MaxPool in both forms on a dt input q: QDQ (DequantizeLinear -> MaxPool ->
    QuantizeLinear, one scale and zero point) and QOperator (MaxPool on q itself), ResNet's 3 x 3
    stride-2 pool with padding 1 (a padded tap in every edge window), and a 2 x 2 one."""
    n, c, hh, ww = shape
    h = onnx.helper
    nodes = [h.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             h.make_node("MaxPool", ["d"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             h.make_node("QuantizeLinear", ["p", "s", "z"], ["y"]),
             h.make_node("MaxPool", ["q"], ["y2"], kernel_shape=[2, 2], strides=[2, 2])]
    t = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    inits = [onnx.numpy_helper.from_array(np.asarray(0.05, np.float32), "s"), onnx.numpy_helper.from_array(np.asarray(7, dt), "z")]
    g = h.make_graph(nodes, "pool", [h.make_tensor_value_info("q", t, [n, c, hh, ww])],
                     [h.make_tensor_value_info("y", t, [n, c, (hh + 1) // 2, (ww + 1) // 2]),
                      h.make_tensor_value_info("y2", t, [n, c, hh // 2, ww // 2])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("shape", [(2, 3, 9, 10), (1, 2, 11, 112)], ids=["small", "rows-of-56"])
def test_a_quantized_max_pool_runs_on_its_integers_and_matches_onnxruntime(dt, shape, tmp_path):
    """The rule maxpool_dequantized (rules/quant.rw) takes the QDQ pool's dequantize and quantize
    away: both pools are one index kernel each on the integers, exactly onnxruntime's (output
    rows of 5 pixels, and of 56: a block of 32 and one of 24)."""
    f, model = tmp_path / "pool.onnx", _maxpool_model(dt, shape)
    onnx.save(model, str(f))
    mod = eqfuse.compile(str(f))
    assert [k.kind for k in mod.kernels] == ["index", "index"], [k.kind for k in mod.kernels]
    info = np.iinfo(dt)
    q = np.random.default_rng(3).integers(info.min, info.max + 1, shape).astype(dt)
    q[0, 0] = info.min  # (a plane of the least value: the padding must not be taken for it)
    want, got = _literal(model, {"q": q}), mod(q)  # (onnxruntime's pool of the dequantized f32, literally)
    for g, w in zip(got, want):
        assert g.dtype == dt and np.array_equal(g, w)


def _conv_node_model(op, x_type, x_shape, zp, pads=(1, 1, 1, 1), yz=np.uint8(0)):
    """One QLinearConv or ConvInteger node over an x_type input (x's zero point zp, y's yz), its
    weights an i8 constant."""
    h = onnx.helper
    rank = len(x_shape)
    w = np.random.default_rng(1).integers(-128, 128, (2, x_shape[1]) + (3,) * (rank - 2)).astype(np.int8)
    inits = [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(np.asarray(zp), "xz")]
    if op == "QLinearConv":
        inits += [onnx.numpy_helper.from_array(np.asarray(v, dt), n) for n, v, dt in
                  (("s", 0.1, np.float32), ("wz", 0, np.int8))]
        inits.append(onnx.numpy_helper.from_array(np.asarray(yz), "yz"))
        ins = ["x", "s", "xz", "w", "s", "wz", "s", "yz"]
    else:
        ins = ["x", "w", "xz"]
    node = h.make_node(op, ins, ["y"], name="qconv", pads=list(pads), strides=[2] * (rank - 2))
    g = h.make_graph([node], "q", [h.make_tensor_value_info("x", x_type, x_shape)], [onnx.ValueInfoProto(name="y")], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


U8 = onnx.TensorProto.UINT8


@pytest.mark.parametrize("op, x_shape, zp, pads, yz, message", [
    ("QLinearConv", [1, 2, 5, 5], np.uint8(0), (1, 1, 1, 1), np.int16(0), "zero point type int16 (input 7"),
    ("ConvInteger", [1, 2, 5, 5], np.int8(0), (1, 1, 1, 1), None, "zero point type int8 (input 2"),
    ("ConvInteger", [1, 2, 5, 5, 5], np.uint8(0), (1, 1, 1, 1, 1, 1), None, "3-D convolution"),
], ids=["y-zero-point-int16", "x-zero-point-of-another-type", "conv3d"])
def test_an_unsupported_integer_conv_is_refused_naming_the_node(op, x_shape, zp, pads, yz, message, tmp_path, capsys):
    from eqfuse.cli.main import main

    f = tmp_path / "bad.onnx"
    onnx.save(_conv_node_model(op, U8, x_shape, zp, pads, yz), str(f))
    assert main(["opt", str(f)]) == 2
    err = capsys.readouterr().err
    assert message in err and f"of ONNX op '{op}' in node 'qconv'" in err and "Traceback" not in err, err


@pytest.mark.parametrize("op, pads, shape", [
    ("QLinearConv", (0, 1, 1, 0), (1, 2, 7, 6)), ("QLinearConv", (1, 0, 2, 1), (1, 2, 7, 6)),
    ("ConvInteger", (2, 1, 0, 2), (1, 2, 7, 6)),
    # 1-D (Wav2Vec2's and Whisper's convs as quantize_dynamic and quantize_static write them)
    ("ConvInteger", (1, 2), (2, 2, 9)), ("QLinearConv", (2, 0), (2, 2, 9))])
def test_integer_convs_with_asymmetric_pads_match_onnxruntime(op, pads, shape, tmp_path):
    """Padding reads x's zero point (onnxruntime's ConvInteger and QLinearConv pad with it), also
    where the pads differ at the two ends and the stride (2) does not divide the difference."""
    model = _conv_node_model(op, U8, list(shape), np.uint8(3), pads, np.uint8(7))
    f = tmp_path / "conv.onnx"
    onnx.save(model, str(f))
    x = np.random.default_rng(0).integers(0, 256, shape).astype(np.uint8)
    (want,), got = _literal(model, {"x": x}), eqfuse.compile(str(f))(x)
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)



def test_an_integer_conv_with_asymmetric_pads_and_a_run_time_zero_point_matches_onnxruntime(tmp_path):
    """MobileNetV1's stride-2 convs with TensorFlow's SAME padding (one more row and column at the
    end), as the dynamo exporter folds the padding into the Conv and quantize_dynamic writes it:
    the extra row is a block of x's zero point, which DynamicQuantizeLinear computes at run time
    (expanded to the block); the integers are onnxruntime's."""
    h = onnx.helper
    w = np.random.default_rng(1).integers(-128, 128, (3, 2, 3, 3)).astype(np.int8)
    nodes = [h.make_node("DynamicQuantizeLinear", ["xf"], ["x", "xs", "xz"]),
             h.make_node("ConvInteger", ["x", "w", "xz"], ["y"], name="qconv", pads=[0, 0, 1, 1], strides=[2, 2])]
    g = h.make_graph(nodes, "q", [h.make_tensor_value_info("xf", F32T, [2, 2, 8, 8])], [onnx.ValueInfoProto(name="y")],
                     [onnx.numpy_helper.from_array(w, "w")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    f = tmp_path / "conv.onnx"
    onnx.save(model, str(f))
    mod = eqfuse.compile(str(f))
    for seed in range(3):
        xf = (np.random.default_rng(seed).standard_normal((2, 2, 8, 8)) + seed - 1).astype(np.float32)
        (want,), got = _literal(model, {"xf": xf}), mod(xf)
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)

PAIRS_G = """graph pairs(q: u8[4, 8], z: u8, w: i8[4, 8], zw: i8[8]) -> (u8[4, 8], u8[4, 8], u8[4, 8], i8[4, 8]) {
    return quantize_linear(dequantize_linear(q, 0.5, z), 0.5, z), quantize_linear(dequantize_linear(q, 0, z), 0, z),
           quantize_linear(dequantize_linear(q, 3e38, z), 3e38, z), quantize_linear(dequantize_linear(w, 0.5, zw), 0.5, zw)
}
"""


def test_dequantize_quantize_does_not_fire_where_its_guard_is_false(tmp_path, capsys):
    """Must not rewrite: a scale of 0 (NaN, saturated), a scale whose 255 multiple overflows, and a
    per-channel zero point keep their pair; the ordinary scalar pair is removed."""
    text, body = _opt(tmp_path, capsys, PAIRS_G, "pairs.g")
    assert "return q, " in body, body
    for kept in ("quantize_linear(k1, 0, z)", "quantize_linear(k2, 3e+38, z)", "quantize_linear(k3, 0.5, zw)"):
        assert kept in body, body
    assert "dequantize_quantize x1" in text


WHERE_NAN_G = """
graph wn(q: u8[4, 8], z: u8, s: f32) {
    return where(isnan(dequantize_linear(q, 0.5, z)), 0.0, dequantize_linear(q, 0.5, z)),
           where(isnan(dequantize_linear(q, s, z)), 0.0, dequantize_linear(q, s, z))
}
"""


def test_where_isnan_of_a_dequantized_tensor_is_the_tensor_at_a_finite_constant_scale(tmp_path, capsys):
    """where_isnan_dequantized (rules/quant.rw): torch's where(isnan(p), 0, p) after a softmax, a QDQ
    pair between them (quantize_static's BERT), is the dequantized p when the scale is a finite
    constant (no dequantized value is NaN); a scale given at run time (NaN possible) keeps it. Both
    results are numpy's."""
    text, body = _opt(tmp_path, capsys, WHERE_NAN_G, "wn.g")
    assert "where_isnan_dequantized x1" in text, text
    assert body.count("isnan(") == 1 and "dequantize_linear(q, s, z)" in body, body
    q = np.random.default_rng(0).integers(0, 256, (4, 8)).astype(np.uint8)
    got = eqfuse.compile(WHERE_NAN_G)(q, np.asarray(7, np.uint8), np.asarray(np.nan, np.float32))
    np.testing.assert_array_equal(got[0], (q.astype(np.float32) - 7) * np.float32(0.5))
    np.testing.assert_array_equal(got[1], np.zeros((4, 8), np.float32))  # (NaN scale: the where's 0)


GELU_QDQ_G = """
graph gq(q: u8[6, 200], z: u8) -> (u8[6, 200], u8[6, 200]) {
    e = erf(dequantize_linear(q, 0.05, z) / 1.4142135)
    return quantize_linear(e, 0.0078, z), quantize_linear(dequantize_linear(quantize_linear(e, 0.0078, z), 0.0078, z) + 1.0, 0.0079, z)
}
"""


def test_the_requantized_steps_of_a_qdq_gelu_are_one_kernel_each():
    """fuse_quantize_erf and fuse_quantize_add (rules/fusion.rw): quantize_static's GELU, a QDQ pair
    after each step, quantizes its Erf's output and its + 1's in their own kernels (no kernel that
    only quantizes), with numpy's bits."""
    q = np.random.default_rng(3).integers(0, 256, (6, 200)).astype(np.uint8)
    z = np.asarray(128, np.uint8)
    mod = eqfuse.compile(GELU_QDQ_G)
    bodies = [re.sub(r"\s+", " ", k.body) for k in mod.kernels]
    assert not any(re.fullmatch(r"kernel \{ quantize_linear\(\w+, [\w.]+, \w+\) \}", b) for b in bodies), bodies
    assert any("quantize_linear(erf(" in b for b in bodies) and any(") + 1, 0.0079" in b for b in bodies), bodies
    for got, want in zip(mod(q, z), eqfuse.reference(GELU_QDQ_G)(q, z)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


VIEW_PAIRS_G = """
graph vp(q: u8[4, 8], z: u8) {
    return quantize_linear(reshape(dequantize_linear(q, 0.5, z), shape=[8, 4]), 0.5, z),
           quantize_linear(transpose(dequantize_linear(q, 0.5, z), perm=[1, 0]), 0.25, z)
}
"""


def test_a_dequantize_quantize_pair_through_a_view_is_the_view_only_at_one_scale(tmp_path, capsys):
    """dequantize_reshape_quantize makes the pair around a reshape of one scale the reshape of the
    integers; must not rewrite: around the transpose the quantize's scale is another (it rounds)."""
    text, body = _opt(tmp_path, capsys, VIEW_PAIRS_G, "view-pairs.g")
    assert "return reshape(q, shape=[8, 4])," in body and "quantize_linear(t2, 0.25, z)" in body, body
    assert "dequantize_reshape_quantize x1" in text and "dequantize_transpose_quantize" not in text


# ------------------------------------------------------------------ the integer GEMM's instruction paths

# Odd shapes (K not a multiple of 4, M and N not multiples of any tile, N below the narrowest
# tile), each operand type, a zero point per column, a batched B read per call, one B bound by
# params= (packed once, with its column sums), one deep enough for K blocks (partial sums kept
# between them) and large enough to share its panels among threads, an int32 result next to
# a dequantized one, and two whose A is quantize_linear of an f32 x (DynamicQuantizeLinear's y),
# quantized by the GEMM into its A buffer (quantize_a; a u8 and an s8 zero point, the row sums of
# A made in the same pass for the non-zero b_zp), and three integer convs, the same GEMM over the
# im2col of x (strided, padded, dilated, grouped; u8 and s8 x, i8 and u8 w, w's zero point per
# output channel; one with its weights bound and a dequantizing epilogue): all in one module per
# path; and a conv that quantizes its x (QCONV_G, on the fallback path, which runs everywhere).
INTEGER_GEMMS = """
graph ig(a: u8[7, 37], b: i8[37, 53], az: u8, bz: i8, s: i8[13, 5], t: u8[5, 70], sz: i8, tz: u8[70],
         c: u8[2, 33, 130], d: i8[2, 130, 7], cz: u8, dz: i8, e: u8[40, 2203], f: i8[2203, 70],
         w: i8[37, 53], sc: f32[53], bias: f32[53], xa: f32[7, 37], xs: f32[13, 5], qs: f32,
         cx: u8[2, 6, 9, 11], cw: i8[8, 3, 3, 3], cwz: i8[8], cy: i8[1, 5, 7, 8], cv: u8[70, 5, 2, 2],
         cw2: i8[8, 6, 3, 3], csc: f32[8, 1, 1]) {
    return matmul_integer(a, b, az, bz), matmul_integer(s, t, sz, tz), matmul_integer(c, d, cz, dz),
           matmul_integer(e, f, az, bz), relu(cast(matmul_integer(a, w, az, bz), to="f32") * sc + bias),
           matmul_integer(quantize_linear(xa, qs, az), b, az, bz), matmul_integer(quantize_linear(xs, qs, sz), t, sz, tz),
           conv_integer(cx, cw, az, cwz, stride=2, padding=1, group=2), conv_integer(cy, cv, sz, tz, padding=1, dilation=2),
           cast(conv_integer(cx, cw2, az, bz, padding=1), to="f32") * csc
}
"""
# A conv quantizing its f32 x itself: a hand-written kernel block (no rule takes the quantize into
# a conv's kernel), compiled as written (fuse="manual")
QCONV_G = """
graph qc(cf: f32[2, 6, 9, 11], qs: f32, az: u8, cw: i8[8, 3, 3, 3], cwz: i8[8]) {
    return kernel { conv_integer(quantize_linear(cf, qs, az), cw, az, cwz, stride=2, padding=1, group=2) }
}
"""


@pytest.fixture(params=["avx512_vnni", "avx_vnni", "avx2_maddubs", "fallback",
                        pytest.param("fallback_scalar", marks=pytest.mark.extended)])
def int8_path(request):
    """Plans for a machine with that path: AVX512_VNNI, AVX-VNNI (ymm), plain AVX2 (vpmaddubsw for
    bound weights: the test binds 7-bit ones, tests/test_qgemm_maddubs.py 8-bit ones; else the
    vpmaddwd fallback) or below AVX2
    (plain C). The machine model is pinned, so the AVX2 paths and the fallbacks run here too."""
    import dataclasses

    from eqfuse import machine

    m, host = machine.machine(), machine.host_isa()
    lanes = {"avx512_vnni": 16, "avx_vnni": 8, "avx2_maddubs": 8, "fallback": 8, "fallback_scalar": 4}[request.param]
    # an instruction path the host lacks is skipped with its reason; the exact AVX2 fallback runs everywhere
    if request.param in host and not host[request.param]:
        pytest.skip(f"this CPU has no {request.param.upper().replace('_', '-') if request.param == 'avx_vnni' else 'AVX512_VNNI'} "
                    f"(cpuinfo flag {request.param}): the {request.param} path cannot run here")
    if m.simd_floats < lanes:
        pytest.skip(f"this CPU's vectors hold {m.simd_floats} floats: the {request.param} path needs {lanes}")
    model = dataclasses.replace(m, simd_floats=lanes, avx512_vnni=request.param == "avx512_vnni",
                                avx_vnni=request.param == "avx_vnni", amx_int8=False)  # (amx_int8: its own fixture)
    with machine.pinned(model):
        yield request.param


@pytest.fixture(params=["amx_int8"])
def amx_int8_path(request, monkeypatch):
    """Plans for a machine with AMX-INT8 (the matmuls of 16 rows or more take tdpbusd): on its
    tiles where this CPU has them, else on their C emulation (-DEQF_AMX_EMULATE: tests/test_qgemm_amx.py)."""
    import dataclasses

    from eqfuse import machine

    from eqfuse.backend.kinds.contraction import qgemm as q

    monkeypatch.setattr(q, "AMX_INT8_MIN_MACS", 0)  # (the random GEMMs are small: a policy, pinned)
    real = machine.host_isa()["amx_int8"] and machine.host_simd_floats() >= 16
    if not real:
        monkeypatch.setenv("EQFUSE_CFLAGS", "-DEQF_AMX_EMULATE")
    with machine.pinned(dataclasses.replace(machine.machine(), simd_floats=16, avx512_vnni=True, amx_int8=True), clamp=real):
        yield request.param


@pytest.mark.heavy  # (a few seconds: the whole suite runs it, the fast tier not)
def test_the_integer_gemm_is_exact_on_every_path(int8_path):
    rng = np.random.default_rng(3)
    u8 = lambda *s: rng.integers(0, 256, s).astype(np.uint8)  # noqa: E731
    i8 = lambda *s: rng.integers(-128, 128, s).astype(np.int8)  # noqa: E731
    # avx2_maddubs: the bound weights (w = b, cw2) of 7 bits, their first column (output channel) at
    # 64, A's first row at 255; the other GEMMs read B at run time and take the fallback
    seven = int8_path == "avx2_maddubs"
    w7 = lambda *s: rng.integers(-64, 65, s).astype(np.int8)  # noqa: E731
    x = {"a": u8(7, 37), "b": w7(37, 53) if seven else i8(37, 53), "az": np.asarray(131, np.uint8), "bz": np.asarray(-3, np.int8),
         "s": i8(13, 5), "t": u8(5, 70), "sz": np.asarray(-77, np.int8), "tz": u8(70),
         "c": u8(2, 33, 130), "d": i8(2, 130, 7), "cz": np.asarray(0, np.uint8), "dz": np.asarray(0, np.int8),
         "e": u8(40, 2203), "f": i8(2203, 70),
         "sc": rng.uniform(1e-4, 1e-3, 53).astype(np.float32), "bias": rng.standard_normal(53).astype(np.float32)}
    x["w"] = x["b"].copy()
    # f32 activations whose quantization saturates at both ends, ties included (k + 0.5 steps)
    x["qs"] = np.asarray(0.25, np.float32)
    x["xa"] = np.concatenate([rng.uniform(-40, 40, (7, 30)), (rng.integers(-80, 80, (7, 7)) + 0.5) * 0.25], 1).astype(np.float32)
    x["xs"] = rng.uniform(-60, 60, (13, 5)).astype(np.float32)
    x.update(cx=u8(2, 6, 9, 11), cw=i8(8, 3, 3, 3), cwz=i8(8), cy=i8(1, 5, 7, 8), cv=u8(70, 5, 2, 2),
             cw2=w7(8, 6, 3, 3) if seven else i8(8, 6, 3, 3), csc=rng.uniform(1e-4, 1e-3, (8, 1, 1)).astype(np.float32))
    if seven:
        x["a"][0], x["b"][:, 0], x["w"][:, 0], x["cw2"][0], x["cx"][0] = 255, 64, 64, 64, 255
    mod = eqfuse.compile(INTEGER_GEMMS, params={"w": x["w"], "cw2": x["cw2"]})
    plans = [p for p in mod.default.last.plans if p.kind == "contraction"]
    paths = {True: int8_path, False: "fallback" if seven else int8_path}  # (by whether B is packed once)
    assert len(plans) == 10 and [(p.precision, p.precision_path) for p in plans] == \
        [("int8", paths[p.prepack is not None]) for p in plans]
    assert sum(p.detail.quantize_a for p in plans) == 2 and sum(p.detail.im2col for p in plans) == 3
    assert len(mod.kernels) == 10  # (no quantize kernel; each conv's epilogue in its kernel)
    assert sum(p.prepack is not None for p in plans) == 2 and sum(p.detail.parallel for p in plans) == 1
    assert sum(p.tiles["kc"] < p.detail.K for p in plans) == 1
    # (the plan's cache check states int8_kc's own budget: every B block within it)
    assert all(re.match(r"B panel block kc x nr = \d+ B <= L1 x 1 \d+ B: ok ", p.cache_check) for p in plans), \
        [p.cache_check for p in plans]
    # (and the threads' line says how the kernel shares its work: whole images only when by_image)
    assert [("each claimed whole" in p.threads) for p in plans] == [bool(p.detail.by_image) for p in plans], \
        [p.threads for p in plans]
    for k in mod.kernels:  # the plan is what runs: its tiles are the constants of the C
        if k.kind == "contraction":
            assert all(re.search(rf"#define \w+_{t.upper()} {v}L?\b", k.c_source) for t, v in k.tiles.items()), k.name
    text = uops_text(INTEGER_GEMMS)  # (eqfuse lower)
    assert text.count(f"precision: int8, path: {paths[False]}") == 10 and "kc=" in text  # (no bound weights)
    assert text.count("quantize_a=1") == 2 and text.count("im2col=1") == 3
    got = mod(**{k: v for k, v in x.items() if k not in ("w", "cw2")})
    exact = lambda p, q, pz, qz: np.matmul(p.astype(np.int64) - np.int64(pz), q.astype(np.int64) - qz.astype(np.int64))  # noqa: E731
    want = [exact(x["a"], x["b"], x["az"], x["bz"]), exact(x["s"], x["t"], x["sz"], x["tz"]),
            exact(x["c"], x["d"], x["cz"], x["dz"]), exact(x["e"], x["f"], x["az"], x["bz"])]
    quantize = OPS["quantize_linear"].numpy  # (the reference of quantize_linear)
    qa, qs = quantize([x["xa"], x["qs"], x["az"]], {}), quantize([x["xs"], x["qs"], x["sz"]], {})
    assert qa.min() == 0 and qa.max() == 255 and qs.min() == -128 and qs.max() == 127
    for g, w in zip(got[5:], [exact(qa, x["b"], x["az"], x["bz"]), exact(qs, x["t"], x["sz"], x["tz"])]):
        assert g.dtype == np.int32 and np.array_equal(g.astype(np.int64), w)
    conv = OPS["conv_integer"].numpy  # (the reference: int64 sums of (x - x_zp) (w - w_zp), padded with 0)
    geo = lambda **a: {"stride": 1, "padding": 0, "dilation": 1, "group": 1, **a}  # noqa: E731
    convs = [conv([x["cx"], x["cw"], x["az"], x["cwz"]], geo(stride=2, padding=1, group=2)),
             conv([x["cy"], x["cv"], x["sz"], x["tz"]], geo(padding=1, dilation=2))]
    for g, w in zip(got[7:9], convs):
        assert g.dtype == np.int32 and g.shape == w.shape and np.array_equal(g, w)
    acc = conv([x["cx"], x["cw2"], x["az"], x["bz"]], geo(padding=1)).astype(np.float64)
    assert np.all(np.abs(got[9] - acc * x["csc"]) <= 2.0**-24 * np.abs(acc * x["csc"]))  # (one rounding: the product)
    for g, w in zip(got[:4], want):
        assert g.dtype == np.int32 and np.array_equal(g.astype(np.int64), w)
    # the epilogue in f32 on the exact sum: the product and the add round once each (or once, fused
    # into an FMA), so |got - exact| <= 2^-24 (|acc sc| + |acc sc + bias|), relu being 1-Lipschitz
    prod = want[0] * x["sc"].astype(np.float64)
    z = prod + x["bias"]
    assert np.all(np.abs(got[4] - np.maximum(z, 0)) <= 2.0**-24 * (np.abs(prod) + np.abs(z)))
    if int8_path != "fallback":
        return  # (the conv quantizing its x: its quantize and im2col are one code on every path, checked once)
    cf = rng.uniform(-40, 40, (2, 6, 9, 11)).astype(np.float32)
    qmod = eqfuse.compile(QCONV_G, fuse="manual")
    assert [k.decisions["quantize_a"] for k in qmod.kernels] == [1] and qmod.kernels[0].decisions["im2col"] == 1
    qc = quantize([cf, x["qs"], x["az"]], {})
    assert qc.min() == 0 and qc.max() == 255
    want_qc = conv([qc, x["cw"], x["az"], x["cwz"]], geo(stride=2, padding=1, group=2))
    got_qc = qmod(cf=cf, qs=x["qs"], az=x["az"], cw=x["cw"], cwz=x["cwz"])
    assert got_qc.dtype == np.int32 and np.array_equal(got_qc, want_qc)


SLICED_G = """graph sliced(x: f32[4, 8, 32], w: i8[32, 16], wz: i8, z: u8, s: f32) {
    return matmul_integer(quantize_linear(reshape(slice(x, axis=1, start=0, stop=1), shape=[4, 32]), s, z), w, z, wz)
}
"""


def test_the_integer_gemm_quantizes_a_strided_view_as_a_copy():
    """Must not read through strides: the GEMM quantizes its x row by row from contiguous memory,
    so a strided view of x (the first token of each sequence) is copied first, not taken as a view
    (eqfuse.backend.views); its integers are the reference's."""
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((4, 8, 32)).astype(np.float32), "w": rng.integers(-128, 128, (32, 16)).astype(np.int8),
             "wz": np.asarray(0, np.int8), "z": np.asarray(100, np.uint8), "s": np.asarray(0.02, np.float32)}
    mod = eqfuse.compile(SLICED_G)
    assert [k.decisions.get("quantize_a") for k in mod.kernels if k.kind == "contraction"] == [1]
    assert any(k.kind == "layout" for k in mod.kernels)
    assert np.array_equal(mod(**feeds), eqfuse.reference(SLICED_G)(**feeds))


@pytest.mark.extended  # (a compile of its own; the default tier's integer GEMM cases are above)
def test_qlinear_matmul_is_one_integer_gemm_kernel_and_matches_onnxruntime(tmp_path):
    """QLinearMatMul (per-tensor and per-column b_scale, odd shapes) is one kernel: the integer GEMM
    with the requantization (scale multiply, round half to even, saturate) in its epilogue, writing
    u8 (rule fuse_requantize); its integers equal onnxruntime's, saturated ones included."""
    from onnx import TensorProto, helper, numpy_helper

    M, K, N = 37, 129, 70
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(np.asarray(0.02, np.float32), "as"),
             numpy_helper.from_array(np.asarray(131, np.uint8), "az"),
             numpy_helper.from_array(_s8_weights(rng, (K, N)), "b"),
             numpy_helper.from_array(np.asarray(0.004 * S8_WEIGHT_SCALE, np.float32), "bs"),
             numpy_helper.from_array((rng.uniform(0.001, 0.01, N) * S8_WEIGHT_SCALE).astype(np.float32), "bsc"),
             numpy_helper.from_array(np.asarray(0, np.int8), "bz"), numpy_helper.from_array(np.zeros(N, np.int8), "bzc"),
             numpy_helper.from_array(np.asarray(0.12, np.float32), "ys"),
             numpy_helper.from_array(np.asarray(120, np.uint8), "yz")]
    nodes = [helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"], name="per_tensor"),
             helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bsc", "bzc", "ys", "yz"], ["yc"], name="per_column")]
    g = helper.make_graph(nodes, "qlmm", [helper.make_tensor_value_info("a", TensorProto.UINT8, [M, K])],
                          [helper.make_tensor_value_info(y, TensorProto.UINT8, [M, N]) for y in ("y", "yc")], inits)
    f = tmp_path / "qlmm.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), str(f))
    a = rng.integers(0, 256, (M, K)).astype(np.uint8)
    want = ort.InferenceSession(str(f), providers=["CPUExecutionProvider"]).run(None, {"a": a})
    mod = eqfuse.compile(str(f))
    assert [(k.kind, mod.report["precision"][k.name]["precision"]) for k in mod.kernels] == [("contraction", "int8")] * 2
    for w, got in zip(want, mod(a)):
        assert got.dtype == np.uint8 and np.array_equal(got, w), int(np.sum(got != w))
    assert all({0, 255} & set(np.unique(w).tolist()) for w in want)  # the saturation was reached



@pytest.mark.parametrize("op, a_shape, b_shape", [
    ("QLinearMatMul", [2, 4, 5, 8], [2, 1, 8, 6]),  # (Falcon's multi-query attention: one key head)
    ("QLinearMatMul", [5, 8], [3, 8, 6]),
    ("MatMulInteger", [2, 1, 5, 8], [3, 8, 6]),
], ids=["one-key-head", "a-matrix", "both-broadcast"])
def test_integer_matmuls_broadcast_their_batch_dims_as_onnxruntime(op, a_shape, b_shape, tmp_path):
    """An integer matmul whose operands' batch dims broadcast (numpy's rules, as ONNX's MatMul):
    both expanded to the common batch, then the batched integer GEMM; the integers equal
    onnxruntime's."""
    rng = np.random.default_rng(8)
    ins = [("a", (U8, a_shape)), ("b", (U8, b_shape))]
    if op == "QLinearMatMul":
        ins = [ins[0], ("as", _a(0.03, np.float32)), ("az", _a(120, np.uint8)), ins[1], ("bs", _a(0.02, np.float32)),
               ("bz", _a(131, np.uint8)), ("ys", _a(0.4, np.float32)), ("yz", _a(125, np.uint8))]
    else:
        ins = ins + [("az", _a(120, np.uint8)), ("bz", _a(131, np.uint8))]
    f = tmp_path / "bmm.onnx"
    onnx.save(_one_node(op, ins, 21), str(f))
    feeds = {"a": rng.integers(0, 256, a_shape).astype(np.uint8), "b": rng.integers(0, 256, b_shape).astype(np.uint8)}
    want = _literal(onnx.load(str(f)), feeds)[0]
    got = np.asarray(eqfuse.compile(str(f))(**feeds))
    assert got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want), int(np.sum(got != want))
    assert len(np.unique(want)) > 10

@pytest.mark.extended  # (a counting build of its own)
def test_a_counting_build_makes_the_integer_micro_kernel_calls_lower_prints():
    """The plan is what runs: the integer GEMM's micro-kernel calls (per panel, K block and row
    tile) in a build that counts them are the counts `eqfuse lower --uops` prints."""
    from eqfuse.backend.cbuild import COMMON_C, build, header_c

    want, name = {}, None
    for line in uops_text(INTEGER_GEMMS).splitlines():
        m = re.match(r"(eqf_\w+): ", line)
        name = m.group(1) if m else name
        m = re.search(r"Exec  micro-kernel .* x(\d+)$", line)
        if m:
            want[name] = int(m.group(1))
    gemms = [k for k in eqfuse.compile(INTEGER_GEMMS).kernels if k.kind == "contraction"]
    assert sorted(want) == sorted(k.name for k in gemms) and len(gemms) == 10
    sigs = {k.name: re.search(rf"void {k.name}\(([^)]*)\)", k.c_source).group(1).replace("restrict ", "") for k in gemms}
    code = "\n".join(k.c_source for k in gemms)
    lib = build(header_c(code) + COMMON_C + code,
                "\n".join(f"void {n}({s});\nlong {n}_gemm_ukernel_calls(void);" for n, s in sigs.items()),
                "count", extra_flags=("-DEQF_COUNT_UKERNEL",))
    buf = np.zeros(1 << 20, dtype=np.uint8)  # the counts do not depend on the values
    for n, sig in sigs.items():
        args = [lib.ffi.cast(p.strip().rsplit(" ", 1)[0], lib.ffi.from_buffer(buf)) for p in sig.split(",")]
        getattr(lib.lib, n)(*args)
        assert getattr(lib.lib, f"{n}_gemm_ukernel_calls")() == want[n], n
    assert max(want.values()) > len(want)  # (K blocks, panels and row tiles multiply)


F32T, I8, I32 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT8, onnx.TensorProto.INT32


def _one_node(op, ins, opset=17, **attrs):
    """A model of one node named 'qnode' over `ins` [(name, value)]: a numpy value is an
    initializer, a (TensorProto type, shape) pair a graph input, None an absent optional input."""
    h = onnx.helper
    inputs = [h.make_tensor_value_info(n, *v) for n, v in ins if isinstance(v, tuple)]
    inits = [onnx.numpy_helper.from_array(np.asarray(v), n) for n, v in ins if isinstance(v, np.ndarray)]
    domain, _, op = op.rpartition(".")  # "com.microsoft.QGemm": a contrib op
    node = h.make_node(op, [n if v is not None else "" for n, v in ins], ["y"], name="qnode", domain=domain, **attrs)
    g = h.make_graph([node], "q", inputs, [onnx.ValueInfoProto(name="y")], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)] + [h.make_opsetid(MS, 1)] * bool(domain))


def _a(v, dt):
    return np.asarray(v, dt)


W8 = np.random.default_rng(2).integers(-128, 128, (8, 6)).astype(np.int8)
WC = np.random.default_rng(3).integers(-128, 128, (2, 2, 3, 3)).astype(np.int8)
S, Z = _a(0.05, np.float32), _a(3, np.uint8)
QLINEAR_CONV = [("x", (U8, [1, 2, 5, 5])), ("xs", S), ("xz", Z), ("w", WC), ("ws", S), ("wz", _a(0, np.int8)),
                ("ys", S), ("yz", Z)]


def _replaced(ins, **new):
    return [(n, new.get(n, v)) for n, v in ins] + [(n, v) for n, v in new.items() if n not in dict(ins)]


@pytest.mark.parametrize("op, ins, attrs, message", [
    ("QuantizeLinear", [("x", (F32T, [4, 4])), ("s", _a([[0.1, 0.2], [0.3, 0.4]], np.float32)), ("z", Z)], {},
     "scale or zero point of shape [2, 2] ('s'; blocked quantization)"),
    ("QuantizeLinear", [("x", (F32T, [4, 4])), ("s", (F32T, [2, 2])), ("z", Z)], {},
     "scale or zero point of shape [2, 2] ('s'; blocked quantization)"),
    ("QuantizeLinear", [("x", (F32T, [4, 4])), ("s", _a([0.1, 0.2], np.float32)), ("z", _a([0, 0], np.uint8))],
     {"block_size": 2, "axis": 1}, "attribute 'block_size' = 2 (blocked quantization)"),
    ("QuantizeLinear", [("x", (F32T, [4])), ("s", S)], {"output_dtype": onnx.TensorProto.UINT16},
     "attribute 'output_dtype' = UINT16 (eqfuse quantizes to uint8, int8)"),
    ("DequantizeLinear", [("x", _a([1, 2], np.int16)), ("s", S)], {},
     "input type int16 (eqfuse dequantizes uint8, int8 and int32)"),
    ("MatMulInteger", [("a", (U8, [8])), ("b", W8)], {}, "operands of rank 1 and 2 (eqfuse takes rank >= 2)"),
    ("MatMulInteger", [("a", (U8, [4, 8])), ("b", W8), ("az", _a([1, 2, 3, 4], np.uint8))], {},
     "a_zero_point per row (eqfuse takes a scalar)"),
    ("MatMulInteger", [("a", (I32, [4, 8])), ("b", W8)], {}, "input type i32 (input 0; eqfuse takes uint8 and int8)"),
    ("QLinearMatMul", [("a", (U8, [4, 8])), ("as", S), ("az", Z), ("b", W8), ("bs", S), ("bz", _a(0, np.int8)),
                       ("ys", (F32T, [])), ("yz", Z)], {}, "scales computed at run time (eqfuse takes constant scales)"),
    ("QLinearMatMul", [("a", (I32, [4, 8])), ("as", S), ("az", _a(0, np.int32)), ("b", W8), ("bs", S),
                       ("bz", _a(0, np.int8)), ("ys", S), ("yz", Z)], {}, "input type i32 (input 0;"),
    ("ConvInteger", [("x", (I32, [1, 2, 5, 5])), ("w", WC)], {}, "input type i32 (x, input 0; eqfuse takes uint8 and int8)"),
    ("ConvInteger", [("x", (U8, [1, 2, 5, 5])), ("w", WC), ("xz", Z), ("wz", _a([0, 0, 0], np.int8))], {},
     "w_zero_point of shape [3] (eqfuse takes a scalar or one per output channel, 2)"),
    ("ConvInteger", [("x", (U8, ["n", 2, 7, 6])), ("w", WC), ("xz", (U8, []))], {"pads": [0, 0, 1, 0], "strides": [2, 2]},
     "asymmetric pads [[0, 1], [0, 0]] with stride 2 and named dims"),
    ("QLinearConv", _replaced(QLINEAR_CONV, ys=(F32T, [])), {}, "scales computed at run time"),
    ("QLinearConv", _replaced(QLINEAR_CONV, ws=_a([0.1, 0.2, 0.3], np.float32)), {},
     "w_scale of shape [3] (eqfuse takes a scalar or one per output channel, 2)"),
    ("QLinearConv", _replaced(QLINEAR_CONV, b=_a([1, 2], np.int8)), {}, "bias type i8 (input 8; QLinearConv's bias is int32)"),
    ("QLinearConv", _replaced(QLINEAR_CONV, b=_a([1, 2, 3], np.int32)), {},
     "bias of shape [3] (one int32 per output channel, 2)"),
    ("com.microsoft.QLinearGlobalAveragePool", [("x", (U8, [1, 2, 4, 4])), ("s", S), ("z", Z), ("ys", S), ("yz", Z)],
     {"channels_last": 1}, "attribute 'channels_last' = 1 (eqfuse takes NCHW)"),
    ("com.microsoft.QLinearAdd", [("a", (U8, [2, 4])), ("s", S), ("z", Z), ("b", (U8, [2, 4])),
                                  ("s2", _a([0.1, 0.2], np.float32)), ("z2", Z), ("ys", S), ("yz", Z)], {},
     "scale or zero point of shape [2] ('s2'; this op takes one per tensor)"),
    ("com.microsoft.QGemm", [("a", (U8, [4, 8])), ("as", S), ("az", Z), ("b", W8), ("bs", S), ("bz", _a(0, np.int8)),
                             ("c", None), ("ys", S)], {}, "y_scale without y_zero_point"),
    ("com.microsoft.QLinearMul", [("a", (I32, [2, 4])), ("s", S), ("z", _a(0, np.int32)), ("b", (I32, [2, 4])), ("s2", S),
                                  ("z2", _a(0, np.int32)), ("ys", S), ("yz", Z)], {}, "input type i32 (input 0;"),
], ids=["scale-2d", "scale-2d-at-run-time", "block-size", "output-dtype", "dequantize-int16", "matmul-rank-1",
        "a-zero-point-per-row", "matmul-integer-i32", "qlinear-matmul-run-time-scale", "qlinear-matmul-i32",
        "conv-integer-i32", "w-zero-point-shape", "asymmetric-pads-named-dims", "qlinear-conv-run-time-scale",
        "w-scale-shape", "bias-type", "bias-shape", "gap-channels-last", "qlinear-add-per-channel",
        "qgemm-y-scale-alone", "qlinear-mul-i32"])
def test_an_unsupported_quantized_node_is_refused_naming_the_node(op, ins, attrs, message, tmp_path, capsys):
    """Each form the importer does not take: exit status 2 and one message naming the node."""
    from eqfuse.cli.main import main

    f = tmp_path / "bad.onnx"
    onnx.save(_one_node(op, ins, 21, **attrs), str(f))
    assert main(["opt", str(f)]) == 2
    err = capsys.readouterr().err
    assert message in err and f"of ONNX op '{op.rpartition('.')[2]}' in node 'qnode'" in err and "Traceback" not in err, err



def test_a_qlinear_softmax_axis_out_of_range_is_named_with_its_node(tmp_path, capsys):
    from eqfuse.cli.main import main

    f = tmp_path / "bad.onnx"
    onnx.save(_one_node("com.microsoft.QLinearSoftmax", [("x", (U8, [4, 8])), ("s", S), ("z", Z), ("ys", S), ("yz", Z)],
                        21, axis=2), str(f))
    assert main(["opt", str(f)]) == 2
    err = capsys.readouterr().err
    assert "QLinearSoftmax: axis 2 is out of range for rank 2 in node 'qnode'" in err and "Traceback" not in err, err

X4 = np.random.default_rng(4).uniform(-6, 6, (4, 8)).astype(np.float32)
A8 = np.random.default_rng(5).integers(0, 256, (4, 8)).astype(np.uint8)


@pytest.mark.parametrize("op, ins, attrs, feeds", [
    ("QuantizeLinear", [("x", (F32T, [4, 8])), ("s", (F32T, [])), ("z", (U8, []))], {},
     {"x": X4, "s": _a(0.04, np.float32), "z": _a(128, np.uint8)}),
    ("QuantizeLinear", [("x", (F32T, [4, 8])), ("s", (F32T, [1])), ("z", (I8, [1]))], {},
     {"x": X4, "s": _a([0.03], np.float32), "z": _a([-5], np.int8)}),
    ("QuantizeLinear", [("x", (F32T, [4, 8])), ("s", (F32T, [4])), ("z", (U8, [4]))], {"axis": 0},
     {"x": X4, "s": np.linspace(0.02, 0.08, 4).astype(np.float32), "z": np.arange(120, 124).astype(np.uint8)}),
    ("QuantizeLinear", [("x", (F32T, [4, 8])), ("s", _a(0.05, np.float32))], {"output_dtype": I8}, {"x": X4}),
    ("QLinearMatMul", [("a", (U8, [4, 8])), ("as", S), ("az", Z), ("b", W8), ("bs", _a(0.02, np.float32)),
                       ("bz", _a(0, np.int8)), ("ys", _a(0.3, np.float32)), ("yz", _a(100, np.uint8))], {}, {"a": A8}),
], ids=["run-time-scale", "run-time-one-element", "run-time-per-channel", "output-dtype-int8", "qlinear-matmul"])
def test_quantized_node_forms_import_as_onnxruntime_computes_them(op, ins, attrs, feeds, tmp_path):
    """Scales and zero points given at run time (a scalar, one element, one per channel), the
    output_dtype attribute, and QLinearMatMul's requantization: eqfuse's reference of the
    imported graph gives onnxruntime's integers (run literally), dtype and all."""
    model = _one_node(op, ins, 21 if "output_dtype" in attrs else 17, **attrs)
    f = tmp_path / "q.onnx"
    onnx.save(model, str(f))
    (want,) = _literal(model, feeds)
    got = np.asarray(eqfuse.reference(str(f))(**feeds, **onnx_params(str(f))))
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), (got, want)
    assert len(np.unique(want)) > 10  # (not a constant: the scale and zero point were applied)

def _dequantized_model():
    """MatMulInteger and ConvInteger, each followed by quantize_dynamic's dequantization (Cast, Mul by
    a scale, Add of a bias): the integer GEMM's epilogue, and a pointwise kernel reading the conv's
    i32 sum."""
    h, nh = onnx.helper, onnx.numpy_helper
    rng = np.random.default_rng(7)
    inits = [nh.from_array(_s8_weights(rng, (96, 80)), "w"),
             nh.from_array(_s8_weights(rng, (8, 3, 3, 3)), "k"),
             nh.from_array(np.asarray(131, np.uint8), "az"), nh.from_array(np.asarray(0.0123457, np.float32), "s"),
             nh.from_array(rng.standard_normal(80).astype(np.float32), "b"),
             nh.from_array(rng.standard_normal((8, 1, 1)).astype(np.float32), "cb")]
    nodes = [h.make_node("MatMulInteger", ["a", "w", "az"], ["i"]), h.make_node("Cast", ["i"], ["f"], to=1),
             h.make_node("Mul", ["f", "s"], ["m"]), h.make_node("Add", ["m", "b"], ["y"]),
             h.make_node("ConvInteger", ["x", "k", "az"], ["ci"], pads=[1, 1, 1, 1]),
             h.make_node("Cast", ["ci"], ["cf"], to=1), h.make_node("Mul", ["cf", "s"], ["cm"]),
             h.make_node("Add", ["cm", "cb"], ["z"])]
    g = h.make_graph(nodes, "dq", [h.make_tensor_value_info("a", U8, [64, 96]), h.make_tensor_value_info("x", U8, [1, 3, 12, 12])],
                     [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in ("y", "z")], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.heavy  # (the fast tier's time)
def test_dequantization_rounds_each_step_as_onnxruntime(tmp_path):
    """cast(sum) * scale + bias rounds the product and the sum each in f32, as onnxruntime's Cast,
    Mul and Add nodes do: no FMA, whose single rounding is an ulp away on many elements (and, before
    a DynamicQuantizeLinear, one quantization step away where that crosses a rounding boundary).
    The kernels say so (fp_contract=0, `eqfuse lower`'s rounding line) and the result is
    onnxruntime's, bit for bit."""
    model = _dequantized_model()
    f = tmp_path / "dq.onnx"
    onnx.save(model, str(f))
    rng = np.random.default_rng(0)
    feeds = {"a": rng.integers(0, 256, (64, 96)).astype(np.uint8), "x": rng.integers(0, 256, (1, 3, 12, 12)).astype(np.uint8)}
    mod = eqfuse.compile(str(f))
    float_kernels = [k for k in mod.kernels if k.kind in ("contraction", "pointwise")]
    assert len(float_kernels) == 2 and all('optimize("fp-contract=off")' in k.c_source for k in float_kernels)
    # (the ConvInteger's dequantization in its integer GEMM's epilogue, as the MatMulInteger's)
    assert uops_text(str(f)).count("rounding: each multiply and add as written") == len(mod.kernels) == 2
    for want, got in zip(_literal(model, feeds), mod(**feeds)):
        assert got.dtype == want.dtype and np.array_equal(got, want), int(np.sum(got != want))


# ---------------------------------------------------------------- QOperator's com.microsoft ops

MS = "com.microsoft"
# onnxruntime computes these with its own f32 steps (scale ratios folded into one multiply-add,
# a zero point added before rounding, tabulated exp and logistic): where the exact value is within
# f32 rounding of a half-integer the two round to neighbouring integers, one step of the output
# apart (docs/precision.md). The other ops give onnxruntime's integers exactly.
ONE_STEP = {"QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearAveragePool", "QLinearSoftmax"}


def _contrib_model(dt):
    """One model of every QOperator op onnxruntime's quantize_static writes (and the plain ops it
    runs on u8 / i8 tensors), side by side over two quantized inputs a, b [2, 8, 6, 6] of type dt."""
    h, nh = onnx.helper, onnx.numpy_helper
    np_dt, t = (np.uint8, U8) if dt == "u8" else (np.int8, I8)
    rng = np.random.default_rng(11)
    zp = (lambda v: np.asarray(v if dt == "u8" else v - 128, np_dt))  # noqa: E731
    inits = {"as": _a(0.031, np.float32), "az": zp(121), "bs": _a(0.017, np.float32), "bz": zp(140),
             "ys": _a(0.045, np.float32), "yz": zp(118), "ps": _a(1 / 256, np.float32), "pz": zp(0),
             "w": _s8_weights(rng, (10, 72)), "ws": (rng.uniform(0.002, 0.01, 10) * S8_WEIGHT_SCALE).astype(np.float32),
             "wz": np.zeros(10, np.int8), "c": rng.integers(-3000, 3000, 10).astype(np.int32), "gs": _a(0.9, np.float32),
             "shape": np.asarray([2, 72], np.int64)}
    n = h.make_node
    nodes = [n("QLinearAdd", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["add"], domain=MS),
             n("QLinearMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["mul"], domain=MS),
             n("QLinearSigmoid", ["a", "as", "az", "ps", "pz"], ["sigmoid"], domain=MS),
             n("QLinearLeakyRelu", ["a", "as", "az", "ys", "yz"], ["leaky"], domain=MS, alpha=0.1),
             n("QLinearAveragePool", ["a", "as", "az", "ys", "yz"], ["avgpool"], domain=MS, kernel_shape=[3, 3],
               pads=[1, 1, 1, 1], strides=[2, 2]),
             n("QLinearGlobalAveragePool", ["a", "as", "az", "ys", "yz"], ["gap"], domain=MS, channels_last=0),
             n("QLinearConcat", ["ys", "yz", "a", "as", "az", "b", "bs", "bz", "add", "ys", "yz"], ["concat"], domain=MS,
               axis=1),
             n("QLinearSoftmax", ["a", "as", "az", "ps", "pz"], ["softmax"], domain=MS, axis=-1, opset=13),
             # (ConvBERT's: over the channels, and over the dims from the channels on before opset 13)
             n("QLinearSoftmax", ["a", "as", "az", "ps", "pz"], ["softmax_c"], domain=MS, axis=1, opset=13),
             n("QLinearSoftmax", ["a", "as", "az", "ps", "pz"], ["softmax_c12"], domain=MS, axis=1, opset=12),
             n("MaxPool", ["a"], ["maxpool"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
             n("Reshape", ["maxpool", "shape"], ["flat"]),
             n("QGemm", ["flat", "as", "az", "w", "ws", "wz", "c", "gs", "yz"], ["gemm"], domain=MS, transB=1),
             n("QGemm", ["flat", "as", "az", "w", "ws", "wz", "c"], ["gemm_f32"], domain=MS, transB=1, alpha=0.5)]
    g = h.make_graph(nodes, "contrib", [h.make_tensor_value_info(x, t, [2, 8, 6, 6]) for x in "ab"],
                     [onnx.ValueInfoProto(name=o) for nd in nodes for o in nd.output if o != "flat"],
                     [nh.from_array(v, k) for k, v in inits.items()])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)])
    rng = np.random.default_rng(12)
    lo, hi = (0, 256) if dt == "u8" else (-128, 128)
    feeds = [{x: rng.integers(lo, hi, (2, 8, 6, 6)).astype(np_dt) for x in "ab"} for _ in range(2)]
    return model, feeds


@pytest.mark.heavy  # (the fast tier's time)
@pytest.mark.parametrize("dt", ["u8", pytest.param("i8", marks=pytest.mark.extended)])
def test_every_qoperator_contrib_op_matches_onnxruntime(dt, tmp_path):
    """Each com.microsoft op quantize_static's QOperator format writes (QLinearAdd, QLinearMul,
    QLinearSigmoid, QLinearLeakyRelu, QLinearAveragePool, QLinearGlobalAveragePool, QLinearConcat,
    QLinearSoftmax, QGemm quantized and f32) and MaxPool / Reshape on quantized tensors, against
    onnxruntime running the nodes: eqfuse's reference and its compiled C give onnxruntime's integers
    exactly, or, for the ops of ONE_STEP, within one step of their output."""
    model, feeds = _contrib_model(dt)
    f = tmp_path / "contrib.onnx"
    onnx.save(model, str(f))
    mod, ref = eqfuse.compile(str(f)), eqfuse.reference(str(f))
    outs = [o.name for o in model.graph.output]
    ops = {o: nd.op_type for nd in model.graph.node for o in nd.output}
    for x in feeds:
        want = _literal(model, x)
        for got in (ref(**x, **onnx_params(str(f))), mod(**x)):
            for out, w, g in zip(outs, want, got):
                g = np.asarray(g)
                assert g.dtype == w.dtype and g.shape == w.shape, (out, g.dtype, w.dtype, g.shape, w.shape)
                if ops[out] in ONE_STEP:
                    d = np.abs(g.astype(np.int32) - w.astype(np.int32))
                    assert d.max() <= 1, f"{out}: max {d.max()}, {np.sum(d > 0)} of {d.size} differ"
                elif w.dtype == np.float32:  # QGemm without y_scale: the exact sum times one f32 scale
                    assert np.array_equal(g, w), f"{out}: {np.max(np.abs(g - w))}"
                else:
                    assert np.array_equal(g, w), f"{out}: {int(np.sum(g != w))} of {w.size} differ"
        assert len(np.unique(want[outs.index("gemm")])) > 10 and len(np.unique(want[outs.index("gap")])) > 3


def test_a_contrib_op_eqfuse_lacks_is_named_with_its_domain(tmp_path, capsys):
    from eqfuse.cli.main import main

    f = tmp_path / "where.onnx"
    onnx.save(_one_node("com.microsoft.QLinearWhere", [("c", (onnx.TensorProto.BOOL, [4])), ("x", (U8, [4]))]), str(f))
    assert main(["opt", str(f)]) == 2
    err = capsys.readouterr().err
    assert "unsupported ONNX op 'com.microsoft.QLinearWhere' in node 'qnode'" in err and "Traceback" not in err, err


def _dynamic_quantize_model(shape):
    h = onnx.helper
    node = h.make_node("DynamicQuantizeLinear", ["x"], ["y", "ys", "yz"], name="dql")
    g = h.make_graph([node], "dql", [h.make_tensor_value_info("x", F32T, shape)],
                     [onnx.ValueInfoProto(name=n) for n in ("y", "ys", "yz")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("mode", ["openmp", "pool", "caller"])
def test_dynamic_range_in_blocks_over_threads_matches_onnxruntime(mode, tmp_path, monkeypatch):
    """dynamic_range's pass over an x larger than a block, in blocks (the plan's `block`, the
    last one part of a 64-lane group) split over 2 threads in each mode a call may pick (OpenMP's
    split, the claim-based pool, the calling thread: tests/test_regions.py's modes): y, scale and
    zero point equal onnxruntime's with the minimum or maximum in the first, a middle or the last
    block's tail."""
    from eqfuse.runtime import load

    free, beside = {"openmp": (2, 2), "pool": (1, 2), "caller": (1, 1)}[mode]
    monkeypatch.setattr(load, "free_cores", lambda now=None, mine=None: free)
    monkeypatch.setattr(load, "free_cores_beside_peers", lambda now=None, mine=None: beside)
    f = tmp_path / "dql.onnx"
    model = _dynamic_quantize_model([129, 300])
    onnx.save(model, str(f))
    module = eqfuse.compile(str(f), threads=2)
    (k,) = [k for k in module.kernels if k.decisions.get("op") == "dynamic_range"]
    n, block = 129 * 300, k.decisions["block"]
    assert k.decisions["parallel"] and n > 2 * block and n % block % 64, k.decisions
    x = np.random.default_rng(7).standard_normal((129, 300)).astype(np.float32)
    cases = {"random": x}
    for where, i in {"first": 3, "middle": n // 2 + 5, "tail": n - 2}.items():
        for sign in (-1, 1):
            v = x.copy().reshape(-1)
            v[i] = 9.0 * sign
            cases[f"{where}{sign:+d}"] = v.reshape(x.shape)
    for what, v in cases.items():
        want = _literal(model, {"x": v})
        for w, g in zip(want, module(x=v)):
            g = np.asarray(g)
            assert g.dtype == w.dtype and np.array_equal(g.reshape(w.shape), w), (mode, what, g, w)


def test_dynamic_quantize_reads_x_once_and_matches_onnxruntime(tmp_path):
    """DynamicQuantizeLinear's range is one pass over x (dynamic_range), its scale and zero point
    C expressions of those two floats (here two scalar kernels, the model's outputs; in a model,
    the integer GEMM's): y, scale and zero point equal onnxruntime's, on a size
    that is not a multiple of the pass's 64 lanes, with the minimum or maximum in the tail, all
    negative, all positive, all zero; a NaN is passed over as eqfuse's reference does."""
    f = tmp_path / "dql.onnx"
    onnx.save(_dynamic_quantize_model([3, 67]), str(f))
    module = eqfuse.compile(str(f))
    # x's 201 floats looped over by the range and the quantize only; the scale and zero point
    # from the range's two floats
    ops = {k.decisions["op"]: "201L" in k.c_source for k in module.kernels if k.kind == "index"}
    assert ops == {"dynamic_range": True}, ops
    scalars = [k for k in module.kernels if k.kind == "pointwise" and "eqf_range_" in k.c_source]
    assert len(scalars) == 2 and not any("201" in k.c_source for k in scalars), module.kernels
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 67)).astype(np.float32)
    tail_min, tail_max = x.copy(), x.copy()
    tail_min[2, 66], tail_max[2, 65] = -9.0, 9.0
    cases = {"random": x, "tail-min": tail_min, "tail-max": tail_max, "negative": -np.abs(x) - 0.1,
             "positive": np.abs(x) + 0.1, "zero": np.zeros_like(x)}
    for what, v in cases.items():
        want = _literal(_dynamic_quantize_model([3, 67]), {"x": v})
        got = module(x=v)
        for w, g in zip(want, got):
            g = np.asarray(g)
            assert g.dtype == w.dtype and np.array_equal(g.reshape(w.shape), w), (what, g, w)
    ref = eqfuse.reference(str(f))
    nan = x.copy()
    nan[1, 5] = np.nan
    for w, g in zip(ref(x=nan), module(x=nan)):
        w, g = np.asarray(w), np.asarray(g)
        assert np.array_equal(g, w), (g, w)


# Integer convs whose kernel rows take each of the im2col's copies: a 5 x 5 kernel (rows of five
# bytes, memcpy), 1 x 1 (one byte: four at once but at a pixel's last row), 3 x 3 at stride 2 on a
# width whose last columns leave fewer than four bytes in the x row (per tap there), in output rows
# of 2 (of 5, the 6-row tiles of the fallback path, an AVX2 CPU's, had read it in place: direct_x).
# And a 7 x 7
# (the quantized ResNet stem's kernel rows of seven bytes) of 126 pixels in rows of 7 (too short
# to go without the im2col: direct_x): the im2col's chunks of 32 pixels start inside an output
# row, and three of its kernel rows lie in the padding at the top and bottom.
IM2COL_G = """
graph im(x: u8[2, 3, 9, 10], w5: i8[4, 3, 5, 5], w1: i8[5, 3, 1, 1], w3: i8[6, 3, 3, 3], w7: i8[4, 3, 7, 7],
         xz: u8, wz: i8, x3: u8[2, 3, 9, 4], x7: u8[1, 3, 18, 7]) {
    return conv_integer(x, w5, xz, wz, stride=2, padding=2), conv_integer(x, w1, xz, wz),
           conv_integer(x3, w3, xz, wz, stride=2, padding=1), conv_integer(x7, w7, xz, wz, padding=3)
}
"""


# Requantized integer convs (u8 out, NCHW) whose tiles of 8 or 16 rows are stored channel by channel
# (the template's COLS8, store_cols8: a transpose of the tile's bytes in registers), with a partial
# last panel (20 and 44 output channels: 32-column panels) and every way a tile's pixels map to
# the output: the im2col (a 1 x 1 of 5 channels), by output row (OW 16, a 3 x 3 of 5 channels),
# rows of virtual pixels (OW 15 -> 16, stride 2), virtual pixels across rows (stride 1, OW 30:
# some tiles cross a row's end and take the row-by-row store); w's zero points per channel (the
# row sums); and a conv of 8 output channels (AVX512_VNNI's 16 x 16 tile, AVX-VNNI's 8 x 8: half a
# transpose)
COLS8_G = """
graph c8(x: u8[2, 8, 14, 30], y: u8[1, 5, 16, 16], w: i8[20, 8, 3, 3], w1: i8[44, 5, 1, 1], w3: i8[44, 5, 3, 3],
         w8: i8[8, 5, 3, 3], xz: u8, wz: i8[20], wz5: i8[44], wz0: i8, s: f32, z: u8) {
    a = kernel { quantize_linear(cast(conv_integer(x, w, xz, wz, padding=1), to="f32") * s, 1.0, z) }
    b = kernel { quantize_linear(cast(conv_integer(x, w, xz, wz, stride=2, padding=1), to="f32") * s, 1.0, z) }
    c = kernel { quantize_linear(cast(conv_integer(y, w1, xz, wz5), to="f32") * s, 1.0, z) }
    d = kernel { quantize_linear(cast(conv_integer(y, w3, xz, wz5, padding=1), to="f32") * s, 1.0, z) }
    e = kernel { quantize_linear(cast(conv_integer(y, w8, xz, wz0, padding=1), to="f32") * s, 1.0, z) }
    return a, b, c, d, e
}
"""


@pytest.mark.heavy
def test_requantized_convs_store_their_tiles_channel_by_channel_exactly(int8_path):
    rng = np.random.default_rng(21)
    i8 = lambda *s: rng.integers(-128, 128, s).astype(np.int8)  # noqa: E731
    x = {"x": rng.integers(0, 256, (2, 8, 14, 30)).astype(np.uint8), "y": rng.integers(0, 256, (1, 5, 16, 16)).astype(np.uint8),
         "w": i8(20, 8, 3, 3), "w1": i8(44, 5, 1, 1), "w3": i8(44, 5, 3, 3), "w8": i8(8, 5, 3, 3), "xz": np.asarray(7, np.uint8),
         "wz0": np.asarray(0, np.int8),
         "wz": rng.integers(-3, 4, 20).astype(np.int8), "wz5": rng.integers(-3, 4, 44).astype(np.int8),
         "s": np.asarray(2e-3, np.float32), "z": np.asarray(100, np.uint8)}
    mod = eqfuse.compile(COLS8_G, fuse="manual")
    convs = [k for k in mod.kernels if k.kind == "contraction"]
    cols8 = [bool(k.decisions["cols8"]) for k in convs]
    assert cols8 == [bool(re.search(r"#define \w+_COLS8 1", k.c_source)) for k in convs]  # (the plan is what runs)
    # (8- and 16-row tiles: AVX512_VNNI's for N > 16 and N <= 16, AVX-VNNI's for N <= 8)
    assert cols8 == [k.tiles["mr"] in (8, 16) for k in convs]
    if int8_path in ("avx512_vnni", "avx_vnni"):
        assert cols8 == ([True] * 5 if int8_path == "avx512_vnni" else [False] * 4 + [True])
    if int8_path == "avx512_vnni":
        assert sorted(k.decisions["direct_x"] for k in convs[:4]) == [0, 1, 2, 2]
        assert sorted(k.decisions["owv"] for k in convs[:4] if k.decisions["direct_x"] == 2) == [16, 16]
    conv, quantize = OPS["conv_integer"].numpy, OPS["quantize_linear"].numpy
    geo = lambda **a: {"stride": 1, "padding": 0, "dilation": 1, "group": 1, **a}  # noqa: E731
    accs = [conv([x["x"], x["w"], x["xz"], x["wz"]], geo(padding=1)), conv([x["x"], x["w"], x["xz"], x["wz"]], geo(stride=2, padding=1)),
            conv([x["y"], x["w1"], x["xz"], x["wz5"]], geo()), conv([x["y"], x["w3"], x["xz"], x["wz5"]], geo(padding=1)),
            conv([x["y"], x["w8"], x["xz"], x["wz0"]], geo(padding=1))]
    for threads in (1, 2):
        mod.default.threads = threads
        for g, acc in zip(mod(**x), accs):
            want = quantize([(acc.astype(np.float32) * x["s"]).astype(np.float32), np.float32(1.0), x["z"]], {})
            assert g.dtype == np.uint8 and g.shape == want.shape and np.array_equal(g, want), threads


# A conv of 16 output channels (one 16-column panel) large enough to share among threads: its
# chunks are the panel's blocks of rows (tile "mb"), here run on 2 threads
ROW_BLOCKS_G = """
graph rb(x: u8[1, 16, 20, 20], w: i8[16, 16, 3, 3], xz: u8, wz: i8, s: f32, z: u8) {
    return quantize_linear(cast(conv_integer(x, w, xz, wz, padding=1), to="f32") * s, 1.0, z)
}
"""


# A residual add requantized (QLinearAdd's, a QDQ ResNet's): a pointwise kernel whose result is a
# quantize_linear of one scale and one zero point quantizes blocks of its floats at once (qout), to
# u8 and to i8, with NaN, ties, saturation and a row that is not whole vectors; a scale per
# channel keeps the element-by-element loop
QADD_G = """
graph qa(a: u8[3, 5, 37], b: u8[3, 5, 37], f: f32[3, 5, 37], sa: f32, sb: f32, za: u8, zb: u8, s: f32, z: u8, z8: i8,
         sc: f32[5, 1]) {
    y = kernel { quantize_linear(dequantize_linear(a, sa, za) + dequantize_linear(b, sb, zb), s, z) }
    y8 = kernel { quantize_linear(dequantize_linear(a, sa, za) + f, s, z8) }
    yc = kernel { quantize_linear(dequantize_linear(a, sa, za) + f, sc, z) }
    return y, y8, yc
}
"""


def test_a_requantized_residual_add_quantizes_blocks_at_once_exactly():
    rng = np.random.default_rng(31)
    u8 = lambda: rng.integers(0, 256, (3, 5, 37)).astype(np.uint8)  # noqa: E731
    f = (rng.integers(-300, 300, (3, 5, 37)) * 0.25).astype(np.float32)  # (quarters: halves land on ties)
    f[0, 0, :3] = [np.nan, 1e30, -1e30]
    x = {"a": u8(), "b": u8(), "f": f, "sa": np.asarray(0.5, np.float32), "sb": np.asarray(0.25, np.float32),
         "za": np.asarray(128, np.uint8), "zb": np.asarray(3, np.uint8), "s": np.asarray(0.5, np.float32),
         "z": np.asarray(10, np.uint8), "z8": np.asarray(-7, np.int8), "sc": rng.uniform(0.2, 0.6, (5, 1)).astype(np.float32)}
    mod = eqfuse.compile(QADD_G, fuse="manual")
    kernels = [k for k in mod.kernels if k.kind == "pointwise"]
    assert [k.decisions["qout"] for k in kernels] == [1, 1, 0]
    assert [bool(re.search(r"#define \w+_QOUT 1", k.c_source)) for k in kernels] == [True, True, False]
    q, dq = OPS["quantize_linear"].numpy, OPS["dequantize_linear"].numpy
    da = dq([x["a"], x["sa"], x["za"]], {})
    want = [q([(da + dq([x["b"], x["sb"], x["zb"]], {})).astype(np.float32), x["s"], x["z"]], {}),
            q([(da + f).astype(np.float32), x["s"], x["z8"]], {}), q([(da + f).astype(np.float32), x["sc"], x["z"]], {})]
    got = mod(**x)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)
    assert got[1].flat[0] == -128 and got[1].flat[1] == 127  # (NaN to the low end; saturation)

# A requantization of one scale and one zero point ends the conv's epilogue (qout: the row's floats,
# then eqf_quantize_row on the row at once), here to i8 at a scale not 1, over tiles of virtual
# pixels across a row's end (OW 30, stride 1: stored as runs under lane masks on AVX-512; 8 output
# channels take 16-row tiles there, whose runs are two halves of 8 pixels); a scale per output
# channel keeps the element-by-element epilogue (qout 0)
QOUT_G = """
graph qo(x: u8[2, 8, 14, 30], w: i8[20, 8, 3, 3], w8: i8[8, 8, 3, 3], xz: u8, wz: i8, s: f32, s2: f32, z8: i8,
         sc: f32[20, 1, 1], z: u8) {
    f = kernel { quantize_linear(cast(conv_integer(x, w, xz, wz, padding=1), to="f32") * s, s2, z8) }
    g = kernel { quantize_linear(cast(conv_integer(x, w, xz, wz, padding=1), to="f32") * s, sc, z) }
    h = kernel { quantize_linear(cast(conv_integer(x, w8, xz, wz, padding=1), to="f32") * s, s2, z8) }
    return f, g, h
}
"""


def test_a_conv_requantized_at_one_scale_quantizes_its_rows_at_once_exactly(int8_path):
    rng = np.random.default_rng(30)
    x = {"x": rng.integers(0, 256, (2, 8, 14, 30)).astype(np.uint8), "w": rng.integers(-128, 128, (20, 8, 3, 3)).astype(np.int8),
         "w8": rng.integers(-128, 128, (8, 8, 3, 3)).astype(np.int8),
         "xz": np.asarray(9, np.uint8), "wz": np.asarray(0, np.int8), "s": np.asarray(1e-3, np.float32),
         "s2": np.asarray(0.37, np.float32), "z8": np.asarray(-5, np.int8),
         "sc": rng.uniform(0.2, 0.6, (20, 1, 1)).astype(np.float32), "z": np.asarray(120, np.uint8)}
    mod = eqfuse.compile(QOUT_G, fuse="manual")
    convs = [k for k in mod.kernels if k.kind == "contraction"]
    assert [k.decisions["qout"] for k in convs] == [1, 0, 1]
    assert [bool(re.search(r"#define \w+_QOUT 1", k.c_source)) for k in convs] == [True, False, True]  # (the plan is what runs)
    if int8_path == "avx512_vnni":  # (rows of 30 virtual pixels: tiles across the rows' ends)
        assert [(k.decisions["direct_x"], k.tiles["mr"]) for k in convs] == [(1, 8), (1, 8), (1, 16)]
    geo = {"stride": 1, "padding": 1, "dilation": 1, "group": 1}
    acc, acc8 = (OPS["conv_integer"].numpy([x["x"], x[w], x["xz"], x["wz"]], geo) for w in ("w", "w8"))
    y, y8 = ((a.astype(np.float32) * x["s"]).astype(np.float32) for a in (acc, acc8))
    quantize = OPS["quantize_linear"].numpy
    want = [quantize([y, x["s2"], x["z8"]], {}), quantize([y, x["sc"], x["z"]], {}), quantize([y8, x["s2"], x["z8"]], {})]
    assert want[0].dtype == np.int8 and len(np.unique(want[0])) > 100  # (the range, not a saturated few values)
    for threads in (1, 2):
        mod.default.threads = threads
        for g, w in zip(mod(**x), want):
            assert g.dtype == w.dtype and np.array_equal(g, w), threads


def test_an_integer_conv_of_one_panel_splits_its_rows_among_threads():
    rng = np.random.default_rng(8)
    mod = eqfuse.compile(ROW_BLOCKS_G)
    (k,) = [k for k in mod.kernels if k.kind == "contraction"]
    assert k.decisions["parallel"] == 1 and k.tiles["nr"] == 16 and k.tiles["mb"] < 400, k.tiles
    assert re.search(rf"#define \w+_MB {k.tiles['mb']}L", k.c_source)
    mod.default.threads = 2
    x = {"x": rng.integers(0, 256, (1, 16, 20, 20)).astype(np.uint8), "w": rng.integers(-128, 128, (16, 16, 3, 3)).astype(np.int8),
         "xz": np.asarray(3, np.uint8), "wz": np.asarray(0, np.int8), "s": np.asarray(1e-3, np.float32),
         "z": np.asarray(128, np.uint8)}
    got = mod(**x)
    acc = OPS["conv_integer"].numpy([x["x"], x["w"], x["xz"], x["wz"]], {"stride": 1, "padding": 1, "dilation": 1, "group": 1})
    want = OPS["quantize_linear"].numpy([(acc.astype(np.float32) * x["s"]).astype(np.float32), np.float32(1.0), x["z"]], {})
    assert got.dtype == np.uint8 and np.array_equal(got, want)


# Integer convs whose images are the threads' chunks (by_image): four images (a multiple of 1, 2 or
# 4 cores), a 3 x 3 read in place (direct_x) with w's zero points per output channel (each image's
# row sums), a 3 x 3 on 6 x 6 planes with its im2col (rows of 6 pixels: a multiple of no path's MR
# of 4, 8 or 16, and under DIRECT_X_MIN_OW), and a 7 x 7 stride-2 stem quantizing its
# own f32 x (each image's quantized planes), each at 1 and 2 threads against numpy
BY_IMAGE_G = """
graph bi(x: u8[4, 16, 16, 16], w: i8[16, 16, 3, 3], y: u8[4, 64, 6, 6], v: i8[64, 64, 3, 3], f: f32[4, 3, 32, 32],
         w7: i8[16, 3, 7, 7], xz: u8, wz: i8[16], vz: i8, qs: f32) {
    q = kernel { conv_integer(quantize_linear(f, qs, xz), w7, xz, vz, stride=2, padding=3) }
    return conv_integer(x, w, xz, wz, padding=1), conv_integer(y, v, xz, vz, padding=1), q
}
"""


@pytest.mark.heavy  # (the fast tier's time)
def test_integer_convs_by_image_match_numpy_on_one_and_two_threads():
    rng = np.random.default_rng(9)
    i8 = lambda *s: rng.integers(-128, 128, s).astype(np.int8)  # noqa: E731
    x = {"x": rng.integers(0, 256, (4, 16, 16, 16)).astype(np.uint8), "w": i8(16, 16, 3, 3),
         "y": rng.integers(0, 256, (4, 64, 6, 6)).astype(np.uint8), "v": i8(64, 64, 3, 3),
         "f": rng.uniform(-3, 3, (4, 3, 32, 32)).astype(np.float32), "w7": i8(16, 3, 7, 7),
         "xz": np.asarray(9, np.uint8), "wz": i8(16), "vz": np.asarray(0, np.int8), "qs": np.asarray(0.03, np.float32)}
    mod = eqfuse.compile(BY_IMAGE_G, fuse="manual")
    convs = [k for k in mod.kernels if k.kind == "contraction"]
    cores = machine().cores
    assert [k.decisions["by_image"] for k in convs] == [int(cores > 1 and 4 % cores == 0)] * 3
    assert sorted(k.decisions["direct_x"] for k in convs) == [0, 2, 2] and sum(k.decisions["quantize_a"] for k in convs) == 1
    conv, quantize = OPS["conv_integer"].numpy, OPS["quantize_linear"].numpy
    geo = lambda **a: {"stride": 1, "padding": 1, "dilation": 1, "group": 1, **a}  # noqa: E731
    want = [conv([x["x"], x["w"], x["xz"], x["wz"]], geo()), conv([x["y"], x["v"], x["xz"], x["vz"]], geo()),
            conv([quantize([x["f"], x["qs"], x["xz"]], {}), x["w7"], x["xz"], x["vz"]], geo(stride=2, padding=3))]
    for threads in (1, 2):
        mod.default.threads = threads
        for g, w in zip(mod(**x), want):
            assert g.dtype == np.int32 and np.array_equal(g, w), threads


# Integer convs read in place from a padded copy of x, without an im2col (direct_x): as virtual
# pixels (1: stride 1, output rows of 8 pixels or more, not a multiple of the tile's rows) padded
# and not, a 4-tap kernel (no tap of weight 0 added), an s8 x, w's zero points per output channel
# and not zero (the row sums of the virtual pixels), two groups, x quantized from f32 by the conv;
# by output row (2: 16 or 32 pixels), a 7 x 7 of stride 2 (two K-groups per kernel row) on an odd
# height and a 3 x 3; and a stride-2 conv of 6-pixel rows beside them that keeps its im2col
DIRECT_X_G = """
graph dx(x: u8[2, 5, 9, 12], w: i8[7, 5, 3, 3], w4: i8[6, 5, 2, 4], wg: i8[8, 2, 3, 3], y: i8[1, 4, 8, 10],
         wy: i8[5, 4, 3, 3], xf: f32[1, 4, 8, 10], qs: f32, xz: u8, yz: i8, wz: i8[7], wz0: i8,
         z: u8[1, 3, 21, 32], w7: i8[5, 3, 7, 7], wz7: i8[5], w3: i8[4, 3, 3, 3]) {
    q = kernel { conv_integer(quantize_linear(xf, qs, xz), wy, xz, wz0) }
    return conv_integer(x, w, xz, wz, padding=1), conv_integer(x, w4, xz, wz0), conv_integer(y, wy, yz, wz0, padding=1),
           conv_integer(y, wg, yz, wz0, padding=1, group=2), q, conv_integer(x, w, xz, wz, stride=2, padding=1),
           conv_integer(z, w7, xz, wz7, stride=2, padding=3), conv_integer(z, w3, xz, wz0, padding=1)
}
"""


@pytest.mark.heavy
def test_integer_convs_without_im2col_read_a_padded_copy_of_x():
    _check_direct_x()


@pytest.mark.heavy  # (a few seconds: the whole suite runs it, the fast tier not)
def test_integer_convs_without_im2col_on_every_path(int8_path):
    _check_direct_x(seven=int8_path == "avx2_maddubs", mr8=int8_path == "avx_vnni")


@pytest.mark.parametrize("W", [13, 16, 20, 29])
def test_an_integer_conv_of_channels_in_fours_copies_every_pixel_of_its_rows(W):
    """Channels in fours (CH4): the padded copy interleaves four channels' rows pixel by pixel,
    16 pixels a round, then 8, then one by one (gemm_u8s8.c, interleave4); rows of 13, 16, 20 and
    29 pixels take each part and their mixes (a row under 8 pixels takes the im2col), against the
    op table's numpy."""
    rng = np.random.default_rng(W)
    x = rng.integers(0, 256, (1, 8, 6, W)).astype(np.uint8)
    w = rng.integers(-128, 128, (16, 8, 3, 3)).astype(np.int8)
    zp, wz = np.asarray(61, np.uint8), np.asarray(0, np.int8)
    src = (f"graph c(x: u8[1, 8, 6, {W}], w: i8[16, 8, 3, 3], xz: u8, wz: i8) {{\n"
           "    return conv_integer(x, w, xz, wz, padding=1)\n}")
    mod = eqfuse.compile(src, fuse="manual", params={"w": w})
    (conv,) = [k for k in mod.kernels if k.kind == "contraction"]
    assert conv.decisions["direct_x"] > 0 and "_CH4 1 " in conv.c_source
    want = OPS["conv_integer"].numpy([x, w, zp, wz], {"stride": 1, "padding": 1, "dilation": 1, "group": 1})
    got = mod(x, zp, wz)
    assert np.array_equal(got, want)


def _check_direct_x(seven: bool = False, mr8: bool = False):
    """DIRECT_X_G against the reference; `seven`: the weights of 7 bits, bound (params=), those of
    one group packed once and so on the avx2_maddubs path, the first output channel's at 64 and x's
    first image at 255. `mr8`: the tile of N <= 8 has 8 rows (AVX-VNNI's; 6 on the AVX2 paths, 16 on
    AVX512_VNNI), and which output rows are whole tiles (direct_x 2) moves: OW 8, 16 and 32 are,
    12 is not, and a stride-2 conv of OW 6 takes the im2col, unless it is one tile of 6 rows or a
    row of virtual pixels (its OW rounded up to whole tiles) wastes at most DIRECT_X_WASTE."""
    rng = np.random.default_rng(12)
    i8 = lambda *s: rng.integers(-64, 65, s).astype(np.int8) if seven else rng.integers(-128, 128, s).astype(np.int8)  # noqa: E731
    x = {"x": rng.integers(0, 256, (2, 5, 9, 12)).astype(np.uint8), "w": i8(7, 5, 3, 3), "w4": i8(6, 5, 2, 4),
         "wg": i8(8, 2, 3, 3), "y": i8(1, 4, 8, 10), "wy": i8(5, 4, 3, 3),
         "xf": rng.uniform(-40, 40, (1, 4, 8, 10)).astype(np.float32), "qs": np.asarray(0.25, np.float32),
         "xz": np.asarray(77, np.uint8), "yz": np.asarray(-9, np.int8), "wz": i8(7), "wz0": np.asarray(0, np.int8),
         "z": rng.integers(0, 256, (1, 3, 21, 32)).astype(np.uint8), "w7": i8(5, 3, 7, 7), "wz7": i8(5), "w3": i8(4, 3, 3, 3)}
    weights = ("w", "w4", "wg", "wy", "w7", "w3") if seven else ()
    for k in weights:
        x[k][0] = 64
    if seven:
        x["x"][0], x["z"][0] = 255, 255
    mod = eqfuse.compile(DIRECT_X_G, fuse="manual", params={k: x[k] for k in weights})
    convs = [k for k in mod.kernels if k.kind == "contraction"]
    # (the tile's rows: 16 on AVX512_VNNI, 8 on AVX-VNNI, 6 on the AVX2 paths: with 6, the 7 x 7's OW of 16 is
    # 18 virtual pixels, a ninth of them not stored, and the stride-2 conv's OW of 6 one tile)
    mr = convs[0].tiles["mr"]
    assert mr == (8 if mr8 else mr)
    assert sorted(k.decisions["direct_x"] for k in convs) == {16: [0, 1, 1, 1, 1, 1, 2, 2], 8: [0, 1, 1, 1, 1, 2, 2, 2],
                                                              6: [1, 1, 1, 1, 1, 2, 2, 2]}[mr]
    assert [k.decisions["owv"] for k in convs if k.decisions["direct_x"] == 2] and all(
        k.decisions["owv"] % mr == 0 for k in convs if k.decisions["direct_x"] == 2)
    paths = [mod.report["precision"][k.name]["path"] for k in convs]
    if seven:  # (wg's two groups are not packed once: the fallback)
        assert paths == ["avx2_maddubs" if k.decisions["prepacked_b"] else "fallback" for k in convs] and paths.count("fallback") == 1
    assert sum(k.decisions["quantize_a"] for k in convs) == 1
    assert uops_text(DIRECT_X_G).count("padded with its zero point") == sum(k.decisions["direct_x"] > 0 for k in convs)
    conv, quantize = OPS["conv_integer"].numpy, OPS["quantize_linear"].numpy
    geo = lambda **a: {"stride": 1, "padding": 0, "dilation": 1, "group": 1, **a}  # noqa: E731
    qx = quantize([x["xf"], x["qs"], x["xz"]], {})
    want = [conv([x["x"], x["w"], x["xz"], x["wz"]], geo(padding=1)), conv([x["x"], x["w4"], x["xz"], x["wz0"]], geo()),
            conv([x["y"], x["wy"], x["yz"], x["wz0"]], geo(padding=1)),
            conv([x["y"], x["wg"], x["yz"], x["wz0"]], geo(padding=1, group=2)), conv([qx, x["wy"], x["xz"], x["wz0"]], geo()),
            conv([x["x"], x["w"], x["xz"], x["wz"]], geo(stride=2, padding=1)),
            conv([x["z"], x["w7"], x["xz"], x["wz7"]], geo(stride=2, padding=3)), conv([x["z"], x["w3"], x["xz"], x["wz0"]], geo(padding=1))]
    for g, w in zip(mod(**{k: v for k, v in x.items() if k not in weights}), want):
        assert g.dtype == np.int32 and g.shape == w.shape and np.array_equal(g, w)


# Strided and 1 x 1 integer convs read in place by output row when their rows are not whole tiles
# (DIRECT_X 2 with OWV > OW: OW 15 rounded up to the tile's rows, 16 or 18, the pixels past each
# row's end computed and not stored): a 3 x 3 of stride 2 with channels in fours and w's zero
# points per output channel (the virtual pixels' row sums), one of 6 channels (kernel rows padded
# to four taps), and a 1 x 1 of stride 2 (a K-group four channels of its one tap)
VIRTUAL_ROWS_G = """
graph vr(x: u8[2, 8, 29, 30], y: u8[1, 6, 29, 30], w: i8[20, 8, 3, 3], w6: i8[12, 6, 3, 3], w1: i8[24, 8, 1, 1],
         xz: u8, wz: i8[20], wz0: i8) {
    return conv_integer(x, w, xz, wz, stride=2, padding=1), conv_integer(y, w6, xz, wz0, stride=2, padding=1),
           conv_integer(x, w1, xz, wz0, stride=2)
}
"""


@pytest.mark.heavy
def test_strided_and_1x1_integer_convs_read_in_place_on_rows_of_virtual_pixels(int8_path):
    rng = np.random.default_rng(15)
    i8 = lambda *s: rng.integers(-128, 128, s).astype(np.int8)  # noqa: E731
    x = {"x": rng.integers(0, 256, (2, 8, 29, 30)).astype(np.uint8), "y": rng.integers(0, 256, (1, 6, 29, 30)).astype(np.uint8),
         "w": i8(20, 8, 3, 3), "w6": i8(12, 6, 3, 3), "w1": i8(24, 8, 1, 1), "xz": np.asarray(201, np.uint8), "wz": i8(20),
         "wz0": np.asarray(0, np.int8)}
    mod = eqfuse.compile(VIRTUAL_ROWS_G, fuse="manual")
    convs = [k for k in mod.kernels if k.kind == "contraction"]
    assert [k.decisions["direct_x"] for k in convs] == [2, 2, 2]
    assert [k.decisions["ch4"] for k in convs] == [1, 0, 1]
    assert all(k.decisions["owv"] > 15 and k.decisions["owv"] % k.tiles["mr"] == 0 for k in convs)
    conv = OPS["conv_integer"].numpy
    geo = lambda **a: {"stride": 2, "padding": 1, "dilation": 1, "group": 1, **a}  # noqa: E731
    want = [conv([x["x"], x["w"], x["xz"], x["wz"]], geo()), conv([x["y"], x["w6"], x["xz"], x["wz0"]], geo()),
            conv([x["x"], x["w1"], x["xz"], x["wz0"]], geo(padding=0))]
    for threads in (1, 2):
        mod.default.threads = threads
        for g, w in zip(mod(**x), want):
            assert g.dtype == np.int32 and g.shape == w.shape and np.array_equal(g, w), threads


@pytest.mark.heavy  # (a few seconds: the whole suite runs it, the fast tier not)
def test_the_integer_conv_im2col_copies_every_kernel_row_width():
    rng = np.random.default_rng(7)
    x = {"x": rng.integers(0, 256, (2, 3, 9, 10)).astype(np.uint8), "xz": np.asarray(77, np.uint8),
         "wz": np.asarray(-5, np.int8), "x7": rng.integers(0, 256, (1, 3, 18, 7)).astype(np.uint8),
         "x3": rng.integers(0, 256, (2, 3, 9, 4)).astype(np.uint8)}
    for n, s in (("w5", (4, 3, 5, 5)), ("w1", (5, 3, 1, 1)), ("w3", (6, 3, 3, 3)), ("w7", (4, 3, 7, 7))):
        x[n] = rng.integers(-128, 128, s).astype(np.int8)
    mod = eqfuse.compile(IM2COL_G)
    assert sum(k.decisions.get("im2col", 0) for k in mod.kernels) == 4
    assert not any(k.decisions.get("direct_x") for k in mod.kernels)
    # the 5 x 5 and 7 x 7 by output row, the 1 x 1 and 3 x 3 pixel by pixel (im2col_by_rows)
    assert sorted(k.decisions["im2col_rows"] for k in mod.kernels if k.kind == "contraction") == [0, 0, 1, 1]
    conv = OPS["conv_integer"].numpy
    geo = lambda **a: {"stride": 1, "padding": 0, "dilation": 1, "group": 1, **a}  # noqa: E731
    want = [conv([x["x"], x["w5"], x["xz"], x["wz"]], geo(stride=2, padding=2)),
            conv([x["x"], x["w1"], x["xz"], x["wz"]], geo()), conv([x["x3"], x["w3"], x["xz"], x["wz"]], geo(stride=2, padding=1)),
            conv([x["x7"], x["w7"], x["xz"], x["wz"]], geo(padding=3))]
    for g, w in zip(mod(**x), want):
        assert g.dtype == np.int32 and g.shape == w.shape and np.array_equal(g, w)


def _qdq_conv_model(path):
    """Two convs as quantize_static writes them (QDQ: u8 activations, i8 weights per tensor, the
    first with a bias, whose ReLU the quantizer folds into the next QuantizeLinear)."""
    h = onnx.helper
    rng = np.random.default_rng(11)
    w1, b1 = (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32), (rng.standard_normal(16) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32)
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", F32T, [1, 8, 12, 12])],
                     [h.make_tensor_value_info("y", F32T, [1, 16, 6, 6])],
                     [onnx.numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"))])
    f32 = path.with_name("conv-f32.onnx")
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), str(f32))

    class Reader(quant.CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": rng.standard_normal((1, 8, 12, 12)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.it, None)

    quant.quantize_static(str(f32), str(path), Reader(), quant_format=quant.QuantFormat.QDQ,
                          activation_type=quant.QuantType.QUInt8, weight_type=quant.QuantType.QInt8,
                          reduce_range=not ORT_EXACT_S8)
    return onnx.load(str(path))


@pytest.mark.heavy  # (the fast tier's time)
def test_qdq_convs_run_on_the_integer_conv_and_match_onnxruntime(tmp_path):
    """A QDQ conv (DequantizeLinear of x and of the weight, Conv, QuantizeLinear) runs as the
    integer conv (rules conv_dequantized, conv_dequantized_bias), its dequantization, bias and
    requantization in the kernel's epilogue (fuse_requantize_conv, _bias): one int8 kernel per conv,
    no f32 conv, no separate quantize kernel after it, and the model input quantized by the first
    conv (conv_dequantized_bias_qa). Its output is within one step of the
    output's scale of onnxruntime's, literal and deployed (docs/precision.md's bound). (The rules'
    soundness: tests/test_soundness.py, as every built-in rule's.)"""
    f = tmp_path / "conv-qdq.onnx"
    model = _qdq_conv_model(f)
    assert {n.op_type for n in model.graph.node} >= {"QuantizeLinear", "DequantizeLinear", "Conv"}
    mod = eqfuse.compile(str(f))
    convs = [k for k in mod.kernels if k.kind == "contraction"]
    assert len(convs) == 2 and all(k.decisions.get("im2col") == 1 for k in convs)
    assert [mod.report["precision"][k.name]["precision"] for k in convs] == ["int8", "int8"]
    assert all("eqf_quantize(" in k.c_source for k in convs)  # (the requantization in each conv's epilogue)
    # the model input's QuantizeLinear in the first conv (conv_dequantized_bias_qa: quantize_a), no
    # quantize kernel of its own
    assert [k.decisions.get("quantize_a") for k in convs] == [1, 0]
    assert not any(k.kind == "pointwise" and "eqf_quantize(" in k.c_source for k in mod.kernels)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    (last,) = [n for n in model.graph.node if "y" in n.output]
    step = float(inits[last.input[1]])
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).standard_normal((1, 8, 12, 12)).astype(np.float32)}
        got = np.asarray(mod(**feeds))
        for want in (_literal(model, feeds)[0], _ort(model, feeds)[0]):
            assert np.max(np.abs(got - want)) <= step


def test_a_qdq_matmul_runs_on_the_integer_gemm_and_matches_onnxruntime(tmp_path):
    """A QDQ MatMul (rule matmul_dequantized) is one int8 GEMM kernel, its requantization in the
    epilogue (fuse_requantize), within one output step of onnxruntime (literal and deployed)."""
    h = onnx.helper
    rng = np.random.default_rng(13)
    w = (rng.standard_normal((24, 40)) * 0.2).astype(np.float32)
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g", [h.make_tensor_value_info("x", F32T, [3, 5, 24])],
                     [h.make_tensor_value_info("y", F32T, [3, 5, 40])], [onnx.numpy_helper.from_array(w, "w")])
    f32, f = tmp_path / "mm.onnx", tmp_path / "mm-qdq.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), str(f32))

    class Reader(quant.CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": rng.standard_normal((3, 5, 24)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.it, None)

    quant.quantize_static(str(f32), str(f), Reader(), quant_format=quant.QuantFormat.QDQ,
                          activation_type=quant.QuantType.QUInt8, weight_type=quant.QuantType.QInt8,
                          reduce_range=not ORT_EXACT_S8)
    model = onnx.load(str(f))
    mod = eqfuse.compile(str(f))
    (gemm,) = [k for k in mod.kernels if k.kind == "contraction"]
    assert mod.report["precision"][gemm.name]["precision"] == "int8" and "eqf_quantize(" in gemm.c_source
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    (last,) = [n for n in model.graph.node if "y" in n.output]
    step = float(inits[last.input[1]])
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).standard_normal((3, 5, 24)).astype(np.float32)}
        got = np.asarray(mod(**feeds))
        for want in (_literal(model, feeds)[0], _ort(model, feeds)[0]):
            assert np.max(np.abs(got - want)) <= step


def test_a_qdq_attention_matmul_runs_on_the_integer_gemm_and_matches_onnxruntime(tmp_path):
    """quantize_static's attention product q k^T of two activations with a batch of heads, k^T a
    Transpose of k (rule matmul_dequantized_batched): one batched int8 GEMM over the u8 heads, B
    read as u8, within one output step of onnxruntime (literal and deployed)."""
    h = onnx.helper
    rng = np.random.default_rng(17)
    g = h.make_graph([h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), h.make_node("MatMul", ["q", "kt"], ["y"])],
                     "att", [h.make_tensor_value_info("q", F32T, [1, 3, 12, 16]), h.make_tensor_value_info("k", F32T, [1, 3, 10, 16])],
                     [h.make_tensor_value_info("y", F32T, [1, 3, 12, 10])])
    f32, f = tmp_path / "att.onnx", tmp_path / "att-qdq.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), str(f32))

    def feeds(r):
        return {"q": r.standard_normal((1, 3, 12, 16)).astype(np.float32), "k": r.standard_normal((1, 3, 10, 16)).astype(np.float32)}

    class Reader(quant.CalibrationDataReader):
        def __init__(self):
            self.it = iter([feeds(rng) for _ in range(4)])

        def get_next(self):
            return next(self.it, None)

    quant.quantize_static(str(f32), str(f), Reader(), quant_format=quant.QuantFormat.QDQ,
                          activation_type=quant.QuantType.QUInt8, weight_type=quant.QuantType.QInt8)
    model = onnx.load(str(f))
    mod = eqfuse.compile(str(f))
    (gemm,) = [k for k in mod.kernels if k.kind == "contraction"]
    assert mod.report["precision"][gemm.name]["precision"] == "int8", mod.report["precision"]
    d = gemm.decisions
    assert (d["batch"], d["nbb"], d["M"], d["N"], d["K"], d["b_u8"]) == (3, 3, 12, 10, 16, 1), d
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    (last,) = [n for n in model.graph.node if "y" in n.output]
    step = float(inits[last.input[1]])
    for seed in range(3):
        x = feeds(np.random.default_rng(seed))
        got = np.asarray(mod(**x))
        for want in (_literal(model, x)[0], _ort(model, x)[0]):
            assert np.max(np.abs(got - want)) <= step


FAKE_QUANT_G = """
graph fq(a: u8[5, 32], w: i8[32, 67], az: u8, wz: i8, b: f32[67], z: u8, wi: i8[32, 67], zi: i8) -> (f32[5, 67], f32[5, 67]) {
    return dequantize_linear(quantize_linear(cast(matmul_integer(a, w, az, wz), to="f32") * 0.002, 0.05, z), 0.05, z) + b,
           dequantize_linear(quantize_linear(cast(matmul_integer(a, wi, az, wz), to="f32") * 0.001, 0.1, zi), 0.2, zi) * b
}
"""


def test_a_fake_quantization_inside_a_kernel_is_computed_in_floats_exactly():
    """dequantize_linear(quantize_linear(x)) inside one kernel (a QDQ model's requantized GEMM
    epilogue) dequantizes the float eqf_quantize returned (cexpr.Exprs), without the round trip
    through the integer type: the same bits as numpy's reference, u8 and i8, with ties and
    saturation at both ends."""
    rng = np.random.default_rng(5)
    a = rng.integers(0, 256, (5, 32)).astype(np.uint8)
    w, wi = (rng.integers(-128, 128, (32, 67)).astype(np.int8) for _ in range(2))
    w[:, :4] = 0  # (ties: sums of 0 around the zero point's own products)
    a[0] = 255
    w[:, 4:8], wi[:, 4:8] = 127, -128  # (saturation: far past both ends)
    b = rng.uniform(-2, 2, 67).astype(np.float32)
    args = (a, w, np.asarray(7, np.uint8), np.asarray(0, np.int8), b, np.asarray(40, np.uint8), wi, np.asarray(-3, np.int8))
    mod = eqfuse.compile(FAKE_QUANT_G)
    gemms = [k for k in mod.kernels if k.kind == "contraction"]
    assert len(gemms) == 2 and all("q - (float)(" in k.c_source for k in gemms), [k.body for k in mod.kernels]
    got, want = mod(*args), eqfuse.reference(FAKE_QUANT_G)(*args)
    for g, wv in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(wv))
    q = np.round(np.float32(0.001) * (a.astype(np.int32) - 7) @ wi.astype(np.int32) / np.float32(0.1)) - 3
    assert (q > 127).any() and (q < -128).any()  # (both ends saturate)


@pytest.mark.heavy  # (the fast tier's time)
def test_a_qdq_gemm_runs_on_the_integer_gemm_and_matches_onnxruntime(tmp_path):
    """A QDQ Gemm with transB=1 and a bias, as torch exports a Linear (rule gemm_dequantized): one
    int8 GEMM kernel reading the [N, K] weight transposed (plan b_transposed), no f32 matmul, within
    one output step of onnxruntime (literal and deployed): its u8 integers (the QuantizeLinear
    after it, exposed) differ by at most one."""
    h = onnx.helper
    rng = np.random.default_rng(17)
    w, b = (rng.standard_normal((40, 24)) * 0.2).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    g = h.make_graph([h.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], "g", [h.make_tensor_value_info("x", F32T, [6, 24])],
                     [h.make_tensor_value_info("y", F32T, [6, 40])], [onnx.numpy_helper.from_array(w, "w"),
                                                                       onnx.numpy_helper.from_array(b, "b")])
    f32, f = tmp_path / "gemm.onnx", tmp_path / "gemm-qdq.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), str(f32))
    _quantize_qdq_6x24(f32, f, rng)
    model = onnx.load(str(f))
    assert "Gemm" in {n.op_type for n in model.graph.node}
    (last,) = [n for n in model.graph.node if "y" in n.output]
    q = last.input[0]  # the Gemm's requantized u8 output, exposed
    exposed = _exposed(model, [q])
    onnx.save(exposed, str(tmp_path / "exposed.onnx"))
    mod = eqfuse.compile(str(tmp_path / "exposed.onnx"))
    (gemm,) = [k for k in mod.kernels if k.kind == "contraction"]
    assert mod.report["precision"][gemm.name]["precision"] == "int8" and gemm.decisions["b_transposed"]
    assert not any("matmul(" in k.body or " @ " in k.body for k in mod.kernels), [k.body for k in mod.kernels]
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    step = float(inits[last.input[1]])
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).standard_normal((6, 24)).astype(np.float32)}
        got = [np.asarray(o) for o in mod(**feeds)]
        for want in (_literal(exposed, feeds), _ort(exposed, feeds)):
            assert np.max(np.abs(got[0] - want[0])) <= step
            assert got[1].dtype == want[1].dtype == np.uint8
            assert np.max(np.abs(got[1].astype(np.int32) - want[1].astype(np.int32))) <= 1



def _quantize_qdq_6x24(f32, out, rng) -> None:
    """quantize_static (QDQ, u8 activations, s8 weights) of a model whose input x is [6, 24],
    calibrated on 4 draws of `rng`."""

    class Reader(quant.CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": rng.standard_normal((6, 24)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.it, None)

    quant.quantize_static(str(f32), str(out), Reader(), quant_format=quant.QuantFormat.QDQ,
                          activation_type=quant.QuantType.QUInt8, weight_type=quant.QuantType.QInt8,
                          reduce_range=not ORT_EXACT_S8)

def _qdq_linears(path):
    """x -> Gemm (transB, bias) -> Relu -> Gemm (transB, bias) as quantize_static writes it (QDQ):
    each bias a DequantizeLinear of an int32 initializer, each Gemm's output quantized (the Relu
    folded into the first QuantizeLinear), the last one dequantized as the model's output."""
    h = onnx.helper
    rng = np.random.default_rng(19)
    arrays = {"w1": rng.standard_normal((40, 24)) * 0.2, "b1": rng.standard_normal(40),
              "w2": rng.standard_normal((16, 40)) * 0.2, "b2": rng.standard_normal(16)}
    nodes = [h.make_node("Gemm", ["x", "w1", "b1"], ["g1"], transB=1), h.make_node("Relu", ["g1"], ["r1"]),
             h.make_node("Gemm", ["r1", "w2", "b2"], ["y"], transB=1)]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", F32T, [6, 24])], [h.make_tensor_value_info("y", F32T, [6, 16])],
                     [onnx.numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()])
    f32 = path.with_name("linears-f32.onnx")
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), str(f32))
    _quantize_qdq_6x24(f32, path, rng)
    return onnx.load(str(path))


@pytest.mark.heavy  # (the fast tier's time)
def test_a_qdq_gemm_with_bias_and_requantization_is_one_kernel(tmp_path):
    """A QDQ Gemm's bias (DequantizeLinear of int32) is folded at compile time (optimizer/fold.py)
    and its requantization joins the integer GEMM's epilogue (fuse_requantize_bias), as does the
    DequantizeLinear of the last one's output (fuse_dequantize_requantized_bias); the first one
    quantizes the model's input x into its own A buffer (gemm_dequantized_qa): the model runs as
    one int8 kernel per Gemm, nothing else. The first Gemm's u8 output (exposed) is within one of
    onnxruntime's integers, the model's output within one step of it (literal and deployed), as
    test_a_qdq_gemm_runs_on_the_integer_gemm_and_matches_onnxruntime."""
    f = tmp_path / "linears-qdq.onnx"
    model = _qdq_linears(f)
    biases = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith("b")]
    assert len(biases) == 2 and {n.op_type for n in model.graph.node} == {"QuantizeLinear", "DequantizeLinear", "Gemm"}
    (q1,) = [n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "r1"]
    exposed = _exposed(model, [q1])
    onnx.save(exposed, str(tmp_path / "exposed.onnx"))
    mod = eqfuse.compile(str(tmp_path / "exposed.onnx"))
    running = [k for k in mod.kernels if k.kind != "view"]
    assert [str(k.kind) for k in running] == ["contraction", "contraction"], [k.body for k in running]
    assert [k.decisions["quantize_a"] for k in running] == [1, 0]
    for k in running:  # (the requantization in the epilogue; the bias a bound f32 input)
        assert mod.report["precision"][k.name]["precision"] == "int8" and "eqf_quantize(" in k.c_source, k.body
        assert "quantize_linear(cast(matmul_integer(" in k.body and "_dq" in k.body, k.body
    assert sum("-> b" in n and "bound: computed once" in n for n in mod.report["folded"]) == 2, mod.report["folded"]
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    (last,) = [n for n in model.graph.node if "y" in n.output]
    step = float(inits[last.input[1]])
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).standard_normal((6, 24)).astype(np.float32)}
        got = [np.asarray(o) for o in mod(**feeds)]
        literal, deployed = _literal(exposed, feeds), _ort(exposed, feeds)
        own = float(np.max(np.abs(deployed[0] - literal[0])))
        for want, bound in ((literal, step), (deployed, step + own)):
            assert np.max(np.abs(got[0] - want[0])) <= bound
            assert got[1].dtype == want[1].dtype == np.uint8
            assert np.max(np.abs(got[1].astype(np.int32) - want[1].astype(np.int32))) <= 1


def _qattention_model(unidirectional: int, mask: tuple | None = None, past: tuple | None = None, S: int = 5,
                      present: bool = False, **attrs):
    """One QAttention node over x [2, S, 16] (4 heads), with a mask_index input m of shape `mask`,
    a past input of shape `past` (onnxruntime's is [2, 2, 4, past length, 4]) and, with a past or
    `present`, its second output, present."""
    return _qattention_graph([(unidirectional, mask, past, S, present, attrs)], suffix=False)


def _qattention_graph(cases, suffix: bool = True):
    """QAttention nodes side by side, one per case (unidirectional, mask shape, past shape, S,
    present, attributes), sharing the weights: node i reads x{i}, m{i}, past{i} and writes y{i},
    present{i} (without the index when not `suffix`)."""
    h = onnx.helper
    rng = np.random.default_rng(3)
    inits = [onnx.numpy_helper.from_array(rng.integers(-60, 60, (16, 48)).astype(np.int8), "w"),
             onnx.numpy_helper.from_array(rng.standard_normal(48).astype(np.float32), "b"),
             onnx.numpy_helper.from_array(np.array(0.05, np.float32), "xs"),
             onnx.numpy_helper.from_array(np.array(0.01, np.float32), "ws"),
             onnx.numpy_helper.from_array(np.array(120, np.uint8), "xz"),
             onnx.numpy_helper.from_array(np.array(0, np.int8), "wz")]
    inputs, outputs, nodes = [], [], []
    for i, (uni, mask, past, S, present, attrs) in enumerate(cases):
        x, m, pa, y, pr = (f"{n}{i}" if suffix else n for n in ("x", "m", "past", "y", "present"))
        inputs.append(h.make_tensor_value_info(x, U8, [2, S, 16]))
        if mask is not None:
            inputs.append(h.make_tensor_value_info(m, onnx.TensorProto.INT32, list(mask)))
        if past is not None:
            inputs.append(h.make_tensor_value_info(pa, F32T, list(past)))
        outs = [h.make_tensor_value_info(y, F32T, [2, S, 16])]
        if present or past is not None:
            outs.append(h.make_tensor_value_info(pr, F32T, None))
        outputs += outs
        nodes.append(h.make_node("QAttention", [x, "w", "b", "xs", "ws", m if mask else "", "xz", "wz"]
                                 + [pa] * (past is not None), [o.name for o in outs], domain="com.microsoft",
                                 num_heads=4, unidirectional=uni, name=f"qatt{i}" if suffix else "qatt", **attrs))
    g = h.make_graph(nodes, "g", inputs, outputs, inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])


@pytest.mark.heavy  # (a few seconds: the whole suite runs it, the fast tier not)
def test_qattention_is_the_integer_gemm_and_attention_and_matches_onnxruntime(tmp_path):
    """com.microsoft QAttention (without mask_index or past), with and without unidirectional: one
    int8 GEMM kernel (Q, K and V with their scale and bias) and one attention kernel, within the
    f32 rounding of the float tail (1e-5 * max|output|, as a dynamic model's) of onnxruntime."""
    outs = {}
    for uni in (0, 1):
        f = tmp_path / f"qatt{uni}.onnx"
        onnx.save(_qattention_model(uni), str(f))
        mod = eqfuse.compile(str(f))
        kinds = sorted(str(k.kind) for k in mod.kernels if k.kind != "view")
        assert kinds == ["attention", "contraction"], kinds
        (gemm,) = [k for k in mod.kernels if k.kind == "contraction"]
        assert mod.report["precision"][gemm.name]["precision"] == "int8"
        for seed in range(3):
            x = np.random.default_rng(seed).integers(0, 256, (2, 5, 16)).astype(np.uint8)
            (want,) = _ort(_qattention_model(uni), {"x": x})
            got = np.asarray(mod(x=x))
            assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want)), (uni, seed)
            outs[uni, seed] = want
    assert not np.allclose(outs[0, 0], outs[1, 0])  # (the causal mask changes the result)


# mask_index forms (onnxruntime's contrib op spec) and a value of each: every query keeps a key
# (a query whose keys are all masked attends to them at -10000 + score, where f32 keeps only
# about three digits of the score: the docstring below)
QATT_MASKS = {"key_padding": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32),
              "lengths": np.array([3, 5], np.int32),
              "ends_starts": np.array([4, 5, 1, 0], np.int32),
              "per_query": np.random.default_rng(1).integers(0, 2, (2, 5, 5)).astype(np.int32) | np.eye(5, dtype=np.int32),
              "dummy": np.array([[0], [1]], np.int32)}
QATT_CASES = [("lengths", 0), ("key_padding", 1)]  # (each form and each unidirectional once: the suite's time)
QATT_EXTENDED = [("key_padding", 0), ("lengths", 1), ("ends_starts", 0), ("per_query", 0), ("per_query", 1), ("dummy", 0)]


@pytest.mark.heavy  # (the fast tier's time)
@pytest.mark.parametrize("form, uni", QATT_CASES + [pytest.param(*c, marks=pytest.mark.extended) for c in QATT_EXTENDED],
                         ids=lambda p: str(p))
def test_qattention_with_a_mask_index_matches_onnxruntime(form, uni, tmp_path):
    """QAttention's mask_index as BERT exports with onnxruntime's transformer optimizer write it: the
    2-D 0/1 key padding mask [batch, sequence], 1-D key lengths [batch] (right padding), 1-D end and
    start positions [2 x batch], a 3-D mask [batch, sequence, sequence], the dummy [batch, 1]. The
    mask is where(keep, 0, mask_filter_value) added to the scores inside the attention kernel (one
    comparison kernel over the int32 mask before it), with unidirectional too; within the f32
    rounding of the float tail (1e-5 * max|output|), as the test without a mask. The masked scores
    do change the result."""
    m = QATT_MASKS[form]
    model = _qattention_model(uni, m.shape)
    f = tmp_path / "qatt-mask.onnx"
    onnx.save(model, str(f))
    mod = eqfuse.compile(str(f))
    kinds = sorted(str(k.kind) for k in mod.kernels if k.kind != "view")
    assert kinds == ["attention", "contraction"] + ["pointwise"] * (form != "dummy"), kinds
    (att,) = [k for k in mod.kernels if k.kind == "attention"]
    assert ("where(" in att.body) == (form != "dummy"), att.body
    for seed in range(2):
        x = np.random.default_rng(seed).integers(0, 256, (2, 5, 16)).astype(np.uint8)
        (want,) = _ort(model, {"x": x, "m": m})
        got = np.asarray(mod(x=x, m=m))
        assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want)), (form, uni, seed)
        (unmasked,) = _ort(_qattention_model(uni), {"x": x})
        assert np.allclose(want, unmasked) == (form == "dummy")


# QAttention with a past (onnxruntime's [2, batch, heads, P, head size]): (unidirectional, mask_index
# form over the P + S keys, P, S); every query keeps a key (QATT_MASKS' comment). The default
# set's second case asks for present without a past (the new keys and values alone); the extended
# set has the other mask forms and a decode step (S = 1; the live= test below has one too)
QATT_PAST_CASES = {"default": [(1, "key_padding", 3, 5), (1, None, None, 5)],
                   "forms": [(0, "lengths", 3, 5), (1, "per_query", 2, 5), (0, "ends_starts", 3, 5), (1, None, 6, 1)]}


def _qatt_past_mask(form: str, S: int, T: int) -> np.ndarray:
    rng = np.random.default_rng(T)
    if form == "key_padding":
        return np.array([[1] * (T - 2) + [0, 0], [1] * T], np.int32)
    if form == "lengths":
        return np.array([T - 3, T], np.int32)
    if form == "ends_starts":
        return np.array([T - 1, T, 1, 0], np.int32)
    m = rng.integers(0, 2, (2, S, T)).astype(np.int32)  # per query: each keeps its own (new) key
    m[:, np.arange(S), T - S + np.arange(S)] = 1
    return m


def _qatt_past_feeds(cases, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for i, (_, form, P, S) in enumerate(cases):
        feeds[f"x{i}"] = rng.integers(0, 256, (2, S, 16)).astype(np.uint8)
        if form is not None:
            feeds[f"m{i}"] = _qatt_past_mask(form, S, (P or 0) + S)
        if P is not None:
            feeds[f"past{i}"] = rng.standard_normal((2, 2, 4, P, 4)).astype(np.float32)
    return feeds


@pytest.fixture(scope="module", params=["default", pytest.param("forms", marks=pytest.mark.extended)])
def qatt_past(request, tmp_path_factory):
    """A set of QATT_PAST_CASES as one model (one QAttention node each), compiled once."""
    cases = QATT_PAST_CASES[request.param]
    model = _qattention_graph([(u, None if f is None else _qatt_past_mask(f, S, (P or 0) + S).shape,
                                None if P is None else (2, 2, 4, P, 4), S, True, {}) for u, f, P, S in cases])
    f = tmp_path_factory.mktemp("qatt_past") / "qatt-past.onnx"
    onnx.save(model, str(f))
    return cases, model, eqfuse.compile(str(f))


def test_qattention_with_a_past_matches_onnxruntime(qatt_past):
    """QAttention's past: the keys attended are the past's then the new ones (one concat along the
    sequence axis, which is the present output), with unidirectional=1 query i sees keys 0 .. P + i,
    and a mask_index covers the P + S keys, in its 1-D, 2-D and 3-D forms; a decode step (S = 1),
    and present without a past. Each node is still one integer GEMM and one attention kernel, and
    one layout kernel that writes present (the concat; without a past the new keys and values'
    head-split copy), a mask's comparison at most one pointwise kernel.
    output within the f32 rounding of the attention (1e-5 x max|output|, docs/precision.md), present
    within that of the dequantized keys and values (the same bound), its past rows copied exactly."""
    cases, model, mod = qatt_past
    running = [k for k in mod.kernels if k.kind != "view"]
    kinds = [str(k.kind) for k in running]
    n, masks = len(cases), sum(c[1] is not None for c in cases)
    assert (kinds.count("contraction"), kinds.count("attention"), kinds.count("layout")) == (n, n, n), kinds
    assert kinds.count("pointwise") <= masks and len(kinds) <= 3 * n + masks, [k.body for k in running]
    for seed in range(2):
        feeds = _qatt_past_feeds(cases, seed)
        want = dict(zip([o.name for o in model.graph.output], _ort(model, feeds)))
        got = dict(zip([o.name for o in model.graph.output], [np.asarray(o) for o in mod(**feeds)]))
        for i, (uni, form, P, S) in enumerate(cases):
            for o in (f"y{i}", f"present{i}"):
                assert got[o].shape == want[o].shape, (i, o)
                assert np.max(np.abs(got[o] - want[o])) <= 1e-5 * np.max(np.abs(want[o])), (i, o, seed)
            if P is not None:
                assert np.array_equal(got[f"present{i}"][:, :, :, :P], feeds[f"past{i}"])


@pytest.mark.heavy  # (a few seconds: the whole suite runs it, the fast tier not)
def test_qattention_past_as_a_live_kv_cache_matches_onnxruntime(tmp_path):
    """A QAttention whose past length is a named dim, compiled with live= (docs/generation.md): its
    one concat is an append into the caller's [2, batch, heads, C + S, head size] buffer, which the
    step returns as present, and its attention reads keys 0 .. t + S - 1 at the run-time length t:
    a decode step (S = 1, the decode attention) and a chunk (S = 5, the causal mask shifted by t,
    with a key padding mask_index over the capacity's keys). The rows past the live ones are NaN
    and never read; output within the f32 rounding of the attention (1e-5 x max|output|) of
    onnxruntime over the past of length t, present's live rows likewise."""
    C, seqs = 8, (1, 5)
    past = (2, 2, 4, "past", 4)
    model = _qattention_graph([(1, None, past, 1, True, {}), (1, (2, "total"), past, 5, True, {})])
    f = tmp_path / "qatt-live.onnx"
    onnx.save(model, str(f))
    step = eqfuse.compile(str(f), dims={"past": C, "total": C + 5}, live="past")
    lives = [k.decisions.get("live") for k in step.kernels if k.kind in ("layout", "attention")]
    assert lives == [f"{w} at run time: live + {S} of {C + S} rows" for S in seqs for w in ("append", "keys")], lives
    assert [k.decisions["decode"] for k in step.kernels if k.kind == "attention"] == [1, 0]
    rng = np.random.default_rng(0)
    bufs = [np.full((2, 2, 4, C + S, 4), np.nan, np.float32) for S in seqs]
    for t in (0, 3, C):
        feeds, live = {"m1": np.ones((2, t + 5), np.int32)}, {}
        feeds["m1"][0, t + 3:] = 0
        feeds["m1"][1, 0] = 0
        live["m1"] = np.concatenate([feeds["m1"], np.zeros((2, C - t), np.int32)], axis=1)
        for i, S in enumerate(seqs):
            feeds[f"x{i}"] = live[f"x{i}"] = rng.integers(0, 256, (2, S, 16)).astype(np.uint8)
            feeds[f"past{i}"] = rng.standard_normal((2, 2, 4, t, 4)).astype(np.float32)
            bufs[i][:, :, :, :t] = feeds[f"past{i}"]
            live[f"past{i}"] = bufs[i]
        want = _ort(model, feeds)
        got = step(**live, past_length=np.array([t]))
        for i, S in enumerate(seqs):
            y, present = np.asarray(got[2 * i]), np.asarray(got[2 * i + 1])
            assert np.shares_memory(present, bufs[i])
            assert np.max(np.abs(y - want[2 * i])) <= 1e-5 * np.max(np.abs(want[2 * i])), (t, S)
            wp = want[2 * i + 1]
            assert np.max(np.abs(present[:, :, :, :t + S] - wp)) <= 1e-5 * np.max(np.abs(wp)), (t, S)


@pytest.mark.extended
def test_qattention_with_named_dims_is_bound_per_call(tmp_path):
    """Without dims= a named past length (and sequence, and mask_index length) is bound per call
    (runtime.padded), the named batch kept by the compiled graph; with a key padding mask_index and
    unidirectional=1, and a 1-D lengths mask_index of the named batch."""
    for mask in ((2, "total"), (2,)):
        model = _qattention_model(1, mask=mask, past=(2, 2, 4, "past", 4))
        g = model.graph
        for v, axes in ((g.input[0], (0, 1)), (g.input[1], (0,)), (g.input[2], (1,)), (g.output[0], (0, 1))):
            for a in axes:
                v.type.tensor_type.shape.dim[a].dim_param = ("batch", "sequence")[a if v.name in ("x", "y") else 0]
        f = tmp_path / "qatt-named.onnx"
        onnx.save(model, str(f))
        mod = eqfuse.compile(str(f))
        for B, S, P in ((2, 5, 3), (1, 1, 6), (3, 4, 2)):
            rng = np.random.default_rng(P)
            m = np.full(B, P + S - 1, np.int32)  # (the last key masked in batch 0, or in each)
            if len(mask) == 2:
                m = (np.arange(P + S) < np.where(np.arange(B) == 0, P + S - 1, P + S)[:, None]).astype(np.int32)
            feeds = {"x": rng.integers(0, 256, (B, S, 16)).astype(np.uint8), "m": m,
                     "past": rng.standard_normal((2, B, 4, P, 4)).astype(np.float32)}
            for got, want in zip(mod(**feeds), _ort(model, feeds)):
                assert np.asarray(got).shape == want.shape
                assert np.max(np.abs(np.asarray(got) - want)) <= 1e-5 * np.max(np.abs(want)), (mask, B, S, P)


@pytest.mark.parametrize("past, message", [((2, 2, 4, 3), "past of shape [2, 2, 4, 3]"),
                                           ((2, 2, 4, 3, 8), "past of shape [2, 2, 4, 3, 8]"),
                                           ((1, 2, 4, 3, 4), "past of shape [1, 2, 4, 3, 4]")])
def test_qattention_with_a_past_of_the_wrong_shape_is_refused_by_name(past, message, tmp_path, capsys):
    """A past that is not [2, batch, num_heads, past length, head size]: one message naming the node
    and the shape onnxruntime's past has, exit 2."""
    from eqfuse.cli.main import main

    f = tmp_path / "qatt-bad-past.onnx"
    onnx.save(_qattention_model(0, past=past), str(f))
    assert main(["opt", str(f)]) == 2
    err = capsys.readouterr().err
    assert "qatt" in err and message in err and "[2, batch, num_heads, past length, head size]" in err, err
    assert "[2, 2, 4, P, 4]" in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2, err


@pytest.mark.parametrize("what, message", [("mask4d", "mask_index of shape [2, 1, 5, 5]"),
                                           ("shared", "past_present_share_buffer=1")])
def test_qattention_with_an_unknown_mask_form_or_a_shared_past_buffer_is_refused_by_name(what, message, tmp_path, capsys):
    from eqfuse.cli.main import main

    f = tmp_path / "qatt-refused.onnx"
    onnx.save(_qattention_model(0, mask=(2, 1, 5, 5) if what == "mask4d" else None,
                                past=(2, 2, 4, 3, 4) if what == "shared" else None,
                                **({"past_present_share_buffer": 1} if what == "shared" else {})), str(f))
    assert main(["opt", str(f)]) == 2
    err = capsys.readouterr().err
    assert "qatt" in err and message in err and "Traceback" not in err, err


@pytest.mark.heavy  # (a conv of 50,176 taps a pixel)
def test_an_integer_conv_of_many_k_groups_reads_them_through_its_offset_table():
    """A conv read in place (direct_x) finds each K-group in x's padded copy through a table filled
    once, at its first call (koff, csrc_templates/gemm_u8s8.c): 1,024 channels by 7 x 7 taps,
    12,544 K-groups of four channels, a table larger than a thread's stack would hold well, at 1
    and 2 threads against numpy."""
    rng = np.random.default_rng(13)
    x = {"x": rng.integers(0, 256, (1, 1024, 8, 8)).astype(np.uint8), "w": rng.integers(-128, 128, (16, 1024, 7, 7)).astype(np.int8),
         "xz": np.asarray(131, np.uint8), "wz": np.asarray(3, np.int8)}
    src = ("graph big(x: u8[1, 1024, 8, 8], w: i8[16, 1024, 7, 7], xz: u8, wz: i8) {\n"
           "  return conv_integer(x, w, xz, wz, padding=3)\n}\n")
    mod = eqfuse.compile(src)
    (conv,) = [k for k in mod.kernels if k.kind == "contraction"]
    assert conv.decisions["direct_x"] and conv.decisions["ch4"], conv.decisions
    want = OPS["conv_integer"].numpy([x["x"], x["w"], x["xz"], x["wz"]], {"stride": 1, "padding": 3, "dilation": 1, "group": 1})
    for threads in (1, 2):
        mod.default.threads = threads
        got = mod(**x)
        assert got.dtype == np.int32 and np.array_equal(got, want), threads
