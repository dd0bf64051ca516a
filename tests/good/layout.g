graph layout(x: f32[B, 4, 6], y: f32[B, 4, 2]) -> (f32[6, 4, B], f32[B, 6, 4], f32[B, 24], f32[2, 3, B, 4], f32[B, 4, 10]) {
    t0 = transpose(x)
    t1 = transpose(x, perm=[0, 2, 1])
    r0 = reshape(x, shape=[-1, 24])
    r1 = transpose(reshape(t1, shape=[-1, 2, 3, 4]), perm=[1, 2, 0, 3])
    c = concat(x, y, slice(x, axis=2, start=-2), axis=-1)
    return t0, t1, r0, r1, c
}

graph slices(x: f32[10, 3]) -> (f32[3, 3], f32[2, 3], f32[10, 2], f32[7, 3], f32[10, 3]) {
    return slice(x, axis=0, start=2, stop=5), slice(x, axis=0, start=-3, stop=-1), slice(x, axis=1, stop=2), slice(x, axis=0, start=3, stop=100), slice(x, axis=-1)
}

graph concat_one(x: f32[2, 3]) -> f32[2, 3] {
    return concat(x, axis=1)
}
