# expect: 3:15: unexpected ')', expected end of line
graph g(x: f32[4, 8], w: f32[8, 3]) -> f32[4, 3] {
    y = x @ w )
    return y
}
