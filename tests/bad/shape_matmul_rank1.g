# expect: 3:14: matmul needs operands of rank >= 2, got [4] and [4]
graph g(x: f32[4], w: f32[4]) -> f32 {
    return x @ w
}
