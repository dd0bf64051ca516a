# expect: 3:14: matmul inner dimensions differ: [4, 3] @ [4, 3] (3 vs 4)
graph g(x: f32[4, 3], y: f32[4, 3]) -> f32[4, 3] {
    return x @ y
}
