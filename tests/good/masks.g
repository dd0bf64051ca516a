# Index and mask arithmetic as exported models write it: i64 ids, bool masks, and the ops
# that build them.
graph embed(ids: i64[B, S], table: f32[100, 16], pos: f32[32, 16], mask: i64[B, S]) -> f32[B, S, 16] {
    keep = mask != 0
    positions = cumsum(cast(keep, to="i64"), axis=1) * mask - 1
    x = gather(table, ids) + gather(pos, clip(positions, min=0))
    return where(unsqueeze(keep, axis=2), x, 0.0)
}

graph scores(s: f32[B, 8, 8], ids: i64[B, 8]) -> (f32[B, 8, 8], i64[B, 8]) {
    causal = tril(expand(cast(true, to="bool"), shape=[8, 8]))
    pad = logical_not(ids == 0)
    allowed = logical_and(causal, unsqueeze(pad, axis=1))
    m = where(logical_or(allowed, isnan(s)), s, -1000000000.0)
    return m, argmax(m, axis=2)
}

graph compare(a: f32[4, 4], b: f32[4, 4]) -> f32[4, 4] {
    lt_ = cast(a < b, to="f32") + cast(a <= b, to="f32") + cast(a > b, to="f32")
    return lt_ * cast(a >= b, to="f32") - cast(a == b, to="f32") + triu(a, k=1)
}

graph activations(x: f32[2, 3, 8, 8]) -> f32[2, 3, 4, 4] {
    y = leaky_relu(x, alpha=0.1) + hard_sigmoid(x) + hard_swish(x) + softplus(x)
    p = pad(y, pads=[0, 0, 1, 1, 0, 0, 1, 1])
    return max_pool2d(p, kernel_size=3, stride=2) + avg_pool2d(y, kernel_size=2)
}

graph scatter(t: f32[10, 4], i: i64[3], u: f32[3, 4]) -> f32[10, 4] {
    return scatter_add(t, i, u)
}

graph reduce_more(x: f32[4, 6], i: i64[4, 6]) -> (f32[4], f32[4], i64[4, 6], f32[1, 24]) {
    return min(x, axis=1), prod(x, axis=1), gather_elements(i, clip(i, min=0, max=5), axis=1), flatten(squeeze(unsqueeze(x, axis=0), axis=0), axis=0)
}

graph positions(x: f32[2, 6, 4]) -> f32[2, 6, 4] {
    return x + cast(unsqueeze(range(stop=6), axis=1), to="f32") + unsqueeze(range(start=1, stop=13, step=3, dtype="f32"), axis=0)
}

graph scatter_elements(t: f32[4, 5], i: i64[4, 2], u: f32[4, 2]) -> f32[4, 5] {
    return scatter_elements_add(t, i, u, axis=1)
}

# topk's two paths: k up to 64 inserts into the k best, a larger k merge-sorts the line
graph top(s: f32[B, 80], ids: i64[B, 8]) -> (f32[B, 3], i64[B, 3], i64[2, 8], i64[B, 80]) {
    return topk(s, k=3), topk(s, k=3, indices=true), topk(ids, k=2, axis=0, largest=false), topk(s, k=80, indices=true, largest=false)
}

graph pool_grads(x: f32[1, 2, 7, 7], dm: f32[1, 2, 4, 4], da: f32[1, 2, 3, 3]) -> f32[1, 2, 7, 7] {
    gm = pool2d_grad(x, dm, mode="max", kernel_size=3, stride=2, padding=1)
    return gm + pool2d_grad(x, da, mode="avg", kernel_size=3, stride=2)
}
