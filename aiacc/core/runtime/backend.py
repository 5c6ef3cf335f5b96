"""aiacc's own runtime (backend="aiacc"): the IR executed by aiacc, every intermediate in one planned arena.

    rt = AiaccRuntime(graph)            # plans lazily, per binding of the graph's symbolic dims
    outs = rt.run({"x": x})             # [array per graph output], in graph.outputs order
    outs = run(graph, {"x": x})         # {output name: array}, like aiacc.core.run

What runs where:
  - aiacc::FusedElementwise nodes: their numba kernel (`aiacc.core.runtime.numba_kernels.compile_fused_node`)
    writing straight into the node's arena slot (`out=`), or over the input it takes over in place;
  - every other node: the arena's into-kernels (numpy `out=`, BLAS matrix products for Conv / MatMul /
    Gemm), else its reference kernel, the result copied into its slot (`aiacc.core.runtime.arena`);
  - nodes whose outputs the arena cannot plan (an opaque node without static output types, and what
    depends on it): their reference kernels (or the opaque node's own callable) on freshly allocated
    arrays. This is a fallback: it is warned once (`aiacc.errors.fallback`) and listed in `report()`.

The arena is allocated once per input-shape binding and reused by every call (only outputs are copied out,
so a caller may keep them). Plans are kept for the last few bindings (`max_plans`).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Mapping

import numpy as np

from aiacc.core.ir import Graph, Node
from aiacc.core.memory import MemoryPlan, plan_memory
from aiacc.core.ops.fused import apply_activation
from aiacc.core.runtime.arena import INTO_KERNELS, ArenaInterpreter
from aiacc.core.runtime.executor import check_inputs
from aiacc.errors import KernelError, fallback


class AiaccInterpreter(ArenaInterpreter):
    """The arena interpreter with numba kernels for aiacc::FusedElementwise nodes (written into the arena)."""

    def __init__(self, graph: Graph, plan: MemoryPlan | None = None, *, dims: Mapping[str, int] | None = None,
                 numba: bool = True):
        super().__init__(graph, plan, dims=dims)
        self.numba_nodes: dict[int, Any] = {}  # id(node) -> compiled kernel
        self.numba_failed: dict[str, str] = {}  # node name -> why it runs its reference kernel instead
        if numba:
            self._compile()

    def _compile(self) -> None:
        try:
            from aiacc.core.runtime.numba_kernels import compile_fused_node
        except ImportError as e:  # the kernels module itself unavailable: every node runs its reference kernel
            for n in self.nodes:
                if n.domain == "aiacc" and n.op == "FusedElementwise":
                    self.numba_failed[n.name] = f"numba kernels unavailable: {e}"
            return
        for n in self.nodes:
            if n.domain != "aiacc" or n.op != "FusedElementwise" or "kernel" in n.meta:
                continue
            try:
                self.numba_nodes[id(n)] = compile_fused_node(n)
            except KernelError as e:
                self.numba_failed[n.name] = str(e)

    def run_node(self, node: Node, args: list[np.ndarray | None]) -> list[np.ndarray]:
        fn = self.numba_nodes.get(id(node))
        view = self.views.get(node.outputs[0].name) if node.outputs else None
        if fn is not None and view is not None and all(a is not None for a in args):
            try:
                with np.errstate(all="ignore"):
                    fn(*args, out=view)
            except KernelError as e:
                raise KernelError(f"node {node.name} (aiacc::FusedElementwise): {e}") from e
            return [view]
        table = FUSED_INTO if node.domain == "aiacc" else STANDARD_INTO if node.domain == "" else {}
        into = table.get(node.op) if "kernel" not in node.meta else None
        if into is not None and view is not None and len(node.outputs) == 1:
            with np.errstate(all="ignore"):
                try:
                    done = into(node, list(args), view)
                except Exception as e:  # noqa: BLE001
                    raise KernelError(f"node {node.name} ({node.qualified_op}) failed writing into its arena "
                                      f"slot: {e}") from e
            if done:
                return [view]
        return super().run_node(node, args)


# ------------------------------------------------------------------------------------------------
# aiacc's fused ops written into their arena slot: the standard op's into-kernel, then the epilogue in place
# ------------------------------------------------------------------------------------------------
def _activation_in_place(node: Node, out: np.ndarray) -> None:
    act = node.attr("activation", "") or ""
    if not act:
        return
    params = list(node.attr("activation_params") or [])
    if act == "Relu":
        np.maximum(out, out.dtype.type(0), out=out)
    elif act == "Clip":
        lo, hi = (params + [-np.inf, np.inf])[:2]
        np.clip(out, out.dtype.type(lo), out.dtype.type(hi), out=out)
    else:
        np.copyto(out, apply_activation(out, act, params))


#: patch-matrix elements of one convolution tile in the runtime (1 MiB of float32): the arena executor's
#: default (8192, for the smallest scratch) makes matrix products too small for BLAS to run at speed
RUNTIME_CONV_TILE = 1 << 18


def _conv(node: Node, args: list, out: np.ndarray) -> bool:
    return INTO_KERNELS["Conv"](node, args, out, RUNTIME_CONV_TILE)


def _fused_conv(node: Node, args: list, out: np.ndarray) -> bool:
    x, w = args[0], args[1]
    b = args[2] if len(args) > 2 else None
    residual = args[3] if len(args) > 3 else None
    if not INTO_KERNELS["Conv"](node, [x, w] + ([b] if b is not None else []), out, RUNTIME_CONV_TILE):
        return False
    if residual is not None:
        np.add(out, residual, out=out)
    _activation_in_place(node, out)
    return True


def _fused_gemm(node: Node, args: list, out: np.ndarray) -> bool:
    if any(a is not None and a.dtype != out.dtype for a in args):
        return False
    if not INTO_KERNELS["Gemm"](node, [a for a in args if a is not None], out):
        return False
    _activation_in_place(node, out)
    return True


def _fused_matmul(node: Node, args: list, out: np.ndarray) -> bool:
    a, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    if a.ndim < 2 or w.ndim != 2 or a.dtype != out.dtype or w.dtype != out.dtype:
        return False
    np.matmul(a, w, out=out)
    if bias is not None:
        np.add(out, bias, out=out)
    _activation_in_place(node, out)
    return True


#: aiacc-domain op -> a kernel writing into the output's arena view (False: it cannot, run the reference)
FUSED_INTO = {"FusedConv": _fused_conv, "FusedGemm": _fused_gemm, "FusedMatMul": _fused_matmul}
def _numba_window_kernels() -> dict:
    """The numba pooling / LRN into-kernels (aiacc.core.runtime.numba_nn), or none without numba (the
    arena's numpy kernels and the reference kernels run those ops then)."""
    try:
        from aiacc.core.runtime.numba_nn import lrn_into, pool_into
    except ImportError:
        return {}
    return {"MaxPool": pool_into, "AveragePool": pool_into, "LRN": lrn_into}


#: standard ops the runtime writes with its own settings (before the arena's into-kernels)
STANDARD_INTO = {"Conv": _conv, **_numba_window_kernels()}


class AiaccRuntime:
    """Runs one graph on aiacc's runtime. `run(feeds)` returns the outputs as a list in graph order (the
    interface of aiacc.backends.onnxruntime.OrtGraphRunner, so the plugins' wrappers take either)."""

    def __init__(self, graph: Graph, *, numba: bool = True, max_plans: int = 4, alignment: int = 64):
        self.graph = graph
        self.numba = numba
        self.max_plans = max_plans
        self.alignment = alignment
        self._interps: OrderedDict[tuple, AiaccInterpreter] = OrderedDict()
        self._lock = threading.Lock()  # one arena per binding: two threads must not run in it at once
        self.unplanned: list[str] = []  # values of the last plan left out of the arena
        self.plans_made = 0

    # -- planning ------------------------------------------------------------------------------------
    def bind(self, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
        """The graph's symbolic dimensions as the feeds bind them."""
        dims: dict[str, int] = {}
        for v in self.graph.inputs:
            a = feeds.get(v.name)
            if a is None or v.shape is None:
                continue
            for d, n in zip(v.shape, np.shape(a)):
                if isinstance(d, str):
                    dims.setdefault(d, int(n))
        return dims

    def interpreter(self, dims: Mapping[str, int]) -> AiaccInterpreter:
        """The interpreter (plan and arena) for one binding of the symbolic dims, made on first use."""
        key = tuple(sorted(dims.items()))
        interp = self._interps.get(key)
        if interp is not None:
            self._interps.move_to_end(key)
            return interp
        plan = plan_memory(self.graph, self.alignment, dims=dims, unplanned="skip")
        if plan.unplanned:
            names = ", ".join(f"%{n}" for n in plan.unplanned[:5]) + (" ..." if len(plan.unplanned) > 5 else "")
            fallback(f"aiacc-runtime-unplanned:{self.graph.name}",
                     f"backend='aiacc': {len(plan.unplanned)} values of graph {self.graph.name} have no static "
                     f"type, so the arena cannot hold them ({names}); their nodes run the reference kernels "
                     f"on freshly allocated arrays")
        interp = AiaccInterpreter(self.graph, plan, numba=self.numba)
        for name, why in interp.numba_failed.items():
            fallback(f"aiacc-runtime-numba:{name}",
                     f"backend='aiacc': node {name} runs its reference kernel, not numba ({why})")
        self.unplanned = list(plan.unplanned)
        self.plans_made += 1
        self._interps[key] = interp
        while len(self._interps) > self.max_plans:
            self._interps.popitem(last=False)
        return interp

    def forget(self, dims: Mapping[str, int]) -> None:
        """Drop the plan and arena of one binding (a caller that runs those shapes elsewhere)."""
        with self._lock:
            self._interps.pop(tuple(sorted(dims.items())), None)

    # -- running -------------------------------------------------------------------------------------
    def run_dict(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run the graph; {output name: array} (fresh arrays, not views of the arena)."""
        feeds = check_inputs(self.graph, inputs)
        with self._lock:
            interp = self.interpreter(self.bind(feeds))
            return interp.run(feeds, validate=False)

    def run(self, inputs: Mapping[str, Any]) -> list[np.ndarray]:
        """Run the graph; one array per graph output, in order."""
        outs = self.run_dict(inputs)
        return [outs[v.name] for v in self.graph.outputs]

    __call__ = run

    # -- what it did ---------------------------------------------------------------------------------
    @property
    def arena_bytes(self) -> int:
        """The arena of the most recently used binding (0 before the first run)."""
        return next(reversed(self._interps.values())).arena_bytes if self._interps else 0

    def report(self) -> dict[str, Any]:
        """What the runtime does for its most recent binding: arena size, numba nodes, fallbacks."""
        if not self._interps:
            return {"plans": 0}
        interp = next(reversed(self._interps.values()))
        plan = interp.plan
        return {
            "plans": self.plans_made,
            "dims": dict(plan.dims),
            "arena_bytes": plan.arena_bytes,
            "naive_bytes": plan.naive_bytes,
            "lower_bound_bytes": plan.lower_bound_bytes,
            "planned_values": len(plan.allocations),
            "unplanned_values": list(plan.unplanned),
            "numba_nodes": [n.name for n in interp.nodes if id(n) in interp.numba_nodes],
            "numba_fallbacks": dict(interp.numba_failed),
            "copied_last_run": interp.copied,
        }

    def __repr__(self) -> str:
        r = self.report()
        if not r.get("plans"):
            return f"<AiaccRuntime {self.graph.name}: not run yet>"
        return (f"<AiaccRuntime {self.graph.name}: arena {r['arena_bytes'] / (1 << 20):.2f} MiB "
                f"(naive {r['naive_bytes'] / (1 << 20):.2f}), {len(r['numba_nodes'])} numba nodes, "
                f"{len(r['unplanned_values'])} values outside the arena>")


def run(graph: Graph, inputs: Mapping[str, Any], *, numba: bool = True) -> dict[str, np.ndarray]:
    """Run `graph` once on aiacc's runtime (planned arena, numba kernels); returns {output name: array}.
    For repeated calls keep an `AiaccRuntime`: it plans and allocates the arena once."""
    return AiaccRuntime(graph, numba=numba).run_dict(inputs)


__all__ = ["AiaccRuntime", "AiaccInterpreter", "run"]
