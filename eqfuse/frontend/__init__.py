"""The front end: .g text (Lark) and ONNX files -> checked Graph IR."""
