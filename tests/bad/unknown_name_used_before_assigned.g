# expect: 3:9: unknown name 'y'
graph g(x: f32[4]) -> f32[4] {
    z = y + x
    y = x
    return z
}
