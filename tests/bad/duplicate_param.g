# expect: 2:20: 'x' is already defined at line 2
graph g(x: f32[4], x: f32[4]) -> f32[4] {
    return x
}
