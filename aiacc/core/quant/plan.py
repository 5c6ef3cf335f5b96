"""The int8 plan: calibrate, choose which layers run in int8, place Q/DQ, measure, and report.

    qgraph, report = quantize(graph, calibration_feeds, tolerance=0.05)

1. The graph's fused ops are written as the standard ops they stand for (the form int8 kernels exist
   for); every layer keeps a label: the original layer name (`layer1.0.conv1` is `layer1_0_conv1`).
2. Calibration observes every activation an int8 layer could read or write (calibration.py) and picks a
   range per tensor by measured error.
3. The plan quantizes every eligible layer (qdq.eligible) except the user's pins (keep_float). With
   keep_float=None ("auto") and a plan whose measured error misses the tolerance, the per-layer
   sensitivity (the output error each layer adds when it alone is quantized) decides: the worst layers are
   returned to float one at a time until the tolerance is met (at most MAX_AUTO_FLOAT of them).
4. The report lists the quantized and float layers (and why), each tensor's range and method, the
   sensitivity table when it was measured, and the measured error.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from aiacc.core.ir import Graph, Node
from aiacc.core.quant import qdq
from aiacc.core.quant.calibration import Range, RunFn, choose_range, observe, reference_run
from aiacc.errors import AiaccError, UnsupportedError

MAX_AUTO_FLOAT = 8  # layers the automatic plan may return to float before it gives up on the tolerance
SENSITIVITY_SAMPLES = 4  # calibration samples the per-layer sensitivity is measured on
DEFAULT_TOLERANCE = {"int8": 0.1, "bf16": 0.05, "fp16": 0.01}  # max relative (L2) output error


# ----------------------------------------------------------------------------------------- tolerance
@dataclass(frozen=True)
class Tolerance:
    """kind "rel": the largest relative L2 error ||q - f|| / ||f|| of any output on any sample must be
    <= value; kind "top1": the fraction of rows of the first output whose argmax (last axis) agrees must
    be >= value."""

    kind: str
    value: float

    def ok(self, score: float) -> bool:
        return score <= self.value if self.kind == "rel" else score >= self.value

    def describe(self, score: float) -> str:
        if self.kind == "rel":
            return f"max relative error {score:.4g} (tolerance {self.value:g})"
        return f"top-1 agreement {score:.4f} (required {self.value:g})"


def parse_tolerance(tolerance: Any, precision: str = "int8") -> Tolerance:
    """tolerance= as given to aiacc.optimize: a number (max relative error), {"top1": fraction} or
    {"rel": number}; None: the precision's default."""
    if tolerance is None:
        return Tolerance("rel", DEFAULT_TOLERANCE.get(precision, 0.1))
    if isinstance(tolerance, Tolerance):
        return tolerance
    if isinstance(tolerance, (int, float)) and not isinstance(tolerance, bool) and tolerance > 0:
        return Tolerance("rel", float(tolerance))
    if isinstance(tolerance, Mapping) and len(tolerance) == 1:
        (k, v), = tolerance.items()
        if k in ("top1", "rel") and isinstance(v, (int, float)) and 0 < v <= (1 if k == "top1" else np.inf):
            return Tolerance(k, float(v))
    raise UnsupportedError(f"tolerance={tolerance!r}: give a max relative error (a number > 0), "
                           f"{{'top1': fraction in (0, 1]}} or {{'rel': number}}")


def score(tol: Tolerance, got: Sequence[Sequence[np.ndarray]], want: Sequence[Sequence[np.ndarray]]) -> float:
    """The tolerance's measure of `got` against `want` (per sample, a list of outputs)."""
    if tol.kind == "top1":
        agree = total = 0
        for g, w in zip(got, want):
            a, b = np.asarray(g[0]), np.asarray(w[0])
            if a.ndim == 0 or a.shape[-1] < 2:
                raise UnsupportedError(f"tolerance {{'top1': ...}} needs class scores on the last axis of the "
                                       f"first output; it has shape {list(a.shape)}")
            a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
            total += a.shape[0]
        return agree / max(total, 1)
    worst = 0.0
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            if not np.issubdtype(b.dtype, np.floating):
                continue
            den = np.linalg.norm(b.ravel())
            err = np.linalg.norm((a - b).ravel()) / (den if den > 0 else 1.0)
            worst = max(worst, float(err) if np.isfinite(err) else np.inf)
    return worst


# ----------------------------------------------------------------------------------------- report
@dataclass
class LayerError:
    """The output error one layer adds when it alone runs in int8."""

    node: str
    label: str
    op: str
    score: float


@dataclass
class QuantReport:
    """What the int8 plan did and measured."""

    precision: str = "int8"
    tolerance: Tolerance | None = None
    quantized: list[str] = field(default_factory=list)  # layer labels running in int8
    kept_float: dict[str, str] = field(default_factory=dict)  # layer label -> why it stays float
    ranges: dict[str, Range] = field(default_factory=dict)  # tensor -> chosen range
    sensitivity: list[LayerError] | None = None  # worst first, when measured
    score: float | None = None  # the tolerance's measure of the plan on the calibration data
    samples: int = 0
    steps: list[str] = field(default_factory=list)  # what the planner tried, in order
    labels: dict[str, str] = field(default_factory=dict)  # node name -> layer label
    backend: str = "reference"  # where the plan runs
    choice: dict[str, float] = field(default_factory=dict)  # backend -> measured ms, where aiacc chose one
    verified: str | None = None  # what the accuracy guard measured on the user's model
    planner: Any = field(default=None, repr=False)  # kept to measure the sensitivity later

    def __getstate__(self) -> dict:
        """Pickled without the planner (its graphs and backend run function): a saved model carries the
        report of what was measured, not the means to measure more."""
        state = self.__dict__.copy()
        state["planner"] = None
        return state

    def measure_sensitivity(self) -> list[LayerError]:
        """The per-layer sensitivity table (measured now if the plan did not need it)."""
        if self.sensitivity is None and self.planner is not None:
            self.sensitivity = self.planner.sensitivity(self.tolerance)
        return self.sensitivity or []

    @property
    def ok(self) -> bool:
        return self.score is not None and self.tolerance is not None and self.tolerance.ok(self.score)

    def worst(self, k: int = 3) -> list[LayerError]:
        return list(self.sensitivity or [])[:k]

    def methods(self) -> dict[str, int]:
        """How many tensors each calibration method was chosen for."""
        out: dict[str, int] = {}
        for r in self.ranges.values():
            out[r.method] = out.get(r.method, 0) + 1
        return out

    def __str__(self) -> str:
        lines = [f"int8 plan: {len(self.quantized)} layers int8, {len(self.kept_float)} float, "
                 f"{self.samples} calibration samples, ranges by {self.methods()}"]
        if self.score is not None and self.tolerance is not None:
            lines.append(f"measured: {self.tolerance.describe(self.score)}: {'ok' if self.ok else 'MISSED'}")
        for name, why in self.kept_float.items():
            lines.append(f"  float {name}: {why}")
        if self.sensitivity:
            lines.append("sensitivity (alone in int8, worst first):")
            for e in self.sensitivity[:10]:
                lines.append(f"  {e.label:40s} {e.op:10s} {e.score:.4g}")
        lines += [f"  step: {s}" for s in self.steps]
        return "\n".join(lines)


# ----------------------------------------------------------------------------------------- planning
def _labels(original: Graph, decomposed: Graph) -> dict[str, str]:
    """Node name in the decomposed graph -> the layer it came from (a fused op's anchor layer)."""
    fused = {}
    for n in original:
        replaced = n.meta.get("replaced") or []
        anchors = [r for r in replaced if n.name.startswith(r)]
        fused[n.name] = max(anchors, key=len) if anchors else n.name
    out = {}
    for n in decomposed:
        if n.name in fused:
            out[n.name] = fused[n.name]
            continue
        owner = max((f for f in fused if n.name.startswith(f + "_")), key=len, default=None)
        out[n.name] = fused[owner] if owner else n.name
    return out


def _norm(name: str) -> str:
    return name.replace(".", "_").replace("/", "_")


def layers(graph: Graph) -> list[Node]:
    """The nodes the planner decides on one by one (compute ops and ops with integer kernels; fused
    activations and data-movement ops follow their neighbours)."""
    return [n for n in graph if qdq.eligible(n) and n.op not in qdq.PASSTHROUGH]


FLOAT_OUT = ("Gemm", "MatMul")  # int8 kernels with a float output (QGemm, MatMulIntegerToFloat): no pair needed


def _origin(v) -> Node | None:
    """The node that computes `v`, looking through data-movement ops (None for a graph input)."""
    n = v.producer
    while n is not None and n.op in qdq.PASSTHROUGH and not n.domain and n.inputs and n.inputs[0] is not None:
        n = n.inputs[0].producer
    return n


def _int8_users(n: Node, plan: set[str]) -> bool:
    """Whether an output of `n` (or of the activation fused into it) is read by a node of the plan."""
    outs = list(n.outputs)
    users = outs[0].users() if outs else []
    if len(users) == 1 and users[0].op in qdq.ACTIVATIONS and users[0].name in plan and n.op in qdq.FUSES_ACTIVATION:
        outs = list(users[0].outputs)
    return any(u.name in plan for v in outs for u in v.users())


def close_plan(graph: Graph, chosen: set[str]) -> set[str]:
    """The chosen layers plus the activations fused into them and the data-movement ops between int8
    layers (a Reshape between two int8 matmuls moves int8; one between float layers stays float), or
    whose consumers are all int8 (then its float input is quantized before it, once, and shared with
    the input's other int8 consumers; chains of them are followed back from the int8 consumer).

    Less is int8 where int8 only adds conversions: an Add/Mul no int8 node reads (a transformer's
    residual add before its float LayerNorm) whose input is float or comes from a matmul/gemm stays
    float (the matmul then outputs float, QGemm / MatMulIntegerToFloat, and there is no requantize and
    dequantize pair between them); likewise a Relu/Clip after a gemm/matmul that no int8 node reads."""
    plan = set(chosen)
    nofuse: set[str] = set()
    while True:
        full = set(plan)
        for n in graph:
            if n.name in full and n.op in qdq.FUSES_ACTIVATION:
                users = n.outputs[0].users()
                if len(users) == 1 and users[0].op in qdq.ACTIVATIONS and not users[0].domain \
                        and users[0].name not in nofuse:
                    full.add(users[0].name)
        changed = True
        while changed:
            changed = False
            for n in graph:
                if n.op not in qdq.PASSTHROUGH or n.name in full or not qdq.eligible(n):
                    continue
                src = n.inputs[0].producer
                into = src is not None and src.name in full
                users = [u for v in n.outputs for u in v.users()]
                out_any = any(u.name in full for u in users)
                out_all = bool(users) and all(u.name in full for u in users) \
                    and not any(v.is_graph_output for v in n.outputs)
                if (into and out_any) or out_all:
                    full.add(n.name)
                    changed = True
        drop, unfuse = set(), set()
        for n in graph:
            if n.name not in full or _int8_users(n, full):
                continue
            if n.op in ("Add", "Mul") and n.name in plan:
                origins = [_origin(n.inputs[i]) for i in qdq.activation_inputs(n)]
                if any(o is None or o.name not in full or o.op in FLOAT_OUT for o in origins):
                    drop.add(n.name)
            elif n.op in FLOAT_OUT and n.name in plan:
                act = n.outputs[0].users()
                if len(act) == 1 and act[0].name in full and act[0].op in qdq.ACTIVATIONS and act[0].name not in plan:
                    unfuse.add(act[0].name)
        if not drop and not unfuse:
            return full
        plan -= drop
        nofuse |= unfuse


class Planner:
    """Calibration data, the float reference and a way to run graphs: builds and measures plans."""

    def __init__(self, graph: Graph, feeds: Sequence[Mapping[str, np.ndarray]], run: RunFn | None = None,
                 methods: Sequence[str] = ("minmax", "percentile", "entropy"), weight_qmax: int = qdq.WEIGHT_QMAX):
        from aiacc.core.translate import decompose_fused

        self.original = graph
        self.graph, _ = decompose_fused(graph)
        if self.graph is graph:
            self.graph = graph.copy()
        self.labels = _labels(graph, self.graph)
        for gemm, matmul in qdq.matmul_bias_to_gemm(self.graph).items():
            self.labels[gemm] = self.labels.get(matmul, matmul)
        self.feeds = list(feeds)
        self.weight_qmax = weight_qmax
        self.run = run or reference_run
        self.layers = layers(self.graph)
        names = sorted({n.inputs[i].name for n in self.graph if qdq.eligible(n) for i in qdq.activation_inputs(n)}
                       | {v.name for n in self.graph if qdq.eligible(n) or n.op in qdq.ACTIVATIONS
                          for v in n.outputs if v.dtype in qdq.FLOATS})
        stats, self.reference = observe(self.graph, self.feeds, names, self.run)
        self.out_names = [v.name for v in self.graph.outputs]
        self.ranges = {n: choose_range(s, methods) for n, s in stats.items() if np.isfinite(s.min)}

    def label(self, node_name: str) -> str:
        return self.labels.get(node_name, node_name)

    def build(self, chosen: set[str]) -> Graph:
        return qdq.insert_qdq(self.graph, close_plan(self.graph, chosen), self.ranges, weight_qmax=self.weight_qmax)

    def outputs(self, g: Graph, feeds: Sequence[Mapping[str, np.ndarray]]) -> list[list[np.ndarray]]:
        return [[self.run(g, f, [])[n] for n in self.out_names] for f in feeds]

    def measure(self, chosen: set[str], tol: Tolerance, n: int | None = None) -> float:
        feeds = self.feeds[:n] if n else self.feeds
        ref = [[r[k] for k in self.out_names] for r in self.reference[:len(feeds)]]
        return score(tol, self.outputs(self.build(chosen), feeds), ref)

    def sensitivity(self, tol: Tolerance) -> list[LayerError]:
        """Each layer quantized alone, measured on the first SENSITIVITY_SAMPLES calibration samples; worst
        first (for top-1 the score is reported as disagreement, 1 - agreement, so larger is worse)."""
        out = []
        for node in self.layers:
            s = self.measure({node.name}, tol, SENSITIVITY_SAMPLES)
            out.append(LayerError(node.name, self.label(node.name), node.op, s if tol.kind == "rel" else 1 - s))
        out.sort(key=lambda e: -e.score)
        return out

    def match(self, names: Iterable[str]) -> set[str]:
        """Node names of the layers the user named (node names or original layer names, '.' or '_')."""
        want = {_norm(x) for x in names}
        found = {n.name for n in self.graph if _norm(n.name) in want or _norm(self.label(n.name)) in want}
        labels = {_norm(self.label(n.name)) for n in self.graph} | {_norm(n.name) for n in self.graph}
        missing = sorted(x for x in names if _norm(x) not in labels)
        if missing:
            known = sorted({self.label(n.name) for n in self.layers})
            raise UnsupportedError(f"keep_float names {missing}, which are not layers of this model (its int8 layers: "
                             f"{', '.join(known[:30])}{' ...' if len(known) > 30 else ''})")
        return found


def quantize(graph: Graph, feeds: Sequence[Mapping[str, np.ndarray]], *, keep_float: Sequence[str] | None = None,
             tolerance: Any = None, run: RunFn | None = None, sensitivity: bool | str = "auto",
             methods: Sequence[str] = ("minmax", "percentile", "entropy"),
             weight_qmax: int = qdq.WEIGHT_QMAX) -> tuple[Graph, QuantReport]:
    """The int8 QDQ graph of `graph` planned on the calibration `feeds`, and its report.

    keep_float: None ("auto": every eligible layer is int8 unless the measured error misses `tolerance`,
    then the most sensitive layers return to float), or the exact list of layers to keep float (node
    names or original layer names; no automatic choice). sensitivity: True measures the per-layer table
    always, "auto" only when it is needed, False never. run: how graphs are run (default: the reference
    executor). weight_qmax: 127, or 63 for kernels that saturate (x86 without VNNI; see qdq.WEIGHT_QMAX)."""
    tol = parse_tolerance(tolerance, "int8")
    p = Planner(graph, feeds, run, methods, weight_qmax)
    report = QuantReport(tolerance=tol, ranges=p.ranges, samples=len(p.feeds), labels=p.labels, planner=p)
    all_layers = {n.name for n in p.layers}
    pinned = p.match(keep_float) if keep_float else set()
    chosen = all_layers - pinned
    for name in sorted(pinned & all_layers):
        report.kept_float[p.label(name)] = "keep_float"
    report.score = p.measure(chosen, tol)
    report.steps.append(f"{len(chosen)} of {len(all_layers)} layers int8: {tol.describe(report.score)}")
    if sensitivity is True or (sensitivity == "auto" and not tol.ok(report.score)):
        report.sensitivity = p.sensitivity(tol)
    if keep_float is None and not tol.ok(report.score) and report.sensitivity:
        for e in report.sensitivity[:MAX_AUTO_FLOAT]:
            chosen.discard(e.node)
            report.kept_float[e.label] = f"sensitivity: {e.score:.4g} alone in int8"
            report.score = p.measure(chosen, tol)
            report.steps.append(f"{e.label} float: {tol.describe(report.score)}")
            if tol.ok(report.score):
                break
    qgraph = p.build(chosen)
    report.quantized = [p.label(n) for n in sorted(qgraph.meta.get("aiacc.quantized", []))
                        if n in all_layers]
    closed = close_plan(p.graph, chosen)
    for name in sorted(all_layers - set(qgraph.meta.get("aiacc.quantized", [])) - pinned):
        if name not in chosen:
            why = report.kept_float.get(p.label(name), "float")
        elif name not in closed:
            why = "no int8 node reads it (in int8 it would only add a requantize and a dequantize)"
        else:
            why = "no measured range for its inputs"
        report.kept_float.setdefault(p.label(name), why)
    qgraph.meta["aiacc.quant_report"] = report
    return qgraph, report


def suggestion(report: QuantReport, k: int = 3) -> list[str]:
    """The layers to try keeping float: the worst of the sensitivity table not already float."""
    return [e.label for e in report.worst(len(report.sensitivity or [])) if e.label not in report.kept_float][:k]
