"""Input shapes of an optimized torch module: the guard on every dimension and the per-shape specializations.

aiacc's IR has static shapes: an optimized module computes the original's outputs at the shapes of the
example it was traced at, and at other batch sizes only where verify's second-batch check found it does
(`free` batch). Every call is checked on every dimension of every tensor it passes:

- a call at the traced shapes (any batch size where the batch is free) runs the module itself;
- a call at other shapes runs a *specialization*: aiacc optimizes the original model again for those shapes,
  with the same options, verified on that call's inputs like the first, cached and dispatched to by shape
  (`Specializations`, installed as the module's `_compiled_call_impl`, the hook nn.Module.__call__ takes, so the
  call keeps its signature, its hooks and its return type). Each new specialization is warned once and listed
  in the pass report's `interface`; train-mode specializations share the module's parameters and buffers;
- `max_shapes` bounds how many are built (the example's counts as one; 1 turns re-optimization off); past the
  bound, and after torch.save/load (the file holds the optimized module, not the original model nor the
  specializations), a call at other shapes is an aiacc ShapeError naming the input, the dimension, and the
  shapes the module was built for (a deepcopy builds its own specializations again);
- `dynamic_shapes` (torch.export's form: `torch.export.Dim` per dimension) declares which dimensions a call may
  vary: those get specializations (and a size outside a Dim's min..max is a ShapeError); a call that differs
  in any other dimension (not a free batch) is a ShapeError at once, as torch.export's program would refuse it.
"""
from __future__ import annotations

import contextlib

import inspect
import warnings
import weakref
from typing import Any

from aiacc.errors import AiaccWarning, OptionError, ShapeError
from aiacc.plugins.shape_guard import ShapeSpec, describe, shape_text  # noqa: F401  (shared by every plugin)

DEFAULT_MAX_SHAPES = 8  # as torch.compile's recompile limit (torch._dynamo.config.cache_size_limit)


def check_max_shapes(value: Any) -> int:
    """`max_shapes` as an int of at least 1, else an OptionError."""
    if value is None:
        return DEFAULT_MAX_SHAPES
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(f"max_shapes={value!r}: give the number of input-shape specializations to keep, an int "
                          f"of at least 1 (1: no re-optimization, other shapes are a ShapeError)")
    return value


class CallSignature:
    """How a call's tensors are named: by the forward's parameters (positional ones in order, keywords by name;
    a parameter holding several tensors as name[i]). Read once from the signature, not bound per call."""

    def __init__(self, forward: Any):
        self.positional: list[str] = []
        self.star = ""
        try:
            params = list(inspect.signature(forward).parameters.values())
        except (TypeError, ValueError):
            params = []
        for p in params:
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                self.positional.append(p.name)
            elif p.kind == p.VAR_POSITIONAL:
                self.star = p.name
                break

    def name_of(self, i: int) -> str:
        if i < len(self.positional):
            return self.positional[i]
        return f"{self.star}[{i - len(self.positional)}]" if self.star else f"input {i}"

    def shapes(self, args: tuple, kwargs: dict) -> dict[str, tuple]:
        """{input name: shape} of every tensor the call passes (None and other non-tensors are left out)."""
        import torch

        found: dict[str, tuple] = {}

        def add(name: str, v: Any) -> None:
            if isinstance(v, torch.Tensor):
                found[name] = tuple(v.shape)
            elif isinstance(v, (list, tuple, dict)):
                from torch.utils import _pytree as pytree

                leaves = [t for t in pytree.tree_leaves(v) if isinstance(t, torch.Tensor)]
                for k, t in enumerate(leaves):
                    found[name if len(leaves) == 1 else f"{name}[{k}]"] = tuple(t.shape)
        for i, a in enumerate(args):
            add(self.name_of(i), a)
        for k, v in kwargs.items():
            add(k, v)
        return found

    def example(self, args: tuple, kwargs: dict) -> Any:
        """The call as example inputs for aiacc.optimize: the positional tuple, or the keywords (positional
        arguments named by their parameters) as a dict."""
        if not kwargs:
            return tuple(args)
        if len(args) > len(self.positional):
            raise ShapeError("a call passing both *args and keywords cannot be replayed as example inputs")
        return {**dict(zip(self.positional, args)), **kwargs}


def _caller() -> int:
    """The stacklevel of the first frame outside aiacc and torch (the user's call) for warnings.warn."""
    import os
    import sys

    import torch

    skip = (os.path.dirname(os.path.dirname(os.path.dirname(__file__))), os.path.dirname(torch.__file__))
    frame, level = sys._getframe(2), 2  # warn's caller is _build, whose caller's caller starts the walk
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame, level = frame.f_back, level + 1
    return level


class ShapeHook:
    """The forward pre-hook of an optimized module: a call whose shapes its ShapeSpec does not take is an aiacc
    ShapeError, never a raw error from inside the graph or a wrong answer. Silent when the module's
    Specializations already routed the call here. A class, not a closure, so the module still pickles."""

    def __init__(self, spec: ShapeSpec, signature: CallSignature, model: str, why: str):
        self.spec, self.signature, self.model, self.why = spec, signature, model, why

    def __call__(self, module: Any, args: Any, kwargs: Any) -> None:
        if isinstance(module.__dict__.get("_compiled_call_impl"), Specializations):
            return
        got = self.signature.shapes(args, kwargs)
        if not self.spec.matches(got):
            raise ShapeError(self.spec.message(self.model, got, [describe(self.spec.shapes)], self.why))


def _dropped() -> None:
    """What a pickled or copied Specializations becomes: nothing (the copy keeps its guard, not the original)."""
    return None


class Specializations:
    """The call of an optimized module that has specializations: the module itself at its own shapes, else the
    specialization built for the call's shapes, else a new one (optimize of the original with the same
    options, up to `limit` in all), else a ShapeError."""

    def __init__(self, module: Any, original: Any, options: dict, limit: int, spec: ShapeSpec,
                 signature: CallSignature, build: Any):
        self._module = weakref.ref(module)
        self.original, self.options, self.limit = original, options, limit
        self.spec, self.signature, self._build_fn = spec, signature, build
        self.specs: list[tuple[ShapeSpec, Any]] = []
        self.name = type(original).__name__

    def __reduce__(self):
        return (_dropped, ())

    def built(self) -> list[str]:
        """The input shapes of every specialization, the module's own first."""
        return [describe(s.shapes) + (" (any batch size)" if s.free_batch else "")
                for s in [self.spec] + [s for s, _ in self.specs]]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self._module()
        got = self.signature.shapes(args, kwargs)
        # the module's own shapes, or a call with other tensors than the example's (the module's ArgumentGuard
        # and ShapeHook then say what is wrong)
        if got == self.spec.shapes or set(got) != set(self.spec.shapes) or self.spec.matches(got):
            return module._call_impl(*args, **kwargs)
        for spec, m in self.specs:
            if spec.matches(got):
                return self._run(module, m, args, kwargs)
        return self._run(module, self._build(module, args, kwargs, got), args, kwargs)

    @staticmethod
    def _run(module: Any, m: Any, args: tuple, kwargs: dict) -> Any:
        if m.training != module.training:
            m.train(module.training)
        return m(*args, **kwargs)

    def _refuse(self, got: dict, why: str) -> ShapeError:
        return ShapeError(self.spec.message(self.name, got, self.built(), why))

    def _build(self, module: Any, args: tuple, kwargs: dict, got: dict) -> Any:
        for (name, d), (lo, hi) in self.spec.declared.items():
            shape = got.get(name)
            if shape is not None and d < len(shape) and not (lo <= shape[d] <= hi):
                raise ShapeError(f"{self.name}: input {name!r} of shape {shape_text(shape)}: its dimension {d} is "
                                 f"{shape[d]}, outside {lo}..{hi}, the range dynamic_shapes gives it")
        if self.spec.declared:
            for name, d, want in self.spec.mismatches(got):
                if d < 0:
                    raise self._refuse(got, "dynamic_shapes= keeps the other dimensions and every rank as traced")
                if (name, d) not in self.spec.declared:
                    raise ShapeError(f"{self.name}: input {name!r} of shape {shape_text(got[name])}: its dimension {d} "
                                     f"must be {want}, the size the model was built for (built: "
                                     f"{'; '.join(self.built())}); dynamic_shapes does not mark dimension {d} of "
                                     f"{name!r} dynamic")
        if 1 + len(self.specs) >= self.limit:
            raise self._refuse(got, f"max_shapes={self.limit} specialization(s) are built; optimize with a larger "
                                    f"max_shapes=, or call it at one of these shapes")
        n = len(self.specs) + 2
        warnings.warn(f"aiacc: {self.name} called with {describe(got)} (optimized for {describe(self.spec.shapes)}"
                      f"): optimizing it again for these shapes (specialization {n} of at most {self.limit}, "
                      f"max_shapes= sets it)", AiaccWarning, stacklevel=_caller())
        from aiacc.errors import AiaccError, first_line

        try:
            new, spec = self._build_fn(self.original, self.signature.example(args, kwargs), dict(self.options))
        except AiaccError as e:  # the original itself does not run there, or optimize refuses those shapes
            raise ShapeError(f"{self.name}: called with {describe(got)} (optimized for {describe(self.spec.shapes)}"
                             f"): optimizing the original for these shapes failed: {first_line(e)}") from e
        spec.declared = self.spec.declared
        if self.options.get("mode") in ("train", "training"):
            share_state(module, new)
        self.specs.append((spec, new))
        report = getattr(module, "aiacc_report", None)
        _report_new_fallbacks(report, getattr(new, "aiacc_report", None), f"specialization {n} ({describe(got)})")
        if report is not None:
            report.shapes = list(getattr(report, "shapes", None) or []) + [
                f"specialization {n} built at the first call with {describe(got)} (optimized again with the same "
                f"options{', verified on that call' if self.options.get('verify', True) else ''})"]
        return new


def _report_new_fallbacks(report: Any, built: Any, what: str) -> None:
    """Warn and list in `report` what a specialization's optimize did less than asked that the first optimize
    did not (its own warnings were silenced so the first optimize's are not repeated for every shape)."""
    if report is None or built is None:
        return
    extra = [f for f in (built.fallbacks or []) if f not in (report.fallbacks or [])]
    for line in extra:
        warnings.warn(f"aiacc: {what}: {line}", AiaccWarning, stacklevel=_caller())
    report.fallbacks = list(report.fallbacks or []) + extra


def share_state(module: Any, new: Any) -> None:
    """Make `new`'s parameters and buffers the same tensors as `module`'s of the same name (a train-mode
    specialization trains the module's weights, not a copy)."""
    params = dict(module.named_parameters(remove_duplicate=False))
    buffers = dict(module.named_buffers(remove_duplicate=False))
    for table, kind in ((params, "_parameters"), (buffers, "_buffers")):
        for qualname, _ in list(getattr(new, f"named{kind}")(remove_duplicate=False)):
            if qualname not in table:
                continue
            *path, leaf = qualname.split(".")
            owner = new.get_submodule(".".join(path)) if path else new
            getattr(owner, kind)[leaf] = table[qualname]


def declared_dims(dynamic_shapes: Any, signature: CallSignature, example: Any) -> dict:
    """torch.export's dynamic_shapes (a dict by parameter name, or a tuple/list in positional order; per tensor
    a dict {dim: Dim} or a tuple of Dim/None) as {(input, dim): (min, max)}; Dim.AUTO/DYNAMIC without bounds
    as (0, inf). An OptionError names what cannot be read."""
    import torch

    if dynamic_shapes is None:
        return {}
    if isinstance(dynamic_shapes, dict):
        named = dict(dynamic_shapes)
    elif isinstance(dynamic_shapes, (list, tuple)):
        named = {signature.name_of(i): s for i, s in enumerate(dynamic_shapes)}
    else:
        raise OptionError(f"dynamic_shapes={dynamic_shapes!r}: give a dict by forward parameter name or a tuple in "
                          f"positional order, as torch.export.export takes")
    out: dict = {}
    for name, spec in named.items():
        if spec is None:
            continue
        items = spec.items() if isinstance(spec, dict) else enumerate(spec) if isinstance(spec, (list, tuple)) \
            else None
        if items is None:
            raise OptionError(f"dynamic_shapes[{name!r}]={spec!r}: give {{dim: torch.export.Dim(...)}} or a tuple "
                              f"of Dim/None per dimension")
        for d, dim in items:
            if dim is None or dim == torch.export.Dim.STATIC:
                continue
            lo = getattr(dim, "min", None)
            hi = getattr(dim, "max", None)
            lo = 0 if lo is None else int(lo)
            hi = float("inf") if hi is None or hi > 2 ** 62 else int(hi)
            out[(name, int(d))] = (lo, hi)
    return out


def install(out: Any, original: Any, example_inputs: Any, options: dict, limit: int, dynamic_shapes: Any,
            batch: dict, build: Any) -> Any:
    """Put the shape guard (ShapeHook) on the optimized module `out` and, with limit > 1, its Specializations;
    `batch`: what the second-batch check found ({"free": True} or {"why": ...}); `build(original, example,
    options)` -> (module, ShapeSpec) optimizes a specialization. Says what it did in the report's interface."""
    from aiacc.plugins.torch.importer import normalize_inputs

    args, kwargs = normalize_inputs(original, example_inputs)
    signature = CallSignature(original.forward)
    shapes = signature.shapes(args, kwargs)
    declared = declared_dims(dynamic_shapes, signature, example_inputs)
    for name, d in declared:
        if name not in shapes or not 0 <= d < len(shapes[name]):
            raise OptionError(f"dynamic_shapes marks dimension {d} of {name!r}, which the example inputs do not have "
                              f"(their tensors: {describe(shapes) or 'none'})")
    spec = ShapeSpec(shapes, free_batch=bool(batch.get("free")), batch_why=batch.get("why", ""), declared=declared)
    name = type(original).__name__
    why = ("max_shapes=1: it is not optimized again for other shapes" if limit == 1 else
           "a module loaded by torch.load does not hold the original model (torch.save keeps the optimized module "
           "only), so it is not optimized again for other shapes; optimize the original with an example of these "
           "shapes")
    out.register_forward_pre_hook(ShapeHook(spec, signature, name, why), with_kwargs=True)
    keep_hooks_when_pickled(out)
    report = getattr(out, "aiacc_report", None)
    if limit > 1:
        out._compiled_call_impl = Specializations(out, original, options, limit, spec, signature, build)
    if report is not None:
        if limit > 1:
            report.interface = [line.replace("calling it with another batch size is a ShapeError",
                                             "another batch size is optimized again at its first call")
                                for line in (report.interface or [])]
        varying = (f"; dynamic_shapes: {', '.join(f'{k}[{d}]' for k, d in declared)} may vary, any other "
                   f"dimension is a ShapeError" if declared else "")
        report.shapes = [f"optimized for {describe(shapes)}" + (" (any batch size)" if spec.free_batch else "") +
                         (f"; a call at other shapes is optimized again for them (up to max_shapes={limit} in "
                          f"all), then a ShapeError" if limit > 1 else "; a call at other shapes is a ShapeError") +
                         varying]
    return out


def keep_hooks_when_pickled(module: Any) -> None:
    """torch.save/pickle of an fx.GraphModule rebuilds it from its code and drops its forward pre-hooks (the
    shape guard, the argument guard): this module's own class (fx makes one per instance) pickles them beside
    it and registers them again on load. Other modules keep their hooks in the state nn.Module pickles."""
    import torch.fx as fx

    if isinstance(module, fx.GraphModule) and type(module).__qualname__.endswith("GraphModuleImpl"):
        type(module).__reduce__ = _reduce_with_hooks
        type(module).__deepcopy__ = _deepcopy_with_hooks


def _deepcopy_with_hooks(self: Any, memo: dict) -> Any:
    """fx.GraphModule's deepcopy, which drops forward pre-hooks, with them copied and registered again; the copy
    gets its own Specializations (the same original model, none built yet: they would build on the copy's
    weights)."""
    import copy

    import torch.fx as fx

    from aiacc.plugins.torch import script_executor

    hooks = [(h, k in self._forward_pre_hooks_with_kwargs) for k, h in self._forward_pre_hooks.items()]
    with _without_executor(self) as executor:
        res = fx.GraphModule.__deepcopy__(self, memo)
    script_executor.restore(res, copy.deepcopy(executor, memo))
    if not res._forward_pre_hooks:
        for hook, with_kwargs in hooks:
            res.register_forward_pre_hook(copy.deepcopy(hook, memo), with_kwargs=with_kwargs)
    calls = self.__dict__.get("_compiled_call_impl")
    if isinstance(calls, Specializations):
        res._compiled_call_impl = Specializations(res, calls.original, calls.options, calls.limit, calls.spec,
                                                  calls.signature, calls._build_fn)
    return res


def _reduce_with_hooks(self: Any) -> tuple:
    import torch.fx as fx

    hooks = [(h, k in self._forward_pre_hooks_with_kwargs) for k, h in self._forward_pre_hooks.items()]
    with _without_executor(self) as executor:
        reduced = fx.GraphModule.__reduce__(self)
    return (_with_hooks, (reduced, hooks, executor))


def _with_hooks(reduced: tuple, hooks: list, executor: dict | None = None) -> Any:
    """The unpickled GraphModule with its forward pre-hooks registered again (and its TorchScript executor,
    script_executor.py, traced again at its first call)."""
    from aiacc.plugins.torch import script_executor

    module = reduced[0](*reduced[1])
    for hook, with_kwargs in hooks:
        module.register_forward_pre_hook(hook, with_kwargs=with_kwargs)
    keep_hooks_when_pickled(module)
    script_executor.restore(module, executor)
    return module


@contextlib.contextmanager
def _without_executor(module: Any):
    """fx's own pickling and deepcopy of `module` without its TorchScript executor (an instance `forward`,
    which they would copy beside fx's); yields what a copy needs to trace its own (or None)."""
    from aiacc.plugins.torch import script_executor

    state = script_executor.executor_state(module)
    saved = {k: module.__dict__.pop(k) for k in ("forward", script_executor.SLOT, "aiacc_executor")
             if k in module.__dict__}
    try:
        yield state
    finally:
        module.__dict__.update(saved)
