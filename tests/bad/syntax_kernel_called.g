# expect: 3:18: unexpected '(', expected '{'
graph g(x: f32[4]) -> f32[4] {
    return kernel(x)
}
