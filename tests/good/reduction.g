graph reductions(x: f32[B, 4, 5]) -> (f32, f32[B, 5], f32[B, 1, 1], f32[4], f32[B, 4, 5]) {
    everything = sum(x)
    per_col = mean(x, axis=1)
    kept = max(x, axis=[1, 2], keepdims=true)
    neg_axes = mean(sum(x, axis=[0, -1]), axis=[], keepdims=false)
    return everything, per_col, kept, neg_axes, x - kept
}
