# expect: 3:12: axis 1 is out of range for rank 1
graph g(x: f32[4]) -> f32 {
    return sum(x, axis=[0, 1])
}
