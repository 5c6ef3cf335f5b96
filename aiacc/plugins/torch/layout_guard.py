"""Memory-layout guards: an optimized module whose result depends on how an input is laid out in memory
refuses a call whose input has another layout (GuardError) instead of answering wrong.

aiacc's IR holds values, not memory. `as_strided` reads memory, so its converter (import_ops/shape.as_strided)
maps each storage position it reads to the element of its input that holds it *in the example's layout*: the
Gather index it builds is right only while the tensor as_strided reads has the example's strides. Under torch
semantics that tensor's layout follows from the layouts of the model inputs it is computed from (views keep
or permute strides, elementwise ops follow their inputs' stride order), except through an op whose output is
always freshly laid out (a matmul, a Linear, an embedding, `.contiguous()`: `FRESH`). So the converter records,
for each model input reaching the as_strided through no such op, the example's strides (and its storage
offset, where as_strided is given an absolute storage_offset), in graph.meta["torch.layout_guards"]; the
exported module (exporter: a `check_layout` call on the input) and the runner modules (ort.RunnerModule:
onnxruntime, backend="aiacc") check them on every call, as torch.compile guards an input's strides. An input
the as_strided does not depend on, or depends on only through a FRESH op, is free to have any layout.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.fx import Proxy
from torch.utils import _pytree as pytree

from aiacc.errors import GuardError

META = "torch.layout_guards"  # {graph input name: {"shape", "stride", "offset" (or None), "what"}}

# ops whose output layout does not depend on their inputs' (given the shapes, which the shape guard fixes):
# a matmul's / Linear's / embedding's result is allocated contiguous, `.contiguous()` lays out as it is told
_FRESH_FUNCTIONS = {torch.matmul, torch.bmm, torch.mm, F.linear, F.embedding}
_FRESH_METHODS = {"contiguous", "matmul", "bmm", "mm"}
_FRESH_MODULES = (nn.Linear, nn.Embedding)
_FRESH_ATEN = {"contiguous", "matmul", "bmm", "mm", "addmm", "linear", "embedding", "baddbmm"}


def _fresh(gm: fx.GraphModule, n: fx.Node) -> bool:
    if n.op == "call_module":
        return isinstance(gm.get_submodule(n.target), _FRESH_MODULES)
    if n.op == "call_method":
        return n.target in _FRESH_METHODS
    if n.op == "call_function":
        if n.target in _FRESH_FUNCTIONS:
            return True
        packet = getattr(n.target, "overloadpacket", None)
        return packet is not None and getattr(n.target, "namespace", "") == "aten" and packet.__name__ in _FRESH_ATEN
    return False


def reaching_placeholders(gm: fx.GraphModule, node: Any) -> list[fx.Node]:
    """The placeholders (model inputs) whose layout the layout of `node`'s value may follow: every one reached
    walking back through its inputs, not through a FRESH op."""
    if not isinstance(node, fx.Node):
        return []
    seen, found, todo = set(), [], [node]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            found.append(n)
        elif n.op != "get_attr" and not _fresh(gm, n):
            todo.extend(n.all_input_nodes)
    return found


def record(imp: Any, x_node: Any, explicit_offset: bool, node_name: str) -> None:
    """Record in imp.graph.meta[META] the example layout of every model input `x_node` (the tensor the
    as_strided node `node_name` reads) may follow: its strides, and its storage offset where
    `explicit_offset` (an absolute storage_offset was given, so the input's own offset changes what is
    read)."""
    guards = imp.graph.meta.setdefault(META, {})
    for ph in reaching_placeholders(imp.gm, x_node):
        values = pytree.tree_leaves(imp.env.get(ph))
        examples = pytree.tree_leaves(imp.example.get(ph))
        if len(values) != len(examples):
            continue
        for v, t in zip(values, examples):
            if not isinstance(t, torch.Tensor) or not hasattr(v, "name"):
                continue
            g = guards.setdefault(v.name, {"shape": tuple(t.shape), "stride": tuple(t.stride()), "offset": None,
                                           "nodes": []})
            if explicit_offset:
                g["offset"] = t.storage_offset()
            if node_name not in g["nodes"]:  # several as_strided on the same input: one guard naming them
                g["nodes"].append(node_name)
            shown = ", ".join(g["nodes"][:3]) + (f" and {len(g['nodes']) - 3} more" if len(g["nodes"]) > 3 else "")
            g["what"] = f"as_strided (node{'s' if len(g['nodes']) > 1 else ''} {shown})"


def check_layout(t: Any, shape: tuple, stride: tuple, offset: Any, what: str, name: str = "") -> Any:
    """`t`, after checking that its strides (and storage offset, when `offset` is not None) are those of the
    example (of `shape`) that `what` (an as_strided of the model) was translated for; a contiguous example
    takes any contiguous tensor of another shape (a free batch). GuardError otherwise. Called with an fx
    Proxy (torch.load re-tracing a saved module) it records a call of itself."""
    if isinstance(t, Proxy):
        return t.tracer.create_proxy("call_function", check_layout, (t, shape, stride, offset, what, name), {},
                                     name="check_layout")
    if not isinstance(t, torch.Tensor):
        return t
    got, got_offset = tuple(t.stride()), t.storage_offset()
    if offset is None or got_offset == offset:
        if got == tuple(stride):
            return t
        if tuple(t.shape) != tuple(shape) and t.is_contiguous() and \
                torch.empty(shape, device="meta").stride() == tuple(stride):
            return t
    have = f"strides {list(got)}" + (f" and storage offset {got_offset}" if offset is not None else "")
    want = f"strides {list(stride)}" + (f" and storage offset {offset}" if offset is not None else "")
    raise GuardError(f"input {name or 'tensor'!r} of shape {list(t.shape)} has {have}; the model was optimized "
                     f"for {want}, its example's memory layout, which {what} reads as memory (torch's as_strided "
                     f"follows the layout, not the values): pass a tensor of that layout (e.g. .contiguous() "
                     f"where the example was contiguous), or optimize again with an example of this layout")


torch.fx.node.has_side_effect(check_layout)  # read by nobody, kept by fx's dead-code elimination


def check_pairs(guards: dict, pairs: list) -> None:
    """check_layout on each (tensor, graph input name) of a call that `guards` (graph.meta[META]) names: the
    runner modules' form (onnxruntime, backend="aiacc")."""
    for t, name in pairs:
        g = guards.get(name)
        if g is not None:
            check_layout(t, g["shape"], g["stride"], g["offset"], g["what"], name)
