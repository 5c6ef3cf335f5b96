"""Constant folding: evaluate nodes whose inputs are all known at compile time."""
from __future__ import annotations

import numpy as np

from aiacc.core.ir import Graph, Node
from aiacc.core.ops.registry import has_side_effects
from aiacc.core.passes.manager import Pass, PassContext, register_pass
from aiacc.core.passes.utils import const_value, set_const
from aiacc.errors import AiaccError

# ops whose result is not a function of their inputs (or that a later pass wants to see)
_NEVER_FOLD = {("", "Dropout"), ("", "RandomNormal"), ("", "RandomUniform"), ("", "RandomNormalLike"),
               ("", "RandomUniformLike"), ("", "Multinomial"), ("", "Bernoulli")}

# folding must not blow a small constant up into a large one (Expand, ConstantOfShape, Tile)
MAX_GROWTH_BYTES = 1 << 20


def _foldable_inputs(node: Node, ctx: PassContext, derived: set[int]) -> list[np.ndarray | None] | None:
    arrays = []
    for v in node.inputs:
        if v is None:
            arrays.append(None)
            continue
        c = const_value(v)
        if c is None:
            return None
        # in training mode initializers are parameters: folding them would cut them out of the gradient
        if not ctx.inference and v.const is not None and id(v) not in derived:
            return None
        arrays.append(c)
    return arrays


def fold_constants(graph: Graph, ctx: PassContext) -> int:
    folded = 0
    derived: set[int] = set()  # initializers this pass made (from Constant nodes): never parameters
    for node in graph.nodes:
        if node.erased or (node.domain, node.op) in _NEVER_FOLD or has_side_effects(node):
            continue
        schema = node.schema
        if schema is None:
            continue  # opaque: its framework kernel may not be pure
        if node.op == "Shape" and node.domain == "":
            x = node.inputs[0]
            if x is None or x.type is None or not x.type.is_static:
                continue
            start, end = node.attr("start", 0), node.attr("end")
            derived.add(id(set_const(graph, node.output, np.asarray(x.shape[start:end], dtype=np.int64))))
            folded += 1
            continue
        arrays = _foldable_inputs(node, ctx, derived)
        if arrays is None:
            continue
        try:
            with np.errstate(all="ignore"):
                outs = schema.run(node, arrays)
        except AiaccError:
            continue  # e.g. a shape error: leave it for the executor to report at run time
        except Exception:  # noqa: BLE001 - a kernel that cannot run on these constants is simply not folded
            continue
        in_bytes = sum(a.nbytes for a in arrays if a is not None)
        if sum(o.nbytes for o in outs) > max(in_bytes, MAX_GROWTH_BYTES):
            continue
        for v, o in zip(list(node.outputs), outs):
            if v.type is not None and v.dtype is not None and o.dtype.name != v.dtype:
                o = o.astype(v.dtype)
            if v.uses or v.is_graph_output:
                derived.add(id(set_const(graph, v, o)))
        if not node.erased and all(not v.uses and not v.is_graph_output for v in node.outputs):
            graph.erase(node)
        folded += 1
    if folded:
        graph.remove_unused_initializers()
    return folded


@register_pass
class ConstantFolding(Pass):
    """Evaluate every node whose inputs are all constants (initializers or Constant nodes) with its
    reference kernel and replace its outputs by initializers of the same names; also fold Shape of a
    statically shaped value and turn Constant nodes into initializers.

    Assumes: registered ops are pure (random ops and Dropout are never folded; opaque nodes are left alone).
    In training mode initializers are parameters, so only nodes fed by Constant nodes and Shape are folded.
    Guarantees: the values computed are bit-identical to what the executor would compute at run time; a
    fold that would grow constants by more than 1 MiB beyond its inputs is skipped.
    """

    name = "constant_folding"
    level = 1

    def run(self, graph: Graph, ctx: PassContext) -> int:
        return fold_constants(graph, ctx)
