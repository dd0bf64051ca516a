# expect: 5:14: cannot broadcast [4, 3] with [4]
graph g(x: f32[4, 3], w: f32[3, 3]) -> f32[4, 3] {
    h = x @ w
    v = sum(h, axis=1)
    return h + v
}
