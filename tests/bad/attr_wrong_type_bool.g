# expect: 3:26: attribute eps= of rmsnorm must be a number
graph g(x: f32[4]) -> f32[4] {
    return rmsnorm(x, x, eps=true)
}
