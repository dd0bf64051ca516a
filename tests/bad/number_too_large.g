# expect: 3:16: number 1e400 is too large for f32
graph g(x: f32[4]) -> f32[4] {
    return x * 1e400
}
