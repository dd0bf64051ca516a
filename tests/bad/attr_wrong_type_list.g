# expect: 3:25: attribute stride= of conv2d must be an integer or a list of two integers
graph g(x: f32[1, 3, 4, 4], w: f32[8, 3, 1, 1]) -> f32[1, 8, 4, 4] {
    return conv2d(x, w, stride=[1, 1, 1])
}
