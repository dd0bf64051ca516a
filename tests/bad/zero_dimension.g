# expect: 2:12: dimension 0 must be positive
graph g(x: f32[0]) -> f32[0] {
    return x
}
