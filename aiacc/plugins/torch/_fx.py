"""torch.fx tracing that never fails: what fx cannot trace becomes an opaque call.

What fx does not handle the way aiacc needs, and what this tracer does about it:

- A submodule whose forward has Python control flow on tensor values makes `symbolic_trace` raise. The
  tracer rolls back the nodes that submodule added and records it as a leaf call instead, so it becomes
  one opaque node holding the module (the finest granularity that traces).
- A custom `torch.autograd.Function` is inlined by fx (its forward is traced, its backward lost). While
  tracing, `Function.apply` is patched so that a call with proxy arguments is recorded as one call of the
  original `apply`, keeping the custom backward.
- nn.MultiheadAttention / nn.TransformerEncoderLayer / nn.TransformerEncoder are leaves (aiacc decomposes
  them itself); their forward's fused inference fast path is never taken.
- A parametrized module (torch.nn.utils.parametrize: weight_norm, spectral_norm, orthogonal, ...) is a
  class fx would keep whole; the tracer goes through it and its parametrizations, so the weight is
  computed from the original parameters in the graph (and gets gradients in train mode).
- A module the forward creates while it runs (`CrossEntropyLoss()` in transformers' heads) has no name in
  the model; fx raises NameError for it. The tracer traces its forward inline instead.
- GraphModule registers a plain tensor attribute of the model, or a tensor the forward makes
  (`_tensor_constant0`), as a buffer of its own; they are made plain attributes again (constants, not state).
- transformers' ModelOutput.to_tuple drops None fields; a proxy field that is None on the example (read off
  an opaque call's output) is dropped too, so return_dict=False tuples keep the original's length.
- A Python branch on tensor data (`if x.sum() > 0:`, `if mask.any().item():`, LongformerModel's global
  attention switch) makes fx raise. The tracer answers it with the example's value, so the trace holds the
  branch the example took, and records a value guard (`value_guard`, a call the IR keeps as
  aiacc::ValueGuard) that raises GuardError on a call whose condition differs: specialised, never wrong.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import linecache
import operator
import os
import sys
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.fx.proxy import Proxy
from torch.utils import _pytree as pytree

from aiacc.errors import GuardError, describe, fallback
from aiacc.plugins.torch.carried import CarriedObject, split
from aiacc.plugins.torch.dispatch_fix import keep_dropped_arguments

# containers fx should trace through even though they live in torch.nn
_TRACE_THROUGH = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def _plain_constant(v: Any) -> bool:
    """None, a bool, number or string: a value the trace fixes (ArgumentGuard refuses a call that changes it)."""
    return v is None or isinstance(v, (bool, int, float, str))


class AiaccTracer(fx.Tracer):
    """An fx Tracer with aiacc's leaf policy and the per-submodule fallback described above."""

    def __init__(self, leaf_types: tuple[type, ...] = ()):
        super().__init__()
        self.leaf_types = leaf_types
        self.forced_leaves: dict[str, str] = {}  # qualified name -> why it could not be traced
        # buffers as get_attr nodes: `self.mask[:, :, :T, :T]` with a traced T cannot index a real tensor
        self.proxy_buffer_attributes = True
        self.example: dict[str, Any] | None = None  # the example call's arguments by parameter name
        self._env: dict[fx.Node, Any] = {}  # example values of the nodes traced so far (filled on demand)
        self._saved_state: tuple | None = None
        self.given: set[str] | None = None  # the forward parameters the example call passes (None: all)
        self.returned_spec: pytree.TreeSpec | None = None

    # -- control flow on sizes, dtypes and ranks ------------------------------------------------------
    def to_bool(self, obj: Proxy) -> bool:
        """`if x.dim() == 3:`, `if mask.dtype == torch.bool:`, `assert H % w == 0`: a condition computed
        only from tensors' metadata (shape, dtype, rank, device) is fixed on the example inputs, like every
        shape of the trace, and answered from them. A condition on tensor data (`if x.sum() > 0:`) is
        answered from the example too, and guarded: a value_guard call in the graph raises on a call
        where it differs. Without an example value it stays fx's TraceError."""
        try:
            value = self.example_value(obj.node)
            answer = bool(value)  # a tensor of several elements: torch's own "ambiguous" error, fx's below
        except Exception:  # noqa: BLE001 - no example value: fx's own error
            return super().to_bool(obj)
        if not static_node(obj.node):
            self._guard(obj, answer)
        return answer

    def _guard(self, cond: Proxy, expected: bool) -> None:
        """Record value_guard(cond, expected, what) once per condition node (a flag read twice, as
        Longformer's layers all read `is_global_attn`, is checked once)."""
        if any(u.op == "call_function" and u.target is value_guard and u.args[1] == expected
               for u in cond.node.users):
            return
        value_guard(cond, expected, _source_of(cond.node))

    # -- iteration over proxies ----------------------------------------------------------------------
    def iter(self, obj: Proxy):
        """`a, b = x.chunk(2)`, `*parts` of a split, `B, C, H, W = x.shape`, `for t in xs`: fx cannot know
        how many elements a proxy has. The graph traced so far is run on the example inputs to find out;
        the elements are then traced as getitem nodes (an arity fixed by the example, like every shape)."""
        try:
            value = self.example_value(obj.node)
            n = len(value)
        except Exception:  # noqa: BLE001 - no example value: fx's own error
            return super().iter(obj)
        return iter([obj[i] for i in range(n)])

    def example_value(self, node: fx.Node) -> Any:
        """`node`'s value on the example inputs (the nodes before it are run once and remembered)."""
        if self.example is None:
            raise KeyError("no example inputs")
        if self._saved_state is None:  # running the model may touch buffers (BatchNorm) and the RNG
            self._saved_state = ({k: b.detach().clone() for k, b in self.root.named_buffers()},
                                 torch.get_rng_state())
        from torch.fx._symbolic_trace import _maybe_revert_all_patches

        runner = fx.Interpreter(self.root, graph=self.graph)
        runner.env = self._env
        with _maybe_revert_all_patches(), torch.no_grad():
            for n in self.graph.nodes:
                if n not in self._env:
                    self._env[n] = self._placeholder_value(n) if n.op == "placeholder" else runner.run_node(n)
                if n is node:
                    return self._env[n]
        raise KeyError(f"{node} is not in the graph")

    def _placeholder_value(self, n: fx.Node) -> Any:
        name = str(n.target).lstrip("*")
        if name not in self.example:
            name = name.rsplit("_", 1)[0]  # a concrete argument's placeholder, "<name>_<k>"
        value = self.example[name]
        return torch.utils._pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, value)

    def release(self) -> None:
        """Drop what the trace holds of the model and the example call (the tracer is not used after its
        trace): whatever might still refer to the tracer then keeps neither alive."""
        self.example = None
        self._saved_state = None
        self._env.clear()
        self.root = None
        self.graph = None
        self.tensor_attrs = {}

    def restore_state(self) -> None:
        if self._saved_state is not None:
            buffers, rng = self._saved_state
            with torch.no_grad():
                for k, b in self.root.named_buffers():
                    if k in buffers:
                        b.copy_(buffers[k])
            torch.set_rng_state(rng)
            self._saved_state = None

    def create_args_for_root(self, root_fn, is_module, concrete_args=None):
        """fx's, with the two changes below (_create_args_for_root), and the forward's own return structure
        remembered (`returned_spec`): fx records a returned dict subclass (a transformers ModelOutput, an
        OrderedDict) as a plain dict."""
        fn, args = self._create_args_for_root(root_fn, is_module, concrete_args)

        def call(*a, **k):
            out = fn(*a, **k)
            leaves, spec = pytree.tree_flatten(out)
            # a returned object holding traced tensors (a transformers DynamicCache of key/value states):
            # fx records its tensors as a tuple, the spec rebuilds the object around them (CarriedObject)
            carried = [self._carried(x) for x in leaves]
            if any(c is not None for c in carried):
                out = pytree.tree_unflatten([tuple(c.leaves) if c is not None else x
                                             for c, x in zip(carried, leaves)], spec)
                leaves, spec = pytree.tree_flatten(pytree.tree_unflatten(
                    [c if c is not None else x for c, x in zip(carried, leaves)], spec))
            # a container pytree does not know (an unregistered dict subclass) is one leaf: no structure
            self.returned_spec = None if any(isinstance(x, (dict, list, tuple)) for x in leaves) else spec
            return out
        return call, args

    def _carried(self, obj: Any) -> CarriedObject | None:
        """A CarriedObject for a returned leaf that is a plain object holding traced tensors (see
        carried.py); None for anything else."""
        def leaf(x):
            if not isinstance(x, Proxy):
                return False, x
            value = self.example_value(x.node)
            return (True, None) if isinstance(value, torch.Tensor) else (False, value)
        try:
            return split(obj, leaf)
        except Exception:  # noqa: BLE001 - no example value for one of them: fx's own error follows
            return None

    def _create_args_for_root(self, root_fn, is_module, concrete_args=None):
        """fx hands `*args` to the forward as one proxy that cannot be iterated; with `var_args` (the example
        call's *args and **kwargs, by parameter name) each element gets its own getitem of the "*args"
        placeholder, so `f(*xs)` and `for x in xs` trace with the example's arity."""
        var_args = getattr(self, "var_args", None)
        given = self.given
        fn = inspect.unwrap(root_fn)
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())[1 if is_module else 0:]
        omitted = given is not None and any(p.name not in given for p in params
                                            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
        if not var_args and not omitted:
            return super().create_args_for_root(root_fn, is_module, concrete_args)
        positional: list[Any] = [self.root] if is_module else []
        keywords: dict[str, Any] = {}
        by_name = False  # after an omitted parameter, the given ones are passed by name
        for p in params:
            if given is not None and p.name not in given and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                # not in the example call: the forward's own default applies (passing it, even as None, can
                # clash with decorators that add it by keyword, as transformers' do with use_cache)
                by_name = True
                continue
            if p.kind == p.VAR_POSITIONAL:
                ph = self.create_proxy("placeholder", "*" + p.name, (), {})
                positional += [ph[i] for i in range(len(var_args.get(p.name, ())))]
            elif p.kind == p.VAR_KEYWORD:
                ph = self.create_proxy("placeholder", "**" + p.name, (), {})
                # a plain value the example passes through **kwargs (transformers' return_dict=False) is a
                # constant of the trace, as a named parameter's is: decorators branch on it in Python
                keywords.update({k: v if _plain_constant(v) else ph[k]
                                 for k, v in var_args.get(p.name, {}).items()})
            else:
                value = self._proxy_placeholder(p.name, concrete_args, sig, fn)
                if p.kind == p.KEYWORD_ONLY or (by_name and p.kind != p.POSITIONAL_ONLY):
                    keywords[p.name] = value
                else:
                    positional.append(value)
        return (lambda: root_fn(*positional, **keywords)), []

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if qualname in self.forced_leaves:
            return True
        if isinstance(m, self.leaf_types):
            return True
        if isinstance(m, _TRACE_THROUGH) or self._parametrization(m, qualname):
            return False
        return super().is_leaf_module(m, qualname)

    def _parametrization(self, m: nn.Module, qualname: str) -> bool:
        """Whether `m` is a parametrized module, the ParametrizationList of one, or a parametrization
        inside such a list (all traced through: the weight is their output)."""
        from torch.nn.utils import parametrize

        if parametrize.is_parametrized(m) or isinstance(m, parametrize.ParametrizationList):
            return True
        parent = qualname.rpartition(".")[0]
        try:
            return bool(parent) and isinstance(self.root.get_submodule(parent), parametrize.ParametrizationList)
        except AttributeError:
            return False

    def call_module(self, m: nn.Module, forward: Any, args: tuple, kwargs: dict) -> Any:
        try:
            qualname = self.path_of_module(m)
        except NameError:
            # a module the forward creates as it runs (transformers' `loss_fct = CrossEntropyLoss()`): not
            # part of the model, so no call_module node can name it; its forward is traced inline (any
            # tensor it holds becomes a constant of the graph)
            return forward(*args, **kwargs)
        if self.is_leaf_module(m, qualname):
            return super().call_module(m, forward, args, kwargs)
        # trace through; if that fails, undo what it added and call the module as one opaque leaf
        last = _last_node(self.graph)  # the last node before this submodule's nodes
        stack = dict(self.module_stack)
        calls = dict(self.num_calls)
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception as e:  # noqa: BLE001 - any failure inside means "not traceable by fx"
            if not qualname:
                raise
            self._rollback(last)
            self.module_stack.clear()
            self.module_stack.update(stack)
            self.num_calls.clear()
            self.num_calls.update(calls)
            self.forced_leaves[qualname] = describe(e, 200)
            return super().call_module(m, forward, args, kwargs)

    def _rollback(self, last: fx.Node | None) -> None:
        """Erase every node created after `last` (newest first, so users go before their inputs)."""
        self._env.clear()  # example values computed in the erased part may have been changed in place
        while (node := _last_node(self.graph)) is not last:
            for user in list(node.users):
                self.graph.erase_node(user)
            self.graph.erase_node(node)


def _source_of(node: fx.Node) -> str:
    """Where the branch on `node` is, for messages: the model's source line that asked for its truth value
    (the innermost frame outside torch and aiacc) and the node, e.g. "`if x.sum() > 0:` (model.py:12, gt)"."""
    skip = (os.path.dirname(torch.__file__) + os.sep,
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep)
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back
    if frame is None:
        return f"node {node.name}"
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}, node {node.name}"
    return f"`{line}` ({where})" if line else where


def value_guard(cond: Any, expected: bool, what: str, message: str = "") -> Any:
    """`cond`, after checking that its truth value is `expected`, the one the trace was specialised on
    (GuardError otherwise, naming `what`: the branch's source; `message`, when given, is the error's text:
    a check that is no branch, as a loss's targets in the class range). Called with an fx Proxy (while
    tracing, or when torch.load re-traces a saved GraphModule) it records one call of itself instead: a
    module-level function, so exported modules pickle and reload with their guards."""
    if isinstance(cond, Proxy):
        return cond.tracer.create_proxy("call_function", value_guard,
                                        (cond, expected, what) + ((message,) if message else ()), {},
                                        name="value_guard")
    from aiacc.core.ops.guard import mismatch_message

    if isinstance(cond, torch.Tensor) and torch.compiler.is_compiling():
        # under torch.compile (the training step's compiled candidate): an assert dynamo keeps in its graph,
        # where bool() would break the graph in two; it raises RuntimeError with the same text
        truth = cond if cond.dtype == torch.bool else cond != 0
        torch._assert_async(truth if expected else ~truth, message or mismatch_message("value guard", what, expected))
        return cond
    if isinstance(cond, torch.Tensor) and cond.is_meta:
        return cond  # a meta tensor has no values to check (module.to("meta") runs shapes only)
    if bool(cond) != expected:
        raise GuardError(message or mismatch_message("value guard", what, expected))
    return cond


torch.fx.node.has_side_effect(value_guard)  # fx's own dead-code elimination keeps it too


def _tensor_items(tracer: "AiaccTracer", graph: fx.Graph) -> None:
    """`flag = mask.any().item(); if flag:` reads a tensor into Python; where every use of the value ends
    in a value guard (through Python arithmetic and comparisons), the read is traced as a 0-d tensor of
    Python's own number type (bool, int64, float64: the example's value tells which) instead, so the IR
    computes the condition as a tensor and the guard checks it on every call."""
    for node in list(graph.nodes):
        if node.op != "call_method" or node.target != "item" or not _ends_in_guards(node):
            continue
        try:
            dtype = _PYTHON_DTYPES.get(type(tracer.example_value(node)))
        except Exception:  # noqa: BLE001 - no example value: the read stays as it is
            dtype = None
        if dtype is None:
            continue
        with graph.inserting_before(node):
            typed = graph.call_method("to", (graph.call_method("reshape", (node.args[0], ())), dtype))
        node.replace_all_uses_with(typed)
        graph.erase_node(node)


_PYTHON_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}


def _ends_in_guards(node: fx.Node, _seen: set | None = None) -> bool:
    """Whether every use of `node` is a value guard, or Python arithmetic/comparison whose uses are."""
    seen = set() if _seen is None else _seen
    if node in seen:
        return True
    seen.add(node)
    if not node.users:
        return False
    for u in node.users:
        if u.op == "call_function" and u.target is value_guard:
            continue
        if u.op == "call_function" and getattr(u.target, "__module__", None) in ("_operator", "operator") \
                and _ends_in_guards(u, seen):
            continue
        return False
    return True


def value_guards(graph: fx.Graph) -> list[tuple[str, bool]]:
    """(what, expected) of each value guard of a traced graph, in graph order."""
    return [(n.args[2], n.args[1]) for n in graph.nodes if n.op == "call_function" and n.target is value_guard]


def _said_guards(module: nn.Module, guards: list[tuple[str, bool]]) -> None:
    """One warning (and report entry, via fallback) per trace naming the conditions it was specialised on."""
    if not guards:
        return
    listed = "; ".join(f"{what}: {expected}" for what, expected in guards[:4])
    more = f" (and {len(guards) - 4} more)" if len(guards) > 4 else ""
    fallback(f"torch.value_guard:{type(module).__name__}:{listed}",
             f"{type(module).__name__}: a Python branch on tensor data is specialised on the example's value of "
             f"{listed}{more}; a call where it differs raises GuardError (value guard)")


# reading these off a tensor gives its metadata, never its data
_META_ATTRS = {"shape", "dtype", "ndim", "device", "is_cuda", "is_sparse", "is_quantized", "layout",
               "requires_grad", "is_meta"}
_META_METHODS = {"size", "dim", "ndimension", "numel", "nelement", "is_floating_point", "is_complex",
                 "is_contiguous", "get_device", "element_size"}


def static_node(node: fx.Node, _seen: dict | None = None) -> bool:
    """Whether `node`'s value depends on its tensors' metadata only (shape, dtype, rank...), so it is the
    same for every input of the example's shapes and dtypes."""
    seen = {} if _seen is None else _seen
    if node in seen:
        return seen[node]
    seen[node] = False
    if node.op == "placeholder":
        ok = False
    elif node.op == "get_attr":
        ok = True  # the model's own state: fixed for every input
    elif node.op == "call_function" and node.target is getattr and len(node.args) > 1 \
            and node.args[1] in _META_ATTRS:
        ok = True
    elif node.op == "call_method" and node.target in _META_METHODS:
        ok = True
    elif node.op in ("call_function", "call_method"):
        ok = all(static_node(a, seen) for a in node.all_input_nodes)
    else:
        ok = False
    seen[node] = ok
    return ok


_TABLES = ("_modules", "_parameters", "_buffers")  # nn.Module's own tables: restored entry by entry


def _python_state(module: nn.Module) -> list[tuple[nn.Module, dict, dict]]:
    """Each submodule's plain attributes and a shallow copy of its dict/list attributes (its parameter and
    buffer tables too), before a trace."""
    out = []
    for m in module.modules():
        attrs = {k: v for k, v in vars(m).items() if k not in _TABLES}
        containers = {k: copy.copy(v) for k, v in attrs.items() if type(v) in (dict, list)}
        containers.update({k: dict(vars(m)[k]) for k in _TABLES[1:] if k in vars(m)})
        out.append((m, attrs, containers))
    return out


def _drop_proxies(module: nn.Module, saved: list) -> None:
    """A forward that caches a result in Python state (timm's LeViT keeps its attention bias in a dict)
    stored a proxy of this trace there: put back what was there before, so the model and a later trace
    never see a proxy."""
    def has_proxy(v):
        return isinstance(v, Proxy) or (type(v) in (dict, list, tuple) and
                                         any(isinstance(x, Proxy) for x in pytree.tree_leaves(v)))
    for m, attrs, containers in saved:
        for k, v in list(vars(m).items()):
            if not has_proxy(v):
                continue
            if k in _TABLES[1:] and k in containers:
                # a forward that reassigns a buffer (CTRL: `self.pos_encoding = self.pos_encoding.to(...)`)
                # left the proxy in nn.Module's table: the entries get their tensors back, the table stays
                for name, entry in list(v.items()):
                    if isinstance(entry, Proxy):
                        if name in containers[k]:
                            v[name] = containers[k][name]
                        else:
                            del v[name]
                continue
            if k not in attrs:
                delattr(m, k)
            elif k in containers and v is attrs[k]:
                v.clear()
                v.update(containers[k]) if isinstance(v, dict) else v.extend(containers[k])
            else:
                m.__dict__[k] = attrs[k]


def _last_node(graph: fx.Graph) -> fx.Node | None:
    """The last node of an fx graph (None when it has none), through fx's public node list."""
    return next(iter(reversed(graph.nodes)), None)


def _fill_override_caches() -> None:
    """Fill torch.overrides' caches of torch's public functions before anything of torch is patched.

    get_ignored_functions and get_overridable_functions read torch's namespaces once, on first use, and keep
    what they found for the whole process; fx's Proxy.__torch_function__ asks is_tensor_method_or_property
    on the first traced op, which fills both. Filled while a trace's patches are in place, they would hold the
    patched torch.zeros (and F.handle_torch_function) for good: the closures keep that trace's tracer alive,
    and with it the traced model, its graph and the example inputs; torch.zeros would also no longer be
    listed as ignored. Filled here first, they hold torch's own functions."""
    torch.overrides.get_ignored_functions()
    torch.overrides.get_overridable_functions()
    torch.overrides.is_tensor_method_or_property(torch.Tensor.add)
    torch.overrides.get_default_nowrap_functions()


@contextlib.contextmanager
def capture_autograd_functions(tracer: fx.Tracer):
    """While active, `SomeFunction.apply(proxy, ...)` records one call_function node whose target is the
    original bound `SomeFunction.apply` (so the export calls it again, custom backward included)."""
    _fill_override_caches()  # before the patch (see there)
    base = torch.autograd.Function
    original = base.__dict__["apply"]

    def patched(cls, *args, **kwargs):
        bound = original.__get__(None, cls)
        if any(isinstance(a, Proxy) for a in torch.utils._pytree.tree_leaves((args, kwargs))):
            return tracer.create_proxy("call_function", bound, args, kwargs, name=cls.__name__.lower())
        return bound(*args, **kwargs)

    base.apply = classmethod(patched)
    try:
        yield
    finally:
        base.apply = original


@contextlib.contextmanager
def proxy_patches(tracer: "AiaccTracer"):
    """While active, `len(proxy)` (also called by `[*proxy]` and `list(proxy)`) is the length of the proxy's
    example value, fixed at trace time like every shape; and `proxy[index] = value` is recorded as an
    operator.setitem call (the importer turns it into an out-of-place update)."""
    _fill_override_caches()  # before torch.zeros & co. are patched: a cache filled after would keep the patches
    original_len = Proxy.__len__
    had_setitem = "__setitem__" in Proxy.__dict__
    original_setitem = Proxy.__dict__.get("__setitem__")

    def patched_len(self):
        if self.tracer is tracer:
            try:
                return len(tracer.example_value(self.node))
            except Exception:  # noqa: BLE001 - no example value: fx's own error
                pass
        return original_len(self)

    def patched_setitem(self, key, value):
        if self.tracer is not tracer and original_setitem is not None:
            return original_setitem(self, key, value)
        self.tracer.create_proxy("call_function", operator.setitem, (self, key, value), {})

    # `y += 1` on a tensor changes y in place (its aliases see it); fx would record a plain `y + 1`
    saved = {name: Proxy.__dict__.get(name) for name in _INPLACE_DUNDERS}

    def inplace(op):
        def patched(self, other):
            return self.tracer.create_proxy("call_function", op, (self, other), {})
        return patched

    # factory functions given traced sizes (`torch.zeros(x.size(0), 4)`) have no tensor argument to
    # dispatch on: record them as calls too
    factories = {name: getattr(torch, name) for name in _FACTORIES if hasattr(torch, name)}

    def factory(original):
        def patched(*args, **kwargs):
            if any(isinstance(a, Proxy) for a in torch.utils._pytree.tree_leaves((args, kwargs))):
                return tracer.create_proxy("call_function", original, args, kwargs)
            return original(*args, **kwargs)
        return patched

    # `torch.finfo(x.dtype)`, `if x.ndim == 4`, `x.to(y.device)`: a tensor's dtype, rank and device are the
    # example's (fixed for the trace like its shapes), answered as Python values rather than proxies
    original_getattr = Proxy.__getattr__

    def patched_getattr(self, k):
        if k in _FIXED_ATTRS and self.tracer is tracer:
            try:
                value = tracer.example_value(self.node)
            except Exception:  # noqa: BLE001 - no example value: a proxy as fx makes it
                value = None
            if isinstance(value, torch.Tensor):
                return getattr(value, k)
        return original_getattr(self, k)

    # functions a library marked torch.fx.wrap (torchvision's Swin helpers) are kept as calls by fx because
    # fx cannot trace their shape checks; this tracer can (to_bool above), so it traces into them, except
    # those a converter translates whole (torchvision's stochastic_depth, whose body draws in place)
    from torch.fx import _symbolic_trace as st

    from aiacc.plugins.torch.importer import has_converter, loaded_named_converters

    wrapped_fns, wrapped_methods = dict(st._wrapped_fns_to_patch), list(st._wrapped_methods_to_patch)
    st._wrapped_fns_to_patch.clear()
    kept = {k: d for k, d in wrapped_fns.items() if has_converter(d.get(k[1]))}
    st._wrapped_fns_to_patch.update(kept)
    st._wrapped_methods_to_patch.clear()
    # fx.wrap patches the name only in the module that called it: a model that imported the function by
    # name (`from torchvision.ops import stochastic_depth`) would be traced into its body (an in-place
    # draw on a constant). fx's autowrap patches any forward's globals bound to these functions too.
    autowrap_ids = {id(d[k[1]]) for k, d in kept.items() if k[1] in d} | \
        {id(fn) for fn in loaded_named_converters()}
    added_ids = autowrap_ids - tracer._autowrap_function_ids
    tracer._autowrap_function_ids |= added_ids

    # transformers' ModelOutput.to_tuple (return_dict=False) drops the fields that are None; a field read off
    # an opaque call's output (`encoder_outputs.past_key_values`) is a proxy, None only when run: one that
    # is None on the example is dropped too, so the tuple has the original's length (fixed like a shape)
    generic = sys.modules.get("transformers.utils.generic")
    model_output = getattr(generic, "ModelOutput", None)
    original_to_tuple = model_output.to_tuple if model_output is not None else None

    def patched_to_tuple(self):
        def none_on_example(v):
            # only a field read off another object can be None when run (an op's result is a tensor): the
            # others are kept without running the example
            if not isinstance(v, Proxy) or v.tracer is not tracer or v.node.target not in (getattr, operator.getitem):
                return False
            try:
                return tracer.example_value(v.node) is None
            except Exception:  # noqa: BLE001 - no example value: kept, as fx would
                return False
        return tuple(v for v in original_to_tuple(self) if not none_on_example(v))

    for name, original in factories.items():
        setattr(torch, name, factory(original))
    if model_output is not None:
        model_output.to_tuple = patched_to_tuple
    Proxy.__getattr__ = patched_getattr
    Proxy.__len__ = patched_len
    Proxy.__setitem__ = patched_setitem
    for name in _INPLACE_DUNDERS:
        setattr(Proxy, name, inplace(getattr(operator, name.strip("_"))))
    try:
        yield
    finally:
        for name, original in factories.items():
            setattr(torch, name, original)
        Proxy.__len__ = original_len
        Proxy.__getattr__ = original_getattr
        if model_output is not None:
            model_output.to_tuple = original_to_tuple
        st._wrapped_fns_to_patch.update(wrapped_fns)
        tracer._autowrap_function_ids -= added_ids
        st._wrapped_methods_to_patch.extend(wrapped_methods)
        if had_setitem:
            Proxy.__setitem__ = original_setitem
        else:
            del Proxy.__setitem__
        for name, fn in saved.items():
            if fn is None:
                delattr(Proxy, name)
            else:
                setattr(Proxy, name, fn)


_FIXED_ATTRS = ("dtype", "ndim", "device", "is_cuda", "layout", "is_sparse", "is_quantized")

_FACTORIES = ("zeros", "ones", "full", "empty", "arange", "linspace", "eye", "rand", "randn", "randint", "randperm",
              "tensor", "as_tensor")

_INPLACE_DUNDERS = ("__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
                    "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__")


def _constants_not_buffers(gm: fx.GraphModule, module: nn.Module) -> None:
    """GraphModule registers every tensor a get_attr names as a buffer of its own: a plain tensor attribute
    of the model (`self.w = torch.tensor(...)`) or a tensor the forward makes, which fx lifts as
    `_tensor_constant0`. They are not the model's state: made plain attributes again, so the importer
    reads them as constants (in train mode it would look them up as state of the model, which has none)."""
    state = {id(t) for t in module.parameters()} | {id(t) for t in module.buffers()}
    originals = {id(m) for m in module.modules()}
    for qualname, t in list(gm.named_buffers()):
        owner_name, _, field = qualname.rpartition(".")
        owner = gm.get_submodule(owner_name)
        if id(t) in state or id(owner) in originals:
            continue
        del owner._buffers[field]
        setattr(owner, field, t)  # no longer in _buffers: nn.Module keeps it as a plain attribute


def trace_module(module: nn.Module, concrete_args: dict[str, Any] | None,
                 leaf_types: tuple[type, ...], example_args: dict[str, Any] | None = None,
                 given: set[str] | None = None) -> tuple[fx.GraphModule, dict[str, str]]:
    """Symbolically trace `module`; returns the GraphModule and the submodules made opaque (name -> why).

    If even the top-level forward cannot be traced, the whole module becomes one opaque call (its *args
    and **kwargs, if any, are passed on with the example call's arity: `example_args`, by parameter name).
    """
    tracer = AiaccTracer(leaf_types)
    sig = inspect.signature(module.forward)
    tracer.var_args = {p.name: (example_args or {}).get(p.name, () if p.kind == p.VAR_POSITIONAL else {})
                       for p in sig.parameters.values() if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    tracer.example = example_args
    tracer.given = given
    saved = _python_state(module)
    try:
        # keep_dropped_arguments: F.l1_loss's weight= would otherwise be traced as an unweighted loss
        with capture_autograd_functions(tracer), proxy_patches(tracer), keep_dropped_arguments():
            graph = tracer.trace(module, concrete_args=concrete_args)
        _drop_proxies(module, saved)  # before GraphModule copies the buffers its get_attr nodes read
        _tensor_items(tracer, graph)
        gm = fx.GraphModule(tracer.root, graph, type(module).__name__)
        _constants_not_buffers(gm, module)
        gm.meta["aiacc.returned_spec"] = tracer.returned_spec
        gm.meta["aiacc.value_guards"] = value_guards(graph)
    except Exception as e:  # noqa: BLE001
        why = describe(e, 200)
        gm = None
    finally:
        tracer._env.clear()
        tracer.restore_state()
        _drop_proxies(module, saved)
        tracer.release()
    if gm is not None:
        _said_guards(module, gm.meta["aiacc.value_guards"])  # outside the try: strict=True's error is no fallback
        return gm, tracer.forced_leaves
    # whole-model fallback: a graph with one call_module node on a wrapper holding the module
    wrapper = nn.Module()
    wrapper.add_module("model", module)
    graph = fx.Graph()

    example_args = example_args or {}
    call_args, call_kwargs = [], {}
    by_name = False  # after a parameter the example call omits, the given ones are passed by name
    for p in inspect.signature(module.forward).parameters.values():
        if given is not None and p.name not in given and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            by_name = True
            continue
        if concrete_args and p.name in concrete_args:
            value = concrete_args[p.name]
        elif p.kind == p.VAR_POSITIONAL:
            ph = graph.placeholder("*" + p.name)
            call_args += [graph.call_function(operator.getitem, (ph, i))
                          for i in range(len(example_args.get(p.name, ())))]
            continue
        elif p.kind == p.VAR_KEYWORD:
            ph = graph.placeholder("**" + p.name)
            call_kwargs.update({k: graph.call_function(operator.getitem, (ph, k))
                                for k in example_args.get(p.name, {})})
            continue
        else:
            value = graph.placeholder(p.name)
        if p.kind == p.POSITIONAL_ONLY or (p.kind == p.POSITIONAL_OR_KEYWORD and not by_name):
            call_args.append(value)
        else:
            call_kwargs[p.name] = value
    out = graph.call_module("model", tuple(call_args), call_kwargs)
    graph.output(out)
    return fx.GraphModule(wrapper, graph, type(module).__name__), {"": why}
