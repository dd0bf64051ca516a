# expect: 7:12: unknown name 't'
graph g(x: f32[4]) -> f32[4] {
    h = kernel {
        t = x + 1
        t * 2
    }
    return t
}
