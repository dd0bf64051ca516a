/* {{NAME}}: {{OP}} over {{SPACE}}. An index kernel: it selects or moves elements. It returns
 * how many indices were out of range (0 for a kernel that reads no indices). */
long {{NAME}}({{PARAMS}})
{
    long bad = 0;
{{BODY}}
    return bad;
}
