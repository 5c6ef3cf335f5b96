"""backend="onnxruntime" for torch: the optimized graph runs in onnxruntime inside an nn.Module.

Inputs and outputs cross without copies on CPU (Tensor.numpy() / torch.from_numpy share memory); CUDA tensors
on a CUDA session go through io-binding with DLPack both ways, so they never leave the device; opaque
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

    def __init__(self, graph: Graph, providers: list[str] | None = None, io_binding: bool | None = None):
        """io_binding: run with onnxruntime's io-binding (inputs and outputs stay on their device, DLPack
        both ways); None: when an input is not on the CPU (CUDA tensors on a CUDA session)."""
        super().__init__()
        from aiacc.backends.onnxruntime import OrtGraphRunner

        self.graph = graph
        self.runner = OrtGraphRunner(graph, providers=providers)
        self.io_binding = io_binding
        self.signature = graph.meta.get("torch.signature") or [("input", v.name, [v.name], None)
                                                                for v in graph.inputs]
        self.outputs = graph.meta.get("torch.outputs")

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        from aiacc.plugins.torch.importer import bind_inputs

        bound = bind_inputs(self.signature, args, kwargs)
        leaves = [(leaf, name) for entry in self.signature if entry[0] == "input"
                  for leaf, name in zip(pytree.tree_leaves(bound[entry[1].lstrip("*")]), entry[2]) if name is not None]
        on_device = any(leaf.device.type != "cpu" for leaf, _ in leaves)
        if self.io_binding or (self.io_binding is None and on_device and self.runner.device[0] != "cpu"):
            outs = self._run_bound(leaves)
        else:
            outs = self._run_numpy(leaves)
        if self.outputs is None:
            return outs[0] if len(outs) == 1 else tuple(outs)
        spec, leaves = self.outputs
        return pytree.tree_unflatten([outs[x] if kind == "value" else x for kind, x in leaves], spec)

    def _run_bound(self, leaves: list) -> list:
        """io-binding: tensors handed to onnxruntime and back through DLPack, on the session's device."""
        kind, index = self.runner.device
        device = torch.device(kind, index) if kind != "cpu" else torch.device("cpu")
        feeds = {name: leaf.detach().to(device).contiguous() for leaf, name in leaves}
        outs = [_from_ortvalue(v) for v in self.runner.run_bound(feeds)]
        home = leaves[0][0].device if leaves else device  # outputs where the inputs were
        return outs if home == device else [o.to(home) for o in outs]

    def _run_numpy(self, pairs: list) -> list:
        feeds: dict[str, np.ndarray] = {}
        device = None
        for leaf, name in pairs:
            device = leaf.device
            feeds[name] = leaf.detach().cpu().numpy()
        outs = [torch.from_numpy(np.asarray(o)) for o in self.runner.run(feeds)]
        if device is not None and device.type != "cpu":
            outs = [o.to(device) for o in outs]
        return outs


def _from_ortvalue(value) -> torch.Tensor:
    """A torch tensor sharing an OrtValue's memory (DLPack); through numpy where DLPack is missing (older
    onnxruntime) or refuses the dtype."""
    c = value._get_c_value()
    try:
        if hasattr(c, "__dlpack__"):
            return torch.from_dlpack(c)
        return torch.utils.dlpack.from_dlpack(c.to_dlpack())  # onnxruntime without the protocol methods
    except (AttributeError, TypeError, RuntimeError, BufferError):
        if value.device_name().lower() != "cpu":
            raise
        return torch.from_numpy(value.numpy())
