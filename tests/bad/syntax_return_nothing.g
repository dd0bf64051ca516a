# expect: 3:11: unexpected end of line, expected '(', '-', 'kernel', a name, a number
graph g(x: f32[4]) -> f32[4] {
    return
}
