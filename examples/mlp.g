# A two-layer MLP. Comments run from '#' to the end of the line.
graph mlp(x: f32[B, 784], w1: f32[784, 1024], b1: f32[1024],
          w2: f32[1024, 10], b2: f32[10]) -> f32[B, 10] {
    h = relu(x @ w1 + b1)
    return h @ w2 + b2
}
