# A three-layer MLP: the walk-through of docs/backend.md (opt, lower --uops, run --verify, bench).
graph mlp3(x: f32[B, 784], w1: f32[784, 512], b1: f32[512], w2: f32[512, 256], b2: f32[256],
           w3: f32[256, 10], b3: f32[10]) -> f32[B, 10] {
    h1 = relu(x @ w1 + b1)
    h2 = relu(h1 @ w2 + b2)
    return h2 @ w3 + b3
}
