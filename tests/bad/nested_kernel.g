# expect: 3:26: kernel blocks cannot be nested
graph g(x: f32[4]) -> f32[4] {
    return kernel { relu(kernel { x + 1 }) }
}
