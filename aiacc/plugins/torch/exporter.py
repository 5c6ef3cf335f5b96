"""aiacc IR -> torch.fx.GraphModule.

Every IR node is lowered to torch calls (torch.nn.functional where one exists) in a fresh fx graph;
parameters and buffers are registered under the original model's qualified names, so state_dict keys
and gradients line up with the original, and the result supports .to(), torch.save and torch.jit.trace.
The forward takes the original's parameters (arguments fixed at trace time keep their value as a default)
and returns the original's output structure. Opaque nodes call the original callable (a copy of an
opaque submodule is registered under `opaque.<n>`). aiacc's fused ops lower to the fastest torch form:
in inference exports, 2-D convolutions and linears go through fastpath.py (oneDNN with weights reordered
once, channels-last activations, the activation as a oneDNN post-op; F.conv2d / F.linear wherever that
cannot run), attention (aiacc::Attention, or at level 2 the Softmax chain itself) to
F.scaled_dot_product_attention; training exports use F.conv2d / F.linear and out-of-place activations.
"""
from __future__ import annotations

import copy
import operator
from typing import Any, Callable

import numpy as np
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.utils import _pytree as pytree

from aiacc.core.ir import Graph, Node, Value
from aiacc.core.ops import REQUIRED, get_schema
from aiacc.core.passes.utils import const_value as _const_of  # initializer or Constant node data
from aiacc.core.translate import OpTable, decompose_fused
from aiacc.errors import UnsupportedError
from aiacc.plugins.torch import fastpath, linear_kernel
from aiacc.plugins.torch.opaque import CallableModule, check_fixed, fill_template, tie_state
from aiacc.plugins.torch.source_watch import watch
from aiacc.plugins.torch import layout_guard

# qualified op ("Conv", "aiacc::FusedConv") -> lowering(builder, lnode) -> fx value(s); filled by the modules of
# aiacc.plugins.torch.export_ops (the plugin imports them; this module never does)
LOWERINGS = OpTable("torch lowerings")
# planners(graph, fusions) run after the built-in peepholes; each may claim nodes none claimed before it
FUSION_PLANNERS: list[Callable[[Graph, Any], None]] = []


def _leaves(x: Any) -> list:
    """The pytree leaves of x (used inside exported graphs to unpack nested inputs and outputs). On a proxy
    (fx re-traces a GraphModule when torch.load unpickles it) it records itself as one call."""
    if isinstance(x, fx.Proxy):
        return x.tracer.create_proxy("call_function", _leaves, (x,), {})
    return pytree.tree_leaves(x)


class OutputStructure(nn.Module):
    """The forward's return structure rebuilt from the optimized graph's flat outputs (`spec`: their pytree
    spec, a transformers ModelOutput's or an OrderedDict's)."""

    def __init__(self, spec: Any):
        super().__init__()
        self.spec = spec

    def forward(self, *flat: Any) -> Any:
        return pytree.tree_unflatten(list(flat), self.spec)


class LNode:
    """What a lowering sees of one IR node: op, attributes (schema defaults filled in), its inputs as fx
    arguments (created on first use, so a constant read as a Python number costs no buffer) and, where
    constant, as numpy arrays."""

    def __init__(self, b: "Builder", op: str, attrs: dict, values: list, outputs: list, name: str,
                 meta: dict | None = None, domain: str = "", args: list | None = None):
        self.b, self.op, self.attrs, self.values = b, op, attrs, values
        self.outputs, self.name, self.meta, self.domain = outputs, name, meta or {}, domain
        self._args = args  # given directly for nodes that exist only inside a lowering

    def attr(self, key: str, default: Any = None) -> Any:
        v = self.attrs.get(key)
        return default if v is None else v

    @property
    def n_inputs(self) -> int:
        return len(self._args) if self._args is not None else len(self.values)

    def arg(self, i: int) -> Any:
        if self._args is not None:
            return self._args[i] if i < len(self._args) else None
        return arg(self.b, self.values[i]) if i < len(self.values) else None

    @property
    def args(self) -> list:
        return [self.arg(i) for i in range(self.n_inputs)]

    def const(self, i: int) -> np.ndarray | None:
        if self._args is not None or i >= len(self.values) or self.values[i] is None:
            return None
        return _const_of(self.values[i])

    def ints(self, i: int) -> list[int] | None:
        c = self.const(i)
        return None if c is None else [int(v) for v in np.asarray(c).reshape(-1)]

    def scalar(self, i: int) -> Any:
        """A one-element constant input as a Python number (else the fx argument)."""
        c = self.const(i)
        if c is not None and c.size == 1 and c.dtype.kind in "fiub":
            return c.reshape(-1)[0].item()
        return self.arg(i)

    def shape(self, i: int):
        v = self.values[i] if self._args is None and i < len(self.values) else None
        return None if v is None else v.shape


class Builder:
    """Emits fx nodes; keeps the module tree of parameters, buffers and opaque submodules."""

    def __init__(self, graph: Graph, original: nn.Module | None):
        self.ir = graph
        self.original = original
        self.root = nn.Module()
        self.fx = fx.Graph()
        self.env: dict[int, Any] = {}
        self._attr_nodes: dict[str, fx.Node] = {}
        self._consts = 0
        self._opaque = 0
        self.inplace_ok = graph.meta.get("torch.mode", "inference") != "train"
        # inference exports lower convolutions and linears to the oneDNN fast path (fastpath.py), which
        # falls back to F.conv2d / F.linear wherever it cannot run
        self.inference = self.inplace_ok
        self.uses_fastpath = False  # set once a convolution may leave a channels-last tensor
        self.linear_kernels: list[tuple] = []  # ((rows, in, out), kernel, why) per linear (linear_kernel.py)
        self._device = None  # see device()
        self.first_input: Any = None  # the fx value of the first tensor input (device())
        self.first_state: str | None = None  # the qualified name of the first model state tensor (device())
        # data address -> the original's tensor the exported module may share (export() fills it; tensor_of)
        self.shareable: dict[int, torch.Tensor] = {}
        # deepcopy's memo for the opaque modules' copies: id(original Parameter) -> the exported one (export())
        self.copy_memo: dict[int, Any] = {}

    # -- emitting ----------------------------------------------------------------------------------
    def call(self, fn: Callable, *args: Any, **kwargs: Any) -> fx.Node:
        return self.fx.call_function(fn, args, kwargs)

    def method(self, name: str, *args: Any, **kwargs: Any) -> fx.Node:
        return self.fx.call_method(name, args, kwargs)

    def device(self) -> Any:
        """An fx value holding the device the module runs on, for factory calls (torch.arange, torch.full)
        that take no tensor: the device of the first model state tensor, else of the first tensor input,
        read when the forward runs, so the module follows .to(device). None when there is neither."""
        if self._device is None:
            if self.first_state is not None:
                self._device = self.call(getattr, self.getattr_node(self.first_state), "device")
            elif self.first_input is not None:
                self._device = self.call(getattr, self.first_input, "device")
        return self._device

    def getattr_node(self, qualname: str) -> fx.Node:
        if qualname not in self._attr_nodes:
            self._attr_nodes[qualname] = self.fx.get_attr(qualname)
        return self._attr_nodes[qualname]

    # -- state ---------------------------------------------------------------------------------------
    def register(self, qualname: str, tensor: torch.Tensor, kind: str, requires_grad: bool) -> None:
        if kind == "parameter":
            tensor = nn.Parameter(tensor, requires_grad=requires_grad)
        register_state(self.root, qualname, tensor)

    def constant(self, array: np.ndarray) -> fx.Node:
        name = f"aiacc_const{self._consts}"
        self._consts += 1
        self.root.register_buffer(name, self.tensor_of(array))
        return self.getattr_node(name)

    def tensor_of(self, array: np.ndarray) -> torch.Tensor:
        """`array` as a torch tensor: the original's own tensor where the array is exactly its memory (a state
        a pass only viewed: a linear's weight transposed, then transposed back at export), else a copy."""
        t = self.shareable.get(array.__array_interface__["data"][0]) if isinstance(array, np.ndarray) else None
        if t is not None and _same_memory(array, t):
            return t.detach()
        return _aligned(array)

    def add_opaque_module(self, module: nn.Module, copy_module: bool = True, qualname: str | None = None) -> str:
        """Register an opaque callable; under its original qualified name when that is free (so its
        parameters keep their state_dict keys), else under `opaque.<n>`."""
        # one memo for every copy: a Parameter the exported graph also reads, or two opaque calls share (a tied
        # weight), stays one tensor, so training it moves every use
        module = copy.deepcopy(module, self.copy_memo) if copy_module else module
        if qualname:
            *path, leaf = qualname.split(".")
            owner = self.root
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, nn.Module())
                owner = getattr(owner, part)
                if not isinstance(owner, nn.Module) or type(owner) is not nn.Module:
                    owner = None
                    break
            if owner is not None and not hasattr(owner, leaf):
                owner.add_module(leaf, module)
                return qualname
        if not hasattr(self.root, "opaque"):
            self.root.add_module("opaque", nn.Module())
        name = str(self._opaque)
        self._opaque += 1
        self.root.opaque.add_module(name, module)
        return f"opaque.{name}"


def register_state(root: nn.Module, qualname: str, tensor: torch.Tensor) -> None:
    """Register `tensor` (a Parameter, else a buffer) at `qualname` under `root`, making the plain submodules
    on the way."""
    *path, leaf = qualname.split(".")
    owner = root
    for part in path:
        if not hasattr(owner, part) or not isinstance(getattr(owner, part), nn.Module):
            owner.add_module(part, nn.Module())
        owner = getattr(owner, part)
    if isinstance(tensor, nn.Parameter):
        owner.register_parameter(leaf, tensor)
    else:
        owner.register_buffer(leaf, tensor)


def _sources(graph: Graph, state: dict, original_state: dict, original: nn.Module) -> dict:
    """id -> (qualified name, the original's tensor) for what the export was computed from: the model state
    the trace read and the parameters and buffers of the submodules run as opaque calls."""
    sources = {}
    for qualname, _, _ in state.values():
        t = original_state.get(qualname)
        if t is not None:
            sources.setdefault(id(t), (qualname, t))
    for node in graph:
        fn = node.meta.get("torch.callable") if node.domain == "torch" else None
        if isinstance(fn, nn.Module):
            prefix = node.meta.get("torch.target") or type(fn).__name__
            for name, t in list(fn.named_parameters()) + list(fn.named_buffers()):
                sources.setdefault(id(t), (f"{prefix}.{name}", t))
    return sources


def _aligned(array: Any) -> torch.Tensor:
    """A copy of `array` in memory torch allocated: numpy's buffers are only 16-byte aligned, and oneDNN/MKL
    GEMMs on weights that are not 64-byte aligned ran ~30% slower (a BERT-style encoder's training step: the
    same GEMMs 157 vs 125 ms per step against the original module's parameters)."""
    return torch.tensor(np.asarray(array))  # one copy, into torch's allocator (from_numpy + clone made two)


def _original_state(original: nn.Module | None) -> dict[str, torch.Tensor]:
    """The original's parameters and buffers by qualified name."""
    if original is None:
        return {}
    return dict(original.named_buffers()) | dict(original.named_parameters())


def _same_memory(array: np.ndarray, t: torch.Tensor) -> bool:
    """Whether `array` is exactly `t`'s data (the importer's zero-copy view of a model state tensor)."""
    return (t.device.type == "cpu" and t.is_contiguous() and array.flags.c_contiguous and array.size > 0
            and array.__array_interface__["data"][0] == t.data_ptr() and tuple(array.shape) == tuple(t.shape)
            and array.dtype.itemsize == t.element_size() and str(array.dtype) == str(t.dtype).replace("torch.", ""))


def _state_tensor(b: Builder, value: Value, qualname: str, original_state: dict) -> torch.Tensor:
    """The exported module's tensor for one model state value: a state no pass changed (the IR still holds the
    importer's view of the original's tensor) is the original's own storage where b.shareable allows, not a
    copy, so the weights of a large model are held once (as torch.compile's and fx's modules share them)."""
    if value.const is not None:
        return b.tensor_of(value.const)
    arrays = b.ir.meta.get("torch.state_arrays", {})
    if value.name in arrays:
        return _aligned(arrays[value.name])
    t = original_state.get(qualname)
    if t is not None:
        return t.detach().clone()
    raise UnsupportedError(f"no value for the model state %{value.name} ({qualname})")


def export(graph: Graph, original: nn.Module | None = None) -> fx.GraphModule:
    """Build the GraphModule for `graph` (see the module docstring)."""
    if not LOWERINGS:
        raise UnsupportedError("the torch lowerings are not loaded: import aiacc.plugins.torch.export_ops "
                               "(aiacc.export and the torch plugin do) before using the exporter directly")
    # a fused op without a torch lowering: lowered as the standard ops it stands for
    graph, _ = decompose_fused(graph, keep=lambda n: n.qualified_op in LOWERINGS)
    b = Builder(graph, original)
    state = graph.meta.get("torch.state", {})
    aliases = graph.meta.get("torch.state_aliases", {})
    original_state = _original_state(original)
    # a buffer is shared with the original only while no opaque call (the one thing of the exported forward
    # that may write into model state) runs: a module updating a buffer must not update the original's
    share_buffers = not any(n.domain == "torch" for n in graph)
    buffers = {k for k, _ in original.named_buffers()} if original is not None else set()
    # inference only: a training export's parameters are its own (an optimizer step must not move the original's)
    b.shareable = {t.data_ptr(): t for k, t in original_state.items() if b.inference and t.device.type == "cpu"
                   and t.numel() and (share_buffers or k not in buffers)}
    # model state: registered under its qualified names
    for vname, (qualname, kind, requires_grad) in state.items():
        if not graph.has_value(vname):
            continue
        v = graph.value(vname)
        if v.producer is not None:
            continue
        b.register(qualname, _state_tensor(b, v, qualname, original_state), kind, requires_grad)
        if kind == "parameter" and qualname in original_state:
            b.copy_memo[id(original_state[qualname])] = b.root.get_parameter(qualname)
        b.env[id(v)] = ("state", qualname)
        b.first_state = b.first_state or qualname
    # inputs
    signature = graph.meta.get("torch.signature")
    user_inputs = [v for v in graph.inputs if v.name not in state]
    if signature is None:
        signature = [("input", v.name, [v.name], None) for v in user_inputs]
    by_name = {v.name: v for v in graph.inputs}
    after_default = False
    for entry in signature:
        if entry[0] == "const":
            b.fx.placeholder(entry[1], default_value=entry[2])
            after_default = True
            continue
        _, name, names, spec = entry
        # a tensor parameter after one with a default needs a default too (valid Python); "*xs", "**kw": var args
        ph = b.fx.placeholder(name, default_value=None) if after_default and not name.startswith("*") \
            else b.fx.placeholder(name)
        if names == [name] and name in by_name:
            b.env[id(by_name[name])] = ph
            b.first_input = ph if b.first_input is None else b.first_input
            continue
        leaves = b.call(_leaves, ph)
        for i, leaf_name in enumerate(names):
            if leaf_name is not None and leaf_name in by_name:
                b.env[id(by_name[leaf_name])] = b.call(operator.getitem, leaves, i)
                b.first_input = b.env[id(by_name[leaf_name])] if b.first_input is None else b.first_input
    # inputs an as_strided reads the memory of: each call's must have the example's layout (layout_guard)
    for name, g in graph.meta.get(layout_guard.META, {}).items():
        if name in by_name and id(by_name[name]) in b.env:
            b.call(layout_guard.check_layout, b.env[id(by_name[name])], g["shape"], g["stride"], g["offset"],
                   g["what"], name)
    fusions = plan_fusions(graph, inference=b.inference)
    for node in graph:
        if id(node) in fusions.skip:
            continue
        outs = lower_node(b, node, fusions)
        for v, o in zip(node.outputs, outs):
            b.env[id(v)] = o
    # outputs, in the original structure
    out_meta = graph.meta.get("torch.outputs")
    values = [arg(b, v) for v in graph.outputs]
    if b.uses_fastpath:  # outputs in the layout the original gives (the fast path works channels-last)
        values = [b.call(fastpath.dense, x) if _maybe_4d(v) else x for v, x in zip(graph.outputs, values)]
    if out_meta is None:
        result = values[0] if len(values) == 1 else tuple(values)
    else:
        spec, leaves = out_meta
        flat = [values[x] if kind == "value" else x for kind, x in leaves]
        if _plain_spec(spec):
            result = pytree.tree_unflatten(flat, spec)
        else:
            # a returned dataclass or dict subclass (transformers' ModelOutput, OrderedDict, a DynamicCache in
            # it): fx would write it as a plain dict, so the forward rebuilds it from its tree spec, in a
            # submodule: torch.load re-traces the saved code with every submodule a leaf, where a function
            # call would run on proxies and be recorded as the plain dict again
            b.root.add_module("aiacc_output", OutputStructure(spec))
            result = b.fx.call_module("aiacc_output", tuple(flat))
    b.fx.output(result)
    b.fx.lint()
    name = "Aiacc" + "".join(ch for ch in graph.name.title() if ch.isalnum())
    gm = fx.GraphModule(b.root, b.fx, class_name=name)
    if b.linear_kernels:  # for the report (translator.optimize): which kernel each linear's shape runs
        gm.aiacc_linear_kernels = linear_kernel.summary(b.linear_kernels)
    if b.inference and b.shareable:  # shares weights with the original: guard the copies' sources (source_watch)
        watch(gm, _sources(graph, state, original_state, original), set(graph.meta.get("torch.state_multi_use", ())),
              type(original).__name__, original_state)
    # a tied weight: the one tensor under the original's other names too (the same state_dict keys; GraphModule
    # keeps only what its graph reads, so they are registered on it), so an optimizer step moves every use
    for qualname, others in aliases.items():
        kind = next((k for q, k, _ in state.values() if q == qualname), None)
        try:
            tensor = gm.get_parameter(qualname) if kind == "parameter" else gm.get_buffer(qualname)
        except AttributeError:
            continue  # not registered: no use of it is left in the graph (inference: folded into a copy)
        for alias in others:
            try:
                register_state(gm, alias, tensor)
            except KeyError:  # the name is another kind of attribute there (an opaque module's): left out
                pass
    gm.train(graph.meta.get("torch.mode") == "train")
    device = _device_of(original)
    if device is not None and device.type != "cpu":  # optimize on a CUDA model: the result runs where it does
        gm.to(device)
    return gm


def _device_of(module: nn.Module | None) -> torch.device | None:
    """The one device all of `module`'s parameters and buffers are on (None if none, or several)."""
    if not isinstance(module, nn.Module):
        return None
    devices = {t.device for t in list(module.parameters()) + list(module.buffers())}
    return devices.pop() if len(devices) == 1 else None


def _plain_spec(spec: Any) -> bool:
    """Whether a tree spec has only the containers fx writes as literals (tuple, list, dict, leaves)."""
    if spec.type not in (None, tuple, list, dict):
        return False
    return all(_plain_spec(c) for c in spec.children_specs)


def _maybe_4d(v: Value | None) -> bool:
    return v is not None and (v.shape is None or len(v.shape) == 4) and v.dtype in (None, "float32")


def arg(b: Builder, v: Value | None) -> Any:
    """The fx argument for an IR value (state and constants become get_attr nodes on first use)."""
    if v is None:
        return None
    got = b.env.get(id(v))
    if isinstance(got, tuple) and len(got) == 2 and got[0] == "state":
        node = b.getattr_node(got[1])
        b.env[id(v)] = node
        return node
    if got is not None:
        return got
    if v.const is not None:
        node = b.constant(v.const)
        b.env[id(v)] = node
        return node
    raise UnsupportedError(f"value %{v.name} has no torch counterpart (a graph input the signature lacks?)")


def lower_node(b: Builder, node: Node, fusions) -> list:
    if node.schema is None:
        return lower_opaque(b, node)
    ln = LNode(b, node.op, resolved_attrs(node), list(node.inputs), node.outputs, node.name, node.meta, node.domain)
    special = fusions.special.get(id(node))
    if special is not None:
        return special(b, ln, node)
    fn = LOWERINGS.get(node.qualified_op)
    if fn is None:
        raise UnsupportedError(f"node {node.name}: no torch lowering for {node.qualified_op}")
    out = fn(b, ln)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def resolved_attrs(node: Node) -> dict:
    """The node's attributes with schema defaults (None for required or absent ones)."""
    attrs = {k: (None if spec.default is REQUIRED else spec.default) for k, spec in node.schema.attrs.items()}
    attrs.update(node.attrs)
    return attrs


def lower_opaque(b: Builder, node: Node) -> list:
    """Call the original torch callable with the original argument structure."""
    fn = node.meta.get("torch.callable")
    if fn is None:
        raise UnsupportedError(f"node {node.name}: {node.qualified_op} is not an op aiacc knows and carries no "
                               f"torch callable, so it cannot run in torch")
    args, kwargs = fill_template(node.meta["torch.template"], [arg(b, v) for v in node.inputs],
                                 node.meta["torch.in_spec"], f"node {node.name}")
    kind = node.meta.get("torch.kind")
    if kind == "module":
        target = b.add_opaque_module(fn, qualname=node.meta.get("torch.target"))
        tie_state(b.root.get_submodule(target), node.meta.get("torch.target"), b.root)
        result = b.fx.call_module(target, tuple(args), dict(kwargs))
    elif kind == "method":
        result = b.method(fn.name, *args, **kwargs)
    else:
        target = b.add_opaque_module(CallableModule(fn), copy_module=False)
        result = b.fx.call_module(target, tuple(args), dict(kwargs))
    fixed = node.meta.get("torch.out_fixed") or ()
    if fixed:  # Python numbers its users took as constants of the trace: checked on every call
        result = b.call(check_fixed, result, tuple(fixed), f"opaque call {node.op} at node {node.name}")
    spec = node.meta["torch.out_spec"]
    positions = node.meta["torch.out_tensor_pos"]
    if spec.is_leaf() and positions == [0]:
        return [result]
    leaves_node = b.call(_leaves, result)
    return [b.call(operator.getitem, leaves_node, i) for i in positions]


# ------------------------------------------------------------------------------------------------ fusions
class Fusions:
    """Peepholes the lowering applies: MatMul(x, Transpose(W)) (+ bias) -> F.linear, Mul(x, Sigmoid(x)) ->
    F.silu. `skip` nodes are absorbed into a later node's `special` lowering."""

    def __init__(self):
        self.skip: set[int] = set()
        self.special: dict[int, Callable] = {}


def _only_user(v: Value) -> Node | None:
    users = v.users()
    if len(users) == 1 and len(v.uses) == 1 and not v.is_graph_output:
        return users[0]
    return None


def plan_fusions(graph: Graph, inference: bool = False) -> Fusions:
    f = Fusions()
    if inference:
        _plan_attention(graph, f)
    for node in graph:
        if node.domain or node.schema is None:
            continue
        if node.op == "MatMul":
            rhs = node.inputs[1]
            t = rhs.producer if rhs is not None else None
            if rhs is not None and rhs.const is not None and rhs.const.ndim == 2 and rhs.const.dtype.kind == "f" \
                    and node.inputs[0].shape is not None and len(node.inputs[0].shape) >= 2:
                w = _Transposed(rhs)  # x @ C == F.linear(x, C^T): one fused GEMM with the bias below
            else:
                w = t.inputs[0] if t is not None and t.op == "Transpose" and not t.domain else None
                if w is None or w.shape is None or len(w.shape) != 2 \
                        or list(t.attrs.get("perm") or [1, 0]) != [1, 0] or _only_user(t.output) is not node:
                    continue
                f.skip.add(id(t))
            add = _only_user(node.output)
            bias = None
            if add is not None and add.op == "Add" and not add.domain:
                other = add.inputs[1] if add.inputs[0] is node.output else add.inputs[0]
                if other is not None and other.shape is not None and len(other.shape) == 1 \
                        and other.shape[0] == w.shape[0] and other.dtype == node.output.dtype:
                    bias = other
            if bias is not None:
                f.skip.add(id(node))
                f.special[id(add)] = _linear_special(node.inputs[0], w, bias)
            else:
                f.special[id(node)] = _linear_special(node.inputs[0], w, None)
        elif node.op == "Mul":
            a, c = node.inputs
            for x, s in ((a, c), (c, a)):
                p = s.producer if s is not None else None
                if p is not None and p.op == "Sigmoid" and not p.domain and p.inputs[0] is x \
                        and _only_user(s) is node:
                    f.skip.add(id(p))
                    f.special[id(node)] = (lambda x: lambda b, ln, n: [b.call(F.silu, arg(b, x))])(x)
                    break
    for planner in FUSION_PLANNERS:  # registered by other modules (the int8 lowering: plugins/torch/int8.py)
        planner(graph, f)
    return f


def _scalar_const(v: Value | None) -> float | None:
    c = _const_of(v) if v is not None else None
    if c is None or c.size != 1 or c.dtype.kind != "f":
        return None
    return float(c.reshape(-1)[0])


def _plan_attention(graph: Graph, f: Fusions) -> None:
    """Softmax(MatMul(q, Transpose(k)) [* c | / c] [+ mask]) @ v -> F.scaled_dot_product_attention (one
    fused kernel instead of the materialized scores), for the level-2 graphs where
    attention_recognition (level 3) has not run. Every intermediate must be read only by the next step."""
    for sm in graph:
        if sm.op != "Softmax" or sm.domain:
            continue
        out = sm.output
        rank = len(out.shape) if out.shape is not None else 0
        if rank < 3 or sm.attr("axis") % rank != rank - 1 or out.dtype not in ("float32", "float64", "float16"):
            continue
        pv = _only_user(out)
        if pv is None or pv.op != "MatMul" or pv.domain or pv.inputs[0] is not out:
            continue
        absorbed, consumer, s = [sm], sm, sm.inputs[0]
        mask, scale = None, 1.0
        p = s.producer
        if p is not None and p.op == "Add" and not p.domain and _only_user(s) is consumer:
            for a, m in ((p.inputs[0], p.inputs[1]), (p.inputs[1], p.inputs[0])):
                if a.producer is not None and a.producer.op in ("Mul", "Div", "MatMul") and not a.producer.domain \
                        and m.dtype == out.dtype and a.shape is not None and a.shape == p.output.shape:
                    mask = m
                    break
            if mask is None:
                continue
            absorbed.append(p)
            consumer, s = p, a
            p = s.producer
        if p is not None and p.op in ("Mul", "Div") and not p.domain and _only_user(s) is consumer:
            pairs = [(p.inputs[0], p.inputs[1])] + ([(p.inputs[1], p.inputs[0])] if p.op == "Mul" else [])
            for a, c in pairs:
                val = _scalar_const(c)
                if val is not None and val != 0.0 and a.producer is not None and a.producer.op == "MatMul":
                    scale = val if p.op == "Mul" else 1.0 / val
                    break
            else:
                continue
            absorbed.append(p)
            consumer, s = p, a
            p = s.producer
        if p is None or p.op != "MatMul" or p.domain or _only_user(s) is not consumer:
            continue
        qk = p
        absorbed.append(qk)
        q, kt, v = qk.inputs[0], qk.inputs[1], pv.inputs[1]
        shapes = [t.shape for t in (q, kt, v)]
        if any(sh is None or len(sh) != rank for sh in shapes) or not (shapes[0][:-2] == shapes[1][:-2]
                                                                          == shapes[2][:-2]):
            continue
        t = kt.producer
        k, k_transposed = kt, True
        if t is not None and t.op == "Transpose" and not t.domain and _only_user(kt) is qk \
                and list(t.attrs.get("perm") or []) == list(range(rank - 2)) + [rank - 1, rank - 2]:
            k, k_transposed = t.inputs[0], False
            absorbed.append(t)
        if any(id(n) in f.skip or id(n) in f.special for n in absorbed + [pv]):
            continue
        f.skip.update(id(n) for n in absorbed)
        f.special[id(pv)] = _sdpa_special(q, k, k_transposed, v, mask, scale)


def _sdpa_special(q: Value, k: Value, k_transposed: bool, v: Value, mask: Value | None, scale: float):
    def lower(b, ln, node):
        kk = arg(b, k)
        if k_transposed:
            kk = b.method("transpose", kk, -1, -2)
        return [b.call(F.scaled_dot_product_attention, arg(b, q), kk, arg(b, v), attn_mask=arg(b, mask),
                       scale=scale)]
    return lower


def _product_shape(node: "LNode | None") -> tuple[int, int, int] | None:
    """(rows, in, out) of the float32 product a node lowered as a linear computes (its first input and its
    output: product_shape), None when unknown."""
    if node is None or node._args is not None or not node.outputs or not node.values:
        return None
    return product_shape(node.values[0], node.outputs[0])


def product_shape(x: Value | None, y: Value | None) -> tuple[int, int, int] | None:
    """(rows, in, out) of a float32 product of input `x` giving `y`: rows and out from y's shape, in from x's
    element count (so a transposed input counts alike); None when a shape is not static or not float32."""
    if x is None or y is None or x.shape is None or y.shape is None or not y.shape or str(x.dtype) != "float32" \
            or not all(isinstance(d, int) for d in (*x.shape, *y.shape)):
        return None
    rows = int(np.prod(y.shape[:-1], dtype=np.int64))
    if rows <= 0 or int(np.prod(x.shape, dtype=np.int64)) % rows:
        return None
    return rows, int(np.prod(x.shape, dtype=np.int64)) // rows, int(y.shape[-1])


class _Transposed:
    """A constant matrix used transposed (as F.linear's weight)."""

    def __init__(self, value: Value):
        self.value = value
        self.shape = value.shape[::-1]
        self.dtype = value.dtype


def _linear_special(x: Value, w, bias: Value | None):
    def lower(b, ln, node):
        if isinstance(w, _Transposed):
            key = ("T", id(w.value))
            if key not in b.env:
                b.env[key] = b.constant(np.ascontiguousarray(w.value.const.T))
            weight = b.env[key]
        else:
            weight = arg(b, w)
        return [linear(b, arg(b, x), weight, arg(b, bias), shape=product_shape(x, ln.outputs[0]))]
    return lower


def linear(b, x, w, bias, onednn=None, node: "LNode | None" = None, shape: tuple | None = None):
    """F.linear(x, w, bias) (w [out, in]); in an inference export fastpath.linear: one oneDNN inner product
    with the fused post-op `onednn` = (attr, scalars, algorithm), or MKL's packed sgemm where linear_kernel
    timed it faster for the product's shape ((rows, in, out) `shape`, or read from `node`, the IR node
    lowered: its first input and output), F.linear where neither can run."""
    if b.inference:
        attr, scalars, algorithm = onednn or ("none", [], None)
        shape = shape or _product_shape(node)
        if shape is not None:
            kernel, why = linear_kernel.choose(*shape, attr, list(scalars), algorithm, bias is not None)
            b.linear_kernels.append((shape, kernel, why))
            if kernel != linear_kernel.ONEDNN:
                return b.call(fastpath.linear, x, w, bias, attr, scalars, algorithm, kernel=kernel)
        return b.call(fastpath.linear, x, w, bias, attr, scalars, algorithm)
    if onednn is not None:
        raise UnsupportedError("a fused post-op needs an inference export")
    return b.call(F.linear, x, w, bias)
