"""torch.nn.Module -> aiacc IR.

The module is traced with torch.fx (see _fx.py), run once node by node on the example inputs (that run
gives every value's dtype and shape and turns a bad input into an error naming the first op that fails),
then converted node by node with the op tables below (FUNCTIONS, METHODS, MODULES, ATEN), which the
modules of aiacc.plugins.torch.import_ops fill (the plugin imports them; this module never does). A
converter that meets a form it does not cover raises Untranslatable: what it added is rolled back
(Graph.checkpoint/rollback) and the call, like one no converter handles, becomes an opaque node (domain
"torch", Graph.add_opaque) holding the original callable in `node.meta["torch.callable"]` and a numpy
`node.meta["kernel"]` for the reference executor.

Graph metadata the exporter reads back (keys under "torch."):
  torch.mode        "inference" or "train"
  torch.signature   the forward's parameters: ("input", name, [graph input names], tree spec) or
                    ("const", name, value) for arguments fixed at trace time
  torch.outputs     (tree spec, leaves): each leaf ("value", output index) or ("const", python value)
  torch.state       {value name: (qualified name, "parameter" | "buffer", requires_grad)}: values that are
                    the model's parameters and buffers (initializers for inference, graph inputs in train
                    mode so no pass can fold them and gradients reach them)
"""
from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.utils import _pytree as pytree

from aiacc.core.ir import Graph, TensorType, Value
from aiacc.core.translate import OpTable, Untranslatable, record_source
from aiacc.errors import AiaccError, ShapeError, UnsupportedError, describe, fallback, first_line
from aiacc.plugins.torch._fx import trace_module
from aiacc.plugins.torch.opaque import (HOLE, MethodCall, OutOfPlace, fixed_leaves, is_inplace, make_kernel,
                                       short_repr)

# The converters (filled by aiacc.plugins.torch.import_ops). A converter takes the Importer and the call's
# arguments (IR values where the argument is a tensor, Python objects otherwise) and returns the result the
# same way, or raises Untranslatable.
FUNCTIONS = OpTable("torch functions")  # a torch / torch.nn.functional / operator callable -> converter
METHODS = OpTable("torch Tensor methods")  # a Tensor method name -> converter(imp, self, *args)
MODULES = OpTable("torch modules")  # an nn.Module type -> converter(imp, module, *args)
ATEN = OpTable("torch aten ops")  # an aten op name whose arguments differ from the torch function's
# nn.Module types fx must not trace through (their converter in MODULES sees the whole call) -> why
LEAF_MODULES = OpTable("torch leaf modules")


def aten_converter(target: Any) -> Any:
    """A converter for an aten OpOverload (programs from torch.export): the ATEN entry, else the
    converter of the torch function or Tensor method of the same name, whose positional arguments aten
    mirrors. A custom op of another namespace (a library's, `torch.ops.transformers.grouped_mm_fallback`)
    is found first under "namespace::name"."""
    if isinstance(target, torch._ops.OpOverloadPacket) and getattr(target, "_qualified_op_name", "aten::") \
            .split("::")[0] != "aten":  # a library's custom op called as torch.ops.ns.name
        target = getattr(target, "default", None)
    if not isinstance(target, torch._ops.OpOverload):
        return None
    name = target.overloadpacket.__name__
    if target.namespace != "aten" and f"{target.namespace}::{name}" in ATEN:  # a library's custom op
        return ATEN[f"{target.namespace}::{name}"]
    if name in ATEN:
        return ATEN[name]
    fn = getattr(torch, name, None)
    conv = FUNCTIONS.get(fn) if fn is not None else None
    if conv is None and getattr(F, name, None) is not None:
        conv = FUNCTIONS.get(getattr(F, name))
    if conv is None and name in METHODS:
        conv = METHODS[name]
    return conv


class Dim(int):
    """A size read off a tensor (`x.size(0)`, `x.shape[1]`): an int that remembers where it came from, so
    `x.view(x.size(0), -1)` keeps the batch dimension dynamic. Arithmetic gives plain ints (specialized)."""

    def __new__(cls, value: int, source: Value | None, axis: int):
        d = super().__new__(cls, value)
        d.source, d.axis = source, axis
        return d


def torch_dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        raise UnsupportedError("bfloat16 tensors have no numpy dtype; convert the model to float32 or float16")
    return t.numpy().copy()


def state_array(t: torch.Tensor) -> np.ndarray:
    """A model parameter's or buffer's data as a read-only numpy view of its own memory (no copy: a large
    model's weights are not held twice while it is optimized); a copy where no view is possible (another
    device, a non-contiguous tensor). The IR treats constants as immutable (Graph.copy shares them), and
    read-only makes a pass that writes into one fail loudly instead of changing the model's weights."""
    d = t.detach()
    if d.device.type != "cpu" or not d.is_contiguous() or d.is_conj() or d.is_neg() or d.dtype == torch.bfloat16:
        return tensor_to_numpy(d)
    a = d.numpy()
    a.flags.writeable = False
    return a


def normalize_inputs(model: nn.Module, example_inputs: Any) -> tuple[tuple, dict]:
    """Example inputs as (args, kwargs): a tensor, a tuple/list of arguments, or a dict of keyword arguments."""
    if example_inputs is None:
        raise ShapeError(f"{type(model).__name__}: aiacc needs example inputs to trace a torch module")
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    return (example_inputs,), {}


def bind_inputs(signature: list, args: tuple, kwargs: dict) -> dict[str, Any]:
    """A call's arguments by parameter name, bound the way the exported forward binds them
    (`signature` is graph.meta["torch.signature"])."""
    P = inspect.Parameter
    params, kind, seen_default = [], P.POSITIONAL_OR_KEYWORD, False
    for entry in signature:
        name = entry[1]
        if name.startswith("**"):
            params.append(P(name[2:], P.VAR_KEYWORD))
        elif name.startswith("*"):
            params.append(P(name[1:], P.VAR_POSITIONAL))
            kind = P.KEYWORD_ONLY
        elif entry[0] == "const":
            params.append(P(name, kind, default=entry[2]))
            seen_default = True
        else:
            params.append(P(name, kind, default=None if seen_default else P.empty))
    try:
        bound = inspect.Signature(params).bind(*args, **kwargs)
    except TypeError as e:
        raise ShapeError(f"the inputs {describe_args(args, kwargs)} do not fit the signature "
                         f"({', '.join(e[1] for e in signature)}): {e}") from None
    bound.apply_defaults()
    return dict(bound.arguments)


def _same_layout_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` with its strides and storage offset: clone() lays a view with gaps out densely and drops
    the offset, while what an as_strided of the model reads (its converter, layout_guard) is the example's own
    layout. clone() where it keeps both, and for a tensor whose elements overlap (no copy can keep that)."""
    c = t.clone()
    if c.stride() == t.stride() and t.storage_offset() == 0 or t.numel() == 0 or \
            any(st == 0 and d > 1 for d, st in zip(t.shape, t.stride())):
        return c
    extent = t.storage_offset() + sum((d - 1) * st for d, st in zip(t.shape, t.stride())) + 1
    out = torch.empty(extent, dtype=t.dtype, device=t.device).as_strided(t.shape, t.stride(), t.storage_offset())
    with torch.no_grad():
        out.copy_(t)
    return out.requires_grad_(t.requires_grad) if t.is_floating_point() or t.is_complex() else out


def _has_tensor(x: Any) -> bool:
    return any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(x))


class _ExampleRun(fx.Interpreter):
    """Runs the traced graph once, keeping each node's result, and names the first node that fails.
    Placeholders take their value from `feed` (by node: fx's own positional feeding cannot fill `**kw`)."""

    def __init__(self, gm: fx.GraphModule, feed: dict[fx.Node, Any]):
        super().__init__(gm)
        self.values: dict[fx.Node, Any] = {}
        self.feed = feed

    def run_node(self, n: fx.Node) -> Any:
        if n.op == "placeholder":
            self.values[n] = self.feed[n]
            return self.feed[n]
        try:
            result = super().run_node(n)
        except ShapeError:
            raise
        except Exception as e:  # noqa: BLE001 - the framework's own error, reworded with the op and shapes
            if n.op == "placeholder":
                raise
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            raise ShapeError(f"op {describe_node(self.module, n)} fails on inputs {describe_args(args, kwargs)}: "
                             f"{first_line(e)}") from e
        self.values[n] = result
        return result


def describe_node(gm: fx.GraphModule, n: fx.Node) -> str:
    """'layer1.0.conv1 (Conv2d)' for a module call, 'add (operator.add)' for a function."""
    if n.op == "call_module":
        return f"{n.target} ({type(gm.get_submodule(n.target)).__name__})"
    if n.op == "call_method":
        return f"{n.name} (Tensor.{n.target})"
    target = getattr(n.target, "__qualname__", None) or getattr(n.target, "__name__", str(n.target))
    module = getattr(n.target, "__module__", None) or ""
    return f"{n.name} ({module + '.' if module and module != 'builtins' else ''}{target})"


def layer_of(gm: fx.GraphModule, n: fx.Node) -> str:
    """The framework layer fx node `n` came from: a module call's qualified name and class, else the call
    with the innermost module whose forward made it ('layer1.0 (BasicBlock): add (operator.add)')."""
    what = describe_node(gm, n).replace("torch._VariableFunctionsClass.", "torch.").replace("(_operator.",
                                                                                           "(operator.")
    stack = n.meta.get("nn_module_stack") or {}
    if n.op == "call_module" or not stack:
        return what
    qualname, cls = list(stack.values())[-1]
    return f"{qualname} ({getattr(cls, '__name__', None) or str(cls).rsplit('.', 1)[-1]}): {what}"


def describe_args(args: tuple, kwargs: dict) -> str:
    def fmt(x):
        if isinstance(x, torch.Tensor):
            return f"{torch_dtype_name(x.dtype)}{list(x.shape)}"
        return repr(x) if not isinstance(x, nn.Module) else type(x).__name__

    parts = [str(pytree.tree_map(fmt, a)).replace("'", "") for a in args]
    parts += [f"{k}={str(pytree.tree_map(fmt, v)).replace(chr(39), '')}" for k, v in kwargs.items()]
    return "(" + ", ".join(parts) + ")"


class Importer:
    """One translation of a module. `mode` is "inference" or "train"."""

    def __init__(self, model: nn.Module, example_inputs: Any, mode: str, frontend: str = "fx",
                 decompose: set | None = None):
        if not isinstance(model, nn.Module):
            raise UnsupportedError(f"the torch plugin translates torch.nn.Module objects, not "
                                   f"{type(model).__module__}.{type(model).__name__}")
        if mode not in ("inference", "train"):
            raise UnsupportedError(f"mode must be 'inference' or 'train', not {mode!r}")
        if not FUNCTIONS:
            raise UnsupportedError("the torch converters are not loaded: import aiacc.plugins.torch.import_ops "
                                   "(aiacc.trace and the torch plugin do) before using the importer directly")
        self.model = model
        self.mode = mode
        self.args, self.kwargs = normalize_inputs(model, example_inputs)
        self.graph = Graph(type(model).__name__)
        self.state: dict[str, tuple[str, str, bool]] = {}
        self._state_values: dict[str, Value] = {}  # qualified name (any alias of a tied tensor) -> value
        self._names: dict[int, list[str]] | None = None  # see _tensor_names
        self._const_count = 0
        self.current: fx.Node | None = None
        self.opaque_reasons: dict[str, str] = {}
        # "fx" (torch.fx symbolic tracing, _fx.py) or "export" (torch.export, export_frontend.py; `decompose`:
        # aten ops to replace by PyTorch's decompositions first)
        self.frontend, self.decompose = frontend, decompose

    # -- the driver ----------------------------------------------------------------------------------
    def run(self) -> Graph:
        sig = inspect.signature(self.model.forward)
        try:
            bound = sig.bind(*self.args, **self.kwargs)
        except TypeError as e:
            raise ShapeError(f"{type(self.model).__name__}.forward{sig} does not accept the example inputs "
                             f"{describe_args(self.args, self.kwargs)}: {e}") from None
        given = set(bound.arguments)
        bound.apply_defaults()
        self.var_kinds = {p.name: "*" if p.kind == p.VAR_POSITIONAL else "**" for p in sig.parameters.values()
                          if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        # a forward with **kwargs (transformers' models) gets only what the example call passes, by name: the
        # rest keep the forward's defaults, since decorators may add them by keyword themselves
        given = given if self.var_kinds else set(bound.arguments)
        self.param_order = list(sig.parameters)
        concrete = {k: v for k, v in bound.arguments.items()
                    if not _has_tensor(v) and k not in self.var_kinds and k in given}
        if self.frontend == "export":
            from aiacc.plugins.torch.export_frontend import capture

            gm, forced = capture(self.model, dict(bound.arguments), given, self.decompose), {}
        else:
            gm, forced = trace_module(self.model, concrete or None, tuple(LEAF_MODULES), dict(bound.arguments),
                                      given)
        self.gm = gm
        self.prefix = "model." if "" in forced else ""  # the whole model was wrapped (see _fx.trace_module)
        for name, why in forced.items():
            self.opaque_reasons[name or type(self.model).__name__] = why
            what = (f"the whole model ({type(self.model).__name__}) is kept as one opaque call, run by torch and "
                    f"not optimized" if not name else
                    f"submodule {name} ({type(self.model.get_submodule(name)).__name__}) is kept opaque, run by "
                    f"torch as it is")
            fallback(f"torch.fx:{name}", f"torch.fx cannot trace {name or type(self.model).__name__} ({why}): {what}")
        example = self._run_example(gm, bound, concrete)
        self._convert(gm, bound, concrete, example)
        g = self.graph
        g.meta["torch.mode"] = self.mode
        g.meta["torch.state"] = dict(self.state)
        # a state read by several nodes: a pass may fold one use into a copy while another shares the tensor
        g.meta["torch.state_multi_use"] = sorted(q for vname, (q, _, _) in self.state.items()
                                                 if g.has_value(vname) and len(g.value(vname).users()) > 1)
        aliases = self._state_aliases()
        if aliases:
            g.meta["torch.state_aliases"] = aliases
        g.meta["torch.opaque_reasons"] = dict(self.opaque_reasons)
        g.verify()
        return g

    def _run_example(self, gm: fx.GraphModule, bound, concrete) -> dict[fx.Node, Any]:
        """Run once to learn every value; side-effect free (buffers and the RNG are restored)."""
        buffers = {k: b.detach().clone() for k, b in self.model.named_buffers()}
        rng = torch.get_rng_state()
        names = self._placeholder_names(gm)
        # clones: an in-place op of the model on its inputs must not change the caller's example tensors
        feed = {n: concrete[names[n]] if names[n] in concrete else
                pytree.tree_map(lambda t: _same_layout_copy(t) if isinstance(t, torch.Tensor) else t,
                                bound.arguments[names[n]])
                for n in gm.graph.nodes if n.op == "placeholder"}
        runner = _ExampleRun(gm, feed)
        try:
            with torch.no_grad():
                runner.run()
        finally:
            torch.set_rng_state(rng)
            with torch.no_grad():
                for k, b in self.model.named_buffers():
                    b.copy_(buffers[k])
        return runner.values

    def _convert(self, gm: fx.GraphModule, bound, concrete, example: dict[fx.Node, Any]) -> None:
        g = self.graph
        self.example = example
        env: dict[fx.Node, Any] = {}
        self.env = env
        self.aliases: dict[fx.Node, list[fx.Node]] = {}  # fx nodes that are one tensor (in-place results)
        signature = []
        placeholder_names = self._placeholder_names(gm)
        for n in gm.graph.nodes:
            self.current = n
            if n.op == "placeholder":
                name = placeholder_names[n]
                if name in concrete:
                    env[n] = concrete[name]
                    signature.append(("const", name, concrete[name]))
                    continue
                value = bound.arguments[name]
                leaves, spec = pytree.tree_flatten(value)
                names, ir_leaves = [], []
                for i, leaf in enumerate(leaves):
                    if isinstance(leaf, torch.Tensor):
                        vname = name if len(leaves) == 1 and isinstance(value, torch.Tensor) else f"{name}.{i}"
                        v = g.add_input(vname, torch_dtype_name(leaf.dtype), tuple(leaf.shape))
                        names.append(vname)
                        ir_leaves.append(v)
                    else:
                        names.append(None)
                        ir_leaves.append(leaf)
                env[n] = pytree.tree_unflatten(ir_leaves, spec)
                signature.append(("input", self.var_kinds.get(name, "") + name, names, spec))
            elif n.op == "get_attr":
                env[n] = self._get_attr(gm, n.target)
            elif n.op == "output":
                leaves, spec = pytree.tree_flatten(_plain(fx.node.map_arg(n.args[0], lambda a: env[a])))
                # fx records a returned dict subclass (a transformers ModelOutput, an OrderedDict) as a plain
                # dict: the tracer remembered the structure the forward returned
                returned = gm.meta.get("aiacc.returned_spec")
                if returned is not None and returned.num_leaves == len(leaves) and returned != spec:
                    spec = returned
                out_leaves = []
                for leaf in leaves:
                    if isinstance(leaf, Value):
                        out_leaves.append(("value", len(g.outputs)))
                        g.add_output(leaf)
                    else:
                        out_leaves.append(("const", leaf))
                g.meta["torch.outputs"] = (spec, out_leaves)
            else:
                args = fx.node.map_arg(n.args, lambda a: env[a])
                kwargs = fx.node.map_arg(n.kwargs, lambda a: env[a])
                mark = g.checkpoint()
                env[n] = self._convert_call(gm, n, args, kwargs)
                record_source(g, mark, layer_of(gm, n))  # for the view: the layer each node came from
        # the forward's parameter order (fx moves keyword-only parameters before *args)
        order = {name: i for i, name in enumerate(self.param_order)}
        signature.sort(key=lambda e: order.get(e[1].lstrip("*"), len(order)))
        g.meta["torch.signature"] = signature
        # graph inputs: user inputs first, then (train mode) the model state
        state_inputs = [v for v in g.inputs if v.name in self.state]
        g.inputs = [v for v in g.inputs if v.name not in self.state] + state_inputs

    def _placeholder_names(self, gm: fx.GraphModule) -> dict[fx.Node, str]:
        """fx makes one placeholder per forward parameter, named after it ("*xs" for *xs; concrete ones may
        be renamed, and keyword-only ones come before *args)."""
        params = list(inspect.signature(self.model.forward).parameters)
        nodes = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if all(str(n.target).lstrip("*") in params for n in nodes) and len(nodes) == len(params):
            return {n: str(n.target).lstrip("*") for n in nodes}
        if len(nodes) == len(params):
            return dict(zip(nodes, params))
        return {n: str(n.target).lstrip("*") for n in nodes}

    def _convert_call(self, gm: fx.GraphModule, n: fx.Node, args: tuple, kwargs: dict) -> Any:
        module = gm.get_submodule(n.target) if n.op == "call_module" else None
        if n.op == "call_function" and n.target in _RANDOM:
            # a fresh draw on every call: never a constant of the trace
            self.opaque_reasons.setdefault(n.name, f"{describe_node(gm, n)}: random")
            return self.opaque(n, args, kwargs)
        if n.op != "call_module" and not _has_ir_value((args, kwargs)):
            # pure Python on sizes, tuples, constants: evaluate now
            result = n.target(*args, **kwargs) if n.op == "call_function" else \
                getattr(args[0], n.target)(*args[1:], **kwargs)
            # a tensor made from constants (torch.arange(x.size(1)), ...) is a constant of this trace
            return pytree.tree_map(lambda t: self.const(tensor_to_numpy(t)) if isinstance(t, torch.Tensor) else t,
                                   result)
        if module is not None:
            fn = MODULES.get(type(module))
            key = type(module).__name__
        elif n.op == "call_method":
            fn = METHODS.get(n.target)
            key = f"Tensor.{n.target}"
        else:
            # by the callable, else by its qualified name (libraries the plugin must not import: torchvision)
            fn = FUNCTIONS.get(n.target) or FUNCTIONS.get(_qualified_name(n.target)) or aten_converter(n.target)
            key = describe_node(gm, n)
        reason = "no converter"
        # an in-place call: later reads of the mutated tensor (the first argument) must see its result
        inplace = is_inplace(n, module, args, kwargs) and bool(args) and isinstance(args[0], Value)
        on_state = inplace and args[0].name in self.state
        if on_state:
            fn, reason = None, "changes the model's state in place"
        result = None
        if fn is not None:
            mark = self.graph.checkpoint()
            try:
                result = fn(self, module, *args, **kwargs) if module is not None else fn(self, *args, **kwargs)
                fn = "done"
            except Untranslatable as e:
                reason = str(e)
                self._rollback(mark)
            except AiaccError:
                raise
            except Exception as e:  # noqa: BLE001 - a converter's own bug or an unforeseen form: this node only
                reason = f"its converter failed: {describe(e)}"
                self._rollback(mark)
                # once per op: its other nodes fail the same way
                fallback(f"torch.converter:{type(module) if module is not None else n.target}",
                         f"{key} at {n.name} stays opaque: {reason}")
        if fn != "done":
            held = [leaf for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, IRObject)]
            if held:  # its producer checked its users; an opaque call cannot take IR parts
                raise UnsupportedError(f"{key} at {n.name}: its argument is a {type(held[0]).__name__} the IR "
                                       f"holds as parts, and the call is not translated ({reason})")
            self.opaque_reasons.setdefault(n.name if module is None else n.target, f"{key}: {reason}")
            # out of place (on a copy), so no other reader of the tensor sees the change at the wrong time;
            # the model's own state is changed in place as the original does
            result = self.opaque(n, args, kwargs, functional=inplace and not on_state and module is None)
        if inplace and isinstance(n.args[0], fx.Node) and isinstance(result, Value):
            # every fx node naming this tensor (the in-place calls' results alias their input) reads the result
            group = self.aliases.setdefault(n.args[0], [n.args[0]])
            group.append(n)
            self.aliases[n] = group
            for alias in group:
                self.env[alias] = result
        return result

    def _rollback(self, mark) -> None:
        """Undo a converter that gave up halfway: its nodes, constants and state values."""
        for v in self.graph.rollback(mark):
            if self.state.pop(v.name, None) is not None:
                # every name of the state (a tied weight's aliases too)
                for name in [k for k, sv in self._state_values.items() if sv is v]:
                    del self._state_values[name]

    # -- helpers for converters ----------------------------------------------------------------------
    @property
    def training(self) -> bool:
        return self.mode == "train"

    def module_training(self, module: nn.Module) -> bool:
        """Training semantics for this submodule: train mode and the submodule itself in train()."""
        return self.mode == "train" and module.training

    def example_of(self, n: fx.Node | None = None) -> Any:
        return self.example.get(n or self.current)

    def op(self, op: str, *inputs: Value | None, outputs: int = 1, domain: str = "", **attrs: Any):
        """Add a node named after the fx node being converted; returns its output(s)."""
        node = self.graph.add_node(op, inputs, attrs, domain=domain, name=self.current.name, outputs=outputs)
        return node.outputs[0] if outputs == 1 else tuple(node.outputs)

    def const(self, array: Any, dtype: str | None = None, name: str | None = None) -> Value:
        a = np.asarray(array, dtype=dtype)
        self._const_count += 1
        return self.graph.add_initializer(name or f"{self.current.name}_c", a)

    def ints(self, values) -> Value:
        return self.const(np.asarray(list(values), dtype=np.int64))

    def scalar_like(self, value: Any, like: Value) -> Value:
        """A Python number as a 0-d constant of `like`'s dtype (torch's scalar type promotion)."""
        dtype = like.dtype or "float32"
        if isinstance(value, bool) or (isinstance(value, float) and np.dtype(dtype).kind in "iub"):
            raise Untranslatable(f"scalar {value!r} with a {dtype} tensor changes the dtype")
        return self.const(np.asarray(value, dtype=dtype))

    def state_value(self, module: nn.Module | None, qualname: str, tensor: torch.Tensor | None = None) -> Value:
        """The IR value of a parameter or buffer, by qualified name (created once). A tensor the model holds
        under several names (tied weights: BERT's MLM decoder weight is its word embedding) is one value under
        the name `named_parameters()` gives it, so both uses read one graph input in train mode (their
        gradients add up in it) and the exported module holds one parameter, as the original does."""
        if qualname in self._state_values:
            return self._state_values[qualname]
        if tensor is None:
            tensor = self.gm.get_parameter(qualname) if _is_param(self.gm, qualname) else self.gm.get_buffer(qualname)
        alias = qualname
        qualname = self._tensor_names().get(id(tensor), [qualname])[0]
        if qualname in self._state_values:
            self._state_values[alias] = self._state_values[qualname]
            return self._state_values[qualname]
        kind = "parameter" if isinstance(tensor, nn.Parameter) else "buffer"
        requires_grad = bool(tensor.requires_grad)
        if self.mode == "train":
            v = self.graph.add_input(self.graph.fresh_name(qualname), torch_dtype_name(tensor.dtype), tuple(tensor.shape))
        else:
            v = self.graph.add_initializer(qualname, state_array(tensor))
        self.state[v.name] = (qualname, kind, requires_grad)
        self._state_values[qualname] = v
        self._state_values[alias] = v
        return v

    def _state_aliases(self) -> dict[str, list[str]]:
        """{state qualname: the model's other names for the same tensor} for tied weights, so the exported
        module registers that one tensor under every name the original has (the same state_dict keys; an
        optimizer step on it moves every use)."""
        by_name = {ns[0]: ns[1:] for ns in self._tensor_names().values() if len(ns) > 1}
        return {q: by_name[q] for q, _, _ in self.state.values() if q in by_name}

    def _tensor_names(self) -> dict[int, list[str]]:
        """id(tensor) -> every name the model holds it under, in named_parameters() / named_buffers() order, so
        the first is the one their deduplicated forms give it (built once; the model's tensors stay alive while
        it is traced, so the ids are stable)."""
        if self._names is None:
            self._names = {}
            for name, t in list(self.model.named_parameters(remove_duplicate=False)) + \
                    list(self.model.named_buffers(remove_duplicate=False)):
                self._names.setdefault(id(t), []).append(name)
        return self._names

    def param(self, module: nn.Module, attr: str) -> Value | None:
        """The value of `module.<attr>` (None when the attribute is None)."""
        t = getattr(module, attr)
        if t is None:
            return None
        prefix = self.qualname_of(module)
        return self.state_value(module, f"{prefix}.{attr}" if prefix else attr, t)

    def qualname_of(self, module: nn.Module) -> str:
        for name, m in self.gm.named_modules():
            if m is module:
                return name[len(self.prefix):] if self.prefix and name.startswith(self.prefix) else name
        raise Untranslatable("module is not part of the model")

    def _get_attr(self, gm: fx.GraphModule, target: str) -> Any:
        obj = gm
        for part in target.split("."):
            obj = getattr(obj, part)
        if isinstance(obj, torch.Tensor):
            if obj.dtype == torch.bfloat16 and self._only_cast_from_bfloat16(self.current, gm, target):
                # the IR has no bfloat16; a buffer read only through casts to another float dtype
                # (RecurrentGemma's `self.normalizer.type(x.dtype)`) is exactly its float32 value there
                return self.graph.add_initializer(target.replace(".", "_"), obj.detach().cpu().float().numpy())
            is_state = target in dict(gm.named_parameters()) or target in dict(gm.named_buffers())
            if is_state:
                return self.state_value(None, target, obj)
            return self.graph.add_initializer(target.replace(".", "_"), tensor_to_numpy(obj))
        return obj

    _CASTS = {"to", "type", "float", "double", "half", "type_as"}

    def _only_cast_from_bfloat16(self, node: fx.Node, gm: fx.GraphModule, target: str) -> bool:
        """Whether the bfloat16 tensor of get_attr `node` is not a trained parameter and every use of it is
        a cast whose result (in the example run) is float16/32/64, so float32 stands for it exactly."""
        if node is None or node.op != "get_attr" or not node.users or \
                (self.training and target in dict(gm.named_parameters())):
            return False
        for user in node.users:
            # a function by its name; torch.export's aten overloads (aten.to.dtype) by their packet's
            name = getattr(getattr(user.target, "overloadpacket", user.target), "__name__", "")
            if user.op == "call_function" and name == "_assert_tensor_metadata":
                continue  # torch.export's check of the example's metadata, which the importer drops
            is_cast = (user.op == "call_method" and user.target in self._CASTS and user.args[0] is node) or \
                (user.op == "call_function" and name in ("_to_copy", "to") and user.args and user.args[0] is node)
            out = self.example.get(user)
            if not is_cast or not isinstance(out, torch.Tensor) or \
                    out.dtype not in (torch.float16, torch.float32, torch.float64):
                return False
        return True

    def shape_of(self, v: Value) -> tuple:
        if v.shape is None or not all(isinstance(d, int) for d in v.shape):
            raise Untranslatable(f"%{v.name} has no static shape")
        return tuple(v.shape)

    # -- opaque nodes --------------------------------------------------------------------------------
    def opaque(self, n: fx.Node, args: tuple, kwargs: dict, functional: bool = False) -> Any:
        """One opaque node for fx node `n`: tensor arguments become its inputs; the callable, the argument
        template and the output structure go into node.meta. `functional`: an in-place call made on a copy
        of its first argument, returning the copy (see opaque.OutOfPlace)."""
        leaves, in_spec = pytree.tree_flatten((args, kwargs))
        inputs = [leaf for leaf in leaves if isinstance(leaf, Value)]
        template = [HOLE if isinstance(leaf, Value) else leaf for leaf in leaves]
        example = self.example.get(n)
        if functional:
            example = self.example.get(n.args[0])  # the mutated tensor (its shape and dtype)
        out_leaves, out_spec = pytree.tree_flatten(example)
        tensor_pos = [i for i, leaf in enumerate(out_leaves) if isinstance(leaf, torch.Tensor)]
        types = [TensorType(torch_dtype_name(out_leaves[i].dtype), tuple(out_leaves[i].shape)) for i in tensor_pos]
        if functional:
            inner = MethodCall(n.target) if n.op == "call_method" else n.target
            label = f"Tensor.{n.target}" if n.op == "call_method" else \
                getattr(n.target, "__name__", None) or getattr(n.target, "__qualname__", "call")
            fn, kind = OutOfPlace(inner), "function"
        elif n.op == "call_module":
            fn, kind, label = self.gm.get_submodule(n.target), "module", type(self.gm.get_submodule(n.target)).__name__
        elif n.op == "call_method":
            fn, kind, label = MethodCall(n.target), "method", f"Tensor.{n.target}"
        else:
            fn, kind = n.target, "function"
            label = getattr(n.target, "__name__", None) or getattr(n.target, "__qualname__", "call")
            self_obj = getattr(n.target, "__self__", None)
            if isinstance(self_obj, type):  # a bound classmethod such as MyFunction.apply
                label = f"{self_obj.__name__}.{n.target.__name__}"
        attrs = {"target": str(n.target) if n.op != "call_function" else label}
        fixed = fixed_leaves(out_leaves, tensor_pos, bool(inputs))
        what = f"opaque call {label} at node {n.name}"
        node = self.graph.add_opaque(label.replace(" ", ""), inputs, domain="torch", name=n.name,
                                     outputs=len(types), output_types=types, attrs=attrs, meta={
            "torch.callable": fn, "torch.kind": kind, "torch.target": n.target if n.op != "call_function" else None,
            "torch.in_spec": in_spec, "torch.template": template,
            "torch.out_spec": out_spec, "torch.out_tensor_pos": tensor_pos,
            "torch.out_consts": [None if i in tensor_pos else leaf for i, leaf in enumerate(out_leaves)],
            "torch.out_fixed": fixed,
            "kernel": make_kernel(fn, in_spec, template, tensor_pos, fixed, what),
        })
        if fixed:  # its check runs on every call, also where no tensor of its result is used
            node.meta["side_effects"] = True
            fallback(f"torch.opaque_values:{n.name}",
                     f"{what} returns Python values {short_repr([v for _, v in fixed], 80)} that the graph "
                     f"after it uses as constants: it is "
                     f"specialised on the example's values, and a call where they differ raises GuardError")
        results = list(node.meta["torch.out_consts"])
        for k, i in enumerate(tensor_pos):
            results[i] = node.outputs[k]
        return pytree.tree_unflatten(results, out_spec)


_RANDOM = {torch.rand, torch.randn, torch.randint, torch.randperm, torch.rand_like, torch.randn_like,
           torch.randint_like, torch.bernoulli, torch.normal, torch.multinomial, torch.poisson}


def _plain(x: Any) -> Any:
    """fx's immutable containers as the plain dict / list / tuple the model returned."""
    from torch.fx.immutable_collections import immutable_dict, immutable_list

    if isinstance(x, immutable_dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, immutable_list):
        return [_plain(v) for v in x]
    if type(x) is tuple:
        return tuple(_plain(v) for v in x)
    return x


def has_converter(fn: Any) -> bool:
    """Whether a function (by itself or by its qualified name) has a converter in FUNCTIONS."""
    return callable(fn) and (FUNCTIONS.get(fn) is not None or FUNCTIONS.get(_qualified_name(fn)) is not None)


def loaded_named_converters() -> list[Any]:
    """The functions FUNCTIONS knows by qualified name ('torchvision.ops.stochastic_depth.stochastic_depth')
    whose module is already imported (a library the plugin must not import itself is looked up only)."""
    import sys

    found = []
    for key in FUNCTIONS.keys():
        if not isinstance(key, str) or "." not in key:
            continue
        parts = key.split(".")
        for cut in range(len(parts) - 1, 0, -1):  # the longest imported module prefix, then attributes
            obj = sys.modules.get(".".join(parts[:cut]))
            if obj is None:
                continue
            for attr in parts[cut:]:
                obj = getattr(obj, attr, None)
            if callable(obj) and _qualified_name(obj) == key:
                found.append(obj)
            break
    return found


def _qualified_name(fn: Any) -> str | None:
    """'module.qualname' of a function ('torchvision.ops.stochastic_depth.stochastic_depth')."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    return f"{module}.{name}" if isinstance(module, str) and isinstance(name, str) else None


class IRObject:
    """Base of the Python objects a converter may return that stand for a tensor as IR values of their own
    (import_ops.fft.Complex: a complex tensor as its real and imaginary parts): a call taking one is never
    evaluated at trace time, and its converter must translate it (it cannot be an opaque node's argument)."""


def _has_ir_value(x: Any) -> bool:
    return any(isinstance(leaf, (Value, IRObject)) for leaf in pytree.tree_leaves(x))


def _is_param(gm: nn.Module, qualname: str) -> bool:
    try:
        gm.get_parameter(qualname)
        return True
    except AttributeError:
        return False


def trace(model: nn.Module, example_inputs: Any, mode: str | None = None, frontend: str = "auto") -> Graph:
    """Translate `model` into an IR graph. mode: "inference", "train", or None to follow model.training;
    frontend: "auto", "export" (torch.export) or "fx" (torch.fx), chosen per model as
    export_frontend.translate says."""
    if isinstance(model, nn.Module) and mode is None:
        mode = "train" if model.training else "inference"
    if not isinstance(model, nn.Module):
        return Importer(model, example_inputs, mode or "inference").run()  # its error names the type
    from aiacc.plugins.torch.export_frontend import translate

    return translate(model, example_inputs, mode or "inference", frontend)
