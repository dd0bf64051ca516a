# expect: 3:14: unexpected character '$'
graph g(x: f32[4]) -> f32[4] {
    return x $ x
}
