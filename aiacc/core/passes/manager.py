"""The pass manager: named passes grouped in optimization levels, a debug mode that checks the graph and
its numerics after every pass, and a report of what each pass changed.

Levels follow onnxruntime's spirit:

    0  nothing
    1  basic cleanups that never change the op vocabulary: DCE, constant folding, CSE, Identity/Dropout
       removal, Transpose/Reshape cancellation
    2  + fusions into standard or aiacc ops: BatchNorm folding, per-channel affine folding, Pad folding,
       Conv/Gemm/MatMul fusions, GELU and LayerNorm recognition
    3  + aggressive: standalone BatchNorm decomposition, attention recognition and elementwise fusion
       (numba kernels)

A pass is an instance of `Pass` (or a subclass) registered with `register_pass`; its docstring states what it
assumes and what it guarantees. `run_passes(graph, level=2)` runs the pipeline for a level in place;
`passes=[...]` runs exactly the named passes in that order; `disable=[...]` skips some.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from aiacc import progress
from aiacc.core.compare import compare_outputs, recheck_float64
from aiacc.core.ir import Graph, Node, TensorType
from aiacc.errors import AiaccError, GraphError, KernelError, VerificationError

# The modes, in their one spelling; ALIASES are accepted everywhere a mode is (plugins, passes, rules).
MODES = ("inference", "train")
ALIASES = {"training": "train"}

# Why a pass that runs in inference only is left out of a training pipeline (the report says it).
TRAIN_SKIPS = {
    "batchnorm_folding": "folds BatchNorm's moving statistics into the weights: training normalizes with the "
                         "batch's statistics and updates the moving ones",
    "batchnorm_decomposition": "turns BatchNorm into a constant scale and shift: training BatchNorm uses batch "
                               "statistics",
    "affine_folding": "folds per-channel scales into weight constants: the weights are trained parameters, "
                      "not constants",
    "pad_folding": "rewrites Transpose/Pad chains for inference layouts only",
    "transpose_propagation": "moves Transposes through ops whose backward the training exporter does not "
                             "re-derive",
    "elementwise_fusion": "its numba kernels have no backward (the framework's compiler fuses elementwise "
                          "chains in training)",
    "canonicalize": "its rules fold constants and BatchNorm for inference",
}


def normalize_mode(mode: str | None) -> str:
    """The mode in its one spelling: "inference" or "train" ("training" accepted as an alias).
    Anything else is an AiaccError listing the accepted names."""
    m = ALIASES.get(mode, mode) if isinstance(mode, str) else mode
    if m not in MODES:
        accepted = ", ".join(repr(x) for x in MODES + tuple(ALIASES))
        raise AiaccError(f"unknown mode {mode!r} (accepted: {accepted})")
    return m


def _said(mode: str) -> str:
    """The mode as a sentence says it ("training mode")."""
    return "training" if mode == "train" else mode


def skip_reason(p: "Pass", mode: str) -> str:
    """Why pass `p` does not run in `mode` (for the report)."""
    if mode == "train" and p.name in TRAIN_SKIPS:
        return TRAIN_SKIPS[p.name]
    return f"runs in {', '.join(p.modes)} mode only"


class PassContext:
    """What a running pass may consult and record: the mode, the level and free-form counters."""

    def __init__(self, mode: str = "inference", level: int = 2):
        mode = normalize_mode(mode)
        self.mode = mode
        self.level = level
        self.counters: dict[str, int] = {}

    def count(self, key: str, n: int = 1) -> None:
        """Add n to a named counter reported with the pass (e.g. count("rule:conv_relu"))."""
        self.counters[key] = self.counters.get(key, 0) + n

    @property
    def inference(self) -> bool:
        return self.mode == "inference"


class Pass:
    """One graph transformation. Subclasses set `name`, `level`, `modes` and implement `run`.

    `run(graph, ctx)` mutates the graph in place and returns the number of rewrites it made (0 when it
    changed nothing). The docstring of each pass says what it assumes and what it guarantees.
    """

    name: str = ""
    level: int = 1
    modes: tuple[str, ...] = MODES

    def run(self, graph: Graph, ctx: PassContext) -> int:
        raise NotImplementedError

    def applies(self, mode: str) -> bool:
        """True when the pass runs in `mode` (any accepted spelling)."""
        return normalize_mode(mode) in {normalize_mode(m) for m in self.modes}

    @property
    def doc(self) -> str:
        return (type(self).__doc__ or "").strip()

    def __repr__(self) -> str:
        return f"<Pass {self.name} (level {self.level})>"


class FunctionPass(Pass):
    """A pass made from a function `fn(graph, ctx) -> int`; the function's docstring is the pass's."""

    def __init__(self, name: str, fn: Callable[[Graph, PassContext], int], level: int = 1,
                 modes: tuple[str, ...] = MODES):
        self.name, self.fn, self.level, self.modes = name, fn, level, tuple(modes)
        self.__doc__ = fn.__doc__

    def run(self, graph: Graph, ctx: PassContext) -> int:
        return int(self.fn(graph, ctx) or 0)

    @property
    def doc(self) -> str:
        return (self.fn.__doc__ or "").strip()


_PASSES: dict[str, Pass] = {}

# The pipeline order; a level runs the passes of this list whose level is <= the requested level.
PIPELINE: list[str] = [
    "identity_removal",
    "constant_folding",
    "cse",
    "transpose_reshape_cancellation",
    "transpose_propagation",
    "dce",
    "pad_folding",
    # recognized before the folding passes take their Mul/Add apart, and so that a Gelu can fuse into the
    # MatMul before it
    "gelu_recognition",
    "layernorm_recognition",
    "batchnorm_folding",
    "batchnorm_decomposition",
    "affine_folding",
    "gemm_fusion",
    # again: Transposes around the MatMuls fused just now (batch_first=False attention) can compose
    "transpose_propagation",
    "conv_fusion",
    "attention_recognition",
    "elementwise_fusion",
    "dce",
]


def register_pass(p: Pass | type | None = None, *, name: str | None = None, level: int | None = None,
                  modes: Iterable[str] | None = None):
    """Register a pass instance, a Pass subclass (instantiated) or, as a decorator on a function
    `fn(graph, ctx) -> int`, a FunctionPass. Returns what it was given."""

    def add(obj):
        if isinstance(obj, type) and issubclass(obj, Pass):
            inst = obj()
        elif isinstance(obj, Pass):
            inst = obj
        elif callable(obj):
            inst = FunctionPass(name or obj.__name__, obj, level if level is not None else 1,
                                tuple(modes) if modes is not None else MODES)
        else:
            raise TypeError(f"cannot register {obj!r} as a pass")
        if not inst.name:
            raise AiaccError(f"pass {obj!r} has no name")
        _PASSES[inst.name] = inst
        return obj

    return add if p is None else add(p)


def _load_builtin_passes() -> None:
    # importing the package registers every built-in pass (one module per pass)
    import aiacc.core.passes  # noqa: F401


def get_pass(name: str) -> Pass:
    _load_builtin_passes()
    try:
        return _PASSES[name]
    except KeyError:
        known = ", ".join(sorted(_PASSES))
        raise AiaccError(f"unknown pass {name!r} (known passes: {known})") from None


def all_passes() -> dict[str, Pass]:
    _load_builtin_passes()
    return dict(_PASSES)


def pipeline(level: int = 2, mode: str = "inference") -> list[Pass]:
    """The passes a level runs, in order (passes that do not apply to `mode` left out)."""
    if not 0 <= level <= 3:
        raise AiaccError(f"optimization level must be 0..3, got {level}")
    mode = normalize_mode(mode)
    _load_builtin_passes()
    out = []
    for n in PIPELINE:
        p = _PASSES.get(n)
        if p is not None and p.level <= level and p.applies(mode) and not (out and out[-1] is p):
            out.append(p)
    return out


def skipped_passes(level: int = 2, mode: str = "inference") -> dict[str, str]:
    """{name: why} of the passes a level would run in inference that `mode` leaves out."""
    mode = normalize_mode(mode)
    kept = {p.name for p in pipeline(level, mode)}
    return {p.name: skip_reason(p, mode) for p in pipeline(level, "inference") if p.name not in kept}


def passes_by_level(mode: str = "inference") -> dict[int, list[str]]:
    """{level: names of the passes it runs}, for documentation and reports."""
    return {lvl: [p.name for p in pipeline(lvl, mode)] for lvl in range(4)}


# ------------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------------
@dataclass
class PassRecord:
    """What one pass did to the graph."""

    name: str
    rewrites: int = 0
    nodes_before: int = 0
    nodes_after: int = 0
    removed: int = 0  # nodes that existed before and not after
    added: int = 0  # nodes that exist after and not before
    fused: int = 0  # added nodes in the aiacc domain (fused ops)
    const_bytes_before: int = 0
    const_bytes_after: int = 0
    seconds: float = 0.0
    ops_removed: dict[str, int] = field(default_factory=dict)
    ops_added: dict[str, int] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    checked: str = ""  # debug mode: "graph", "graph+numerics" or why numerics were not checked
    notes: list[str] = field(default_factory=list)  # what the backend made of the pass's result (per node)

    @property
    def const_bytes_saved(self) -> int:
        return self.const_bytes_before - self.const_bytes_after

    @property
    def changed(self) -> bool:
        return bool(self.rewrites or self.removed or self.added or self.const_bytes_saved)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "rewrites": self.rewrites, "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after, "removed": self.removed, "added": self.added, "fused": self.fused,
            "const_bytes_before": self.const_bytes_before, "const_bytes_after": self.const_bytes_after,
            "const_bytes_saved": self.const_bytes_saved, "seconds": self.seconds,
            "ops_removed": dict(self.ops_removed), "ops_added": dict(self.ops_added),
            "counters": dict(self.counters), "checked": self.checked, "notes": list(self.notes),
        }


@dataclass
class PassReport:
    """The records of every pass a run_passes call ran, in order."""

    level: int
    mode: str
    records: list[PassRecord] = field(default_factory=list)
    nodes_before: int = 0
    nodes_after: int = 0
    const_bytes_before: int = 0
    const_bytes_after: int = 0
    ops_before: dict[str, int] = field(default_factory=dict)
    ops_after: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # pass name -> why this mode leaves it out
    fallbacks: list[str] = field(default_factory=list)  # what optimize did less than asked, and why (warned)
    interface: list[str] = field(default_factory=list)  # what optimize checked of the inputs' sizes (batch)
    shapes: list[str] = field(default_factory=list)  # the input shapes the module was optimized for, and later ones

    def __getitem__(self, name: str) -> PassRecord:
        """The (first) record of the pass called `name`."""
        for r in self.records:
            if r.name == name:
                return r
        raise KeyError(name)

    def note(self, name: str, lines: list[str]) -> None:
        """Add the backend's notes to the record of pass `name` (e.g. which fused kernels the torch export
        kept: "f1: kept: numba 0.41x"); shown under the table. Without a record of that pass (a graph that
        came in fused), a record is added for the notes."""
        try:
            rec = self[name]
        except KeyError:
            rec = PassRecord(name)
            self.records.append(rec)
        rec.notes.extend(lines)

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.records)

    @property
    def fused(self) -> int:
        return sum(r.fused for r in self.records)

    def as_dict(self) -> dict[str, Any]:
        return {
            "level": self.level, "mode": self.mode, "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after, "const_bytes_before": self.const_bytes_before,
            "const_bytes_after": self.const_bytes_after, "ops_before": dict(self.ops_before),
            "ops_after": dict(self.ops_after), "seconds": self.seconds,
            "passes": [r.as_dict() for r in self.records],
            **({"skipped": dict(self.skipped)} if self.skipped else {}),
            **({"fallbacks": list(self.fallbacks)} if self.fallbacks else {}),
            **({"interface": list(self.interface)} if self.interface else {}),
            **({"shapes": list(self.shapes)} if self.shapes else {}),
        }

    def table(self):
        """A rich Table: one row per pass."""
        from rich.table import Table

        t = Table(title=f"aiacc passes (level {self.level}, {self.mode}): {self.nodes_before} -> "
                        f"{self.nodes_after} nodes, constants {_bytes(self.const_bytes_before)} -> "
                        f"{_bytes(self.const_bytes_after)}")
        for col in ("pass", "rewrites", "removed", "added", "fused", "const saved", "ms", "ops"):
            t.add_column(col, justify="left" if col in ("pass", "ops") else "right")
        for r in self.records:
            ops = ", ".join([f"-{k}x{v}" for k, v in r.ops_removed.items()]
                            + [f"+{k}x{v}" for k, v in r.ops_added.items()])
            t.add_row(r.name, str(r.rewrites), str(r.removed), str(r.added), str(r.fused),
                      _bytes(r.const_bytes_saved), f"{r.seconds * 1e3:.1f}", ops)
        notes = [f"{r.name}: {n}" for r in self.records for n in r.notes[:8]]
        notes += [f"{r.name}: ... {len(r.notes) - 8} more (as_dict() has them all)" for r in self.records
                  if len(r.notes) > 8]
        if notes:
            t.caption = "\n".join(notes)
        if self.skipped:
            t.caption = (t.caption + "\n" if notes else "") + "skipped in " + _said(self.mode) + " mode: " \
                + "; ".join(f"{k} ({v})" for k, v in self.skipped.items())
        if self.fallbacks:
            t.caption = ((t.caption + "\n") if t.caption else "") + "fallbacks: " + "; ".join(self.fallbacks)
        if self.interface:
            t.caption = ((t.caption + "\n") if t.caption else "") + "interface: " + "; ".join(self.interface)
        if self.shapes:
            t.caption = ((t.caption + "\n") if t.caption else "") + "shapes: " + "; ".join(self.shapes)
        return t

    def __str__(self) -> str:
        from rich.console import Console

        console = Console(width=140, record=True, file=_Null())
        console.print(self.table())
        return console.export_text()


class _Null:
    def write(self, s):  # rich needs a file; the text comes from export_text
        return len(s)

    def flush(self):
        pass


def _bytes(n: int) -> str:
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    return f"{sign}{n}"


# ------------------------------------------------------------------------------------------------
# debug checks
# ------------------------------------------------------------------------------------------------
def random_feeds(graph: Graph, seed: int = 0, batch: int = 2, size: int = 8) -> dict[str, np.ndarray]:
    """Random inputs matching the graph input types: symbols in the first dimension bound to `batch`,
    other symbols and unknown dimensions to `size` (the same symbol gets the same size everywhere)."""
    rng = np.random.default_rng(seed)
    bound: dict[str, int] = {}
    feeds = {}
    for v in graph.inputs:
        if v.type is None or v.shape is None:
            raise VerificationError(f"graph input %{v.name} has no known shape: pass feeds= to check numerics")
        dims = []
        for k, d in enumerate(v.shape):
            if isinstance(d, int):
                dims.append(d)
            elif isinstance(d, str):
                dims.append(bound.setdefault(d, batch if k == 0 else size))
            else:
                dims.append(batch if k == 0 else size)
        dtype = np.dtype(v.dtype or "float32")
        if dtype.kind == "f":
            a = rng.standard_normal(dims).astype(dtype)
        elif dtype.kind in "iu":
            a = rng.integers(0, 4, dims).astype(dtype)
        elif dtype.kind == "b":
            a = rng.random(dims) > 0.5
        else:
            raise VerificationError(f"graph input %{v.name}: cannot make random {dtype.name} data: pass feeds=")
        feeds[v.name] = a
    return feeds


def _run_outputs(graph: Graph, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    from aiacc.core.runtime.executor import run

    out = run(graph, feeds)
    return [out[v.name] for v in graph.outputs]


def float64_copy(graph: Graph) -> Graph | None:
    """A copy of `graph` computing in float64 where it computes in float32: float32 inputs, constants, value
    types and dtype attributes ("to", "dtype": "float32"; float32 arrays) widened, for the debug mode's float64
    re-check. None where the graph holds an opaque node (its framework callable keeps its own dtypes)."""
    g = graph.copy()
    for n in g:
        if n.domain not in ("", "ai.onnx", "aiacc"):
            return None
        for k, a in list(n.attrs.items()):
            if isinstance(a, str) and a == "float32":
                n.attrs[k] = "float64"
            elif isinstance(a, np.ndarray) and a.dtype == np.float32:
                n.attrs[k] = a.astype(np.float64)
    values = list(g.inputs) + list(g.initializers.values()) + [o for n in g for o in n.outputs]
    for v in values:
        if v.dtype == "float32":
            v.type = TensorType("float64", v.shape)
            if v.const is not None:
                v.const = np.asarray(v.const).astype(np.float64)  # a new array: the copy shares the original's
    return g


def _float64_verdict(before: Graph | None, after: Graph, feeds, baseline, got, rtol: float, atol: float,
                     problem: str) -> str | None:
    """The debug mode's float64 re-check of a pass whose float32 outputs moved: `before` (the input graph) and
    `after` run in float64 on the widened feeds decide (compare.recheck_float64); `problem` where they cannot."""
    wide_before = None if before is None else float64_copy(before)
    wide_after = float64_copy(after) if wide_before is not None else None
    if wide_after is None:
        return problem
    wide = {k: (np.asarray(v).astype(np.float64) if np.asarray(v).dtype == np.float32 else v)
            for k, v in feeds.items()}
    try:
        truth, got64 = _run_outputs(wide_before, wide), _run_outputs(wide_after, wide)
    except AiaccError as e:
        return f"{problem} (the float64 re-check could not run: {e})"
    why = recheck_float64(baseline, got, truth, got64, rtol, atol)
    return f"{problem}; float64 re-check: {why}" if why else None


# ------------------------------------------------------------------------------------------------
# the manager
# ------------------------------------------------------------------------------------------------
def _names(spec: Any) -> list[str]:
    if spec is None:
        return []
    if isinstance(spec, str):
        return [s.strip() for s in spec.split(",") if s.strip()]
    out = []
    for s in spec:
        out.append(s.name if isinstance(s, Pass) else str(s))
    return out


class PassManager:
    """Runs a list of passes over a graph, recording each one and (in debug mode) checking it."""

    def __init__(self, passes: list[Pass], *, level: int = 2, mode: str = "inference", debug: bool = False,
                 feeds: Mapping[str, np.ndarray] | None = None, rtol: float = 1e-4, atol: float = 1e-5):
        self.passes = passes
        self.level = level
        self.mode = normalize_mode(mode)
        self.debug = debug
        self.feeds = feeds
        self.rtol, self.atol = rtol, atol

    def run(self, graph: Graph) -> PassReport:
        report = PassReport(level=self.level, mode=self.mode, nodes_before=len(graph),
                            const_bytes_before=graph.constant_bytes(), ops_before=graph.op_histogram())
        baseline = feeds = reference = None  # reference: debug's copy of the input graph
        numerics_note = ""
        if self.debug:
            _verify_graph(graph, "the input graph (before any pass)")
            try:
                feeds = dict(self.feeds) if self.feeds is not None else random_feeds(graph)
                baseline = _run_outputs(graph, feeds)
                reference = graph.copy()  # structure only (constants shared): for the float64 re-check
            except (KernelError, VerificationError) as e:
                numerics_note = f"numerics not checked: {e}"
        with progress.task("passes", total=len(self.passes)) as shown:
            for p in self.passes:
                shown.update(p.name)
                self._run_one(p, graph, report, feeds, baseline, numerics_note, reference)
                shown.advance()
        report.nodes_after = len(graph)
        report.const_bytes_after = graph.constant_bytes()
        report.ops_after = graph.op_histogram()
        return report

    def _run_one(self, p: Pass, graph: Graph, report: PassReport, feeds, baseline, numerics_note: str,
                 reference: Graph | None = None) -> None:
        """Run pass `p`, record it in `report` and (debug) check the graph and its numerics."""
        ctx = PassContext(self.mode, self.level)
        # Hold the nodes themselves, not only their ids: a node the pass removes could otherwise be freed and its
        # id reused by a node the pass adds, which then counts as neither removed nor added.
        before_nodes = {id(n): (n, n.qualified_op) for n in graph}
        rec = PassRecord(p.name, nodes_before=len(graph), const_bytes_before=graph.constant_bytes())
        t0 = time.perf_counter()
        try:
            rec.rewrites = int(p.run(graph, ctx) or 0)
        except AiaccError:
            raise
        except Exception as e:  # a bug in the pass: name it
            raise AiaccError(f"pass {p.name} failed: {type(e).__name__}: {e}") from e
        rec.seconds = time.perf_counter() - t0
        after_nodes = {id(n): n for n in graph}
        for k, (_node, op) in before_nodes.items():
            if k not in after_nodes:
                rec.removed += 1
                rec.ops_removed[op] = rec.ops_removed.get(op, 0) + 1
        for k, n in after_nodes.items():
            if k not in before_nodes:
                rec.added += 1
                rec.ops_added[n.qualified_op] = rec.ops_added.get(n.qualified_op, 0) + 1
                if n.domain == "aiacc":
                    rec.fused += 1
        rec.nodes_after = len(graph)
        rec.const_bytes_after = graph.constant_bytes()
        rec.counters = dict(ctx.counters)
        if self.debug:
            _verify_graph(graph, f"pass {p.name}")
            if baseline is not None:
                try:
                    got = _run_outputs(graph, feeds)
                except AiaccError as e:
                    raise VerificationError(f"pass {p.name} left a graph the reference executor cannot run: "
                                            f"{e}") from e
                problem = compare_outputs(baseline, got, self.rtol, self.atol)
                if problem:  # float32 rounding an ill-conditioned graph amplifies, or a real change: float64 decides
                    problem = _float64_verdict(reference, graph, feeds, baseline, got, self.rtol, self.atol,
                                               problem)
                if problem:
                    raise VerificationError(f"pass {p.name} changed the numerics: {problem}")
                rec.checked = "graph+numerics"
            else:
                rec.checked = "graph; " + numerics_note
        report.records.append(rec)


def _verify_graph(graph: Graph, what: str) -> None:
    try:
        graph.verify()
    except GraphError as e:
        raise VerificationError(f"{what} left an invalid graph: {e}") from e
    except AiaccError as e:
        raise VerificationError(f"{what} left an invalid graph: {e}") from e


def run_passes(graph: Graph, *, level: int = 2, passes: Any = None, disable: Any = None, debug: bool = False,
               feeds: Mapping[str, np.ndarray] | None = None, mode: str = "inference") -> PassReport:
    """Optimize `graph` in place and return a PassReport.

    level: 0..3 (see the module docstring); passes: names (or Pass objects) to run, exactly those and in that
    order, instead of the level's pipeline; disable: names to skip; debug: after every pass verify the graph
    and compare the reference executor's outputs with the input graph's on `feeds` (random inputs from the
    input types when None), raising VerificationError naming the pass that broke them; mode: "inference" or
    "train" (alias "training"; training keeps Dropout, training-mode BatchNorm, parameters as inputs and
    anything the backward pass needs; the report's `skipped` says which passes the mode left out and why).
    """
    mode = normalize_mode(mode)
    skip = set(_names(disable))
    _load_builtin_passes()
    for n in skip:
        if n not in _PASSES:
            get_pass(n)  # raises naming the unknown pass
    if passes:
        chosen = []
        for item in (passes if not isinstance(passes, str) else _names(passes)):
            p = item if isinstance(item, Pass) else get_pass(str(item))
            if not p.applies(mode):
                raise AiaccError(f"pass {p.name} does not apply in {_said(mode)} mode (it runs in: "
                                 f"{', '.join(p.modes)})")
            if p.name not in skip:
                chosen.append(p)
    else:
        chosen = [p for p in pipeline(level, mode) if p.name not in skip]
    report = PassManager(chosen, level=level, mode=mode, debug=debug, feeds=feeds).run(graph)
    if not passes:
        report.skipped = {k: v for k, v in skipped_passes(level, mode).items() if k not in skip}
    return report
