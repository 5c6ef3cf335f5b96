"""The MXNet op converters, registered in the importer's table (`importer.converters`) when this package
is imported (the plugin's translator imports it).

Each converter takes a `Ctx` and returns the IR values of the node's outputs, or None where MXNet's
semantics need information it does not have (usually a static shape); the node then stays opaque and
round-trips. `basic`: the ops of the vision-zoo / BERT core; `extra`: the ops models use beyond it.
"""
from aiacc.plugins.mxnet.import_ops import basic, extra  # noqa: F401  (each registers its converters)
