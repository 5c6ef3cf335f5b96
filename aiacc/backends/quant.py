"""onnxruntime for the int8 planner (aiacc.core.quant): a run function that calibrates and measures plans
in onnxruntime (tens of times faster than the reference executor on real models, and it measures the
integer kernels the user will run), and the weight range onnxruntime's x86 kernels need on this CPU."""
from __future__ import annotations

import platform
from typing import Mapping, Sequence

import numpy as np

from aiacc.core.ir import Graph
from aiacc.core.quant.calibration import RunFn


def cpu_flags() -> set[str]:
    """The CPU feature flags Linux reports (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def has_int8_dot() -> bool:
    """Whether x86 int8 dot products accumulate without int16 saturation here (AVX-512 VNNI, AVX-VNNI or
    AMX); non-x86 CPUs (ARM sdot/udot) do not saturate."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return True
    return bool(cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"})


def weight_qmax() -> int:
    """127 where onnxruntime's u8 x s8 kernels accumulate exactly, 63 (7-bit weights, onnxruntime's
    reduce_range) on x86 without VNNI, whose vpmaddubsw saturates pairs of full-range products."""
    return 127 if has_int8_dot() else 63


def ort_run(threads: int | None = None) -> RunFn:
    """A RunFn on onnxruntime (aiacc.backends.onnxruntime.OrtGraphRunner: opaque nodes run their
    framework callables between segments). Sessions are cached per graph and requested tensors."""
    from aiacc.backends.onnxruntime import OrtGraphRunner

    cache: dict[tuple[int, tuple[str, ...]], tuple[Graph, OrtGraphRunner, list[str]]] = {}

    def run(graph: Graph, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
        key = (id(graph), tuple(names))
        if key not in cache:
            if len(cache) > 4:
                cache.pop(next(iter(cache)))
            g = graph
            extra = [n for n in names if n not in {v.name for v in graph.outputs}]
            if extra:
                g = graph.copy()
                inputs = {v.name for v in g.inputs}
                for n in extra:
                    if n not in inputs and g.has_value(n):
                        g.add_output(g.value(n))
            runner = OrtGraphRunner(g, intra_op_threads=threads or 0)
            cache[key] = (graph, runner, [v.name for v in g.outputs])
        _, runner, out_names = cache[key]
        outs = dict(zip(out_names, runner.run(feeds)))
        for v in graph.inputs:
            if v.name in names:
                outs[v.name] = np.asarray(feeds[v.name])
        return outs

    return run
