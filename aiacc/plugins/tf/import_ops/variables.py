"""Variable reads and assignments of a training-mode (unfrozen) TF graph, registered in the importer's table
(`importer.handlers`).

In mode="train" the model's variables stay variables: each captured resource is an IR graph input (its
value when the step starts, `GraphImporter.variable_inputs`). A ReadVariableOp reads the variable's current
value; AssignVariableOp / AssignAddVariableOp / AssignSubVariableOp (BatchNormalization's moving statistics,
the dropout seed generator's state) set it, and the importer makes every changed variable's final value a
graph output that the exporter assigns back to the same tf.Variable. Frozen (inference) graphs have none of
these ops.
"""
from __future__ import annotations

from aiacc.core.translate import Untranslatable
from aiacc.plugins.tf.importer import Entry, GraphImporter, handlers


def _resource(imp: GraphImporter, tfop):
    if not imp.training:
        raise Untranslatable("variable ops are translated in training mode only")
    key = tfop.inputs[0].name
    if key not in imp.var_current:
        raise Untranslatable(f"resource {key} is not one of the model's variables")
    return key


@handlers.register("ReadVariableOp")
def _read(imp: GraphImporter, tfop):
    return [Entry(imp.var_current[_resource(imp, tfop)])]


@handlers.register("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")
def _assign(imp: GraphImporter, tfop):
    key = _resource(imp, tfop)
    value = imp.plain(tfop.inputs[1])
    if tfop.type != "AssignVariableOp":
        op = "Add" if tfop.type == "AssignAddVariableOp" else "Sub"
        value = imp.emit1(op, [imp.var_current[key], value], name=tfop.name)
    imp.var_current[key] = value
    return []
