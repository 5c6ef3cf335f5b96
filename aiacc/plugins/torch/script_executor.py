"""The TorchScript executor of a torch inference export: the exported fx.GraphModule's body run by TorchScript's
interpreter instead of fx's generated Python code, where that measured faster on the example.

Why: a small model's exported graph (hidden 256, seq 128) is bound by Python dispatch: its ~120 fx nodes each
cost a Python call (~10 us), about a quarter of BERT-small's latency, where TorchScript's interpreter runs the
same ops in C++.

What runs: the module stays the same fx.GraphModule (the same state_dict names, parameters shared with the
original, hooks, report, torch.save/load and deepcopy). Its graph is cut into three parts:
  - prologue (Python, every call): binding the arguments, the source watch (source_watch.py);
  - core (TorchScript, torch.jit.trace of a GraphModule on the same parameter tensors, no copies): every tensor
    op, with each value guard's condition returned as an extra output instead of checked in the trace;
  - epilogue (Python): the value guards checked on those conditions, then the outputs rebuilt (a ModelOutput
    through the export's own aiacc_output module).
The core runs only for calls whose tensors have the example's shapes, dtypes and devices (it was traced for
them: sizes may be baked in), under the grad mode it was traced in, and while no parameter or buffer of the
module changed in place since it was traced (fastpath's packed weights are trace constants); any other call,
a failing value guard (the fx forward then raises its own error) or an exception inside the core (the fx
forward then runs and raises or answers as before) runs the fx forward; so do calls under torch.compile and
torch.jit.trace (they see fx's code, as without the executor). The fast path's MKL / oneDNN linears are lowered
in the core to the ops they call (torch.ops.mkl._mkl_linear, mkldnn._linear_pointwise through a script
function) on the weights fastpath packed for the example's row count (its own cache: no second copy), as
buffers of the core (`prepack`); anything else of the fast path runs its plain torch form in the trace
(fastpath.usable refuses every trace).

Choice (AIACC_TORCHSCRIPT=on|off|measure, default measure): the core is traced, checked equal to the fx forward
on the example and on a second input of the same shapes (within the plugin's tolerance), then both are timed
interleaved (timing.interleaved_medians); kept only at KEEP ratio or better. The report's "executor" note says
which runs, with both times. The trace is not frozen (torch.jit.freeze would make every weight a constant, a
second copy of a base model's weights, for no measured gain over the unfrozen trace on these models).
torch.save / deepcopy keep the choice: the copy traces its own core (on its own tensors) at its first call.
"""
from __future__ import annotations

import inspect
import os
import warnings
from typing import Any

import torch
import torch.fx as fx

ENV = "AIACC_TORCHSCRIPT"
KEEP = 0.97  # the core must run the example at this fraction of the fx forward's time or less
ROUNDS, MAX_ROUNDS, MAX_SECONDS, AMBIGUOUS = 7, 15, 4.0, 0.05


def mode() -> str:
    """AIACC_TORCHSCRIPT: 'on' (keep the executor wherever it traces and checks equal), 'off', or 'measure'."""
    value = os.environ.get(ENV, "measure").strip().lower()
    if value not in ("on", "off", "measure"):
        from aiacc.errors import OptionError

        raise OptionError(f"{ENV}={value!r}: give on, off or measure")
    return value


class _Slot:
    """The place of the core's i-th output in the output node's structure."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i


def _target_name(node: fx.Node) -> str:
    return getattr(node.target, "__name__", "") if node.op == "call_function" else ""


def split(gm: fx.GraphModule) -> tuple[fx.GraphModule, dict] | str:
    """(core GraphModule on gm's own tensors and submodules, plan) for gm's graph, or why it cannot be cut:
    plan = {"inputs": [(placeholder name, position or None)], "guards": [(core output index, value_guard args)],
    "template": the output node's argument with _Slot(i) for core outputs, "n_out": outputs that are values}."""
    from aiacc.plugins.torch import _fx, exporter

    graph = gm.graph
    core = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    inputs: list[tuple[str, Any]] = []
    guards: list[tuple[fx.Node, tuple]] = []
    position = 0
    skipped: set[fx.Node] = set()
    out_node = None
    for node in graph.nodes:
        if node.op == "placeholder":
            star = str(node.target).startswith("*")
            pos = None if star else position
            position += 0 if star else 1
            if any(u.op != "call_function" or u.target is not exporter._leaves or u.users for u in node.users):
                if star:
                    return f"its input {node.target} is read"
                env[node] = core.placeholder(node.name)
                inputs.append((str(node.target), pos))
            else:
                skipped.add(node)
            continue
        if node.op == "output":
            out_node = node
            continue
        if node.op == "call_module" and node.target in (exporter_watch_name(), "aiacc_output"):
            skipped.add(node)
            continue
        if node.op == "call_function" and node.target is exporter._leaves:
            if node.users:
                return "an input is a nested structure (unpacked in the forward)"
            skipped.add(node)
            continue
        if node.op == "call_function" and node.target is _fx.value_guard:
            env[node] = env[node.args[0]] if isinstance(node.args[0], fx.Node) else node.args[0]
            guards.append((node.args[0], tuple(node.args[1:])))
            continue
        if node.op == "call_function" and _target_name(node) in ("check_layout",):
            return "an input's memory layout is checked per call (layout_guard)"
        if any(a in skipped for a in node.all_input_nodes):
            return f"node {node.name} reads {', '.join(a.name for a in node.all_input_nodes if a in skipped)}"
        env[node] = core.node_copy(node, lambda a: env[a])
    if out_node is None:
        return "no output"
    # the epilogue: the aiacc_output module's arguments (a ModelOutput) or the output node's own structure
    outs: list[fx.Node] = []

    def slot(a: Any) -> Any:
        if isinstance(a, fx.Node):
            if a.op == "call_module" and a.target == "aiacc_output":
                return _OutputModule(fx.node.map_aggregate(a.args, slot))
            if a in skipped:
                raise _Uncut(f"the output reads {a.name}")
            outs.append(env[a])
            return _Slot(len(outs) - 1)
        return a
    try:
        template = fx.node.map_aggregate(out_node.args[0], slot)
    except _Uncut as e:
        return str(e)
    n_out = len(outs)
    guard_plan = []
    for cond, rest in guards:
        if not isinstance(cond, fx.Node):
            return "a value guard on a constant"
        outs.append(env[cond])
        guard_plan.append((len(outs) - 1, rest))
    core.output(tuple(outs))
    core.lint()
    cm = fx.GraphModule(gm, core, class_name="AiaccScriptCore")
    return cm, {"inputs": inputs, "guards": guard_plan, "template": template, "n_out": n_out}


_SCRIPTED: dict = {}


def _onednn_linear(attr: str, scalars: list, algorithm: str | None):
    """A TorchScript function x, packed weight, bias -> mkldnn._linear_pointwise with this post-op: the tracer
    cannot record that op's Scalar?[] argument itself, a script function called in the trace can."""
    key = (attr, tuple(float(v) for v in scalars), algorithm)
    fn = _SCRIPTED.get(key)
    if fn is None:
        values = ", ".join(repr(v) for v in key[1])
        src = (f"def f(x: Tensor, w: Tensor, b: Optional[Tensor]):\n"
               f"    s: List[Optional[number]] = [{values}]\n"
               f"    return torch.ops.mkldnn._linear_pointwise(x, w, b, {attr!r}, s, {algorithm!r})\n")
        scripted = torch.jit.CompilationUnit(src).f

        def fn(x, w, b):  # a plain function for the fx node (fx names nodes by __name__); the trace sees through it
            return scripted(x, w, b)
        fn.__name__ = f"onednn_linear_{attr}"
        _SCRIPTED[key] = fn
    return fn


def prepack(cm: fx.GraphModule, flat: list) -> int:
    """Lower each fast-path linear (fastpath.linear: MKL's packed sgemm or oneDNN's inner product on a weight
    packed per row count, packed in Python at each call) of the core to the op it calls on its weight packed
    now (fastpath's own cache: the same tensor, no second copy), held as a buffer of the core, so the trace
    records the kernel (fastpath.usable keeps every trace on plain F.linear). The row count and the checks the
    fast path makes per call come from one run of the core on the example (`flat`). Returns how many."""
    from aiacc.plugins.torch import fastpath

    seen: dict[fx.Node, tuple] = {}

    class Record(fx.Interpreter):
        def run_node(self, n):
            if n.op == "call_function" and n.target is fastpath.linear:
                seen[n] = self.fetch_args_kwargs_from_env(n)
            return super().run_node(n)
    with torch.no_grad():
        Record(cm).run(*flat)
    done = 0
    for node, (args, kwargs) in seen.items():
        x, weight, bias = args[:3]
        attr, scalars, algorithm = (list(args[3:]) + ["none", (), None][len(args) - 3:])[:3]
        attr, scalars = kwargs.get("attr", attr), kwargs.get("scalars", scalars)
        algorithm, kernel = kwargs.get("algorithm", algorithm), kwargs.get("kernel", "onednn")
        if not (fastpath.usable(x, weight, bias) and x.dim() >= 1 and x.numel() > 0 and weight.dim() == 2):
            continue  # the plain path at the example: F.linear, as the trace records it anyway
        rows = x.numel() // x.shape[-1]
        name = f"aiacc_packed{done}"
        xn, wn, bn = node.args[:3]
        with cm.graph.inserting_before(node):
            if kernel == "mkl" and fastpath.MKL_LINEAR and x.dim() >= 2:
                packed = fastpath._packed(weight, ("mkl", rows),
                                          lambda w: torch.ops.mkl._mkl_reorder_linear_weight(w, rows))
                cm.register_buffer(name, packed, persistent=False)
                y = cm.graph.call_function(torch.ops.mkl._mkl_linear.default,
                                           (xn, cm.graph.get_attr(name), wn, bn, rows))
                y = cm.graph.call_function(fastpath._UNARY[attr], (y, list(scalars), algorithm))
            else:
                packed = fastpath._packed(weight, rows, lambda w: torch.ops.mkldnn._reorder_linear_weight(w, rows))
                cm.register_buffer(name, packed, persistent=False)
                y = cm.graph.call_function(_onednn_linear(attr, list(scalars), algorithm),
                                           (xn, cm.graph.get_attr(name), bn))
        node.replace_all_uses_with(y)
        cm.graph.erase_node(node)
        done += 1
    if done:
        cm.graph.lint()
        cm.recompile()
    return done


class _Uncut(Exception):
    pass


class _OutputModule:
    """The place of the export's aiacc_output call (a ModelOutput rebuilt from its arguments)."""

    __slots__ = ("args",)

    def __init__(self, args: Any):
        self.args = args


def exporter_watch_name() -> str:
    from aiacc.plugins.torch.source_watch import WATCH_NAME

    return WATCH_NAME


def _key(args: tuple, kwargs: dict) -> tuple:
    """What a call must match to run the core: arity, keyword names, each tensor's shape, dtype and device
    (non-tensors by value where hashable)."""
    def one(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return (a.shape, a.dtype, a.device)
        if a is None or isinstance(a, (bool, int, float, str)):
            return a
        return ("?", type(a).__name__)
    return (tuple(one(a) for a in args), tuple((k, one(v)) for k, v in sorted(kwargs.items())))


class ScriptExecutor:
    """gm's forward as prologue + TorchScript core + epilogue (see the module docstring); called by the module's
    instance `forward` (executor_forward), so nn.Module's call (hooks, Specializations) reaches it; `fx_forward`
    is the fx one."""

    def __init__(self, gm: fx.GraphModule, example: tuple[tuple, dict], note: str):
        import weakref

        self._gm = weakref.ref(gm)
        self.example = example  # (args, kwargs) the core is traced and checked on (kept for a copy's re-trace)
        self.note = note
        self.key = _key(*example)
        self.core = None  # traced lazily by a copy (torch.save / deepcopy), eagerly by `build`
        self.plan: dict | None = None
        self.versions: tuple = ()
        self.tensors: list = []
        self.failed = ""

    # -- building
    def build(self) -> str:
        """Trace the core on gm's tensors; '' or why not (then the fx forward runs every call)."""
        gm = self._gm()
        got = split(gm)
        if isinstance(got, str):
            self.failed = got
            return got
        cm, self.plan = got
        args, kwargs = self.example
        flat = self._inputs(args, kwargs)
        try:
            with torch.no_grad():  # the core runs without autograd: the fast path's checks as they will be
                prepack(cm, flat)
        except Exception as e:  # noqa: BLE001
            from aiacc.errors import describe

            self.failed = f"the fast path's kernels could not be set up for the trace ({describe(e, 160)})"
            return self.failed
        try:
            # under no_grad: the core runs for calls without autograd only (the fx forward keeps autograd)
            with warnings.catch_warnings(record=True) as caught, torch.no_grad():
                warnings.simplefilter("always", torch.jit.TracerWarning)
                core = torch.jit.trace(cm, tuple(flat), check_trace=False, strict=False)
        except Exception as e:  # noqa: BLE001 - whatever TorchScript refuses: the fx forward stays
            from aiacc.errors import describe

            self.failed = f"torch.jit.trace failed ({describe(e, 160)})"
            return self.failed
        bad = [str(w.message) for w in caught if issubclass(w.category, torch.jit.TracerWarning)
               and ("Python value" in str(w.message) or "numpy" in str(w.message).lower())]
        if bad:  # a tensor read as a Python value or numpy array: the trace baked a value in
            self.failed = f"the trace reads a tensor's value ({bad[0][:120]})"
            return self.failed
        self.core = core
        # every tensor of gm: an in-place write (version) or new memory (.data, .to()) makes the core's packed
        # weights old
        self.tensors = list({id(t): t for t in list(gm.parameters()) + list(gm.buffers())}.values())
        self.versions = self._versions()
        return ""

    def _versions(self) -> tuple:
        return tuple((t._version, t.data_ptr()) for t in self.tensors)

    def _inputs(self, args: tuple, kwargs: dict) -> list:
        out = []
        for name, pos in self.plan["inputs"]:
            out.append(args[pos] if pos is not None and pos < len(args) else kwargs[name])
        return out

    # -- calling
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        gm = self._gm()
        if self.core is None and not self.failed:
            self._rebuild(gm)
        if self.core is None or torch.is_grad_enabled() or _key(args, kwargs) != self.key:
            return self.fx_forward(*args, **kwargs)
        watch = gm.__dict__["_modules"].get(exporter_watch_name())
        if watch is not None:
            watch()
        if self._versions() != self.versions:  # a weight written in place: the core's packed copies are old
            self.core = None
            if self.build():  # traced again on the new values; where that fails, the fx forward from now on
                return self.fx_forward(*args, **kwargs)
        try:
            outs = self.core(*self._inputs(args, kwargs))
        except Exception:  # noqa: BLE001 - the fx forward raises (or answers) as it always did
            return self.fx_forward(*args, **kwargs)
        for i, rest in self.plan["guards"]:
            if bool(outs[i]) != rest[0]:
                return self.fx_forward(*args, **kwargs)  # raises the value guard's GuardError
        return _fill(self.plan["template"], outs, gm)

    def fx_forward(self, *args: Any, **kwargs: Any) -> Any:
        """The fx GraphModule's own forward."""
        gm = self._gm()
        return type(gm).forward(gm, *args, **kwargs)

    def _rebuild(self, gm: fx.GraphModule) -> None:
        """A copy's first call: trace its own core, checked equal to its fx forward on the example."""
        why = self.build()
        if why:
            return
        args, kwargs = self.example
        problem = _compare(self, gm, args, kwargs)
        if problem:
            self.core, self.failed = None, f"the copy's core differs from its fx forward ({problem})"

    def state(self) -> dict:
        """What a copy needs to trace its own core: the example and the note."""
        return {"example": self.example, "note": self.note}

    def __reduce__(self):
        # carried by shapes.keep_hooks_when_pickled as `state()`: the copy traces its own core on its own tensors
        return (_dropped, ())


def _dropped() -> None:
    return None


def _fill(template: Any, outs: tuple, gm: fx.GraphModule) -> Any:
    if isinstance(template, _Slot):
        return outs[template.i]
    if isinstance(template, _OutputModule):
        return gm.aiacc_output(*_fill(template.args, outs, gm))
    if isinstance(template, tuple):
        return tuple(_fill(t, outs, gm) for t in template)
    if isinstance(template, list):  # fx's immutable_list: the forward returned a list
        return [_fill(t, outs, gm) for t in template]
    if isinstance(template, dict):
        return {k: _fill(v, outs, gm) for k, v in template.items()}
    return template


def _compare(ex: ScriptExecutor, gm: fx.GraphModule, args: tuple, kwargs: dict) -> str:
    from torch.utils import _pytree as pytree

    from aiacc.core.compare import compare_outputs
    from aiacc.plugins.torch.translator import PLUGIN

    with torch.no_grad():
        want = ex.fx_forward(*args, **kwargs)
        got = ex(*args, **kwargs)
    a = [t.detach().cpu().numpy() for t in pytree.tree_leaves(want) if isinstance(t, torch.Tensor)]
    b = [t.detach().cpu().numpy() for t in pytree.tree_leaves(got) if isinstance(t, torch.Tensor)]
    if type(want) is not type(got) or len(a) != len(b):
        return "its outputs are structured differently"
    return compare_outputs(a, b, PLUGIN.rtol, PLUGIN.atol) or ""


def _second_input(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Another input of the example's shapes: float tensors perturbed, integer tensors permuted along their
    last dimension (ids stay valid ids, a mask stays a mask), so a value the trace baked in shows."""
    g = torch.Generator().manual_seed(1)

    def other(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            return t
        if t.is_floating_point():
            return t + 0.1 * torch.randn(t.shape, generator=g, dtype=t.dtype).to(t.device) * (t.abs().mean() + 1e-3)
        if t.dim() >= 1:
            return t[..., torch.randperm(t.shape[-1], generator=g).to(t.device)]
        return t
    return tuple(other(a) for a in args), {k: other(v) for k, v in kwargs.items()}


def choose(gm: Any, model: Any, example_inputs: Any, report: Any = None) -> Any:
    """Install the executor on `gm` (an inference fx.GraphModule export) where AIACC_TORCHSCRIPT and the
    measurement say so; the note goes into the report. Returns gm."""
    from aiacc.plugins.timing import interleaved_medians
    from aiacc.plugins.torch.importer import normalize_inputs

    setting = mode()
    if setting == "off":
        _say(report, f"fx (the GraphModule's Python forward): {ENV}=off")
        return gm
    if not isinstance(gm, fx.GraphModule) or gm.training:
        return gm
    args, kwargs = normalize_inputs(model, example_inputs)
    ex = ScriptExecutor(gm, (tuple(args), dict(kwargs)), "")
    why = ex.build()
    if not why:
        problem = _compare(ex, gm, *ex.example) or _compare(ex, gm, *_second_input(*ex.example))
        if problem:
            why = f"its outputs differ from the fx forward's ({problem})"
    if why:
        _say(report, f"fx (the GraphModule's Python forward): TorchScript not used: {why}")
        return gm

    def step(fn):
        def run():
            with torch.no_grad():
                return fn(*args, **kwargs)
        return run
    if setting == "on":
        ex.note = f"TorchScript (torch.jit.trace of the exported graph, not frozen): {ENV}=on"
    else:
        ms = interleaved_medians({"fx": step(ex.fx_forward), "torchscript": step(ex)}, ROUNDS, 2, MAX_ROUNDS,
                                 MAX_SECONDS, AMBIGUOUS)
        ratio = ms["torchscript"] / ms["fx"] if ms["fx"] > 0 else float("inf")
        times = f"torchscript {ms['torchscript']:.2f} ms, fx {ms['fx']:.2f} ms on the example, {ratio:.2f}x"
        if ratio > KEEP:
            _say(report, f"fx (the GraphModule's Python forward): TorchScript not at most {KEEP:.2f}x ({times})")
            return gm
        ex.note = f"TorchScript (torch.jit.trace of the exported graph, not frozen): {times}"
    install(gm, ex)
    _say(report, ex.note)
    return gm


SLOT = "_aiacc_script"  # gm.__dict__ key of its ScriptExecutor


def executor_forward(gm: fx.GraphModule):
    """The forward of a module with a TorchScript executor (its instance `forward`; a function on a weak
    reference, so the module holds no reference cycle): the executor, or fx's own forward under torch.compile
    (dynamo traces the fx code) and torch.jit.trace (a user's trace records the ops, as without the
    executor)."""
    import weakref

    ref = weakref.ref(gm)

    def forward(*args: Any, **kwargs: Any) -> Any:
        module = ref()
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return type(module).forward(module, *args, **kwargs)
        return module.__dict__[SLOT](*args, **kwargs)
    # callers read the original's parameter names off `fast.forward` (inspect.signature): keep fx's forward's
    forward.__signature__ = inspect.signature(type(gm).forward.__get__(gm))
    forward.__doc__ = type(gm).forward.__doc__
    return forward


def install(gm: fx.GraphModule, ex: ScriptExecutor) -> None:
    """Make `ex` gm's forward (an instance attribute: fx's class-level forward stays, for the fallback and for
    torch.save, which writes fx's code)."""
    gm.__dict__[SLOT] = ex
    gm.__dict__["forward"] = executor_forward(gm)
    object.__setattr__(gm, "aiacc_executor", ex.note)
    from aiacc.plugins.torch.shapes import keep_hooks_when_pickled

    keep_hooks_when_pickled(gm)


def executor_state(gm: Any) -> dict | None:
    """What torch.save / deepcopy carry of gm's executor (None without one)."""
    ex = gm.__dict__.get(SLOT) if isinstance(gm, torch.nn.Module) else None
    return ex.state() if isinstance(ex, ScriptExecutor) else None


def executor_of(gm: Any) -> ScriptExecutor | None:
    """gm's ScriptExecutor, or None."""
    return gm.__dict__.get(SLOT) if isinstance(gm, torch.nn.Module) else None


def restore(gm: Any, state: dict | None) -> None:
    """Give a copy (unpickled or deep-copied) its own executor, traced at its first call."""
    if state is None or not isinstance(gm, fx.GraphModule):
        return
    install(gm, ScriptExecutor(gm, state["example"], state["note"]))


def _say(report: Any, line: str) -> None:
    if report is not None:
        report.note("executor", [line])

