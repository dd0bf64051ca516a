# One transformer encoder layer (post-norm, as in BERT): 4 heads of 64, model width 256,
# sequence length 128, batch B. Attention is written out; eqfuse recognizes it.
graph encoder(x: f32[B, 128, 256],
              wq: f32[256, 256], bq: f32[256], wk: f32[256, 256], bk: f32[256],
              wv: f32[256, 256], bv: f32[256], wo: f32[256, 256], bo: f32[256],
              g1: f32[256], be1: f32[256],
              w1: f32[256, 1024], b1: f32[1024], w2: f32[1024, 256], b2: f32[256],
              g2: f32[256], be2: f32[256]) -> f32[B, 128, 256] {
    q = transpose(reshape(x @ wq + bq, shape=[-1, 128, 4, 64]), perm=[0, 2, 1, 3])
    k = transpose(reshape(x @ wk + bk, shape=[-1, 128, 4, 64]), perm=[0, 2, 1, 3])
    v = transpose(reshape(x @ wv + bv, shape=[-1, 128, 4, 64]), perm=[0, 2, 1, 3])
    a = softmax(q @ transpose(k, perm=[0, 1, 3, 2]) * 0.125, axis=-1) @ v
    o = reshape(transpose(a, perm=[0, 2, 1, 3]), shape=[-1, 128, 256])
    h = layernorm(x + (o @ wo + bo), g1, be1)
    f = gelu(h @ w1 + b1) @ w2 + b2
    return layernorm(h + f, g2, be2)
}
