# A ResNet-style block: 3x3 convolution, inference batchnorm, ReLU. NCHW / OIHW.
graph conv_bn_relu(x: f32[N, 16, 32, 32], w: f32[32, 16, 3, 3],
                   mean: f32[32], var: f32[32], gamma: f32[32], beta: f32[32]) -> f32[N, 32, 32, 32] {
    y = conv2d(x, w, stride=1, padding=1)
    return relu(batchnorm(y, mean, var, gamma, beta, eps=1e-5))
}
