# expect: 4:5: 'y' is already defined at line 3
graph g(x: f32[4]) -> f32[4] {
    y = relu(x)
    y = x
    return y
}
# note: each name is assigned once
