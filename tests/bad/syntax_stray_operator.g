# expect: 3:13: unexpected '@', expected '(', '-', 'kernel', a name, a number
graph g(x: f32[4, 8], w: f32[8, 3]) -> f32[4, 3] {
    y = x @ @ w
    return y
}
