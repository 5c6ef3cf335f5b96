"""What an opaque torch node carries: the original callable, how to call it, and a numpy kernel so the
reference executor (and the per-pass numerics checks) can still run a graph that contains it."""
from __future__ import annotations

import inspect
import operator
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils import _pytree as pytree


class MethodCall:
    """A picklable `Tensor.<name>(*args)` call (the callable of an opaque call_method node)."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, obj: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(obj, self.name)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tensor.{self.name}"


class Hole:
    """Marks where a tensor argument goes in an opaque call's argument template. (None cannot mark it:
    None is an ordinary argument value, e.g. `F.interpolate(x, size=None, scale_factor=2)`.) Compared by
    type, so copies of the template (deepcopy, pickle) still match."""

    def __repr__(self) -> str:
        return "<tensor>"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Hole)

    def __hash__(self) -> int:
        return hash(Hole)


HOLE = Hole()


def fill_template(template: Sequence[Any], tensors: Sequence[Any], in_spec, what: str = "opaque call") -> tuple:
    """(args, kwargs) of an opaque call: the template's holes filled with `tensors`, in order."""
    from aiacc.errors import GraphError

    holes = sum(1 for t in template if isinstance(t, Hole))
    tensors = list(tensors)
    if holes != len(tensors):
        raise GraphError(f"{what}: its argument template has {holes} tensor slots but the node has "
                         f"{len(tensors)} inputs")
    it = iter(tensors)
    leaves = [next(it) if isinstance(t, Hole) else t for t in template]
    return pytree.tree_unflatten(leaves, in_spec)


_INPLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
                      operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift,
                      operator.irshift, operator.imatmul, operator.setitem}


def is_inplace(n, module: Any, args: tuple, kwargs: dict) -> bool:
    """Whether fx node `n` changes its first argument in place: `x.add_(1)`, `x += 1`, `x[i] = v`,
    `torch.relu_(x)`, `F.relu(x, inplace=True)`, `nn.ReLU(inplace=True)(x)`."""
    if n.op == "call_module":
        return bool(getattr(module, "inplace", False))
    if n.op == "call_method":
        name = str(n.target)
        return (name.endswith("_") and not name.startswith("_")) or \
            (name.startswith("__i") and name.endswith("__") and name[3:-2] in _IN_PLACE_DUNDERS)
    if n.op != "call_function":
        return False
    if n.target in _INPLACE_OPERATORS:
        return True
    name = getattr(n.target, "__name__", "")
    if name.endswith("_") and not name.startswith("_") and getattr(n.target, "__module__", "") in \
            ("torch", "torch.nn.functional", "torch._C._VariableFunctions", "torch._C._nn", None):
        return True
    if kwargs.get("inplace") is True:
        return True
    try:
        bound = inspect.signature(n.target).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return False
    return bound.arguments.get("inplace") is True


_IN_PLACE_DUNDERS = {"add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift",
                     "matmul"}


class OutOfPlace:
    """An in-place call made on a copy: clones the first argument, applies the call to the copy and returns
    it (so the traced graph stays free of mutation; the callable of an opaque in-place node)."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        x = x.clone()
        self.fn(x, *args, **kwargs)
        return x

    def __repr__(self) -> str:
        return f"OutOfPlace({self.fn!r})"


def call_opaque(fn: Callable, in_spec, template: Sequence[Any], tensors: Sequence[Any]) -> Any:
    """Call `fn` with the original argument structure, tensors filled into the template's holes."""
    args, kwargs = fill_template(template, tensors, in_spec, repr(fn))
    return fn(*args, **kwargs)


def flatten_outputs(result: Any, tensor_pos: Sequence[int]) -> list:
    leaves = pytree.tree_leaves(result)
    return [leaves[i] for i in tensor_pos]


def fixed_leaves(out_leaves: Sequence[Any], tensor_pos: Sequence[int], has_inputs: bool) -> tuple:
    """((position, value), ...): the Python numbers an opaque call returned beside its tensors (`tolist()`,
    `item()`, a count) that the trace gave its users as constants. Computed from tensor inputs they can
    change from call to call (JetMoE's `expert_size.tolist()` feeding a split), so every call checks them
    (`check_fixed`); a call without tensor inputs returns the same numbers each time."""
    if not has_inputs:
        return ()
    return tuple((i, leaf) for i, leaf in enumerate(out_leaves)
                 if i not in tensor_pos and isinstance(leaf, (bool, int, float)))


def check_fixed(result: Any, fixed: tuple, what: str) -> Any:
    """`result`, after checking that its Python-number leaves at `fixed`'s positions equal the values the
    trace fixed (GuardError otherwise, naming `what` and both values): specialised, never silently wrong.
    A module-level function, so exported modules pickle and reload with the check (torch.load re-traces a
    saved GraphModule: called with an fx Proxy it records one call of itself)."""
    if isinstance(result, torch.fx.Proxy):
        return result.tracer.create_proxy("call_function", check_fixed, (result, fixed, what), {},
                                          name="check_fixed")
    leaves = pytree.tree_leaves(result)
    for i, expected in fixed:
        got = leaves[i] if i < len(leaves) else None
        same = got == expected or (isinstance(got, float) and got != got and expected != expected)
        if not same or type(got) is not type(expected):
            from aiacc.errors import GuardError

            shown = [v for _, v in fixed]
            values = [leaves[j] if j < len(leaves) else None for j, _ in fixed]
            raise GuardError(f"{what} returned the Python values {short_repr(values)} where the optimized graph "
                             f"was traced with {short_repr(shown)}: they are constants of the trace (computed from "
                             f"tensor data the opaque call reads into Python), so this input needs another "
                             f"trace (optimize again with it as the example)")
    return result


torch.fx.node.has_side_effect(check_fixed)  # fx's dead-code elimination keeps it


def short_repr(values: Any, limit: int = 120) -> str:
    """repr(values), cut to `limit` characters (ending in "...") for a message."""
    text = repr(values)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def make_kernel(fn: Callable, in_spec, template: Sequence[Any], tensor_pos: Sequence[int], fixed: tuple = (),
                what: str = "opaque call"):
    """A numpy-in, numpy-out kernel that runs the torch callable (for the reference executor); `fixed`: the
    Python numbers of its result the trace fixed, checked on every call (check_fixed)."""

    def kernel(*arrays: np.ndarray) -> list[np.ndarray]:
        tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
        with torch.no_grad():
            result = call_opaque(fn, in_spec, template, tensors)
        if fixed:
            check_fixed(result, fixed, what)
        return [t.detach().cpu().numpy() for t in flatten_outputs(result, tensor_pos)]

    return kernel


def tie_state(module: torch.nn.Module, qualname: str | None, root: torch.nn.Module) -> None:
    """Make an opaque submodule's copy use the parameters and buffers that `root` already holds under the
    same qualified names (a weight the opaque module shares with translated ops, e.g. a tied embedding
    read by F.embedding elsewhere): one tensor, so gradients add up as in the original."""
    if not qualname:
        return
    for sub_name, sub in module.named_modules():
        prefix = f"{qualname}.{sub_name}." if sub_name else f"{qualname}."
        for table, lookup in ((sub._parameters, root.get_parameter), (sub._buffers, root.get_buffer)):
            for name, mine in list(table.items()):
                try:
                    existing = lookup(prefix + name)
                except AttributeError:
                    continue
                if existing is not mine and existing.shape == getattr(mine, "shape", None):
                    table[name] = existing


class OpOverloadRef:
    """An aten (or other torch.ops) overload called by name: an OpOverload itself does not pickle (its
    pybind11 function record), so an opaque op of a torch.export graph saved with torch.save holds this."""

    def __init__(self, op: torch._ops.OpOverload):
        self.namespace, self.name, self.overload = op.namespace, op._schema.name.split("::")[-1], op._overloadname
        self._op = op

    def resolve(self) -> torch._ops.OpOverload:
        if getattr(self, "_op", None) is None:
            self._op = getattr(getattr(getattr(torch.ops, self.namespace), self.name), self.overload)
        return self._op

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __getstate__(self) -> dict:
        return {"namespace": self.namespace, "name": self.name, "overload": self.overload}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._op = None

    def __repr__(self) -> str:
        return f"{self.namespace}.{self.name}.{self.overload}"


class CallableModule(torch.nn.Module):
    """An opaque function call held as a submodule of the exported module: fx's code generator cannot
    name every callable (a custom autograd Function's `apply`, a function from a user script), but it
    can always call a submodule, and torch.save pickles it by reference (an OpOverload by its name)."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = OpOverloadRef(fn) if isinstance(fn, torch._ops.OpOverload) else fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def extra_repr(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))
