"""Data-parallel plans in the view: the gradient buckets of a plan, a timeline of compute and
communication per rank (from the simulator, or recorded in a real run by hvd.start_timeline), and the
Chrome trace-event form of the same timeline (chrome://tracing, https://ui.perfetto.dev).

The simulator (aiacc.core.comm.simulate) models synchronous data parallelism: every rank runs the same
backward, the same all-reduces and the same forward, so each simulated rank's lanes are the same; a
recorded timeline has each rank's own times.
"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Sequence

from aiacc.core.comm import ClusterSpec, Plan, SimResult, chrome_trace, gradient_specs_from_graph, make_plan, simulate
from aiacc.core.ir import Graph
from aiacc.errors import UnsupportedError

RANKS_SHOWN = 4  # simulated ranks drawn (they are identical; more would only repeat them)


def plan_data_parallel(graph: Graph, *, workers: int = 8, workers_per_node: int = 8, network_gbps: float = 25.0,
                       strategy: str = "aiacc", compression: str = "none"):
    """(model spec, cluster, plan, simulated result) for training `graph` data-parallel."""
    model = gradient_specs_from_graph(graph)
    cluster = ClusterSpec.from_workers(workers, workers_per_node, network_gbps)
    plan = make_plan(strategy, model, cluster, compression=compression)
    return model, cluster, plan, simulate(model, cluster, plan)


def simulated_trace(result: SimResult, world_size: int, ranks: int = RANKS_SHOWN) -> dict:
    """The simulated iteration as a Chrome trace: one process per rank (the first `ranks` ranks)."""
    one = chrome_trace(result)
    events = []
    for r in range(min(world_size, ranks)):
        for e in one["traceEvents"]:
            e = dict(e, pid=r)
            if e["ph"] == "M" and e["name"] == "process_name":
                e["args"] = {"name": f"rank {r} (simulated: {result.strategy})"}
            events.append(e)
    return {**one, "traceEvents": events,
            "otherData": {**one["otherData"], "world_size": world_size, "source": "aiacc.core.comm.simulate"}}


def trace_lanes(trace: dict) -> list[dict[str, Any]]:
    """Complete ('X') and begin/end ('B'/'E') events of a Chrome trace as lanes:
    [{"lane": "rank 0 / network", "events": [{"name", "start", "end", "args"}]}] (seconds)."""
    names: dict[tuple, str] = {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[(e.get("pid"),)] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e.get("pid"), e.get("tid"))] = e["args"]["name"]
    lanes: dict[tuple, list] = {}
    open_: dict[tuple, list] = {}
    for e in trace.get("traceEvents", []):
        key = (e.get("pid"), e.get("tid"))
        if e.get("ph") == "X":
            lanes.setdefault(key, []).append({"name": e["name"], "start": e["ts"] / 1e6,
                                              "end": (e["ts"] + e.get("dur", 0)) / 1e6, "args": e.get("args", {})})
        elif e.get("ph") == "B":
            open_.setdefault(key + (e["name"],), []).append(e)
        elif e.get("ph") == "E":
            stack = open_.get(key + (e.get("name"),)) or next((v for k, v in open_.items() if k[:2] == key and v), None)
            if stack:
                b = stack.pop()
                lanes.setdefault(key, []).append({"name": b["name"], "start": b["ts"] / 1e6, "end": e["ts"] / 1e6,
                                                  "args": {**b.get("args", {}), **e.get("args", {})}})
    out = []
    for key in sorted(lanes, key=lambda k: (str(k[0]), str(k[1]))):
        label = f"{names.get((key[0],), f'pid {key[0]}')} / {names.get(key, f'tid {key[1]}')}"
        out.append({"lane": label, "events": sorted(lanes[key], key=lambda d: d["start"])})
    return out


def timeline_svg(lanes: Sequence[dict], width: int = 1100, lane_h: int = 22, svg_id: str = "timeline") -> str:
    """Lanes of events as an SVG Gantt chart (compute blue, network orange; a title on each bar)."""
    left, right, top = 230, 20, 10
    t0 = min((e["start"] for l in lanes for e in l["events"]), default=0.0)
    t1 = max((e["end"] for l in lanes for e in l["events"]), default=1.0)
    span = max(t1 - t0, 1e-9)
    w = width - left - right
    height = top + lane_h * len(lanes) + 30
    out = [f'<svg id="{svg_id}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}">']
    for i, lane in enumerate(lanes):
        y = top + i * lane_h
        net = "network" in lane["lane"] or "all-reduce" in lane["lane"]
        color = "#ef6c00" if net else "#1e88e5"
        out.append(f'<text x="{left - 6}" y="{y + lane_h * 0.65:.1f}" text-anchor="end" font-size="11">'
                   f'{html.escape(lane["lane"])}</text>')
        out.append(f'<rect x="{left}" y="{y + 2}" width="{w}" height="{lane_h - 4}" fill="#f5f5f5"/>')
        for e in lane["events"]:
            x = left + w * (e["start"] - t0) / span
            bw = max(w * (e["end"] - e["start"]) / span, 0.5)
            tip = f'{e["name"]}: {(e["start"] - t0) * 1e3:.3f}-{(e["end"] - t0) * 1e3:.3f} ms'
            if e.get("args"):
                tip += " " + json.dumps(e["args"], default=str)[:300]
            out.append(f'<rect class="tl-event" x="{x:.2f}" y="{y + 3}" width="{bw:.2f}" height="{lane_h - 6}" '
                       f'fill="{color}" stroke="#fff" stroke-width="0.3"><title>{html.escape(tip)}</title></rect>')
    y = top + lane_h * len(lanes) + 14
    for k in range(6):
        t = span * k / 5
        x = left + w * k / 5
        out.append(f'<text x="{x:.1f}" y="{y}" text-anchor="middle" font-size="10">{t * 1e3:.2f} ms</text>')
    out.append("</svg>")
    return "".join(out)


def comm_facts(model, cluster: ClusterSpec, plan: Plan, result: SimResult) -> dict[str, Any]:
    """The buckets (in plan order, with their bytes, pieces, tensors and simulated times) and the figures."""
    wire = plan.wire_bytes(model)
    times = {}
    for e in result.events:
        if e.lane == "network" and e.name.startswith("all-reduce #"):
            times[int(e.name.split("#")[1])] = (e.start, e.end)
    buckets = []
    for k, b in enumerate(plan.buckets):
        s, e = times.get(k, (None, None))
        buckets.append({"index": k, "bytes": wire[k], "pieces": len(b.pieces), "priority": b.priority,
                        "tensors": sorted({p.grad for p in b.pieces}), "start_s": s, "end_s": e})
    return {"strategy": plan.strategy, "scheduling": plan.scheduling, "compression": plan.compression,
            "workers": cluster.world_size, "nodes": cluster.nodes, "workers_per_node": cluster.workers_per_node,
            "network_gbps": cluster.inter_bandwidth * 8 / 1e9, "iteration_s": result.iteration_s,
            "compute_s": result.compute_s, "exposed_s": result.exposed_s, "comm_busy_s": result.comm_busy_s,
            "gradient_bytes": model.nbytes, "buckets": buckets, "issue_order": list(result.issue_order),
            "notes": plan.notes}


def load_trace(path: str | Path) -> dict:
    """A Chrome trace file (a recorded hvd timeline): the object form, or the bare array form."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UnsupportedError(f"{path}: not a readable Chrome trace ({e})") from e
    return {"traceEvents": doc} if isinstance(doc, list) else doc


def write_trace(trace: dict, path: str | Path) -> Path:
    """Write a Chrome trace document as JSON."""
    path = Path(path)
    path.write_text(json.dumps(trace))
    return path
