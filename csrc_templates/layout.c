/* {{NAME}}: {{OP}} {{SPACE}} (a strided copy per input; writes are contiguous). */
void {{NAME}}({{PARAMS}})
{
{{BLOCKS}}
}
