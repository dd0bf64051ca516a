# expect: 2:17: unexpected '.5', expected ',', ']'
graph g(x: f32[4.5]) -> f32[4] {
    return x
}
