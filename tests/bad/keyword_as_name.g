# expect: 2:9: unexpected 'kernel', expected ')', a name
graph g(kernel: f32[4]) -> f32[4] {
    return kernel
}
# note: 'kernel' is a keyword; it cannot be used as a name
