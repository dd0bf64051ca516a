# expect: 2:29: unexpected end of line, expected '{'
graph g(x: f32[4]) -> f32[4]
    return x
}
