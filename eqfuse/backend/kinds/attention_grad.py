"""The attention-gradient kind: attention_dq, attention_dk or attention_dv over kernel inputs
(eqfuse/ir/ops_attention.py), from csrc_templates/attention_grad.c.

Each kernel recomputes the probabilities P = softmax(q @ k^T * scale + mask) from q and k, a block
of rows at a time; the Sq x Sk matrix is never stored (per thread: a block of score and dP rows,
and the batch's k^T and v^T, or q^T and dy^T; for dk and dv, three floats of statistics per query
row). q, k, v, dy and the mask are read in
place through any strides (the head split transposes are views), and the result is written
through any strides (the head merge transpose that follows it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from eqfuse.backend.cexpr import kernel_params, render
from eqfuse.backend.indexing import bstrides, contiguous, offset
from eqfuse.backend.kinds.base import PARALLEL_MIN, Kind, parallel_rule
from eqfuse.backend.plan import KernelPlan, UOp, size
from eqfuse.ir.kernels import K
from eqfuse.ir.ops import flit
from eqfuse.ir.ops_attention import ARGS, attention_grad_flops

MODES = {"attention_dq": 0, "attention_dk": 1, "attention_dv": 2}


@dataclass(frozen=True)
class AttentionGradDetail:
    op: str
    batch: tuple[int, ...]
    Sq: int
    Sk: int
    D: int
    Dv: int
    parallel: bool  # the `if` of the parallel region
    rb: int = 1  # rows per block: 4 when 4 divides both sequence lengths
    vec: bool = False  # the AVX-512 micro-kernels (after_views: needs the strides)


class AttentionGrad(Kind):
    kinds = (K.ATTENTION_GRAD,)
    writes_strided = True


    def plan(self, plan: KernelPlan, c) -> None:
        n = plan.body.nodes[plan.shape.anchor]
        t = dict(zip(ARGS[n.op][0], (plan.body.nodes[a].type.shape for a in n.args)))
        q, k, dy = t["q"], t["k"], t["dy"]
        batch, Sq, Sk, D, Dv = tuple(q[:-2]), q[-2], k[-2], q[-1], dy[-1]
        rows = size(batch) * (Sq if n.op == "attention_dq" else Sk)
        work = size(batch) * Sq * Sk * (D + Dv)
        par = work >= 8 * PARALLEL_MIN and rows > 1
        plan.detail = AttentionGradDetail(n.op, batch, Sq, Sk, D, Dv, par, 4 if Sq % 4 == 0 and Sk % 4 == 0 else 1)
        plan.threads = parallel_rule(par, f"{work} score and dP products", 8 * PARALLEL_MIN,
                                     "the query rows, then the key rows,")
        rb = plan.detail.rb
        per_thread = 4 * ((D + Dv) * max(Sq, Sk) + 2 * rb * max(Sq, Sk))
        plan.cache_check = (f"per thread {per_thread} B (the transposed batch and {rb}-row blocks of scores and dP) "
                            f"<= L2 {c.l2} B: {'ok' if per_thread <= c.l2 else 'no'}; never {Sq} x {Sk}")
        passes = 1 if n.op == "attention_dq" else 2
        plan.flops = attention_grad_flops(n.op, size(batch) * Sq, Sk, D, Dv)
        plan.uops = [UOp(0, "Loop", f"{size(batch)} x {Sq} query rows", size(batch) * Sq),
                     UOp(1, "Exec", f"the row's {Sk} scores, softmax statistics and dP", size(batch) * Sq),
                     UOp(0, "Loop", f"{size(batch)} x {Sk} key rows, P recomputed" if passes == 2 else
                         "(dq: each query row's result from its own row)", size(batch) * Sk if passes == 2 else 0),
                     UOp(1, "Store", "a result row", rows)]

    def after_views(self, plan: KernelPlan, caches) -> None:
        """The micro-kernels of common.h (4 rows x 64 columns) need whole 64-row tiles of both
        sequences, widths of 16, 32 or 64, and contiguous rows for the matrix each result row
        accumulates (k for dq, dy for dv, q for dk)."""
        d = plan.detail
        n = plan.body.nodes[plan.shape.anchor]
        acc_arg = n.args[{"attention_dq": 1, "attention_dk": 0, "attention_dv": 2}[n.op]]
        st = plan.base_strides().get(acc_arg)
        vec = (d.Sq % 64 == 0 and d.Sk % 64 == 0 and d.D in (16, 32, 64) and d.Dv in (16, 32, 64)
               and (st is None or st[-1] == 1))
        plan.detail = replace(d, vec=vec)

    def emit(self, plan: KernelPlan) -> str:
        body, d = plan.body, plan.detail
        n = body.nodes[plan.shape.anchor]
        names = ARGS[n.op][0]
        params, ptrs = kernel_params(plan)
        base = plan.base_strides()
        nb = len(d.batch)

        def strided(arg: int, rows: int, cols: int):
            x = body.nodes[arg]
            st = bstrides(x.type.shape, d.batch + (rows, cols), base.get(arg) or contiguous(x.type.shape))
            return ptrs[arg], offset("b", d.batch, st[:nb]), st[nb], st[nb + 1]

        t = dict(zip(names, n.args))
        Q, QOFF, QR, QC = strided(t["q"], d.Sq, d.D)
        Kp, KOFF, KR, KC = strided(t["k"], d.Sk, d.D)
        DY, DYOFF, DYR, DYC = strided(t["dy"], d.Sq, d.Dv)
        V, VOFF, VR, VC = strided(t["v"], d.Sk, d.Dv) if "v" in t else ("((const float*)0)", "0", 0, 0)
        mask = ""
        if len(n.args) > len(names):
            M, MOFF, MR, MC = strided(n.args[-1], d.Sq, d.Sk)
            mask = f" + {M}[({MOFF}) + i * {MR}L + j * {MC}L]"
        what = {"attention_dq": "dq = dS k", "attention_dk": "dk = dS^T q", "attention_dv": "dv = P^T dy"}[n.op]
        outd = d.Dv if n.op == "attention_dv" else d.D
        ost = plan.out_strides or contiguous(plan.out_shape)
        return render("attention_grad.c", NAME=plan.name, WHAT=what, PARAMS=params, MODE=MODES[n.op],
                      BATCH=size(d.batch), SQ=d.Sq, SK=d.Sk, D=d.D, DV=d.Dv, OUTD=outd,
                      SCALE=flit(n.attr["scale"]), ZERO_NAN=int(n.attr["zero_nan"]), PARALLEL=int(d.parallel), RB=d.rb, VEC=int(d.vec),
                      Q=Q, QOFF=QOFF, QR=QR, QC=QC, K=Kp, KOFF=KOFF, KR=KR, KC=KC,
                      V=V, VOFF=VOFF, VR=VR, VC=VC, DY=DY, DYOFF=DYOFF, DYR=DYR, DYC=DYC, MASK_IJ=mask,
                      OOFF=offset("b", d.batch, ost[:nb]), OR=ost[nb], OC=ost[nb + 1])
