"""What every framework plugin shares: the optimize() flow (trace, passes, export, verify).

A plugin subclasses `Translator` with its framework's import, export and run, and its package exposes
`trace`, `optimize` and `export` built from it (see `plugin_api`).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from aiacc.core.ir import Graph
from aiacc.errors import VerificationError


class Translator:
    """Framework-specific half of a plugin. Subclasses override the four methods below."""

    framework = "?"
    rtol = 1e-4
    atol = 1e-5

    def trace(self, model: Any, example_inputs: Any, **options: Any) -> Graph:
        """Translate `model` into an IR graph (inference or training semantics as options say)."""
        raise NotImplementedError

    def export(self, graph: Graph, *, original: Any = None, backend: str = "native", **options: Any) -> Any:
        """Turn an (optimized) graph back into a model of this framework, or one that runs `backend`."""
        raise NotImplementedError

    def run(self, model: Any, example_inputs: Any) -> list[np.ndarray]:
        """Run a model of this framework; outputs flattened to a list of numpy arrays (NCHW where the
        graph is NCHW is not required: only original-vs-optimized comparisons use this)."""
        raise NotImplementedError

    def feeds(self, graph: Graph, example_inputs: Any) -> dict[str, np.ndarray] | None:
        """The example inputs as IR feeds (graph input name -> array in the IR's layout), for per-pass
        numerics checks on the reference executor; None when the plugin cannot provide them."""
        return None


def compare_outputs(expected: Sequence[np.ndarray], actual: Sequence[np.ndarray], rtol: float, atol: float,
                    what: str) -> None:
    """Raise VerificationError naming the first output that differs beyond tolerance."""
    if len(expected) != len(actual):
        raise VerificationError(f"{what}: {len(actual)} outputs, the original has {len(expected)}")
    for i, (e, a) in enumerate(zip(expected, actual)):
        e, a = np.asarray(e), np.asarray(a)
        if e.shape != a.shape:
            raise VerificationError(f"{what}: output {i} has shape {list(a.shape)}, the original {list(e.shape)}")
        if e.dtype.kind in "fc":
            scale = max(float(np.max(np.abs(e))) if e.size else 0.0, 1e-30)
            err = float(np.max(np.abs(e.astype(np.float64) - a.astype(np.float64)))) if e.size else 0.0
            if not np.isfinite(err) or err > atol + rtol * scale:
                raise VerificationError(f"{what}: output {i} differs from the original by {err:.3g} "
                                        f"(max |original| {scale:.3g}, tolerance rtol={rtol} atol={atol})")
        elif not np.array_equal(e, a):
            raise VerificationError(f"{what}: output {i} differs from the original")


def optimize_model(translator: Translator, model: Any, example_inputs: Any, *, level: int = 2,
                   passes: Any = None, disable: Any = None, backend: str = "native", verify: bool = True,
                   debug: bool = False, **options: Any) -> Any:
    """trace -> core passes -> export -> (verify against the original on the example inputs)."""
    graph = translator.trace(model, example_inputs, **options)
    report = None
    if level > 0 or passes:
        from aiacc.core.passes import run_passes

        feeds = translator.feeds(graph, example_inputs) if debug else None
        report = run_passes(graph, level=level, passes=passes, disable=disable, debug=debug, feeds=feeds,
                            mode=options.get("mode", "inference"))
    out = translator.export(graph, original=model, backend=backend, **options)
    if verify and example_inputs is not None:
        expected = translator.run(model, example_inputs)
        actual = translator.run(out, example_inputs)
        try:
            compare_outputs(expected, actual, translator.rtol, translator.atol,
                            f"aiacc.optimize ({translator.framework}, backend={backend})")
        except VerificationError as e:
            culprit = _find_culprit(translator, model, example_inputs, level, passes, disable, options)
            raise VerificationError(f"{e}; {culprit}") from None
    try:
        out.aiacc_report = report
    except (AttributeError, TypeError):
        pass
    return out


def _find_culprit(translator, model, example_inputs, level, passes, disable, options) -> str:
    """Replay the passes in debug mode on the reference executor to name the pass that broke numerics."""
    if not (level > 0 or passes):
        return "no pass ran: the translation itself differs"
    from aiacc.core.passes import run_passes

    graph = translator.trace(model, example_inputs, **options)
    feeds = translator.feeds(graph, example_inputs)
    if feeds is None:
        return "the plugin cannot replay the passes to name the one responsible"
    try:
        run_passes(graph, level=level, passes=passes, disable=disable, debug=True, feeds=feeds,
                   mode=options.get("mode", "inference"))
    except VerificationError as e:
        return str(e)
    return "every pass preserves numerics on the reference executor: the export (lowering) differs"


def plugin_api(translator: Translator):
    """The module-level trace / optimize / export functions of a plugin built on `translator`."""

    def trace(model: Any, example_inputs: Any = None, **options: Any) -> Graph:
        return translator.trace(model, example_inputs, **options)

    def optimize(model: Any, example_inputs: Any = None, **options: Any) -> Any:
        return optimize_model(translator, model, example_inputs, **options)

    def export(graph: Graph, **options: Any) -> Any:
        return translator.export(graph, **options)

    return trace, optimize, export
