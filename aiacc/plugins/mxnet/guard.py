"""The shape guard of an optimized Gluon block: every dimension aiacc specialized (shape_guard.ShapeSpec).

MXNet translates a model at the example inputs' static shapes. A forward pre-hook makes a call at shapes the
block was not built for an aiacc ShapeError naming the input, the dimension and the size the block was built
for, never a wrong answer or an error from deep inside MXNet or onnxruntime. Free: dimension 0 where verify's
second-batch check found the block right at another batch size, and a dimension its check of other sizes
(Plugin._check_dims, native blocks only: onnxruntime and aiacc's runtime run the static graph) found right.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from aiacc.errors import first_line
from aiacc.plugins.shape_guard import ShapeCheck, ShapeSpec, graph_spec, other_shapes_why


class ShapeGuardHook:
    """A Gluon forward pre-hook (`hook(block, args)`) running a ShapeCheck on the block's NDArray inputs. A
    class, not a closure, so a guarded block still pickles."""

    def __init__(self, guard: ShapeCheck):
        self.guard = guard

    def __call__(self, block: Any, args: Any) -> None:
        flat = []

        def walk(x):
            if isinstance(x, (list, tuple)):
                for v in x:
                    walk(v)
            else:
                flat.append(x)
        walk(args)
        self.guard.check(flat)


def guardable(block: Any) -> bool:
    """True for an optimized inference block the guard can hook (a Gluon block with its graph)."""
    graph = getattr(block, "aiacc_graph", None)
    return hasattr(block, "register_forward_pre_hook") and graph is not None and graph.meta.get("mxnet.mode") != "train"


def guard_block(block: Any, original: Any, found: dict | None) -> ShapeSpec | None:
    """Register the shape guard on an optimized Gluon block: its ShapeSpec (None for anything else). Its inputs
    are named as the optimized graph names them, their shapes the graph's with what verify `found` free."""
    if not guardable(block):
        return None
    graph = block.aiacc_graph
    names = [v.name for v in graph.inputs]
    spec = graph_spec([v.shape for v in graph.inputs], names, found)
    # the original's class, as torch's guard names it (a Symbol, triple or file: the optimized block's)
    named = original is not None and hasattr(original, "collect_params")
    model = type(original).__name__ if named else type(block).__name__
    block.register_forward_pre_hook(ShapeGuardHook(ShapeCheck(spec, names, model, other_shapes_why("MXNet"))))
    return spec


def block_shapes(block: Any, inputs: dict) -> dict:
    """`inputs` (name -> shape) and the shapes of the block's parameters that are set, for symbol_misfit."""
    shapes = dict(inputs)
    for name, p in block.collect_params().items():
        try:
            shapes.setdefault(name, tuple(p.data().shape))
        except Exception:  # noqa: BLE001 - a parameter not initialized: MXNet infers it, or says why not
            pass
    return shapes


RESHAPES = ("Reshape", "reshape", "_np_reshape", "_npx_reshape")


def symbol_misfit(sym: Any, shapes: dict, expected: list | None = None) -> str:
    """Why `sym` cannot run on inputs and parameters of `shapes` (name -> shape), from MXNet's shape inference
    alone, or "". MXNet's Reshape does not check that its target holds as many elements as its input, and
    its kernel then reads or writes out of bounds (a segfault): a symbol whose reshape targets were fixed at
    another batch size is refused here before it runs. `expected`: the output shapes the original gave."""
    from aiacc.plugins.mxnet._import import import_mxnet

    mx = import_mxnet()
    try:
        _, outs, _ = sym.infer_shape_partial(**shapes)
    except mx.base.MXNetError as e:
        return f"MXNet cannot infer its shapes there: {first_line(e, 160)}"
    if expected is not None:
        for i, (got, want) in enumerate(zip(outs, expected)):
            if got and tuple(got) != tuple(want):
                return f"output {i} would have shape {list(got)}, the original's has {list(want)}"
    internals = sym.get_internals()
    for name in internals.list_outputs():
        node = internals[name]
        children = node.get_children() if node.attr("op_name") in RESHAPES else None
        if children is None:
            continue
        try:
            src = children.infer_shape_partial(**shapes)[1][0]
            dst = node.infer_shape_partial(**shapes)[1][0]
        except (mx.base.MXNetError, IndexError):
            continue
        if src and dst and 0 not in src and int(np.prod(src)) != int(np.prod(dst)):
            return f"its {node.name} reshapes {list(src)} to {list(dst)} (fixed at the size it was built for)"
    return ""
