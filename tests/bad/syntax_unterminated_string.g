# expect: 3:32: unterminated string
graph g(x: f32[4]) -> f32[4] {
    return gelu(x, approximate="tanh)
}
