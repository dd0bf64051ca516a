# expect: 3:13: unexpected end of file
graph g(x: f32[4]) -> f32[4] {
    return x
