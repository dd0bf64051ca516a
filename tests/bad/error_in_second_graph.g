# expect: 6:12: unknown op 'sofmax'
graph ok(x: f32[4]) -> f32[4] {
    return x
}
graph bad(x: f32[4]) -> f32[4] {
    return sofmax(x)
}
# note: did you mean 'softmax'?
