"""Run an IR graph in onnxruntime, handing the nodes onnxruntime cannot run (opaque nodes) back to the
framework between onnxruntime segments.

Plugins wrap an `OrtGraphRunner` in a model of their own kind (torch nn.Module, tf.Module, Gluon Block,
CaffeModel). On the CPU provider, numpy inputs are passed to onnxruntime without a copy and outputs come
back as numpy arrays that torch/TF/MXNet can wrap without a copy.

Execution providers (`select_providers`): by default CUDA where onnxruntime has it (the `onnxruntime-gpu`
wheel, extra `gpu`), then CPU; TensorRT only when asked for (it builds an engine per session, which takes
minutes; engines are cached under $AIACC_TRT_CACHE, default ~/.cache/aiacc/tensorrt). An explicit
`providers=` (names, short names "tensorrt"/"cuda"/"cpu", or (name, options) pairs) is honoured in its
order; a provider onnxruntime lacks is dropped with a warning, and CPU is always last, so a node the
accelerator has no kernel for runs on the CPU inside the same session: those nodes are reported
(`OrtGraphRunner.cpu_nodes`, and warned) from onnxruntime's own assignment record.

`run_bound` runs with io-binding: inputs are bound from DLPack objects (torch tensors, CUDA or CPU) or
OrtValues without a copy, every segment's outputs stay on the session's device as OrtValues, and only
opaque nodes (run by the framework on numpy) cross to the host.
"""
from __future__ import annotations

import os
from typing import Callable, Mapping, Sequence

import numpy as np

from aiacc.core.ir import Graph, Node
from aiacc.core.partition import Segment, partition
from aiacc.errors import KernelError, UnsupportedError, fallback, first_line


_SHORT = {"tensorrt": "TensorrtExecutionProvider", "trt": "TensorrtExecutionProvider",
          "cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}
_CPU = "CPUExecutionProvider"
_ACCELERATORS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")  # their memory is the CUDA device's


def _tensorrt_options() -> dict:
    """TensorRT EP defaults: engines and timing caches on disk (an engine build takes minutes); fp16 is not
    turned on (trt_fp16_enable): the graph's own precision is kept."""
    cache = os.environ.get("AIACC_TRT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "aiacc",
                                                                   "tensorrt")
    return {"trt_engine_cache_enable": "True", "trt_engine_cache_path": cache, "trt_timing_cache_enable": "True",
            "trt_timing_cache_path": cache}


def select_providers(requested=None, available: Sequence[str] | None = None) -> list:
    """The providers (names, or (name, options) pairs as onnxruntime takes them) for a session.

    requested None: CUDA first where `available` (default: onnxruntime's) has it, then CPU. Otherwise
    the requested ones in their order (short names "tensorrt", "trt", "cuda", "cpu" accepted): one that is
    not available is dropped with a warning; CPU is appended when missing, so nodes the accelerator cannot
    run fall back to the CPU. TensorRT gets an on-disk engine cache unless options are given."""
    if available is None:
        import onnxruntime as ort

        available = ort.get_available_providers()
    available = list(available)
    if requested is None:
        return [p for p in ("CUDAExecutionProvider", _CPU) if p in available]
    if isinstance(requested, (str, tuple)):
        requested = [requested]
    chosen, missing, seen = [], [], set()
    for item in requested:
        name, options = (item if isinstance(item, tuple) else (item, None))
        if not isinstance(name, str) or (options is not None and not isinstance(options, dict)):
            raise UnsupportedError(f"providers=: {item!r} is neither a provider name nor a (name, options) pair")
        name = _SHORT.get(name.lower(), name)
        if name in seen:
            continue
        seen.add(name)
        if name not in available:
            missing.append(name)
            continue
        if options is None and name == "TensorrtExecutionProvider":
            options = _tensorrt_options()
        chosen.append(name if options is None else (name, options))
    if missing:
        fallback(f"onnxruntime-providers:{','.join(missing)}",
                 f"onnxruntime has no {', '.join(missing)} here (available: {', '.join(available)}); running "
                 f"without {'it' if len(missing) == 1 else 'them'}"
                 + (" (install aiacc[gpu]: onnxruntime-gpu)" if set(missing) & set(_ACCELERATORS) else ""))
    if _CPU not in seen and _CPU in available:
        chosen.append(_CPU)
    if not chosen:
        raise UnsupportedError(f"none of the requested onnxruntime providers {missing} is available "
                               f"(available: {', '.join(available)})")
    return chosen


def provider_names(providers: Sequence) -> list[str]:
    """The names of a providers list that may hold (name, options) pairs."""
    return [p[0] if isinstance(p, tuple) else p for p in providers]


def default_providers() -> list[str]:
    """CUDA first where onnxruntime has it, then CPU."""
    return select_providers(None)


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
                 run_opaque: Callable[[Node, list], list] | None = None, spinning: bool = False,
                 fusions: bool = True):
        """intra_op_threads: threads per session (0: the CPUs this process may use). spinning: let idle
        onnxruntime workers busy-wait for the next op (onnxruntime's default). Off by default: the host
        framework's own threads (and the other segments' sessions) share the cores with them, and on a
        busy machine spinning workers and onnxruntime's default pinning of one worker per core slowed
        ResNet-50 3-4x (benchmarks/inference.py); on an idle machine spinning gains about 5% (spinning
        only inside a run, session.force_spinning_stop, measured no faster interleaved with torch models
        on 2 cores: BERT-small 11.8 vs 11.4 ms).
        fusions: on CPU sessions, write each multi-head attention as onnxruntime's fused kernel
        (aiacc.backends.ort_fusions; `fused_ops` counts them); a segment whose fused form onnxruntime
        refuses runs unfused (warned)."""
        try:
            import onnxruntime as ort
        except ImportError as e:
            raise UnsupportedError("backend='onnxruntime' needs the onnxruntime package "
                                   "(pip install -c constraints.txt onnxruntime)") from e
        from aiacc.core.onnx import to_onnx

        self.graph = graph
        self._providers = select_providers(providers or None)  # as onnxruntime takes them (options kept)
        self.providers = provider_names(self._providers)
        # where the sessions' inputs and outputs live with io-binding (run_bound)
        self.device = ("cuda", 0) if set(self.providers) & set(_ACCELERATORS) else ("cpu", 0)
        for name, opts in (p for p in self._providers if isinstance(p, tuple)):
            if "device_id" in opts:
                self.device = (self.device[0], int(opts["device_id"]))
        self.cpu_nodes: list[str] = []  # nodes onnxruntime placed on the CPU although an accelerator was asked for
        self.run_opaque = run_opaque or _run_meta_kernel
        # an op with side effects (a value guard) has no ONNX form: it runs on aiacc's kernel between sessions
        self.segments: list[Segment] = partition(graph, supported=lambda n: n.schema is not None
                                                 and not n.schema.side_effects)
        self.sessions: list = []
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # an explicit thread count also stops onnxruntime from pinning each worker to one core, so a
        # worker whose core is busy (framework threads, other processes) can move to a free one
        options.intra_op_num_threads = intra_op_threads or _usable_cpus()
        if not spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        if self.device[0] != "cpu":  # record which provider runs each node, to report CPU fallbacks
            options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        self._ort, self._options, self._to_onnx = ort, options, to_onnx
        self.fusions = fusions and self.device[0] == "cpu"  # the fused kernels are checked on CPU only
        self.fused_ops: dict[str, int] = {}  # com.microsoft kernel -> how many the sessions run
        self.fallback_nodes: list[str] = []  # nodes onnxruntime could not build, run on aiacc's kernels
        self._fused_graphs: set[int] = set()  # id() of the segment graphs whose session runs the fused form
        segments, self.segments = self.segments, []
        for seg in segments:
            self._add_segment(seg)
        self.constants = {name: v.const for name, v in graph.initializers.items()}
        self.input_names = [v.name for v in graph.inputs]
        self.output_names = [v.name for v in graph.outputs]
        if self.cpu_nodes:
            fallback(f"onnxruntime-cpu-nodes:{','.join(self.cpu_nodes)}",
                     f"onnxruntime runs {len(self.cpu_nodes)} node(s) on the CPU, not on {self.providers[0]} "
                     f"(no kernel there): {', '.join(self.cpu_nodes[:20])}"
                     + (" ..." if len(self.cpu_nodes) > 20 else ""))

    def _session(self, graph: Graph):
        """An onnxruntime session for a segment, or None when onnxruntime refuses it (e.g. no kernel for
        an op at these dtypes). With `fusions`, attention is written as onnxruntime's fused kernels first;
        a fused form onnxruntime refuses is built without them."""
        model = self._to_onnx(graph)
        if self.fusions:
            from aiacc.backends.ort_fusions import fuse_attention

            counts = {k: v for k, v in fuse_attention(model).items() if v}
            if counts:
                try:
                    sess = self._ort.InferenceSession(model.SerializeToString(), self._options,
                                                      providers=self._providers)
                except Exception as e:  # noqa: BLE001 - onnxruntime's own exception types
                    fallback("onnxruntime-fusions", f"onnxruntime refused its fused attention kernels "
                             f"({', '.join(counts)}) in graph {graph.name}: {first_line(e)}; running the "
                             f"attention unfused")
                    model = self._to_onnx(graph)
                else:
                    for k, v in counts.items():
                        self.fused_ops[k] = self.fused_ops.get(k, 0) + v
                    self._fused_graphs.add(id(graph))
                    return sess
        try:
            return self._ort.InferenceSession(model.SerializeToString(), self._options, providers=self._providers)
        except Exception:  # onnxruntime raises its own exception types (NotImplemented, Fail, InvalidGraph)
            return None

    def segment_models(self):
        """The ONNX model of each onnxruntime segment, built again as its session was (attention fused where
        the session runs it fused), in segment order: for profiling or inspecting what the sessions run."""
        from aiacc.backends.ort_fusions import fuse_attention

        for seg, sess in zip(self.segments, self.sessions):
            if sess is not None:
                model = self._to_onnx(seg.graph)
                if id(seg.graph) in self._fused_graphs:
                    fuse_attention(model)
                yield model

    def optimized_ops(self) -> dict[str, int]:
        """How many nodes of each op type ("Attention", "SkipLayerNormalization", "Gemm" ...) the sessions run
        after onnxruntime's own graph optimizations (at this runner's level), read from the graph onnxruntime
        saves (optimized_model_filepath) for each of `segment_models`: checks that a fused kernel survives
        onnxruntime's optimizers. It builds a second session per segment, so it is slow."""
        import collections
        import tempfile

        import onnx

        counts: collections.Counter = collections.Counter()
        with tempfile.TemporaryDirectory(prefix="aiacc-ort-opt-") as tmp:
            for i, model in enumerate(self.segment_models()):
                options = self._ort.SessionOptions()
                options.graph_optimization_level = self._options.graph_optimization_level
                options.intra_op_num_threads = 1
                options.optimized_model_filepath = path = os.path.join(tmp, f"segment{i}.onnx")
                self._ort.InferenceSession(model.SerializeToString(), options, providers=self._providers)
                counts.update(n.op_type for n in onnx.load(path).graph.node)
        return dict(counts)

    def _record_placement(self, sess) -> None:
        """Add the nodes onnxruntime assigned to the CPU provider (an accelerator was asked for) to cpu_nodes."""
        if self.device[0] == "cpu":
            return
        try:
            subgraphs = sess.get_provider_graph_assignment_info()
        except Exception:  # an onnxruntime without the assignment record (before 1.23) or with it off
            return
        for sub in subgraphs:
            if sub.ep_name == _CPU:
                self.cpu_nodes += [f"{n.name} ({n.op_type})" for n in sub.get_nodes()
                                   if not n.op_type.startswith("Memcpy")]

    def _add_segment(self, seg: Segment) -> None:
        """Append a segment with its session; a segment onnxruntime refuses is split so that only the
        nodes it cannot build fall back to aiacc's reference kernels."""
        if seg.graph is None:
            self.segments.append(seg)
            self.sessions.append(None)
            return
        sess = self._session(seg.graph)
        if sess is not None:
            self._record_placement(sess)
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

    # -------------------------------------------------------------------------------- io-binding
    def to_ortvalue(self, x) -> "object":
        """An OrtValue for an input: an OrtValue as it is; a numpy array or any DLPack object (a torch tensor
        on CPU or CUDA) sharing its memory (no copy); anything else through numpy."""
        ort = self._ort
        if isinstance(x, ort.OrtValue):
            return x
        if isinstance(x, np.ndarray):
            return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x))
        if hasattr(x, "__dlpack__"):
            if hasattr(ort.OrtValue, "from_dlpack"):
                return ort.OrtValue.from_dlpack(x)
            # onnxruntime before OrtValue.from_dlpack: the binding's own entry point takes a capsule
            from onnxruntime.capi import _pybind_state as C

            try:  # (capsule, is_bool) in the releases that had it; (capsule) in later ones
                c = C.OrtValue.from_dlpack(x.__dlpack__(), str(getattr(x, "dtype", "")).endswith("bool"))
            except TypeError:
                c = C.OrtValue.from_dlpack(x.__dlpack__())
            return ort.OrtValue(c)
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(np.asarray(x)))

    def _on_device(self, array: np.ndarray):
        return self._ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), *self.device)

    def run_bound(self, feeds: Mapping[str, object]) -> list:
        """Outputs (OrtValues on `self.device`) in graph-output order, every onnxruntime segment run with
        io-binding: inputs bound where they are (see to_ortvalue), outputs allocated by onnxruntime on the
        session's device and handed to the next segment as they are. Opaque nodes get numpy copies."""
        device_type, device_id = self.device
        env: dict = {name: self.to_ortvalue(x) for name, x in feeds.items()}
        for seg, sess in zip(self.segments, self.sessions):
            if sess is not None:
                binding = sess.io_binding()
                for name in seg.input_names:
                    binding.bind_ortvalue_input(name, env[name])
                for name in seg.output_names:
                    binding.bind_output(name, device_type, device_id)
                binding.synchronize_inputs()
                sess.run_with_iobinding(binding)
                binding.synchronize_outputs()
                env.update(zip(seg.output_names, binding.get_outputs()))
            else:
                node = seg.node
                args = [None if v is None else (v.const if v.is_constant else env[v.name].numpy())
                        for v in node.inputs]
                schema = node.schema
                outs = schema.run(node, args) if schema is not None else self.run_opaque(node, args)
                env.update((name, self._on_device(np.asarray(o))) for name, o in zip(seg.output_names, outs))
        return [env[name] if name in env else self._on_device(self.constants[name]) for name in self.output_names]
