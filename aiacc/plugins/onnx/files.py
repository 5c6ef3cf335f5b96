"""ONNX files for the `aiacc` command: `.onnx` in, optimized `.onnx` out.

    graph = load_graph("model.onnx")
    optimize_file("model.onnx", "fast.onnx")      # a FileReport: written, passes, model (the IR graph)

aiacc's own graph files (.json/.aiacc + .npz) take the same path: the command passes their reader and
writer as `load=` and `save=`.
"""
from __future__ import annotations

from typing import Any, Callable

from aiacc.core.ir import Graph
from aiacc.errors import UnsupportedError
from aiacc.plugins.base import FileReport


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
                  debug: bool = False, mode: str = "inference", load: Callable[[str], Graph] | None = None,
                  save: Callable[[Graph, str], list[str]] | None = None, **_: Any) -> FileReport:
    """Run the pass pipeline on the graph of `path`, check the graph's invariants and write it at `out`.
    `load(path)` reads the graph (default: an .onnx file), `save(graph, out)` writes it and returns the
    paths written (default: an .onnx file)."""
    graph = (load or load_graph)(path)
    try:
        from aiacc.core.passes import run_passes
    except ImportError as e:
        raise UnsupportedError(f"optimizing needs aiacc.core.passes ({e})") from e
    report = run_passes(graph, level=level, passes=passes, disable=disable, debug=debug, mode=mode)
    graph.verify()
    written = (save or save_graph)(graph, out)
    return FileReport(str(path), "onnx", list(written), report, graph)
