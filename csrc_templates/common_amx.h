/* AMX tiles, for the blocked GEMM's BF16 3 path (csrc_templates/gemm.c; docs/precision.md,
 * "AMX-BF16") and the integer GEMM's PATH 5 (csrc_templates/gemm_u8s8.c, tdpbusd), in a module
 * built for a CPU with AMX-TILE and AMX-BF16 or AMX-INT8, or with EQF_AMX_EMULATE.
 *
 * eqf_amx_ready(): Linux enables the tile data state (XSTATE component 18, XTILEDATA) for a
 * process only on request, arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); the first tile
 * instruction of a process without it raises SIGILL. The permission is the whole process's (every
 * thread, present or later; inherited by fork, cleared by exec), so the GEMM asks once, on the
 * calling thread before its parallel region; asking again is harmless (a module asks once, and
 * every module of the process may). A refusal (a kernel older than 5.16, or a sigaltstack too
 * small for the tile state) makes the GEMM note EQF_NO_AMX and return without running a tile
 * instruction: the caller gets an error, not a signal.
 *
 * eqf_amx_begin(): palette 1 with tiles 0-7 of 16 rows x 64 bytes each (EQF_AMX_CFG), loaded by
 * every thread that runs tiles (the tile configuration is per thread); _tile_release() after its
 * last tile instruction returns the tile state to its initial one.
 *
 * EQF_AMX_EMULATE: the same kernels on a CPU without AMX, for the tests. The tile instructions
 * (_tile_loadconfig, _tile_loadd, _tile_stored, _tile_zero, _tile_dpbf16ps, _tile_dpbusd, _tile_release) become
 * C over per-thread tile registers held as arrays, following the operation sections of Intel's
 * SDM: LDTILECFG zeroes the tiles; TILELOADD and TDPBF16PS write `rows` rows of `colsb` bytes and
 * zero the rest of the tile; TDPBF16PS keeps two f32 sums per output element (the even and the odd
 * elements of the K-pairs), each built by FMAs over the 16 K-pairs of the A row, then adds the two
 * and adds that to the accumulator, every step rounded to nearest even with denormal inputs read
 * as zero and denormal results flushed to zero (DAZ = FTZ = 1); TDPBUSD adds to each int32 element
 * the four products of u8 A bytes and s8 B bytes of every K-group, wrapping (no saturation). A
 * shape the instruction refuses (#UD) traps. */
#if defined(EQF_AMX_EMULATE) || (defined(__AMX_TILE__) && (defined(__AMX_BF16__) || defined(__AMX_INT8__)))

/* The 64-byte tile configuration of LDTILECFG */
typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16]; /* bytes per row of tiles 0-15 */
    uint8_t rows[16];
} __attribute__((aligned(64))) eqf_tilecfg;

/* A static constant: the compiler must not drop a store to a local copy that only the asm reads */
__attribute__((unused)) static const eqf_tilecfg EQF_AMX_CFG = {.palette_id = 1, .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
                                        .rows = {16, 16, 16, 16, 16, 16, 16, 16}};

/* gcc's tileloadd asm names no memory it reads: the packed operands must be in memory before it */
#define EQF_AMX_FENCE() __asm__ volatile("" ::: "memory")

#if defined(EQF_AMX_EMULATE)
#if defined(__x86_64__)
#include <immintrin.h> /* (first: its tile macros are replaced below) */
#endif
#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
#undef _tile_dpbusd

static _Thread_local struct {
    eqf_tilecfg cfg;
    int on; /* a palette is loaded */
    uint8_t t[8][16][64];
} eqf_amx_emu;

static inline void eqf_amx_emu_check(int ok)
{
    if (!ok)
        __builtin_trap(); /* (#UD or #GP: a use the hardware refuses) */
}

static inline void eqf_amx_emu_loadconfig(const void* p)
{
    memcpy(&eqf_amx_emu.cfg, p, sizeof(eqf_tilecfg));
    memset(eqf_amx_emu.t, 0, sizeof eqf_amx_emu.t);
    const eqf_tilecfg* c = &eqf_amx_emu.cfg;
    eqf_amx_emu.on = c->palette_id != 0;
    eqf_amx_emu_check(c->palette_id <= 1);
    for (int t = 0; t < 16; t++)
        eqf_amx_emu_check(t < 8 ? c->rows[t] <= 16 && c->colsb[t] <= 64 : c->rows[t] == 0 && c->colsb[t] == 0);
}

static inline void eqf_amx_emu_release(void)
{
    memset(&eqf_amx_emu, 0, sizeof eqf_amx_emu);
}

/* tile t, which must be configured */
static inline uint8_t (*eqf_amx_emu_tile(int t))[64]
{
    eqf_amx_emu_check(eqf_amx_emu.on && t >= 0 && t < 8 && eqf_amx_emu.cfg.rows[t] > 0);
    return eqf_amx_emu.t[t];
}

static inline void eqf_amx_emu_loadd(int t, const void* base, long stride)
{
    uint8_t (*x)[64] = eqf_amx_emu_tile(t);
    const int rows = eqf_amx_emu.cfg.rows[t], colsb = eqf_amx_emu.cfg.colsb[t];
    memset(x, 0, 16 * 64);
    for (int r = 0; r < rows; r++)
        memcpy(x[r], (const char*)base + r * stride, (size_t)colsb);
}

static inline void eqf_amx_emu_stored(int t, void* base, long stride)
{
    uint8_t (*x)[64] = eqf_amx_emu_tile(t);
    for (int r = 0; r < eqf_amx_emu.cfg.rows[t]; r++)
        memcpy((char*)base + r * stride, x[r], eqf_amx_emu.cfg.colsb[t]);
}

static inline void eqf_amx_emu_zero(int t)
{
    memset(eqf_amx_emu_tile(t), 0, 16 * 64);
}

/* DAZ and FTZ: a denormal read or written as a zero of its sign */
static inline float eqf_amx_emu_flush(float x)
{
    return fabsf(x) < 0x1p-126f ? copysignf(0.0f, x) : x;
}

/* make_fp32 of the bf16 element i of row r of tile t (a denormal read as zero) */
static inline float eqf_amx_emu_bf16(int t, int r, int i)
{
    uint16_t h;
    memcpy(&h, &eqf_amx_emu.t[t][r][2 * i], 2);
    return eqf_amx_emu_flush(eqf_bf16_f32(h));
}

static inline float eqf_amx_emu_f32(int t, int r, int n)
{
    float x;
    memcpy(&x, &eqf_amx_emu.t[t][r][4 * n], 4);
    return x;
}

/* the configuration of a tile product d += s1 . s2 (TDPBF16PS, TDPBUSD), its three tiles
 * configured and their shapes matched as the instructions require */
static inline const eqf_tilecfg* eqf_amx_emu_dp_cfg(int d, int s1, int s2)
{
    (void)eqf_amx_emu_tile(d);
    (void)eqf_amx_emu_tile(s1);
    (void)eqf_amx_emu_tile(s2);
    const eqf_tilecfg* c = &eqf_amx_emu.cfg;
    eqf_amx_emu_check(c->colsb[d] % 4 == 0 && c->colsb[s1] % 4 == 0 && c->colsb[s2] % 4 == 0
                      && c->colsb[d] == c->colsb[s2] && c->colsb[s1] / 4 == c->rows[s2] && c->rows[d] == c->rows[s1]);
    return c;
}

static inline void eqf_amx_emu_dpbf16ps(int d, int s1, int s2)
{
    const eqf_tilecfg* c = eqf_amx_emu_dp_cfg(d, s1, s2);
    const int rows = c->rows[d], kpairs = c->colsb[s1] / 4, cols = c->colsb[d] / 4;
    uint8_t out[16][64] = {{0}};
    for (int m = 0; m < rows; m++) {
        float even[16] = {0}, odd[16] = {0}; /* temp1: the even and the odd products' sums */
        for (int k = 0; k < kpairs; k++)
            for (int n = 0; n < cols; n++) {
                even[n] = eqf_amx_emu_flush(fmaf(eqf_amx_emu_bf16(s1, m, 2 * k), eqf_amx_emu_bf16(s2, k, 2 * n), even[n]));
                odd[n] = eqf_amx_emu_flush(fmaf(eqf_amx_emu_bf16(s1, m, 2 * k + 1), eqf_amx_emu_bf16(s2, k, 2 * n + 1),
                                                odd[n]));
            }
        for (int n = 0; n < cols; n++) {
            const float pair = eqf_amx_emu_flush(even[n] + odd[n]);
            const float acc = eqf_amx_emu_flush(eqf_amx_emu_flush(eqf_amx_emu_f32(d, m, n)) + pair);
            memcpy(&out[m][4 * n], &acc, 4);
        }
    }
    memcpy(eqf_amx_emu.t[d], out, sizeof out);
}

/* TDPBUSD: d[m][n] += sum over the K-groups k of u8 s1[m][4k + i] x s8 s2[k][4n + i], i < 4, in
 * int32 arithmetic that wraps */
static inline void eqf_amx_emu_dpbusd(int d, int s1, int s2)
{
    const eqf_tilecfg* c = eqf_amx_emu_dp_cfg(d, s1, s2);
    const int rows = c->rows[d], kgroups = c->colsb[s1] / 4, cols = c->colsb[d] / 4;
    uint8_t out[16][64] = {{0}};
    for (int m = 0; m < rows; m++)
        for (int n = 0; n < cols; n++) {
            uint32_t acc;
            memcpy(&acc, &eqf_amx_emu.t[d][m][4 * n], 4);
            for (int k = 0; k < kgroups; k++)
                for (int i = 0; i < 4; i++)
                    acc += (uint32_t)((int32_t)eqf_amx_emu.t[s1][m][4 * k + i] * (int32_t)(int8_t)eqf_amx_emu.t[s2][k][4 * n + i]);
            memcpy(&out[m][4 * n], &acc, 4);
        }
    memcpy(eqf_amx_emu.t[d], out, sizeof out);
}

#define _tile_loadconfig(p) eqf_amx_emu_loadconfig(p)
#define _tile_release() eqf_amx_emu_release()
#define _tile_loadd(t, base, stride) eqf_amx_emu_loadd((t), (base), (long)(stride))
#define _tile_stored(t, base, stride) eqf_amx_emu_stored((t), (base), (long)(stride))
#define _tile_zero(t) eqf_amx_emu_zero(t)
#define _tile_dpbf16ps(d, s1, s2) eqf_amx_emu_dpbf16ps((d), (s1), (s2))
#define _tile_dpbusd(d, s1, s2) eqf_amx_emu_dpbusd((d), (s1), (s2))

/* (EQF_AMX_EMULATE_REFUSED: as if the operating system refused the tile state, for the test of the error) */
#if defined(EQF_AMX_EMULATE_REFUSED)
__attribute__((unused)) static int eqf_amx_ready(void) { return 0; }
#else
__attribute__((unused)) static int eqf_amx_ready(void) { return 1; }
#endif
#else
static pthread_once_t eqf_amx_once = PTHREAD_ONCE_INIT;
static int eqf_amx_granted;

static void eqf_amx_request(void)
{
#if defined(__linux__)
    /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18), the numbers of <asm/prctl.h>
     * spelled out for C libraries older than the request */
    eqf_amx_granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    eqf_amx_granted = 1; /* (other systems enable the tile state without a request) */
#endif
}

/* whether this process may run tile instructions (asked once, see above) */
__attribute__((unused)) static int eqf_amx_ready(void)
{
    pthread_once(&eqf_amx_once, eqf_amx_request);
    return eqf_amx_granted;
}
#endif

/* (a macro: <immintrin.h>, which declares _tile_loadconfig, is the kernel's include) */
#define eqf_amx_begin() _tile_loadconfig(&EQF_AMX_CFG)
#endif
