"""torch.compile(model, backend="eqfuse"): models compiled through dynamo and AOTAutograd match
torch's eager results (rtol 1e-4, atol 1e-5), and each test checks that eqfuse really computed
them (the report of the compiled graph: eqfuse graphs, and what stayed in torch).
"""

from __future__ import annotations

import copy
import os
import sys
import warnings
from importlib import import_module
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from eqfuse import torch_backend  # noqa: E402
from eqfuse.torch_backend import REPORTS, FallbackWarning  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch_backend.register()
    torch._dynamo.reset()
    del REPORTS[:]
    yield
    torch._dynamo.reset()


def check(model, *args, fallbacks=(), **kwargs):
    """Compile with backend="eqfuse", call under no_grad, compare with eager; returns the output.
    `fallbacks` names every op allowed to stay in torch (none by default: eqfuse computes it all).
    Dynamo and REPORTS start afresh: past dynamo's recompile limit (a test checking many modules of
    one class, Lambda), it would run the module eagerly and the earlier checks' reports would pass."""
    torch._dynamo.reset()
    del REPORTS[:]
    compiled = torch.compile(model, backend="eqfuse")
    with torch.no_grad():
        got = compiled(*args, **kwargs)
        want = model(*args, **kwargs)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    assert REPORTS and all(r.partitions for r in REPORTS), "eqfuse computed nothing"
    left = {op for r in REPORTS for op, _ in r.fallbacks}
    assert left <= set(fallbacks), [r.summary() for r in REPORTS]
    return got


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(nn.functional.gelu(self.fc1(x)))))


class BasicBlock(nn.Module):
    """ResNet's basic block with a strided 1x1 downsample."""

    def __init__(self, cin=8, cout=16, stride=2):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + self.down(x))


def _randomize_bn(model):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return model


def test_entry_point_is_declared_and_callable():
    # installing eqfuse registers the name; a source checkout is registered by register() (the fixture)
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    target = meta["project"]["entry-points"]["torch_dynamo_backends"]["eqfuse"]
    module, _, attr = target.partition(":")
    assert callable(getattr(import_module(module), attr))
    assert getattr(import_module(module), attr) is torch_backend.eqfuse_backend
    assert "eqfuse" in torch._dynamo.list_backends()


@pytest.mark.heavy  # (the fast tier's time)
def test_mlp_matches_eager_in_one_eqfuse_graph():
    torch.manual_seed(0)
    check(MLP().eval(), torch.randn(16, 4).t())  # a transposed (non-contiguous) input
    (report,) = REPORTS
    assert len(report.partitions) == 1 and "gelu(" in report.partitions[0] and "tanh(" in report.partitions[0]


@pytest.mark.heavy
def test_resnet_basic_block():
    torch.manual_seed(0)
    check(_randomize_bn(BasicBlock()).eval(), torch.randn(2, 8, 16, 16))
    assert "conv2d(" in REPORTS[0].partitions[0] and "batchnorm(" in REPORTS[0].partitions[0]


@pytest.mark.heavy
@pytest.mark.parametrize("norm_first", [False, pytest.param(True, marks=pytest.mark.extended)])  # (the suite's time)
def test_transformer_encoder_layer(norm_first):
    # in eval under no_grad torch takes its fused fast path (_transformer_encoder_layer_fwd), decomposed here
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, norm_first=norm_first,
                                       activation="gelu" if norm_first else "relu").eval()
    x = torch.randn(2, 8, 32)
    pad = torch.zeros(2, 8, dtype=torch.bool)
    pad[1, 5:] = True
    check(layer, x, src_key_padding_mask=pad)


@pytest.mark.heavy
# (GPT-2 in the extended tier: the suite's time; test_zoo.py runs it through torch.compile by default)
@pytest.mark.parametrize("name", ["bert", pytest.param("gpt2", marks=pytest.mark.extended)])
def test_hugging_face_models(name):
    sys.path.insert(0, str(ROOT / "tests"))
    import model_exports as me

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' deprecation notes
        model, _ = me._hf(name)
    feeds = {k: torch.from_numpy(v) for k, v in me.inputs(name).items()}  # padded second sequence
    check(model, **feeds)
    text = REPORTS[0].partitions[0]
    assert "gather(" in text and "softmax(" in text and "layernorm(" in text


@pytest.mark.extended  # (some 25 s of compiles when the kernel cache is cold)
def test_transformers_generate_with_a_static_cache_compiles_once():
    """transformers' generate over a compiled forward with its static cache
    (cache_implementation="static": the cache at its full length from the start, written in place
    with index_copy_, which stays in torch): the prefill and the decode step are two graphs of fixed
    shapes, each compiled once; greedy ids are eager's, and a second generation compiles nothing.
    (With the default dynamic cache the keys grow by a row a token, and each length compiles:
    docs/torch.md.)"""
    sys.path.insert(0, str(ROOT / "tests"))
    import decoder_exports as de

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = de.gpt2()
        ids = torch.from_numpy(np.random.default_rng(0).integers(0, de.VOCAB, (2, 8)))
        args = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=10, min_new_tokens=10,
                    pad_token_id=de.EOS, cache_implementation="static")
        with torch.no_grad():
            eager = model.generate(ids, **args)
            model.forward = torch.compile(model.forward, backend="eqfuse")
            first = model.generate(ids, **args)
            graphs = len(REPORTS)
            again = model.generate(ids, **args)
    assert graphs == 2, [r.name for r in REPORTS]  # the prefill and the decode step
    assert len(REPORTS) == graphs  # nothing compiled again
    torch.testing.assert_close(first, eager, rtol=0, atol=0)
    torch.testing.assert_close(again, eager, rtol=0, atol=0)
    ops = {op for r in REPORTS for op, _ in r.fallbacks}
    assert ops <= {"index_copy.default", "copy_.default"}, ops  # the cache's in-place writes


class EmptyCacheStart(nn.Module):
    """transformers' DynamicCache before its first token: the keys start as torch.tensor([]) (a
    1-D empty tensor), concatenated with the new keys along the rows."""

    def __init__(self):
        super().__init__()
        self.k = nn.Linear(16, 16)

    def forward(self, x, past):
        keys = torch.cat([torch.tensor([]), self.k(x)], dim=-2)
        both = torch.cat([past, keys], dim=-2)  # (past: [2, 0, 16] at the first step)
        return torch.softmax(x @ both.transpose(-1, -2), -1) @ both, keys


@pytest.mark.parametrize("verify", [False, True])
def test_a_cache_that_starts_empty_runs_in_one_eqfuse_graph(verify):
    """A zero-size tensor (a cache's empty start, as a constant and as an input) is dropped from
    the cat that appends to it: the whole forward is one eqfuse graph (before, each cat and the
    empty constant stayed in torch and split the graph in three), the empty input no array of the
    compiled graph, and the results are eager's."""
    torch.manual_seed(0)
    model = EmptyCacheStart().eval()
    x, past = torch.randn(2, 5, 16), torch.zeros(2, 0, 16)
    compiled = torch.compile(model, backend="eqfuse", options={"verify": verify})
    with torch.no_grad():
        got, want = compiled(x, past), model(x, past)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)
    (report,) = REPORTS
    assert len(report.partitions) == 1 and not report.fallbacks, report.summary()
    assert "concat(" not in report.partitions[0]


@pytest.mark.extended  # (the suite's time: test_a_cache_that_starts_empty_runs_in_one_eqfuse_graph is its unit)
def test_a_hugging_face_decoder_with_its_default_cache_is_one_eqfuse_graph():
    """A Llama called as transformers calls it by default (use_cache: a DynamicCache whose keys and
    values start empty): one eqfuse graph, eager's hidden states and cache."""
    sys.path.insert(0, str(ROOT / "tests"))
    import zoo_models as zm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        model = zm._config("llama").eval()
    feeds = {k: torch.from_numpy(v) for k, v in zm.inputs("llama").items()}
    with torch.no_grad():
        want = model(**feeds)
        got = torch.compile(model, backend="eqfuse")(**feeds)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=RTOL, atol=ATOL)
    for a, b in zip(got.past_key_values.layers, want.past_key_values.layers):
        torch.testing.assert_close(a.keys, b.keys, rtol=RTOL, atol=ATOL)
    assert len(REPORTS) == 1 and not REPORTS[0].fallbacks, [r.summary() for r in REPORTS]

def test_parameters_never_go_stale():
    torch.manual_seed(0)
    model = MLP().eval()
    compiled = torch.compile(model, backend="eqfuse")
    x = torch.randn(4, 16)
    with torch.no_grad():
        before = compiled(x)
        model.fc1.weight.mul_(-2.0)  # in place, as optimizer.step() does
        model.fc3.bias.add_(1.0)
        after = compiled(x)
        torch.testing.assert_close(after, model(x), rtol=RTOL, atol=ATOL)
        assert not torch.allclose(before, after)
        model.fc2.weight.data = torch.randn(32, 32)  # new storage behind the same Parameter
        torch.testing.assert_close(compiled(x), model(x), rtol=RTOL, atol=ATOL)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model(x).square().sum().backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=RTOL, atol=ATOL)
    assert len(REPORTS) == 1  # the same compiled graph all along: values are read at each call


class Lgamma(nn.Module):
    """lgamma, an op eqfuse has no equivalent for, between two linear layers."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 8)

    def forward(self, x):
        h = torch.lgamma(torch.relu(self.a(x)) + 1.0)
        return torch.tanh(self.b(h) * 2.0)


@pytest.mark.heavy  # (a few seconds: the whole suite runs it, the fast tier not)
def test_unsupported_op_runs_in_torch_and_is_listed():
    torch.manual_seed(0)
    with pytest.warns(FallbackWarning, match=r"1 of \d+ ops run in torch[\s\S]*lgamma\.default x1: no eqfuse equivalent"):
        check(Lgamma().eval(), torch.randn(4, 16), fallbacks={"lgamma.default"})
    (report,) = REPORTS
    assert report.fallbacks == {("lgamma.default", "no eqfuse equivalent"): 1}
    assert len(report.partitions) == 2  # the linear layers before and after lgamma


@pytest.mark.heavy
def test_new_shapes_compile_again_and_warn_once():
    torch.manual_seed(0)
    model = Lgamma().eval()
    compiled = torch.compile(model, backend="eqfuse")
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for batch in (4, 5, 6, 5):  # dynamo makes the batch symbolic at 5: specialized per shape here
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), model(x), rtol=RTOL, atol=ATOL)
    shapes = {r.name for r in REPORTS}
    assert len(shapes) == 3, shapes  # batch 4, then 5 and 6 once each (5 again is cached)
    assert sum(issubclass(w.category, FallbackWarning) for w in caught) == 2  # static graph, then the dynamic one


@pytest.mark.heavy
def test_training_matches_eager_gradients():
    torch.manual_seed(0)
    model = MLP().train()
    ref = copy.deepcopy(model)
    x = torch.randn(4, 16)
    compiled = torch.compile(model, backend="eqfuse")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)  # the backward's *_backward ops stay in torch
        loss = compiled(x).square().sum()
        loss.backward()
    want = ref(x).square().sum()
    want.backward()
    torch.testing.assert_close(loss, want, rtol=RTOL, atol=ATOL)
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=RTOL, atol=ATOL, msg=n)
    assert len(REPORTS) == 2 and all(r.partitions for r in REPORTS)  # forward and backward graphs


@pytest.mark.heavy  # (the fast tier's time)
def test_verify_option_and_unknown_option():
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        got = torch.compile(model, backend="eqfuse", options={"verify": True, "threads": 1})(x)
        torch.testing.assert_close(got, model(x), rtol=RTOL, atol=ATOL)
        torch._dynamo.reset()
        with pytest.raises(Exception, match="unknown option.*fast.*options: verify, threads, cost"):
            torch.compile(model, backend="eqfuse", options={"fast": True})(x)


class ManyOps(nn.Module):
    """ATen handlers beyond the models': splits, joins, padding, indices, masks, reductions."""

    def forward(self, x, ids, mask):
        a, b = x.split([3, 5], dim=-1)
        y = nn.functional.pad(torch.cat([b, a * 2], dim=-1), (1, 2))
        y = y.clamp(-1, 1) + y.cumsum(-1) / 10 - torch.rsqrt(y.abs() + 1)
        y = torch.where(mask[:, None], y, -y).masked_fill(y > 0.9, 0.5)
        s = torch.stack([x.amax(-1), x.mean(-1), x.sum(dim=(0, 1)).expand(x.shape[0])], dim=0)
        t = torch.tril(x @ x.t(), diagonal=-1) + torch.triu(x @ x.t()).neg()
        r = torch.arange(8) * 2 + ids.sum() + torch.ones(8, dtype=torch.int64)
        return (y, x[ids], x.gather(1, ids[None, :].expand(x.shape[0], 3)), s, x.argmax(-1), t,
                torch.log_softmax(x, -1), r, torch.softmax(x.unbind(0)[1], 0), (ids > 1) & ~mask[:3])


class PoolingOps(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = nn.functional.hardswish(self.conv(x)) + nn.functional.leaky_relu(x.mean(1, keepdim=True), 0.1)
        p = nn.functional.max_pool2d(y, 3, 2, 1) + nn.functional.avg_pool2d(y, 2, 2, count_include_pad=False)[..., :4, :4]
        q = nn.functional.softplus(p) * torch.sigmoid(p) + nn.functional.silu(p) + nn.functional.hardsigmoid(p)
        return nn.functional.adaptive_avg_pool2d(q, 1).flatten(1), nn.functional.adaptive_avg_pool2d(q, 2)


class CeilPools(nn.Module):
    """Pooling with ceil_mode (GoogLeNet's, SqueezeNet's, Funnel's 1-D average), with and without
    counting the padding."""

    def forward(self, x):
        f = nn.functional
        return (f.max_pool2d(x, 3, 2, ceil_mode=True), f.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
                f.avg_pool2d(x, 2, 2, 1, ceil_mode=True, count_include_pad=False),
                f.avg_pool1d(x.flatten(2), 2, 2, ceil_mode=True, count_include_pad=False))


class Assignments(nn.Module):
    """Indexed assignments into a new tensor (BEiT's relative position index, built in forward):
    slice_scatter, select_scatter, fill and copy once functionalized."""

    def forward(self, x):
        y = torch.zeros(5, 6, dtype=torch.int64)
        y[1:3, 1:] = (x[:2, 1:] * 4).long()
        y[0, 0:] = 7
        y[:, 0] = 3
        z = x.clone()
        z[:, 2] = x[:, 0] + 1
        # Funnel's relative positions: an integer range of float bounds
        pos = torch.arange(-x.shape[1] * 2, x.shape[1] * 2, 1.0, dtype=torch.int64).to(x.dtype)
        return y, z * 2 + pos[: x.shape[1]]


class Lambda(nn.Module):
    """A module of one function."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _nans(x):
    z = torch.where(x > 1, x / 0, x)
    return torch.where(x < -1, torch.log(x), z)


nf = nn.functional
# the activations and roundings torch writes as their own ATen ops (selu as elu with a scale,
# logsigmoid as a forward with a buffer), the trigonometry beyond sin and cos; remainder and floor
# division (numpy's signs), division's rounding modes, var and std with a correction, nan_to_num
MORE_OPS = [
    lambda x: nf.elu(x, 0.7) + nf.selu(x) + nf.celu(x, 1.5),
    lambda x: nf.mish(x) + nf.softsign(x) + nf.logsigmoid(x) + torch.threshold(x, 0.2, -1.0),
    lambda x: torch.expm1(x * 1e-3) * 1e3 + torch.log1p(x.abs()),
    lambda x: torch.round(x * 3) + torch.trunc(x * 3) + torch.frac(x * 3),
    lambda x: torch.atan(x) + torch.tan(x * 0.5) + torch.sinh(x),
    lambda x: torch.cosh(x) + torch.asinh(x) + torch.atanh(x * 0.3),
    lambda x: torch.remainder(x * 4, 1.5) + torch.floor_divide(x * 4, -1.5),
    lambda x: torch.div(x * 4, 1.5, rounding_mode="trunc") + torch.div(x * 4, -0.7, rounding_mode="floor"),
    lambda x: torch.std(x, 1, keepdim=True) + torch.var(x, (0, 1), correction=0),
    # logsumexp: large values (no overflow), a row of -inf and one holding +inf
    lambda x: torch.logsumexp(x * 60, 1, keepdim=True) + torch.logsumexp(
        torch.cat([x, torch.full_like(x[:1], -torch.inf), x[:1].clamp(max=1.0) / 0.0]), 0, keepdim=True),
    lambda x: torch.nan_to_num(_nans(x), nan=0.5),
    lambda x: torch.nan_to_num(_nans(x), 1.0, 2.0, -3.0),
    # torch.max and torch.min over a dim: values and the first index (ties, and a NaN, in the rows)
    lambda x: torch.max(torch.round(x * 2) / 2, 1),
    lambda x: (lambda m: (torch.nan_to_num(m.values), m.indices))(torch.min(_nans(x), 0, keepdim=True)),
    lambda x: torch.argmin(torch.round(x * 2), 1) + torch.argmax(x, 0).sum(),
    # topk and sort (values and indices; NaN above every number: first descending, last ascending)
    lambda x: (*torch.topk(x, 3), *torch.topk(x, 2, 0, largest=False)),
    lambda x: (lambda s: (torch.nan_to_num(s.values, 7.0), s.indices))(torch.sort(_nans(x), 1)),
    lambda x: (*torch.sort(x, dim=0, descending=True, stable=True), torch.argsort(x, 1)),
]


class Unfolds(nn.Module):
    """nn.Unfold: ConvBERT's span convolution over the sequence (a [k, 1] kernel, padded), and a
    strided, dilated 2-D one; torch.flip and a log-softmax beside them."""

    def __init__(self):
        super().__init__()
        self.span = nn.Unfold(kernel_size=(3, 1), padding=(1, 0))
        self.grid = nn.Unfold(kernel_size=(2, 3), dilation=(1, 2), padding=(1, 0), stride=(2, 1))

    def forward(self, x):
        return self.span(x[..., :1]) * 2, self.grid(x) + 1, torch.flip(x, [1, -1]) - torch.log_softmax(x, -2)


class GroupNorms(nn.Module):
    """GroupNorm over groups of channels and per channel, and a weight-normed conv (Wav2Vec2's)."""

    def __init__(self):
        super().__init__()
        self.gn, self.gn_each = nn.GroupNorm(2, 6), nn.GroupNorm(6, 6)
        for p in (*self.gn.parameters(), *self.gn_each.parameters()):
            nn.init.uniform_(p, 0.5, 1.5)
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(6, 6, 3, padding=1), dim=2)

    def forward(self, x):
        # (with ConvNeXt V2's vector norm and BiT's batch norm over the batch's own statistics)
        grn = x * torch.linalg.vector_norm(x, dim=2, keepdim=True) + torch.linalg.vector_norm(x, ord=1, dim=(1, 2))[:, None, None]
        std = nn.functional.batch_norm(x.reshape(1, 12, -1), None, None, training=True, momentum=0.0, eps=1e-5)
        return self.conv(self.gn(x)) + self.gn_each(x) + grn + std.reshape(x.shape)


class Rolls(nn.Module):
    """torch.roll as Swin shifts its windows (two dims at once, both ways), and over the flattened tensor."""

    def forward(self, x):
        y = torch.roll(x, shifts=(-2, -2), dims=(1, 2))
        return torch.roll(y * 2.0, shifts=(2, 3), dims=(1, -2)) + torch.roll(x, 5)


def test_roll_runs_in_eqfuse():
    torch.manual_seed(0)
    check(Rolls(), torch.randn(2, 6, 5, 3))
    assert REPORTS[0].partitions[0].count("concat(") == 5  # one per dim rolled


@pytest.mark.heavy
def test_many_aten_ops():
    torch.manual_seed(0)
    x, ids = torch.randn(4, 8), torch.tensor([2, 0, 3])
    mask = torch.tensor([True, False, True, True])
    check(ManyOps(), x, ids, mask)
    check(PoolingOps().eval(), torch.randn(2, 3, 8, 8))
    check(GroupNorms().eval(), torch.randn(2, 6, 10) * 3 + 1)
    check(CeilPools(), torch.randn(2, 3, 7, 8))
    check(Assignments(), torch.randn(4, 6))
    check(Unfolds(), torch.randn(2, 3, 7, 8))


def test_as_strided_views_run_in_eqfuse_and_other_windows_in_torch():
    """as_strided as AdaptiveAvgPool1d's decomposition writes it (x's own size and strides, Swinv2's
    pooler) and as a reshape of a contiguous x run in eqfuse; a window that reads elements twice
    stays in torch, listed with its reason."""
    x = torch.randn(2, 8, 6)
    check(Lambda(lambda x: nn.functional.adaptive_avg_pool1d(x.transpose(1, 2) * 2, 1).squeeze(-1)), x)
    check(Lambda(lambda x: torch.as_strided(x * 2, (4, 24), (24, 1)) + 1), x)
    with pytest.warns(FallbackWarning, match="as_strided.default x1: a window over the storage that is no reshape"):
        check(Lambda(lambda x: torch.as_strided(x * 2, (3, 3), (1, 1)) + 1), x, fallbacks={"as_strided.default"})

def _outputs(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)  # (torch.max's values and indices)


@pytest.mark.heavy
def test_more_aten_ops_in_one_graph():
    """MORE_OPS's functions as the outputs of one function: one compile (the extended tier checks
    each alone, test_each_of_more_aten_ops)."""
    x = torch.tensor([[0.5, -0.5, 1.5, -2.5, 0.0, 1.2]]) * torch.ones(4, 1) + torch.randn(4, 6) * 0.1
    check(Lambda(lambda x, i: tuple(t for fn in MORE_OPS for t in _outputs(fn(x))) + (torch.index_select(x, 1, i),)),
          x, torch.tensor([5, 0, 2, 2]))


@pytest.mark.extended
@pytest.mark.parametrize("fn", MORE_OPS)
def test_each_of_more_aten_ops(fn):
    x = torch.tensor([[0.5, -0.5, 1.5, -2.5, 0.0, 1.2]]) * torch.ones(4, 1) + torch.randn(4, 6) * 0.1
    check(Lambda(fn), x)


def _affinities() -> dict[int, set]:
    """Each thread of this process and the CPUs it may run on."""
    out = {}
    for tid in Path("/proc/self/task").iterdir():
        try:
            out[int(tid.name)] = os.sched_getaffinity(int(tid.name))
        except OSError:  # the thread ended meanwhile
            pass
    return out


@pytest.mark.heavy
@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two CPUs")
@pytest.mark.parametrize("free", [1, 2])
def test_the_host_process_keeps_its_threads_affinities_and_environment(monkeypatch, free):
    # eqfuse's OpenMP is the process's libgomp, shared with torch: a call may use fewer threads
    # than torch's (another process holds a core: `free` cores) or place threads, and must give
    # back the thread count torch reads, every thread's CPUs, and the environment
    from eqfuse.runtime import load

    monkeypatch.setattr(load, "free_cores", lambda now=None, mine=None: free)
    monkeypatch.setattr(load, "free_cores_beside_peers", lambda now=None, mine=None: free)
    monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        a = torch.randn(512, 512)
        (a @ a).relu_().sum()  # torch's OpenMP threads exist before eqfuse runs
        env, before = dict(os.environ), _affinities()
        mlp = torch.compile(MLP().eval(), backend="eqfuse")
        layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval()
        enc = torch.compile(layer, backend="eqfuse")
        with torch.no_grad():
            for _ in range(3):  # a recompile (dynamo guards on torch's thread count) raises
                mlp(torch.randn(256, 16))  # (rows enough for OpenMP kernels)
                assert torch.get_num_threads() == 2
            x = torch.randn(2, 8, 32)
            torch.testing.assert_close(enc(x), layer(x), rtol=RTOL, atol=ATOL)
            enc(x)
            (a @ a).relu_().sum()
        after = _affinities()
        assert {t: after[t] for t in before if t in after} == {t: before[t] for t in before if t in after}
        assert dict(os.environ) == env
        left = [r.summary() for r in REPORTS if r.fallbacks]
        assert len(REPORTS) == 2 and not left, left  # the layer norms too, after the MLP
    finally:
        torch.set_num_threads(threads)


@pytest.mark.heavy  # (the fast tier's time)
def test_fallback_warning_names_the_users_line():
    torch.manual_seed(0)
    compiled = torch.compile(Lgamma().eval(), backend="eqfuse")
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        compiled(torch.randn(4, 16))
    (w,) = [w for w in caught if issubclass(w.category, FallbackWarning)]
    assert w.filename == __file__, (w.filename, w.lineno)
