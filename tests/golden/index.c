#define eqf_kinds_k7_index_PARALLEL 0 /* the plan's parallel: the `if` of a pooling, dynamic_range or integer conv kernel's parallel loop */
#define eqf_kinds_k7_index_IN_BLOCKED 0 /* the plan's in_blocked: the input in blocks of VL channels (a pooling between convs reads it) */
#define eqf_kinds_k7_index_OUT_BLOCKED 0 /* the plan's out_blocked: the output in blocks of VL channels (read too) */
#define eqf_kinds_k7_index_VL 0 /* the plan's vl: the channels of a block, the lanes of the blocked pooling's loops (0: not blocked) */
#define eqf_kinds_k7_index_CHECKED 1 /* the plan's checked: the kernel counts indices out of range */
#define eqf_kinds_k7_index_POOL_S2 0 /* the plan's pool_s2: a stride-2 max pool's rows in AVX-512 vectors */
/* eqf_kinds_k7_index: gather over [5, 7]. An index kernel: it selects or moves elements. It returns
 * how many indices were out of range (0 for a kernel that reads no indices). A pooling kernel's
 * loop is a range function of the claim-based pool (eqfuse.backend.kinds.index.on_pool). */
long eqf_kinds_k7_index(const float* restrict in0, const int64_t* restrict in1, float* restrict out)
{
    long bad = 0;
    for (long o = 0; o < 1; o++)
        for (long k = 0; k < 5; k++) {
            long j = (long)in1[k];
            if (j < 0) j += 11;
            if (j < 0 || j >= 11) { bad++; j = 0; }
            memcpy(out + (o * 5 + k) * 7, in0 + (o * 11 + j) * 7, 7 * sizeof(*out));
        }
    return bad;
}
