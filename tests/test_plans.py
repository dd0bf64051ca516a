"""The plan is what runs: every tile a plan holds is the constant in its kernel's C, and the
micro-kernel calls a counting build makes are the uop counts `eqfuse lower --uops` prints."""

import re

import numpy as np
import pytest

import eqfuse
from eqfuse.backend.cbuild import COMMON_C, build, header_c
from eqfuse.cli.main import main
from eqfuse.pipeline import uops_text

# One kernel of each kind, over odd shapes (nothing a multiple of a vector or a tile).
KINDS = """
graph kinds(x: f32[7, 37], w: f32[37, 53], b: f32[53], y: f32[7, 53], g: f32[53], be: f32[53],
            q: f32[3, 19, 24], k: f32[3, 29, 24], v: f32[3, 29, 40], z: f32[5, 9, 13],
            img: f32[2, 3, 11, 13], f: f32[5, 3, 3, 3], t: f32[11, 7], ids: i64[5]) {
    p = kernel { relu(y * 2 + b) }
    c = kernel { relu(x @ w + b) }
    cr = kernel { layernorm(x @ w + y, g, be) }
    r = kernel { softmax(y + b) }
    s = kernel { sum(z, axis=1) }
    a = kernel { softmax(q @ transpose(k, perm=[0, 2, 1]) * 0.2) @ v }
    l = kernel { transpose(z, perm=[2, 0, 1]) }
    i = kernel { gather(t, ids) }
    cv = kernel { relu(conv2d(img, f, padding=1)) }
    return p, c, cr, r, s, a, l, i, cv
}
"""
ALL_KINDS = ["pointwise", "contraction", "contraction_row", "row", "reduce", "attention", "layout", "index",
             "conv2d"]


def declared(c_source: str, key: str, value: int) -> bool:
    """Whether the C holds `value` as the constant `key`: `#define <NAME>_KEY value[L]`, or
    `key = value` / `KEY = value` in a declaration or an enum."""
    v = rf"{value}L?\b"
    return bool(re.search(rf"#define \w+_{key.upper()} {v}", c_source)
                or re.search(rf"(const long|enum \{{|,)[^;{{}}]*\b({key}|{key.upper()}) = {v}", c_source))


def test_the_constant_check_tells_a_tile_from_another_value():
    src = "#define k_gemm_MR 6\n#define k_gemm_KC 392L\nconst long inner = 53, tile = 53;\nenum { BQ = 16, BK = 64 };"
    assert declared(src, "mr", 6) and declared(src, "kc", 392) and declared(src, "tile", 53)
    assert declared(src, "bq", 16) and declared(src, "bk", 64)
    assert not declared(src, "mr", 16) and not declared(src, "kc", 39) and not declared(src, "nr", 6)
    assert not declared(src, "bq", 64) and not declared("/* tile = 53 */", "tile", 53)


def test_every_tile_of_every_kind_is_the_constant_in_its_c(machine_model):
    mod = eqfuse.compile(KINDS, fuse="manual")
    assert sorted(k.kind for k in mod.kernels) == sorted(ALL_KINDS)
    tiled = 0
    for k in mod.kernels:
        for key, value in k.tiles.items():
            assert declared(k.c_source, key, value), (k.name, key, value)
            tiled += 1
    # pointwise (tile, stream), attention (bq, bk), 2 GEMMs (mr, nr, kc, mc, nc) and the 3x3
    # conv's direct kernel, 5 output channels: pixels in the lanes (ro, rph, rpw: conv_direct)
    assert tiled == 2 + 2 + 2 * 5 + 3


def test_the_gemm_tiles_follow_the_machine(machine_model):
    """The register tile narrows for few columns and KC follows L1: the plan changes with the
    machine, and the C with it."""
    mod = eqfuse.compile("graph n(x: f32[7, 300], w: f32[300, 13]) { return kernel { x @ w } }", fuse="manual")
    (k,) = mod.kernels
    assert (k.tiles["mr"], k.tiles["nr"]) == (14, 16)
    assert k.tiles["mr"] * k.tiles["kc"] * 4 <= machine_model.l1 // 2
    assert declared(k.c_source, "kc", k.tiles["kc"])


# The choices besides tiles that a template is written with: a plan field each (printed by
# `eqfuse lower` as "plan: ..."), declared as a constant of its kernel's C.
CHOICES = {"contraction": ("direct_a", "direct_b"), "contraction_row": ("direct_a", "direct_b"),
           "skinny": ("pack_parts",), "pixel_conv": ("vl",), "direct_conv": ("vl", "reorder"), "winograd_conv": ("vl", "reorder"), "attention_grad": ("rb", "vec"), "attention": ("vec",),
           "grouped_conv": ("channels", "grouped", "vl", "rw", "band", "prefetch")}


def test_every_choice_of_a_plan_is_the_constant_in_its_c(machine_model):
    """DIRECT_A and DIRECT_B of the blocked GEMM, the skinny GEMM's PACK_PARTS, a direct conv's
    vector width and REORDER, a grouped conv's lanes and tiles, attention's VEC and the attention
    gradient's RB: what the plan says is what the C declares."""
    skinny = "graph s(x: f32[4, 37], w: f32[37, 53]) { return kernel { relu(x @ w) } }"
    lanes = ("graph cd(x: f32[1, 32, 40, 40], w: f32[32, 32, 3, 3], y: f32[1, 16, 10, 10], v: f32[16, 16, 3, 3],\n"
             "         dx: f32[1, 20, 9, 9], dw: f32[20, 1, 7, 7], gx: f32[1, 32, 6, 6], gw: f32[32, 16, 3, 3]) {\n"
             "    a = kernel { relu(conv2d(x, w, stride=2, padding=1)) }\n"
             "    d = kernel { relu(conv2d(dx, dw, padding=3, group=20)) }\n"
             "    e = kernel { relu(conv2d(gx, gw, padding=1, group=2)) }\n"
             "    return a, d, e, kernel { relu(conv2d(y, v, padding=1)) }\n}\n")
    grad = ("graph ag(q: f32[2, 8, 16], k: f32[2, 8, 16], v: f32[2, 8, 16], dy: f32[2, 8, 16]) {\n"
            "    return kernel { attention_dq(q, k, v, dy, scale=0.25) }\n}\n")
    kernels = [*eqfuse.compile(KINDS, fuse="manual").kernels, *eqfuse.compile(grad, fuse="manual").kernels,
               *eqfuse.compile(skinny, fuse="manual", params={"w": np.ones((37, 53), np.float32)}).kernels,
               *eqfuse.compile(lanes, fuse="manual").kernels]
    seen = set()
    for k in kernels:
        d = k.decisions
        which = "skinny" if d.get("path") == "skinny" else "grouped_conv" if "channels" in d else {"pixels": "pixel_conv", "channels": "direct_conv", "winograd": "winograd_conv"}.get(
            d.get("algorithm"), k.kind)
        for key in CHOICES.get(which, ()):
            if key == "pack_parts":  # 0: the calling thread packs A, in one part
                assert declared(k.c_source, "pack_parallel", int(d[key] > 0)), k.name
                assert declared(k.c_source, key, max(1, d[key])), (k.name, key, d[key])
            else:
                assert declared(k.c_source, key, d[key]), (k.name, key, d[key])
            seen.add(which)
    assert seen == set(CHOICES), seen


def test_lower_prints_every_choice():
    text = uops_text(KINDS, fuse="manual")
    assert "direct_a=" in text and "direct_b=" in text and "vl=" in text


# GEMMs of every mapping onto GEMM calls: one matrix, batches folded into rows (B shared),
# strided batches, batches the wrapper loops over, a transposed B, a row epilogue, a conv.
GEMMS = """
graph gemms(x: f32[7, 37], w: f32[37, 53], b: f32[53], xb: f32[3, 19, 37], wb: f32[3, 37, 53],
            x4: f32[2, 3, 19, 37], w4: f32[3, 37, 53], wt: f32[53, 37], g: f32[53], be: f32[53],
            img: f32[2, 3, 11, 13], f: f32[5, 3, 3, 3], big: f32[29, 600], wbig: f32[600, 70]) {
    one = kernel { relu(x @ w + b) }
    fold = kernel { xb @ w }
    batch = kernel { xb @ wb + b }
    loop = kernel { x4 @ w4 }
    bt = kernel { x @ transpose(wt) }
    row = kernel { layernorm(x @ w, g, be) }
    cv = kernel { relu(conv2d(img, f, padding=1)) }
    deep = kernel { big @ wbig }
    return one, fold, batch, loop, bt, row, cv, deep
}
"""


def ukernel_counts(text: str) -> dict[str, int]:
    """{kernel name: micro-kernel calls} from `eqfuse lower --uops` text."""
    counts, name = {}, None
    for line in text.splitlines():
        m = re.match(r"(eqf_\w+): ", line)
        if m:
            name = m.group(1)
        m = re.search(r"Exec  micro-kernel .* x(\d+)$", line)
        if m:
            counts[name] = int(m.group(1))
    return counts


@pytest.mark.heavy
def test_a_counting_build_makes_the_micro_kernel_calls_lower_prints(machine_model, monkeypatch):
    monkeypatch.setenv("EQFUSE_CONV", "im2col")  # the conv's GEMM too (a direct conv has no micro-kernel)
    want = ukernel_counts(uops_text(GEMMS, fuse="manual"))
    mod = eqfuse.compile(GEMMS, fuse="manual")
    gemms = [k for k in mod.kernels if k.kind in ("contraction", "contraction_row", "conv2d")]
    assert sorted(want) == sorted(k.name for k in gemms) and len(gemms) == 8
    cdefs = []
    for k in gemms:
        sig = re.search(rf"void {k.name}\(([^)]*)\)", k.c_source).group(1).replace("restrict ", "")
        cdefs.append(f"void {k.name}({sig});\nlong {k.name}_gemm_ukernel_calls(void);")
    code = "\n".join(k.c_source for k in gemms)
    lib = build(header_c(code) + COMMON_C + code, "\n".join(cdefs),
                "count", extra_flags=("-DEQF_COUNT_UKERNEL",))
    buf = np.zeros(1 << 16, dtype=np.float32)  # the counts do not depend on the values
    for k in gemms:
        nargs = re.search(rf"void {k.name}\(([^)]*)\)", k.c_source).group(1).count(",") + 1
        getattr(lib.lib, k.name)(*[lib.ffi.from_buffer("float[]", buf)] * nargs)
        calls = getattr(lib.lib, f"{k.name}_gemm_ukernel_calls")()
        assert calls == want[k.name], (k.name, calls, want[k.name])
    assert want[next(k.name for k in gemms if k.name.endswith("k7_contraction"))] > 0


def test_lower_prints_the_plan_and_with_uops_the_schedule(capsys, tmp_path):
    model = tmp_path / "m.g"
    model.write_text("graph m(x: f32[7, 37], w: f32[37, 53]) { return kernel { relu(x @ w) } }\n")
    assert main(["lower", str(model)]) == 0
    plan = capsys.readouterr().out
    assert "tiles: mr=" in plan and "threads (decided at run time):" in plan and "uops: " in plan
    assert "micro-kernel" not in plan and re.search(r"^total: \d+ uops", plan, re.MULTILINE)
    assert main(["lower", str(model), "--uops"]) == 0
    sched = capsys.readouterr().out
    counts = [int(c) for c in re.findall(r"  x(\d+)$", sched, re.MULTILINE)]
    assert "micro-kernel" in sched and f"total: {sum(counts)} uops" in sched
    assert re.search(r"^total: (\d+)", plan, re.MULTILINE).group(1) == str(sum(counts))


@pytest.mark.parametrize("K, slices", [(400, 1), (1500, 5)])
def test_k_is_cut_into_equal_slices(K, slices):
    from eqfuse.backend.kinds.contraction.plan_gemm import gemm_tiles
    from eqfuse.machine import MODELS

    t = gemm_tiles(64, 512, K, MODELS["zen4"])
    assert -(-K // t["kc"]) == slices and t["kc"] * slices - K < slices


def test_small_gemms_open_no_parallel_region_and_the_plan_says_so(machine_model):
    """GEMMs and convs below plan_gemm.PARALLEL_MIN_FMAS run on the calling thread: the plan's
    detail.parallel is the `if` of the C's parallel regions, and its thread rule says so."""
    mod = eqfuse.compile(GEMMS, fuse="manual")
    plans = {p.name: p for p in mod.gemms.last.plans}
    seen = set()
    for k in mod.kernels:
        p = plans[k.name]
        par = p.detail.parallel
        assert f"#pragma omp parallel if ({int(par)})" in k.c_source, k.name
        assert p.threads.startswith("one thread, no parallel region") == (not par), k.name
        if k.kind == "conv2d" and "direct conv2d" not in k.c_source:  # im2col's loop (not the direct kernel's)
            assert f"collapse(2) schedule(static) if ({int(par)})" in k.c_source
        seen.add(par)
    assert seen == {True, False}  # `deep` is large enough to split; the others are not


@pytest.mark.parametrize("seq, parallel", [(16, False), (128, True)])
def test_attention_opens_a_parallel_region_only_for_enough_work(seq, parallel):
    src = f"""graph at(q: f32[2, {seq}, 32], k: f32[2, {seq}, 32], v: f32[2, {seq}, 32]) {{
        return kernel {{ softmax(q @ transpose(k, perm=[0, 2, 1]) * 0.2) @ v }}
    }}"""
    mod = eqfuse.compile(src, fuse="manual")
    (p,) = mod.at.last.plans
    assert p.kind == "attention" and p.detail.parallel is parallel
    assert f"#pragma omp parallel if ({int(parallel)})" in mod.kernels[0].c_source
    assert p.threads.startswith("one thread") is not parallel
