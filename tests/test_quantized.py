"""Quantized ONNX models as onnxruntime's own quantizers write them load in eqfuse and match
onnxruntime on the same quantized file.

An MLP and a tiny BERT-like encoder are exported from torch, quantized with
onnxruntime.quantization (quantize_dynamic: DynamicQuantizeLinear + MatMulInteger with int8 weights;
quantize_static: QuantizeLinear / DequantizeLinear pairs around the MatMuls, u8 activations, i8
weights), compiled with eqfuse.compile and run beside onnxruntime. The bounds:
  - every QuantizeLinear / DynamicQuantizeLinear output (and its scale and zero point) equal,
    integer for integer, node by node (each exposed as a graph output of the quantized file);
  - QDQ models: the float output within one quantization step, |diff| <= the scale of the last
    quantized tensor before the output (a value one rounding apart at that tensor moves the output
    by at most one step; the layers after it are float);
  - dynamic models: the float output within one quantization step of the output, |diff| <=
    x_scale * w_scale * sum|...| is not needed: the integers are exact, so the outputs differ only by
    f32 rounding of the float tail, bounded here by 1e-5 * max|output| + the smallest output scale.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
quant = pytest.importorskip("onnxruntime.quantization")

import eqfuse  # noqa: E402
from eqfuse.frontend.onnx_import import onnx_params  # noqa: E402


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


SHAPES = {"mlp": (8, 32), "bert": (2, 8, 32)}


def _export(name, path):
    torch.manual_seed(0)
    model = (MLP() if name == "mlp" else TinyBert()).eval()
    x = torch.randn(*SHAPES[name])
    torch.onnx.export(model, (x,), str(path), input_names=["x"], output_names=["y"], opset_version=17, dynamo=False)


class _Reader(quant.CalibrationDataReader):
    """A few random batches of the model's input shape (the calibration of quantize_static)."""

    def __init__(self, shape):
        rng = np.random.default_rng(1)
        self.batches = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)])

    def get_next(self):
        return next(self.batches, None)


@pytest.fixture(scope="module", params=[("mlp", "dynamic"), ("mlp", "static"), ("bert", "dynamic"), ("bert", "static")],
                ids=lambda p: "-".join(p))
def quantized(request, tmp_path_factory):
    name, how = request.param
    d = tmp_path_factory.mktemp(f"{name}_{how}")
    f32, q = d / "f32.onnx", d / "q.onnx"
    _export(name, f32)
    if how == "dynamic":
        quant.quantize_dynamic(str(f32), str(q), weight_type=quant.QuantType.QInt8, op_types_to_quantize=["MatMul"])
    else:
        quant.quantize_static(str(f32), str(q), _Reader(SHAPES[name]), quant_format=quant.QuantFormat.QDQ,
                              activation_type=quant.QuantType.QUInt8, weight_type=quant.QuantType.QInt8)
    return name, how, onnx.load(str(q)), q


def _ort(model, x):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})


def _inputs(name, seed):
    return np.random.default_rng(seed).standard_normal(SHAPES[name]).astype(np.float32)


def _exposed(model, names):
    """The model with the tensors `names` added as graph outputs."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.value_info[:]
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)
    return m


def _one_node(model, node, x):
    """A model of the one node: its float input a graph input of x's shape, its scale and zero
    point the quantized file's initializers."""
    inits = [i for i in model.graph.initializer if i.name in node.input[1:]]
    g = onnx.helper.make_graph([node], "node", [onnx.helper.make_tensor_value_info(node.input[0], onnx.TensorProto.FLOAT, x.shape)],
                               [onnx.ValueInfoProto(name=o) for o in node.output if o], inits)
    return onnx.helper.make_model(g, opset_imports=list(model.opset_import))


def test_quantized_model_matches_onnxruntime(quantized):
    name, how, model, path = quantized
    ops = {n.op_type for n in model.graph.node}
    assert ({"DynamicQuantizeLinear", "MatMulInteger"} if how == "dynamic" else {"QuantizeLinear", "DequantizeLinear"}) <= ops
    module = eqfuse.compile(str(path))
    for seed in range(3):
        x = _inputs(name, seed)
        (want,) = _ort(model, x)
        got = module(x)
        got = got[0] if isinstance(got, (list, tuple)) else got
        assert got.shape == want.shape
        if how == "static":
            # one quantization step of the last quantized tensor before the output
            last = [n for n in model.graph.node if n.op_type == "DequantizeLinear"][-1]
            inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
            step = float(np.max(inits[last.input[1]]))
            bound = step * (1 + 1e-3)
        else:
            bound = 1e-5 * float(np.max(np.abs(want))) + 1e-6
        diff = float(np.max(np.abs(got - want)))
        assert diff <= bound, f"{name} {how} seed {seed}: max|diff| {diff} > {bound}"


def test_every_quantize_node_matches_onnxruntime_integer_for_integer(quantized, tmp_path):
    """Node by node: each QuantizeLinear / DynamicQuantizeLinear fed onnxruntime's own float input
    (exposed as an output of the quantized model), its outputs (integers, and the dynamic scale and
    zero point) equal in eqfuse's reference, in eqfuse's compiled C and in onnxruntime. Fed the same
    floats, not eqfuse's: the float ops before a node (layernorm, softmax) round differently by an ulp,
    which may move a value across a rounding boundary."""
    name, how, model, path = quantized
    nodes = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DynamicQuantizeLinear")]
    assert nodes
    exposed = _exposed(model, [n.input[0] for n in nodes])
    for seed in range(2):
        floats = dict(zip([o.name for o in exposed.graph.output], _ort(exposed, _inputs(name, seed))))
        for k, node in enumerate(nodes):
            x = floats[node.input[0]]
            one = _one_node(model, node, x)
            f = tmp_path / f"node{k}.onnx"
            onnx.save(one, str(f))
            s = ort.InferenceSession(one.SerializeToString(), providers=["CPUExecutionProvider"])
            want = s.run(None, {node.input[0]: x})
            ref = eqfuse.reference(str(f))
            got_ref = ref(**{ref.default.params[0][0]: x}, **onnx_params(str(f)))
            got_c = eqfuse.compile(str(f))(x)
            for got in (got_ref, got_c):
                got = got if isinstance(got, (list, tuple)) else [got]
                assert len(got) == len(want)
                for w, g in zip(want, got):
                    g = np.asarray(g)
                    assert g.dtype == w.dtype and g.shape == w.shape, node.name
                    assert np.array_equal(g, w), f"{node.name}: {int(np.sum(g != w))} of {w.size} differ"
