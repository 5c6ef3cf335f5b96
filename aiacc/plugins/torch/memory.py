"""Training under a memory budget for PyTorch: activation checkpointing chosen by aiacc.

    small = plan_training_memory(module, example_inputs, memory_budget=BYTES)
    loss = small(x).sum(); loss.backward()       # same gradients, activation memory within the budget

The module is traced with torch.fx; one profiling run (forward with autograd on the example inputs) measures
what each node saves for the backward pass (saved-tensor hooks; parameters and shared storages counted
once), its output size and its FLOPs. The graph is cut into units where one tensor flows from everything
before to everything after, the plan is chosen framework-free by `aiacc.core.memory_checkpoint`, and each
chosen segment becomes a submodule run through `torch.utils.checkpoint` (non-reentrant). The result shares
the original's parameters. Batch-norm running statistics are restored after a recompute, so they are
updated once per step as in the original.

`measure_training_memory` measures a training step with the CPU allocator's own counters (the torch
profiler's memory events): the bytes held between forward and backward, and the peak of the step.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Sequence

import torch
import torch.fx as fx
from torch.utils.checkpoint import checkpoint

from aiacc.core.memory_checkpoint import CheckpointPlan, MemoryBudgetError, Unit, plan_checkpoints
from aiacc.errors import UnsupportedError

__all__ = ["plan_training_memory", "profile_units", "measure_training_memory", "MemoryBudgetError",
           "CheckpointedSegment"]


def _as_tuple(example_inputs: Any) -> tuple:
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs)
    return (example_inputs,)


def _bytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (tuple, list)):
        return sum(_bytes(v) for v in x)
    return 0


# ------------------------------------------------------------------------------------------------
# profiling: what every node saves, produces and costs
# ------------------------------------------------------------------------------------------------
class _Profiler(fx.Interpreter):
    """Runs the traced module once with autograd, recording per node the bytes it saves for backward, the
    bytes of its output, and its FLOPs (plus one per output element, so elementwise ops cost something).

    A storage saved by several nodes (a ReLU's output that the next convolution saves as its input) is
    counted once, at the *last* node that saves it: a tensor crossing a cut is then either the next
    unit's saved input or, when that unit starts a checkpointed segment, the segment's kept input.
    Parameters, buffers and the model's inputs are not activations and are not counted."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.owned = {p.untyped_storage().data_ptr() for p in gm.parameters()}
        self.owned |= {b.untyped_storage().data_ptr() for b in gm.buffers()}
        self.storage: dict[int, tuple[int, fx.Node]] = {}  # data_ptr -> (bytes, last node saving it)
        self.out_bytes: dict[fx.Node, int] = {}
        self.flops: dict[fx.Node, float] = {}
        self.keep: list = []  # saved tensors stay referenced so storage addresses are not reused

    @property
    def saved(self) -> dict[fx.Node, int]:
        out: dict[fx.Node, int] = {}
        for nbytes, node in self.storage.values():
            if node is not None:
                out[node] = out.get(node, 0) + nbytes
        return out

    def run_node(self, n: fx.Node) -> Any:
        from torch.utils.flop_counter import FlopCounterMode

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in self.owned:
                self.storage[ptr] = (t.untyped_storage().nbytes(), n)
            self.keep.append(t)
            return t

        counter = FlopCounterMode(display=False)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), counter:
            out = super().run_node(n)
        self.out_bytes[n] = _bytes(out)
        self.flops[n] = float(counter.get_total_flops()) + self.out_bytes[n] / 4
        if n.op == "placeholder" and isinstance(out, torch.Tensor):
            self.owned.add(out.untyped_storage().data_ptr())  # inputs exist anyway: not activations
        return out


@contextlib.contextmanager
def _frozen_buffers(module: torch.nn.Module):
    """Run the profiling forward without leaving a trace in running statistics."""
    saved = {k: b.detach().clone() for k, b in module.named_buffers()}
    try:
        yield
    finally:
        with torch.no_grad():
            for k, b in module.named_buffers():
                b.copy_(saved[k])


class _Unit:
    def __init__(self, nodes: list[fx.Node], inputs: list[fx.Node], output: fx.Node | None):
        self.nodes = nodes
        self.inputs = inputs
        self.output = output


def _work_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op in ("placeholder", "call_module", "call_function", "call_method")]


def _cut_units(gm: fx.GraphModule) -> list[_Unit]:
    """Split the graph at cut points: after node t exactly one value (a tensor-producing node) is still
    needed later. get_attr nodes are constants, available everywhere."""
    work = _work_nodes(gm)
    pos = {n: i for i, n in enumerate(work)}
    end = len(work)
    last_use: dict[fx.Node, int] = {}
    for n in work:
        uses = [pos.get(u, end) for u in n.users]  # the output node (or anything not work) is "the end"
        last_use[n] = max(uses, default=pos[n])
    units: list[_Unit] = []
    live: set[fx.Node] = set()
    start = 0
    prev_cut_inputs: list[fx.Node] = []
    n_placeholders = sum(1 for n in work if n.op == "placeholder")
    for t, n in enumerate(work):
        live.add(n)
        live = {v for v in live if last_use[v] > t}
        if t < n_placeholders - 1 or t == len(work) - 1:
            continue
        if len(live) == 1:
            (out,) = live
            body = [m for m in work[start:t + 1] if m.op != "placeholder"]
            if body:
                units.append(_Unit(body, prev_cut_inputs, out))
                prev_cut_inputs = [out]
                start = t + 1
            elif not prev_cut_inputs:
                prev_cut_inputs = [out]
                start = t + 1
    tail = [m for m in work[start:] if m.op != "placeholder"]
    if tail:
        units.append(_Unit(tail, prev_cut_inputs, None))
    return units


def profile_units(module: torch.nn.Module, example_inputs: Any) -> tuple[fx.GraphModule, list[_Unit], list[Unit]]:
    """Trace `module`, measure its nodes on `example_inputs`, and return (graph module, fx units, cost units)."""
    try:
        gm = fx.symbolic_trace(module)
    except Exception as e:
        raise UnsupportedError(f"memory_budget needs a module torch.fx can trace; tracing "
                               f"{type(module).__name__} failed: {e}") from e
    args = _as_tuple(example_inputs)
    prof = _Profiler(gm)
    with _frozen_buffers(gm), torch.enable_grad():
        prof.run(*args)
    prof.keep.clear()
    saved = prof.saved
    units = _cut_units(gm)
    cost_units = []
    for k, u in enumerate(units):
        name = f"{u.nodes[0].name}..{u.nodes[-1].name}" if len(u.nodes) > 1 else u.nodes[0].name
        cost_units.append(Unit(
            name=name,
            saved=sum(saved.get(n, 0) for n in u.nodes),
            input=sum(prof.out_bytes.get(v, 0) for v in u.inputs),
            cost=sum(prof.flops.get(n, 0.0) for n in u.nodes),
            # a segment needs its inputs (known) and one output tensor; the first unit's inputs may be
            # the model's inputs, which exist anyway
            checkpointable=u.output is not None and bool(u.inputs)))
    return gm, units, cost_units


# ------------------------------------------------------------------------------------------------
# building the checkpointed module
# ------------------------------------------------------------------------------------------------
class CheckpointedSegment(torch.nn.Module):
    """Runs `inner` under torch.utils.checkpoint (non-reentrant): its activations are recomputed in the
    backward pass instead of kept. Batch-norm running statistics are restored after the recompute."""

    def __init__(self, inner: fx.GraphModule):
        super().__init__()
        self.inner = inner

    def _recompute_context(self):
        norms = [m for m in self.inner.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]

        @contextlib.contextmanager
        def restore():
            saved = [[b.detach().clone() for b in m.buffers()] for m in norms]
            try:
                yield
            finally:
                with torch.no_grad():
                    for m, bufs in zip(norms, saved):
                        for b, s in zip(m.buffers(), bufs):
                            b.copy_(s)

        return contextlib.nullcontext(), restore()

    def forward(self, *args):
        if not torch.is_grad_enabled():
            return self.inner(*args)
        return checkpoint(self.inner, *args, use_reentrant=False, context_fn=self._recompute_context)


def _build(gm: fx.GraphModule, units: list[_Unit], segments: Sequence[tuple[int, int]]) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    skip: set[fx.Node] = set()
    seg_of_first_node = {}
    for k, (a, b) in enumerate(segments):
        nodes = [n for u in units[a:b + 1] for n in u.nodes]
        seg_of_first_node[nodes[0]] = (k, a, b, nodes)
    for n in gm.graph.nodes:
        if n in skip:
            continue
        if n in seg_of_first_node:
            k, a, b, nodes = seg_of_first_node[n]
            inputs = units[a].inputs
            inner = _segment_module(gm, nodes, inputs, units[b].output)
            name = f"aiacc_checkpoint_{k}"
            gm.add_submodule(name, CheckpointedSegment(inner))
            env[units[b].output] = graph.call_module(name, tuple(env[v] for v in inputs))
            skip.update(nodes)
            continue
        env[n] = graph.node_copy(n, lambda m: env[m])
    gm.graph = graph
    gm.recompile()
    return gm


def _segment_module(gm: fx.GraphModule, nodes: list[fx.Node], inputs: list[fx.Node], output: fx.Node) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for v in inputs:
        env[v] = graph.placeholder(v.name)
    members = set(nodes)

    def arg(m: fx.Node) -> fx.Node:
        if m not in env:
            if m.op != "get_attr" or m in members:
                raise UnsupportedError(f"checkpoint segment reads %{m.name} from outside its inputs")
            env[m] = graph.get_attr(m.target)
        return env[m]

    for n in nodes:
        env[n] = graph.node_copy(n, arg)
    graph.output(env[output])
    return fx.GraphModule(gm, graph)  # shares gm's submodules and parameters


def plan_training_memory(module: torch.nn.Module, example_inputs: Any, memory_budget: int) -> torch.nn.Module:
    """A module computing what `module` computes, whose training step keeps at most `memory_budget` bytes
    of activations (aiacc's estimate, from one profiling run on `example_inputs`) at the least recompute.

    The returned fx.GraphModule shares the original's parameters; its `aiacc_memory_plan` attribute is the
    `CheckpointPlan` (segments, estimated memory, recompute fraction). Raises MemoryBudgetError naming the
    smallest achievable figure when no plan fits, UnsupportedError when torch.fx cannot trace the module.
    """
    t0 = time.perf_counter()
    if memory_budget is None or memory_budget <= 0:
        raise MemoryBudgetError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}", 0)
    gm, units, cost_units = profile_units(module, example_inputs)
    try:
        plan: CheckpointPlan = plan_checkpoints(cost_units, int(memory_budget))
    except MemoryBudgetError as e:
        raise MemoryBudgetError(f"{type(module).__name__}: {e}", e.smallest) from None
    out = _build(gm, units, plan.segments)
    plan.notes.append(f"planned in {time.perf_counter() - t0:.2f} s")
    out.aiacc_memory_plan = plan
    return out


# ------------------------------------------------------------------------------------------------
# measuring a training step
# ------------------------------------------------------------------------------------------------
def _allocations(fn) -> tuple[int, int]:
    """Run fn under the profiler; (peak, final) of CPU bytes allocated minus freed during it."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    cur = peak = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak, cur


def measure_training_memory(module: torch.nn.Module, example_inputs: Any, loss_fn=None) -> dict[str, int]:
    """Measure one training step with the CPU allocator's counters (torch profiler memory events).

    Returns {"held": bytes allocated by the forward pass and still held when it ends (activations kept
    for backward, plus the loss), "peak": the highest allocation above the start over forward and
    backward}. Gradients are allocated by a warm-up step first, so they do not count.
    """
    args = _as_tuple(example_inputs)
    loss_fn = loss_fn or (lambda out: out.float().pow(2).mean() if isinstance(out, torch.Tensor)
                          else sum(o.float().pow(2).mean() for o in out))
    state = {k: b.detach().clone() for k, b in module.named_buffers()}
    loss_fn(module(*args)).backward()  # warm-up: allocates .grad
    result: dict[str, Any] = {}

    def forward():
        result["loss"] = loss_fn(module(*args))

    def backward():
        result.pop("loss").backward()

    fwd_peak, held = _allocations(forward)
    bwd_peak, _ = _allocations(backward)
    for p in module.parameters():
        if p.grad is not None:
            p.grad = None
    with torch.no_grad():
        for k, b in module.named_buffers():
            b.copy_(state[k])
    return {"held": int(held), "peak": int(max(fwd_peak, held + bwd_peak))}
