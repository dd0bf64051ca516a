# A quantized model as onnxruntime's quantizers write it: u8 activations and i8 weights, quantized
# per tensor and per channel (the scale shaped to broadcast along the channel axis), and an integer
# matmul accumulating in i32 whose result is scaled back to f32.
graph qdq(x: f32[B, 8], w: i8[8, 4], ws: f32[4], wz: i8[4], xs: f32, xz: u8) -> (f32[B, 4], u8[B, 8]) {
    q = quantize_linear(x, xs, xz)
    y = dequantize_linear(q, xs, xz) @ dequantize_linear(w, ws, wz)
    return y, q
}

graph dynamic(x: u8[B, 8], w: i8[8, 4], xz: u8, wz: i8, scale: f32) -> f32[B, 4] {
    return cast(matmul_integer(x, w, xz, wz), to="f32") * scale
}

# An integer conv as ONNX ConvInteger: exact in i32, the padding reading x's zero point, the
# weights' zero point per output channel.
graph qconv(x: u8[1, 4, 6, 6], w: i8[6, 2, 3, 3], xz: u8, wz: i8[6], scale: f32) -> f32[1, 6, 6, 6] {
    return cast(conv_integer(x, w, xz, wz, padding=1, group=2), to="f32") * scale
}

# ONNX DynamicQuantizeLinear as the importer writes it: the activation's scale and zero point from
# its own range, then the quantize step with them.
graph dynamic_quantize(x: f32[B, 8]) -> (u8[B, 8], f32, u8) {
    s = dynamic_scale(x)
    z = dynamic_zero_point(x)
    return quantize_linear(x, s, z), s, z
}

# The same as the importer writes it now: x's range read once (dynamic_range, [min(x, 0),
# max(x, 0)]), the scale and zero point of its two floats (the range of a range is itself).
graph dynamic_quantize_once(x: f32[B, 8]) -> (u8[B, 8], f32, u8) {
    r = dynamic_range(x)
    s = dynamic_scale(r)
    z = dynamic_zero_point(r)
    return quantize_linear(x, s, z), s, z
}
