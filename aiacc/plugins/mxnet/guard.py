"""The batch guard of an optimized Gluon block specialized to its example's batch size.

MXNet translates a model at the example inputs' static shapes. Where the optimized block does not compute
the original's outputs at another batch size (verify runs both at another size), a forward pre-hook makes
any other batch size an aiacc ShapeError naming the input, the dimension and the size the block was built
for, never a wrong answer or an error from deep inside MXNet or onnxruntime.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from aiacc.errors import first_line
from aiacc.plugins.base import BatchGuard


class BatchHook:
    """A Gluon forward pre-hook (`hook(block, args)`) running a BatchGuard on the block's NDArray inputs."""

    def __init__(self, guard: BatchGuard):
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


def guard_block(block: Any, batch: int, why: str) -> bool:
    """Register the batch guard on a Gluon block (False for anything else); its inputs are named as the
    optimized graph names them."""
    if not hasattr(block, "register_forward_pre_hook"):
        return False
    graph = getattr(block, "aiacc_graph", None)
    names = [v.name for v in graph.inputs] if graph is not None else []
    block.register_forward_pre_hook(BatchHook(BatchGuard(batch, why, names, model=type(block).__name__)))
    return True


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
