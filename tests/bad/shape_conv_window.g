# expect: 3:12: conv2d window 5 with padding 0 does not fit input size 4
graph g(x: f32[1, 3, 4, 4], w: f32[8, 3, 5, 5]) -> f32[1, 8, 1, 1] {
    return conv2d(x, w)
}
