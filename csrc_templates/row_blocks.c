#if {{NAME}}_PARALLEL >= 0
/* {{NAME}}'s blocks of {{STEP}} rows are the items of one eqf_region loop (common_pool.h):
 * OpenMP's static split when every core is free, else the claim-based pool (held over the
 * kernel by the run function); blocks_ runs the blocks [eqf_lo, eqf_hi) */
typedef struct {
    {{PARAM_FIELDS}}
} {{NAME}}_job;
static {{NAME}}_QATTR void {{NAME}}_blocks(void* eqf_ctx, long eqf_lo, long eqf_hi);
void {{NAME}}({{PARAMS}})
{
    {{NAME}}_job job = { {{PARAM_INIT}} };
    eqf_region(({{ROWS}} - {{R0}} + {{STEP}} - 1) / {{STEP}}, {{NAME}}_blocks, &job, {{NAME}}_PARALLEL);
}
static {{NAME}}_QATTR void {{NAME}}_blocks(void* eqf_ctx, long eqf_lo, long eqf_hi)
{
    const {{NAME}}_job* jb = eqf_ctx;
    {{PARAM_UNPACK}}
    const long eqf_first = {{R0}} + eqf_lo * {{STEP}}, eqf_end = eqf_minl({{R0}} + eqf_hi * {{STEP}}, {{ROWS}});
#else
/* (a GEMM's row epilogue: the rows [R0, ROWS) the GEMM's thread has finished, on that thread) */
{{NAME}}_QATTR void {{NAME}}({{PARAMS}})
{
    const long eqf_first = {{R0}}, eqf_end = {{ROWS}};
#endif
