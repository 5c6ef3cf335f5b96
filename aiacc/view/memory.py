"""The memory plan as a picture: live bytes at each step of the schedule, drawn as inline SVG.

The curve is recomputed from the plan's allocations (a value and the input it takes over in place are
one buffer, sizes rounded to the plan's alignment), so its highest point is the plan's lower bound and
sits at the plan's peak step; the arena, the lower bound and the naive total are horizontal lines.
"""
from __future__ import annotations

import html
from typing import Any

import numpy as np

from aiacc.core.ir import Graph, TensorType
from aiacc.core.memory import MemoryPlan, align, plan_memory
from aiacc.errors import ShapeError


def plan_for_view(graph: Graph, dims: dict[str, int]) -> tuple[MemoryPlan, str | None]:
    """plan_memory with symbolic dims bound; where shapes still are not static (a Slice whose ends come
    from a Shape), the plan is made on a copy whose inputs have the bound shapes and whose shape
    computations are folded to constants. Returns (plan, a note saying so or None)."""
    try:
        return plan_memory(graph, dims=dims), None
    except ShapeError:
        pass
    from aiacc.core.ops import infer_node
    from aiacc.core.passes import run_passes

    g = graph.copy()
    for v in g.inputs:
        if v.type is not None and v.shape is not None:
            v.type = TensorType(v.dtype, tuple(int(dims.get(d, 1)) if isinstance(d, str) else d for d in v.shape))
    run_passes(g, passes=["constant_folding", "dce"])  # Shape of a now static input becomes a constant
    for n in g:
        if n.schema is not None:
            infer_node(n)
    return plan_memory(g, dims=dims), ("planned on a copy with the inputs' shapes bound and the shape "
                                       "computations folded to constants (the graph has shapes that depend on "
                                       "the input's values)")


def live_bytes(plan: MemoryPlan) -> np.ndarray:
    """Bytes live at each step of `plan.schedule` (buffers shared in place counted once)."""
    steps = len(plan.schedule)
    root: dict[str, str] = {}

    def find(name: str) -> str:
        while plan.allocations[name].shares is not None and plan.allocations[name].shares in plan.allocations:
            name = plan.allocations[name].shares
        return name

    spans: dict[str, list[int]] = {}  # buffer -> [size, start, end]
    for name, a in plan.allocations.items():
        root[name] = r = find(name)
        size = align(a.nbytes, plan.alignment)
        s = spans.setdefault(r, [size, a.start, a.end])
        s[0], s[1], s[2] = max(s[0], size), min(s[1], a.start), max(s[2], a.end)
    delta = np.zeros(steps + 1, dtype=np.int64)
    for size, start, end in spans.values():
        delta[start] += size
        delta[end + 1] -= size
    return np.cumsum(delta[:-1]) if steps else np.zeros(0, np.int64)


def memory_facts(plan: MemoryPlan) -> dict[str, Any]:
    """The numbers the page shows: figures, the curve, the peak and what is live there (largest first)."""
    prof = live_bytes(plan)
    peak = plan.peak_node
    live = sorted(({"value": n, "bytes": plan.allocations[n].nbytes, "dtype": plan.allocations[n].dtype,
                    "shape": list(plan.allocations[n].shape),
                    "steps": [plan.allocations[n].start, plan.allocations[n].end],
                    "shares": plan.allocations[n].shares} for n in plan.peak_values), key=lambda d: -d["bytes"])
    return {
        "arena": plan.arena_bytes, "lower_bound": plan.lower_bound_bytes, "naive": plan.naive_bytes,
        "import_order_bound": plan.import_order_bound_bytes, "schedule_source": plan.schedule_source,
        "inplace": plan.inplace_count, "values": len(plan.allocations), "alignment": plan.alignment,
        "peak_step": plan.peak_step, "peak_node": None if peak is None else peak.name,
        "peak_op": None if peak is None else peak.qualified_op, "peak_live": live,
        "profile": prof.tolist(), "steps": [n.name for n in plan.schedule], "dims": dict(plan.dims),
    }


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def memory_svg(facts: dict[str, Any], width: int = 900, height: int = 280) -> str:
    """An SVG plot of live bytes over the schedule with the peak marked (id `mem-peak`) and the arena,
    lower bound and naive totals as lines."""
    prof = facts["profile"]
    left, right, top, bottom = 70, 160, 16, 36
    w, h = width - left - right, height - top - bottom
    ymax = max([facts["arena"], facts["lower_bound"], 1] + list(prof)) * 1.08
    n = max(len(prof), 1)
    x = lambda i: left + w * (i + 0.5) / n
    y = lambda b: top + h * (1 - b / ymax)
    out = [f'<svg id="mem-plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="live bytes over the schedule">',
           f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fafafa" stroke="#ccc"/>']
    for k in range(5):  # y grid
        b = ymax * k / 4
        out.append(f'<line x1="{left}" x2="{left + w}" y1="{y(b):.1f}" y2="{y(b):.1f}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{y(b) + 4:.1f}" text-anchor="end" font-size="10">{_mib(b)}</text>')
    if prof:
        pts = []
        for i, b in enumerate(prof):  # a step plot: each step holds its value across its width
            pts.append(f"{left + w * i / n:.1f},{y(b):.1f}")
            pts.append(f"{left + w * (i + 1) / n:.1f},{y(b):.1f}")
        area = f"{left:.1f},{y(0):.1f} " + " ".join(pts) + f" {left + w:.1f},{y(0):.1f}"
        out.append(f'<polygon class="mem-area" points="{area}" fill="#bbdefb" stroke="none"/>')
        out.append(f'<polyline id="mem-curve" points="{" ".join(pts)}" fill="none" stroke="#1565c0" '
                   f'stroke-width="1.5"/>')
    label_y: list[float] = []  # right-hand labels, moved apart where two figures are close

    def place(want: float) -> float:
        for used in sorted(label_y):
            if abs(want - used) < 13:
                want = used + 13
        label_y.append(want)
        return want

    for key, label, color in (("lower_bound", "lower bound", "#6a1b9a"), ("arena", "arena", "#2e7d32"),
                              ("naive", "naive", "#c62828")):
        b = facts[key]
        if b > ymax:
            out.append(f'<text x="{left + w + 6}" y="{place(top + 10):.1f}" font-size="11" fill="{color}">'
                       f'{label} {_mib(b)} (off the top)</text>')
            continue
        out.append(f'<line class="mem-line" data-figure="{key}" x1="{left}" x2="{left + w}" y1="{y(b):.1f}" '
                   f'y2="{y(b):.1f}" stroke="{color}" stroke-dasharray="5,3"/>'
                   f'<text x="{left + w + 6}" y="{place(y(b) + 4):.1f}" font-size="11" fill="{color}">{label} '
                   f'{_mib(b)}</text>')
    if prof:
        i = facts["peak_step"]
        px, py = x(i), y(prof[i])
        label = html.escape(f"peak {_mib(prof[i])} at step {i}: {facts['peak_node']} ({facts['peak_op']})")
        anchor = "end" if px > left + w / 2 else "start"
        out.append(f'<g id="mem-peak" class="peak" data-step="{i}" data-bytes="{prof[i]}">'
                   f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{top}" y2="{top + h}" stroke="#d32f2f" '
                   f'stroke-width="1"/><circle cx="{px:.1f}" cy="{py:.1f}" r="5" fill="#d32f2f"/>'
                   f'<text x="{px + (-8 if anchor == "end" else 8):.1f}" y="{py - 8:.1f}" text-anchor="{anchor}" '
                   f'font-size="11" fill="#d32f2f">{label}</text></g>')
    out.append(f'<text x="{left + w / 2}" y="{height - 8}" text-anchor="middle" font-size="11">schedule step '
               f'(0..{len(prof) - 1}, schedule: {html.escape(facts["schedule_source"])})</text>')
    out.append("</svg>")
    return "".join(out)
