# expect: 3:12: slice needs the attribute axis=
graph g(x: f32[4]) -> f32[3] {
    return slice(x, start=1)
}
