"""Run an IR graph in onnxruntime, handing the nodes onnxruntime cannot run (opaque nodes) back to the
framework between onnxruntime segments.

Plugins wrap an `OrtGraphRunner` in a model of their own kind (torch nn.Module, tf.Module, Gluon Block,
CaffeModel). On the CPU provider, numpy inputs are passed to onnxruntime without a copy and outputs come
back as numpy arrays that torch/TF/MXNet can wrap without a copy.
"""
from __future__ import annotations

import os
from typing import Callable, Mapping, Sequence

import numpy as np

from aiacc.core.ir import Graph, Node
from aiacc.core.partition import Segment, partition
from aiacc.errors import KernelError, UnsupportedError, fallback


def default_providers() -> list[str]:
    """CUDA first where onnxruntime has it, then CPU."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


# threads per onnxruntime session when the caller gives none (None: the CPUs this process may use);
# benchmarks set it to compare runtimes at one thread count
DEFAULT_THREADS: int | None = None


def _usable_cpus() -> int:
    if DEFAULT_THREADS:
        return DEFAULT_THREADS
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _run_meta_kernel(node: Node, arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    kernel = node.meta.get("kernel")
    if kernel is None:
        raise KernelError(f"no kernel for {node.domain or 'ai.onnx'}::{node.op} at node {node.name}: onnxruntime "
                          f"cannot run it and the plugin attached no framework callable")
    out = kernel(*arrays)
    return [np.asarray(o) for o in out] if isinstance(out, (tuple, list)) else [np.asarray(out)]


class OrtGraphRunner:
    """onnxruntime sessions for each supported run of `graph`; opaque nodes run through `run_opaque`."""

    def __init__(self, graph: Graph, *, providers: Sequence[str] | None = None, intra_op_threads: int = 0,
                 run_opaque: Callable[[Node, list], list] | None = None, spinning: bool = False):
        """intra_op_threads: threads per session (0: the CPUs this process may use). spinning: let idle
        onnxruntime workers busy-wait for the next op (onnxruntime's default). Off by default: the host
        framework's own threads (and the other segments' sessions) share the cores with them, and on a
        busy machine spinning workers and onnxruntime's default pinning of one worker per core slowed
        ResNet-50 3-4x (benchmarks/inference.py); on an idle machine spinning gains about 5%."""
        try:
            import onnxruntime as ort
        except ImportError as e:
            raise UnsupportedError("backend='onnxruntime' needs the onnxruntime package "
                                   "(pip install -c constraints.txt onnxruntime)") from e
        from aiacc.core.onnx import to_onnx

        self.graph = graph
        self.providers = list(providers or default_providers())
        self.run_opaque = run_opaque or _run_meta_kernel
        self.segments: list[Segment] = partition(graph, supported=lambda n: n.schema is not None)
        self.sessions: list = []
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # an explicit thread count also stops onnxruntime from pinning each worker to one core, so a
        # worker whose core is busy (framework threads, other processes) can move to a free one
        options.intra_op_num_threads = intra_op_threads or _usable_cpus()
        if not spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        self._ort, self._options, self._to_onnx = ort, options, to_onnx
        self.fallback_nodes: list[str] = []  # nodes onnxruntime could not build, run on aiacc's kernels
        segments, self.segments = self.segments, []
        for seg in segments:
            self._add_segment(seg)
        self.constants = {name: v.const for name, v in graph.initializers.items()}
        self.input_names = [v.name for v in graph.inputs]
        self.output_names = [v.name for v in graph.outputs]

    def _session(self, graph: Graph):
        """An onnxruntime session for a segment, or None when onnxruntime refuses it (e.g. no kernel for
        an op at these dtypes)."""
        try:
            return self._ort.InferenceSession(self._to_onnx(graph).SerializeToString(), self._options,
                                              providers=self.providers)
        except Exception:  # onnxruntime raises its own exception types (NotImplemented, Fail, InvalidGraph)
            return None

    def _add_segment(self, seg: Segment) -> None:
        """Append a segment with its session; a segment onnxruntime refuses is split so that only the
        nodes it cannot build fall back to aiacc's reference kernels."""
        if seg.graph is None:
            self.segments.append(seg)
            self.sessions.append(None)
            return
        sess = self._session(seg.graph)
        if sess is not None:
            self.segments.append(seg)
            self.sessions.append(sess)
            return
        refused = set()
        for node in seg.graph:
            single = [s for s in partition(seg.graph, supported=lambda n, node=node: n is node) if s.graph]
            if self._session(single[0].graph) is None:
                refused.add(node.name)
        if not refused:  # every node builds alone: the combination fails, so run each node on its own
            refused = {n.name for n in seg.graph}
        self.fallback_nodes += sorted(refused)
        fallback(f"onnxruntime:{','.join(sorted(refused))}", f"onnxruntime cannot run node(s) "
                 f"{', '.join(sorted(refused))}; they run on aiacc's reference kernels between onnxruntime segments")
        for sub in partition(seg.graph, supported=lambda n: n.name not in refused):
            if sub.graph is None:
                self.segments.append(sub)
                self.sessions.append(None)
            else:
                self._add_segment(sub)

    @property
    def num_opaque(self) -> int:
        return sum(1 for s in self.segments if s.node is not None)

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Outputs in graph-output order for numpy feeds keyed by graph input name."""
        env: dict[str, np.ndarray] = dict(feeds)
        for seg, sess in zip(self.segments, self.sessions):
            if sess is not None:
                ins = {name: np.ascontiguousarray(env[name]) for name in seg.input_names}
                outs = sess.run(seg.output_names, ins)
                env.update(zip(seg.output_names, outs))
            else:
                node = seg.node
                args = [None if v is None else (v.const if v.is_constant else env[v.name]) for v in node.inputs]
                schema = node.schema
                outs = schema.run(node, args) if schema is not None else self.run_opaque(node, args)
                env.update(zip(seg.output_names, outs))
        return [env[name] if name in env else self.constants[name] for name in self.output_names]
