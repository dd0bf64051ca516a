# expect: 3:20: attribute approximate= of gelu must be one of 'none', 'tanh'
graph g(x: f32[4]) -> f32[4] {
    return gelu(x, approximate="fast")
}
