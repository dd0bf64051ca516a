# Row ops with their attributes given and left at the defaults.
graph rows(x: f32[B, 6, 8], g8: f32[8], b8: f32[8], g68: f32[6, 8], b68: f32[6, 8]) -> f32[B, 6, 8] {
    s0 = softmax(x)
    s1 = softmax(x, axis=1)
    s2 = softmax(x, axis=-3)
    l1 = layernorm(x, g8, b8)
    l2 = layernorm(x, g68, b68, axis=-2, eps=0.001)
    r = rmsnorm(x, g8, eps=1e-3) + rmsnorm(x, g8)
    return s0 + s1 + s2 + l1 + l2 + r
}

graph bn(x: f32[N, 3, 4, 4], m: f32[3], v: f32[3], g: f32[3], b: f32[3], y: f32[2, 3]) -> (f32[N, 3, 4, 4], f32[2, 3]) {
    return batchnorm(x, m, v, g, b, eps=0.01), batchnorm(y, m, v, g, b)
}
