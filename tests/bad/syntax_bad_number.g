# expect: 3:20: unexpected '.3'
graph g(x: f32[4, 8], w: f32[8, 3]) -> f32[4, 3] {
    y = x @ w * 1.2.3
    return y
}
