"""sin, cos, sign, ceil and floor end to end: the compiled C against numpy, the ONNX import
against onnxruntime, and torch.compile (with Tensor.repeat) against eager. Rotary embeddings take
sin and cos of angles in the thousands, DeBERTa-v2's position buckets sign and ceil."""

import numpy as np
import pytest

import eqfuse

RNG = np.random.default_rng(11)

GRAPH = """
graph trig(x: f32[6, 40], t: f32[6, 40]) -> (f32[6, 40], f32[6, 40], f32[6, 40]) {
    return kernel { sin(t) * x + cos(t) }, kernel { sign(x) * ceil(x * 3) }, kernel { floor(x * 3) - sign(-x) }
}
"""


def _inputs():
    x = RNG.standard_normal((6, 40)).astype(np.float32)
    x[0, :6] = [0.0, -0.0, np.nan, np.inf, -np.inf, 1.0]  # sign's 0 and NaN; ceil/floor keep inf
    x[1, :4] = [-2.0, 2.0, -0.5, 0.5]  # integers and halves: exact in x * 3
    t = (RNG.uniform(-1, 1, (6, 40)) * 4096).astype(np.float32)  # rotary angles: position x frequency
    return x, t


def test_compiled_c_matches_numpy():
    x, t = _inputs()
    a, b, c = eqfuse.compile(GRAPH)(x, t)
    np.testing.assert_allclose(a, np.sin(t) * x + np.cos(t), rtol=1e-5, atol=1e-5)
    with np.errstate(invalid="ignore"):
        want_b = np.sign(x) * np.ceil(x * np.float32(3))
        want_c = np.floor(x * np.float32(3)) - np.sign(-x)
    np.testing.assert_array_equal(b, want_b)  # NaN where numpy's is NaN, exact elsewhere
    np.testing.assert_array_equal(c, want_c)
    assert np.isnan(b[0, 2]) and b[0, 0] == 0 and b[0, 3] == np.inf


def test_sign_of_integers_keeps_the_dtype():
    m = eqfuse.compile("graph s(i: i64[7]) -> i64[7] { return kernel { sign(i) * 5 } }")
    i = np.array([-(2 ** 40), -3, -1, 0, 1, 2, 2 ** 40], np.int64)
    got = m(i)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, np.sign(i) * 5)


@pytest.mark.parametrize("op", ["Sin", "Cos", "Sign", "Ceil", "Floor"])
def test_onnx_import_matches_onnxruntime(op, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Mul", ["x", "s"], ["xs"]), helper.make_node(op, ["xs"], ["y"])]
    g = helper.make_graph(nodes, op.lower(), [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 8])],
                          [helper.make_tensor("s", TensorProto.FLOAT, [], [2.5])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / f"{op}.onnx"
    onnx.save(model, str(path))
    x = (RNG.standard_normal((5, 8)) * 4).astype(np.float32)
    x[0, :3] = [0.0, 0.4, -0.4]  # 0 and 2.5 x = +-1 exactly: sign's 0 and the rounding edges
    want = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    got = eqfuse.compile(str(path))(x)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.heavy  # (the fast tier's time)
def test_torch_compile_runs_sin_cos_sign_ceil_and_repeat_in_eqfuse():
    torch = pytest.importorskip("torch")
    from eqfuse import torch_backend
    from eqfuse.torch_backend import REPORTS

    class Model(torch.nn.Module):
        def forward(self, x, pos):
            ang = pos[:, None].float() * torch.tensor([1.0, 0.1, 0.01, 0.001])  # rotary-style angles
            emb = torch.cat([ang, ang], dim=-1)
            rot = x * emb.cos() + torch.cat([-x[..., 4:], x[..., :4]], dim=-1) * emb.sin()  # rotate_half
            rel = pos[:, None] - pos[None, :]  # int64: sign keeps it an integer
            bucket = torch.ceil(torch.log(rel.abs().float() + 1) * 2.5) * torch.sign(rel)
            return rot.repeat(2, 1, 3), bucket.repeat(3, 1), torch.sign(rel).repeat(1, 2)

    torch_backend.register()
    torch._dynamo.reset()
    del REPORTS[:]
    try:
        x, pos = torch.randn(2, 16, 8), torch.arange(0, 3200, 200)
        model = Model()
        compiled = torch.compile(model, backend="eqfuse")
        with torch.no_grad():
            got, want = compiled(x, pos), model(x, pos)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
        assert REPORTS and all(r.partitions for r in REPORTS), "eqfuse computed nothing"
        left = {op for r in REPORTS for op, _ in r.fallbacks}
        assert not left, left  # sin, cos, sign, ceil and repeat all ran in eqfuse
    finally:
        torch._dynamo.reset()
