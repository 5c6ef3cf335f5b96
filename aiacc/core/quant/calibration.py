"""Calibration: activation ranges measured on the user's inputs.

Every float activation the int8 plan may quantize is observed on every calibration sample: its exact
min/max and a bounded random sample of its values. A range is then chosen per tensor among the candidates
(min/max, percentiles, entropy/KL) by the error it causes on the observed values (mean squared
quantize-dequantize error), so a tensor with rare outliers gets a clipped range and a tensor without keeps
its full range.

The tensors are observed by a `RunFn`: the reference executor by default (`reference_run`); a backend may
pass a faster one (aiacc.backends.quant.ort_run runs onnxruntime with the tensors as extra outputs).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from aiacc.core.ir import Graph, Node
from aiacc.core.runtime.executor import Interpreter, check_inputs
from aiacc.errors import AiaccError, ShapeError

# run(graph, feeds, names) -> {name: array} for the graph outputs and every value named in `names`
RunFn = Callable[[Graph, Mapping[str, np.ndarray], Sequence[str]], dict[str, np.ndarray]]

SAMPLE_PER_BATCH = 4096  # values kept per tensor per calibration sample (bounded memory)
PERCENTILES = (99.9, 99.99, 99.999)
FLOATS = ("float32", "float64", "float16")


class _Observer(Interpreter):
    def __init__(self, graph: Graph, names: Sequence[str]):
        super().__init__(graph)
        self.want = set(names)
        self.seen: dict[str, np.ndarray] = {}

    def after_node(self, node: Node, pos: int, env: dict[int, np.ndarray]) -> None:
        for v in node.outputs:
            if v.name in self.want and id(v) in env:
                self.seen[v.name] = env[id(v)]


def reference_run(graph: Graph, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
    """Run `graph` on the reference executor; the outputs and every value in `names`, by name."""
    obs = _Observer(graph, names)
    outs = obs.run(feeds, validate=False)
    seen = dict(obs.seen)
    for v in graph.inputs:
        if v.name in obs.want:
            seen[v.name] = np.asarray(feeds[v.name])
    seen.update(outs)
    return seen


def check_calibration(graph: Graph, samples: Iterable[Mapping[str, Any]], what: str = "calibration") -> list[dict]:
    """The calibration samples (feeds keyed by graph input name) validated against the graph's inputs:
    an aiacc ShapeError naming the sample, the input and the expected shape/dtype when one does not fit,
    and when there is no sample at all."""
    out = []
    for i, feeds in enumerate(samples):
        try:
            out.append(check_inputs(graph, feeds))
        except ShapeError as e:
            raise ShapeError(f"{what} sample {i}: {e}") from e
    if not out:
        raise ShapeError(f"the {what} data is empty: int8 needs at least one input sample to measure "
                         f"activation ranges (calibration=[inputs, ...], each like the example inputs)")
    return out


@dataclass
class TensorStats:
    """What calibration saw of one tensor."""

    min: float = np.inf
    max: float = -np.inf
    samples: list[np.ndarray] = field(default_factory=list)

    def observe(self, a: np.ndarray, rng: np.random.Generator) -> None:
        a = np.asarray(a, dtype=np.float32).ravel()
        if a.size == 0:
            return
        self.min = min(self.min, float(a.min()))
        self.max = max(self.max, float(a.max()))
        self.samples.append(a if a.size <= SAMPLE_PER_BATCH else a[rng.integers(0, a.size, SAMPLE_PER_BATCH)])

    def values(self) -> np.ndarray:
        """The kept sample (uniform over all observed values, so percentiles and errors are estimates)."""
        return np.concatenate(self.samples) if self.samples else np.zeros(1, np.float32)


def observe(graph: Graph, feeds_list: Sequence[Mapping[str, np.ndarray]], names: Sequence[str],
            run: RunFn | None = None, seed: int = 0) -> tuple[dict[str, TensorStats], list[dict[str, np.ndarray]]]:
    """Statistics of the tensors `names` over the calibration feeds, and the graph's outputs per sample
    (the float reference the plan is measured against)."""
    run = run or reference_run
    rng = np.random.default_rng(seed)
    stats = {n: TensorStats() for n in names}
    outputs = []
    out_names = [v.name for v in graph.outputs]
    for feeds in feeds_list:
        seen = run(graph, feeds, list(names))
        for n in names:
            if n in seen:
                stats[n].observe(seen[n], rng)
        outputs.append({n: seen[n] for n in out_names})
    return stats, outputs


# --------------------------------------------------------------------------------------------- ranges
QMIN, QMAX = 0, 255  # activations are uint8 (onnxruntime's fast x86 form is u8 activations x s8 weights)


def scale_zero_point(lo: float, hi: float) -> tuple[np.float32, np.uint8]:
    """Asymmetric uint8 parameters for [lo, hi] (widened to include 0, so zero is exact)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / (QMAX - QMIN)
    if not np.isfinite(scale) or scale <= 0:
        scale = 1.0
    zp = int(np.clip(round(QMIN - lo / scale), QMIN, QMAX))
    return np.float32(scale), np.uint8(zp)


def fake_quant(x: np.ndarray, scale: float, zp: int) -> np.ndarray:
    """x quantized to uint8 and back (what a QuantizeLinear/DequantizeLinear pair computes)."""
    return ((np.clip(np.rint(x / scale) + zp, QMIN, QMAX) - zp) * scale).astype(np.float32)


def _entropy_range(values: np.ndarray, lo: float, hi: float, bins: int = 2048) -> tuple[float, float]:
    """TensorRT-style KL calibration on |x| (one-sided for non-negative tensors): the clip threshold whose
    128-level quantized histogram is closest (KL divergence) to the observed one."""
    nonneg = lo >= 0
    mags = values if nonneg else np.abs(values)
    top = float(mags.max()) if mags.size else 0.0
    if top <= 0:
        return lo, hi
    hist, edges = np.histogram(mags, bins=bins, range=(0, top))
    hist = hist.astype(np.float64)
    levels = 256 if nonneg else 128
    best, best_kl = bins, np.inf
    for i in range(levels, bins + 1, 16):
        p = hist[:i].copy()
        p[-1] += hist[i:].sum()
        if p.sum() == 0:
            continue
        # q: the first i bins merged into `levels` levels, each level's mass spread over its non-empty bins
        starts = np.linspace(0, i, levels + 1).astype(np.int64)[:-1]
        nonzero = (hist[:i] > 0).astype(np.float64)
        mass = np.add.reduceat(hist[:i], starts)
        count = np.add.reduceat(nonzero, starts)
        lengths = np.diff(np.append(starts, i))
        q = np.repeat(np.where(count > 0, mass / np.maximum(count, 1), 0.0), lengths) * nonzero
        pn, qn = p / p.sum(), q / max(q.sum(), 1e-12)
        mask = pn > 0
        kl = float(np.sum(pn[mask] * np.log(pn[mask] / np.maximum(qn[mask], 1e-12))))
        if kl < best_kl:
            best, best_kl = i, kl
    t = float(edges[best])
    return (0.0, t) if nonneg else (max(lo, -t), min(hi, t))


@dataclass
class Range:
    """The chosen range of one tensor and why."""

    lo: float
    hi: float
    method: str  # "minmax", "percentile99.99", "entropy", ...
    mse: float  # quantize-dequantize mean squared error on the observed values
    scale: np.float32 = np.float32(1)
    zero_point: np.uint8 = np.uint8(0)


def choose_range(stats: TensorStats, methods: Sequence[str] = ("minmax", "percentile", "entropy")) -> Range:
    """The candidate range with the least quantization error on the tensor's observed values."""
    values = stats.values()
    cands: list[tuple[str, float, float]] = []
    if "minmax" in methods:
        cands.append(("minmax", stats.min, stats.max))
    if "percentile" in methods:
        for p in PERCENTILES:
            lo = float(np.percentile(values, 100 - p)) if stats.min < 0 else stats.min
            cands.append((f"percentile{p}", lo, float(np.percentile(values, p))))
    if "entropy" in methods:
        try:
            lo, hi = _entropy_range(values, stats.min, stats.max)
            cands.append(("entropy", lo, hi))
        except (ValueError, FloatingPointError):  # degenerate histogram: the other candidates stand
            pass
    if not cands:
        raise AiaccError(f"no calibration method among {list(methods)} (known: minmax, percentile, entropy)")
    best = None
    for name, lo, hi in cands:
        scale, zp = scale_zero_point(lo, hi)
        mse = float(np.mean((fake_quant(values, float(scale), int(zp)) - values) ** 2))
        if best is None or mse < best.mse:
            best = Range(lo, hi, name, mse, scale, zp)
    return best
