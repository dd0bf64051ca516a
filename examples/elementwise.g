# A chain of pointwise ops: one kernel, one pass over memory once fused.
graph chain(a: f32[N], b: f32[N], c: f32[N]) -> f32[N] {
    t = relu(a * b + c)
    u = sigmoid(t) * tanh(c) - 0.5
    return exp(-u * u) / (1 + abs(t))
}
