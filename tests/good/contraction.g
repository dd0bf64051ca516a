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

# grouped, depthwise and dilated conv2d, conv1d (NCW, OIW) and conv_transpose2d ([C_in, C_out / group, kH, kW])
graph conv_groups(x: f32[2, 8, 9, 9], dw: f32[8, 1, 3, 3], gw: f32[4, 4, 3, 3], s: f32[2, 6, 20],
                  w1: f32[4, 3, 3], t: f32[1, 4, 5, 5], wt: f32[4, 2, 3, 3]) -> (f32[2, 8, 9, 9], f32[2, 4, 5, 5], f32[2, 4, 8], f32[1, 4, 11, 11]) {
    d = conv2d(x, dw, padding=1, group=8)
    g = conv2d(x, gw, dilation=2, group=2)
    c = conv1d(s, w1, stride=2, dilation=2, group=2)
    u = conv_transpose2d(t, wt, stride=2, output_padding=[0, 0], group=2)
    return d, g, c, u
}
