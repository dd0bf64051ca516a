# expect: 3:12: layernorm takes 3 tensor arguments, got 2
graph g(x: f32[4]) -> f32[4] {
    return layernorm(x, x)
}
