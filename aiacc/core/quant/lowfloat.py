"""Reduced float precision in the IR: the graph in float16 with float32 at its boundary (for backends
that run float16 kernels, e.g. onnxruntime), and the report of a bf16/fp16 result."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aiacc.core.ir import Graph, TensorType

# inputs that ONNX requires in float32 whatever the data type (Resize's roi and scales)
_KEEP_F32_INPUTS = {"Resize": (1, 2)}


@dataclass
class LowFloatReport:
    """What a bf16/fp16 result is and what the guard measured."""

    precision: str
    backend: str
    cast: int = 0  # float32 constants cast (onnxruntime fp16)
    verified: str | None = None

    def __str__(self) -> str:
        return f"{self.precision} on {self.backend}" + (f": {self.verified}" if self.verified else "")


def to_float16(graph: Graph) -> Graph:
    """A copy of `graph` computing in float16: float32 constants, Constant/Cast/ConstantOfShape nodes and
    every float32 value become float16; a Cast to float16 after each float32 input and back to float32
    before each float32 output keep the interface as it was."""
    from aiacc.core.translate import decompose_fused

    g, _ = decompose_fused(graph)
    if g is graph:
        g = graph.copy()
    keep = set()
    for n in g:
        for i in _KEEP_F32_INPUTS.get(n.op if not n.domain else "", ()):
            if i < len(n.inputs) and n.inputs[i] is not None:
                keep.add(n.inputs[i].name)
    cast = 0
    for name, v in list(g.initializers.items()):
        if v.const is not None and v.const.dtype == np.float32 and name not in keep:
            nv = g.add_initializer(g.fresh_name(name + "_fp16"), v.const.astype(np.float16))
            v.replace_all_uses_with(nv)
            cast += 1
    g.remove_unused_initializers()
    boundary = set()
    for n in g.nodes:
        if n.domain:
            continue
        if n.op == "Cast" and np.dtype(n.attrs.get("to")).name == "float32":
            n.attrs["to"] = "float16"
        if n.op in ("Constant", "ConstantOfShape") and not any(v.name in keep for v in n.outputs):
            for k, a in list(n.attrs.items()):
                if isinstance(a, np.ndarray) and a.dtype == np.float32:
                    n.attrs[k] = a.astype(np.float16)
                elif k in ("value_float", "value_floats") and n.op == "Constant":
                    n.attrs.pop(k)
                    n.attrs["value"] = np.asarray(a, np.float16)
        for v in n.outputs:
            if v.dtype == "float32" and v.name not in keep:
                v.type = TensorType("float16", v.shape)
    first = g.first_node
    for v in list(g.inputs):
        if v.dtype == "float32":
            c = g.add_node("Cast", [v], {"to": "float16"}, name=f"aiacc_fp16_{v.name}", before=first)
            boundary.add(c.name)
            for user in v.users():
                if user is not c:
                    for i, x in enumerate(user.inputs):
                        if x is v:
                            user.set_input(i, c.output)
    for i, v in enumerate(list(g.outputs)):
        if v.dtype == "float16":
            c = g.add_node("Cast", [v], {"to": "float32"}, name=f"aiacc_fp32_{v.name}")
            g.outputs[i] = c.output
    g.meta["aiacc.float16_cast"] = cast
    return g
