# expect: 3:12: cannot reshape [4, 6] (24 elements) to [-1, 5]
graph g(x: f32[4, 6]) -> f32[5, 5] {
    return reshape(x, shape=[-1, 5])
}
