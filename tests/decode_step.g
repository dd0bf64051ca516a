# One decode step of a one-layer attention decoder with a KV cache, written by hand: 4 heads of
# 16, width 64, 100 logits. past_k and past_v are the cache's P rows, [B, heads, P, head size]
# as the ONNX exports have them; the step appends the new token's keys and values (concat along
# P) and returns them as the presents. P + 1 is a sum of names, so compile binds P with dims=;
# live="P" makes P the cache's capacity and its live length a run-time input (docs/generation.md):
#   eqfuse.compile("tests/decode_step.g", dims={"B": 1, "P": 32}, live="P")
graph decode(x: f32[B, 1, 64], past_k: f32[B, 4, P, 16], past_v: f32[B, 4, P, 16],
             wq: f32[64, 64], wk: f32[64, 64], wv: f32[64, 64], wo: f32[64, 64], wout: f32[64, 100]) {
    q = transpose(reshape(x @ wq, shape=[-1, 1, 4, 16]), perm=[0, 2, 1, 3])
    k = transpose(reshape(x @ wk, shape=[-1, 1, 4, 16]), perm=[0, 2, 1, 3])
    v = transpose(reshape(x @ wv, shape=[-1, 1, 4, 16]), perm=[0, 2, 1, 3])
    keys = concat(past_k, k, axis=2)
    values = concat(past_v, v, axis=2)
    a = softmax(q @ transpose(keys, perm=[0, 1, 3, 2]) * 0.25, axis=-1) @ values
    h = x + reshape(transpose(a, perm=[0, 2, 1, 3]), shape=[-1, 1, 64]) @ wo
    return h @ wout, keys, values
}
