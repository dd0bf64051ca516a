# expect: 2:23: unknown dtype 'float'
graph g(x: f32[4]) -> float[4] {
    return x
}
