# expect: 3:23: softmax has no attribute 'axes' (its attributes: axis, zero_nan)
graph g(x: f32[4]) -> f32[4] {
    return softmax(x, axes=0)
}
