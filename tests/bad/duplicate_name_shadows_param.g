# expect: 3:5: 'x' is already defined at line 2
graph g(x: f32[4]) -> f32[4] {
    x = relu(x)
    return x
}
