/* {{NAME}}: matmul {{SHAPES}} through {{GEMM}} (epilogue fused into its store).
 * Batch dims that fold into one stride per operand are the GEMM's own batch; any others
 * ({{OUTER}} groups) are walked here. */
void {{NAME}}({{PARAMS}})
{
    for (long g = 0; g < {{OUTER}}; g++) {
{{OFFSETS}}
        {{GEMM}}({{ARGS}});
    }
}
