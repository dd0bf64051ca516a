# expect: 3:12: this kernel block cannot be lowered
graph g(x: f32[4, 4]) -> f32[4, 4] {
    return kernel { softmax(x @ x) @ x @ x }
}
# note: supported kernel shapes: pointwise
