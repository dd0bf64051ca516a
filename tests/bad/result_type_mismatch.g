# expect: 3:12: graph 'g' returns f32[4] here but declares f32[5]
graph g(x: f32[4]) -> f32[5] {
    return relu(x)
}
