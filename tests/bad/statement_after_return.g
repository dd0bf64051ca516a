# expect: 4:5: statement after return
graph g(x: f32[4]) -> f32[4] {
    return x
    y = x
}
