"""The torch exporter's op table: each module registers its lowerings in
aiacc.plugins.torch.exporter.LOWERINGS (keyed by qualified op). Importing this package fills it; the
exporter never imports its tables (the plugin does, see translator.py).

  basic   the ops of CNNs and transformers and aiacc's fused ops (the hot path)
  extra   the less common ops the importer emits (Resize, Tile, ArgMax/ArgMin, Range, ...)
"""
from aiacc.plugins.torch.export_ops import basic, extra  # noqa: F401

__all__ = ["basic", "extra"]
