# expect: 3:29: unexpected '+', expected ')', ','
graph g(x: f32[4, 2]) -> f32[4, 2] {
    return softmax(x, axis=1+1)
}
