# expect: 3:12: cannot reshape [4, 6] to [5, 5]: sizes differ
graph g(x: f32[4, 6]) -> f32[5, 5] {
    return reshape(x, shape=[5, 5])
}
