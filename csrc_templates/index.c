#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the `if` of a pooling, dynamic_range or integer conv kernel's parallel loop */
#define {{NAME}}_IN_BLOCKED {{IN_BLOCKED}} /* the plan's in_blocked: the input in blocks of VL channels (a pooling between convs reads it) */
#define {{NAME}}_OUT_BLOCKED {{OUT_BLOCKED}} /* the plan's out_blocked: the output in blocks of VL channels (read too) */
#define {{NAME}}_VL {{VL}} /* the plan's vl: the channels of a block, the lanes of the blocked pooling's loops (0: not blocked) */
#define {{NAME}}_CHECKED {{CHECKED}} /* the plan's checked: the kernel counts indices out of range */
#define {{NAME}}_POOL_S2 {{POOL_S2}} /* the plan's pool_s2: a stride-2 max pool's rows in AVX-512 vectors */
/* {{NAME}}: {{OP}} over {{SPACE}}. An index kernel: it selects or moves elements. It returns
 * how many indices were out of range (0 for a kernel that reads no indices). A pooling kernel's
 * loop is a range function of the claim-based pool (eqfuse.backend.kinds.index.on_pool). */
{{RANGES}}long {{NAME}}({{PARAMS}})
{
    long bad = 0;
{{BODY}}
    return bad;
}
