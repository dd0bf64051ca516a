"""The geometry of a conv2d as its kernel's C reads it: the one place that reads a conv node's
shapes and attributes for the conv kernels (conv: direct and Winograd; conv_grouped; conv_dwpw;
conv_dwln; the im2col GEMM, plan_gemm and emit_gemm; the integer GEMM of conv_integer, qgemm).
The conv plan details inherit ConvGeometry and add their output channels (a fused kernel's are
its last conv's or matmul's, not the depthwise conv's) and their choices.
"""

from __future__ import annotations

from dataclasses import dataclass

from eqfuse.backend.plan import KernelPlan
from eqfuse.ir.kernels import uneven_pads_conv
from eqfuse.ir.ops import conv_pads, pair


@dataclass(frozen=True)
class ConvGeometry:
    """A conv2d's input [N][C][H][W], its KH x KW window and its output's OH x OW pixels."""

    N: int
    C: int
    H: int
    W: int
    KH: int
    KW: int
    OH: int
    OW: int
    stride: tuple[int, int]
    # top, left: a kernel that may be padded unevenly (ir.kernels.uneven_pads_conv) zero-fills
    # whatever a tap reads past the image's bottom or right edge, sized by OH and OW
    padding: tuple[int, int]
    dilation: tuple[int, int]

    def in_rows(self, out_rows: int) -> int:
        """The padded input rows that `out_rows` consecutive output rows read."""
        return (out_rows - 1) * self.stride[0] + (self.KH - 1) * self.dilation[0] + 1

    def in_cols(self, out_cols: int) -> int:
        """The padded input columns that `out_cols` consecutive output columns read."""
        return (out_cols - 1) * self.stride[1] + (self.KW - 1) * self.dilation[1] + 1

    def shape_c(self, *omit: str) -> dict[str, int]:
        """The templates' shape placeholders: N C H W KH KW OH OW, the stride SH SW, the top and
        left padding PH PW and the dilation DH DW; but those in `omit`, which a template has not."""
        c = dict(N=self.N, C=self.C, H=self.H, W=self.W, KH=self.KH, KW=self.KW, OH=self.OH, OW=self.OW,
                 SH=self.stride[0], SW=self.stride[1], PH=self.padding[0], PW=self.padding[1],
                 DH=self.dilation[0], DW=self.dilation[1])
        return {k: v for k, v in c.items() if k not in omit}


def conv_geometry(plan: KernelPlan, conv: int) -> ConvGeometry:
    """The geometry of the conv2d (or conv_integer) at body node `conv` of the plan's kernel. Only the conv that
    ir.kernels.uneven_pads_conv names may be padded unevenly ([top, left, bottom, right]): its
    kernel's copies zero what lies past the bottom and right edges, so (top, left) is all the C
    takes; classify refuses an uneven padding anywhere else (the pad op stays before the conv)."""
    body = plan.body
    n = body.nodes[conv]
    N, C, H, W = body.nodes[n.args[0]].type.shape
    KH, KW = body.nodes[n.args[1]].type.shape[2:]
    OH, OW = n.type.shape[2:]
    top, left, bottom, right = conv_pads(n.attr["padding"])
    assert (top, left) == (bottom, right) or conv == uneven_pads_conv(body, plan.shape), n.attr["padding"]
    return ConvGeometry(N, C, H, W, KH, KW, OH, OW, pair(n.attr["stride"]), (top, left),
                        pair(n.attr.get("dilation", 1)))
