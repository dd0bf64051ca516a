# expect: 3:17: unknown name 'xx'
graph g(x: f32[4]) -> f32[4] {
    return relu(xx)
}
# note: did you mean 'x'?
