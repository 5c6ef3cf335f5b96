"""backend="onnxruntime" for torch: the optimized graph runs in onnxruntime inside an nn.Module.

Inputs and outputs cross without copies on CPU (Tensor.numpy() / torch.from_numpy share memory); opaque
nodes run their original torch callable between onnxruntime segments (aiacc.backends.onnxruntime).
The module is for inference: it has no parameters to train and does not track gradients.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils import _pytree as pytree

from aiacc.core.ir import Graph


class OrtModule(nn.Module):
    """Calls like the original module (same parameter names, same output structure)."""

    def __init__(self, graph: Graph, providers: list[str] | None = None):
        super().__init__()
        from aiacc.backends.onnxruntime import OrtGraphRunner

        self.graph = graph
        self.runner = OrtGraphRunner(graph, providers=providers)
        self.signature = graph.meta.get("torch.signature") or [("input", v.name, [v.name], None)
                                                                for v in graph.inputs]
        self.outputs = graph.meta.get("torch.outputs")

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        from aiacc.plugins.torch.importer import bind_inputs

        bound = bind_inputs(self.signature, args, kwargs)
        feeds: dict[str, np.ndarray] = {}
        device = None
        for entry in self.signature:
            if entry[0] != "input":
                continue
            for leaf, name in zip(pytree.tree_leaves(bound[entry[1].lstrip("*")]), entry[2]):
                if name is not None:
                    device = leaf.device
                    feeds[name] = leaf.detach().cpu().numpy()
        outs = [torch.from_numpy(np.asarray(o)) for o in self.runner.run(feeds)]
        if device is not None and device.type != "cpu":
            outs = [o.to(device) for o in outs]
        if self.outputs is None:
            return outs[0] if len(outs) == 1 else tuple(outs)
        spec, leaves = self.outputs
        return pytree.tree_unflatten([outs[x] if kind == "value" else x for kind, x in leaves], spec)
