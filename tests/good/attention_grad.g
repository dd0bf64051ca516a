# The gradients of softmax(q @ k^T * 0.5 + mask) @ v with respect to q, k and v
graph attention_grads(q: f32[2, 3, 5, 4], k: f32[2, 3, 7, 4], v: f32[2, 3, 7, 4], dy: f32[2, 3, 5, 4],
                      mask: f32[2, 1, 1, 7]) -> f32[2, 3, 7, 4] {
    dq = attention_dq(q, k, v, dy, mask, scale=0.5)
    dk = attention_dk(q, k, v, dy, scale=0.5, zero_nan=true)
    return attention_dv(q, k, dy, mask, scale=0.5) + dk + sum(dq, axis=[2], keepdims=true)
}

# The gradients of softmax and layernorm with respect to their input
graph row_grads(dy: f32[2, 5, 8], y: f32[2, 5, 8], x: f32[2, 5, 8], g: f32[8]) -> f32[2, 5, 8] {
    return softmax_grad(dy * 2, y) + layernorm_grad(dy, x, g, eps=0.001) + softmax_grad(dy, y, axis=1)
}
