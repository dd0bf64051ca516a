# expect: 3:11: unexpected 'z'
graph g(x: f32[4]) -> f32[4] {
    y = x z = x
    return x
}
