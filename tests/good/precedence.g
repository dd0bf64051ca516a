# Python's precedence and associativity.
graph prec(a: f32[3, 3], b: f32[3, 3], c: f32[3, 3], x: f32[3, 3]) -> f32[3, 3] {
    p1 = -x ** 2
    p2 = 2 ** -x
    p3 = a - (b - c)
    p4 = a - b - c
    p5 = (a @ b) @ c
    p6 = a @ (b @ c)
    p7 = a / (b * c)
    p8 = a / b * c
    p9 = x ** 2 ** 0.5
    p10 = (x ** 2) ** 0.5
    p11 = (-x) ** 2
    p12 = -2 ** x
    p13 = (-2) ** x
    p14 = a * -b + -(a + b) - -c
    p15 = - -x
    p16 = a @ b * c + a * b @ c
    p17 = -(a @ b)
    p18 = a ** -2 * b
    return p1 + p2 + p3 + p4 + p5 + p6 + p7 + p8 + p9 + p10 + p11 + p12 + p13 + p14 + p15 + p16 + p17 + p18
}
