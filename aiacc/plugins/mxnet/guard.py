"""The batch guard of an optimized Gluon block specialized to its example's batch size.

MXNet translates a model at the example inputs' static shapes. Where the optimized block does not compute
the original's outputs at another batch size (verify runs both at another size), a forward pre-hook makes
any other batch size an aiacc ShapeError naming the input, the dimension and the size the block was built
for, never a wrong answer or an error from deep inside MXNet or onnxruntime.
"""
from __future__ import annotations

from typing import Any

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
