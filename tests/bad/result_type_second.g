# expect: 3:15: graph 'g' returns f32[1] here but declares f32
graph g(x: f32[4]) -> (f32[4], f32) {
    return x, sum(x, keepdims=true)
}
