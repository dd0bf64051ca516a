# expect: 3:5: graph 'g' returns 1 value but declares 2
graph g(x: f32[4]) -> (f32[4], f32[4]) {
    return x
}
