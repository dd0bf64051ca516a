"""One line of meaning per op of the op table, with the inputs as written in a call.

The meanings live here, not in eqfuse/ir/ops.py, so that the table stays a table; `ops.define`
copies them into `Op.doc`. eqfuse.ir.opref renders them for `eqfuse ops [NAME]` and the language
reference. An op without an entry here fails tests/test_opdocs.py. This module imports nothing
from eqfuse: ops.py imports DOCS from it.
"""

from __future__ import annotations

# name -> (the inputs as written in a call, one line of meaning)
DOCS: dict[str, tuple[str, str]] = {
    "neg": ("x", "-x"),
    "abs": ("x", "|x|"),
    "relu": ("x", "max(x, 0)"),
    "sigmoid": ("x", "1 / (1 + exp(-x))"),
    "tanh": ("x", "hyperbolic tangent"),
    "exp": ("x", "e to the power x"),
    "log": ("x", "natural logarithm"),
    "sqrt": ("x", "square root"),
    "rsqrt": ("x", "1 / sqrt(x)"),
    "erf": ("x", "the Gauss error function"),
    "silu": ("x", "x * sigmoid(x) (swish)"),
    "sin": ("x", "sine (x in radians)"),
    "cos": ("x", "cosine (x in radians)"),
    "sign": ("x", "-1, 0 or 1 as x is negative, zero or positive, in x's dtype; NaN stays NaN"),
    "ceil": ("x", "x rounded up to an integer (a float)"),
    "floor": ("x", "x rounded down to an integer (a float)"),
    "round": ("x", "x rounded to the nearest integer, halves to even (a float)"),
    "tan": ("x", "tangent (x in radians)"),
    "asin": ("x", "arcsine, in radians"),
    "acos": ("x", "arccosine, in radians"),
    "atan": ("x", "arctangent, in radians"),
    "sinh": ("x", "hyperbolic sine"),
    "cosh": ("x", "hyperbolic cosine"),
    "asinh": ("x", "inverse hyperbolic sine"),
    "acosh": ("x", "inverse hyperbolic cosine"),
    "atanh": ("x", "inverse hyperbolic tangent"),
    "expm1": ("x", "exp(x) - 1, exact near 0"),
    "log1p": ("x", "log(1 + x), exact near 0"),
    "gelu": ("x", 'x * Phi(x), Phi the normal CDF: through erf ("none") or the tanh approximation ("tanh")'),
    "add": ("a, b", "a + b, numpy broadcasting"),
    "sub": ("a, b", "a - b, numpy broadcasting"),
    "mul": ("a, b", "a * b, numpy broadcasting"),
    "div": ("a, b", "a / b, numpy broadcasting; integers truncate toward 0, an integer divided by 0 gives 0"),
    "pow": ("a, b", "a to the power b, numpy broadcasting"),
    "maximum": ("a, b", "the larger of a and b, elementwise, numpy broadcasting"),
    "minimum": ("a, b", "the smaller of a and b, elementwise, numpy broadcasting"),
    "floordiv": ("a, b", "a / b rounded down (numpy's floor_divide); an integer divided by 0 gives 0"),
    "mod": ("a, b", "a - floordiv(a, b) * b, with the sign of b (numpy's remainder); an integer mod 0 gives 0"),
    "matmul": ("a, b", "numpy.matmul: [..., M, K] @ [..., K, N] -> [..., M, N], rank >= 2, batch dims broadcast"),
    "conv2d": ("x, w[, b]", "2-D convolution (cross-correlation): x NCHW, w OIHW with I = C / group, bias b[O]; "
                            "stride and dilation an int or [h, w], padding an int, [h, w] or [top, left, bottom, right] "
                            "(uneven: TF's \"same\" padding); group splits the channels (group = C: depthwise)"),
    "conv1d": ("x, w[, b]", "1-D convolution (cross-correlation): x NCW, w OIW with I = C / group, bias b[O]; "
                            "stride, padding and dilation each an int (padding on both ends), group as conv2d's"),
    "conv_transpose2d": ("x, w[, b]", "2-D transposed convolution (conv2d's gradient with respect to its input): "
                                      "x NCHW, w [C, O / group, kH, kW], bias b[O]; output size "
                                      "(H - 1) x stride - 2 x padding + kH + output_padding"),
    "sum": ("x", "sum over `axis` (every axis when omitted); keepdims=true keeps them as size 1"),
    "mean": ("x", "mean over `axis` (every axis when omitted); keepdims=true keeps them as size 1"),
    "max": ("x", "maximum over `axis` (every axis when omitted); keepdims=true keeps them as size 1"),
    "softmax": ("x", "exp(x - max) / sum(exp(x - max)) along `axis`"),
    "layernorm": ("x, gamma, beta", "(x - mean) / sqrt(var + eps) * gamma + beta over the dims from `axis` "
                                    "to the end (gamma, beta have their shape)"),
    "rmsnorm": ("x, gamma", "x / sqrt(mean(x * x) + eps) * gamma over the last axis"),
    "batchnorm": ("x, mean, var, gamma, beta", "inference batch norm over channel axis 1: "
                                               "(x - mean) / sqrt(var + eps) * gamma + beta"),
    "transpose": ("x", "permute the axes by `perm` (omitted: reverse them)"),
    "reshape": ("x", "the same elements in a new shape; one -1 is inferred (free: a view)"),
    "slice": ("x", "x[start:stop:step] along `axis`, Python's rules for negative bounds (stop omitted: the end; step >= 1)"),
    "concat": ("x0, x1, ...", "join the inputs along `axis`; every other dimension must agree"),
    # masks, indices and the ops exporters write
    "eq": ("a, b", "a == b elementwise (bool); also written a == b"),
    "ne": ("a, b", "a != b elementwise (bool); also written a != b"),
    "lt": ("a, b", "a < b elementwise (bool); also written a < b"),
    "le": ("a, b", "a <= b elementwise (bool); also written a <= b"),
    "gt": ("a, b", "a > b elementwise (bool); also written a > b"),
    "ge": ("a, b", "a >= b elementwise (bool); also written a >= b"),
    "logical_and": ("a, b", "a and b, of bool tensors"),
    "logical_or": ("a, b", "a or b, of bool tensors"),
    "logical_not": ("a", "not a, of a bool tensor"),
    "isnan": ("x", "whether x is NaN (bool)"),
    "where": ("cond, a, b", "a where the bool cond is true, else b (numpy broadcasting)"),
    "cast": ("x", 'x converted to the dtype to= ("f32", "i64", "i32", "bool", "u8", "i8"; nonzero is true)'),
    # quantized models (onnxruntime's semantics; scale and zero point broadcast: per-channel is [C, 1, ...])
    "quantize_linear": ("x, scale, zp", "saturate(round_half_even(x / scale) + zp) in zp's dtype (u8 or i8): ONNX QuantizeLinear"),
    "dequantize_linear": ("q, scale, zp", "(q - zp) * scale in f32, q and zp of one dtype (u8, i8 or i32): ONNX DequantizeLinear"),
    "matmul_integer": ("a, b, a_zp, b_zp", "(a - a_zp) @ (b - b_zp) of u8/i8 operands, exact in i32 (a_zp scalar, b_zp scalar or per column): ONNX MatMulInteger"),
    "conv_integer": ("x, w, x_zp, w_zp", "conv2d(x - x_zp, w - w_zp) of u8/i8 operands, exact in i32, padded with x_zp, padding an int or [h, w] (x_zp scalar, w_zp scalar or per output channel): ONNX ConvInteger"),
    "dynamic_scale": ("x", "ONNX DynamicQuantizeLinear's scale of x: (hi - lo) / 255 in f32 (1 when hi == lo) over lo = min(x, 0), hi = max(x, 0)"),
    "dynamic_zero_point": ("x", "ONNX DynamicQuantizeLinear's zero point of x: saturate(round_half_even(-lo / dynamic_scale(x))), u8"),
    "dynamic_range": ("x", "[lo, hi] = [min(x, 0), max(x, 0)] in f32 (NaN passed over), shape [2]: dynamic_scale and dynamic_zero_point of it are those of x"),
    "expand": ("x", "x broadcast to shape= (numpy broadcasting of x with that shape)"),
    "clip": ("x", "x limited to [min, max] (either bound optional); NaN stays NaN"),
    "leaky_relu": ("x", "x where x >= 0, else alpha * x"),
    "hard_sigmoid": ("x", "clip(alpha * x + beta, 0, 1)"),
    "hard_swish": ("x", "x * clip(x / 6 + 1 / 2, 0, 1)"),
    "softplus": ("x", "log(1 + exp(x)), without overflow"),
    "min": ("x", "the smallest element over axis= (all axes by default)"),
    "prod": ("x", "the product of the elements over axis= (all axes by default)"),
    "gather": ("data, indices", "data's slices at the integer indices along axis= (an embedding lookup); "
                                "negative indices count from the end"),
    "scatter_add": ("x, indices, updates", "x with each slice of updates added at its index along axis= "
                                           "(repeated indices add up): the inverse of gather, its gradient"),
    "gather_elements": ("data, indices", "out[i][j] = data[i][indices[i][j]] along axis= (take_along_axis)"),
    "cumsum": ("x", "running sum along axis= (exclusive=, reverse= as in ONNX CumSum)"),
    "argmax": ("x", "the index (i64) of the largest element along axis=; the first NaN wins"),
    "topk": ("x", "the k= largest elements along axis= (largest=false: the smallest), in order, or with "
                  "indices=true their indices (i64); NaN above every number, equal values in index order"),
    "range": ("", "start, start + step, ... below stop (dtype= i64, i32 or f32): position ids"),
    "tril": ("x", "x with the elements above diagonal k= set to 0 (last two axes)"),
    "triu": ("x", "x with the elements below diagonal k= set to 0 (last two axes)"),
    "pad": ("x", "x padded with value= by pads= (every axis's begin, then every axis's end)"),
    "max_pool2d": ("x", "the largest of each kernel_size window of NCHW x (stride=, padding=)"),
    "avg_pool2d": ("x", "the mean of each kernel_size window of NCHW x (count_include_pad=)"),
    "pool2d_grad": ("x, dy", "the gradient of max_pool2d (mode=\"max\": dy to each window's first largest "
                             "element) or avg_pool2d (mode=\"avg\") with respect to x"),
    "scatter_elements_add": ("x, indices, updates", "x with each element of updates added at its index along "
                                                    "axis= (repeated indices add up): the gradient of gather_elements"),
    "softmax_grad": ("dy, y", "the gradient of y = softmax(x, axis=) with respect to x: y * (dy - sum(dy * y))"),
    "layernorm_grad": ("dy, x, gamma", "the gradient of layernorm(x, gamma, beta, axis=, eps=) with respect to x"),
    "attention_dq": ("q, k, v, dy[, mask]", "the gradient of softmax(q @ k^T * scale= + mask) @ v with respect "
                                            "to q, the probabilities recomputed (never stored)"),
    "attention_dk": ("q, k, v, dy[, mask]", "the gradient of softmax(q @ k^T * scale= + mask) @ v with respect "
                                            "to k, the probabilities recomputed"),
    "attention_dv": ("q, k, dy[, mask]", "the gradient of softmax(q @ k^T * scale= + mask) @ v with respect to v: "
                                         "softmax(...)^T @ dy, the probabilities recomputed"),
    "squeeze": ("x", "x without the size-1 axes axis= (all size-1 axes by default); a reshape"),
    "unsqueeze": ("x", "x with size-1 axes inserted at axis=; a reshape"),
    "flatten": ("x", "x as a matrix: the axes before axis= times the rest; a reshape"),
}
