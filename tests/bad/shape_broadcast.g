# expect: 3:14: cannot broadcast [4, 3] with [5]: dimension 3 vs 5
graph g(x: f32[4, 3], y: f32[5]) -> f32[4, 3] {
    return x + y
}
