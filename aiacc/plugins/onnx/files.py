"""ONNX files for the `aiacc` command: `.onnx` in, optimized `.onnx` out.

    graph = load_graph("model.onnx")
    optimize_file("model.onnx", "fast.onnx")      # a FileReport: written, passes, model (the IR graph)

aiacc's own graph files (.json/.aiacc + .npz) take the same path: the command passes their reader and
writer as `load=` and `save=`.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from aiacc.core.ir import Graph
from aiacc.errors import AiaccError, UnsupportedError, VerificationError, fallback, first_line
from aiacc.plugins.base import FileReport

RTOL, ATOL = 1e-4, 1e-5  # as the plugins' verify


def load_graph(path: str, **_: Any) -> Graph:
    """The IR graph of an .onnx file."""
    from aiacc.core.onnx import load

    return load(path)


def save_graph(graph: Graph, out: str) -> list[str]:
    """Write `graph` as an .onnx file; returns [out]."""
    from aiacc.core.onnx import save

    save(graph, out)
    return [out]


def optimize_file(path: str, out: str, *, level: int = 2, passes: Any = None, disable: Any = None,
                  debug: bool = False, mode: str = "inference", verify: bool = True, seed: int = 0,
                  load: Callable[[str], Graph] | None = None, save: Callable[[Graph, str], list[str]] | None = None,
                  **_: Any) -> FileReport:
    """Run the pass pipeline on the graph of `path`, check the graph's invariants and write it at `out`.
    With verify, the original and the optimized graph run on the same random inputs (`seed`) and must give
    the same outputs, under the same names, within 1e-4 relative (VerificationError otherwise; a warned
    fallback when neither the reference executor nor onnxruntime can run the graph). `load(path)` reads the
    graph (default: an .onnx file), `save(graph, out)` writes it and returns the paths written."""
    graph = (load or load_graph)(path)
    try:
        from aiacc.core.passes import run_passes
    except ImportError as e:
        raise UnsupportedError(f"optimizing needs aiacc.core.passes ({e})") from e
    original = graph.copy() if verify else None
    report = run_passes(graph, level=level, passes=passes, disable=disable, debug=debug, mode=mode)
    graph.verify()
    verified = verify_graphs(original, graph, str(path), seed) if verify else "not verified (verify=False)"
    written = (save or save_graph)(graph, out)
    return FileReport(str(path), "onnx", list(written), report, graph, verified)


def verify_graphs(original: Graph, optimized: Graph, what: str, seed: int = 0) -> str:
    """Run both graphs on the same random inputs: a VerificationError naming the first difference (values or
    output names), else a sentence saying what was checked. The reference executor runs them, onnxruntime
    where it cannot (an op without a kernel); when neither can, a fallback (warned; strict: an error)."""
    from aiacc.core.compare import compare_outputs
    from aiacc.core.passes.manager import random_feeds

    names, new_names = [v.name for v in original.outputs], [v.name for v in optimized.outputs]
    if names != new_names:
        raise VerificationError(f"aiacc optimize {what}: the optimized graph's outputs are named {new_names}, "
                                f"the original's {names}")
    try:
        feeds = random_feeds(original, seed)
    except VerificationError as e:
        fallback(f"verify:{what}", f"{what} was not verified: {e}")
        return f"not verified: {e}"
    try:
        expected, got, runner = _run_both(original, optimized, feeds)
    except AiaccError as e:
        fallback(f"verify:{what}", f"{what} was not verified: {e}")
        return f"not verified: {e}"
    problem = compare_outputs(expected, got, RTOL, ATOL)
    if problem:
        raise VerificationError(f"aiacc optimize {what}: on random inputs (seed {seed}) the optimized graph "
                                f"differs from the original ({runner}): {problem}")
    return f"verified: same outputs on random inputs (seed {seed}, {runner}, rtol={RTOL:g}, atol={ATOL:g})"


def _run_both(original: Graph, optimized: Graph, feeds: dict) -> tuple[list, list, str]:
    from aiacc.core.runtime import run

    try:
        ref, new = run(original, feeds), run(optimized, feeds)
        return ([ref[v.name] for v in original.outputs], [new[v.name] for v in optimized.outputs],
                "aiacc's reference executor")
    except AiaccError as e:
        why = str(e)
    try:
        from aiacc.core.onnx import to_onnx
        from aiacc.plugins.onnx.translator import _session

        outs = []
        for g in (original, optimized):
            sess = _session(to_onnx(g))
            outs.append([np.asarray(a) for a in sess.run(None, {k: feeds[k] for k in
                                                                 (i.name for i in sess.get_inputs())})])
        return outs[0], outs[1], "onnxruntime"
    except AiaccError as e:
        raise AiaccError(f"the reference executor cannot run it ({why}) and neither can onnxruntime ({e})") from e
    except Exception as e:  # noqa: BLE001 - onnxruntime's own error: the graph cannot be checked this way
        raise AiaccError(f"the reference executor cannot run it ({why}) and neither can onnxruntime "
                         f"({first_line(e)})") from e
