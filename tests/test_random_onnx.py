"""Random ONNX graphs from hypothesis, compiled from the file and run against onnxruntime on the
same file: the importer's reading of each op's attributes and inputs (negative axes and indices,
broadcasting, steps, keepdims, pad modes' constant value) together with the kernels, where a
test of one op at a time checks one reading at a time."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extras: pip install '.[test]'")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import eqfuse  # noqa: E402

F = TensorProto.FLOAT
SIZES = [1, 3, 8]  # (8: a vector's width; convs and pools take what these give)
UNARY = ["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Erf", "Softplus"]
BINARY = ["Add", "Sub", "Mul", "Max", "Min"]


@st.composite
def random_onnx(draw):
    """(model bytes, input shape): a chain of 1 to 5 ops over one f32 input of rank 1 to 4, each
    op's operand drawn from the values so far, its constants (initializers) of the shapes it
    needs."""
    shape = tuple(draw(st.sampled_from(SIZES)) for _ in range(draw(st.integers(1, 4))))
    vals = {"x": shape}
    nodes, inits = [], []
    rng = np.random.default_rng(draw(st.integers(0, 1000)))

    def const(arr) -> str:
        name = f"c{len(inits)}"
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    for i in range(draw(st.integers(1, 5))):
        x = draw(st.sampled_from(sorted(vals)))
        s = vals[x]
        r = len(s)
        out = f"v{i}"
        ax = draw(st.integers(-r, r - 1))
        a = ax % r
        kind = draw(st.sampled_from(["unary", "binary", "binary", "transpose", "slice", "concat", "pad", "reduce",
                                     "softmax", "gather", "unsqueeze", "reshape", "expand", "where", "matmul",
                                     "layernorm", "clip", "cumsum", "tile", "split", "conv", "conv", "pool", "gemm",
                                     "variadic", "div", "pow", "squeeze", "flatten", "gather_elements", "argmax",
                                     "batchnorm", "instancenorm", "activation", "trilu", "bmm", "topk"]))
        if kind == "unary":
            nodes.append(helper.make_node(draw(st.sampled_from(UNARY)), [x], [out]))
            t = s
        elif kind == "binary":  # the other operand broadcast: a trailing part of s with some ones
            k = draw(st.integers(0, r))
            other = tuple(1 if draw(st.booleans()) else d for d in s[r - k:])
            y = draw(st.sampled_from([v for v, vs in vals.items() if vs == s] + [None]))
            operand = y if y and draw(st.booleans()) else const(rng.standard_normal(other).astype(np.float32))
            pair = [x, operand] if draw(st.booleans()) else [operand, x]
            nodes.append(helper.make_node(draw(st.sampled_from(BINARY)), pair, [out]))
            t = s
        elif kind == "transpose":
            perm = list(draw(st.permutations(range(r))))
            nodes.append(helper.make_node("Transpose", [x], [out], perm=perm))
            t = tuple(s[p] for p in perm)
        elif kind == "slice":
            step = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
            n = s[a]
            if step > 0:
                start = draw(st.integers(-n, n - 1))
                stop = draw(st.integers((start % n) + 1, n + 2))
            else:
                start = draw(st.integers(-1, n - 1))
                stop = draw(st.sampled_from([-n - 5, -(n + 1) if n > 1 else -n - 5]))
            got = len(range(*slice(start, stop, step).indices(n)))
            if got == 0:
                continue
            nodes.append(helper.make_node("Slice", [x, const([start]), const([stop]), const([ax]), const([step])],
                                          [out]))
            t = s[:a] + (got,) + s[a + 1:]
        elif kind == "concat":
            y = const(rng.standard_normal(s[:a] + (2,) + s[a + 1:]).astype(np.float32))
            nodes.append(helper.make_node("Concat", [x, y, x], [out], axis=ax))
            t = s[:a] + (2 * s[a] + 2,) + s[a + 1:]
        elif kind == "pad":
            pads = [draw(st.integers(0, 2)) for _ in range(2 * r)]
            value = draw(st.sampled_from([0.0, -1.5]))
            nodes.append(helper.make_node("Pad", [x, const(pads), const(np.float32(value))], [out]))
            t = tuple(d + pads[k] + pads[k + r] for k, d in enumerate(s))
        elif kind == "reduce":
            op = draw(st.sampled_from(["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceL1",
                                       "ReduceLogSumExp"]))
            keep = draw(st.booleans())  # (opset 18 takes axes as an input for all of them)
            nodes.append(helper.make_node(op, [x, const([ax])], [out], keepdims=int(keep)))
            t = s[:a] + ((1,) if keep else ()) + s[a + 1:]
            if not t:
                continue
        elif kind == "softmax":
            nodes.append(helper.make_node(draw(st.sampled_from(["Softmax", "LogSoftmax"])), [x], [out], axis=ax))
            t = s
        elif kind == "gather":
            idx = rng.integers(-s[a], s[a], draw(st.sampled_from([(2,), (1, 3), ()])))
            nodes.append(helper.make_node("Gather", [x, const(idx.astype(np.int64))], [out], axis=ax))
            t = s[:a] + idx.shape + s[a + 1:]
            if not t or len(t) > 4:
                continue
        elif kind == "unsqueeze" and r < 4:
            u = draw(st.integers(-r - 1, r))
            nodes.append(helper.make_node("Unsqueeze", [x, const([u])], [out]))
            t = list(s)
            t.insert(u % (r + 1), 1)
            t = tuple(t)
        elif kind == "reshape" and r > 1:  # two neighbouring axes merged, written with a -1 or a 0
            b = draw(st.integers(0, r - 2))
            t = s[:b] + (s[b] * s[b + 1],) + s[b + 2:]
            spec = [0 if k < b and draw(st.booleans()) else d for k, d in enumerate(t)]
            spec[b] = -1 if draw(st.booleans()) else spec[b]
            nodes.append(helper.make_node("Reshape", [x, const(np.array(spec, np.int64))], [out]))
        elif kind == "expand" and 1 in s:
            t = tuple(4 if d == 1 else d for d in s)
            nodes.append(helper.make_node("Expand", [x, const(np.array(t, np.int64))], [out]))
        elif kind == "where":
            cond = f"m{i}"
            nodes.append(helper.make_node("Greater", [x, const(np.float32(0.2))], [cond]))
            nodes.append(helper.make_node("Where", [cond, x, const(np.float32(-3.0))], [out]))
            t = s
        elif kind == "matmul":
            n = draw(st.sampled_from([1, 5, 8]))
            nodes.append(helper.make_node("MatMul", [x, const(rng.standard_normal((s[-1], n)).astype(np.float32))],
                                          [out]))
            t = s[:-1] + (n,)
        elif kind == "layernorm":
            nodes.append(helper.make_node("LayerNormalization",
                                          [x, const(rng.uniform(0.5, 1.5, s[-1]).astype(np.float32)),
                                           const(rng.standard_normal(s[-1]).astype(np.float32))], [out], axis=-1))
            t = s
        elif kind == "clip":
            nodes.append(helper.make_node("Clip", [x, const(np.float32(-0.5)), const(np.float32(0.7))], [out]))
            t = s
        elif kind == "cumsum":
            nodes.append(helper.make_node("CumSum", [x, const(np.int64(ax))], [out],
                                          reverse=int(draw(st.booleans())), exclusive=int(draw(st.booleans()))))
            t = s
        elif kind == "tile":
            reps = [draw(st.integers(1, 2)) for _ in range(r)]
            nodes.append(helper.make_node("Tile", [x, const(np.array(reps, np.int64))], [out]))
            t = tuple(d * k for d, k in zip(s, reps))
        elif kind == "split" and s[a] >= 2:
            first = draw(st.integers(1, s[a] - 1))
            nodes.append(helper.make_node("Split", [x, const(np.array([first, s[a] - first], np.int64))],
                                          [f"{out}a", out], axis=ax))
            t = s[:a] + (s[a] - first,) + s[a + 1:]
        elif kind == "conv" and r == 4 and s[1] > 0:  # any kernel, stride, dilation, asymmetric pads, groups
            c, (h, w) = s[1], s[2:]
            k = [draw(st.integers(1, 3)) for _ in range(2)]
            dil = [draw(st.integers(1, 2)) for _ in range(2)]
            stride = [draw(st.integers(1, 2)) for _ in range(2)]
            pads = [draw(st.integers(0, 2)) for _ in range(4)]
            group = draw(st.sampled_from([1, c]))
            o = c * draw(st.integers(1, 2)) if group == c else draw(st.sampled_from([1, 4, 8]))
            oh, ow = ((n + pads[j] + pads[j + 2] - dil[j] * (k[j] - 1) - 1) // stride[j] + 1 for j, n in enumerate((h, w)))
            if oh < 1 or ow < 1:
                continue
            ins = [x, const((rng.standard_normal((o, c // group, *k)) / np.sqrt(c // group * k[0] * k[1])).astype(np.float32))]
            if draw(st.booleans()):
                ins.append(const(rng.standard_normal(o).astype(np.float32)))
            nodes.append(helper.make_node("Conv", ins, [out], kernel_shape=k, strides=stride, dilations=dil, pads=pads,
                                          group=group))
            t = (s[0], o, oh, ow)
        elif kind == "pool" and r == 4:
            op = draw(st.sampled_from(["MaxPool", "AveragePool"]))
            k = [draw(st.integers(1, 3)) for _ in range(2)]
            stride = [draw(st.integers(1, 2)) for _ in range(2)]
            pads = [draw(st.integers(0, k[j % 2] - 1)) for j in range(4)]
            ceil = int(draw(st.booleans()))
            attrs = dict(kernel_shape=k, strides=stride, pads=pads, ceil_mode=ceil)
            if op == "AveragePool":
                attrs["count_include_pad"] = int(draw(st.booleans()))
            dims = []
            for j, n in enumerate(s[2:]):
                span = n + pads[j] + pads[j + 2] - k[j]
                m = (-(-span // stride[j]) if ceil else span // stride[j]) + 1
                if ceil and (m - 1) * stride[j] >= n + pads[j]:  # a last window starting in the end pad is dropped
                    m -= 1
                dims.append(m)
            if min(dims) < 1:
                continue
            nodes.append(helper.make_node(op, [x], [out], **attrs))
            t = s[:2] + tuple(dims)
        elif kind == "gemm" and r == 2:
            ta, tb = draw(st.booleans()), draw(st.booleans())
            m_, k_ = (s[1], s[0]) if ta else s
            n = draw(st.sampled_from([1, 5, 8]))
            b = rng.standard_normal((n, k_) if tb else (k_, n)).astype(np.float32)
            cshape = draw(st.sampled_from([(n,), (1, n), (m_, n), (m_, 1)]))
            nodes.append(helper.make_node("Gemm", [x, const(b), const(rng.standard_normal(cshape).astype(np.float32))],
                                          [out], transA=int(ta), transB=int(tb),
                                          alpha=draw(st.sampled_from([1.0, 0.5])), beta=draw(st.sampled_from([1.0, -2.0]))))
            t = (m_, n)
        elif kind == "bmm":  # MatMul broadcasting a batch of weights, or a 1-D one
            n = draw(st.sampled_from([1, 3, 8]))
            wshape = draw(st.sampled_from([(2, s[-1], n), (s[-1],)])) if r <= 2 else (s[-1], n)
            nodes.append(helper.make_node("MatMul", [x, const(rng.standard_normal(wshape).astype(np.float32))], [out]))
            if wshape == (s[-1],):
                t = s[:-1]
            elif len(wshape) == 3:
                t = (2,) + (s[:-1] if r == 2 else ()) + (n,)
            else:
                t = s[:-1] + (n,)
            if not t:
                continue
        elif kind == "variadic":
            others = [const(rng.standard_normal(tuple(1 if draw(st.booleans()) else d for d in s)).astype(np.float32))
                      for _ in range(2)]
            nodes.append(helper.make_node(draw(st.sampled_from(["Sum", "Mean", "Max", "Min"])), [x] + others, [out]))
            t = s
        elif kind == "div":
            d = f"d{i}"
            nodes.append(helper.make_node("Abs", [x], [d + "a"]))
            nodes.append(helper.make_node("Add", [d + "a", const(np.float32(0.5))], [d]))
            pair = [const(rng.standard_normal(s[-1:]).astype(np.float32)), d] if draw(st.booleans()) else [x, d]
            nodes.append(helper.make_node("Div", pair, [out]))
            t = s
        elif kind == "pow":
            d = f"p{i}"
            nodes.append(helper.make_node("Abs", [x], [d]))
            nodes.append(helper.make_node("Pow", [d, const(np.float32(draw(st.sampled_from([2.0, 0.5, 3.0]))))], [out]))
            t = s
        elif kind == "squeeze" and 1 in s and r > 1:
            axes = [k - r if draw(st.booleans()) else k for k, d in enumerate(s) if d == 1][:r - 1]
            nodes.append(helper.make_node("Squeeze", [x, const(np.array(axes, np.int64))], [out]))
            t = tuple(d for k, d in enumerate(s) if k % r not in {q % r for q in axes})
        elif kind == "flatten":
            f_ax = draw(st.integers(-r, r))
            nodes.append(helper.make_node("Flatten", [x], [out], axis=f_ax))
            f_ax += r if f_ax < 0 else 0
            t = (int(np.prod(s[:f_ax])), int(np.prod(s[f_ax:])))
        elif kind == "gather_elements":
            idx = rng.integers(-s[a], s[a], s).astype(np.int64)
            nodes.append(helper.make_node("GatherElements", [x, const(idx)], [out], axis=ax))
            t = s
        elif kind == "topk":  # the values, or the indices as f32 (random values: no ties)
            k = draw(st.integers(1, s[a]))
            vi = [f"tv{i}", f"ti{i}"]
            nodes.append(helper.make_node("TopK", [x, const(np.array([k], np.int64))], vi, axis=ax,
                                          largest=int(draw(st.booleans()))))
            if draw(st.booleans()):
                nodes.append(helper.make_node("Cast", [vi[1]], [out], to=F))
            else:
                nodes.append(helper.make_node("Identity", [vi[0]], [out]))
            t = s[:a] + (k,) + s[a + 1:]
        elif kind == "argmax":
            keep = draw(st.booleans())
            am = f"am{i}"
            nodes.append(helper.make_node(draw(st.sampled_from(["ArgMax", "ArgMin"])), [x], [am], axis=ax,
                                          keepdims=int(keep)))
            nodes.append(helper.make_node("Cast", [am], [out], to=F))
            t = s[:a] + ((1,) if keep else ()) + s[a + 1:]
            if not t:
                continue
        elif kind == "batchnorm" and r >= 2:
            c = s[1]
            nodes.append(helper.make_node("BatchNormalization", [x] + [
                const(v.astype(np.float32)) for v in (rng.uniform(0.5, 1.5, c), rng.standard_normal(c),
                                                      rng.standard_normal(c), rng.uniform(0.5, 2.0, c))], [out]))
            t = s
        elif kind == "instancenorm" and r >= 3:
            c = s[1]
            nodes.append(helper.make_node("InstanceNormalization", [x, const(rng.uniform(0.5, 1.5, c).astype(np.float32)),
                                                                    const(rng.standard_normal(c).astype(np.float32))],
                                          [out], epsilon=1e-3))
            t = s
        elif kind == "activation":
            op, attrs = draw(st.sampled_from([("LeakyRelu", dict(alpha=0.1)), ("HardSigmoid", dict(alpha=0.3, beta=0.4)),
                                              ("HardSwish", {}), ("Elu", dict(alpha=0.7)), ("Selu", {}),
                                              ("Celu", dict(alpha=1.5)), ("ThresholdedRelu", dict(alpha=0.3)),
                                              ("Sign", {}), ("Floor", {}), ("Ceil", {}), ("Round", {}),
                                              ("Reciprocal", {}), ("Sin", {}), ("Cos", {}), ("Softsign", {}),
                                              ("Mish", {}), ("IsInf", {}), ("Not", {})]))
            if op in ("IsInf", "Not"):
                b_ = f"b{i}"
                first = helper.make_node("IsInf", [x], [b_]) if op == "IsInf" else \
                    helper.make_node("Less", [x, const(np.float32(0.1))], [b_])
                nodes += [first, helper.make_node("Cast", [b_], [out], to=F)]
            else:
                nodes.append(helper.make_node(op, [x], [out], **attrs))
            t = s
        elif kind == "trilu" and r >= 2:
            nodes.append(helper.make_node("Trilu", [x, const(np.int64(draw(st.integers(-2, 2))))], [out],
                                          upper=int(draw(st.booleans()))))
            t = s
        else:
            continue
        vals[out] = t
    last = [v for v in vals if v != "x"]
    if not last:  # every draw skipped: one op at least
        nodes.append(helper.make_node("Relu", ["x"], ["v"]))
        last = ["v"]
    g = helper.make_graph(nodes, "r", [helper.make_tensor_value_info("x", F, list(shape))],
                          [helper.make_tensor_value_info(last[-1], F, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString(), shape


@pytest.mark.heavy
@settings(max_examples=15, deadline=None)
@given(random_onnx())
def test_random_onnx_graphs_match_onnxruntime(tmp_path_factory, model):
    check(tmp_path_factory, model)


@pytest.mark.extended
@settings(max_examples=200, deadline=None)
@given(random_onnx())
def test_many_random_onnx_graphs_match_onnxruntime(tmp_path_factory, model):
    check(tmp_path_factory, model)


def check(tmp_path_factory, model):
    data, shape = model
    path = tmp_path_factory.mktemp("m") / "m.onnx"
    path.write_bytes(data)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    (want,) = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = eqfuse.compile(str(path))(x=x)
    text = onnx.printer.to_text(onnx.load_from_string(data).graph)
    assert got.shape == want.shape, text
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=text)


@pytest.mark.heavy
def test_reduce_log_sum_exp_of_infinite_rows_matches_onnxruntime(tmp_path):
    """ReduceLogSumExp shifted by the row's maximum (large values do not overflow), with a row of
    -inf (-inf), a row holding +inf (+inf) and one holding NaN (NaN), keepdims either way."""
    from onnx import TensorProto, helper

    x = np.random.default_rng(2).standard_normal((5, 6)).astype(np.float32) * 40 + 60
    x[1], x[2, 3], x[3, 0] = -np.inf, np.inf, np.nan
    nodes = [helper.make_node("ReduceLogSumExp", ["x", "axes"], [f"y{k}"], keepdims=k) for k in (0, 1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, None) for k in (0, 1)],
                              [helper.make_tensor("axes", TensorProto.INT64, [1], [1])])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    (tmp_path / "lse.onnx").write_bytes(data)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = eqfuse.compile(str(tmp_path / "lse.onnx"))(x=x)
    for g, w in zip(got, want):
        assert np.isfinite(w.ravel()[[0, 4]]).all() and w.ravel()[1] == -np.inf and w.ravel()[2] == np.inf
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
