# expect: 4:9: 'x' is already defined at line 2
graph g(x: f32[4]) -> f32[4] {
    y = kernel {
        x = relu(x)
        x
    }
    return y
}
