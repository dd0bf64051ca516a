# expect: 3:23: maximum has no attribute 'axis' (its attributes: none)
graph g(x: f32[4]) -> f32[4] {
    return maximum(x, axis=1, x)
}
