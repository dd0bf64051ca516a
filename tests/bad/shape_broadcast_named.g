# expect: 3:14: cannot broadcast [B] with [N]: dimension B vs N
graph g(x: f32[B], y: f32[N]) -> f32[B] {
    return x + y
}
