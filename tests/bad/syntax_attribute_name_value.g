# expect: 3:30: unexpected 'p'
graph g(x: f32[4, 2]) -> f32[2, 4] {
    return transpose(x, perm=p)
}
