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


class RunnerModule(nn.Module):
    """An nn.Module whose forward hands the graph's inputs to a runner (`run(feeds) -> [arrays]`) and packs
    the outputs as the original module returned them: called like the original (same parameter names, same
    output structure). The base of the onnxruntime module here and of backend="aiacc"'s module."""

    def __init__(self, graph: Graph, runner: Any):
        super().__init__()
        self.graph = graph
        self.runner = runner
        self.signature = graph.meta.get("torch.signature") or [("input", v.name, [v.name], None)
                                                                for v in graph.inputs]
        self.outputs = graph.meta.get("torch.outputs")
        self.layouts = graph.meta.get("torch.layout_guards") or {}  # see layout_guard
        # parameters that are one tensor graph input each, in order: a call passing exactly those, as
        # tensors, is bound without building an inspect.Signature (~0.3 ms of a 10 ms BERT call)
        entries = [e for e in self.signature if not (e[1].startswith("**") and not e[2])]  # an unused **kwargs
        plain = all(e[0] == "input" and not e[1].startswith("*") and len(e[2]) == 1 and e[2][0] is not None
                    for e in entries)
        self._direct = {e[1]: e[2][0] for e in entries} if plain else None

    def input_leaves(self, args: tuple, kwargs: dict) -> list:
        """(tensor, graph input name) for each tensor of the call that is a graph input; an input whose memory
        layout an as_strided depends on is checked to have the example's (layout_guard)."""
        pairs = self._input_leaves(args, kwargs)
        if self.layouts:
            from aiacc.plugins.torch.layout_guard import check_pairs

            check_pairs(self.layouts, pairs)
        return pairs

    def _input_leaves(self, args: tuple, kwargs: dict) -> list:
        from aiacc.plugins.torch.importer import bind_inputs

        direct = self._direct
        if direct is not None and len(args) + len(kwargs) == len(direct):
            pairs = list(zip(args, direct.values())) + [(v, direct.get(k)) for k, v in kwargs.items()]
            if len({name for _, name in pairs}) == len(direct) and None not in {name for _, name in pairs} and \
                    all(isinstance(t, torch.Tensor) for t, _ in pairs):
                return pairs
        bound = bind_inputs(self.signature, args, kwargs)
        return [(leaf, name) for entry in self.signature if entry[0] == "input"
                for leaf, name in zip(pytree.tree_leaves(bound[entry[1].lstrip("*")]), entry[2]) if name is not None]

    def pack_outputs(self, outs: list) -> Any:
        """The output tensors in the original's structure (a tensor, a tuple, a dict, a ModelOutput ...)."""
        if self.outputs is None:
            return outs[0] if len(outs) == 1 else tuple(outs)
        spec, leaves = self.outputs
        return pytree.tree_unflatten([outs[x] if kind == "value" else x for kind, x in leaves], spec)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.pack_outputs(self._run_numpy(self.input_leaves(args, kwargs)))

    def _run_numpy(self, pairs: list) -> list:
        """Inputs as numpy views of CPU tensors' memory; outputs back as tensors on the inputs' device."""
        feeds: dict[str, np.ndarray] = {}
        device = None
        for leaf, name in pairs:
            device = leaf.device
            feeds[name] = leaf.detach().cpu().numpy()
        outs = [torch.from_numpy(np.asarray(o)) for o in self.runner.run(feeds)]
        if device is not None and device.type != "cpu":
            outs = [o.to(device) for o in outs]
        return outs


class OrtModule(RunnerModule):
    """Calls like the original module (same parameter names, same output structure), on onnxruntime."""

    def __init__(self, graph: Graph, providers: list[str] | None = None, io_binding: bool | None = None):
        """io_binding: run with onnxruntime's io-binding (inputs and outputs stay on their device, DLPack
        both ways); None: when an input is not on the CPU (CUDA tensors on a CUDA session)."""
        from aiacc.backends.onnxruntime import OrtGraphRunner

        super().__init__(graph, OrtGraphRunner(graph, providers=providers))
        self.io_binding = io_binding

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        leaves = self.input_leaves(args, kwargs)
        on_device = any(leaf.device.type != "cpu" for leaf, _ in leaves)
        if self.io_binding or (self.io_binding is None and on_device and self.runner.device[0] != "cpu"):
            outs = self._run_bound(leaves)
        else:
            outs = self._run_numpy(leaves)
        return self.pack_outputs(outs)

    def _run_bound(self, leaves: list) -> list:
        """io-binding: tensors handed to onnxruntime and back through DLPack, on the session's device."""
        kind, index = self.runner.device
        device = torch.device(kind, index) if kind != "cpu" else torch.device("cpu")
        feeds = {name: leaf.detach().to(device).contiguous() for leaf, name in leaves}
        outs = [_from_ortvalue(v) for v in self.runner.run_bound(feeds)]
        home = leaves[0][0].device if leaves else device  # outputs where the inputs were
        return outs if home == device else [o.to(home) for o in outs]


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
