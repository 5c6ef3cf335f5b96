"""Chrome trace export of a simulated timeline (open in chrome://tracing or https://ui.perfetto.dev)."""
from __future__ import annotations

import json
from pathlib import Path

from aiacc.core.comm.simulate import SimResult

_LANES = {"compute": 1, "network": 2}


def chrome_trace(result: SimResult) -> dict:
    """The timeline as a Chrome trace-event document (times in microseconds)."""
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"aiacc plan: {result.strategy}"}}]
    for lane, tid in _LANES.items():
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": lane}})
    for e in result.events:
        events.append({"name": e.name, "cat": e.lane, "ph": "X", "pid": 0, "tid": _LANES[e.lane],
                       "ts": e.start * 1e6, "dur": max(0.0, e.end - e.start) * 1e6, "args": e.args})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"strategy": result.strategy, "iteration_s": result.iteration_s,
                          "compute_s": result.compute_s, "exposed_s": result.exposed_s}}


def write_chrome_trace(result: SimResult, path: str | Path) -> Path:
    """Write `chrome_trace(result)` as JSON to `path`."""
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(result)))
    return path
