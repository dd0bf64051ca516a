# expect: 3:18: unexpected 'e'
graph g(x: f32[4, 8], w: f32[8, 3]) -> f32[4, 3] {
    y = x @ w * 1e
    return y
}
