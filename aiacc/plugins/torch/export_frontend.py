"""The torch.export frontend: capture a module with `torch.export.export` and hand its ATen graph to the
Importer, as an fx.GraphModule shaped like the one the torch.fx tracer gives (one placeholder per forward
parameter of the example call, the model's parameters and buffers as get_attr nodes under their qualified
names, the forward's own return structure remembered in `gm.meta["aiacc.returned_spec"]`).

What torch.export brings over fx symbolic tracing: Python control flow on shapes, dtypes and ranks is run on
the example (dynamo-style capture, `strict=False`), custom autograd Functions and modules such as nn.LSTM are
inlined into ATen ops, and `**kwargs` forwards (transformers' models) are called exactly as the example call
does. The program is kept at the level export gives (aten.linear, aten.layer_norm,
aten.scaled_dot_product_attention stay whole, which the passes fuse); only ops without a converter are
decomposed with PyTorch's own decompositions (`decompose=`, see importer.trace).

The batch dimension (the first dimension the example's tensors share) is exported as `Dim.AUTO`: dynamic
where the model allows it, specialized by torch.export where it does not; which one happened is reported
(`gm.meta["aiacc.export"]`). Other dimensions are static (the IR's shapes are the example's).
"""
from __future__ import annotations

import contextlib
import contextvars
import inspect
import warnings
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

from aiacc.errors import UnsupportedError, describe
from aiacc.plugins.torch.carried import as_pytree_nodes, carried_classes, to_carried
from aiacc.plugins.torch.dispatch_fix import keep_dropped_arguments


class ExportFailed(UnsupportedError):
    """torch.export could not capture the model (the message is torch's first line)."""


def leaf(tree: Any, index: int) -> Any:
    """The index-th pytree leaf of `tree`: how a forward parameter holding a container (a tuple of tensors)
    feeds the flat inputs of the exported program. Has a converter (import_ops.aten) doing the same on IR
    values."""
    return pytree.tree_leaves(tree)[index]


def filled(sizes: list, value: Any, dtype: torch.dtype) -> torch.Tensor:
    """torch.full of `sizes`, where a size may be (tensor, axis): that tensor's size there. The form the
    capture gives `aten.zeros/ones/full/new_*` of a symbolic (batch) size, so the size is read off the
    tensor at run time rather than fixed to the example's."""
    return torch.full([d[0].shape[d[1]] if isinstance(d, tuple) else d for d in sizes], value, dtype=dtype)


def ranged(start: Any, end: Any, step: Any, dtype: torch.dtype) -> torch.Tensor:
    """torch.arange(start, end, step), where start or end may be (tensor, axis): that tensor's size there
    (`aten.arange` of a symbolic size, read at run time)."""
    start, end = ((x[0].shape[x[1]] if isinstance(x, tuple) else x) for x in (start, end))
    return torch.arange(start, end, step, dtype=dtype)


def _size_source(d: Any) -> Any:
    """(tensor node, axis) for an `aten.sym_size.int` node, the int itself for an int, else None."""
    if isinstance(d, int) and not isinstance(d, bool):
        return d
    if isinstance(d, fx.Node) and d.op == "call_function" and d.target is torch.ops.aten.sym_size.int:
        return (d.args[0], d.args[1])
    return None


def _read_sizes_at_run_time(graph: fx.Graph) -> None:
    """Factories of a symbolic size (`aten.zeros([2, sym_size(x, 0), 16])`, `aten.arange(sym_size(x, 1))`)
    become `filled` / `ranged` calls naming the tensor the size is read off (whose converters read it with
    Shape), so a dynamic batch stays dynamic through them. Sizes computed from several (2 * batch) stay as
    export gave them (fixed to the example by the Importer)."""
    aten = torch.ops.aten
    fills = {aten.zeros.default: 0, aten.ones.default: 1, aten.empty.memory_format: 0, aten.full.default: None,
             aten.new_zeros.default: 0, aten.new_ones.default: 1, aten.new_empty.default: 0,
             aten.new_full.default: None}
    ranges = (aten.arange.default, aten.arange.start, aten.arange.start_step)
    for n in list(graph.nodes):
        if n.op != "call_function" or (n.target not in fills and n.target not in ranges):
            continue
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor) or all(isinstance(d, int) for d in val.shape):
            continue
        if n.target in fills:
            is_new = n.target.__name__.startswith("new_")
            size = n.args[1] if is_new else n.args[0]
            value = fills[n.target]
            if value is None:
                value = n.args[2] if is_new else n.args[1]
            spec = [_size_source(d) for d in size]
            if any(d is None for d in spec) or isinstance(value, fx.Node):
                continue
            new_args = (spec, value, val.dtype)
            fn = filled
        else:
            args = list(n.args)
            start, end, step = (0, args[0], 1) if len(args) == 1 else \
                (args[0], args[1], args[2] if len(args) > 2 else 1)
            start, end = _size_source(start), _size_source(end)
            if start is None or end is None or isinstance(step, fx.Node):
                continue
            new_args = (start, end, step, val.dtype)
            fn = ranged
        with graph.inserting_before(n):
            new = graph.call_function(fn, new_args)
        new.meta.update(n.meta)
        n.replace_all_uses_with(new)
        graph.erase_node(n)


def _call_form(sig: inspect.Signature, arguments: dict[str, Any], given: set[str]) -> tuple[list, dict, list]:
    """(positional args, keyword args, [(parameter, value)] in forward order) for export: every parameter by
    name, except positional-only ones and those before a non-empty *args, which go by position."""
    params = list(sig.parameters.values())
    star = next((p for p in params if p.kind == p.VAR_POSITIONAL and arguments.get(p.name)), None)
    args, kwargs, order = [], {}, []
    for p in params:
        if p.name not in given or p.name not in arguments:
            continue
        value = arguments[p.name]
        order.append((p, value))
        if p.kind == p.VAR_POSITIONAL:
            args.extend(value)
        elif p.kind == p.VAR_KEYWORD:
            kwargs.update(value)
        elif p.kind == p.POSITIONAL_ONLY or (star is not None and params.index(p) < params.index(star)):
            args.append(value)
        else:
            kwargs[p.name] = value
    return args, kwargs, order


def _batch_of(leaves: list) -> int | None:
    dims = {t.shape[0] for t in leaves if isinstance(t, torch.Tensor) and t.dim() > 0}
    return dims.pop() if len(dims) == 1 else None


def _dynamic_shapes(order: list, batch: int | None) -> dict:
    """{parameter name: its value's specs}: Dim.AUTO on every tensor's first dimension of the batch size."""
    def spec(x):
        if isinstance(x, torch.Tensor) and batch is not None and x.dim() > 0 and x.shape[0] == batch:
            return {0: torch.export.Dim.AUTO}
        return None
    return {p.name: pytree.tree_map(spec, value, is_leaf=lambda v: v is None) for p, value in order}


# the dynamic_shapes given to aiacc.optimize (torch.export's form), set while it traces (translator._export_dims)
USER_DYNAMIC_SHAPES: contextvars.ContextVar = contextvars.ContextVar("aiacc_dynamic_shapes", default=None)


def _user_dynamic_shapes(order: list, given: Any) -> dict:
    """The user's dynamic_shapes by parameter name (a tuple is in positional order), None for the others."""
    if not isinstance(given, dict):
        given = {p.name: s for (p, _), s in zip(order, given)}
    return {p.name: given.get(p.name) for p, _ in order}


def export_program(model: nn.Module, args: list, kwargs: dict, order: list, dynamic: bool = True) -> tuple[Any, str]:
    """torch.export.export(model, args, kwargs, strict=False) with the batch dimension Dim.AUTO (or the
    dimensions aiacc.optimize's dynamic_shapes= gives), or static shapes when that fails: (program, why shapes
    are static or "")."""
    batch = _batch_of(pytree.tree_leaves((args, kwargs)))
    static_why = ""
    user = USER_DYNAMIC_SHAPES.get()
    if dynamic and user is not None:
        try:
            return _export(model, args, kwargs, _user_dynamic_shapes(order, user)), ""
        except ExportFailed as e:
            return _export(model, args, kwargs, None), (f"export with the given dynamic_shapes failed ({e}); "
                                                        f"exported with static shapes")
    if dynamic and batch is not None:
        try:
            return _export(model, args, kwargs, _dynamic_shapes(order, batch)), ""
        except ExportFailed as e:
            static_why = f"export with a dynamic batch dimension failed ({e}); exported with static shapes"
    return _export(model, args, kwargs, None), static_why


def _export(model: nn.Module, args: list, kwargs: dict, dynamic_shapes: Any) -> Any:
    try:
        with torch.no_grad(), keep_dropped_arguments():  # F.l1_loss's weight (dispatch_fix.py)
            return torch.export.export(model, tuple(args), dict(kwargs), dynamic_shapes=dynamic_shapes,
                                       strict=False)
    except Exception as e:  # noqa: BLE001 - torch.export's own error, one line, for the fallback's reason
        raise ExportFailed(f"torch.export cannot capture {type(model).__name__}: {describe(e, 300)}") from e


FUNCTIONALIZE = "functionalize"  # in decompose's ops: functionalize the program even with nothing to decompose


def decompose(program: Any, ops: set) -> Any:
    """The program with the aten ops `ops` replaced by PyTorch's own decompositions (those that have one);
    every other op is kept as it is. run_decompositions also functionalizes: in-place writes into views
    (`h[:, t] = x`: aten.copy_ into a select of an intermediate, left in export's training IR) become
    slice_scatter / select_scatter, which translate; FUNCTIONALIZE among `ops` asks for that alone."""
    from torch._decomp import core_aten_decompositions

    table = core_aten_decompositions()
    chosen = {op: table[op] for op in ops if op in table}
    if not chosen and FUNCTIONALIZE not in ops:
        return program
    try:
        return program.run_decompositions(chosen)
    except Exception as e:  # noqa: BLE001
        raise ExportFailed(f"run_decompositions failed: {describe(e, 300)}") from e


def decomposable(op: Any) -> bool:
    """Whether PyTorch has a decomposition of aten op `op`."""
    from torch._decomp import core_aten_decompositions

    return isinstance(op, torch._ops.OpOverload) and op in core_aten_decompositions()


def capture(model: nn.Module, arguments: dict[str, Any], given: set[str],
            decompose_ops: set | None = None) -> fx.GraphModule:
    """The exported program of `model` called with `arguments` (the example call's arguments by parameter
    name, defaults applied; `given`: the parameters the call passes) as an fx.GraphModule the Importer
    converts: a placeholder per given parameter (targets "*name" / "**name" for var parameters), each flat
    input of the program read off its parameter (`leaf`), get_attr nodes for the state, the program's flat
    outputs as a tuple and the forward's return structure in meta["aiacc.returned_spec"]. Raises
    ExportFailed with torch's reason."""
    sig = inspect.signature(model.forward)
    args, kwargs, order = _call_form(sig, arguments, given)
    # objects in the output holding tensors (a transformers DynamicCache) are pytree nodes while exporting
    try:
        with torch.no_grad():
            classes = carried_classes(model(*args, **kwargs))
    except Exception:  # noqa: BLE001 - torch.export's own run says why it fails
        classes = set()
    with as_pytree_nodes(classes):
        return _capture(model, args, kwargs, order, decompose_ops, classes)


def _capture(model: nn.Module, args: list, kwargs: dict, order: list, decompose_ops: set | None,
             classes: set) -> fx.GraphModule:
    program, static_why = export_program(model, args, kwargs, order)
    if decompose_ops:
        program = decompose(program, decompose_ops)
    flat, spec = pytree.tree_flatten((tuple(args), kwargs))
    if program.call_spec.in_spec is not None and program.call_spec.in_spec != spec:
        raise ExportFailed(f"the program's inputs {program.call_spec.in_spec} are not the call's {spec}")
    unlifted = program.module()
    src = unlifted.graph
    placeholders = [n for n in src.nodes if n.op == "placeholder"]
    if len(placeholders) != len(flat):
        raise ExportFailed(f"the program has {len(placeholders)} inputs for the call's {len(flat)} leaves")

    graph = fx.Graph()
    env: dict[fx.Node, Any] = {}
    k = 0
    for p, value in order:
        prefix = "*" if p.kind == p.VAR_POSITIONAL else "**" if p.kind == p.VAR_KEYWORD else ""
        ph = graph.placeholder(prefix + p.name)
        leaves = pytree.tree_leaves(value)
        for i, x in enumerate(leaves):
            src_ph = placeholders[k]
            k += 1
            if not isinstance(x, torch.Tensor):
                env[src_ph] = x  # export specializes non-tensor inputs: a constant of the trace
            elif isinstance(value, torch.Tensor):
                env[src_ph] = ph
            else:
                env[src_ph] = graph.call_function(leaf, (ph, i))
            env[src_ph].meta.update(src_ph.meta) if isinstance(env[src_ph], fx.Node) else None
    dynamic = []
    for src_ph, x in zip(placeholders, flat):
        val = src_ph.meta.get("val")
        if isinstance(x, torch.Tensor) and isinstance(val, torch.Tensor) and val.dim() > 0 \
                and not isinstance(val.shape[0], int):
            dynamic.append(src_ph.name)
    for n in src.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "call_module" and n.target == "_guards_fn":
            continue  # export's input guards: the Importer checks the example itself
        if n.op == "output":
            out = fx.node.map_arg(n.args[0], lambda a: env[a])
            graph.output(tuple(out) if isinstance(out, (list, tuple)) else (out,))
            continue
        if _noop_state_copy(n):  # the buffer already holds that value: nothing to write back
            env[n] = env[n.args[0]]
            continue
        env[n] = graph.node_copy(n, lambda a: env[a])
    _read_sizes_at_run_time(graph)
    gm = fx.GraphModule(unlifted, graph, type(model).__name__)
    gm.meta["aiacc.returned_spec"] = to_carried(program.call_spec.out_spec, classes)
    batch = _batch_of(flat)
    gm.meta["aiacc.export"] = {
        "dynamic_batch": bool(dynamic),
        # (with the user's dynamic_shapes, a static batch is what they asked for)
        "static_why": static_why or ("" if dynamic or batch is None or USER_DYNAMIC_SHAPES.get() is not None
                                     else f"torch.export specialized the batch dimension to {batch} (the model's "
                                          f"code fixes it)"),
        "decomposed": sorted(str(op) for op in (decompose_ops or ())),
    }
    return gm


_SAME_VALUE = {torch.ops.aten.to.device, torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout,
               torch.ops.aten._to_copy.default, torch.ops.aten.clone.default, torch.ops.aten.alias.default}


def _noop_state_copy(n: fx.Node) -> bool:
    """`buffer.copy_(buffer.to(its own dtype and device))`: how torch.export writes back a forward's
    `self.buf = self.buf.to(x.device, x.dtype)` (CTRL's positional encoding) when the buffer already is in
    that dtype and on that device. Any other write to the model's state is kept (and stays opaque)."""
    if n.op != "call_function" or n.target is not torch.ops.aten.copy_.default or len(n.args) < 2:
        return False
    dst, src = n.args[0], n.args[1]
    if not (isinstance(dst, fx.Node) and dst.op == "get_attr" and isinstance(src, fx.Node)
            and src.op == "call_function" and src.target in _SAME_VALUE and src.args and src.args[0] is dst):
        return False
    before, after = dst.meta.get("val"), src.meta.get("val")
    return isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor) and before.dtype == after.dtype \
        and before.device == after.device and tuple(before.shape) == tuple(after.shape)


# ------------------------------------------------------------------------------------------ the choice
FRONTENDS = {"auto": "torch.fx where it translates the whole model, else torch.export (the one with fewer "
                     "opaque nodes)",
             "export": "torch.export (inference only)", "fx": "torch.fx symbolic tracing"}


def check_frontend(frontend: Any) -> str:
    """`frontend` if it is one of FRONTENDS, else an OptionError listing them."""
    from aiacc.errors import OptionError

    if frontend not in FRONTENDS:
        raise OptionError(f"frontend={frontend!r} is not one of {', '.join(repr(k) for k in FRONTENDS)}")
    return frontend


@contextlib.contextmanager
def _held_fallbacks():
    """A private fallback scope for a trial translation: its fallbacks are recorded, not warned nor refused
    under strict=True; the chosen trial's are replayed into the caller's scope (`_replay`)."""
    from aiacc import errors

    scope = errors.Fallbacks(False)
    token = errors._SCOPE.set(scope)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.AiaccWarning)
            yield scope
    finally:
        errors._SCOPE.reset(token)


def _replay(scope, suffix: str = "") -> None:
    from aiacc.errors import fallback

    for cause, message in scope.seen.items():
        fallback(cause, message + suffix, stacklevel=4)


def _keep_fx(fx_held, name: str, why: str) -> None:
    """fx's translation is kept with its opaque regions: its own fallbacks say what is opaque and why, each
    with why torch.export did not do better appended (one warning per cause, as before the export
    frontend); where fx said nothing (an op without a converter), the choice is its own fallback."""
    from aiacc.errors import fallback

    if fx_held.seen:
        _replay(fx_held, f" (torch.export was tried too: {why})")
    else:
        fallback("torch.frontend", f"{name}: the torch.fx translation with its opaque regions is used; "
                                   f"torch.export was tried too: {why}")


def _opaque_count(graph) -> int:
    return sum(1 for n in graph if n.is_opaque)


def _fx_graph(model: nn.Module, example_inputs: Any, mode: str):
    from aiacc.plugins.torch.importer import Importer

    g = Importer(model, example_inputs, mode, frontend="fx").run()
    g.meta["torch.frontend"] = "fx"
    return g


def export_graph(model: nn.Module, example_inputs: Any, mode: str = "inference"):
    """The IR graph of `model` through torch.export. Ops left opaque for want of a converter that PyTorch
    can decompose are decomposed and the program imported again (up to 3 rounds: a decomposition may bring
    ops of its own); an in-place op left opaque has the program functionalized in the next round. Raises
    ExportFailed (or the Importer's aiacc error)."""
    from aiacc.plugins.torch.importer import Importer

    if mode != "inference":
        raise UnsupportedError("frontend='export' translates inference only (mode='train' keeps the model's "
                               "state updates, which torch.fx's translation handles): use frontend='fx'")
    ops: set = set()
    for _ in range(4):
        imp = Importer(model, example_inputs, mode, frontend="export", decompose=ops or None)
        g = imp.run()
        left = {n.meta.get("torch.callable") for n in g if n.is_opaque} - ops
        more = {op for op in left if decomposable(op)}
        if FUNCTIONALIZE not in ops and any(isinstance(op, torch._ops.OpOverload) and op._schema.is_mutable
                                            for op in left):
            more.add(FUNCTIONALIZE)  # an in-place op left opaque (copy_ into a view): functionalize
        if not more:
            break
        ops |= more
    g.meta["torch.frontend"] = "export"
    g.meta["torch.export"] = dict(imp.gm.meta["aiacc.export"])
    return g


def translate(model: nn.Module, example_inputs: Any, mode: str, frontend: str = "auto"):
    """The IR graph of `model` through the frontend asked for (see FRONTENDS).

    "auto": torch.fx first (its translation is the one the existing suite and goldens verify, and it is
    the cheaper capture); when fx leaves opaque nodes or fails, torch.export is tried and the graph with
    fewer opaque nodes kept (fx on a tie). Each switch and its reason is a fallback (warned, reported,
    refused under strict=True: pass frontend= to choose without one). mode="train" always uses fx.
    """
    from aiacc.errors import AiaccError, fallback

    check_frontend(frontend)
    name = type(model).__name__
    if frontend == "fx" or (frontend == "auto" and mode != "inference"):
        return _fx_graph(model, example_inputs, mode)
    if frontend == "export":
        with _held_fallbacks() as held:
            g = export_graph(model, example_inputs, mode)
        _replay(held)
        _static_fallback(g, name)
        return g
    fx_error = export_error = None
    with _held_fallbacks() as fx_held:
        try:
            fx_g = _fx_graph(model, example_inputs, mode)
        except AiaccError as e:
            fx_g, fx_error = None, e
    if fx_g is not None and _opaque_count(fx_g) == 0:
        _replay(fx_held)
        return fx_g
    with _held_fallbacks() as ex_held:
        try:
            ex_g = export_graph(model, example_inputs, mode)
        except AiaccError as e:  # ExportFailed, or an error of the Importer on the program
            ex_g, export_error = None, e
    fx_why = (f"torch.fx fails ({fx_error})" if fx_g is None else
              f"torch.fx leaves {_opaque_count(fx_g)} opaque node(s) "
              f"({'; '.join(list(fx_g.meta.get('torch.opaque_reasons', {}).values())[:3])})")
    if ex_g is None:
        if fx_g is None:
            raise fx_error
        _keep_fx(fx_held, name, f"it failed: {export_error}")
        fx_g.meta["torch.frontend_why"] = f"{fx_why}; torch.export failed: {export_error}"
        return fx_g
    if fx_g is not None and _opaque_count(ex_g) >= _opaque_count(fx_g):
        _keep_fx(fx_held, name, f"it leaves {_opaque_count(ex_g)} opaque node(s) "
                                f"({'; '.join(list(ex_g.meta.get('torch.opaque_reasons', {}).values())[:3])})")
        fx_g.meta["torch.frontend_why"] = f"{fx_why}; torch.export leaves {_opaque_count(ex_g)}"
        return fx_g
    _replay(ex_held)
    fallback("torch.frontend", f"{name}: {fx_why}; translated with torch.export instead "
                               f"({_opaque_count(ex_g)} opaque node(s)); pass frontend='export' to choose it "
                               f"without this fallback")
    _static_fallback(ex_g, name)
    ex_g.meta["torch.frontend_why"] = fx_why
    return ex_g


def _static_fallback(g, name: str) -> None:
    from aiacc.errors import fallback

    why = g.meta.get("torch.export", {}).get("static_why")
    if why:
        fallback("torch.export.static", f"{name}: {why}; the translation is specialized to the example's batch "
                                        f"size")


# ------------------------------------------------------------------------------------------ the call guard
class ArgumentGuard:
    """The forward pre-hook of an optimized module: a keyword argument the example call did not pass
    (`past_key_values=`, `use_cache=True`, `output_attentions=True`) was never traced, so the optimized
    module cannot honour it; it is refused (UnsupportedError naming it) rather than ignored, unless it is
    None or the forward's own default, which is what was traced (then it is dropped). A class, not a
    closure, so the module still pickles."""

    def __init__(self, model: nn.Module, example_inputs: Any):
        from aiacc.plugins.torch.importer import normalize_inputs

        args, kwargs = normalize_inputs(model, example_inputs)
        sig = inspect.signature(model.forward)
        try:
            given = set(sig.bind(*args, **kwargs).arguments)
        except TypeError:
            given = set(kwargs)
        self.name = type(model).__name__
        self.given = given | set(kwargs)
        self.defaults = {p.name: p.default for p in sig.parameters.values()
                         if p.default is not p.empty and p.name not in given}
        # keywords the example passed as plain values (return_dict=False, output_hidden_states=True): the trace
        # is specialized to them, so a call with another value is refused rather than answered for this one
        self.constants = {k: v for k, v in kwargs.items() if isinstance(v, (bool, int, float, str))}

    def __call__(self, module: Any, args: Any, kwargs: Any) -> Any:
        from aiacc.errors import UnsupportedError as Unsupported

        dropped = []
        constants = getattr(self, "constants", {})  # a guard pickled before it had them
        for k, v in kwargs.items():
            if k in constants and not _same_value(v, constants[k]):
                raise Unsupported(f"{self.name} was optimized for {k}={constants[k]!r} (the example's value, "
                                  f"fixed in the translation) and is called with {k}={v!r}: optimize with an "
                                  f"example that passes {k}={v!r}")
            if k in self.given:
                continue
            if v is None or (k in self.defaults and _same_value(v, self.defaults[k])):
                dropped.append(k)
                continue
            raise Unsupported(f"{self.name} was optimized for calls without {k}= (the example inputs did not "
                              f"pass it, so what it changes was not traced): call it without {k}, or optimize "
                              f"with an example that passes it")
        if not dropped:
            return None
        return args, {k: v for k, v in kwargs.items() if k not in dropped}


def _same_value(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - tensors and other objects without a plain equality
        return False
