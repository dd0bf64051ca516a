/* {{NAME}}: C[b] = epilogue((A[b] - a_zp) @ (B[b % NBB] - b_zp)) for b < {{BATCH}}, the integer
 * GEMM of matmul_integer (ONNX MatMulInteger): M={{M}} N={{N}} K={{K}}, A u8 (or s8) M x K
 * row-major, B s8 (or u8) K x N row-major, the product exact in int32 (wrapping, as onnxruntime's).
 *
 * B is packed into NR-column panels of 4-byte K-groups, [K/4][NR][4] per panel (zero padded in
 * K and N): one 32-bit lane holds one column's four k, the operand layout of vpdpbusd, followed
 * by the column sums of B (int32, NPAD). With PREPACKED_B ({{PREPACKED_B}}; B bound by params=)
 * the B argument is those panels, made once by {{NAME}}_prepack; otherwise each call packs B.
 * An s8 A (A_S8 {{A_S8}}) is read as u8 a ^ 0x80 = a + 128 and a u8 B (B_U8 {{B_U8}}) as s8
 * b ^ 0x80 = b - 128, their zero points moved by the same 128, so that the product is always
 * u8 x s8, and
 *   sum_k (a - az)(b - bz) = sum_k a b - az colsum(b)[j] - bz[j] rowsum(a)[i] + K az bz[j]
 * subtracts the activation's zero point once per column (column sums made at pack time); the
 * row sums of A are computed only when some b_zp is not zero.
 *
 * With QUANT_A ({{QUANT_A}}; A is quantize_linear(x, scale, zp), DynamicQuantizeLinear's y) the A
 * argument is the f32 x, quantized here as quantize_linear computes it (eqf_quantize: x / scale
 * rounded half to even, + zp, saturated) into the kernel's A buffer, M x K bytes of scratch that
 * every batch reuses, before the panels read it (with A's row sums, when needed, in the same
 * pass): the u8 tensor is never written out and read back.
 *
 * With IM2COL ({{IM2COL}}; conv_integer, ONNX ConvInteger and QLinearConv) call b is image b / G,
 * group b % G of G ({{G}}): A is the im2col of that image's group of channels, written here into
 * the same A buffer, M = OH x OW pixels by K = C/G x KH x KW taps, a padded tap being x's zero point
 * (it then adds 0, as onnxruntime pads); B is the group's weights, read as N x K (N = O/G output
 * channels), and C is stored transposed, channels x pixels: NCHW. j in the epilogue is the output
 * channel, i the pixel.
 *
 * With DIRECT_X ({{DIRECT_X}}; no dilation, kernel rows of 3, 4, 7 or 8 taps) there is no im2col:
 * x is copied once per image and group into a padded buffer (planes of HP x WP bytes, the
 * padding x's zero point), and the micro-kernel reads A's four bytes in place from there. A
 * kernel row (c, u) is KWG = ceil(KW / 4) K-groups of four taps (the taps past KW get weight 0),
 * so K in the panels is KP = C/G x KH x KWG x 4; K-group (c, u, t) of pixel (oh, ow) starts at
 * byte (c HP + oh SH + u) WP + ow SW + 4 t of the buffer: one address per K-group, plus r SW for
 * row r of a tile when the tile's pixels are in one output row. DIRECT_X 2: they are (each output
 * row OWV ({{OWV}}) pixels, OW rounded up to a multiple of MR; the OWV - OW past its end computed
 * and not stored). DIRECT_X 1 (stride 1): the rows are virtual pixels q = oh WP + ow, ow < WP, at
 * byte q + the K-group's offset, so that a tile may cross output rows; the M = (OH - 1) WP + OW
 * virtual pixels include the WP - OW past each output row's end, computed and not stored. The
 * row sums (when some b_zp is not zero) count only the real taps, as the column sums do.
 * With CH4 ({{CH4}}: C/G a multiple of 4) the buffer holds the channels in fours, interleaved
 * pixel by pixel ([C/G/4][HP][WP][4]), and a K-group is four channels of one tap: K-group (c4, u, t)
 * of pixel (oh, ow) at byte 4 ((c4 HP + oh SH + u) WP + ow SW + t), KP = K, no padded taps.
 *
 * PATH ({{PATH}}, the plan's precision_path): 3 = AVX512_VNNI (vpdpbusd on zmm, 64 u8 x s8
 * products in 16 lanes per instruction), 2 = AVX-VNNI (the VEX vpdpbusd on ymm), 4 = AVX2 with
 * bound weights: vpmaddubsw (u8 x s8 byte products, adjacent pairs summed into int16 with
 * saturation), then vpmaddwd by a vector of ones (the two pairs of a lane summed into int32): the
 * same four-byte K-groups as vpdpbusd. A pair of weights of one sign whose magnitudes sum past 128
 * could saturate there (255 x 129 > 2^15): the pack reduces the larger to 128 minus the smaller's
 * magnitude and lists the pair (room for NCORR {{NCORR}}, from the shape: qgemm.correction_room;
 * the plan counted fewer, qgemm.pair_corrections) with its remainder, which the panel adds to the tile times A's byte after the micro-kernel, so
 * the sums are exact (onnxruntime's reduce_range=True weights, 7 bits, have none);
 * 1 = the exact fallback for any weights: u8 and s8 widened to int16 (the even and odd bytes of
 * each lane) and multiplied by vpmaddwd, whose two products per lane (at most 255 * 128 each) add
 * exactly in int32; 0 = the same sums in plain C (no AVX2).
 * 5 = AMX-INT8 (a matmul, not a conv; MR = NR = 32): tdpbusd on 2 x 2 C tiles of 16 x 16 int32
 * (ukernel_amx; common_amx.h: the tile configuration, the operating system's permission, and an
 * emulation for CPUs without AMX). A tile is read by tileloadd in place, so A always goes through
 * the kernel's A buffer, as u8 bytes (an s8 A's xor 0x80 applied when written there: quantized,
 * or copied from the A argument), MPAD rows (M rounded up to whole tiles: the rows past M hold
 * anything, their sums never stored) and 64 bytes of slack; the panels' K is padded by zeros to
 * whole tiles of 16 K-groups (KGPP), so the bytes a tile reads past a row's K (the next row's, or
 * the slack) meet weights 0.
 *
 * Threads: the NR-column panels are chunks of the claim-based pool (common_pool.h), each panel
 * computed over all rows in MR-row tiles; with few panels (MB {{MB}} < M), a chunk is a panel's
 * block of MB rows (chunk c: panel c / RBLOCKS, rows from (c % RBLOCKS) MB). Its K is walked in blocks of KC ({{KC}}) so that the
 * block of B's panel stays in L1 while every row tile passes over it; the int32 partial sums of a
 * block wait for the next in a buffer of M x NR per thread (eqf_scratch).
 * The finished MR x NR tile of int32 sums leaves the micro-kernel into a buffer in L1, from where
 * it reaches C through `{{EPILOGUE}}` (in terms of the exact int32 `acc`, i, j, b and the extra
 * parameters): the dequantization, bias and activation in f32, and the only store of C. */
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* (the epilogue's f32 rows in 512-bit vectors where there are, common.h's EQF_WIDE_BEGIN: BERT-base's
 * FFN up with its GELU 17% faster, `benchmarks/bench_models.py --quantized dynamic --model bert-base`) */
EQF_WIDE_BEGIN

#define {{NAME}}_M {{M}}L
#define {{NAME}}_N {{N}}L
#define {{NAME}}_K {{K}}L
#define {{NAME}}_MR {{MR}}
#define {{NAME}}_NR {{NR}}
#define {{NAME}}_EDGE ({{NAME}}_M % {{NAME}}_MR ? (int)({{NAME}}_M % {{NAME}}_MR) : {{NAME}}_MR)
#define {{NAME}}_KC {{KC}}L /* K per block (a multiple of 4, or K itself: one block) */
#define {{NAME}}_MB {{MB}}L /* rows per chunk of the threads' work (M: a chunk is a whole panel) */
#define {{NAME}}_RBLOCKS (({{NAME}}_M + {{NAME}}_MB - 1) / {{NAME}}_MB)
/* the plan's other choices (`eqfuse lower`'s plan: and precision: lines) */
#define {{NAME}}_PATH {{PATH}} /* the instruction path: 3 avx512_vnni, 2 avx_vnni, 4 avx2_maddubs, 1 fallback, 0 plain C */
#define {{NAME}}_NCORR {{NCORR}}L /* PATH 4: room for the weight pairs packed reduced, their remainders added to the tiles */
#define {{NAME}}_A_S8 {{A_S8}} /* A is s8: read as u8 a ^ 0x80 */
#define {{NAME}}_B_U8 {{B_U8}} /* B is u8: packed as s8 b ^ 0x80 */
#define {{NAME}}_B_TRANSPOSED {{B_TRANSPOSED}} /* B is read as N x K (a QDQ Gemm's transB weight), packed from there */
#define {{NAME}}_BZP_PER_COL {{BZP_PER_COL}} /* b_zp one per column */
#define {{NAME}}_PREPACKED_B {{PREPACKED_B}} /* B's panels made once by _prepack (B bound by params=) */
#define {{NAME}}_PARALLEL {{PARALLEL}} /* the panels shared by the pool's threads */
#define {{NAME}}_QUANT_A {{QUANT_A}} /* A is f32 x, quantized into the kernel's A buffer */
#define {{NAME}}_IM2COL {{IM2COL}} /* A is the im2col of a conv's x, C stored NCHW */
#define {{NAME}}_IM2COL_ROWS {{IM2COL_ROWS}} /* the im2col by output row, kernel row outermost (else pixel by pixel) */
#define {{NAME}}_BY_IMAGE {{BY_IMAGE}} /* the threads' chunks are whole images (each its A buffer and its GEMM) */
#define {{NAME}}_DIRECT_X {{DIRECT_X}} /* no im2col: A read in place from a padded copy of x (kernel rows as K-groups) */
#define {{NAME}}_CH4 {{CH4}} /* DIRECT_X's K-groups are four channels of a tap: the copy's channels interleaved in fours */
#define {{NAME}}_COLS8 {{COLS8}} /* a conv's tiles of 8 or 16 rows stored channel by channel (store_cols8) */
#define {{NAME}}_VW ({{NAME}}_DIRECT_X == 1 ? {{NAME}}_WP : {{NAME}}_DIRECT_X == 2 ? {{NAME}}_OWV : 1L) /* DIRECT_X: virtual pixels a row */
#define {{NAME}}_MO {{MO}}L /* the output's pixels per image (M counts DIRECT_X's virtual pixels) */
#define {{NAME}}_G {{G}}L /* the conv's groups: B one matrix per group */
#define {{NAME}}_CI {{CI}}L /* the conv's geometry: x's channels, height, width; the kernel, stride, padding, dilation */
#define {{NAME}}_H {{H}}L
#define {{NAME}}_W {{W}}L
#define {{NAME}}_KH {{KH}}L
#define {{NAME}}_KW {{KW}}L
#define {{NAME}}_SH {{SH}}L
#define {{NAME}}_SW {{SW}}L
#define {{NAME}}_PH {{PH}}L
#define {{NAME}}_PW {{PW}}L
#define {{NAME}}_DH {{DH}}L
#define {{NAME}}_DW {{DW}}L
#define {{NAME}}_OW {{OW}}L
#define {{NAME}}_OWV {{OWV}}L /* DIRECT_X 2: virtual pixels per output row (OW rounded up to whole tiles; 0 otherwise) */
#define {{NAME}}_KCG (({{NAME}}_KC + 3) / 4) /* K-groups per block */
#define {{NAME}}_HP ({{NAME}}_H + 2 * {{NAME}}_PH) /* DIRECT_X's padded planes */
#define {{NAME}}_WP ({{NAME}}_W + 2 * {{NAME}}_PW)
#define {{NAME}}_CG ({{NAME}}_CI / {{NAME}}_G)
#define {{NAME}}_KWG ({{NAME}}_DIRECT_X && !{{NAME}}_CH4 ? ({{NAME}}_KW + 3) / 4 : 1L) /* DIRECT_X: K-groups per kernel row */
#define {{NAME}}_KP ({{NAME}}_CH4 ? {{NAME}}_CG * {{NAME}}_KH * {{NAME}}_KW : \
                     {{NAME}}_DIRECT_X ? {{NAME}}_CG * {{NAME}}_KH * {{NAME}}_KWG * 4 : {{NAME}}_K) /* K in the panels */
#define {{NAME}}_PXB ({{NAME}}_CH4 ? 4L : 1L) /* bytes of a pixel in DIRECT_X's padded copy */
/* the byte of channel c, kernel row u, tap v in DIRECT_X's padded copy, from a pixel's first byte */
#define {{NAME}}_XAT(c, u, v) ({{NAME}}_CH4 ? ((((c) / 4 * {{NAME}}_HP + (u)) * {{NAME}}_WP + (v)) * 4 + (c) % 4) \
                                          : (((c) * {{NAME}}_HP + (u)) * {{NAME}}_WP + (v)))
#define {{NAME}}_KG ({{NAME}}_KP / 4) /* whole K-groups of A; a last partial one is KT bytes */
#define {{NAME}}_KT ({{NAME}}_KP % 4)
#define {{NAME}}_KGP (({{NAME}}_KP + 3) / 4) /* K-groups of A */
#define {{NAME}}_AMX ({{NAME}}_PATH == 5) /* tdpbusd on tiles: A from the A buffer, K-groups in whole tiles */
#define {{NAME}}_KGPP ({{NAME}}_AMX ? ({{NAME}}_KGP + 15) / 16 * 16 : {{NAME}}_KGP) /* K-groups in the panels */
#define {{NAME}}_MPAD ({{NAME}}_AMX ? ({{NAME}}_M + {{NAME}}_MR - 1) / {{NAME}}_MR * {{NAME}}_MR : {{NAME}}_M) /* rows the micro-kernel computes */
/* the xor an s8 A's bytes take on their way into the A buffer (AMX: the tiles read u8), and on
 * their way out of it into the micro-kernel or a row sum (the others) */
#define {{NAME}}_WXOR ({{NAME}}_A_S8 && {{NAME}}_AMX ? 0x80u : 0u)
#define {{NAME}}_RXOR ({{NAME}}_A_S8 && !{{NAME}}_AMX ? 0x80u : 0u)
/* A's row stride: a conv's im2col rows padded to whole K-groups (the pad bytes meet B's zero
 * padding), so that every group of four is one aligned-stride load with no partial last group */
#define {{NAME}}_LDA ({{NAME}}_IM2COL ? {{NAME}}_KGP * 4 : {{NAME}}_K)
/* the A buffer's bytes: the im2col, or the padded copy and the bytes the last virtual pixels'
 * fourth taps read past it (and DIRECT_X 2's last OWV - OW, VPAST more) */
#define {{NAME}}_VPAST ({{NAME}}_DIRECT_X == 2 ? ({{NAME}}_OWV - {{NAME}}_OW) * {{NAME}}_SW * {{NAME}}_PXB : 0L)
#define {{NAME}}_ABYTES ({{NAME}}_DIRECT_X ? {{NAME}}_CG * {{NAME}}_HP * {{NAME}}_WP + 64L + {{NAME}}_VPAST \
                        : {{NAME}}_MPAD * {{NAME}}_LDA + ({{NAME}}_AMX ? 64L : 0L))
/* a conv whose x it quantizes: the image's group of channels in bytes, after the A buffer */
#define {{NAME}}_XBYTES ({{NAME}}_QUANT_A && {{NAME}}_IM2COL ? {{NAME}}_CI / {{NAME}}_G * {{NAME}}_H * {{NAME}}_W : 0L)
/* the A buffer (and quantized x) of each image (BY_IMAGE: one per image, 64-byte aligned) */
#define {{NAME}}_ASTRIDE (({{NAME}}_ABYTES + {{NAME}}_XBYTES + 63L) / 64 * 64)
#define {{NAME}}_NPAD (({{NAME}}_N + {{NAME}}_NR - 1) / {{NAME}}_NR * {{NAME}}_NR)
#define {{NAME}}_PANELS ({{NAME}}_NPAD / {{NAME}}_NR)
/* (the fallback's panels hold each K-group as two vectors of int16 pairs, 8 bytes a column) */
#define {{NAME}}_GROUP_BYTES ({{NAME}}_PATH == 1 ? 8L : 4L)
#define {{NAME}}_PANEL_BYTES ({{NAME}}_KGPP * {{NAME}}_GROUP_BYTES * {{NAME}}_NR)
#define {{NAME}}_AXOR ({{NAME}}_RXOR * 0x01010101u)
/* (the A buffer: a quantized A, a conv's, or AMX's copy of the A argument) */
#define {{NAME}}_ABUF ({{NAME}}_QUANT_A || {{NAME}}_IM2COL || {{NAME}}_AMX)
#if {{NAME}}_NCORR && ({{NAME}}_PATH != 4 || !{{NAME}}_PREPACKED_B)
#error "weight pairs are corrected only on the avx2_maddubs path, with the weights packed once"
#endif
#if {{NAME}}_AMX && ({{NAME}}_IM2COL || {{NAME}}_MR != 32 || {{NAME}}_NR != 32 || {{NAME}}_KC % 64)
#error "the AMX-INT8 path is a matmul's, on 32 x 32 tiles, its K blocks whole tiles of 16 K-groups"
#endif
#if {{NAME}}_AMX && !defined(EQF_AMX_EMULATE) && !(defined(__AMX_TILE__) && defined(__AMX_INT8__))
#error "the plan chose the AMX-INT8 path (tdpbusd) but the compiler does not target AMX-TILE and AMX-INT8"
#endif
#if {{NAME}}_PATH == 3 && !defined(__AVX512VNNI__)
#error "the plan chose the AVX512_VNNI path (vpdpbusd) but the compiler does not target AVX512_VNNI"
#endif
#if {{NAME}}_PATH == 2
#define {{NAME}}_TARGET __attribute__((target("avx2,fma,avxvnni")))
#elif ({{NAME}}_PATH == 1 || {{NAME}}_PATH == 4) && !defined(__AVX2__)
#error "the plan chose an AVX2 path (vpmaddwd, vpmaddubsw) but the compiler does not target AVX2"
#else
#define {{NAME}}_TARGET
#endif
#ifndef {{NAME}}_TARGET
#define {{NAME}}_TARGET
#endif

/* A counting build (-DEQF_COUNT_UKERNEL) counts the micro-kernel calls (`eqfuse lower --uops`). */
#ifdef EQF_COUNT_UKERNEL
static long {{NAME}}_calls;
long {{NAME}}_ukernel_calls(void) { return __atomic_exchange_n(&{{NAME}}_calls, 0, __ATOMIC_RELAXED); }
#define {{NAME}}_COUNT_CALL() __atomic_fetch_add(&{{NAME}}_calls, 1, __ATOMIC_RELAXED)
#else
#define {{NAME}}_COUNT_CALL() ((void)0)
#endif

/* Four bytes of a row of A from k = 4 g (u8 after the xor of an s8 A); the last partial group
 * reads only the K % 4 bytes there are (B's padding is zero, so the rest may be anything). */
static inline uint32_t {{NAME}}_a4(const uint8_t* a, long g)
{
    uint32_t w = 0;
    if (g < {{NAME}}_KG || {{NAME}}_LDA % 4 == 0)
        memcpy(&w, a + 4 * g, 4);
    else
        memcpy(&w, a + 4 * g, {{NAME}}_KT);
    return w ^ {{NAME}}_AXOR;
}

/* DIRECT_X: the byte of x's padded copy where K-group g of a tile's first pixel starts, from that
 * pixel's first tap (four bytes of padded row (c, oh SH + u) from the pixel's column + 4 t; CH4: tap
 * g % KW of the four channels of kernel row (c4, u)). A table of them is filled once per process
 * (koff, at the kernel's first call): computed per K-group in the micro-kernel, its divisions and
 * products were as many instructions as the vpdpbusd they fed (`benchmarks/bench_models.py
 * --quantized static --model resnet_stages`). */
static inline long {{NAME}}_kofs(long g)
{
#if {{NAME}}_DIRECT_X && {{NAME}}_CH4
    const long cu = g / {{NAME}}_KW; /* (kernel row (c4, u) = (cu / KH, cu % KH)) */
    return ((cu / {{NAME}}_KH * {{NAME}}_HP + cu % {{NAME}}_KH) * {{NAME}}_WP + g % {{NAME}}_KW) * 4;
#elif {{NAME}}_DIRECT_X
    const long cu = g / {{NAME}}_KWG; /* (kernel row (c, u) = (cu / KH, cu % KH), its taps from 4 (g % KWG)) */
    return (cu / {{NAME}}_KH * {{NAME}}_HP + cu % {{NAME}}_KH) * {{NAME}}_WP + g % {{NAME}}_KWG * 4;
#else
    return 4 * g;
#endif
}
#if {{NAME}}_DIRECT_X
_Static_assert({{NAME}}_ABYTES < 2147483647L, "the padded copy's offsets are int32 (koff)");
static int32_t {{NAME}}_koff[{{NAME}}_KGP];
static pthread_once_t {{NAME}}_koff_once = PTHREAD_ONCE_INIT;
static void {{NAME}}_koff_fill(void)
{
    for (long g = 0; g < {{NAME}}_KGP; g++)
        {{NAME}}_koff[g] = (int32_t){{NAME}}_kofs(g);
}
#endif

/* K-group g of row r of a tile whose first row is at a (DIRECT_X: at koff[g], the table of kofs,
 * and r SW pixels on; else A's row r) */
static inline uint32_t {{NAME}}_arow(const uint8_t* a, const int32_t* koff, int r, long g)
{
#if {{NAME}}_DIRECT_X
    uint32_t w;
    memcpy(&w, a + koff[g] + r * {{NAME}}_SW * ({{NAME}}_CH4 ? 4 : 1), 4);
    return w ^ {{NAME}}_AXOR;
#else
    (void)koff;
    return {{NAME}}_a4(a + r * {{NAME}}_LDA, g);
#endif
}

#if {{NAME}}_PATH == 2
/* acc + the sums of each lane's four u8 x s8 byte products */
#define {{NAME}}_dot4(acc, a, b) _mm256_dpbusd_avx_epi32(acc, a, b)
#elif {{NAME}}_PATH == 4
/* vpdpbusd's sums in two steps: the u8 x s8 pairs in int16 (no saturation: the packed pairs'
 * magnitudes sum to at most 128), then the two pairs of each lane in int32 */
#define {{NAME}}_dot4(acc, a, b) \
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)))
#endif

/* out[r][NR] = init[r][NR] (0 without init) + the sum over the K-groups [g0, g1) of
 * A[r][k] * panel[k][j] (u8 x s8, int32), for r < mr */
static inline __attribute__((always_inline)) {{NAME}}_TARGET void {{NAME}}_ukernel(
    const int mr, const uint8_t* restrict a, const int32_t* restrict koff, const int8_t* restrict bp,
    const long g0, const long g1,
    const int32_t* init, int32_t* out)
{
    {{NAME}}_COUNT_CALL();
    /* the K-groups' end through an empty asm, so unknown to gcc: with a constant trip count (a
     * conv's one K block) its loop passes moved each accumulator through a second register and
     * spilled two to the stack on every K-group, near a third of vpdpbusd's rate
     * (`benchmarks/bench_models.py --quantized static --model resnet_stages`) */
    long gn = g1;
    __asm__("" : "+r"(gn));
#if {{NAME}}_PATH == 3
    enum { V = {{NAME}}_NR / 16 };
    __m512i acc[{{NAME}}_MR][V];
#pragma GCC unroll 16 /* (every row: no accumulator is read unset) */
    for (int r = 0; r < {{NAME}}_MR; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            acc[r][v] = init && r < mr ? _mm512_loadu_si512((const void*)(init + r * {{NAME}}_NR + 16 * v))
                                       : _mm512_setzero_si512();
    for (long g = g0; g < gn; g++) {
        __m512i b[V];
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            b[v] = _mm512_loadu_si512((const void*)(bp + (g * {{NAME}}_NR + 16 * v) * 4));
#pragma GCC unroll 16
        for (int r = 0; r < mr; r++) {
            const __m512i av = _mm512_set1_epi32((int){{NAME}}_arow(a, koff, r, g));
#pragma GCC unroll 8
            for (int v = 0; v < V; v++)
                acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], av, b[v]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            _mm512_storeu_si512((void*)(out + r * {{NAME}}_NR + 16 * v), acc[r][v]);
#elif {{NAME}}_PATH == 2 || {{NAME}}_PATH == 4 || {{NAME}}_PATH == 1
    enum { V = {{NAME}}_NR / 8 };
    __m256i acc[{{NAME}}_MR][V];
#pragma GCC unroll 16 /* (every row: no accumulator is read unset) */
    for (int r = 0; r < {{NAME}}_MR; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            acc[r][v] = init && r < mr ? _mm256_loadu_si256((const __m256i*)(init + r * {{NAME}}_NR + 8 * v))
                                       : _mm256_setzero_si256();
    for (long g = g0; g < gn; g++) {
#if {{NAME}}_PATH == 2 || {{NAME}}_PATH == 4
        __m256i b[V];
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            b[v] = _mm256_loadu_si256((const __m256i*)(bp + (g * {{NAME}}_NR + 8 * v) * 4));
#pragma GCC unroll 16
        for (int r = 0; r < mr; r++) {
            const __m256i av = _mm256_set1_epi32((int)({{NAME}}_arow(a, koff, r, g)));
#pragma GCC unroll 8
            for (int v = 0; v < V; v++)
                acc[r][v] = {{NAME}}_dot4(acc[r][v], av, b[v]);
        }
#else
        /* each 32-bit lane: B's bytes b0 b1 b2 b3 as the int16 pairs (b0, b2) and (b1, b3), packed
         * so (the group's even vector, then its odd one); A's the same way, zero-extended: two
         * vpmaddwd */
        __m256i be[V], bo[V];
#pragma GCC unroll 8
        for (int v = 0; v < V; v++) {
            be[v] = _mm256_loadu_si256((const __m256i*)(bp + ((2 * g) * {{NAME}}_NR + 8 * v) * 4));
            bo[v] = _mm256_loadu_si256((const __m256i*)(bp + ((2 * g + 1) * {{NAME}}_NR + 8 * v) * 4));
        }
#pragma GCC unroll 16
        for (int r = 0; r < mr; r++) {
            /* (A's four bytes broadcast from memory and split in the vector registers: splitting
             * them in a general register first moved each half over with vmovd + vpbroadcastd,
             * the fallback's bottleneck, `bench_gemm.py --int8 --reduce-range off`) */
            const __m256i aw = _mm256_set1_epi32((int){{NAME}}_arow(a, koff, r, g));
            const __m256i ae = _mm256_srli_epi16(_mm256_slli_epi16(aw, 8), 8); /* (no mask: its register holds an accumulator) */
            const __m256i ao = _mm256_srli_epi16(aw, 8);
#pragma GCC unroll 8
            for (int v = 0; v < V; v++)
                acc[r][v] = _mm256_add_epi32(acc[r][v], _mm256_add_epi32(_mm256_madd_epi16(ae, be[v]),
                                                                         _mm256_madd_epi16(ao, bo[v])));
        }
#endif
    }
#pragma GCC unroll 16
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            _mm256_storeu_si256((__m256i*)(out + r * {{NAME}}_NR + 8 * v), acc[r][v]);
#else
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < {{NAME}}_NR; j++)
            out[r * {{NAME}}_NR + j] = init ? init[r * {{NAME}}_NR + j] : 0;
    for (long g = g0; g < gn; g++)
        for (int r = 0; r < mr; r++) {
            const uint32_t w = {{NAME}}_arow(a, koff, r, g);
            for (int j = 0; j < {{NAME}}_NR; j++) {
                const int8_t* q = bp + (g * {{NAME}}_NR + j) * 4;
                out[r * {{NAME}}_NR + j] += (int32_t)(w & 255) * q[0] + (int32_t)(w >> 8 & 255) * q[1]
                                             + (int32_t)(w >> 16 & 255) * q[2] + (int32_t)(w >> 24) * q[3];
            }
        }
#endif
}

#if {{NAME}}_AMX
/* out[MR][NR] (MR = NR = 32) = init (0 without init) + the sum over the K-groups [g0, g1) (whole
 * tiles of 16) of A[r][k] * panel[k][j], by tdpbusd: amx_start, an amx_step per 16 K-groups, then
 * amx_finish (the panel interleaves another tile's epilogue between the steps). An A tile is 16
 * rows x 64 bytes (16 K-groups) of the A buffer, at its row stride LDA; a B tile 16 K-groups x 16
 * columns of the panel ([KGPP][NR][4]: 64 bytes a row at a stride of NR x 4). Tiles: C 0-3 (rows
 * 0-15 x columns 0-15, rows 0-15 x 16-31, rows 16-31 x 0-15, rows 16-31 x 16-31), A 4-5 (rows
 * 0-15, 16-31), B 6-7 (columns 0-15, 16-31). */
_Static_assert({{NAME}}_MR == 32 && {{NAME}}_NR == 32, "the AMX micro-kernel is 2 x 2 C tiles of 16 x 16");
enum { {{NAME}}_CS = 4 * {{NAME}}_NR }; /* (bytes a row of the int32 tile buffers) */

static inline __attribute__((always_inline)) void {{NAME}}_amx_start(const int32_t* init)
{
    {{NAME}}_COUNT_CALL();
    EQF_AMX_FENCE(); /* (A, the panels and init are in memory before the first tile load) */
    if (init) {
        _tile_loadd(0, init, {{NAME}}_CS);
        _tile_loadd(1, init + 16, {{NAME}}_CS);
        _tile_loadd(2, init + 16 * {{NAME}}_NR, {{NAME}}_CS);
        _tile_loadd(3, init + 16 * {{NAME}}_NR + 16, {{NAME}}_CS);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
}

static inline __attribute__((always_inline)) void {{NAME}}_amx_step(const uint8_t* restrict a, const int8_t* restrict bp,
                                                                   const long g)
{
    _tile_loadd(4, a + 4 * g, {{NAME}}_LDA);
    _tile_loadd(5, a + 16 * {{NAME}}_LDA + 4 * g, {{NAME}}_LDA);
    _tile_loadd(6, bp + g * {{NAME}}_CS, {{NAME}}_CS);
    _tile_loadd(7, bp + g * {{NAME}}_CS + 64, {{NAME}}_CS);
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
}

static inline __attribute__((always_inline)) void {{NAME}}_amx_finish(int32_t* out)
{
    _tile_stored(0, out, {{NAME}}_CS);
    _tile_stored(1, out + 16, {{NAME}}_CS);
    _tile_stored(2, out + 16 * {{NAME}}_NR, {{NAME}}_CS);
    _tile_stored(3, out + 16 * {{NAME}}_NR + 16, {{NAME}}_CS);
    EQF_AMX_FENCE(); /* (the sums are in memory before they are read) */
}

static inline __attribute__((always_inline)) void {{NAME}}_ukernel_amx(const uint8_t* restrict a, const int8_t* restrict bp,
                                                                    const long g0, const long g1, const int32_t* init,
                                                                    int32_t* out)
{
    {{NAME}}_amx_start(init);
    for (long g = g0; g < g1; g += 16)
        {{NAME}}_amx_step(a, bp, g);
    {{NAME}}_amx_finish(out);
}
#endif

#if {{NAME}}_NCORR
/* PATH 4's pairs that vpmaddubsw could saturate on: after the column sums, where each panel's
 * list starts (PANELS + 1 int32), then the pairs in panel order: the packed K index of the
 * reduced weight, its column in the panel and the remainder (weight - reduced) */
typedef struct {
    int32_t k;
    int16_t jj, rem;
} {{NAME}}_fix_t;
#define {{NAME}}_FIX_START(P) ((int32_t*)((P) + {{NAME}}_PANELS * {{NAME}}_PANEL_BYTES + 4 * {{NAME}}_NPAD))
#define {{NAME}}_FIXES(P) (({{NAME}}_fix_t*)({{NAME}}_FIX_START(P) + {{NAME}}_PANELS + 1))
#define {{NAME}}_FIX_BYTES (4 * ({{NAME}}_PANELS + 1) + (long)sizeof({{NAME}}_fix_t) * {{NAME}}_NCORR)

/* Each pair (k even, k + 1) of a packed column whose weights have one sign and magnitudes summing
 * past 128: the larger reduced to 128 minus the smaller's magnitude, the pair listed (the column
 * sums, made before, keep the weights themselves). The plan counted them on the same packed
 * weights (qgemm.pair_corrections), at most NCORR; a pair past that room (never) is left as it is. */
static void {{NAME}}_reduce_pairs(int8_t* restrict P)
{
    int32_t* restrict start = {{NAME}}_FIX_START(P);
    {{NAME}}_fix_t* restrict fix = {{NAME}}_FIXES(P);
    long n = 0;
    for (long p = 0; p < {{NAME}}_PANELS; p++) {
        int8_t* restrict q = P + p * {{NAME}}_PANEL_BYTES;
        start[p] = (int32_t)n;
        for (long g = 0; g < {{NAME}}_KGP; g++)
            for (long jj = 0; jj < {{NAME}}_NR; jj++)
                for (int h = 0; h < 2; h++) {
                    int8_t* v = q + (g * {{NAME}}_NR + jj) * 4 + 2 * h;
                    const int a = v[0], b = v[1], big = abs(b) > abs(a);
                    if (a * b <= 0 || abs(a) + abs(b) <= 128 || n >= {{NAME}}_NCORR)
                        continue;
                    const int keep = (v[big] > 0 ? 1 : -1) * (128 - abs(v[!big]));
                    fix[n++] = ({{NAME}}_fix_t){(int32_t)(4 * g + 2 * h + big), (int16_t)jj, (int16_t)(v[big] - keep)};
                    v[big] = (int8_t)keep;
                }
    }
    start[{{NAME}}_PANELS] = (int32_t)n;
}
#endif

/* B (K x N, row stride N) into the panels P and its column sums after them (see above) */
static void {{NAME}}_pack(const {{B_T}}* restrict B, int8_t* restrict P)
{
    int32_t* restrict colsum = (int32_t*)(P + {{NAME}}_PANELS * {{NAME}}_PANEL_BYTES);
    for (long j = 0; j < {{NAME}}_NPAD; j++)
        colsum[j] = 0;
    for (long p = 0; p < {{NAME}}_PANELS; p++) {
        int8_t* restrict q = P + p * {{NAME}}_PANEL_BYTES;
        for (long k = 0; k < {{NAME}}_KGPP * 4; k++) /* (B's rows in order: its bytes read once, in sequence) */
            for (long jj = 0; jj < {{NAME}}_NR; jj++) {
                const long j = p * {{NAME}}_NR + jj;
                /* (a u8 B is read as s8 b - 128: its bits xor 0x80) */
                /* (a conv's weights are N x K: each output channel's taps in a row) */
                /* (DIRECT_X: k is tap t of kernel row (c, u), weight 0 past KW; CH4: channel k % 4 of the
                 * four c4 at tap g % KW of kernel row u, (c4, u) = cu, g = k / 4) */
                const long t = k % ({{NAME}}_KWG * 4), g4 = k / 4, cu = g4 / ({{NAME}}_CH4 ? {{NAME}}_KW : 1);
                const long kh = {{NAME}}_CH4 ? {{NAME}}_KH : 1, kw = {{NAME}}_CH4 ? {{NAME}}_KW : 1;
                const long kk = {{NAME}}_CH4 ? ((cu / kh * 4 + k % 4) * kh + cu % kh) * kw + g4 % kw
                              : {{NAME}}_DIRECT_X ? k / ({{NAME}}_KWG * 4) * {{NAME}}_KW + t : k;
                const int real = {{NAME}}_CH4 ? k < {{NAME}}_KP
                               : {{NAME}}_DIRECT_X ? t < {{NAME}}_KW && k < {{NAME}}_KP : k < {{NAME}}_K;
                const long at = {{NAME}}_IM2COL || {{NAME}}_B_TRANSPOSED ? j * {{NAME}}_K + kk : kk * {{NAME}}_N + j;
                const int8_t v = j < {{NAME}}_N && real ? (int8_t)((uint8_t)B[at] ^ ({{NAME}}_B_U8 ? 0x80 : 0)) : 0;
                if ({{NAME}}_PATH == 1) /* (k's int16 in the even (k % 2 = 0) or odd vector of its group) */
                    ((int16_t*)q)[(((k / 4) * 2 + k % 2) * {{NAME}}_NR + jj) * 2 + k % 4 / 2] = v;
                else
                    q[((k / 4) * {{NAME}}_NR + jj) * 4 + k % 4] = v;
                colsum[j] += v;
            }
    }
#if {{NAME}}_NCORR
    {{NAME}}_reduce_pairs(P);
#endif
}

#define {{NAME}}_QROWS 16L /* rows per chunk of the quantization (and of AMX's copy of A) */

#if {{NAME}}_QUANT_A
/* The quantization of A (QUANT_A): rows [r0, r1) of `rows` rows of `len` f32 x into the u8
 * buffer (an s8 zero point's results stored as their bits, which the micro-kernel reads as
 * u8 ^ 0x80), and their row sums as the micro-kernel sees them when rowsum is not NULL. (A conv's
 * rows are its group's channel planes of the image, which the im2col then reads.) */
typedef struct {
    const float* X;
    uint8_t* A;
    int32_t* rowsum;
    float scale, zp, lo, hi;
    long rows, len;
} {{NAME}}_qjob;


static void {{NAME}}_quantize(void* ctx, long c)
{
    const {{NAME}}_qjob* q = ctx;
    const long r0 = c * {{NAME}}_QROWS, r1 = r0 + {{NAME}}_QROWS < q->rows ? r0 + {{NAME}}_QROWS : q->rows;
    const float scale = q->scale, zp = q->zp, lo = q->lo, hi = q->hi;
    const long len = q->len;
    for (long i = r0; i < r1; i++) {
        const float* restrict x = q->X + i * len;
        uint8_t* restrict a = q->A + i * len;
#pragma omp simd
        for (long k = 0; k < len; k++)
            a[k] = (uint8_t)((int)eqf_quantize(x[k], scale, zp, lo, hi) ^ {{NAME}}_WXOR);
        if (q->rowsum) {
            uint32_t s = 0;
            for (long k = 0; k < len; k++)
                s += a[k] ^ {{NAME}}_RXOR;
            q->rowsum[i] = (int32_t)s;
        }
    }
}
#endif

#if {{NAME}}_AMX && !{{NAME}}_QUANT_A
/* AMX's copy of the A argument (u8 bytes; an s8 A's xor 0x80) into the A buffer: rows [r0, r1)
 * of a chunk of QROWS, and their row sums when rowsum is not NULL */
typedef struct {
    const uint8_t* X;
    uint8_t* A;
    int32_t* rowsum;
} {{NAME}}_ajob;

static void {{NAME}}_copy_a(void* ctx, long c)
{
    const {{NAME}}_ajob* q = ctx;
    const long r0 = c * {{NAME}}_QROWS, r1 = r0 + {{NAME}}_QROWS < {{NAME}}_M ? r0 + {{NAME}}_QROWS : {{NAME}}_M;
    for (long i = r0; i < r1; i++) {
        const uint8_t* restrict x = q->X + i * {{NAME}}_K;
        uint8_t* restrict a = q->A + i * {{NAME}}_K;
        uint32_t s = 0;
#pragma omp simd reduction(+ : s)
        for (long k = 0; k < {{NAME}}_K; k++) {
            a[k] = (uint8_t)(x[k] ^ {{NAME}}_WXOR);
            s += a[k];
        }
        if (q->rowsum)
            q->rowsum[i] = (int32_t)s;
    }
}
#endif

#if {{NAME}}_IM2COL && !{{NAME}}_DIRECT_X
/* The im2col of one image's group of channels X (IM2COL): rows [r0, r1) (pixels) of the A buffer,
 * tap k = (c KH + u) KW + v of pixel (oh, ow) reading x[c][oh SH - PH + u DH][ow SW - PW + v DW],
 * or the zero point's byte where that is padding; and the rows' sums when rowsum is not NULL.
 * A kernel row (c, u) is KW bytes: the zero point's where its x row is padding; copied with no
 * test per tap where every tap of it lies inside x (all pixels but the few at the left and right
 * edges): a memcpy without dilation, four bytes at once for a row of fewer (3 x 3 convs); tested
 * tap by tap at the edges. */
typedef struct {
    const uint8_t* X;
    uint8_t* A;
    int32_t* rowsum;
    uint8_t zp;
} {{NAME}}_cjob;

#define {{NAME}}_CROWS 32L /* pixels per chunk of the im2col */
/* a kernel row of fewer than 4 bytes copied as 4 (one load and store; rows of 4-7 as 8 were
 * slower on the 7 x 7 stem of `benchmarks/bench_models.py --quantized static --model resnet18`) */
#define {{NAME}}_WIDE ({{NAME}}_KW < 4 ? 4L : 0L)

/* One kernel row (KW taps) of a pixel whose first tap is at column w0 of the x row xr (inside: every
 * tap lies in x), into ar at tap offset kofs of the pixel's A row. WIDE bytes moved at once: the
 * ones past KW belong to the next kernel row of this pixel, which overwrites them next, or to its
 * pad bytes, zeroed after (never the next pixel's: kofs + WIDE <= LDA). Both im2col orders below. */
static inline __attribute__((always_inline)) void {{NAME}}_krow(uint8_t* restrict ar, const uint8_t* restrict xr,
                                                              long w0, int inside, long kofs, uint8_t zp)
{
    if (inside && {{NAME}}_WIDE && {{NAME}}_DW == 1 && w0 + {{NAME}}_WIDE <= {{NAME}}_W
        && kofs + {{NAME}}_WIDE <= {{NAME}}_LDA)
        memcpy(ar, xr + w0, {{NAME}}_WIDE);
    else if (inside && {{NAME}}_DW == 1)
        memcpy(ar, xr + w0, {{NAME}}_KW);
    else if (inside)
        for (long v = 0; v < {{NAME}}_KW; v++)
            ar[v] = xr[w0 + v * {{NAME}}_DW];
    else
        for (long v = 0; v < {{NAME}}_KW; v++) {
            const long w = w0 + v * {{NAME}}_DW;
            ar[v] = w >= 0 && w < {{NAME}}_W ? xr[w] : zp;
        }
}

#if {{NAME}}_IM2COL_ROWS
static void {{NAME}}_im2col(void* ctx, long ch)
{
    const {{NAME}}_cjob* q = ctx;
    const long r0 = ch * {{NAME}}_CROWS, r1 = r0 + {{NAME}}_CROWS < {{NAME}}_M ? r0 + {{NAME}}_CROWS : {{NAME}}_M;
    /* IM2COL_ROWS: the chunk's pixels by output row: per kernel row (c, u), its x row (or padding)
     * is found once, then copied to every pixel of the output row in a tight loop (dst LDA bytes
     * apart) */
    for (long p0 = r0; p0 < r1;) {
        const long oh = p0 / {{NAME}}_OW, owa = p0 % {{NAME}}_OW;
        const long pe = (oh + 1) * {{NAME}}_OW < r1 ? (oh + 1) * {{NAME}}_OW : r1;
        const long owb = owa + (pe - p0);
        for (long c = 0; c < {{NAME}}_K / ({{NAME}}_KH * {{NAME}}_KW); c++) {
            const uint8_t* restrict xc = q->X + c * {{NAME}}_H * {{NAME}}_W;
            for (long u = 0; u < {{NAME}}_KH; u++) {
                const long h = oh * {{NAME}}_SH - {{NAME}}_PH + u * {{NAME}}_DH;
                const long kofs = (c * {{NAME}}_KH + u) * {{NAME}}_KW;
                uint8_t* restrict ar = q->A + p0 * {{NAME}}_LDA + kofs;
                if (h < 0 || h >= {{NAME}}_H) {
                    for (long ow = owa; ow < owb; ow++, ar += {{NAME}}_LDA)
                        for (long v = 0; v < {{NAME}}_KW; v++)
                            ar[v] = q->zp;
                    continue;
                }
                const uint8_t* restrict xr = xc + h * {{NAME}}_W;
                for (long ow = owa; ow < owb; ow++, ar += {{NAME}}_LDA) {
                    const long w0 = ow * {{NAME}}_SW - {{NAME}}_PW;
                    {{NAME}}_krow(ar, xr, w0, w0 >= 0 && w0 + ({{NAME}}_KW - 1) * {{NAME}}_DW < {{NAME}}_W, kofs, q->zp);
                }
            }
        }
        for (long p = p0; p < pe && {{NAME}}_LDA > {{NAME}}_K; p++) /* (the pad bytes: zero) */
            memset(q->A + p * {{NAME}}_LDA + {{NAME}}_K, 0, {{NAME}}_LDA - {{NAME}}_K);
        if (q->rowsum)
            for (long p = p0; p < pe; p++) {
                const uint8_t* restrict a = q->A + p * {{NAME}}_LDA;
                uint32_t s = 0;
                for (long k = 0; k < {{NAME}}_K; k++)
                    s += a[k] ^ {{NAME}}_RXOR;
                q->rowsum[p] = (int32_t)s;
            }
        p0 = pe;
    }
}
#else
static void {{NAME}}_im2col(void* ctx, long ch)
{
    /* pixel by pixel, each of its kernel rows found and copied in turn */
    const {{NAME}}_cjob* q = ctx;
    const long r0 = ch * {{NAME}}_CROWS, r1 = r0 + {{NAME}}_CROWS < {{NAME}}_M ? r0 + {{NAME}}_CROWS : {{NAME}}_M;
    for (long p = r0; p < r1; p++) {
        const long oh = p / {{NAME}}_OW, ow = p % {{NAME}}_OW;
        const long w0 = ow * {{NAME}}_SW - {{NAME}}_PW;
        const int inside = w0 >= 0 && w0 + ({{NAME}}_KW - 1) * {{NAME}}_DW < {{NAME}}_W;
        uint8_t* restrict a = q->A + p * {{NAME}}_LDA;
        for (long c = 0; c < {{NAME}}_K / ({{NAME}}_KH * {{NAME}}_KW); c++) {
            const uint8_t* restrict xc = q->X + c * {{NAME}}_H * {{NAME}}_W;
            for (long u = 0; u < {{NAME}}_KH; u++) {
                const long h = oh * {{NAME}}_SH - {{NAME}}_PH + u * {{NAME}}_DH;
                uint8_t* restrict ar = a + (c * {{NAME}}_KH + u) * {{NAME}}_KW;
                if (h < 0 || h >= {{NAME}}_H) {
                    for (long v = 0; v < {{NAME}}_KW; v++)
                        ar[v] = q->zp;
                    continue;
                }
                const uint8_t* restrict xr = xc + h * {{NAME}}_W;
                {{NAME}}_krow(ar, xr, w0, inside, (c * {{NAME}}_KH + u) * {{NAME}}_KW, q->zp);
            }
        }
        if ({{NAME}}_LDA > {{NAME}}_K) /* (the pad bytes: zero) */
            memset(a + {{NAME}}_K, 0, {{NAME}}_LDA - {{NAME}}_K);
        if (q->rowsum) {
            uint32_t s = 0;
            for (long k = 0; k < {{NAME}}_K; k++)
                s += a[k] ^ {{NAME}}_RXOR;
            q->rowsum[p] = (int32_t)s;
        }
    }
}
#endif
#endif

#if {{NAME}}_DIRECT_X
/* DIRECT_X: the byte of the padded planes where pixel q's kernel starts (q a virtual pixel with
 * DIRECT_X 1) */
static inline long {{NAME}}_xofs(long q)
{
#if {{NAME}}_DIRECT_X == 1
    return q * {{NAME}}_PXB;
#else
    return (q / {{NAME}}_OWV * {{NAME}}_SH * {{NAME}}_WP + q % {{NAME}}_OWV * {{NAME}}_SW) * {{NAME}}_PXB;
#endif
}

/* where row i0 of A starts: the pixel's first byte in DIRECT_X's padded planes, or i0 LDA */
static inline long {{NAME}}_arow0(long i0) { return {{NAME}}_xofs(i0); }

/* DIRECT_X: the image's group of channels X into the padded planes XP (x's zero point around
 * it, and in the bytes past the last plane), and the row sums of the virtual pixels' real taps
 * when rowsum is not NULL. The planes are chunks the call's threads share: a plane of four
 * channels (CH4) or of one is a chunk; the row sums, which read every plane, come after them. */
typedef struct {
    const uint8_t* X;
    uint8_t* XP;
    uint8_t zp;
} {{NAME}}_pjob;

#define {{NAME}}_PLANES ({{NAME}}_CH4 ? {{NAME}}_CG / 4 : {{NAME}}_CG) /* pad_x's chunks */

/* CH4: four channels' rows of n pixels interleaved, pixel by pixel, into out (4 n bytes): 16
 * pixels a round through two rounds of unpacks, then 8 through the low halves (x's rows end at
 * n: no load may pass it), then one by one */
static inline void {{NAME}}_interleave4(const uint8_t* restrict s0, const uint8_t* restrict s1, const uint8_t* restrict s2,
                                        const uint8_t* restrict s3, uint8_t* restrict out, long n)
{
    long v = 0;
#if defined(__AVX2__) || defined(__AVX512F__)
    for (; v + 16 <= n; v += 16) {
        const __m128i a0 = _mm_loadu_si128((const __m128i*)(s0 + v)), a1 = _mm_loadu_si128((const __m128i*)(s1 + v));
        const __m128i a2 = _mm_loadu_si128((const __m128i*)(s2 + v)), a3 = _mm_loadu_si128((const __m128i*)(s3 + v));
        const __m128i lo01 = _mm_unpacklo_epi8(a0, a1), hi01 = _mm_unpackhi_epi8(a0, a1);
        const __m128i lo23 = _mm_unpacklo_epi8(a2, a3), hi23 = _mm_unpackhi_epi8(a2, a3);
        _mm_storeu_si128((__m128i*)(out + 4 * v), _mm_unpacklo_epi16(lo01, lo23));
        _mm_storeu_si128((__m128i*)(out + 4 * v + 16), _mm_unpackhi_epi16(lo01, lo23));
        _mm_storeu_si128((__m128i*)(out + 4 * v + 32), _mm_unpacklo_epi16(hi01, hi23));
        _mm_storeu_si128((__m128i*)(out + 4 * v + 48), _mm_unpackhi_epi16(hi01, hi23));
    }
    if (v + 8 <= n) {
        const __m128i lo01 = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i*)(s0 + v)), _mm_loadl_epi64((const __m128i*)(s1 + v)));
        const __m128i lo23 = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i*)(s2 + v)), _mm_loadl_epi64((const __m128i*)(s3 + v)));
        _mm_storeu_si128((__m128i*)(out + 4 * v), _mm_unpacklo_epi16(lo01, lo23));
        _mm_storeu_si128((__m128i*)(out + 4 * v + 16), _mm_unpackhi_epi16(lo01, lo23));
        v += 8;
    }
#endif
    for (; v < n; v++) {
        out[4 * v] = s0[v];
        out[4 * v + 1] = s1[v];
        out[4 * v + 2] = s2[v];
        out[4 * v + 3] = s3[v];
    }
}

static void {{NAME}}_pad_plane(void* ctx, long c4)
{
    const {{NAME}}_pjob* pj = ctx;
    const uint8_t* restrict X = pj->X;
    const uint8_t zp = pj->zp;
#if {{NAME}}_CH4
    /* (four channels' rows interleaved, pixel by pixel; the pad rows and columns x's zero point) */
    uint8_t* restrict xp = pj->XP + c4 * {{NAME}}_HP * {{NAME}}_WP * 4;
    memset(xp, zp, {{NAME}}_PH * {{NAME}}_WP * 4);
    for (long h = 0; h < {{NAME}}_H; h++) {
        uint8_t* restrict row = xp + (h + {{NAME}}_PH) * {{NAME}}_WP * 4;
        const uint8_t* restrict s0 = X + ((c4 * 4) * {{NAME}}_H + h) * {{NAME}}_W;
        const uint8_t* restrict s1 = s0 + {{NAME}}_H * {{NAME}}_W;
        const uint8_t* restrict s2 = s1 + {{NAME}}_H * {{NAME}}_W;
        const uint8_t* restrict s3 = s2 + {{NAME}}_H * {{NAME}}_W;
        memset(row, zp, {{NAME}}_PW * 4);
        memset(row + ({{NAME}}_PW + {{NAME}}_W) * 4, zp, {{NAME}}_PW * 4);
        {{NAME}}_interleave4(s0, s1, s2, s3, row + {{NAME}}_PW * 4, {{NAME}}_W);
    }
    memset(xp + ({{NAME}}_PH + {{NAME}}_H) * {{NAME}}_WP * 4, zp, {{NAME}}_PH * {{NAME}}_WP * 4);
#else
    const long c = c4;
    uint8_t* restrict xp = pj->XP + c * {{NAME}}_HP * {{NAME}}_WP;
    memset(xp, zp, {{NAME}}_PH * {{NAME}}_WP);
    for (long h = 0; h < {{NAME}}_H; h++) {
        uint8_t* restrict row = xp + (h + {{NAME}}_PH) * {{NAME}}_WP;
        for (long v = 0; v < {{NAME}}_PW; v++)
            row[v] = row[{{NAME}}_PW + {{NAME}}_W + v] = zp;
        memcpy(row + {{NAME}}_PW, X + (c * {{NAME}}_H + h) * {{NAME}}_W, {{NAME}}_W);
    }
    memset(xp + ({{NAME}}_PH + {{NAME}}_H) * {{NAME}}_WP, zp, {{NAME}}_PH * {{NAME}}_WP);
#endif
}

static void {{NAME}}_pad_x(const uint8_t* restrict X, uint8_t* restrict XP, int32_t* restrict rowsum, uint8_t zp, int threads)
{
    {{NAME}}_pjob pj = {X, XP, zp};
    eqf_parallel_for({{NAME}}_PLANES, {{NAME}}_pad_plane, &pj, threads);
    memset(XP + {{NAME}}_CG * {{NAME}}_HP * {{NAME}}_WP, zp, 64);
    if (!rowsum)
        return;
    for (long q = 0; q < {{NAME}}_M; q++) {
        uint32_t s = 0;
        for (long c = 0; c < {{NAME}}_CG; c++)
            for (long u = 0; u < {{NAME}}_KH; u++)
                for (long v = 0; v < {{NAME}}_KW; v++)
                    s += XP[{{NAME}}_XAT(c, u, v) + {{NAME}}_xofs(q)] ^ {{NAME}}_RXOR;
        rowsum[q] = (int32_t)s;
    }
}
#else
static inline long {{NAME}}_arow0(long i0) { return i0 * {{NAME}}_LDA; }
#endif


typedef struct {
    const uint8_t* A;
    const int8_t* P;
    const int32_t* rowsum;
    {{OUT_T}}* C;
    long b;
    long jofs; /* the first output channel of the call's group (IM2COL) */
    uint32_t az;
    const {{BZP_T}}* bzp;
    int* nomem; /* a thread's partial-sum buffer could not be allocated */
    int tiles; /* AMX: the calling thread's tiles are configured for the whole call (one thread) */
    {{EXTRA_FIELDS}}
} {{NAME}}_job;

#if {{NAME}}_COLS8
#define {{NAME}}_OBW ({{NAME}}_NR < 16 ? 16 : {{NAME}}_NR) /* store_cols8's rows: whole vectors of 16 */
/* The low 8 bytes of v to c, those of the lanes set in `lanes` (all 8: one 8-byte store; else a
 * masked store, which writes and touches nothing at the other lanes) */
#if defined(__AVX512BW__) && defined(__AVX512VL__)
#define {{NAME}}_MASKED_STORES 1
#else
#define {{NAME}}_MASKED_STORES 0
#endif
static inline void {{NAME}}_store8(uint8_t* c, __m128i v, unsigned lanes)
{
#if {{NAME}}_MASKED_STORES
    if (lanes != 0xffu) {
        _mm_mask_storeu_epi8(c, (__mmask16)lanes, v);
        return;
    }
#endif
    _mm_storel_epi64((__m128i*)c, v);
}

/* COLS8 ({{COLS8}}: a conv, C NCHW of bytes, tiles of 8 or 16 rows): of a tile whose pixels are
 * consecutive, the tile's bytes, computed row by row into ob, stored channel by channel, each
 * channel's 8 pixels of 8 rows (ob) one 8-byte store at C + j MO, after a transpose in registers
 * (three rounds of unpacks per 16 channels), of the pixels in `lanes` (a run of the tile's pixels
 * that are consecutive in the output). Row by row, its bytes were nr stores MO apart for each row. */
static inline void {{NAME}}_store_cols8(const uint8_t ob[8][{{NAME}}_OBW], uint8_t* c, long nr, unsigned lanes)
{
    for (long j = 0; j < nr; j += 16) {
        __m128i r[8], t[8], u[8], v[8];
        for (int k = 0; k < 8; k++)
            r[k] = _mm_loadu_si128((const __m128i*)(ob[k] + j));
        for (int k = 0; k < 4; k++) { /* (rows 2k, 2k + 1 byte by byte: channels 0-7, then 8-15) */
            t[2 * k] = _mm_unpacklo_epi8(r[2 * k], r[2 * k + 1]);
            t[2 * k + 1] = _mm_unpackhi_epi8(r[2 * k], r[2 * k + 1]);
        }
        for (int h = 0; h < 2; h++) /* (rows 0-3 and 4-7 of four channels a vector) */
            for (int k = 0; k < 2; k++) {
                u[4 * h + 2 * k] = _mm_unpacklo_epi16(t[4 * h + k], t[4 * h + 2 + k]);
                u[4 * h + 2 * k + 1] = _mm_unpackhi_epi16(t[4 * h + k], t[4 * h + 2 + k]);
            }
        for (int k = 0; k < 4; k++) { /* (all 8 rows of two channels a vector: 2k, 2k + 1 of the four k's) */
            v[2 * k] = _mm_unpacklo_epi32(u[k], u[4 + k]);
            v[2 * k + 1] = _mm_unpackhi_epi32(u[k], u[4 + k]);
        }
        /* v[m] holds channels j + 2m (low half) and j + 2m + 1 (high half), in order: t's channels 0-7
         * are u[0], u[1] (0-3, 4-7), 8-15 u[2], u[3], so v[0..7] run through channels 0..15 */
        for (int m = 0; m < 8 && j + 2 * m < nr; m++) {
            {{NAME}}_store8(c + (j + 2 * m) * {{NAME}}_MO, v[m], lanes);
            if (j + 2 * m + 1 < nr)
                {{NAME}}_store8(c + (j + 2 * m + 1) * {{NAME}}_MO, _mm_unpackhi_epi64(v[m], v[m]), lanes);
        }
    }
}
#endif

/* Row r of the finished tile (pixel or row i, A's row q) through the epilogue, in the panel's
 * scope: element jj of it to DST[jj * STEP]. With QOUT ({{QOUT}}: the epilogue ends in a
 * quantize_linear whose scale and zero point are one each), the row's floats before that
 * quantize_linear ({{QX}}) first, then the row quantized at once (eqf_quantize_row). */
#define {{NAME}}_QOUT {{QOUT}}
#define {{NAME}}_ROW_ACC                                                                          \
        const long j = jofs + j0 + jj;                                                            \
        const int32_t acc = (int32_t)((uint32_t)trow[jj] + corr[jj] - bzj[jj] * rs);              \
        (void)j;                                                                                  \
        (void)i
#if {{NAME}}_QOUT
#define {{NAME}}_EPI_ROW(DST, STEP)                                                               \
    do {                                                                                          \
        const uint32_t rs = rowsum ? (uint32_t)rowsum[q] : 0u;                                    \
        const int32_t* restrict trow = tile + r * {{NAME}}_NR;                                    \
        float xr[{{NAME}}_NR] __attribute__((aligned(64)));                                       \
        uint8_t qr[{{NAME}}_NR];                                                                  \
        _Pragma("omp simd")                                                                       \
        for (long jj = 0; jj < nr; jj++) {                                                        \
            {{NAME}}_ROW_ACC;                                                                     \
            xr[jj] = {{QX}};                                                                      \
        }                                                                                         \
        const {{OUT_T}} zq = {{QZP}};                                                             \
        uint8_t* qd = (STEP) == 1 ? (uint8_t*)(DST) : qr;                                         \
        eqf_quantize_row(xr, nr, {{QSCALE}}, (float)zq, EQF_QLO(zq), EQF_QHI(zq), qd);            \
        if ((STEP) != 1)                                                                          \
            for (long jj = 0; jj < nr; jj++)                                                      \
                (DST)[jj * (STEP)] = ({{OUT_T}})qr[jj];                                           \
    } while (0)
#else
#define {{NAME}}_EPI_ROW(DST, STEP)                                                               \
    do {                                                                                          \
        const uint32_t rs = rowsum ? (uint32_t)rowsum[q] : 0u;                                    \
        const int32_t* restrict trow = tile + r * {{NAME}}_NR;                                    \
        _Pragma("omp simd")                                                                       \
        for (long jj = 0; jj < nr; jj++) {                                                        \
            {{NAME}}_ROW_ACC;                                                                     \
            (DST)[jj * (STEP)] = {{EPILOGUE}};                                                    \
        }                                                                                         \
    } while (0)
#endif

/* One NR-column panel over a block of MB rows of batch b (all M rows when MB is M): micro-kernel,
 * then the epilogue per tile */
static {{NAME}}_TARGET void {{NAME}}_panel(void* ctx, long chunk)
{
    const long p = chunk / {{NAME}}_RBLOCKS, m0 = chunk % {{NAME}}_RBLOCKS * {{NAME}}_MB;
    const long m1 = m0 + {{NAME}}_MB < {{NAME}}_M ? m0 + {{NAME}}_MB : {{NAME}}_M;
    const {{NAME}}_job* jb = ctx;
    const uint8_t* restrict A = jb->A;
    const int8_t* restrict bp = jb->P + p * {{NAME}}_PANEL_BYTES;
    const int32_t* restrict colsum = (const int32_t*)(jb->P + {{NAME}}_PANELS * {{NAME}}_PANEL_BYTES);
    const int32_t* restrict rowsum = jb->rowsum;
    {{OUT_T}}* restrict C = jb->C;
    const long b = jb->b, jofs = jb->jofs;
    const uint32_t az = jb->az;
    const {{BZP_T}}* restrict bzp = jb->bzp;
    {{EXTRA_UNPACK}}
    (void)b;
    (void)jofs;
    const long j0 = p * {{NAME}}_NR;
    const long nr = {{NAME}}_N - j0 < {{NAME}}_NR ? {{NAME}}_N - j0 : {{NAME}}_NR;
    /* per column: -az colsum[j] + K az bz[j] (uint32: wraps as int32 arithmetic does) and bz[j] */
    uint32_t corr[{{NAME}}_NR], bzj[{{NAME}}_NR];
    for (long jj = 0; jj < {{NAME}}_NR; jj++) {
        const long j = j0 + jj < {{NAME}}_N ? j0 + jj : {{NAME}}_N - 1;
        bzj[jj] = (uint32_t)((int32_t)bzp[{{NAME}}_BZP_PER_COL ? j : 0] - ({{NAME}}_B_U8 ? 128 : 0));
        corr[jj] = (uint32_t){{NAME}}_K * az * bzj[jj] - az * (uint32_t)colsum[j0 + jj];
    }
#if {{NAME}}_DIRECT_X
    pthread_once(&{{NAME}}_koff_once, {{NAME}}_koff_fill);
    const int32_t* restrict koff = {{NAME}}_koff;
#else
    const int32_t* koff = NULL;
    (void)koff;
#endif
    int32_t tile[{{NAME}}_MR * {{NAME}}_NR] __attribute__((aligned(64)));
    /* the partial sums of all M rows between K blocks (none with one block) */
    enum { ONE_BLOCK = {{NAME}}_KCG >= {{NAME}}_KGPP };
    int32_t* part = ONE_BLOCK ? NULL : (int32_t*)eqf_scratch(EQF_SCRATCH_GEMM_A, {{NAME}}_MPAD * {{NAME}}_NR);
    if (!ONE_BLOCK && !part) {
        __atomic_store_n(jb->nomem, 1, __ATOMIC_RELAXED);
        return;
    }
#if {{NAME}}_AMX
    if (!jb->tiles)
        eqf_amx_begin(); /* (per chunk: the tile configuration is a thread's) */
#endif
    for (long g0 = 0; g0 < {{NAME}}_KGPP; g0 += {{NAME}}_KCG) {
      const long g1 = g0 + {{NAME}}_KCG < {{NAME}}_KGPP ? g0 + {{NAME}}_KCG : {{NAME}}_KGPP;
      const int last = g1 == {{NAME}}_KGPP;
#if {{NAME}}_AMX
      if (last) {
        /* the last K block's tiles in turn, each one's sums stored into one of two buffers: the
         * previous tile's rows pass through the epilogue a few between each of this tile's K steps,
         * so that the vector units run the epilogue while the tile unit multiplies (BERT-base's FFN
         * up, whose GELU epilogue took longer than its tiles' products, 9% faster:
         * `benchmarks/bench_models.py --quantized dynamic --model bert-base`) */
        int32_t tb[2][{{NAME}}_MR * {{NAME}}_NR] __attribute__((aligned(64)));
        const long steps = (g1 - g0) / 16;
        long pi0 = 0;
        int pmr = 0, t = 0;
        for (long i0 = m0; i0 < m1; i0 += {{NAME}}_MR, t++) {
            const int32_t* tile = tb[(t + 1) & 1]; /* (the previous tile's sums, read by EPI_ROW) */
            const long per = (pmr + steps - 1) / steps;
            {{NAME}}_amx_start(g0 ? part + i0 * {{NAME}}_NR : NULL);
            for (long g = g0, s = 0; g < g1; g += 16, s++) {
                {{NAME}}_amx_step(A + i0 * {{NAME}}_LDA, bp, g);
                for (int r = (int)(s * per); r < (s + 1) * per && r < pmr; r++) {
                    const long q = pi0 + r, i = q;
                    {{NAME}}_EPI_ROW(C + i * {{LDC}}L + j0, 1);
                }
            }
            {{NAME}}_amx_finish(tb[t & 1]);
            pi0 = i0;
            pmr = m1 - i0 < {{NAME}}_MR ? (int)(m1 - i0) : {{NAME}}_MR;
        }
        const int32_t* tile = tb[(t + 1) & 1]; /* (the last tile) */
        for (int r = 0; r < pmr; r++) {
            const long q = pi0 + r, i = q;
            {{NAME}}_EPI_ROW(C + i * {{LDC}}L + j0, 1);
        }
        continue;
      }
#endif
      for (long i0 = m0; i0 < m1; i0 += {{NAME}}_MR) {
        const int mr = m1 - i0 < {{NAME}}_MR ? (int)(m1 - i0) : {{NAME}}_MR;
        const int32_t* init = g0 ? part + i0 * {{NAME}}_NR : NULL;
        int32_t* dst = last ? tile : part + i0 * {{NAME}}_NR;
        /* (the last M % MR rows: a kernel of that many rows, unrolled like the full one; AMX: all
         * MR rows, those past M from the A buffer's padding) */
#if {{NAME}}_AMX
        {{NAME}}_ukernel_amx(A + i0 * {{NAME}}_LDA, bp, g0, g1, init, dst);
#else
        if (mr == {{NAME}}_MR)
            {{NAME}}_ukernel({{NAME}}_MR, A + {{NAME}}_arow0(i0), koff, bp, g0, g1, init, dst);
        else
            {{NAME}}_ukernel({{NAME}}_EDGE, A + {{NAME}}_arow0(i0), koff, bp, g0, g1, init, dst);
#endif
        if (!last)
            continue;
#if {{NAME}}_NCORR
        /* the pairs packed reduced: A's byte times the remainder (A's rows as the micro-kernel reads them) */
        {
            const int32_t* start = {{NAME}}_FIX_START(jb->P);
            const {{NAME}}_fix_t* fix = {{NAME}}_FIXES(jb->P);
            for (long c = start[p]; c < start[p + 1]; c++)
                for (int r = 0; r < mr; r++) { /* (uint32: wraps as the int32 sums do) */
                    const int32_t byte = (int32_t)({{NAME}}_arow(A + {{NAME}}_arow0(i0), koff, r, fix[c].k / 4) >> 8 * (fix[c].k % 4) & 255);
                    tile[r * {{NAME}}_NR + fix[c].jj] = (int32_t)((uint32_t)tile[r * {{NAME}}_NR + fix[c].jj] + (uint32_t)(byte * fix[c].rem));
                }
        }
#endif
#if {{NAME}}_COLS8
        /* (a tile whose MR pixels are all stored, consecutive from ib: with DIRECT_X's virtual
         * pixels, VW a row, one that ends before its row's OW) */
        if (mr == {{NAME}}_MR && (!{{NAME}}_DIRECT_X || i0 % {{NAME}}_VW + {{NAME}}_MR <= {{NAME}}_OW)) {
            const long ib = {{NAME}}_DIRECT_X ? i0 / {{NAME}}_VW * {{NAME}}_OW + i0 % {{NAME}}_VW : i0;
            uint8_t ob[{{NAME}}_MR][{{NAME}}_OBW] __attribute__((aligned(64)));
            if ({{NAME}}_OBW > {{NAME}}_NR) /* (the columns past NR: loaded, never stored) */
                memset(ob, 0, sizeof ob);
            for (int r = 0; r < {{NAME}}_MR; r++) {
                const long i = ib + r, q = i0 + r;
                {{NAME}}_EPI_ROW(ob[r], 1);
            }
            for (int h = 0; h < {{NAME}}_MR; h += 8) /* (16 rows: two runs of 8 per channel) */
                {{NAME}}_store_cols8(ob + h, (uint8_t*)(C + j0 * {{NAME}}_MO + ib + h), nr, 0xffu);
            continue;
        }
#if {{NAME}}_DIRECT_X && {{NAME}}_MASKED_STORES
        /* (a tile of virtual pixels across the end of an output row: its stored pixels in runs that
         * are consecutive in the output, at most two, each stored channel by channel under the
         * mask of its lanes; a pixel not stored is computed as the tile's first stored one) */
        if (mr == {{NAME}}_MR) {
            long at[{{NAME}}_MR], first = -1;
            for (int r = 0; r < {{NAME}}_MR; r++) {
                const long q = i0 + r, col = q % {{NAME}}_VW;
                at[r] = col < {{NAME}}_OW ? q / {{NAME}}_VW * {{NAME}}_OW + col : -1;
                first = first < 0 ? at[r] : first;
            }
            if (first >= 0) {
                uint8_t ob[{{NAME}}_MR][{{NAME}}_OBW] __attribute__((aligned(64)));
                if ({{NAME}}_OBW > {{NAME}}_NR)
                    memset(ob, 0, sizeof ob);
                for (int r = 0; r < {{NAME}}_MR; r++) {
                    const long i = at[r] >= 0 ? at[r] : first, q = i0 + r;
                    {{NAME}}_EPI_ROW(ob[r], 1);
                }
                unsigned done = 0;
                for (int k = 0; k < {{NAME}}_MR; k++) {
                    if (at[k] < 0 || done >> k & 1)
                        continue;
                    const long base = at[k] - k; /* (lane t of the run is output pixel base + t) */
                    unsigned run = 0;
                    for (int t = k; t < {{NAME}}_MR; t++)
                        run |= (unsigned)(at[t] == base + t) << t;
                    done |= run;
                    for (int h = 0; h < {{NAME}}_MR; h += 8)
                        if (run >> h & 0xffu)
                            {{NAME}}_store_cols8(ob + h, (uint8_t*)(C + j0 * {{NAME}}_MO + base + h), nr, run >> h & 0xffu);
                }
            }
            continue;
        }
#endif
#endif
        for (int r = 0; r < mr; r++) {
            const long q = i0 + r;
#if {{NAME}}_DIRECT_X == 1 /* (virtual pixel q: column q % WP of output row q / WP; past OW not stored) */
            if (q % {{NAME}}_WP >= {{NAME}}_OW)
                continue;
            const long i = q / {{NAME}}_WP * {{NAME}}_OW + q % {{NAME}}_WP;
#elif {{NAME}}_DIRECT_X == 2 && {{NAME}}_OWV != {{NAME}}_OW /* (virtual pixel q: column q % OWV of output row q / OWV) */
            if (q % {{NAME}}_OWV >= {{NAME}}_OW)
                continue;
            const long i = q / {{NAME}}_OWV * {{NAME}}_OW + q % {{NAME}}_OWV;
#else
            const long i = q;
#endif
            /* C[i][j], or C[j][i] for a conv (NCHW: a column of the tile per channel plane) */
            {{OUT_T}}* restrict crow = C + ({{NAME}}_IM2COL ? i + j0 * {{NAME}}_MO : i * {{LDC}}L + j0);
            {{NAME}}_EPI_ROW(crow, {{NAME}}_IM2COL ? {{NAME}}_MO : 1);
        }
      }
    }
#if {{NAME}}_AMX
    if (!jb->tiles)
        _tile_release();
#endif
}

/* What every call of the kernel shares: its arguments, the scratch, and the job of the panels
 * (base: the fields every call has alike) */
typedef struct {
    const {{A_T}}* A0;
    const {{B_T}}* B0;
    const {{AZP_T}}* azp;
    const float* a_scale;
    uint8_t* qa;
    int32_t* rowsum;
    int8_t* packed;
    {{NAME}}_job base;
} {{NAME}}_call_t;

/* GEMM call b (a conv: image b / G, group b % G) on `threads` threads: its A made (quantized, the
 * im2col or the padded copy of x, into the A buffer: with `own`, image b's own, else the one
 * every call reuses), B packed when not prepacked, then its panels */
static void {{NAME}}_call(const {{NAME}}_call_t* cx, long b, int threads, int own)
{
    const {{A_T}}* A0 = cx->A0;
    const {{AZP_T}}* azp = cx->azp;
    const float* a_scale = cx->a_scale;
    (void)A0;
    (void)azp;
    (void)a_scale;
    uint8_t* const qa = cx->qa ? cx->qa + (own ? b * {{NAME}}_ASTRIDE : 0) : NULL;
    int32_t* const rowsum = cx->rowsum ? cx->rowsum + (own ? b * {{NAME}}_M : 0) : NULL;
    (void)qa;
#if {{NAME}}_QUANT_A && {{NAME}}_IM2COL
    /* the image's group of channels quantized (planes as rows), then their im2col */
    {{NAME}}_qjob qj = {(const float*)(const void*)(A0 + ((b / {{NAME}}_G) * {{NAME}}_CI + (b % {{NAME}}_G) * ({{NAME}}_CI / {{NAME}}_G))
                                                    * {{NAME}}_H * {{NAME}}_W),
                        qa + {{NAME}}_ABYTES, NULL, a_scale[0], (float)azp[0], EQF_QLO(azp[0]), EQF_QHI(azp[0]),
                        {{NAME}}_CI / {{NAME}}_G, {{NAME}}_H * {{NAME}}_W};
    eqf_parallel_for(({{NAME}}_CI / {{NAME}}_G + {{NAME}}_QROWS - 1) / {{NAME}}_QROWS, {{NAME}}_quantize, &qj, threads);
#if {{NAME}}_DIRECT_X
    {{NAME}}_pad_x(qa + {{NAME}}_ABYTES, qa, rowsum, (uint8_t)azp[0], threads);
#else
    {{NAME}}_cjob cj = {qa + {{NAME}}_ABYTES, qa, rowsum, (uint8_t)azp[0]};
    eqf_parallel_for(({{NAME}}_M + {{NAME}}_CROWS - 1) / {{NAME}}_CROWS, {{NAME}}_im2col, &cj, threads);
#endif
    const uint8_t* A = qa;
#elif {{NAME}}_QUANT_A
    {{NAME}}_qjob qj = {(const float*)(const void*)(A0 + b * {{NAME}}_M * {{NAME}}_K), qa, rowsum, a_scale[0],
                        (float)azp[0], EQF_QLO(azp[0]), EQF_QHI(azp[0]), {{NAME}}_M, {{NAME}}_K};
    eqf_parallel_for(({{NAME}}_M + {{NAME}}_QROWS - 1) / {{NAME}}_QROWS, {{NAME}}_quantize, &qj, threads);
    const uint8_t* A = qa;
#elif {{NAME}}_IM2COL
    const uint8_t* X = (const uint8_t*)(A0 + ((b / {{NAME}}_G) * {{NAME}}_CI + (b % {{NAME}}_G) * ({{NAME}}_CI / {{NAME}}_G))
                                        * {{NAME}}_H * {{NAME}}_W);
#if {{NAME}}_DIRECT_X
    {{NAME}}_pad_x(X, qa, rowsum, (uint8_t)azp[0], threads);
#else
    {{NAME}}_cjob cj = {X, qa, rowsum, (uint8_t)azp[0]};
    eqf_parallel_for(({{NAME}}_M + {{NAME}}_CROWS - 1) / {{NAME}}_CROWS, {{NAME}}_im2col, &cj, threads);
#endif
    const uint8_t* A = qa;
#elif {{NAME}}_AMX
    {{NAME}}_ajob aj = {(const uint8_t*)(A0 + b * {{NAME}}_M * {{NAME}}_K), qa, rowsum};
    eqf_parallel_for(({{NAME}}_M + {{NAME}}_QROWS - 1) / {{NAME}}_QROWS, {{NAME}}_copy_a, &aj, threads);
    const uint8_t* A = qa;
#else
    const uint8_t* A = (const uint8_t*)(A0 + b * {{NAME}}_M * {{NAME}}_K);
#endif
#if {{NAME}}_PREPACKED_B
    const int8_t* P = (const int8_t*)cx->B0;
#else
    /* (BY_IMAGE: packed once before the images) */
    if (!{{NAME}}_BY_IMAGE && (b < {{NBB}} || {{NBB}} > 1))
        {{NAME}}_pack(cx->B0 + (b % {{NBB}}) * {{NAME}}_K * {{NAME}}_N, cx->packed);
    const int8_t* P = cx->packed;
#endif
    if (rowsum && !{{NAME}}_ABUF)
        for (long i = 0; i < {{NAME}}_M; i++) {
            uint32_t s = 0;
            for (long k = 0; k < {{NAME}}_K; k++)
                s += A[i * {{NAME}}_K + k] ^ {{NAME}}_RXOR;
            rowsum[i] = (int32_t)s;
        }
    /* (a conv's call b: image b / G, its group's channels from jofs, their zero points) */
    const long img = {{NAME}}_IM2COL ? b / {{NAME}}_G : b, jofs = {{NAME}}_IM2COL ? (b % {{NAME}}_G) * {{NAME}}_N : 0;
    {{NAME}}_job job = cx->base;
    job.A = A;
    job.P = P;
    job.rowsum = rowsum;
    job.C = cx->base.C + b * {{NAME}}_MO * {{LDC}}L;
    job.b = img;
    job.jofs = jofs;
    job.bzp = cx->base.bzp + ({{NAME}}_BZP_PER_COL ? jofs : 0);
    eqf_parallel_for({{NAME}}_PANELS * {{NAME}}_RBLOCKS, {{NAME}}_panel, &job, threads);
}

#if {{NAME}}_BY_IMAGE
/* BY_IMAGE's chunk: image b, whole, on the thread that claimed it */
static void {{NAME}}_image(void* ctx, long b) { {{NAME}}_call(ctx, b, 1, 1); }
#endif

void {{NAME}}(const {{A_T}}* A0, const {{B_T}}* B0, const {{AZP_T}}* azp, const {{BZP_T}}* bzp, const float* a_scale,
              {{OUT_T}}* C0{{EXTRA_PARAMS}})
{
#if {{NAME}}_AMX
    if (!eqf_amx_ready()) { /* the tile state refused (common_amx.h): no tile instruction runs */
        eqf_fail_note(EQF_NO_AMX);
        return;
    }
#endif
    /* the zero points as the u8 x s8 product sees them (an s8 A's moved by +128) */
    const uint32_t az = (uint32_t)((int32_t)azp[0] + ({{NAME}}_A_S8 ? 128 : 0));
    int bz_zero = 1;
    for (long j = 0; j < ({{NAME}}_BZP_PER_COL ? {{NAME}}_G * {{NAME}}_N : 1); j++)
        bz_zero &= (int32_t)bzp[j] - ({{NAME}}_B_U8 ? 128 : 0) == 0;
    const long pbytes = {{NAME}}_PANELS * {{NAME}}_PANEL_BYTES + 4 * {{NAME}}_NPAD;
    /* scratch: the row sums of A (when needed), then B's panels (when not prepacked), then the
     * quantized A (QUANT_A) or a conv's A buffer; BY_IMAGE: row sums and A buffers per image */
    const long images = {{NAME}}_BY_IMAGE ? {{BATCH}} : 1;
    const long rfloats = bz_zero ? 0 : images * {{NAME}}_M, pfloats = {{NAME}}_PREPACKED_B ? 0 : (pbytes + 3) / 4;
    const long qfloats = {{NAME}}_ABUF ? (images * {{NAME}}_ASTRIDE + 3) / 4 : 0;
    float* scratch = rfloats + pfloats + qfloats == 0 ? NULL : eqf_scratch(EQF_SCRATCH_GEMM_B, rfloats + pfloats + qfloats);
    if (!scratch && rfloats + pfloats + qfloats) {
        eqf_nomem_note();
        return;
    }
    int nomem = 0;
    {{NAME}}_call_t cx = {A0, B0, azp, a_scale, {{NAME}}_ABUF ? (uint8_t*)(scratch + rfloats + pfloats) : NULL,
                          bz_zero ? NULL : (int32_t*)scratch, {{NAME}}_PREPACKED_B ? NULL : (int8_t*)(scratch + rfloats),
                          {NULL, NULL, NULL, C0, 0, 0, az, bzp, &nomem, 0{{EXTRA_INIT}}}};
    const int threads = {{NAME}}_PARALLEL ? eqf_pool_threads() : 1;
    /* (a call that ran this kernel on the pool with a worker: its workers linger after the call,
     * common_pool.h eqf_pool_linger, as after a call of eqf_region loops on the pool) */
    if (threads > 1)
        eqf_region_pooled = 1;
#if {{NAME}}_BY_IMAGE
    /* (on one thread the images in turn, in the one A buffer, as without BY_IMAGE) */
#if !{{NAME}}_PREPACKED_B
    {{NAME}}_pack(B0, cx.packed);
#endif
    if (threads > 1) {
        eqf_parallel_for({{BATCH}}, {{NAME}}_image, &cx, threads);
        goto done;
    }
#endif
#if {{NAME}}_AMX
    /* (on one thread the tiles configured once for every call and chunk: per chunk, the
     * configuration and release were most of a small GEMM's time, a ViT's attention products
     * under `benchmarks/bench_models.py --quantized static`) */
    cx.base.tiles = threads == 1;
    if (cx.base.tiles)
        eqf_amx_begin();
#endif
    for (long b = 0; b < {{BATCH}} && !__atomic_load_n(&nomem, __ATOMIC_RELAXED); b++)
        {{NAME}}_call(&cx, b, threads, 0);
#if {{NAME}}_AMX
    if (cx.base.tiles)
        _tile_release();
#endif
#if {{NAME}}_BY_IMAGE
done:
#endif
    if (__atomic_load_n(&nomem, __ATOMIC_RELAXED))
        eqf_nomem_note();
}

#if {{NAME}}_PREPACKED_B
/* The panels and column sums the kernel reads in place of B, in floats (the runtime's unit) */
long {{NAME}}_prepack_floats(void)
{
#if {{NAME}}_NCORR
    return ({{NAME}}_PANELS * {{NAME}}_PANEL_BYTES + 4 * {{NAME}}_NPAD + {{NAME}}_FIX_BYTES + 3) / 4;
#else
    return ({{NAME}}_PANELS * {{NAME}}_PANEL_BYTES + 4 * {{NAME}}_NPAD + 3) / 4;
#endif
}

void {{NAME}}_prepack(const float* B, float* P) { {{NAME}}_pack((const {{B_T}}*)(const void*)B, (int8_t*)P); }
#endif

EQF_WIDE_END
