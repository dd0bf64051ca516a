"""Quantized ONNX models as onnxruntime's own quantizers write them load in eqfuse and match
onnxruntime on the same quantized file.

An MLP and a tiny BERT-like encoder are exported from torch, quantized with
onnxruntime.quantization (quantize_dynamic: DynamicQuantizeLinear + MatMulInteger with int8 weights;
quantize_static: QuantizeLinear / DequantizeLinear pairs around the MatMuls, u8 activations, i8
weights), compiled with eqfuse.compile and run beside onnxruntime on the same file. onnxruntime runs
it twice: literally (graph optimizations off: each QDQ node as written, the file's meaning) and as
deployed (its default optimizations fuse QDQ groups into integer kernels that requantize once,
which rounds differently from the file's float steps). The bounds:
  - every QuantizeLinear / DynamicQuantizeLinear node, fed onnxruntime's float input, gives the
    same integers (and the same dynamic scale and zero point) in eqfuse's reference, eqfuse's C
    and onnxruntime;
  - whole model against the literal run: |diff| <= one quantization step of the output (QDQ: the
    scale of the output's DequantizeLinear; dynamic: the output is float after exact integer
    matmuls, so the step is the f32 rounding of the float tail, 1e-5 * max|output|);
  - whole model against the deployed run: that bound plus onnxruntime's own deviation between its
    two runs on the same input (its fused integer kernels' rounding, not eqfuse's).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
quant = pytest.importorskip("onnxruntime.quantization")

import eqfuse  # noqa: E402
from eqfuse.backend.kinds.contraction import qgemm  # noqa: E402
from eqfuse.frontend.onnx_import import onnx_params  # noqa: E402
from eqfuse.machine import machine  # noqa: E402
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


# The BERT-like encoder's two quantizations run in the extended tier (-m extended, a step of
# .ci/run): exporting, calibrating and compiling it would take the whole suite past its budget.
@pytest.fixture(scope="module", params=[("mlp", "dynamic"), ("mlp", "static"),
                                        pytest.param(("bert", "dynamic"), marks=pytest.mark.extended),
                                        pytest.param(("bert", "static"), marks=pytest.mark.extended)],
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


def _literal(model, x):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})


def test_quantized_model_matches_onnxruntime(quantized):
    name, how, model, path = quantized
    ops = {n.op_type for n in model.graph.node}
    assert ({"DynamicQuantizeLinear", "MatMulInteger"} if how == "dynamic" else {"QuantizeLinear", "DequantizeLinear"}) <= ops
    module = eqfuse.compile(str(path))
    if how == "dynamic":  # each MatMulInteger one integer GEMM, on this machine's instruction path
        int8 = [v["path"] for v in module.report["precision"].values() if v["precision"] == "int8"]
        assert int8 == [qgemm.int8_path(machine())] * sum(n.op_type == "MatMulInteger" for n in model.graph.node)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    for seed in range(3):
        x = _inputs(name, seed)
        (literal,), (deployed,) = _literal(model, x), _ort(model, x)
        got = module(x)
        got = got[0] if isinstance(got, (list, tuple)) else got
        assert got.shape == literal.shape
        if how == "static":
            (last,) = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and model.graph.output[0].name in n.output]
            step = float(np.max(inits[last.input[1]]))
        else:
            step = 1e-5 * float(np.max(np.abs(literal)))
        diff = float(np.max(np.abs(got - literal)))
        assert diff <= step, f"{name} {how} seed {seed}: max|diff| {diff} > one step {step} (literal run)"
        own = float(np.max(np.abs(deployed - literal)))
        diff = float(np.max(np.abs(got - deployed)))
        assert diff <= step + own, f"{name} {how} seed {seed}: max|diff| {diff} > {step} + {own} (deployed run)"


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


def test_every_integer_matmul_node_matches_onnxruntime_integer_for_integer(quantized, tmp_path):
    """Node by node: each MatMulInteger fed onnxruntime's own u8 activations and zero point (exposed
    as outputs of the quantized model) gives onnxruntime's int32 sums exactly in eqfuse's compiled
    u8 x s8 GEMM (its weight an initializer, so bound and prepacked with its column sums)."""
    name, how, model, path = quantized
    nodes = [n for n in model.graph.node if n.op_type == "MatMulInteger"]
    if how != "dynamic":
        pytest.skip("quantize_static writes QDQ pairs around MatMul, no MatMulInteger")
    inits = {i.name: i for i in model.graph.initializer}
    runtime = [x for n in nodes for x in n.input if x and x not in inits]
    exposed = _exposed(model, runtime)
    values = dict(zip([o.name for o in exposed.graph.output], _ort(exposed, _inputs(name, 0))))
    # the nodes side by side in one model (one compile): their activations and zero points inputs
    feeds = {x: values[x] for x in dict.fromkeys(runtime)}
    ins = [onnx.helper.make_tensor_value_info(x, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for x, v in feeds.items()]
    g = onnx.helper.make_graph(nodes, "mmi", ins, [onnx.ValueInfoProto(name=n.output[0]) for n in nodes],
                               [inits[x] for n in nodes for x in n.input if x in inits])
    one = onnx.helper.make_model(g, opset_imports=list(model.opset_import))
    f = tmp_path / "mmi.onnx"
    onnx.save(one, str(f))
    want = ort.InferenceSession(one.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    mod = eqfuse.compile(str(f))
    got = mod(*feeds.values())
    assert [(p.precision, p.prepack is not None) for p in mod.default.last.plans] == [("int8", True)] * len(nodes)
    for n, w, g_ in zip(nodes, want, got):
        assert g_.dtype == w.dtype == np.int32 and np.array_equal(g_, w), n.name


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
    want = _ort(model, x)
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

    name, how, model, path = quantized
    assert main(["opt", str(path)]) == 0
    text = capsys.readouterr().out
    assert "u8" in text and "i8" in text and "quantize_linear(" in text
    if (name, how) == ("mlp", "dynamic"):  # the dequantization, bias and activation in the integer GEMM's kernel
        assert re.search(r"kernel \{ relu\(cast\(matmul_integer\(\w+, \w+, \w+, \w+\), to=\"f32\"\) \* \(\w+ \* [0-9.e-]+\) "
                         r"\+ \w+\) \}", text), text
    g = tmp_path / "q.g"
    g.write_text(text)
    assert list(eqfuse.reference(str(g)).graphs)


# ------------------------------------------------------------------ the integer GEMM's instruction paths

# Odd shapes (K not a multiple of 4, M and N not multiples of any tile, N below the narrowest
# tile), each operand type, a zero point per column, a batched B read per call, one B bound by
# params= (packed once, with its column sums), one deep enough for K blocks (partial sums kept
# between them) and large enough to share its panels among threads, and an int32 result next to
# a dequantized one: all in one module per path.
INTEGER_GEMMS = """
graph ig(a: u8[7, 37], b: i8[37, 53], az: u8, bz: i8, s: i8[13, 5], t: u8[5, 70], sz: i8, tz: u8[70],
         c: u8[2, 33, 130], d: i8[2, 130, 7], cz: u8, dz: i8, e: u8[40, 1101], f: i8[1101, 70],
         w: i8[37, 53], sc: f32[53], bias: f32[53]) {
    return matmul_integer(a, b, az, bz), matmul_integer(s, t, sz, tz), matmul_integer(c, d, cz, dz),
           matmul_integer(e, f, az, bz), relu(cast(matmul_integer(a, w, az, bz), to="f32") * sc + bias)
}
"""


@pytest.fixture(params=["avx512_vnni", "avx_vnni", "fallback", pytest.param("fallback_scalar", marks=pytest.mark.extended)])
def int8_path(request):
    """Plans for a machine with that path: AVX512_VNNI, AVX-VNNI (ymm), plain AVX2 (the vpmaddwd
    fallback) or below AVX2 (plain C). The machine model is pinned, so the fallbacks run here too."""
    import dataclasses

    from eqfuse import machine

    m, host = machine.machine(), machine.host_isa()
    lanes = {"avx512_vnni": 16, "avx_vnni": 8, "fallback": 8, "fallback_scalar": 4}[request.param]
    if request.param in host and not host[request.param]:
        pytest.skip(f"this CPU has no {request.param.upper().replace('_', '-') if request.param == 'avx_vnni' else 'AVX512_VNNI'} "
                    f"(cpuinfo flag {request.param}): the {request.param} path cannot run here")
    if m.simd_floats < lanes:
        pytest.skip(f"this CPU's vectors hold {m.simd_floats} floats: the {request.param} path needs {lanes}")
    model = dataclasses.replace(m, simd_floats=lanes, avx512_vnni=request.param == "avx512_vnni",
                                avx_vnni=request.param == "avx_vnni")
    with machine.pinned(model):
        yield request.param


def test_the_integer_gemm_is_exact_on_every_path(int8_path):
    rng = np.random.default_rng(3)
    u8 = lambda *s: rng.integers(0, 256, s).astype(np.uint8)  # noqa: E731
    i8 = lambda *s: rng.integers(-128, 128, s).astype(np.int8)  # noqa: E731
    x = {"a": u8(7, 37), "b": i8(37, 53), "az": np.asarray(131, np.uint8), "bz": np.asarray(-3, np.int8),
         "s": i8(13, 5), "t": u8(5, 70), "sz": np.asarray(-77, np.int8), "tz": u8(70),
         "c": u8(2, 33, 130), "d": i8(2, 130, 7), "cz": np.asarray(0, np.uint8), "dz": np.asarray(0, np.int8),
         "e": u8(40, 1101), "f": i8(1101, 70),
         "sc": rng.uniform(1e-4, 1e-3, 53).astype(np.float32), "bias": rng.standard_normal(53).astype(np.float32)}
    x["w"] = x["b"].copy()
    mod = eqfuse.compile(INTEGER_GEMMS, params={"w": x["w"]})
    plans = [p for p in mod.default.last.plans if p.kind == "contraction"]
    assert len(plans) == 5 and {(p.precision, p.precision_path) for p in plans} == {("int8", int8_path)}
    assert sum(p.prepack is not None for p in plans) == 1 and sum(p.detail.parallel for p in plans) == 1
    assert sum(p.tiles["kc"] < p.detail.K for p in plans) == 1
    for k in mod.kernels:  # the plan is what runs: its tiles are the constants of the C
        if k.kind == "contraction":
            assert all(re.search(rf"#define \w+_{t.upper()} {v}L?\b", k.c_source) for t, v in k.tiles.items()), k.name
    text = uops_text(INTEGER_GEMMS)  # (eqfuse lower)
    assert text.count(f"precision: int8, path: {int8_path}") == 5 and "kc=" in text
    got = mod(**{k: v for k, v in x.items() if k != "w"})
    exact = lambda p, q, pz, qz: np.matmul(p.astype(np.int64) - np.int64(pz), q.astype(np.int64) - qz.astype(np.int64))  # noqa: E731
    want = [exact(x["a"], x["b"], x["az"], x["bz"]), exact(x["s"], x["t"], x["sz"], x["tz"]),
            exact(x["c"], x["d"], x["cz"], x["dz"]), exact(x["e"], x["f"], x["az"], x["bz"])]
    for g, w in zip(got[:4], want):
        assert g.dtype == np.int32 and np.array_equal(g.astype(np.int64), w)
    # the epilogue in f32 on the exact sum: the product and the add round once each (or once, fused
    # into an FMA), so |got - exact| <= 2^-24 (|acc sc| + |acc sc + bias|), relu being 1-Lipschitz
    prod = want[0] * x["sc"].astype(np.float64)
    z = prod + x["bias"]
    assert np.all(np.abs(got[4] - np.maximum(z, 0)) <= 2.0**-24 * (np.abs(prod) + np.abs(z)))


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
             numpy_helper.from_array(rng.integers(-128, 128, (K, N)).astype(np.int8), "b"),
             numpy_helper.from_array(np.asarray(0.004, np.float32), "bs"),
             numpy_helper.from_array(rng.uniform(0.001, 0.01, N).astype(np.float32), "bsc"),
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
    assert sorted(want) == sorted(k.name for k in gemms) and len(gemms) == 5
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
