"""The decode attention (the attention plan's `decode`, csrc_templates/attention_decode.c): one query
row per (batch, head) against a KV cache's live rows, read in place. Three attentions in one step
compiled with live="P": grouped-query (4 query heads over 2 key/value heads, repeated in the graph;
the attention reads the 2 heads of the caches itself, no repeat kernel), head size 64, an additive mask (the score pass); 3 heads of 24 with values of 8 (the portable loops: no
whole vectors); and 2 heads of 64 with values of 32 and the mask, over their caches directly (the
vector paths, which read a bf16 cache under precision="bf16"). Every live length that ends a key block or passes one (1, 15, 16, 17, 250 keys), at
two capacities, the buffers' spare rows and the mask's spare columns NaN, so a read past the live
length shows; against float64 at the documented attention bound (docs/precision.md, "Attention":
u = 0 for f32, what its arithmetic may add; u = 2^-8 under precision="bf16", where the caches
the attentions read in place are bf16 and the kernel widens them)."""

from __future__ import annotations

import numpy as np
import pytest
from test_bf16 import U, attention_bound

import eqfuse
from eqfuse.pipeline import uops_text
from eqfuse.runtime.program import bf16_bits, bf16_widen

SCALE = 0.125  # (the first attention's; the second's is 0.2)
STEP = """
graph step(q: f32[2, 4, 1, 64], past_k: f32[2, 2, P, 64], past_v: f32[2, 2, P, 64], k: f32[2, 2, 1, 64],
           v: f32[2, 2, 1, 64], mask: f32[2, 1, 1, {cap1}], q2: f32[2, 3, 1, 24], past_k2: f32[2, 3, P, 24],
           past_v2: f32[2, 3, P, 8], k2: f32[2, 3, 1, 24], v2: f32[2, 3, 1, 8], q3: f32[2, 2, 1, 64],
           past_k3: f32[2, 2, P, 64], past_v3: f32[2, 2, P, 32], k3: f32[2, 2, 1, 64], v3: f32[2, 2, 1, 32]) {
    keys = concat(past_k, k, axis=2)
    values = concat(past_v, v, axis=2)
    rk = reshape(expand(unsqueeze(keys, axis=2), shape=[1, 1, 2, 1, 1]), shape=[2, 4, -1, 64])
    rv = reshape(expand(unsqueeze(values, axis=2), shape=[1, 1, 2, 1, 1]), shape=[2, 4, -1, 64])
    a = softmax(q @ transpose(rk, perm=[0, 1, 3, 2]) * 0.125 + mask, axis=-1) @ rv
    keys2 = concat(past_k2, k2, axis=2)
    values2 = concat(past_v2, v2, axis=2)
    a2 = softmax(q2 @ transpose(keys2, perm=[0, 1, 3, 2]) * 0.2, axis=-1) @ values2
    keys3 = concat(past_k3, k3, axis=2)
    values3 = concat(past_v3, v3, axis=2)
    a3 = softmax(q3 @ transpose(keys3, perm=[0, 1, 3, 2]) * 0.125 + mask, axis=-1) @ values3
    return a, a2, a3, keys, values, keys2, values2, keys3, values3
}
"""
CACHES = {"past_k": (2, 64), "past_v": (2, 64), "past_k2": (3, 24), "past_v2": (3, 8),
          "past_k3": (2, 64), "past_v3": (2, 32)}  # (heads, width)
NEW = {"past_k": "k", "past_v": "v", "past_k2": "k2", "past_v2": "v2", "past_k3": "k3", "past_v3": "v3"}


@pytest.fixture(scope="module")
def steps():
    """(precision, capacity) -> the step, compiled once per module."""
    compiled = {}

    def get(precision: str, cap: int):
        if (precision, cap) not in compiled:
            compiled[precision, cap] = eqfuse.compile(STEP.replace("{cap1}", str(cap + 1)), dims={"P": cap},
                                                      live="P", precision=precision)
        return compiled[precision, cap]
    return get


def reference(q, keys, values, scale, mask=None):
    """float64 attention of q [2, H, 1, D] over keys, values [2, KV, n, .] (each key head repeated
    for H / KV query heads), as (result, bound) from test_bf16.attention_bound on [2 H, 1, .]."""
    H, n = q.shape[1], keys.shape[2]
    ks, vs = (np.repeat(x, H // x.shape[1], axis=1).reshape(2 * H, n, -1) for x in (keys, values))
    mk = None if mask is None else np.repeat(mask[..., :n], H, axis=1).reshape(2 * H, 1, n)
    return q.reshape(2 * H, 1, -1), ks, vs, mk


def run_steps(step, cap: int, lives, u: float, bf16: bool = False):
    """Decode steps at live lengths `lives`; with `bf16`, the buffers passed are bf16 KV caches
    (uint16 bits, the spare rows NaN) and the reference takes the f32 values before their rounding,
    so the bound covers k and v rounded to bf16; returns the largest error / bound with u = 0 (what
    f32 arithmetic alone may add)."""
    rng = np.random.default_rng(cap)
    bufs = {name: np.full((2, h, cap + 1, w), np.nan, np.float32) for name, (h, w) in CACHES.items()}
    worst = 0.0
    for t in lives:
        for name, b in bufs.items():  # the past rows 0 .. t - 1; row t is the append's; the rest NaN
            b[:, :, :t] = rng.standard_normal(b[:, :, :t].shape, dtype=np.float32)
            b[:, :, t:] = np.nan
        mask = np.full((2, 1, 1, cap + 1), np.nan, np.float32)
        mask[..., :t + 1] = np.where(rng.random((2, 1, 1, t + 1)) < 0.2, -1e4, 0.0)
        mask[..., t] = 0.0  # (the new token sees itself)
        new = {"q": (2, 4, 1, 64), "k": (2, 2, 1, 64), "v": (2, 2, 1, 64), "q2": (2, 3, 1, 24),
               "k2": (2, 3, 1, 24), "v2": (2, 3, 1, 8), "q3": (2, 2, 1, 64), "k3": (2, 2, 1, 64),
               "v3": (2, 2, 1, 32)}
        x = {n: rng.standard_normal(s, dtype=np.float32) for n, s in new.items()}
        passed = {n: bf16_bits(b) for n, b in bufs.items()} if bf16 else bufs
        a, a2, a3, *presents = step(**x, mask=mask, P_length=np.array([t]), **passed)
        assert all(pr is passed[n] for pr, n in zip(presents, CACHES))
        for name, b in passed.items():
            got = bf16_widen(b) if bf16 else b
            assert np.isnan(got[:, :, t + 1:]).all(), (name, t)  # appended at row t only
            if bf16:  # the new row rounded to nearest even, the past rows as they were
                assert b.dtype == np.uint16 and np.array_equal(b[:, :, :t], bf16_bits(bufs[name][:, :, :t]))
                newrow = x[NEW[name]][:, :, 0]
                assert np.array_equal(b[:, :, t], bf16_bits(newrow)), (name, t)
        for name, nn in NEW.items():
            bufs[name][:, :, t] = x[nn][:, :, 0]  # (the reference's f32 new row, not rounded)
        for y, qn, kn, vn, scale, mk in ((a, "q", "past_k", "past_v", SCALE, mask), (a2, "q2", "past_k2", "past_v2", 0.2, None),
                                         (a3, "q3", "past_k3", "past_v3", SCALE, mask)):
            live = [bufs[n][:, :, :t + 1].astype(np.float64) for n in (kn, vn)]
            q3, k3, v3, m3 = reference(x[qn].astype(np.float64), *live, scale, mk)
            ref, bound = attention_bound(q3, k3, v3, scale, m3, 64, u=u)
            err = np.abs(y.reshape(ref.shape).astype(np.float64) - ref)
            assert np.all(err <= bound), (qn, t + 1, float(np.max(err / bound)))
            _, f32_bound = attention_bound(q3, k3, v3, scale, m3, 64, u=0.0)
            worst = max(worst, float(np.max(err / f32_bound)))
    return worst


def decode_kernels(step):
    """The three decode attentions, after checking that the step is 6 appends and 3 attentions:
    no kernel copies a cache (the grouped-query attention reads its 2 key/value heads itself,
    query head h at head h / 2: the plan's kv_group, no repeat kernel)."""
    ks = [k for k in step.kernels if k.kind == "attention"]
    assert len(ks) == 3
    for k in ks:
        assert k.decisions["decode"] == 1 and k.decisions["live"].startswith("keys"), k.decisions
        assert "EQF_SCRATCH_ATTENTION_KT" not in k.c_source  # (no copy of k^T)
    assert [k.decisions["kv_group"] for k in ks] == [2, 1, 1]
    rest = [k for k in step.kernels if k.kind not in ("attention", "view")]
    assert len(rest) == 6 and all(k.decisions.get("live", "").startswith("append") for k in rest), \
        [(k.name, k.decisions.get("live")) for k in rest]
    return ks


@pytest.mark.heavy  # (the fast tier's time)
def test_decode_attention_over_live_lengths_f32(steps):
    """1, 15, 16, 17 and 250 keys (a partial block, one key short of, at and past a block of 16; 4
    blocks of 64 with a partial last one) at capacity 256."""
    step = steps("f32", 256)
    decode_kernels(step)
    run_steps(step, 256, [0, 14, 15, 16, 249], u=0.0)
    assert all(k.decisions["k_bf16"] == 0 for k in step.kernels if k.kind == "attention")


@pytest.mark.heavy  # (the fast tier's time)
def test_decode_attention_over_a_bf16_cache(steps):
    """Under precision="bf16" the KV caches are bf16 (uint16): the appends round the new rows to
    nearest even, the decode attention widens the keys and values it reads (q, the scores and the
    softmax stay f32), and the report and the plan say so. Its result is within the documented bf16
    bound against float64 attention over the f32 values before their rounding (k and v rounded are
    in that bound), here at capacity 16 up to the whole buffer (17 keys), the spare rows NaN; the
    bound with u = 0 (f32 arithmetic alone) is exceeded somewhere, so an f32 cache would not be
    told apart by luck. An f32 past given to the step is rounded into a new bf16 buffer, which is
    returned as the present."""
    step = steps("bf16", 16)
    for k in decode_kernels(step):  # (the grouped-query one too: it reads its caches, no f32 copy)
        e = step.report["precision"][k.name]
        assert (e["precision"], e["path"]) == ("bf16", "widen") and "bf16 KV cache" in e["note"], e
        assert "bf16 cache" in k.decisions["live"] and k.decisions["k_bf16"] == k.decisions["v_bf16"] == 1
    appends = [k for k in step.kernels if k.decisions.get("live", "").startswith("append")]
    assert len(appends) == 6 and all("bf16 cache" in k.decisions["live"] for k in appends)
    assert all(step.report["precision"][k.name]["path"] == "round" for k in appends)
    assert run_steps(step, 16, [0, 15, 16], u=U, bf16=True) > 1.0
    rng = np.random.default_rng(0)
    f32 = {n: rng.standard_normal((2, h, 17, w), dtype=np.float32) for n, (h, w) in CACHES.items()}
    x = {n: np.zeros(s, np.float32) for n, s in (("q", (2, 4, 1, 64)), ("k", (2, 2, 1, 64)), ("v", (2, 2, 1, 64)),
                                                 ("q2", (2, 3, 1, 24)), ("k2", (2, 3, 1, 24)), ("v2", (2, 3, 1, 8)),
                                                 ("q3", (2, 2, 1, 64)), ("k3", (2, 2, 1, 64)), ("v3", (2, 2, 1, 32)))}
    presents = step(**x, mask=np.zeros((2, 1, 1, 17), np.float32), P_length=np.array([5]), **f32)[3:]
    for p, n in zip(presents, CACHES):
        assert p.dtype == np.uint16 and np.array_equal(p[:, :, :5], bf16_bits(f32[n][:, :, :5]))
        assert not p[:, :, 5].any()  # (the new row: zeros)


def test_lower_prints_the_decode_plan():
    """One query row is the decode plan (`decode=1`, tiles bk only); more rows the general one."""
    g = ("graph g(q: f32[6, {n}, 32], k: f32[6, 40, 32], v: f32[6, 40, 32]) {{\n"
         "  return softmax(q @ transpose(k, perm=[0, 2, 1]) * 0.5, axis=-1) @ v\n}}")
    one, four = uops_text(g.format(n=1)), uops_text(g.format(n=4))
    assert "decode=1" in one and "tiles: bk=64\n" in one and "k rows [32] in place" in one
    assert "decode=0" in four and "bq=" in four


@pytest.mark.parametrize("threads", [1, 2])
def test_decode_attention_rising_scores_and_masked_blocks(threads):
    """The lazy rescale of one query row: its scores grow block after block, so the running maximum
    is raised (and the accumulators rescaled) several times; a -inf mask hides the first block of 64
    keys from row 1 (its maximum starts at -inf) and every key from row 2 (NaN, as numpy's softmax
    gives). Head size 64 (the vector paths) and 24 with values of 8 (the portable loops), at the
    same tolerance as the general kernel's test (tests/test_kernels_c.py)."""
    sk, rng = 150, np.random.default_rng(3)
    src = ("graph att(q: f32[3, 1, 64], k: f32[3, 150, 64], v: f32[3, 150, 64], m: f32[3, 1, 150], "
           "q2: f32[3, 1, 24], k2: f32[3, 150, 24], v2: f32[3, 150, 8]) {\n"
           "    a = kernel { softmax(q @ transpose(k, perm=[0, 2, 1]) * 0.5 + m) @ v }\n"
           "    b = kernel { softmax(q2 @ transpose(k2, perm=[0, 2, 1]) * 0.5 + m) @ v2 }\n"
           "    return a, b\n}\n")
    mod = eqfuse.compile(src, fuse="manual", threads=threads)
    assert [k.decisions["decode"] for k in mod.kernels] == [1, 1]
    growth = np.linspace(0.2, 3.0, sk, dtype=np.float32)[:, None]
    x = {}
    for n, d, dv in (("", 64, 64), ("2", 24, 8)):
        x["q" + n] = rng.standard_normal((3, 1, d), dtype=np.float32)
        x["k" + n] = (rng.standard_normal((3, sk, d)) * growth).astype(np.float32)
        x["v" + n] = rng.standard_normal((3, sk, dv), dtype=np.float32)
    m = np.zeros((3, 1, sk), np.float32)
    m[1, :, :64] = -np.inf
    m[2] = -np.inf
    got = mod(**x, m=m)
    for g, n in zip(got, ("", "2")):
        s = x["q" + n].astype(np.float64) @ x["k" + n].astype(np.float64).transpose(0, 2, 1) * 0.5 + m
        with np.errstate(invalid="ignore"):
            e = np.exp(s - s.max(-1, keepdims=True))
            want = (e / e.sum(-1, keepdims=True)) @ x["v" + n].astype(np.float64)
        assert np.all(np.diff(s[0, 0]) != 0) and np.isnan(want[2]).all() and np.isnan(g[2]).all()
        np.testing.assert_allclose(g[:2], want[:2], rtol=2e-5, atol=2e-5)



SCALED = """
graph step(q: f32[2, 4, 1, 64], past_k: f32[2, 2, P, 64], past_v: f32[2, 2, P, 64], k: f32[2, 2, 1, 64],
           v: f32[2, 2, 1, 64]) {
    keys = concat(past_k, k, axis=2)
    values = concat(past_v, v, axis=2)
    uk = unsqueeze(keys, axis=2)
    uv = unsqueeze(values, axis=2)
    ek = kernel { expand(uk, shape=[1, 1, 2, 1, 1]) }
    ev = kernel { expand(uv, shape=[1, 1, 2, 1, 1]) }
    rk = reshape(ek, shape=[2, 4, -1, 64])
    rv = reshape(ev, shape=[2, 4, -1, 64])
    sk = kernel { rk * 0.5 }
    a = kernel { softmax(q @ transpose(sk, perm=[0, 1, 3, 2]) * 0.125, axis=-1) @ rv }
    return a, keys, values
}
"""


def test_grouped_query_keys_scaled_in_front_of_the_repeat():
    """Keys repeated for the query heads, then scaled by a kernel of their own (as the export of a
    deep Llama leaves its sqrt(scale)): the attention reads the 2 cache heads itself, the scale
    folded into q; no kernel but the appends and the attention runs, and 1 and 16 keys (the whole
    buffer), the spare rows NaN, are within the f32 attention bound against float64."""
    step = eqfuse.compile(SCALED, dims={"P": 16}, live="P", fuse="manual")
    ks = [k for k in step.kernels if k.kind not in ("view",)]
    assert [k.kind for k in ks] == ["layout", "layout", "attention"] and ks[2].decisions["kv_group"] == 2
    rng = np.random.default_rng(5)
    for t in (0, 15):
        bufs = [np.full((2, 2, 17, 64), np.nan, np.float32) for _ in range(2)]
        for b in bufs:
            b[:, :, :t] = rng.standard_normal((2, 2, t, 64), dtype=np.float32)
        q, k, v = (rng.standard_normal(s, dtype=np.float32) for s in ((2, 4, 1, 64), (2, 2, 1, 64), (2, 2, 1, 64)))
        a, *_ = step(q=q, k=k, v=v, past_k=bufs[0], past_v=bufs[1], P_length=np.array([t]))
        live = [b[:, :, :t + 1].astype(np.float64) for b in bufs]
        q3, k3, v3, _ = reference(q.astype(np.float64), *live, 0.0625)
        ref, bound = attention_bound(q3, k3, v3, 0.0625, None, 64, u=0.0)
        assert np.all(np.abs(a.reshape(ref.shape) - ref) <= bound), t


GROUPS = ((1, 64, 64), (2, 64, 64), (3, 24, 8), (4, 64, 32))  # (g query heads per key/value head, D, Dv)
GROUPED = "graph step(" + ", ".join(
    f"q{g}: f32[2, {2 * g}, 1, {d}], pk{g}: f32[2, 2, P, {d}], pv{g}: f32[2, 2, P, {dv}], k{g}: f32[2, 2, 1, {d}], "
    f"v{g}: f32[2, 2, 1, {dv}], m{g}: f32[2, {2 * g}, 1, 161]" for g, d, dv in GROUPS) + ") {\n" + "".join(
    f"    keys{g} = concat(pk{g}, k{g}, axis=2)\n    values{g} = concat(pv{g}, v{g}, axis=2)\n"
    + (f"    rk{g} = keys{g}\n    rv{g} = values{g}\n" if g == 1 else
       f"    rk{g} = reshape(expand(unsqueeze(keys{g}, axis=2), shape=[1, 1, {g}, 1, 1]), shape=[2, {2 * g}, -1, {d}])\n"
       f"    rv{g} = reshape(expand(unsqueeze(values{g}, axis=2), shape=[1, 1, {g}, 1, 1]), shape=[2, {2 * g}, -1, {dv}])\n")
    + f"    a{g} = softmax(q{g} @ transpose(rk{g}, perm=[0, 1, 3, 2]) * 0.125 + m{g}, axis=-1) @ rv{g}\n"
    for g, d, dv in GROUPS) + "    return " + ", ".join(f"a{g}" for g, _, _ in GROUPS) + ", " + ", ".join(
    f"keys{g}, values{g}" for g, _, _ in GROUPS) + "\n}\n"


@pytest.mark.heavy  # (a few seconds: the whole suite runs it, the fast tier not)
def test_grouped_query_decode_reads_each_cache_row_once():
    """Grouped-query decode attention with g = 1, 2, 3 and 4 query heads per key/value head (2 of
    them; head sizes 64 and 24 with values of 8, the vector and portable paths): one task per
    (batch, key/value head) computes its g query rows in one pass over the cache's rows (the plan's
    kv_rows = g; each k and v row loaded once per task: the schedule's counts), with a mask of its
    own per query head (each row's score ops at its own offsets). Live lengths that end a block
    of 64 keys, and pass it, up to the whole buffer (1, 63, 64, 65, 128, 129 and 160 keys) at
    capacity 160, the spare rows and mask columns NaN: within the f32 attention bound (u = 0)
    against float64."""
    step = eqfuse.compile(GROUPED, dims={"P": 160}, live="P")
    ks = [k for k in step.kernels if k.kind == "attention"]
    assert [(k.decisions["kv_group"], k.decisions["kv_rows"]) for k in ks] == [(1, 1), (2, 2), (3, 3), (4, 4)]
    assert all(k.decisions["decode"] == 1 for k in ks)
    assert all(k.kind in ("attention", "layout", "view") for k in step.kernels)  # (no repeat kernel)
    rng = np.random.default_rng(11)
    bufs = {f"p{x}{g}": np.full((2, 2, 161, d if x == "k" else dv), np.nan, np.float32)
            for g, d, dv in GROUPS for x in "kv"}
    for t in (0, 62, 63, 64, 127, 128, 159):
        for b in bufs.values():
            b[:, :, :t] = rng.standard_normal(b[:, :, :t].shape, dtype=np.float32)
            b[:, :, t:] = np.nan
        x = {}
        for g, d, dv in GROUPS:
            x[f"q{g}"] = rng.standard_normal((2, 2 * g, 1, d), dtype=np.float32)
            x[f"k{g}"] = rng.standard_normal((2, 2, 1, d), dtype=np.float32)
            x[f"v{g}"] = rng.standard_normal((2, 2, 1, dv), dtype=np.float32)
            m = np.full((2, 2 * g, 1, 161), np.nan, np.float32)
            m[..., :t + 1] = np.where(rng.random((2, 2 * g, 1, t + 1)) < 0.2, -1e4, 0.0)
            m[..., t] = 0.0
            x[f"m{g}"] = m
        outs = step(**x, **bufs, P_length=np.array([t]))
        for (g, d, dv), y in zip(GROUPS, outs):
            live = [bufs[f"p{c}{g}"][:, :, :t + 1].astype(np.float64) for c in "kv"]
            for c, w in zip(live, (x[f"k{g}"], x[f"v{g}"])):
                c[:, :, t] = w[:, :, 0]  # (the new row, appended at t)
            H = 2 * g
            q3 = x[f"q{g}"].astype(np.float64).reshape(2 * H, 1, d)
            k3, v3 = (np.repeat(c, g, axis=1).reshape(2 * H, t + 1, -1) for c in live)
            m3 = x[f"m{g}"][..., :t + 1].astype(np.float64).reshape(2 * H, 1, t + 1)
            ref, bound = attention_bound(q3, k3, v3, 0.125, m3, 64, u=0.0)
            err = np.abs(y.reshape(ref.shape).astype(np.float64) - ref)
            assert np.all(err <= bound), (g, t + 1, float(np.max(err / bound)))
    text = uops_text(GROUPED, dims={"P": 160}, live="P")
    assert "kv_rows=4" in text and "tasks of 4 query rows, each k and v row read once for them" in text


CHUNK = """
graph step(q: f32[1, 2, 3, 16], past_k: f32[1, 2, P, 16], past_v: f32[1, 2, P, 16], k: f32[1, 2, 3, 16],
           v: f32[1, 2, 3, 16], cm: f32[3, 9]) {
    keys = concat(past_k, k, axis=2)
    values = concat(past_v, v, axis=2)
    a = softmax(q @ transpose(keys, perm=[0, 1, 3, 2]) * 0.25 + cm, axis=-1) @ values
    return a, keys, values
}
"""
# the dynamo exporter's form: the causal mask, bound, and the padding mask, a run-time input,
# combined into one mask over the query rows and the keys before the attention reads it
CHUNK_PADDED = """
graph step(q: f32[1, 2, 3, 16], past_k: f32[1, 2, P, 16], past_v: f32[1, 2, P, 16], k: f32[1, 2, 3, 16],
           v: f32[1, 2, 3, 16], cm: bool[3, 9], keep: bool[1, 9]) {
    keys = concat(past_k, k, axis=2)
    values = concat(past_v, v, axis=2)
    a = softmax(q @ transpose(keys, perm=[0, 1, 3, 2]) * 0.25 + where(logical_and(cm, keep), 0, -inf), axis=-1) @ values
    return a, keys, values
}
"""


@pytest.mark.heavy  # (the fast tier's time)
@pytest.mark.parametrize("padded, window", [(False, None), (True, None), (False, 4), (True, 4)])
def test_an_attention_over_several_new_rows_computes_its_causal_mask_from_the_live_length(padded, window):
    """A step of 3 new rows over a cache of capacity 6 (a prompt's chunk): its causal mask, bound
    and computed with the past at the capacity (key j visible to query i where j <= 6 + i), is
    computed from the live length L instead (eqfuse.ir.live.causal_from_length), so query i sees
    keys 0 .. L + i; the same when the mask is combined with a run-time padding mask first (the
    dynamo exporter's form), key 1 then hidden. At live lengths 0 .. 6, the spare rows NaN,
    within the f32 attention bound against float64. With a sliding window W (a sliding-window
    layer's mask over its cache kept whole), key j is also hidden from query i where
    j <= L + i - W. A mask over the query rows and the keys that is neither is refused: it would
    hold the capacity's mask, not the live length's."""
    w = window or 10
    causal = (np.arange(9)[None, :] <= 6 + np.arange(3)[:, None]) & (np.arange(9)[None, :] > 6 + np.arange(3)[:, None] - w)
    src = CHUNK_PADDED if padded else CHUNK
    cm = causal if padded else np.where(causal, 0.0, -np.inf).astype(np.float32)
    step = eqfuse.compile(src, dims={"P": 6}, live="P", params={"cm": cm})
    (att,) = [k for k in step.kernels if k.kind == "attention"]
    assert att.decisions["live"] == "keys at run time: live + 3 of 9 rows"
    rng = np.random.default_rng(2)
    keep = np.ones((1, 9), bool)
    for t in range(7):
        bufs = [np.full((1, 2, 9, 16), np.nan, np.float32) for _ in range(2)]
        for b in bufs:
            b[:, :, :t] = rng.standard_normal((1, 2, t, 16), dtype=np.float32)
        q, k, v = (rng.standard_normal((1, 2, 3, 16), dtype=np.float32) for _ in range(3))
        feeds = {"keep": (keep := np.arange(9)[None] != 1)} if padded else {}
        a, keys, values = step(q=q, k=k, v=v, past_k=bufs[0], past_v=bufs[1], P_length=np.array([t]), **feeds)
        assert np.isnan(keys[:, :, t + 3:]).all() and np.array_equal(keys[:, :, t:t + 3], k)
        kk, vv = (np.concatenate([b[:, :, :t], x], axis=2).astype(np.float64).reshape(2, t + 3, 16)
                  for b, x in ((bufs[0], k), (bufs[1], v)))
        for i in range(3):  # query i against its keys 0 .. t + i not hidden (the others weigh exactly 0)
            seen = np.flatnonzero(keep[0, :t + i + 1] & (np.arange(t + i + 1) > t + i - w))
            ref, bound = attention_bound(q.astype(np.float64).reshape(2, 3, 16)[:, i:i + 1], kk[:, seen],
                                         vv[:, seen], 0.25, None, 64, u=0.0)
            assert np.all(np.abs(a[:, :, i:i + 1].reshape(ref.shape) - ref) <= bound), (t, i)
    other = cm.copy()
    other[0, 5] = other[0, 7]  # (a key inside the band hidden from query 0: neither mask)
    with pytest.raises(eqfuse.EqfuseError, match="not computed from the live length"):
        eqfuse.compile(src, dims={"P": 6}, live="P", params={"cm": other})


POOLED = """
graph step(q: f32[1, 8, 1, 64], past_k: f32[1, 8, P, 64], past_v: f32[1, 8, P, 64], k: f32[1, 8, 1, 64],
           v: f32[1, 8, 1, 64]) {
    keys = concat(past_k, k, axis=2)
    values = concat(past_v, v, axis=2)
    a = softmax(q @ transpose(keys, perm=[0, 1, 3, 2]) * 0.125, axis=-1) @ values
    return a, keys, values
}
"""


@pytest.mark.heavy  # (the fast tier's time)
@pytest.mark.parametrize("precision", ["f32", pytest.param("bf16", marks=pytest.mark.extended)])  # (the suite's time)
def test_decode_attention_tasks_on_the_pool_give_the_same_bits_on_1_and_2_threads(precision):
    """With enough work to share (8 heads over 257 keys), the decode attention's tasks are chunks
    of the claim-based pool (the plan's pool: the run function keeps the pool held across it, as
    across the step's few-rows GEMMs), and the appends, which copy the new rows only, say one
    thread (block_parallel 0/0: a parallel flag would let go of the pool before them). Each task
    writes its own rows, so the result on 2 threads has the bits of the result on 1, and both are
    within the attention bound against float64 (u = 2^-8 with the bf16 cache)."""
    mods = [eqfuse.compile(POOLED, dims={"P": 256}, live="P", precision=precision, threads=t) for t in (1, 2)]
    for mod in mods:
        att = [k for k in mod.kernels if k.kind == "attention"]
        assert len(att) == 1 and att[0].decisions["pool"] == 1 and att[0].decisions["parallel"] == 1
        assert f"#define {att[0].name}_POOL 1" in att[0].c_source
        appends = [k for k in mod.kernels if k.decisions.get("live", "").startswith("append")]
        assert len(appends) == 2 and all(k.decisions["block_parallel"] == "0/0" for k in appends)
    rng = np.random.default_rng(7)
    for t in (3, 200, 256):
        past = [rng.standard_normal((1, 8, 257, 64), dtype=np.float32) for _ in range(2)]
        past = [bf16_widen(bf16_bits(p)) for p in past] if precision == "bf16" else past
        q, k, v = (rng.standard_normal((1, 8, 1, 64), dtype=np.float32) for _ in range(3))
        outs = []
        for mod in mods:
            bufs = [bf16_bits(p) if precision == "bf16" else p.copy() for p in past]
            outs.append(mod(q=q, k=k, v=v, past_k=bufs[0], past_v=bufs[1], P_length=np.array([t]))[0])
        assert np.array_equal(outs[0], outs[1]), t
        kv = [np.concatenate([p[:, :, :t], n], axis=2).astype(np.float64) for p, n in zip(past, (k, v))]
        if precision == "bf16":  # (the new rows rounded into the cache, as the reference's keys)
            kv = [np.concatenate([x[:, :, :t], bf16_widen(bf16_bits(n)).astype(np.float64)], axis=2)
                  for x, n in zip(kv, (k, v))]
        ref, bound = attention_bound(q.astype(np.float64).reshape(8, 1, 64), *(x.reshape(8, t + 1, 64) for x in kv),
                                     0.125, None, 64, u=U if precision == "bf16" else 0.0)
        assert np.all(np.abs(outs[0].reshape(ref.shape) - ref) <= bound), t
