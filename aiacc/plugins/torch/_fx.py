"""torch.fx tracing that never fails: what fx cannot trace becomes an opaque call.

Three things fx does not handle the way aiacc needs, and what this tracer does about them:

- A submodule whose forward has Python control flow on tensor values makes `symbolic_trace` raise. The
  tracer rolls back the nodes that submodule added and records it as a leaf call instead, so it becomes
  one opaque node holding the module (the finest granularity that traces).
- A custom `torch.autograd.Function` is inlined by fx (its forward is traced, its backward lost). While
  tracing, `Function.apply` is patched so that a call with proxy arguments is recorded as one call of the
  original `apply`, keeping the custom backward.
- nn.MultiheadAttention / nn.TransformerEncoderLayer / nn.TransformerEncoder are leaves (aiacc decomposes
  them itself); their forward's fused inference fast path is never taken.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.fx.proxy import Proxy

# containers fx should trace through even though they live in torch.nn
_TRACE_THROUGH = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


class AiaccTracer(fx.Tracer):
    """An fx Tracer with aiacc's leaf policy and the per-submodule fallback described above."""

    def __init__(self, leaf_types: tuple[type, ...] = ()):
        super().__init__()
        self.leaf_types = leaf_types
        self.forced_leaves: dict[str, str] = {}  # qualified name -> why it could not be traced

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if qualname in self.forced_leaves:
            return True
        if isinstance(m, self.leaf_types):
            return True
        if isinstance(m, _TRACE_THROUGH):
            return False
        return super().is_leaf_module(m, qualname)

    def call_module(self, m: nn.Module, forward: Any, args: tuple, kwargs: dict) -> Any:
        qualname = self.path_of_module(m)
        if self.is_leaf_module(m, qualname):
            return super().call_module(m, forward, args, kwargs)
        # trace through; if that fails, undo what it added and call the module as one opaque leaf
        last = self.graph._root.prev  # the last node before this submodule's nodes
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
            self.forced_leaves[qualname] = f"{type(e).__name__}: {e}".split("\n")[0][:200]
            return super().call_module(m, forward, args, kwargs)

    def _rollback(self, last: fx.Node) -> None:
        """Erase every node created after `last` (newest first, so users go before their inputs)."""
        while self.graph._root.prev is not last:
            node = self.graph._root.prev
            for user in list(node.users):
                self.graph.erase_node(user)
            self.graph.erase_node(node)


@contextlib.contextmanager
def capture_autograd_functions(tracer: fx.Tracer):
    """While active, `SomeFunction.apply(proxy, ...)` records one call_function node whose target is the
    original bound `SomeFunction.apply` (so the export calls it again, custom backward included)."""
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


def trace_module(module: nn.Module, concrete_args: dict[str, Any] | None,
                 leaf_types: tuple[type, ...]) -> tuple[fx.GraphModule, dict[str, str]]:
    """Symbolically trace `module`; returns the GraphModule and the submodules made opaque (name -> why).

    If even the top-level forward cannot be traced, the whole module becomes one opaque call.
    """
    tracer = AiaccTracer(leaf_types)
    try:
        with capture_autograd_functions(tracer):
            graph = tracer.trace(module, concrete_args=concrete_args)
        return fx.GraphModule(tracer.root, graph, type(module).__name__), tracer.forced_leaves
    except Exception as e:  # noqa: BLE001
        why = f"{type(e).__name__}: {e}".split("\n")[0][:200]
    # whole-model fallback: a graph with one call_module node on a wrapper holding the module
    wrapper = nn.Module()
    wrapper.add_module("model", module)
    graph = fx.Graph()
    import inspect

    params = [p for p in inspect.signature(module.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    placeholders = {}
    for p in params:
        if concrete_args and p.name in concrete_args:
            continue
        placeholders[p.name] = graph.placeholder(p.name)
    call_kwargs = {**{k: v for k, v in (concrete_args or {}).items()}, **placeholders}
    out = graph.call_module("model", (), call_kwargs)
    graph.output(out)
    return fx.GraphModule(wrapper, graph, type(module).__name__), {"": why}
