# expect: 3:12: relu takes 1 tensor argument, got 2
graph g(x: f32[4]) -> f32[4] {
    return relu(x, x)
}
