# expect: 3:12: concat takes at least 1 tensor argument, got 0
graph g(x: f32[4]) -> f32[4] {
    return concat(axis=0)
}
