"""The plan is what runs: every tile and every other choice a plan holds (`eqfuse lower` prints
them) is the constant its kernel's C declares, every placeholder of csrc_templates/ is either such
a choice or says why it is not, and the micro-kernel calls a counting build makes are the uop
counts `eqfuse lower --uops` prints."""

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


@pytest.mark.heavy  # (the fast tier's time)
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


def test_the_gemm_tiles_follow_the_machine(planned_model, monkeypatch):
    """The register tile narrows for few columns and KC follows L1: the plan changes with the
    machine, and the C with it (planned and written only: 16-float vectors on any host)."""
    ((p, c, _),) = emitted("graph n(x: f32[7, 300], w: f32[300, 13]) { return kernel { x @ w } }", monkeypatch)
    assert (p.tiles["mr"], p.tiles["nr"]) == (14, 16)
    assert p.tiles["mr"] * p.tiles["kc"] * 4 <= planned_model.l1 // 2
    assert declared(c, "kc", p.tiles["kc"])


# ------------------------------------------------------------------ every placeholder of csrc_templates/
#
# Each {{NAME}} placeholder of a template is either a choice or not. A choice (a tile, a flag, an
# algorithm switch, a vector width, a thread rule) is filled from the plan field named here, which
# `eqfuse lower` prints (its `tiles:` or `plan:` line; `BF16` its `precision:` line's path), and
# the template declares it as `#define <NAME>_<PLACEHOLDER> <value>`, so the C says what it was
# written with. Every other placeholder is listed with the reason it is not a choice.
ROW_PARALLEL = {"PARALLEL": "parallel"}  # (-1 in a GEMM's row epilogue: run by the GEMM's threads, split=rows)
# (quantize_out: a quantized result computed in scratch rows; 0 in a GEMM's row epilogue, whose C is f32)
ROW_QUANTIZE = {**ROW_PARALLEL, "QUANTIZE_OUT": "quantize_out", "QUANTIZE_FLAT": "quantize_flat"}
ROW_NORM = {**ROW_QUANTIZE, "SUM_APART": "sum_apart"}
CHOICES: dict[str, dict[str, str]] = {
    "attention.c": {"BQ": "bq", "BK": "bk", "VEC": "vec", "SCORE_OPS": "score_ops", "PARALLEL": "parallel",
                    "BF16": "precision_path"},
    "attention_decode.c": {"BK": "bk", "SCORE_OPS": "score_ops", "PARALLEL": "parallel", "K_BF16": "k_bf16",
                           "V_BF16": "v_bf16", "G": "kv_rows", "POOL": "pool"},
    "attention_grad.c": {"RB": "rb", "VEC": "vec", "PARALLEL": "parallel"},
    "conv2d.c": {"IM2COL": "im2col", "IMPLICIT": "implicit", "PARALLEL": "parallel"},
    "conv_amx.c": {"PREPACKED": "prepacked_b", "PARALLEL": "parallel", "CHUNKS": "region_chunks", "KCB": "kcb",
                   "G": "group", "FOLD": "fold", "OVERLAP": "overlap", "IN_COPY": "in_copy", "OUT_COPY": "out_copy",
                   "OUT_POOL": "out_pool", "IN_BLOCKED": "in_blocked", "OUT_BLOCKED": "out_blocked",
                   "EPI_BLOCKED": "epi_blocked", "VL": "vl", "STAGED": "staged"},
    "conv_direct.c": {"CB": "cb", "VL": "vl", "V": "v", "OBW": "obw", "RW": "rw", "ROWS": "rows",
                      "IN_BLOCKED": "in_blocked", "OUT_BLOCKED": "out_blocked", "INPLACE": "in_place",
                      "PREPACKED": "prepacked_b", "EPI_BLOCKED": "epi_blocked", "REORDER": "reorder",
                      "PARALLEL": "parallel", "BF16": "precision_path", "CHUNKS": "region_chunks"},
    "conv_grouped.c": {"PLANE": "plane", "PARALLEL": "parallel", "CHANNELS": "channels", "VL": "vl", "RW": "rw",
                       "BAND": "band", "GROUPED": "grouped", "PREFETCH": "prefetch", "PREPACKED": "prepacked_b",
                       "BF16": "precision_path"},
    "conv_dwpw.c": {"PARALLEL": "parallel", "VL": "vl", "RO": "ro", "BAND": "band", "FLAT": "flat", "OLANES": "olanes",
                    "PREPACKED": "prepacked_b", "EXPAND": "expand"},
    "conv_dwln.c": {"PARALLEL": "parallel", "VL": "vl", "RO": "ro", "NV": "nv", "BAND": "band", "FLAT": "flat",
                    "PREPACKED": "prepacked_b"},
    "conv_pixels.c": {"VL": "vl", "RO": "ro", "RPH": "rph", "RPW": "rpw", "PREPACKED": "prepacked_b",
                      "PARALLEL": "parallel", "OINNER": "o_inner", "ALIGN": "row_align", "CHUNKS": "region_chunks"},
    "conv_reorder.c": {"VL": "vl"},
    "conv_winograd.c": {"VL": "vl", "V": "v", "OBW": "obw", "RW": "rw", "TB": "tb", "IN_BLOCKED": "in_blocked",
                        "OUT_BLOCKED": "out_blocked", "PREPACKED": "prepacked_b", "REORDER": "reorder",
                        "PARALLEL": "parallel", "BF16": "precision_path"},
    "copy_block.c": {"PARALLEL": "block_parallel"},  # (block k of the plan's "/"-joined flags)
    "gemm.c": {"MR": "mr", "NR": "nr", "MC": "mc", "NC": "nc", "KC": "kc", "DIRECT_A": "direct_a",
               "DIRECT_B": "direct_b", "PREPACKED_B": "prepacked_b", "SPLIT": "split", "PARALLEL": "parallel",
               "BF16": "precision_path", "A_TRANSPOSED": "a_transposed", "B_TRANSPOSED": "b_transposed",
               "IMPLICIT": "implicit", "POOL": "pool"},
    "im2col_b.c": {},  # (rendered before gemm.c for an implicit im2col: the conv's geometry, no choice)
    "gemm_skinny.c": {"MR": "mr", "NR": "nr", "GROUPS": "groups", "PF": "pf", "PACK_PARTS": "pack_parts",
                      "PARALLEL": "parallel", "RUNS": "runs", "BF16": "precision_path", "A_TRANSPOSED": "a_transposed"},
    "gemm_u8s8.c": {"MR": "mr", "NR": "nr", "KC": "kc", "MB": "mb", "PATH": "precision_path", "A_S8": "a_s8", "B_U8": "b_u8",
                    "BZP_PER_COL": "bzp_per_col", "PREPACKED_B": "prepacked_b", "PARALLEL": "parallel",
                    "QUANT_A": "quantize_a", "IM2COL": "im2col", "IM2COL_ROWS": "im2col_rows", "DIRECT_X": "direct_x", "OWV": "owv", "CH4": "ch4", "COLS8": "cols8",
                    "QOUT": "qout", "BY_IMAGE": "by_image", "NCORR": "corrections",
                    "B_TRANSPOSED": "b_transposed"},
    "index.c": {"PARALLEL": "parallel", "IN_BLOCKED": "in_blocked", "OUT_BLOCKED": "out_blocked", "VL": "vl",
                "CHECKED": "checked", "POOL_S2": "pool_s2"},
    "layout.c": {},
    "matmul.c": {},
    "pointwise.c": {"TILE": "tile", "STREAM": "stream", "PARALLEL": "parallel", "TWO_PASS": "two_pass", "QOUT": "qout",
                    "RUN": "run"},
    "reduce.c": {"PARALLEL": "parallel", "THREAD_LOOP": "thread_loop", "ACC": "acc"},
    "row_grad.c": ROW_PARALLEL, "row_layernorm.c": ROW_NORM, "row_reduce.c": ROW_PARALLEL,
    "row_rmsnorm.c": ROW_NORM, "row_softmax.c": ROW_QUANTIZE,
    "row_quantize_block.c": {},  # (rendered into the three above, whose QUANTIZE_OUT and QUANTIZE_FLAT it reads)
    "row_blocks.c": {},  # (rendered into the three above, the head of their loop over blocks of rows: it reads their PARALLEL)
    "row_layernorm_lanes.c": {"PARALLEL": "parallel", "BLOCK": "lanes"},
}
SIGNATURE = "the kernel's symbol, parameters, operand pointers or the call of a function it holds"
SHAPE = "a size of the operands or an attribute of the op (stride, padding, groups, axes)"
MEMORY = "where an operand or the result lies: offsets, strides, leading dimensions of its layout"
EXPR = "an op expression or constant from the op table (the op, its attributes, the fused prologue/epilogue)"
TEXT = "text of a comment (from the op or the flags asserted here)"
DERIVED = "computed from shapes and the choices asserted here, in one way"
# a row kernel's NEXT: the address of a later row of the first input its prologue reads in whole
# rows (row.next_row), prefetched while this row computes, or NULL when there is none, or in a
# GEMM's row epilogue (whose rows are the GEMM's, in cache: split=rows, asserted here). How far
# ahead is the op's (softmax: the next block of rows, which its passes go over together; the
# norms: the next row). No alternative is weighed: an address fixed by the operands' layout.
PREFETCH_ROW = "the address of the row after, fixed by the operands' layout and the op"
NOT_CHOICES: dict[str, dict[str, str]] = {
    "attention.c": {SIGNATURE: "NAME PARAMS Q K V", SHAPE: "BATCH SQ SK D DV", DERIVED: "SKP",
                    MEMORY: "QOFF QR QC KSRC KBI KD KJ VOFF VR VC OUT_OFF OR OC OFFSETS",
                    EXPR: "SCORE_BODY SCORE QSCALE SCORE_LOG2E EPI_BODY EPI ZERO_NAN"},
    "attention_decode.c": {SIGNATURE: "NAME PARAMS Q K V PARAM_FIELDS PARAM_INIT PARAM_UNPACK", SHAPE: "BATCH SK D DV",
                           MEMORY: "QOFF QC KOFF KD KJ VOFF VR VC OUT_OFF OR OC OFFSETS",
                           EXPR: "SCORE_BODY SCORE QSCALE SCORE_LOG2E EPI_BODY EPI ZERO_NAN"},
    "attention_grad.c": {SIGNATURE: "NAME PARAMS Q K V DY", SHAPE: "BATCH SQ SK D DV OUTD", TEXT: "WHAT",
                         MEMORY: "QOFF QR QC KOFF KR KC VOFF VR VC DYOFF DYR DYC OOFF OR OC",
                         EXPR: "MODE SCALE ZERO_NAN MASK_IJ"},
    "conv2d.c": {SIGNATURE: "NAME PARAMS X GEMM ARGS", SHAPE: "N C H W O KH KW OH OW SH SW PH PW DH DW",
                 DERIVED: "HP WP"},
    "conv_amx.c": {SIGNATURE: "NAME PARAMS X WEIGHTS EXTRAS PARAM_FIELDS PARAM_INIT PARAM_UNPACK",
                   SHAPE: "N C H W O KH KW OH OW SH SW PH PW", EXPR: "EPILOGUE",
                   DERIVED: "KCP YSH YSW YPH YPW YQH YQW YHQ YWQ YPHASE YKCP PKH PKW PSH PSW PPH PPW POH POW "
                            "SIBLING SPLANE SHQ SWQ SPHASE"},
    "conv_direct.c": {SIGNATURE: "NAME PARAMS X WEIGHTS EXTRAS PARAM_FIELDS PARAM_INIT PARAM_UNPACK", SHAPE: "N C H W O KH KW OH OW SH SW PH PW",
                      EXPR: "EPILOGUE EPILOGUE_NCHW", DERIVED: "EDGE_L EDGE_R REORDER_FN"},
    "conv_grouped.c": {SIGNATURE: "NAME PARAMS X WEIGHTS EXTRAS PARAM_FIELDS PARAM_INIT PARAM_UNPACK",
                       SHAPE: "N C H W O G CG OG KH KW OH OW SH SW PH PW DH DW", EXPR: "EPILOGUE",
                       DERIVED: "TRANSPOSE"},
    "conv_dwpw.c": {SIGNATURE: "NAME PARAMS X WE WD WP EXTRAS", SHAPE: "N CI C H W O KH KW OH OW SH SW PH PW DH DW",
                    EXPR: "EXPROLOGUE PROLOGUE EPILOGUE"},
    "conv_dwln.c": {SIGNATURE: "NAME PARAMS X WD BD BIAS LG LB WM EXTRAS",
                    SHAPE: "N C H W F KH KW OH OW SH SW PH PW DH DW EPS", EXPR: "EPILOGUE", MEMORY: "WM_AT"},
    "conv_pixels.c": {SIGNATURE: "NAME PARAMS X WEIGHTS EXTRAS PARAM_FIELDS PARAM_INIT PARAM_UNPACK", SHAPE: "N C H W O KH KW OH OW SH SW PH PW",
                      EXPR: "EPILOGUE"},
    "conv_reorder.c": {SIGNATURE: "NAME", DERIVED: "TRANSPOSE"},
    "conv_winograd.c": {SIGNATURE: "NAME PARAMS X WEIGHTS EXTRAS PARAM_FIELDS PARAM_INIT PARAM_UNPACK", SHAPE: "N C H W O OH OW PH PW",
                        EXPR: "EPILOGUE", DERIVED: "REORDER_FN"},
    "copy_block.c": {SIGNATURE: "NAME SRC DST", SHAPE: "OUTER INNER", MEMORY: "OFFSETS SRC_STRIDE DST_STRIDE",
                     DERIVED: "CVT"},  # (eqf_bf16 into a bf16 KV cache: the plan's live, "bf16 cache")
    "gemm.c": {SIGNATURE: "NAME EXTRA_ARGS EXTRA_PARAMS LIVE_PARAM ROWMAP_PARAM ROWMAP_ARG EXTRA_FIELDS EXTRA_INIT EXTRA_UNPACK",
               SHAPE: "M N K BATCH ROWS_LIVE EDGE_ROWS_DIRECT EDGE_ROWS_PACKED ROWMAP AROW", TEXT: "A_LAYOUT B_LAYOUT",
               MEMORY: "LDA LDB LDC CSC A_BATCH_STRIDE B_BATCH_STRIDE C_BATCH_STRIDE B_AT",
               EXPR: "EPILOGUE ROW_EPILOGUE"},
    "im2col_b.c": {SIGNATURE: "NAME", SHAPE: "KH KW OH OW SH SW DH DW", DERIVED: "HP WP"},
    "gemm_skinny.c": {SIGNATURE: "NAME EXTRA_ARGS EXTRA_PARAMS EXTRA_FIELDS EXTRA_INIT EXTRA_UNPACK",
                      SHAPE: "M N K", TEXT: "A_LAYOUT B_LAYOUT", MEMORY: "LDC A_AT B_AT",
                      EXPR: "EPILOGUE ROW_EPILOGUE ROW_EPILOGUE_ON"},
    "gemm_u8s8.c": {SIGNATURE: "NAME EXTRA_PARAMS EXTRA_FIELDS EXTRA_INIT EXTRA_UNPACK A_T B_T AZP_T BZP_T OUT_T",
                    SHAPE: "M MO N K BATCH NBB G CI H W KH KW SH SW PH PW DH DW OW", MEMORY: "LDC", EXPR: "EPILOGUE QX QSCALE QZP"},
    "index.c": {SIGNATURE: "NAME PARAMS", SHAPE: "SPACE", EXPR: "OP BODY", DERIVED: "RANGES"},
    "layout.c": {SIGNATURE: "NAME PARAMS", SHAPE: "SPACE", EXPR: "OP", DERIVED: "BLOCKS"},
    "matmul.c": {SIGNATURE: "NAME PARAMS GEMM ARGS", SHAPE: "OUTER", MEMORY: "OFFSETS", TEXT: "SHAPES"},
    "pointwise.c": {SIGNATURE: "NAME PARAMS PARAM_FIELDS PARAM_INIT PARAM_UNPACK", SHAPE: "SPACE OUTER INNER", DERIVED: "NTILES",
                    MEMORY: "OFFSETS DST_BASE DST_J OTYPE",
                    EXPR: "BODY LINE_BODY RESULT FAST_BODY FAST_LINE_BODY FAST_RESULT GUARD QX QSCALE QZP"},
    "reduce.c": {SIGNATURE: "NAME PARAMS", SHAPE: "SPACE OUT_SPACE AXES OUT_SIZE N0 N1 N2 N3 N4", TEXT: "RUNS",
                 MEMORY: "OUT_OFFSET EPI_OFFSETS",
                 EXPR: "OP INIT OMP_OP COMBINE COMBINE_NAN NAN_TRACK SCALE PRO_BODY X EPI_BODY EPI"},
    "row_grad.c": {SIGNATURE: "NAME PARAMS", SHAPE: "L ROWS R0", MEMORY: "OFFSETS YBASE YS",
                   EXPR: "OP MODE A1 GAMMA_J EPS PRO_BODY X EPI_BODY EPI"},
    "row_layernorm.c": {SIGNATURE: "NAME ROWS_HEAD", SHAPE: "L ROWS", MEMORY: "OFFSETS YBASE", PREFETCH_ROW: "NEXT",
                        EXPR: "GAMMA BETA EPS PRO_BODY X EPI_BODY EPI QUANTIZE_BLOCK"},
    "row_layernorm_lanes.c": {SIGNATURE: "NAME PARAMS", SHAPE: "L ROWS", MEMORY: "OFFSETS YOFF RUN",
                              DERIVED: "OUTER NB", EXPR: "GAMMA BETA EPS PRO_BODY X EPI_BODY EPI"},
    "row_quantize_block.c": {SIGNATURE: "NAME", SHAPE: "L", MEMORY: "OFFSETS YBASE YS", EXPR: "EPI_BODY EPI"},
    "row_blocks.c": {SIGNATURE: "NAME PARAMS PARAM_FIELDS PARAM_INIT PARAM_UNPACK", SHAPE: "ROWS R0", DERIVED: "STEP"},
    "row_reduce.c": {SIGNATURE: "NAME PARAMS", SHAPE: "L ROWS", MEMORY: "OFFSETS EPI_OFFSETS OUT_ROW",
                     EXPR: "OP INIT RED COMBINE NAN_TRACK SCALE PRO_BODY X EPI_BODY EPI"},
    "row_rmsnorm.c": {SIGNATURE: "NAME ROWS_HEAD", SHAPE: "L ROWS", MEMORY: "OFFSETS YBASE", PREFETCH_ROW: "NEXT",
                      EXPR: "GAMMA EPS PRO_BODY X EPI_BODY EPI QUANTIZE_BLOCK"},
    "row_softmax.c": {SIGNATURE: "NAME ROWS_HEAD", SHAPE: "L ROWS", MEMORY: "OFFSETS YBASE YS", PREFETCH_ROW: "NEXT",
                      EXPR: "ZERO_NAN PRO_BODY X EPI_BODY EPI QUANTIZE_BLOCK"},
}


def test_every_placeholder_of_every_template_is_a_choice_or_says_why_not():
    """A template that gains a placeholder fails here until it is classified; a choice is
    declared by its template as `#define {{NAME}}_<PLACEHOLDER> {{<PLACEHOLDER>}}`."""
    from eqfuse.backend.cbuild import PLACEHOLDER, templates_dir

    # (every .c template but runtime.c, the runtime's translation unit, which has no placeholder)
    names = sorted(p.name for p in templates_dir().glob("*.c") if p.name != "runtime.c")
    assert names == sorted(CHOICES) == sorted(NOT_CHOICES)
    assert not PLACEHOLDER.findall((templates_dir() / "runtime.c").read_text())
    for name in names:
        text = (templates_dir() / name).read_text()
        others = [x for group in NOT_CHOICES[name].values() for x in group.split()]
        assert len(others) == len(set(others)), name
        assert not set(CHOICES[name]) & set(others), name
        assert set(PLACEHOLDER.findall(text)) == set(CHOICES[name]) | set(others), name
        for x in CHOICES[name]:
            assert re.search(rf"^#define {{{{NAME}}}}_{x} {{{{{x}}}}}L?( |$)", text, re.M), (name, x)


# One kernel of each template and each choice's values both ways where cheap: every kind of
# KINDS; a bound B on the few-rows path; a conv with channels in the lanes, a Winograd one, an
# im2col one (a 1x1: x read as it is) and a grouped one, convs in the blocked layout with a pool
# between, weights bound by params=; a concat of two copy blocks; the row kinds. Lowered and
# emitted only: no C is compiled.
MORE = """
graph more(x: f32[7, 37], w: f32[37, 53], xs: f32[16, 1024], ws: f32[1024, 1024], y: f32[7, 53],
           dy: f32[7, 53], g: f32[53], be: f32[53], q: f32[2, 8, 16], k: f32[2, 8, 16], v: f32[2, 8, 16],
           dq: f32[2, 8, 16], big: f32[64, 640], wb: f32[640, 640], huge: f32[4096, 2048], a: f32[3, 5],
           c: f32[4, 5], img: f32[1, 32, 40, 40], f: f32[32, 32, 3, 3], im2: f32[1, 16, 10, 10],
           f2: f32[16, 16, 3, 3], dw: f32[6, 1, 3, 3], im6: f32[2, 6, 9, 9], f1: f32[8, 6, 1, 1],
           pl: f32[2, 16, 64, 64], mk: f32[8, 8], dx: f32[1, 20, 9, 9], dw7: f32[20, 1, 7, 7],
           gx: f32[1, 32, 6, 6], gw: f32[32, 16, 3, 3], qa: u8[7, 37], qw: i8[37, 53],
           qz: u8, wz: i8, q1: f32[2, 1, 16], m1: f32[1, 8], qs: f32,
           cq: u8[1, 3, 6, 6], cqw: i8[4, 3, 3, 3], sx: f32[1, 24, 2, 2], sdw: f32[24, 1, 3, 3],
           spw: f32[32, 24, 1, 1], nx: f32[1, 16, 9, 9], nwd: f32[16, 1, 7, 7], nbd: f32[16], ng: f32[16],
           nbe: f32[16], nw1: f32[16, 64], nb1: f32[64]) {
    sk = kernel { relu(x @ w) }
    sp = kernel { relu(xs @ ws) }
    bg = kernel { big @ wb }
    ag = kernel { attention_dq(q, k, v, dq, scale=0.25) }
    am = kernel { softmax(q @ transpose(k, perm=[0, 2, 1]) * 0.25 + mk) @ v }
    a1 = kernel { softmax(q1 @ transpose(k, perm=[0, 2, 1]) * 0.25) @ v }
    a2 = kernel { softmax(q1 @ transpose(k, perm=[0, 2, 1]) * 0.25 + m1) @ v }
    sg = kernel { softmax_grad(dy, y) }
    rm = kernel { rmsnorm(y, g) }
    ln = kernel { layernorm(y, g, be) }
    sm = kernel { softmax(big) }
    rr = kernel { sum(big, axis=1) }
    st = kernel { relu(huge * 2) }
    cat = kernel { concat(a, c, axis=0) }
    cd = kernel { relu(conv2d(img, f, stride=2, padding=1)) }
    wg = kernel { relu(conv2d(im2, f2, padding=1)) }
    gr = kernel { relu(conv2d(im6, dw, padding=1, group=6)) }
    d7 = kernel { relu(conv2d(dx, dw7, padding=3, group=20)) }
    gg = kernel { relu(conv2d(gx, gw, padding=1, group=2)) }
    one = kernel { conv2d(im6, f1) }
    mp = kernel { max_pool2d(pl, kernel_size=2) }
    w1 = kernel { relu(conv2d(img, f, padding=1)) }
    p1 = kernel { max_pool2d(w1, kernel_size=2) }
    w2 = kernel { relu(conv2d(p1, f, padding=1)) }
    d2 = kernel { relu(conv2d(cd, f, stride=2, padding=1)) }
    qm = kernel { relu(cast(matmul_integer(qa, qw, qz, wz), to="f32")) }
    qq = kernel { matmul_integer(quantize_linear(x, qs, qz), qw, qz, wz) }
    qc = kernel { conv_integer(cq, cqw, qz, wz, padding=1) }
    tr = kernel { sin(y) * cos(y) }
    ir = kernel { conv2d(clip(conv2d(im6, dw, padding=1, group=6), min=0.0, max=6.0), f1) }
    is = kernel { conv2d(relu(conv2d(sx, sdw, padding=1, group=24)), spw) }
    cn = kernel { gelu(nb1 + layernorm(transpose(conv2d(nx, nwd, nbd, padding=3, group=16), perm=[0, 2, 3, 1]), ng, nbe) @ nw1) }
    tn = transpose(nx, perm=[0, 2, 3, 1])
    cf = kernel { layernorm(tn, ng, nbe) }
    qsm = kernel { quantize_linear(softmax(y), 0.004, qz) }
    qln = kernel { quantize_linear(layernorm(y, g, be), 0.02, qz) }
    qrm = kernel { quantize_linear(rmsnorm(y, g), 0.02, qz) }
    return sk, sp, bg, ag, am, a1, a2, sg, rm, ln, sm, rr, st, cat, cd, wg, gr, d7, gg, one, mp, w2, d2, qm, qq, qc, tr, ir, is, cn, cf, qsm, qln, qrm
}
"""


def emitted(src: str, monkeypatch, params=frozenset(), precision="f32") -> list[tuple]:
    """(plan, its C, the (template, NAME) of each template it was rendered from) of every kernel."""
    import eqfuse.backend.cexpr as cexpr
    from eqfuse.backend.cbuild import render as original
    from eqfuse.backend.emit import emit_kernel
    from eqfuse.frontend.load import load
    from eqfuse.pipeline import lower, optimize

    rendered = []
    monkeypatch.setattr(cexpr, "cb_render", lambda t, **v: rendered.append((t, v.get("NAME"))) or original(t, **v))
    out = []
    for g in load(src):
        fused, _ = optimize(g, fuse="manual")
        for p in lower(fused, {}, fuse="manual", params=frozenset(params), precision=precision)[2]:
            if p.kind == "view":
                continue
            rendered.clear()
            out.append((p, emit_kernel(p), list(rendered)))
    return out


def chosen(p, template: str, name: str, field: str) -> int:
    """The value the plan says the C of `template` (rendered as NAME `name`) declares for `field`."""
    from eqfuse.backend.kinds.contraction.emit_gemm import BF16_PATHS, SPLITS
    from eqfuse.backend.kinds.contraction.qgemm import INT8_PATHS
    from eqfuse.backend.lower import plan_decisions

    printed = {**plan_decisions(p), **p.tiles}
    if field == "precision_path":
        return (INT8_PATHS if template == "gemm_u8s8.c" else BF16_PATHS)[p.precision_path]
    if field == "parallel" and template.startswith("row_") and p.kind != "row":
        assert printed["split"] == "rows"  # a GEMM's row epilogue: on the thread that finished the rows
        return -1
    if field in ("quantize_out", "quantize_flat", "sum_apart") and template.startswith("row_") and p.kind != "row":
        return 0  # a GEMM's row epilogue stores into C, f32 (classify refuses a quantized one)
    if field == "plane" and printed.get("channels"):  # (the channels path tiles by rw and band: PLANE 0, unused)
        return 0
    if field == "block_parallel":
        return int(printed[field].split("/")[int(name.rsplit("_copy", 1)[1])])
    value = printed[field]
    return {"split": SPLITS}.get(field, {}).get(value, value)


def test_every_choice_of_a_plan_is_the_constant_in_its_c(planned_model, monkeypatch):
    """Each choice placeholder of each template a kernel was written from (CHOICES) holds what the
    plan printed by `eqfuse lower` says; every choice of every template is seen at least once."""
    kernels = (emitted(KINDS, monkeypatch) + emitted(MORE, monkeypatch, params={"w", "ws", "wb", "f2", "dw7", "spw"})
               + emitted(MORE.replace("graph more", "graph bf"), monkeypatch, precision="bf16"))
    monkeypatch.setenv("EQFUSE_CONV", "im2col")  # (a 3x3 conv's column matrix)
    kernels += emitted(KINDS.replace("graph kinds", "graph cols"), monkeypatch)
    seen: dict[tuple[str, str], set] = {}
    for p, c, rendered in kernels:
        for key, value in p.tiles.items():  # (every tile, of these kernels too)
            assert declared(c, key, value), (p.name, key, value)
        for template, name in rendered:
            for x, field in CHOICES[template].items():
                value = chosen(p, template, name, field)
                assert re.search(rf"^[ \t]*#define {name}_{x} {value}L?\b", c, re.M), (p.name, template, x, value)
                seen.setdefault((template, x), set()).add(value)
    # (conv_amx.c: the direct conv on AMX tiles, planned only for a machine with AMX-BF16)
    expected = {(t, x) for t, xs in CHOICES.items() for x in xs if planned_model.amx_bf16 or t != "conv_amx.c"}
    assert set(seen) == expected, sorted(expected - set(seen))
    # a pooling's C reads its choices through their #defines, not a copy of their values: the
    # blocked layout and lanes (between convs), the stride-2 max pool's vector path
    pools = [(p, c) for p, c, _ in kernels if p.kind == "index" and p.detail.op in ("max_pool2d", "avg_pool2d")]
    blocked = [(p, c) for p, c in pools if p.detail.in_blocked or p.detail.out_blocked]
    assert blocked and any(p.detail.pool_s2 for p, _ in pools)
    for p, c in blocked:
        assert f"#if {p.name}_IN_BLOCKED" in c and f"#if {p.name}_OUT_BLOCKED" in c and f"l < {p.name}_VL;" in c, p.name
        assert not re.search(r"\bl < \d+;", c), p.name  # (no lane count but the plan's)
    for p, c in pools:
        if p.detail.pool_s2:
            assert f"#if {p.name}_POOL_S2 && defined(__AVX512F__)" in c, p.name
    # both values of the flags this covers cheaply
    for key in [("gemm.c", "PARALLEL"), ("gemm.c", "BF16"), ("gemm.c", "DIRECT_B"), ("gemm_skinny.c", "PACK_PARTS"),
                ("pointwise.c", "STREAM"), ("pointwise.c", "TWO_PASS"), ("row_softmax.c", "PARALLEL"),
                ("row_softmax.c", "QUANTIZE_OUT"), ("row_layernorm.c", "QUANTIZE_OUT"), ("row_rmsnorm.c", "QUANTIZE_OUT"),
                ("conv2d.c", "IM2COL"), ("attention.c", "SCORE_OPS"), ("attention.c", "BF16"),
                ("attention_decode.c", "SCORE_OPS"), ("conv_direct.c", "BF16"),
                ("conv_winograd.c", "BF16")]:
        if key[1] == "BF16" and key[0] != "gemm.c" and planned_model.bf16_dot_ratio <= 1:
            # (vdpbf16ps no faster than the FMA: these kernels compute in f32, plan_gemm.bf16_pays)
            assert seen[key] == {0}, (key, seen[key])
            continue
        assert len(seen[key]) > 1, (key, seen[key])


def test_lower_prints_every_choice():
    text = uops_text(KINDS, fuse="manual")
    assert "direct_a=" in text and "direct_b=" in text and "vl=" in text
    assert "thread_loop=" in text and "block_parallel=" in text and "epi_blocked=" in text


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


@pytest.mark.parametrize("K, slices", [(1024, 1), (1360, 1), (1536, 2), (2203, 3), (3072, 3)])
def test_a_bf16_gemm_slices_k_deeper_by_its_bytes(K, slices):
    """On the vdpbf16ps path (A packed as bf16) K slices are BF16_KC deep (a K up to half again in one), as far
    as the A micro-panel fits half of L1, and whole K-pairs but the last; f32's stay shallower."""
    from eqfuse.backend.kinds.contraction.plan_gemm import BF16, BF16_KC, gemm_tiles
    from eqfuse.machine import MODELS

    m = MODELS["zen4"]
    t = gemm_tiles(64, 512, K, m, even_kc=True, a_bytes=BF16)
    assert -(-K // t["kc"]) == slices and t["kc"] <= BF16_KC * 3 // 2 and t["mr"] * t["kc"] * BF16 <= m.l1 // 2
    assert t["kc"] == K or t["kc"] % 2 == 0
    assert gemm_tiles(64, 512, K, m)["kc"] < t["kc"] or K < 1024


@pytest.mark.heavy  # (the fast tier's time)
def test_small_gemms_open_no_parallel_region_and_the_plan_says_so(machine_model):
    """GEMMs and convs below plan_gemm.PARALLEL_MIN_FMAS run on the calling thread: the plan's
    detail.parallel is the `if` of the C's parallel regions (or the `parallel` of its loops on the
    claim-based pool, eqf_region), and its thread rule says so."""
    mod = eqfuse.compile(GEMMS, fuse="manual")
    plans = {p.name: p for p in mod.gemms.last.plans}
    seen = set()
    for k in mod.kernels:
        p = plans[k.name]
        par = p.detail.parallel
        assert (f"#pragma omp parallel if ({int(par)})" in k.c_source
                or re.search(rf"eqf_region\(.*, {int(par)}\);", k.c_source)), k.name
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
