# expect: 3:31: attribute 'axis' given twice
graph g(x: f32[4]) -> f32[4] {
    return softmax(x, axis=0, axis=0)
}
