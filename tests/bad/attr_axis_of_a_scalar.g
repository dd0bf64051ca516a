# expect: 3:12: axis 0 is out of range for rank 0
graph g(s: f32) -> f32[2] {
    return concat(s, s)
}
