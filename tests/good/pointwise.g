# Every pointwise op, as a call and (where there is one) as an infix operator.
graph unary(x: f32[B, 8], p: f32[B, 8]) -> (f32[B, 8], f32[B, 8], f32[B, 8], f32[B, 8]) {
    a = neg(x) + abs(x) + relu(x) + sigmoid(x) + tanh(x)
    b = exp(x) + log(p) + sqrt(p) + rsqrt(p) + erf(x) + silu(x)
    c = gelu(x) + gelu(x, approximate="tanh") + gelu(x, approximate="none")
    d = sin(x) + cos(x) + sign(x) + ceil(x) + floor(x) + round(x) + tan(x) + atan(x) + sinh(x) + cosh(x)
    e = asinh(x) + expm1(x) + log1p(abs(x)) + asin(x * 0.5) + acos(x * 0.5) + atanh(x * 0.5) + acosh(abs(x) + 1)
    return a, b, c, d + e
}

graph binary(x: f32[4, 8], y: f32[8], s: f32) -> f32[4, 8] {
    calls = add(x, y) * sub(x, s) / div(y, 3) - pow(abs(x), 0.5)
    infix = x + y - s * x / y ** 2
    return maximum(calls, infix) + minimum(x, 0.25) + floordiv(x, 0.5) + mod(x, 0.75)
}
