# expect: 3:23: attribute axis= of softmax must be an integer
graph g(x: f32[4]) -> f32[4] {
    return softmax(x, axis="last")
}
