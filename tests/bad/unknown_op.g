# expect: 3:12: unknown op 'relux'
graph g(x: f32[4]) -> f32[4] {
    return relux(x)
}
# note: did you mean 'relu'?
