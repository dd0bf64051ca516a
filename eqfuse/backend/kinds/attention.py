"""The attention kind: softmax(q @ k^T * scale [+ mask]) @ v in one pass over key tiles with an
online softmax (csrc_templates/attention.c); q, k^T and v read in place through layout views,
the result possibly written through transposes (the head merge). One query row per (batch, head)
(a decode step's attention over its KV cache) is the plan's `decode`:
csrc_templates/attention_decode.c, its keys and values read row by row where they lie."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from itertools import count

from eqfuse.backend.cexpr import (
    I1,
    I3,
    I4,
    Exprs,
    Space,
    kernel_params,
    param_job,
    render,
)
from eqfuse.backend.indexing import bstrides, offset, result_strides, view_strides
from eqfuse.backend.kinds.base import Kind
from eqfuse.backend.kinds.contraction.emit_gemm import BF16_PATHS
from eqfuse.backend.kinds.contraction.plan_gemm import (
    PARALLEL_MIN_FMAS,
    bf16_pays,
    bf16_path,
    f32_reason,
    gemm_bf16_path,
    why_not_bf16,
)
from eqfuse.backend.plan import KernelPlan, UOp, computes_f32, size
from eqfuse.ir.graph import Graph
from eqfuse.ir.kernels import F32, K
from eqfuse.ir.ops import flit


@dataclass(frozen=True)
class AttentionDetail:
    batch: int
    Sq: int
    Sk: int
    D: int
    Dv: int
    parallel: bool  # the `if` of the parallel region
    vec: bool = False  # the vectorized micro-kernels (whole 64-key tiles, v rows contiguous): after_views
    # the score has ops of its own (a mask, a bias) run in a score pass; else it is q k^T times a
    # constant, folded into the q block (`_score_scale`)
    score_ops: bool = False
    # one query row per (batch, head) (Sq = 1, a decode step): csrc_templates/attention_decode.c,
    # the keys and values read in place row by row, in f32 (`_plan_decode`); else attention.c
    decode: bool = False
    # the decode plan's keys / values read from a bf16 KV cache (uint16), widened to f32 by a
    # 16-bit shift (eqfuse.backend.live.cache_bf16)
    k_bf16: bool = False
    v_bf16: bool = False
    # the decode plan's k and v read from KV caches of fewer heads than the query's (grouped-query
    # attention): query head h reads key/value head h / kv_group, the repeat kernel that copied
    # the cache for the query heads gone (eqfuse.backend.live._read_through_repeats). kv_read is
    # how: for k then v, ((batch sizes, the cache's strides along them), (its two matrix dims'
    # strides)), a layout like the strides of a view
    kv_group: int = 1
    kv_read: tuple = ()
    # the decode plan's query rows per task, sharing one pass over the keys and values: kv_group
    # when a key/value head's query heads are consecutive rows (the repeat's axis the innermost
    # batch dim), so each cache row is read once per key/value head, not once per query head
    kv_rows: int = 1
    # a constant the keys were scaled by in front of the repeat (an export's sqrt(scale)), folded
    # into q with the score scale
    k_scale: float = 1.0
    # the decode plan's tasks are chunks of the claim-based pool (common_pool.h), as its step's
    # few-rows GEMMs: the run function then holds the pool across the attention
    # (runtime.program.hold_pool), where an OpenMP region would let the pool's worker fall asleep
    # and wake OpenMP's, both at every layer; else an OpenMP region (the `if` is `parallel`)
    pool: bool = False


def _score_scale(body: Graph, score: int, qk: int) -> float | None:
    """c when the attention score is q k^T * c, c * q k^T or q k^T / c with c a constant (1.0 for
    q k^T itself); None when it has other ops (masks, biases)."""
    if score == qk:
        return 1.0
    n = body.nodes[score]
    if n.op not in ("mul", "div") or len(n.args) != 2:
        return None
    a, b = (body.nodes[x] for x in n.args)
    if n.op == "mul" and a.op == "const" and n.args[1] == qk:
        return float(a.value)
    if n.args[0] == qk and b.op == "const":
        return float(b.value) if n.op == "mul" else 1.0 / float(b.value)
    return None


# The fewest keys with which a bf16 attention takes AMX tiles: with fewer, its 64-key tiles are mostly
# zeros, and the tiles' per-tile work (k^T and v packed per head, scores and accumulators through
# memory around each product) cost more than f32 on the vectors: 17 keys ran 1.45x slower, 32 and 50
# keys level (within 5%), 64 keys 1.3-1.4x faster, 128 keys 2x, 512 keys 3x
# (`python benchmarks/bench_attention.py --precision bf16`)
AMX_MIN_KEYS = 64


def _amx(m) -> bool:
    """Whether machine m runs a bf16 attention's two products on AMX tiles (where the blocks suit
    them: after_views)."""
    return gemm_bf16_path(m) == "amx_bf16" and bf16_pays(m, "amx_bf16")


def _v_strides(plan: KernelPlan) -> tuple[int, ...]:
    body, p = plan.body, plan.shape.parts
    res = tuple(body.nodes[p.result].type.shape)
    _, st = view_strides(body, p.v, plan.base_strides())
    return bstrides(body.nodes[p.v].type.shape, res[:-2] + (plan.detail.Sk, plan.detail.Dv), st)


class Attention(Kind):
    kinds = (K.ATTENTION,)

    def plan(self, plan: KernelPlan, c) -> None:
        # precision="bf16": q k^T and p v multiply bf16 operands, accumulating in f32; the softmax
        # stays f32. The instruction path is chosen in after_views (it needs `vec`). Without a bf16
        # multiply that pays (AMX tiles, or plan_gemm.bf16_pays's) it computes in f32.
        if plan.wanted_precision == "bf16" and not (_amx(c) or bf16_pays(c)):
            computes_f32(plan, f32_reason(c))
        else:
            plan.precision = "bf16" if plan.wanted_precision == "bf16" else "f32"
        body, p = plan.body, plan.shape.parts
        qs, kts, vs = (body.nodes[i].type.shape for i in (p.q, p.kt, p.v))
        pv = body.nodes[plan.shape.anchor]
        Sq, D = qs[-2], qs[-1]
        Sk = kts[-1]
        Dv = vs[-1]
        batch = size(pv.type.shape[:-2])
        if Sq == 1:
            return self._plan_decode(plan, c, batch, Sk, D, Dv)
        # A key tile of 64 is four 16-lane vectors (the micro-kernels' width). The query block is
        # the largest whose q block, score tile and accumulators share L1 with the key tile, when
        # the key tile takes at most half of L1; a larger one (head size 128: 32 KiB) streams from
        # L2 row by row, each row used by 4 query rows x 64 keys of FMAs, and is left out of the
        # count (counted, it forced blocks of 4 queries: every key tile read again per 4 rows).
        bk = 64 if D * 64 * F32 <= c.l2 // 4 else 16
        kt_l1 = D * bk * F32 if D * bk * F32 <= c.l1 // 2 else 0
        if Sk <= 16:  # a few keys: one tile of 16, not 64 (GPT-2's test heads of 16 x 16; at 32
            bk = 16   # keys the 64-key path still wins: benchmarks/bench_models.py --model gpt2)
        kt_l1 = D * bk * F32 if D * bk * F32 <= c.l1 // 2 else 0
        bq = 32
        while bq > 4 and ((bq * D + bq * bk + bq * Dv) * F32 + kt_l1 > c.l1 or bq >= 2 * Sq):
            bq //= 2
        ws = (bq * D + bq * bk + bq * Dv) * F32 + kt_l1
        plan.tiles = {"bq": bq, "bk": bk}
        plan.flops = batch * (2 * Sq * Sk * D + 2 * Sq * Sk * Dv + 6 * Sq * Sk)
        # its two products as one GEMM's multiply-adds: a parallel region only above the GEMMs' bar
        fmas, nqb_ = batch * Sq * Sk * (D + Dv), -(-Sq // bq)
        par = batch * Sq > 1 and fmas >= PARALLEL_MIN_FMAS
        score_ops = _score_scale(body, body.nodes[p.sm].args[0], p.qk) is None
        plan.detail = AttentionDetail(batch, Sq, Sk, D, Dv, par, score_ops=score_ops)
        plan.threads = (f"the {batch} x {nqb_} (batch, {bq}-query block) tasks split evenly among the threads"
                        if par else
                        f"one thread, no parallel region ({fmas} multiply-adds < {PARALLEL_MIN_FMAS}, "
                        "plan_gemm.PARALLEL_MIN_FMAS)")
        held = "q block, k tile, score tile, accumulators" if kt_l1 else \
            f"q block, score tile, accumulators; the {D * bk * F32} B k tile streams from L2"
        plan.cache_check = (f"tile working set ({held}) {ws} B <= L1 {c.l1} B: "
                            f"{'ok' if ws <= c.l1 else 'NO'}; largest buffer {bq} x {bk} scores, never {Sq} x {Sk}")
        nqb, nkt = -(-Sq // bq), -(-Sk // bk)

        def via(i):  # q, k^T and v may be read in place through transposes / reshapes
            return "" if body.nodes[i].op == "input" else " (strided, through its layout view)"

        out_via = "" if p.result == body.outputs[0] else " (strided, through the output transpose)"
        mul = ", bf16 operands, f32 accumulation" if plan.precision == "bf16" else ""
        plan.uops += [
            UOp(0, "Loop", f"batch {batch} x query blocks of {bq} (parallel)", batch * nqb),
            UOp(1, "Load", f"q block [{bq} x {D}]{via(p.q)}", batch * nqb),
            UOp(1, "Loop", f"key tiles of {bk} over {Sk}", batch * nqb * nkt),
            UOp(2, "Load", f"k^T tile [{D} x {bk}] of the per-head padded copy of k^T{via(p.kt)}", batch * nqb * nkt),
            UOp(2, "Exec", f"scores {bq} x {bk} = q k^T ({bq * bk * D} FMA{mul}) + score ops"
                           f"{' + mask' if p.mask is not None else ''}", batch * nqb * nkt),
            UOp(2, "Exec", "online softmax in base 2: row max, lazy rescale (only when the max rises "
                           "by more than 2^8), exp2", batch * nqb * nkt),
            UOp(2, "Load", f"v tile [{bk} x {Dv}]{via(p.v)}", batch * nqb * nkt),
            UOp(2, "Exec", f"acc [{bq} x {Dv}] += p v ({bq * bk * Dv} FMA{mul})", batch * nqb * nkt),
            UOp(1, "Store", f"out block [{bq} x {Dv}] / row sums, epilogue{out_via}", batch * nqb)]
        self.after_views(plan, c)

    def _plan_decode(self, plan: KernelPlan, c, batch: int, Sk: int, D: int, Dv: int) -> None:
        """One query row per task (a decode step's attention over its KV cache): each task reads its
        keys and values once, in place, in blocks of 64 keys (whose scores stay on the stack). The
        general kernel would pad the row to a block of 4 queries and copy each head's k^T into a
        tile first, so the keys would be read twice and written once before any score
        (benchmarks/RESULTS.md, "The decode attention reads the cache in place")."""
        body, p = plan.body, plan.shape.parts
        # f32 arithmetic under precision="bf16" too: its time is the cache's bytes, which bf16
        # operands would not reduce. A bf16 KV cache (eqfuse.backend.live.cache_bf16, after this)
        # halves them: k and v then widen to f32 as they are read.
        computes_f32(plan, "the decode attention reads an f32 KV cache in place; its time is the cache's "
                           "bytes, which bf16 operands would not reduce")
        bk = 64  # four 16-lane vectors of scores per softmax step
        plan.tiles = {"bk": bk}
        plan.flops = batch * (2 * Sk * D + 2 * Sk * Dv + 6 * Sk)
        fmas = batch * Sk * (D + Dv)
        par = batch > 1 and fmas >= PARALLEL_MIN_FMAS
        score_ops = _score_scale(body, body.nodes[p.sm].args[0], p.qk) is None
        plan.detail = AttentionDetail(batch, 1, Sk, D, Dv, par, score_ops=score_ops, decode=True, pool=par)
        plan.threads = (f"the {batch} (batch, head) query rows claimed one at a time by the threads of the "
                        "claim-based pool (common_pool.h), as the decode step's few-rows GEMMs" if par else
                        f"one thread, no parallel region ({fmas} multiply-adds < {PARALLEL_MIN_FMAS}, "
                        "plan_gemm.PARALLEL_MIN_FMAS)")
        ws = (bk + D + Dv + 16) * F32
        plan.cache_check = (f"q row, {bk} scores, accumulators and row sum {ws} B on the stack; "
                            f"k and v rows stream once, in place")
        nkt = -(-Sk // bk)

        def via(i):
            return "" if body.nodes[i].op == "input" else " (strided, through its layout view)"

        out_via = "" if p.result == body.outputs[0] else " (strided, through the output transpose)"
        plan.uops += [
            UOp(0, "Loop", f"{batch} (batch, head) query rows (parallel)", batch),
            UOp(1, "Load", f"q row [{D}]{via(p.q)}, times the folded score scale", batch),
            UOp(1, "Loop", f"key blocks of {bk} over {Sk}", batch * nkt),
            UOp(2, "Load", f"{bk} k rows [{D}] in place{via(p.kt)}", batch * nkt),
            UOp(2, "Exec", f"scores [{bk}] = k q ({bk * D} FMA) + score ops"
                           f"{' + mask' if p.mask is not None else ''}", batch * nkt),
            UOp(2, "Exec", "online softmax in base 2: block max, lazy rescale (only when the max rises "
                           "by more than 2^8), exp2", batch * nkt),
            UOp(2, "Load", f"{bk} v rows [{Dv}] in place{via(p.v)}", batch * nkt),
            UOp(2, "Exec", f"acc [{Dv}] += p v ({bk * Dv} FMA)", batch * nkt),
            UOp(1, "Store", f"out row [{Dv}] / row sum, epilogue{out_via}", batch)]

    def after_views(self, plan: KernelPlan, caches) -> None:
        """The vectorized micro-kernels need whole 64-key tiles, blocks of 4 queries, and rows of
        v that are contiguous vectors of 16 (v's strides are known once views are placed)."""
        d, t = plan.detail, plan.tiles
        if d.decode:
            return
        nb = len(plan.body.nodes[plan.shape.parts.result].type.shape) - 2
        vec = t["bk"] % 64 == 0 and t["bq"] % 4 == 0 and d.Dv % 16 == 0 and _v_strides(plan)[nb + 1] == 1
        plan.detail = replace(d, vec=vec)
        # bf16: AMX tiles where the CPU has them and the blocks are whole tiles; else vdpbf16ps in
        # the vectorized micro-kernels where the CPU has AVX512_BF16; the portable loops (and CPUs
        # without it) multiply operands rounded to bf16 with the f32 FMA
        if plan.precision == "bf16":
            tiles = vec and t["bq"] % 16 == 0
            if _amx(caches) and tiles and d.Sk >= AMX_MIN_KEYS:
                plan.precision_path, plan.precision_note = "amx_bf16", ""
                return
            if not bf16_pays(caches):  # (AMX, but not for this attention: see after_views' rule)
                why = (f"fewer than {AMX_MIN_KEYS} keys, a 64-key tile mostly padding" if tiles else
                       "its tiles are not whole 64-key tiles with rows of v in vectors of 16 and query blocks of "
                       "whole 16-row tiles")
                computes_f32(plan, f"{why_not_bf16(caches)}, and this attention does not take the AMX path ({why}): "
                                   "it computes in f32 (docs/precision.md, \"Attention on AMX tiles\")")
                return
            path = bf16_path(caches)
            plan.precision_path = path if vec else "fallback"
            plan.precision_note = "" if path == plan.precision_path else \
                "the fallback: the tiles are not whole 64-key tiles with rows of v in vectors of 16"

    def emit(self, plan: KernelPlan) -> str:
        """q, k^T and v are read in place through their views (strides), the result is written
        through its output transposes (strides); k^T is first copied per head into a padded tile."""
        body, p = plan.body, plan.shape.parts
        pv = plan.shape.anchor
        res = tuple(body.nodes[p.result].type.shape)
        nb = len(res) - 2
        bdims = list(range(nb))
        d = plan.detail
        Sq, Sk, D, Dv = d.Sq, d.Sk, d.D, d.Dv
        batch = res[:-2]
        params, ptrs = kernel_params(plan)

        base = plan.base_strides()  # inputs read through views

        def strided(i, tail):  # (input pointer, strides over batch + tail) of the view node i
            src, st = view_strides(body, i, base)
            return ptrs[src], bstrides(body.nodes[i].type.shape, batch + tail, st)

        Q, qs = strided(p.q, (Sq, D))
        Kp, ks = strided(p.kt, (D, Sk))
        V, vs = strided(p.v, (Sk, Dv))
        os_ = result_strides(body, p.result)
        koff, voff = offset("b", batch, ks[:nb]), offset("b", batch, vs[:nb])
        if d.kv_read:  # grouped-query: the caches themselves, head h / kv_group (the plan's kv_group)
            ((kn, kst), (kd, kj)), ((vn, vst), (vr, vc)) = d.kv_read
            koff, voff = offset("b", kn, kst), offset("b", vn, vst)
            ks, vs = ks[:nb] + (kd, kj), vs[:nb] + (vr, vc)
        # k^T is transposed once per distinct head: the batch dims along which it does not broadcast
        kdims = [i for i in bdims if ks[i] != 0]
        kb_index = [0] * nb
        acc = 1
        for i in reversed(kdims):
            kb_index[i] = acc
            acc *= batch[i]
        ids = count()
        sspace = Space(batch + (Sq, Sk), [("b", bdims, True), ("i", [nb], False), ("j", [nb + 1], False)], I1, ids)
        sc = Exprs(body, sspace, ptrs, {p.qk: "acc_s"}, I4)
        # The softmax works in base 2. A score q k^T * c (or / c, or plain q k^T) is folded into the
        # q block as a factor c log2 e, and the score pass then only masks the keys past the end.
        scale = _score_scale(body, body.nodes[p.sm].args[0], p.qk)
        assert (scale is None) == d.score_ops, "the plan's score_ops"
        if d.score_ops:
            score, qscale, slog2e = sc.value(body.nodes[p.sm].args[0]), "1.0f" if d.k_scale == 1.0 else flit(d.k_scale), "EQF_LOG2E"
        else:
            score, qscale, slog2e = "acc_s", flit(d.k_scale * scale * math.log2(math.e)), "1.0f"
        ospace = Space(res, [("b", bdims, True), ("i", [nb], False), ("e", [nb + 1], False)], I1, ids)
        epi = Exprs(body, ospace, ptrs, {pv: "v"}, I3, forbid={p.qk, p.sm})
        e = epi.value(p.result)
        bk, bq = plan.tiles["bk"], plan.tiles.get("bq", 1)
        # keys over a KV cache (eqfuse.backend.live): the live length and the new rows, at run time;
        # a named dim at run time (eqfuse.backend.runtime_dim): the queries, and the keys when they are it
        # (a chunk step's new rows at run time too: its `live_new` queries, live + live_new keys)
        sq = "live_new" if plan.live is not None and plan.live.new_length >= 0 else str(Sq)
        sk = plan.live.end if plan.live else str(Sk)
        if plan.live is not None and plan.live.what == "dim":
            sq, sk = "live", "live" if Sk == plan.live.rows else str(Sk)
        if plan.live:
            params += plan.live.params
        if d.decode:
            # (the offsets are declared where each of a task's rows is: some scopes use none)
            decls = sspace.decls + ospace.decls
            used = [f"{I1}(void){m.group(1)};" for x in decls for m in [re.search(r"(\w+)\s*=", x)] if m]
            return render("attention_decode.c", NAME=plan.name, PARAMS=params, BATCH=size(batch), SK=sk, D=D, DV=Dv,
                          BK=bk, PARALLEL=int(d.parallel), ZERO_NAN=int(body.nodes[p.sm].attr["zero_nan"]),
                          Q=Q, QOFF=offset("b", batch, qs[:nb]), QC=qs[nb + 1],
                          K=Kp, KOFF=koff, KD=ks[nb], KJ=ks[nb + 1],
                          V=V, VOFF=voff, VR=vs[nb], VC=vs[nb + 1],
                          OUT_OFF=offset("b", batch, os_[:nb]), OR=os_[nb], OC=os_[nb + 1],
                          OFFSETS="\n".join(decls + used),
                          SCORE_BODY=sc.text(), SCORE=score, QSCALE=qscale, SCORE_LOG2E=slog2e,
                          SCORE_OPS=int(d.score_ops), EPI_BODY=epi.text(), EPI=e,
                          K_BF16=int(d.k_bf16), V_BF16=int(d.v_bf16), G=d.kv_rows, POOL=int(d.pool),
                          **param_job(params))
        return render("attention.c", NAME=plan.name, PARAMS=params, BATCH=size(batch), SQ=sq, SK=sk, D=D, DV=Dv,
                      BQ=bq, BK=bk, SKP=-(-Sk // bk) * bk, VEC=int(d.vec),
                      ZERO_NAN=int(body.nodes[p.sm].attr["zero_nan"]), PARALLEL=int(d.parallel),
                      Q=Q, QOFF=offset("b", batch, qs[:nb]), QR=qs[nb], QC=qs[nb + 1],
                      K=Kp, KSRC=offset("kb", [batch[i] for i in kdims], [ks[i] for i in kdims]),
                      KBI=offset("b", batch, kb_index), KD=ks[nb], KJ=ks[nb + 1],
                      V=V, VOFF=offset("b", batch, vs[:nb]), VR=vs[nb], VC=vs[nb + 1],
                      OUT_OFF=offset("b", batch, os_[:nb]), OR=os_[nb], OC=os_[nb + 1],
                      OFFSETS="\n".join(sspace.decls + ospace.decls),
                      SCORE_BODY=sc.text(), SCORE=score, QSCALE=qscale, SCORE_LOG2E=slog2e, SCORE_OPS=int(d.score_ops),
                      EPI_BODY=epi.text(), EPI=e, BF16=BF16_PATHS[plan.precision_path])
