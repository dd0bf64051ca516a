# expect: 3:12: axis 3 is out of range for rank 1
graph g(x: f32[4]) -> f32[4] {
    return softmax(x, axis=3)
}
