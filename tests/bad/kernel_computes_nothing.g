# expect: 3:12: a kernel block must compute something
graph g(x: f32[4]) -> f32[4] {
    return kernel { x }
}
