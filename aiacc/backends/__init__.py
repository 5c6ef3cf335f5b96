"""Execution backends that run an optimized IR graph outside the framework (onnxruntime; later TensorRT)."""
