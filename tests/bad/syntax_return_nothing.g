# expect: 3:11: unexpected end of line, expected '(', '-', 'false', 'kernel', 'true', a name, a number
graph g(x: f32[4]) -> f32[4] {
    return
}
