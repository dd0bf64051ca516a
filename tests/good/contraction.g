# matmul (plain, batched, broadcast batch dims) and conv2d (bias, stride, padding, pairs).
graph matmuls(a: f32[5, 6], b: f32[6, 7], c: f32[2, 3, 5, 6], d: f32[3, 6, 4]) -> (f32[5, 7], f32[2, 3, 5, 4]) {
    return a @ b, matmul(c, d)
}

graph convs(x: f32[N, 3, 9, 8], w: f32[4, 3, 3, 3], bias: f32[4], w1: f32[2, 4, 1, 1]) -> f32[N, 2, 5, 4] {
    y = conv2d(x, w, bias, stride=2, padding=1)
    z = conv2d(x, w, stride=[2, 2], padding=[1, 1])
    return conv2d(relu(y + z), w1)
}

graph conv_rect(x: f32[1, 2, 7, 6], w: f32[3, 2, 3, 2]) -> f32[1, 3, 3, 7] {
    return conv2d(x, w, stride=[2, 1], padding=[0, 1])
}
