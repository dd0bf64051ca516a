# Comments, blank lines, line breaks inside brackets, trailing commas, quoting, number forms.

graph syntax(   # a comment after '('
    x: f32[B, T, 4],   # named dims
    w: f32[4, 4],
) -> f32[B, T, 4] {

    # a comment line inside the body
    y = x @ w   # a trailing comment
    z = gelu(
        y,
        approximate='tanh',
    )
    nums = .5 * z + 1. * z - 1e-3 * z + 2E+2 * z + 0.000125 * z + 12345678 * z
    k = sum(nums, axis=[-1,], keepdims=true) + max(nums, axis=-1, keepdims=true,)
    return nums - k
}
