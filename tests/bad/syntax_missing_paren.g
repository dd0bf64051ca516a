# expect: 4:5: unexpected 'return'
graph g(x: f32[4, 8], w: f32[8, 3]) -> f32[4, 3] {
    y = relu(x @ w
    return y
}
# note: the '(' at line 3, column 13 is never closed
