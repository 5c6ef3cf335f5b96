"""`aiacc demo`: the main job. The bundled models (aiacc.zoo) of every installed framework are optimized
with aiacc, for both backends, then timed side by side and checked against the original numbers.

    aiacc demo                                   # ResNet-50 of torch, tf, mxnet and caffe, batch 1, 224x224
    aiacc demo --models resnet50,mobilenet_v2,bert_encoder --frameworks torch,caffe --iters 20

For each (framework, model): build the model, `aiacc.optimize` it with backend="native" and with
backend="onnxruntime", run the three interleaved (so drift hits all alike) and print one table: median
latencies, speedups over the original, the maximum relative error of each optimized model against the
original on the same inputs (the numeric check: it passes at 1e-4), and the node count before and after
the passes. A rich progress display shows what is running.

The pieces (`runner`, `time_interleaved`, `max_rel_error`) are shared with benchmarks/inference.py.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from aiacc import progress, zoo
from aiacc.errors import AiaccError, UnsupportedError
from aiacc.plugins import get_plugin
from aiacc.plugins.base import to_numpy_list  # noqa: F401  (the demo's helpers, shared with benchmarks)
from aiacc.plugins.caffe.translator import opencv_available, opencv_runner  # noqa: F401

DEMO_FRAMEWORKS = ("torch", "tf", "mxnet", "caffe")
BACKENDS = ("native", "onnxruntime")
TOLERANCE = 1e-4  # maximum relative error (to the largest magnitude of each output) that passes the check


# ------------------------------------------------------------------------------------------------ running
def runner(framework: str, model: Any, inputs: Any) -> Callable[[], list[np.ndarray]]:
    """A no-argument callable running `model` on `inputs` (as aiacc.zoo gives them) and returning its
    outputs as numpy arrays: the plugin's `runner` (inputs are converted to the framework's tensors once,
    outside the call; a CaffeModel runs in OpenCV dnn where OpenCV is installed)."""
    return get_plugin(framework).runner(model, inputs)


def set_threads(n: int) -> None:
    """One intra-op thread count for every runtime (torch, TF, MXNet's OpenMP, onnxruntime, OpenCV); call
    before any framework is imported. On a shared machine, 1 stops spinning thread pools from measuring
    contention instead of the models."""
    if any(m in sys.modules for m in ("torch", "tensorflow", "mxnet")):
        raise UnsupportedError("set_threads must run before the frameworks are imported")
    os.environ["OMP_NUM_THREADS"] = str(n)  # MXNet (OpenMP) and torch's OpenMP pool
    os.environ["MKL_NUM_THREADS"] = str(n)
    import aiacc.backends.onnxruntime as ortb

    ortb.DEFAULT_THREADS = n
    try:
        import cv2

        cv2.setNumThreads(n)
    except ImportError:
        pass
    if zoo.installed("torch"):
        import torch

        torch.set_num_threads(n)
        torch.set_num_interop_threads(1)
    if zoo.installed("tf"):
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(1)


def time_interleaved(fns: dict[str, Callable[[], Any]], iters: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of every function, measured round-robin (one call of each per round) so that
    drift of the machine affects all of them alike. `warmup` untimed rounds come first."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(iters):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return times


def median_ms(times: Sequence[float]) -> float:
    return statistics.median(times) * 1e3


def max_rel_error(expected: Sequence[np.ndarray], actual: Sequence[np.ndarray]) -> float:
    """The largest |actual - expected| over all outputs, each relative to its output's largest |expected|
    (inf when the outputs do not line up or are not finite)."""
    if len(expected) != len(actual):
        return float("inf")
    worst = 0.0
    for e, a in zip(expected, actual):
        e, a = np.asarray(e), np.asarray(a)
        if e.shape != a.shape:
            return float("inf")
        if e.size == 0:
            continue
        if e.dtype.kind not in "fc":
            worst = max(worst, 0.0 if np.array_equal(e, a) else float("inf"))
            continue
        scale = max(float(np.max(np.abs(e))), 1e-30)
        err = float(np.max(np.abs(e.astype(np.float64) - a.astype(np.float64)))) / scale
        worst = max(worst, err if np.isfinite(err) else float("inf"))
    return worst


def framework_available(framework: str) -> str | None:
    """None when the framework and its aiacc plugin import, else why not."""
    try:
        plugin = get_plugin(framework)
    except Exception as e:  # a broken install: report it and go on with the other frameworks
        return f"plugin does not import: {type(e).__name__}: {e}"
    if not zoo.installed(framework):
        return f"not installed ({plugin.install_hint})"
    return None


# ------------------------------------------------------------------------------------------------ the job
@dataclass
class Result:
    """One (framework, model) row of the demo table."""

    framework: str
    model: str
    original_ms: float | None = None
    ms: dict[str, float] = field(default_factory=dict)  # backend -> median latency
    error: dict[str, float] = field(default_factory=dict)  # backend -> max relative error
    failed: dict[str, str] = field(default_factory=dict)  # backend (or "build") -> message
    nodes_before: int | None = None
    nodes_after: int | None = None

    def speedup(self, backend: str) -> float | None:
        if self.original_ms is None or backend not in self.ms:
            return None
        return self.original_ms / self.ms[backend]

    @property
    def passed(self) -> bool:
        return not self.failed and all(e <= TOLERANCE for e in self.error.values())


def demo_one(framework: str, model_name: str, *, batch: int = 1, size: int = 224, seq: int = 128,
             iters: int = 5, warmup: int = 1, backends: Sequence[str] = BACKENDS, level: int = 2,
             step: Callable[[str], None] = lambda s: None) -> Result:
    """Build, optimize (each backend), check and time one bundled model. `step(text)` reports progress."""
    import aiacc

    res = Result(framework, model_name)
    step(f"{framework} {model_name}: building")
    kw = {"seq": seq} if model_name == "bert_encoder" else {"size": size}
    try:
        model, inputs = zoo.build(framework, model_name, batch=batch, **kw)
        original = runner(framework, model, inputs)
        expected = original()
    except Exception as e:
        res.failed["build"] = f"{type(e).__name__}: {e}"
        return res
    fns = {"original": original}
    for backend in backends:
        step(f"{framework} {model_name}: aiacc.optimize(backend={backend!r})")
        try:
            # verify=False: the check below is the same comparison, shown in the table instead of raised
            fast = aiacc.optimize(model, inputs, level=level, backend=backend, verify=False)
            report = getattr(fast, "aiacc_report", None)
            if report is not None:
                res.nodes_before, res.nodes_after = report.nodes_before, report.nodes_after
            fns[backend] = runner(framework, fast, inputs)
            res.error[backend] = max_rel_error(expected, fns[backend]())
        except Exception as e:
            fns.pop(backend, None)
            res.failed[backend] = f"{type(e).__name__}: {e}"
    step(f"{framework} {model_name}: timing {len(fns)} models x {iters} runs")
    times = time_interleaved(fns, iters, warmup)
    res.original_ms = median_ms(times.pop("original"))
    res.ms = {k: median_ms(v) for k, v in times.items()}
    return res


def _fmt_ms(ms: float | None) -> str:
    return "-" if ms is None else (f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}")


def _fmt_x(x: float | None) -> str:
    if x is None:
        return "-"
    color = "green" if x >= 1.0 else "red"
    return f"[{color}]{x:.2f}x[/{color}]"


def _fmt_err(res: Result, backend: str) -> str:
    if backend in res.failed:
        return "[red]failed[/red]"
    if backend not in res.error:
        return "-"
    e = res.error[backend]
    color = "green" if e <= TOLERANCE else "red"
    return f"[{color}]{e:.1e}[/{color}]"


def results_table(results: Sequence[Result], *, batch: int, size: int, seq: int, backends=BACKENDS):
    """The demo's rich Table."""
    from rich.table import Table

    t = Table(title=f"aiacc on the bundled models: batch {batch}, images {size}x{size}, BERT sequence {seq}; "
                    f"median latency (ms); speedup over the original; check: max relative error <= {TOLERANCE:g}; "
                    f"nodes before->after the passes; ort = onnxruntime")
    t.add_column("model")
    t.add_column("framework")
    t.add_column("original ms", justify="right")
    labels = {"native": "native", "onnxruntime": "ort"}
    for b in backends:
        t.add_column(f"aiacc {labels.get(b, b)} ms", justify="right")
        t.add_column("speedup", justify="right")
    for b in backends:
        t.add_column(f"rel err {labels.get(b, b)}", justify="right")
    t.add_column("check", justify="center")
    t.add_column("nodes", justify="right")
    for r in results:
        if "build" in r.failed:
            t.add_row(r.model, r.framework, "[red]build failed[/red]", *([""] * (3 * len(backends))),
                      "[red]FAIL[/red]", "")
            continue
        cells = [r.model, r.framework, _fmt_ms(r.original_ms)]
        for b in backends:
            cells += [_fmt_ms(r.ms.get(b)), _fmt_x(r.speedup(b))]
        cells += [_fmt_err(r, b) for b in backends]
        cells.append("[green]pass[/green]" if r.passed else "[red]FAIL[/red]")
        cells.append("-" if r.nodes_before is None else f"{r.nodes_before}->{r.nodes_after}")
        t.add_row(*cells)
    return t


def run_demo(frameworks: Sequence[str] = DEMO_FRAMEWORKS, models: Sequence[str] = ("resnet50",), *,
             batch: int = 1, size: int = 224, seq: int = 128, iters: int = 5, warmup: int = 1,
             backends: Sequence[str] = BACKENDS, level: int = 2, console=None) -> list[Result]:
    """The main job: every (installed framework, model) through demo_one, with a progress display; prints
    the skipped frameworks, the failures and the table; returns the results."""
    from rich.console import Console

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    console = console or Console(width=None if sys.stdout.isatty() else 150)
    for name in models:
        if name not in zoo.MODELS:
            raise UnsupportedError(f"unknown model {name!r} (known: {', '.join(zoo.MODELS)})")
    for b in backends:
        if b not in BACKENDS:
            raise UnsupportedError(f"unknown backend {b!r} (known: {', '.join(BACKENDS)})")
    jobs, notes = [], []
    for fw in frameworks:
        if fw not in zoo.FRAMEWORKS:
            raise UnsupportedError(f"unknown framework {fw!r} (known: {', '.join(DEMO_FRAMEWORKS)})")
        why = framework_available(fw)
        if why:
            notes.append(f"skipped {fw}: {why}")
            continue
        for name in models:
            if zoo.has(fw, name):
                jobs.append((fw, name))
            else:
                notes.append(f"skipped {name} for {fw}: {zoo.UNAVAILABLE[fw, name]}")
    results = []
    # the bar is drawn only on a terminal (aiacc.progress); the per-model lines are printed either way
    with progress.use_console(console), progress.task("demo", total=len(jobs)) as shown:
        for fw, name in jobs:
            res = demo_one(fw, name, batch=batch, size=size, seq=seq, iters=iters, warmup=warmup,
                           backends=backends, level=level, step=shown.update)
            results.append(res)
            shown.advance()
            status = "[green]pass[/green]" if res.passed else "[red]FAIL[/red]"
            console.print(f"{fw} {name}: {status}")
    for note in notes:
        console.print(f"[yellow]{note}[/yellow]")
    console.print(results_table(results, batch=batch, size=size, seq=seq, backends=backends))
    for r in results:
        for what, msg in r.failed.items():
            console.print(f"[red]{r.framework} {r.model} ({what}): {msg}[/red]")
    return results


def add_arguments(parser) -> None:
    """The `aiacc demo` options."""
    parser.add_argument("--frameworks", default=",".join(DEMO_FRAMEWORKS),
                        help="comma-separated frameworks (default: %(default)s; missing ones are skipped)")
    parser.add_argument("--models", default="resnet50",
                        help=f"comma-separated bundled models: {', '.join(zoo.MODELS)} (default: %(default)s)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="default: %(default)s")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--size", type=int, default=224, help="image size (default: %(default)s)")
    parser.add_argument("--seq", type=int, default=128, help="BERT sequence length (default: %(default)s)")
    parser.add_argument("--iters", type=int, default=5, help="timed runs of each model (default: %(default)s)")
    parser.add_argument("--level", type=int, default=2, help="optimization level (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=0,
                        help="intra-op threads of every runtime (default: the framework defaults); 1 gives "
                             "steadier figures on a busy machine")


def main(args) -> int:
    """`aiacc demo`: 0 when every model passed the numeric check, 1 otherwise."""

    def split(s: str) -> list[str]:
        return [p.strip() for p in s.split(",") if p.strip()]

    if args.threads:
        set_threads(args.threads)
    results = run_demo(split(args.frameworks), split(args.models), batch=args.batch, size=args.size,
                       seq=args.seq, iters=args.iters, backends=split(args.backends), level=args.level)
    if not results:
        raise AiaccError("no model ran: none of the frameworks asked for is installed")
    return 0 if all(r.passed for r in results) else 1
