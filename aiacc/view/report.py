"""The HTML report: one self-contained file (styles, scripts, SVGs and data inlined; nothing fetched).

Sections: the graph (before and after optimization side by side, with the node facts panel), the pass
report, the memory plan, and for data-parallel training the gradient buckets and the timeline.
"""
from __future__ import annotations

import html
import json
import time
from importlib import resources
from pathlib import Path
from typing import Any

from aiacc.core.ir import Graph
from aiacc.core.stats import format_bytes, format_count, graph_stats, graph_symbols, node_flops
from aiacc.errors import AiaccError
from aiacc.view.comm import comm_facts, simulated_trace, timeline_svg, trace_lanes
from aiacc.view.graph import draw
from aiacc.view.memory import memory_facts, memory_svg


def _static(name: str) -> str:
    return resources.files("aiacc.view").joinpath("static", name).read_text(encoding="utf-8")


def _script_json(obj: Any) -> str:
    """JSON safe inside <script type="application/json"> (no "</" can end the element early)."""
    return json.dumps(obj, default=str).replace("</", "<\\/")


def _panel(name: str, title: str, svg: str) -> str:
    return (f'<div class="panel" id="panel-{name}"><h3>{html.escape(title)}</h3>'
            f'<div class="canvas" id="canvas-{name}">{svg}</div></div>')


def _pass_table(report, after_ids: dict[str, str], fused_nodes: list[dict]) -> str:
    rows = []
    for r in report.records:
        ops = ", ".join([f"-{k}&times;{v}" for k, v in r.ops_removed.items()]
                        + [f"+{k}&times;{v}" for k, v in r.ops_added.items()])
        rules = ", ".join(f"{html.escape(k.removeprefix('rule:'))}&times;{v}" for k, v in r.counters.items())
        rows.append(f'<tr class="pass-row" data-pass="{html.escape(r.name)}"><td class="l">{html.escape(r.name)}</td>'
                    f"<td>{r.rewrites}</td><td>{r.removed}</td><td>{r.added}</td><td>{r.fused}</td>"
                    f"<td>{html.escape(format_bytes(max(r.const_bytes_saved, 0)))}</td><td>{r.seconds * 1e3:.1f}</td>"
                    f'<td class="l">{ops}</td><td class="l">{rules}</td></tr>')
    head = ("<tr><th class='l'>pass</th><th>rewrites</th><th>removed</th><th>added</th><th>fused</th>"
            "<th>const saved</th><th>ms</th><th class='l'>ops</th><th class='l'>rules fired</th></tr>")
    fused = "".join(f'<tr><td class="l"><a data-goto="{after_ids[f["name"]]}" href="#graph">{html.escape(f["name"])}</a>'
                    f'</td><td class="l">{html.escape(f["op"])}</td><td class="l">{html.escape(f["rule"] or "")}</td>'
                    f'<td class="l">{html.escape(", ".join(f["fused_from"]))}</td></tr>'
                    for f in fused_nodes if f["name"] in after_ids)
    out = (f"<p>level {report.level}, {report.mode}: {report.nodes_before} &rarr; {report.nodes_after} nodes in "
           f"{report.seconds * 1e3:.0f} ms; constants {html.escape(format_bytes(report.const_bytes_before))} &rarr; "
           f"{html.escape(format_bytes(report.const_bytes_after))}</p>"
           f'<div class="scroll"><table class="data" id="pass-table">{head}{"".join(rows)}</table></div>')
    if fused:
        out += ("<details open><summary>fused nodes and the nodes they replaced</summary><div class='scroll'>"
                "<table class='data' "
                "id='fused-table'><tr><th class='l'>fused node</th><th class='l'>op</th><th class='l'>rule</th>"
                f"<th class='l'>replaced</th></tr>{fused}</table></div></details>")
    return out


def _memory_section(facts: dict) -> str:
    live = "".join(f'<tr><td class="l">%{html.escape(v["value"])}</td><td class="l">{html.escape(v["dtype"])}'
                   f'{html.escape(str(v["shape"]))}</td><td>{html.escape(format_bytes(v["bytes"]))}</td>'
                   f'<td>{v["steps"][0]}..{v["steps"][1]}</td><td class="l">'
                   f'{"in place of %" + html.escape(v["shares"]) if v["shares"] else ""}</td></tr>'
                   for v in facts["peak_live"])
    ratio = facts["arena"] / max(facts["lower_bound"], 1)
    dims = ", ".join(f"{k}={v}" for k, v in facts["dims"].items())
    return (f'<table class="data" id="mem-figures"><tr><th class="l">figure</th><th>bytes</th><th class="l">note</th></tr>'
            f'<tr><td class="l">arena</td><td>{html.escape(format_bytes(facts["arena"]))}</td><td class="l">'
            f'{ratio:.3f}&times; the lower bound</td></tr>'
            f'<tr><td class="l">lower bound</td><td>{html.escape(format_bytes(facts["lower_bound"]))}</td>'
            f'<td class="l">peak of live bytes on the schedule ({html.escape(facts["schedule_source"])}, '
            f'{facts["inplace"]} values in place)</td></tr>'
            f'<tr><td class="l">naive</td><td>{html.escape(format_bytes(facts["naive"]))}</td><td class="l">'
            f'{facts["values"]} values, each in its own buffer</td></tr></table>'
            + (f'<p class="note">symbolic dimensions bound: {html.escape(dims)}</p>' if dims else "")
            + f'<div class="scroll">{memory_svg(facts)}</div>'
            f'<h3>live at the peak: step {facts["peak_step"]}, {html.escape(str(facts["peak_node"]))} '
            f'({html.escape(str(facts["peak_op"]))})</h3><div class="scroll"><table class="data" id="peak-live">'
            f'<tr><th class="l">value</th><th class="l">type</th><th>bytes</th><th>steps</th><th class="l"></th></tr>'
            f'{live}</table></div>')


def _ms(t: float | None) -> str:
    return "" if t is None else f"{t * 1e3:.3f}"


def _comm_section(facts: dict, lanes: list[dict], recorded: list[dict] | None) -> str:
    rows = "".join(f'<tr><td>{b["index"]}</td><td>{html.escape(format_bytes(b["bytes"]))}</td><td>{b["pieces"]}</td>'
                   f'<td>{_ms(b["start_s"])}</td><td>{_ms(b["end_s"])}</td>'
                   f'<td class="l">{html.escape(", ".join(b["tensors"][:6]))}'
                   f'{" ..." if len(b["tensors"]) > 6 else ""}</td></tr>' for b in facts["buckets"])
    out = (f'<p>strategy <b>{html.escape(facts["strategy"])}</b> ({html.escape(facts["scheduling"])}, compression '
           f'{html.escape(facts["compression"])}) on {facts["workers"]} workers ({facts["nodes"]} nodes &times; '
           f'{facts["workers_per_node"]}, {facts["network_gbps"]:.0f} Gbit/s between nodes): '
           f'{len(facts["buckets"])} buckets for {html.escape(format_bytes(facts["gradient_bytes"]))} of gradients; '
           f'simulated iteration {facts["iteration_s"] * 1e3:.2f} ms, compute {facts["compute_s"] * 1e3:.2f} ms, '
           f'exposed communication {facts["exposed_s"] * 1e3:.2f} ms</p>'
           f'<div class="scroll"><table class="data" id="bucket-table"><tr><th>bucket</th><th>bytes</th>'
           f'<th>pieces</th><th>start ms</th><th>end ms</th><th class="l">tensors</th></tr>{rows}</table></div>'
           f'<h3>simulated timeline per rank</h3><p class="note">the simulator models synchronous data '
           f'parallelism, so every rank runs the same schedule; the first {len(lanes) // 2} ranks are drawn. '
           f'A real run records each rank\'s own times with hvd.start_timeline(path).</p>'
           f'<div class="scroll">{timeline_svg(lanes)}</div>')
    if recorded:
        out += ('<h3>recorded timeline</h3><div class="scroll">'
                f'{timeline_svg(recorded, svg_id="recorded-timeline")}</div>')
    return out


def build_report(before: Graph, after: Graph | None, pass_report, *, title: str, plan=None,
                 memory_error: str | None = None, memory_note: str | None = None, dp=None, recorded_trace: dict | None = None,
                 bind: dict[str, int] | None = None) -> tuple[str, dict]:
    """The HTML page and its data. `dp` is (model spec, cluster, plan, simulated result) or None."""
    t0 = time.perf_counter()
    bind = dict(bind or {})
    for g in (before, after):
        if g is not None:
            for s in graph_symbols(g):
                bind.setdefault(s, 1)
    notes: list[str] = []
    graphs: dict[str, Any] = {}
    panels = []
    shown = [("before", "b", before, "before optimization" if after is not None else before.name)]
    if after is not None:
        shown.append(("after", "a", after, "after optimization"))
    for key, prefix, g, label in shown:
        drawn = draw(g, prefix, {n.name: node_flops(n, bind) for n in g})
        graphs[key] = {"nodes": drawn.nodes, "ids": drawn.ids, "layout": drawn.layout, "count": len(g)}
        notes += [f"{label}: {n}" for n in drawn.notes]
        panels.append(_panel(key, f"{label}: {len(g)} nodes", drawn.svg))
    replaced_by: dict[str, list[str]] = {}
    fused_nodes = []
    if after is not None:
        for f in graphs["after"]["nodes"].values():
            if f["fused_from"]:
                fused_nodes.append(f)
                for n in f["fused_from"]:
                    replaced_by.setdefault(n, []).append(f["name"])
    stats = graph_stats(before, bind)
    stats_after = graph_stats(after, bind) if after is not None else None
    figures = [f"{stats.nodes} nodes" + (f" &rarr; {stats_after.nodes}" if stats_after else ""),
               f"{format_count(stats.parameters)} parameters",
               f"{format_count(stats.flops)}FLOPs" + (f" &rarr; {format_count(stats_after.flops)}FLOPs" if stats_after else "")]
    if plan is not None:
        figures.append(f"arena {format_bytes(plan.arena_bytes)} (naive {format_bytes(plan.naive_bytes)})")
    data: dict[str, Any] = {"title": title, "graphs": graphs, "replaced_by": replaced_by, "notes": notes}
    sections = [f'<section id="graph"><h2>graph</h2><p class="legend"><span><i class="swatch" '
                f'style="background:#fff"></i>standard op</span><span><i class="swatch" style="background:#e8f5e9;'
                f'border-color:#2e7d32"></i>aiacc fused op</span><span><i class="swatch" style="background:#fff3e0;'
                f'border-color:#e65100;border-style:dashed"></i>opaque (the framework\'s own)</span><span>edges: '
                f'value types; drag to pan, wheel to zoom, click a node</span></p>'
                + "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes)
                + f'<div id="graphs">{"".join(panels)}<div id="info">click a node to see its attributes, '
                  f'inputs, outputs, FLOPs and the layer it came from</div></div></section>']
    nav = ['<a href="#graph">graph</a>']
    if pass_report is not None:
        sections.append(f'<section id="passes"><h2>passes</h2>'
                        f'{_pass_table(pass_report, graphs.get("after", {}).get("ids", {}), fused_nodes)}</section>')
        data["passes"] = pass_report.as_dict()
        nav.append('<a href="#passes">passes</a>')
    if plan is not None:
        mf = memory_facts(plan)
        data["memory"] = mf
        sections.append(f'<section id="memory"><h2>memory plan ({html.escape(plan.graph.name)}, '
                        f'{"after" if after is not None else "as imported"})</h2>'
                        + (f'<p class="note">{html.escape(memory_note)}</p>' if memory_note else "")
                        + f'{_memory_section(mf)}</section>')
        nav.append('<a href="#memory">memory</a>')
    elif memory_error:
        sections.append(f'<section id="memory"><h2>memory plan</h2><p class="note">no memory plan: '
                        f'{html.escape(memory_error)}</p></section>')
    if dp is not None:
        model, cluster, cplan, result = dp
        cf = comm_facts(model, cluster, cplan, result)
        trace = simulated_trace(result, cluster.world_size)
        data["comm"] = cf
        recorded = trace_lanes(recorded_trace) if recorded_trace else None
        sections.append(f'<section id="comm"><h2>data parallel</h2>{_comm_section(cf, trace_lanes(trace), recorded)}'
                        f'</section>')
        nav.append('<a href="#comm">data parallel</a>')
    elif recorded_trace:
        sections.append('<section id="comm"><h2>recorded timeline</h2><div class="scroll">'
                        f'{timeline_svg(trace_lanes(recorded_trace), svg_id="recorded-timeline")}</div></section>')
        nav.append('<a href="#comm">timeline</a>')
    data["build_seconds"] = time.perf_counter() - t0
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>aiacc view: {html.escape(title)}'
            f'</title><style>{_static("view.css")}</style></head><body>'
            f'<header><h1>aiacc view: {html.escape(title)}</h1><div class="figures">'
            + "".join(f"<span>{f}</span>" for f in figures) + f'</div></header><nav>{"".join(nav)}</nav>'
            + "".join(sections)
            + f'<script id="aiacc-data" type="application/json">{_script_json(data)}</script>'
            f'<script>{_static("svg-pan-zoom.min.js")}</script><script>{_static("view.js")}</script>'
            f'<!-- svg-pan-zoom 3.6.2 (BSD-2-Clause, https://github.com/bumbu/svg-pan-zoom) is inlined above --></body></html>')
    return page, data


def write_report(page: str, output: str | Path) -> Path:
    """Write the page; returns its path."""
    path = Path(output)
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as e:
        raise AiaccError(f"cannot write the report to {path}: {e}") from e
    return path
