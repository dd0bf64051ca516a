# expect: 2:12: unknown dtype 'f64': eqfuse supports f32
graph g(x: f64[4]) -> f32[4] {
    return x
}
# note: f64 and other dtypes are not supported yet
