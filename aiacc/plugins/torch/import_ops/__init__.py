"""The torch importer's op tables, by op family: each module registers its converters in the tables of
aiacc.plugins.torch.importer (FUNCTIONS, METHODS, MODULES, ATEN, LEAF_MODULES). Importing this package
fills them; the importer never imports its tables (the plugin does, see translator.py).

  common       argument checks shared by every converter
  nn           dropout, linear algebra, convolution, normalization, pooling, resampling
  shape        views, reshapes, indexing, copies and dtype conversion, padding, rearrangements
  reduce       reductions and statistics
  elementwise  arithmetic, activations, comparisons and logic, max / min
  attention    scaled dot-product attention, MultiheadAttention, Transformer encoder layers (fx leaves)
  indexing     tensor indexing, gather, cumsum, roll, torchvision's stochastic_depth
  einsum       torch.einsum on static shapes (MatMul / Transpose / Reshape / ReduceSum)
  scatter      topk, scatter / index_add / index_put (TopK, ScatterElements, ScatterND, Where)
  fft          torch.fft.fft / fft2 / fftn read through .real / .imag (DFT matrices on static shapes)
  loss         cross entropy, NLL, MSE, L1, smooth L1, Huber, BCE (functions, modules, aten ops)
  rnn          nn.LSTM / nn.GRU / nn.RNN and their cells, unrolled over the static sequence length
  aten         aten OpOverloads (torch.export programs) whose arguments differ from the torch function
  guard        the tracer's value guards (a branch on tensor data fixed on the example's value)
"""
from aiacc.plugins.torch.import_ops import (common, nn, shape, reduce, elementwise, attention,  # noqa: F401
                                             indexing, scatter, einsum, fft, rnn, loss, aten)
from aiacc.plugins.torch.import_ops import guard  # noqa: F401,E402

__all__ = ["common", "nn", "shape", "reduce", "elementwise", "attention", "indexing", "scatter", "einsum", "fft", "rnn",
           "loss", "aten", "guard"]
