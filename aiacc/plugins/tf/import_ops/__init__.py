"""One translation per TF op type (TF semantics on the left, IR/ONNX semantics on the right), registered
in the importer's table (`importer.handlers`) when this package is imported (the plugin's translator
imports it), one module per op family: elementwise, nn, shapes (and the helpers they share in common).

A handler returns one `Entry` per TF output, or raises `Untranslatable` (or returns None) for a form it
does not cover: the importer rolls back what it added and keeps the op opaque.
"""
from aiacc.plugins.tf.import_ops import elementwise, nn, shapes, variables  # noqa: F401  (each registers its handlers)
