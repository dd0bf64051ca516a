# Several graphs in one file; scalars; results given or left to inference; parameterless graph.
graph scalars(s: f32, t: f32) -> f32 {
    return s * t + 1
}

graph no_result_type(x: f32[3]) {
    return x * 2
}

graph two(x: f32[2, 3]) -> (f32[2, 3], f32[3, 2]) {
    return relu(x), transpose(x)
}

graph same_twice(x: f32[2]) -> (f32[2], f32[2]) {
    y = exp(x)
    return y, y
}

graph constant() -> f32 {
    return 2 ** 0.5 * 3
}

graph alias(x: f32[2]) -> f32[2] {
    y = x
    z = y
    return z
}

graph names_like_keywords(kernels: f32[2], returned: f32[2], graph: f32[2], true_: f32[2]) -> f32[2] {
    kernel_ = kernels + returned
    return kernel_ * graph - true_
}
