# expect: 3:12: unknown op 'frobnicate'
graph g(x: f32[4]) -> f32[4] {
    return frobnicate(x)
}
