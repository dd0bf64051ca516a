# Expressions deeper than the printer inlines (it gives them their own lines).
graph deep(x: f32[4]) -> (f32[4], f32[4]) {
    long = x + x * 2 + x * 3 + x * 4 + x * 5 + x * 6 + x * 7 + x * 8 + x * 9 + x * 10 + x * 11 + x * 12 + x * 13 + x * 14 + x * 15 + x * 16 + x * 17 + x * 18 + x * 19 + x * 20 + x * 21 + x * 22 + x * 23 + x * 24 + x * 25 + x * 26 + x * 27 + x * 28 + x * 29 + x * 30 + x * 31 + x * 32
    nested = tanh(relu(tanh(relu(tanh(relu(tanh(relu(tanh(relu(tanh(relu(tanh(relu(tanh(relu(tanh(relu(tanh(relu(tanh(relu(tanh(relu(tanh(relu(tanh(relu(tanh(relu(tanh(relu(tanh(relu(tanh(relu(tanh(relu(tanh(relu(x * 0.5)) * 0.5)) * 0.5)) * 0.5)) * 0.5)) * 0.5)) * 0.5)) * 0.5)) * 0.5)) * 0.5)) * 0.5)) * 0.5)) * 0.5)) * 0.5)) * 0.5)) * 0.5)) * 0.5)) * 0.5)) * 0.5)) * 0.5))
    return long, nested
}
