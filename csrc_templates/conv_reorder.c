#define {{NAME}}_VL {{VL}} /* the plan's vl: the channels of a block, transposed VL x VL */
/* {{NAME}}_reorder (conv_direct.c's and conv_winograd.c's REORDER): an NCHW output is stored in blocks of VL channels first (ys, as between two
 * convs), then each block's rows transposed VL x VL in registers into the output's VL channel
 * rows (the last VL pixels of a row overlapping the previous ones when VL does not divide OW).
 * Tile by tile, the NCHW store transposed each tile through memory element by element, a large
 * part of the 128-channel conv at 28 x 28 that writes the ResNet stages' output
 * (benchmarks/bench_models.py --model resnet_stages); MLAS too stores its
 * NCHWc output and reorders it in a pass of its own. */
/* row q of the N x O / VL x OH block rows */
static inline void {{NAME}}_reorder_row(const float* restrict ys, float* restrict out, long q)
{
    {{NAME}}_DIMS;
    typedef int vi __attribute__((vector_size({{VL}} * 4)));
    (void)sizeof(vi);
    {
        const long b = q / ((O / VL) * OH), cb = q / OH % (O / VL), oh = q % OH;
        const float* restrict src = ys + q * OW * VL;
        float* restrict dst = out + (b * O + cb * VL) * (long)P + oh * OW;
        for (long ow = 0; ow < OW; ow += VL) {
            const long o0 = ow + VL <= OW ? ow : OW - VL;
            {{NAME}}_vf m[VL];
#pragma GCC unroll 16
            for (int p = 0; p < VL; p++)
                m[p] = *(const {{NAME}}_vf*)(src + (o0 + p) * VL);
{{TRANSPOSE}}
#pragma GCC unroll 16
            for (int l = 0; l < VL; l++)
                *({{NAME}}_vfu*)(dst + l * (long)P + o0) = m[l];
        }
    }
}
