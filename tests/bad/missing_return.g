# expect: 2:7: graph 'g' has no return statement
graph g(x: f32[4]) -> f32[4] {
    y = x
}
# note: end the body with: return EXPR
