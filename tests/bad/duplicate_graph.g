# expect: 5:7: graph 'g' is already defined at line 2
graph g(x: f32[4]) -> f32[4] {
    return x
}
graph g(x: f32[4]) -> f32[4] {
    return x
}
