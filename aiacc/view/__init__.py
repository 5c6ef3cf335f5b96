"""See the optimization: one self-contained HTML page with the graph, the passes, the memory plan and,
for data-parallel training, the gradient buckets and a timeline per rank.

    aiacc.view(model, example_inputs, optimize=True, output="report.html")
    aiacc view model.onnx --optimize -o report.html --trace timeline.json     # the same from the shell

The graph is laid out by Graphviz's `dot` (needs the `graphviz` system package) and drawn as SVG; pan
and zoom are svg-pan-zoom's (vendored in aiacc/view/static with its BSD license); the memory plot and the
timeline are SVG drawn here from the numbers. Nothing on the page is fetched: it opens offline.
`--trace` writes the timeline in the Chrome trace-event format (chrome://tracing, ui.perfetto.dev).
"""
from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any, Mapping

from aiacc.errors import AiaccError

__all__ = ["view", "write_svg"]


def _as_graph(model_or_graph: Any, example_inputs: Any):
    from aiacc.core.ir import Graph

    if isinstance(model_or_graph, Graph):
        return model_or_graph.copy(), model_or_graph.name
    if isinstance(model_or_graph, (str, os.PathLike)):
        from aiacc.cli import load_graph

        return load_graph(os.fspath(model_or_graph)), os.fspath(model_or_graph)
    import aiacc

    g = aiacc.trace(model_or_graph, example_inputs)
    return g, g.name or type(model_or_graph).__name__


def view(model_or_graph: Any, example_inputs: Any = None, optimize: bool = False, output: str | os.PathLike =
         "report.html", *, level: int = 2, passes: Any = None, disable: Any = None, dims: Mapping[str, int] | None
         = None, memory: bool = True, data_parallel: int | None = None, workers_per_node: int = 8,
         network_gbps: float = 25.0, strategy: str = "aiacc", compression: str = "none",
         trace: str | os.PathLike | None = None, timeline: str | os.PathLike | None = None,
         title: str | None = None) -> Path:
    """Write the HTML view of a model (a framework model with its example inputs, a model file, or an IR
    Graph) to `output` and return its path.

    optimize: also run the passes (level / passes / disable as in aiacc.optimize) and show before and
    after side by side with the pass report; dims: sizes of symbolic dimensions (default 1) for FLOPs and
    the memory plan; memory: plan memory (of the optimized graph when optimize); data_parallel: number of
    workers to plan and simulate gradient communication for (strategy, compression, workers_per_node,
    network_gbps as in aiacc.core.comm); trace: also write that timeline as a Chrome trace (implies
    data_parallel=8 when not given); timeline: a Chrome trace recorded by hvd.start_timeline, drawn too.
    """
    from aiacc.view.comm import load_trace, plan_data_parallel, simulated_trace, write_trace
    from aiacc.view.report import build_report, write_report

    before, name = _as_graph(model_or_graph, example_inputs)
    after = report = None
    if optimize:
        from aiacc.core.passes import run_passes

        after = before.copy()
        report = run_passes(after, level=level, passes=passes, disable=disable)
    bind = dict(dims or {})
    plan = memory_error = memory_note = None
    if memory:
        from aiacc.core.stats import graph_symbols
        from aiacc.view.memory import plan_for_view

        target = after if after is not None else before
        try:
            plan, memory_note = plan_for_view(target, {s: int(bind.get(s, 1)) for s in graph_symbols(target)})
        except AiaccError as e:  # e.g. an opaque node of unknown output shape: show the rest
            memory_error = str(e)
    if trace is not None and data_parallel is None:
        data_parallel = 8
    dp = None
    if data_parallel:
        dp = plan_data_parallel(before, workers=int(data_parallel), workers_per_node=workers_per_node,
                                network_gbps=network_gbps, strategy=strategy, compression=compression)
    recorded = load_trace(timeline) if timeline is not None else None
    page, _ = build_report(before, after, report, title=title or str(name), plan=plan, memory_error=memory_error, memory_note=memory_note,
                           dp=dp, recorded_trace=recorded, bind=bind)
    path = write_report(page, output)
    if trace is not None:
        write_trace(simulated_trace(dp[3], dp[1].world_size), trace)
    return path


def write_svg(graph, path: str | os.PathLike) -> Path:
    """Draw `graph` with Graphviz's dot into an SVG file (`aiacc dump --format svg`)."""
    from aiacc.core.stats import graph_symbols, node_flops
    from aiacc.view.graph import draw

    bind = {s: 1 for s in graph_symbols(graph)}
    drawn = draw(graph, "n", {n.name: node_flops(n, bind) for n in graph})
    path = Path(path)
    path.write_text('<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n' + drawn.svg, encoding="utf-8")
    return path


class _CallableModule(types.ModuleType):
    """`aiacc.view(...)` keeps working once importing this subpackage has made `aiacc.view` the module."""

    def __call__(self, *args: Any, **kwargs: Any) -> Path:
        return view(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
