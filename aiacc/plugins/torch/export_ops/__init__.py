"""The torch exporter's op table: each module registers its lowerings in
aiacc.plugins.torch.exporter.LOWERINGS (keyed by qualified op). Importing this package fills it; the
exporter never imports its tables (the plugin does, see translator.py).

  elementwise  activations, arithmetic, Where, Cast, softmax, dropout
  shape        reshapes, transposes, gather/slice/split/concat, padding, the common reductions
  nn           convolution, normalization, pooling, MatMul / Gemm (oneDNN in inference exports)
  fused        aiacc's fused ops (domain "aiacc")
  extra        the less common ops the importer emits (Resize, Tile, ArgMax/ArgMin, Range, ...)
  scatter      TopK, ScatterElements, ScatterND
  guard        aiacc::ValueGuard, the run-time check of a branch fixed on the example's value
"""
from aiacc.plugins.torch.export_ops import elementwise, extra, fused, nn, scatter, shape  # noqa: F401
from aiacc.plugins.torch.export_ops import guard  # noqa: F401,E402
from aiacc.plugins.torch import int8  # noqa: F401,E402  (QuantizeLinear/DequantizeLinear, integer kernels)

__all__ = ["elementwise", "shape", "nn", "fused", "extra", "scatter", "guard"]
