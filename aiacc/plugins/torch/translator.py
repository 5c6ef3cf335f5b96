"""The torch plugin (aiacc.plugins.base.Plugin): trace (importer.py), export (exporter.py natively, ort.py
for backend="onnxruntime"), run, feeds and the timing runner. torch is imported inside the methods, so
importing this module (and detecting a torch model) costs nothing."""
from __future__ import annotations

import contextlib
import contextvars
import sys
from typing import Any

import numpy as np

from aiacc.core.ir import Graph
from aiacc.errors import AiaccError, UnsupportedError, collecting_fallbacks, describe, fallback
from aiacc.plugins.base import Plugin, to_numpy_list


def normalize_mode(mode: str | None, model: Any = None) -> str:
    """'inference' or 'training' (the pass manager's names); 'train' and 'eval' are accepted too;
    None follows model.training."""
    if mode is None:
        from torch import nn

        return "training" if isinstance(model, nn.Module) and model.training else "inference"
    from aiacc.core.passes.manager import normalize_mode as one_spelling  # the one error for an unknown mode

    return "training" if one_spelling("inference" if mode == "eval" else mode) == "train" else "inference"


def _check_module(model: Any, verb: str) -> None:
    from torch import nn

    if not isinstance(model, nn.Module):
        raise UnsupportedError(f"the torch plugin {verb} torch.nn.Module objects, not "
                               f"{type(model).__module__}.{type(model).__name__}")


class TorchPlugin(Plugin):
    name = "torch"
    title = "torch"
    install_hint = "pip install 'aiacc[torch]'"
    modes = ("inference", "train")
    options = {"memory_budget": "bytes of activations to keep in mode='train' (recomputation plans the rest)",
               "framework_compile": "mode='train': 'auto' measures the step with and without torch.compile and "
                                    "keeps the faster; True always compiles; False never",
               "frontend": "'auto' (torch.fx where it translates the whole model, else torch.export), 'export' "
                           "(torch.export, inference) or 'fx' (torch.fx symbolic tracing)",
               "max_shapes": "how many input-shape specializations a call may build: a call at shapes the module "
                             "was not optimized for optimizes the original again for them, up to this many in all "
                             "(default 8; 1: other shapes are a ShapeError)",
               "dynamic_shapes": "torch.export's dynamic_shapes (torch.export.Dim per dimension): the dimensions "
                                 "a call may vary (each new size a specialization within the Dim's min..max); "
                                 "any other dimension differing is a ShapeError; given to torch.export too"}

    checks_batch = True

    def with_batch(self, example_inputs: Any, n: int) -> Any:
        """The example tensors with `n` rows (repeated; float rows perturbed by 1% noise so rows differ)."""
        import torch
        from torch.utils import _pytree as pytree

        gen = torch.Generator().manual_seed(0)

        def grow(t):
            if not isinstance(t, torch.Tensor) or t.dim() == 0:
                return t
            reps = -(-n // t.shape[0])
            big = t.repeat(reps, *([1] * (t.dim() - 1)))[:n].clone()
            if big.is_floating_point():
                big = big + 0.01 * torch.randn(big.shape, generator=gen, dtype=big.dtype).to(big.device)
            return big
        return pytree.tree_map(grow, example_inputs)

    def guard_batch(self, model: Any, batch: int, why: str) -> bool:
        """Note that the optimized module is specialized to `batch`: the shape guard optimize installs last
        (shapes.ShapeHook, every dimension) then holds dimension 0 fixed too and says `why`."""
        if not hasattr(model, "register_forward_pre_hook"):
            return False
        state = _BATCH.get()
        if state is not None:
            state["why"] = why
        return True

    def _check_batch(self, model: Any, out: Any, example_inputs: Any) -> list[str]:
        """base's second-batch check; where it found the module right at another batch size, the shape guard
        leaves dimension 0 free."""
        import io

        # torch.fx prints the generated code's traceback to stderr before re-raising a failure at the other
        # size (fx.graph_module._WrappedCall); the failure is handled here and said in the report
        with contextlib.redirect_stderr(io.StringIO()):
            lines = super()._check_batch(model, out, example_inputs)
        state = _BATCH.get()
        if state is not None and lines and "runs at other sizes" in lines[0] and not state.get("why"):
            state["free"] = True
        return lines

    def detect(self, model: Any) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(model, torch.nn.Module)

    def trace(self, model: Any, example_inputs: Any = None, mode: str | None = None, **options: Any) -> Graph:
        """torch.nn.Module -> IR graph (inference, or training semantics with mode='train')."""
        _check_module(model, "translates")
        from aiacc.plugins.torch.export_frontend import check_frontend

        frontend = check_frontend(options.get("frontend", "auto"))
        with aiacc_errors(f"aiacc.trace of {type(model).__name__}"):
            return self._trace(model, example_inputs, mode, frontend)

    def _trace(self, model: Any, example_inputs: Any, mode: str | None, frontend: str = "auto") -> Graph:
        from aiacc.plugins.torch import import_ops  # noqa: F401  (fills the importer's op tables)
        from aiacc.plugins.torch.importer import trace

        mode = normalize_mode(mode, model)
        graph = trace(model, example_inputs, "train" if mode == "training" else "inference", frontend)
        if mode == "training":
            state = graph.meta["torch.state"]
            arrays = {}
            for name, (qualname, _, _) in state.items():
                t = _lookup_state(model, qualname)
                arrays[name] = t.detach().cpu().numpy().copy()
            graph.meta["torch.state_arrays"] = arrays
        return graph

    def export_auto(self, graph: Graph, *, original: Any = None, providers: Any = None, **options: Any) -> Any:
        """backend="auto": the native module, carrying the maker of the onnxruntime module (from its own
        copy of the graph) for optimize's measured choice (backend_choice.py)."""
        for_ort = graph.copy()  # the native export annotates its graph (kept fusions); onnxruntime gets its own
        native = self.export_native(graph, original=original, **options)
        # a plain attribute (object.__setattr__), so nn.Module does not register anything; popped by optimize
        object.__setattr__(native, "_aiacc_make_ort", lambda: self.export_onnxruntime(
            for_ort, original=original, providers=providers, **options))
        return native

    def export_native(self, graph: Graph, *, original: Any = None, **options: Any) -> Any:
        """An fx.GraphModule computing the graph (the original module supplies opaque calls and state)."""
        from aiacc.plugins.torch import export_ops  # noqa: F401  (fills the exporter's op table)
        from aiacc.plugins.torch.exporter import export

        notes = {}
        if graph.meta.get("torch.mode", "inference") != "train" and (
                graph.find_nodes("FusedElementwise", "aiacc") or graph.meta.get("elementwise_fusion")):
            from aiacc.plugins.torch.numba_op import choose_fusions  # numba kernel or torch ops, measured

            notes = choose_fusions(graph)
        level2 = None
        if notes:  # level 3's whole-network guard (level3_guard.py): level 2's lowering, for optimize to time
            from aiacc.plugins.torch import level3_guard

            if level3_guard.skip_reason(graph) is None:
                level2 = level3_guard.as_level2(graph)
        gm = export(graph, original)
        if notes:
            gm.aiacc_fused_elementwise = notes  # {node: "kept: numba 0.41x" | "dropped: ..."}, for the report
        if level2 is not None:  # taken by optimize's guard (level3_guard.choose)
            level3_guard.attach(gm, lambda: export(level2, original))
        return gm

    def export_onnxruntime(self, graph: Graph, *, original: Any = None, providers: Any = None,
                           **options: Any) -> Any:
        """An nn.Module running the graph in onnxruntime (inference only)."""
        if graph.meta.get("torch.mode") == "train":
            raise UnsupportedError("backend='onnxruntime' runs inference only; use backend='native' for mode='train'")
        from aiacc.plugins.torch.ort import OrtModule

        return OrtModule(graph, providers=providers)

    def run(self, model: Any, example_inputs: Any) -> list[np.ndarray]:
        """Outputs as numpy, without side effects on the model (buffers and RNG restored, dropout seeded
        the same way for every model compared)."""
        return self.run_named(model, example_inputs)[0]

    def run_named(self, model: Any, example_inputs: Any) -> tuple[list[np.ndarray], list[str]]:
        """`run`'s tensors and where each sits in what forward returns: "dict['logits']", "Out.aux",
        "tuple[1]" (containers by type, keys and fields in order; a returned None or number keeps its
        place too), so verify refuses a result whose output structure differs from the original's."""
        import torch

        from aiacc.plugins.base import output_paths

        paths = output_paths(self._call(model, example_inputs), lambda x: isinstance(x, torch.Tensor))
        return ([t.detach().cpu().numpy() for _, t in paths if isinstance(t, torch.Tensor)],
                [p for p, _ in paths])

    def _call(self, model: Any, example_inputs: Any) -> Any:
        """model(example inputs) under no_grad, buffers and RNG restored, seeded the same for every model."""
        import torch

        from aiacc.plugins.torch.cuda import exact_fp32
        from aiacc.plugins.torch.importer import normalize_inputs

        args, kwargs = normalize_inputs(model, example_inputs)
        buffers = {k: b.detach().clone() for k, b in model.named_buffers()}
        # exact_fp32: on CUDA, TF32 alone would make equal models differ beyond the tolerance
        with torch.random.fork_rng(devices=[]), torch.no_grad(), exact_fp32():
            torch.manual_seed(0)
            try:
                out = model(*args, **kwargs)
            finally:
                for k, b in model.named_buffers():
                    # only what the call changed (BatchNorm's native kernel updates its statistics without
                    # bumping their version): a restoring copy_ bumps the version an optimized module sharing the
                    # buffer watches (source_watch), and would read as a change of the original's weights
                    if k in buffers and not torch.equal(b, buffers[k]):
                        b.copy_(buffers[k])
        return out

    def feeds(self, graph: Graph, example_inputs: Any) -> dict[str, np.ndarray] | None:
        from torch.utils import _pytree as pytree

        from aiacc.plugins.torch.importer import bind_inputs, normalize_inputs, tensor_to_numpy

        feeds: dict[str, np.ndarray] = {}
        signature = graph.meta.get("torch.signature", [])
        args, kwargs = normalize_inputs(None, example_inputs)
        bound = bind_inputs(signature, args, kwargs)
        for entry in signature:
            name = entry[1].lstrip("*")
            if entry[0] != "input" or name not in bound:
                continue
            leaves = pytree.tree_leaves(bound[name])
            for leaf, name in zip(leaves, entry[2]):
                if name is not None:
                    feeds[name] = tensor_to_numpy(leaf)
        feeds.update(graph.meta.get("torch.state_arrays", {}))
        return {v.name: feeds[v.name] for v in graph.inputs if v.name in feeds}

    def float64_outputs(self, model: Any, inputs: Any) -> list[np.ndarray] | None:
        """`run` on a float64 copy of the module (deepcopy, then .double(): every floating parameter and buffer)
        with every floating input tensor in float64, for verify's float64 re-check; the copy is dropped after
        the run. None where `model` is not an nn.Module."""
        import copy

        import torch
        from torch.utils import _pytree as pytree

        if not isinstance(model, torch.nn.Module):
            return None
        widen = (lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t)
        return self.run(copy.deepcopy(model).double(), pytree.tree_map(widen, inputs))

    def runner(self, model: Any, inputs: Any):
        """Calls model(*inputs) under no_grad; outputs as numpy."""
        import torch

        xs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)

        def run_torch():
            with torch.no_grad():
                return to_numpy_list(model(*xs))
        return run_torch

    def optimize(self, model: Any, example_inputs: Any = None, **options: Any) -> Any:
        """aiacc.optimize for torch: trace, run the passes, export, verify. mode defaults to the model's own
        (train() -> 'train'); memory_budget (bytes) with mode='train' plans activation recomputation."""
        _check_module(model, "optimizes")
        self.check_options(options)
        from aiacc.plugins.torch import shapes

        limit = shapes.check_max_shapes(options.pop("max_shapes", None))
        dynamic_shapes = options.pop("dynamic_shapes", None)
        again = dict(options)  # what a specialization for other shapes is optimized with
        batch = {}
        token = _BATCH.set(batch)
        try:
            with collecting_fallbacks(options.get("strict", False)), \
                    _export_dims(dynamic_shapes):
                if options.get("mode") is None and model.training:
                    fallback("torch.mode", f"{type(model).__name__} is in train mode (as a freshly built nn.Module "
                             f"is) and no mode= was given: it is optimized with training semantics (BatchNorm uses "
                             f"batch statistics and is not folded, Dropout stays random); call model.eval() or pass "
                             f"mode='inference' for inference, mode='train' to keep training semantics")
                out = self._optimize_torch(model, example_inputs, options)
        finally:
            _BATCH.reset(token)
        if example_inputs is None or not hasattr(out, "register_forward_pre_hook"):
            return out
        return shapes.install(out, model, example_inputs, again, limit, dynamic_shapes, batch,
                              lambda m, ex, opts: _specialization(self, m, ex, opts, dynamic_shapes))

    def _optimize_torch(self, model: Any, example_inputs: Any, options: dict) -> Any:
        explicit = options.get("mode") is not None
        options["mode"] = normalize_mode(options.get("mode"), model)
        auto_backend = options.get("backend") == "auto"
        if auto_backend and options["mode"] == "training":  # onnxruntime runs inference only
            options["backend"], auto_backend = "native", False
        if options.get("backend") == "onnxruntime" and options["mode"] == "training":
            raise UnsupportedError("backend='onnxruntime' runs inference only; use backend='native' for mode='train'")
        budget = options.pop("memory_budget", None)
        from aiacc.plugins.train_choice import option as compile_option

        compile_setting = compile_option(options)
        if budget is not None and options["mode"] != "training":
            raise UnsupportedError("memory_budget applies to mode='train' (inference memory is planned by the arena)")
        as_eval = options["mode"] == "inference" and model.training
        with aiacc_errors(f"aiacc.optimize of {type(model).__name__}"), _eval_for_inference(model, options["mode"]):
            out = super().optimize(model, example_inputs, **options)
            from aiacc.plugins.torch import level3_guard

            if level3_guard.pending(out):  # level 3 against level 2, whole network
                out = level3_guard.choose(self, model, out, example_inputs)
            if auto_backend:  # measured: native or onnxruntime (backend_choice.py)
                out = _choose_backend(self, model, out, example_inputs)
            if example_inputs is not None and options["mode"] == "inference" and \
                    options.get("backend", "native") in ("native", "auto"):
                from aiacc.plugins.torch import script_executor  # measured: fx's Python forward or TorchScript

                out = script_executor.choose(out, model, example_inputs, getattr(out, "aiacc_report", None))
            if example_inputs is not None and hasattr(out, "register_forward_pre_hook"):
                from aiacc.plugins.torch.export_frontend import ArgumentGuard  # untraced keywords: an error

                out.register_forward_pre_hook(ArgumentGuard(model, example_inputs), with_kwargs=True)
            notes = getattr(out, "aiacc_fused_elementwise", None)
            report = getattr(out, "aiacc_report", None)
            if as_eval and report is not None:  # the semantics the result has, next to its batch behaviour
                report.interface = list(report.interface or []) + [
                    "mode: the module is in train mode; optimized and verified in eval semantics (mode='inference'), "
                    "the module itself stays in train mode"]
            if notes and report is not None:
                report.note("elementwise_fusion", [f"{k}: {v}" for k, v in notes.items()])
            kernels = getattr(out, "aiacc_linear_kernels", None)
            if kernels and report is not None:
                report.note("linear_kernel", kernels)
            if budget is not None:
                report = getattr(out, "aiacc_report", None)
                out = _plan_memory(out, example_inputs, budget)
                out.aiacc_report = report
            if options["mode"] == "training" and options.get("backend", "native") == "native":
                from aiacc.plugins.torch.training import choose_train_step

                report = getattr(out, "aiacc_report", None)
                plan = getattr(out, "aiacc_memory_plan", None)
                # recomputation under a budget is planned for eager execution, and a mode inferred from
                # model.training is not a request to train faster: there 'auto' does not try the compiler
                auto_off = compile_setting == "auto" and (budget is not None or not explicit)
                out = choose_train_step(out, example_inputs, False if auto_off else compile_setting,
                                        original=model)
                for name, value in (("aiacc_report", report), ("aiacc_memory_plan", plan)):
                    if value is not None:
                        setattr(out, name, value)
        return out


def _choose_backend(plugin: Any, model: Any, native: Any, example_inputs: Any) -> Any:
    """backend="auto": the native result or its onnxruntime twin, whichever measured faster."""
    from aiacc.plugins.torch.backend_choice import BackendChoice, _said, choose_backend

    make_ort = native.__dict__.pop("_aiacc_make_ort", None)
    report = getattr(native, "aiacc_report", None)
    if example_inputs is None or make_ort is None:
        out, _ = _said(native, BackendChoice("native", reason="no example inputs to measure on"), report)
        return out
    out, _ = choose_backend(plugin, model, native, make_ort, example_inputs, report)
    if out is not native:
        out.aiacc_report = report
        for name in ("aiacc_fused_elementwise",):  # what the native export says, for the report
            if hasattr(native, name):
                object.__setattr__(out, name, getattr(native, name))
    return out


@contextlib.contextmanager
def _eval_for_inference(model: Any, mode: str):
    """mode='inference' on a module left in train mode: optimized with eval semantics, so it is traced and
    verified against the original in eval mode too (BatchNorm's running statistics, Dropout off), not against
    a training forward it was never meant to equal; the user's train/eval flags are restored afterwards."""
    if mode != "inference" or not model.training:
        yield
        return
    from aiacc.errors import AiaccWarning
    import warnings

    flags = {m: m.training for m in model.modules()}
    warnings.warn(f"aiacc: {type(model).__name__} is in train mode and mode='inference' was given: it is optimized "
                  f"and verified in eval semantics (BatchNorm running statistics, no Dropout); the module itself "
                  f"stays in train mode", AiaccWarning, stacklevel=4)
    model.eval()
    try:
        yield
    finally:
        for m, training in flags.items():
            m.training = training


def _lookup_state(model: Any, qualname: str) -> Any:
    # every name, a tied weight's other names too
    for name, t in model.named_parameters(remove_duplicate=False):
        if name == qualname:
            return t
    for name, t in model.named_buffers(remove_duplicate=False):
        if name == qualname:
            return t
    # a whole-model opaque fallback registers the model under "model."
    if qualname.startswith("model."):
        return _lookup_state(model, qualname[len("model."):])
    raise UnsupportedError(f"the model has no parameter or buffer {qualname}")


def _plan_memory(module: Any, example_inputs: Any, budget: Any) -> Any:
    """mode='train', memory_budget=...: the training memory planner picks what to recompute."""
    try:
        from aiacc.plugins.torch.memory import plan_training_memory
    except ImportError as e:
        raise UnsupportedError(f"memory_budget needs aiacc.plugins.torch.memory.plan_training_memory: {e}") from e
    return plan_training_memory(module, example_inputs, budget)


_WRAPPING = contextvars.ContextVar("aiacc_errors_wrapping", default=False)


@contextlib.contextmanager
def aiacc_errors(what: str):
    """Any failure that is not already an aiacc error becomes one (UnsupportedError naming the step and
    the original exception, which stays chained as __cause__): callers catch AiaccError only. Nested, the
    outermost step names the failure (optimize's trace fails as "aiacc.optimize of ...")."""
    if _WRAPPING.get():
        yield
        return
    token = _WRAPPING.set(True)
    try:
        yield
    except AiaccError:
        raise
    except Exception as e:  # noqa: BLE001
        raise UnsupportedError(f"{what} failed: {describe(e)}") from e
    finally:
        _WRAPPING.reset(token)


PLUGIN = TorchPlugin()
TRANSLATOR = PLUGIN  # the name earlier code and tests use


# what the second-batch check found while optimize runs: {"free": True} (right at another batch size) or
# {"why": ...} (specialized to the example's); read by shapes.install
_BATCH: contextvars.ContextVar = contextvars.ContextVar("aiacc_torch_batch", default=None)


@contextlib.contextmanager
def _export_dims(dynamic_shapes: Any):
    """The user's dynamic_shapes, for torch.export while this optimize traces (export_frontend.export_program)."""
    if dynamic_shapes is None:
        yield
        return
    from aiacc.plugins.torch.export_frontend import USER_DYNAMIC_SHAPES

    token = USER_DYNAMIC_SHAPES.set(dynamic_shapes)
    try:
        yield
    finally:
        USER_DYNAMIC_SHAPES.reset(token)


def _specialization(plugin: Any, model: Any, example: Any, options: dict, dynamic_shapes: Any) -> tuple[Any, Any]:
    """(the module optimized for `example`'s shapes with the first optimize's options, its ShapeSpec): a
    specialization a call at new shapes builds. Its fallbacks were warned by the first optimize already (they
    stay in its own report); it builds no specializations of its own."""
    import warnings

    from aiacc.errors import AiaccWarning
    from aiacc.plugins.torch.shapes import ShapeHook

    options.setdefault("progress", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AiaccWarning)
        new = plugin.optimize(model, example, max_shapes=1, dynamic_shapes=dynamic_shapes, **options)
    hook = next(h for h in new._forward_pre_hooks.values() if isinstance(h, ShapeHook))
    return new, hook.spec
