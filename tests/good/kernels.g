# Hand-written kernel blocks: one line, several lines, reading outer names, one kernel feeding another.
graph fused(x: f32[B, 16], w: f32[16, 8], b: f32[8], g: f32[8], be: f32[8]) -> (f32[B, 8], f32[B, 8]) {
    h = kernel { relu(x @ w + b) }
    n = kernel {
        t = h + b
        u = t * 2
        layernorm(u, g, be)
    }
    p = kernel { sigmoid(n) * h }
    return p, kernel { -n ** 2 }
}

graph returned(x: f32[4]) -> f32[4] {
    return kernel {
        a = exp(x)
        a / sum(a)
    }
}
