"""A timeline of a real data-parallel run, as in Horovod: `hvd.start_timeline(path)` ... `hvd.stop_timeline()`.

While a timeline is on, the plan executor (aiacc.distributed.executor) records on every rank when each
bucket's all-reduce started (handed to torch.distributed) and when it finished (its completion callback
ran, or `wait()` saw it done where the transport has no callback). `stop_timeline()` gathers the
events of all ranks (a collective: every rank calls it, as every rank calls start_timeline) and rank 0
writes one Chrome trace-event file: one process per rank, one lane for the all-reduces, times in
microseconds from the first event. It opens in chrome://tracing and https://ui.perfetto.dev, and
`aiacc view MODEL --timeline path` draws it next to the simulated plan.

torch is not imported here: the events are plain dicts, and gathering uses torch.distributed only when
the process joined a group.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from aiacc.distributed.process import is_initialized

_lock = threading.Lock()
_active: "_Recorder | None" = None


class _Recorder:
    def __init__(self, path: Path, rank: int):
        self.path, self.rank = path, rank
        self.events: list[dict[str, Any]] = []
        self.step = 0  # the executor's step (counted by bucket 0's starts)


def _rank() -> int:
    if not is_initialized():
        return 0
    import torch.distributed as dist

    return dist.get_rank()


def start_timeline(file_path: str | Path, mark_cycles: bool = False) -> None:
    """Start recording the all-reduces of every bucket on this rank (call it on every rank);
    `mark_cycles` is accepted for Horovod compatibility (aiacc has no cycle thread to mark)."""
    global _active
    with _lock:
        _active = _Recorder(Path(file_path), _rank())


def active() -> bool:
    """Whether a timeline is being recorded."""
    return _active is not None


def bucket_started(index: int, tensors: str, nbytes: int) -> dict[str, Any] | None:
    """Record the start of bucket `index`'s all-reduce; returns the event to finish (None when off)."""
    rec = _active
    if rec is None:
        return None
    if index == 0 and rec.events:  # every step starts its buckets in issue order, bucket 0 first
        rec.step += 1
    ev = {"name": f"all-reduce bucket {index}", "ph": "X", "pid": rec.rank, "tid": 1, "ts": time.time() * 1e6,
          "args": {"bucket": index, "bytes": int(nbytes), "tensors": tensors, "step": rec.step}}
    with _lock:
        rec.events.append(ev)
    return ev


def bucket_finished(event: dict[str, Any] | None) -> None:
    """Record that the all-reduce of `event` (from bucket_started) finished; only the first call counts."""
    if event is not None and "dur" not in event:
        event["dur"] = max(time.time() * 1e6 - event["ts"], 0.0)


def stop_timeline() -> Path | None:
    """Stop recording; gather every rank's events and write the trace on rank 0 (returns its path there,
    None on the other ranks). A collective when the process joined a group: call it on every rank."""
    global _active
    with _lock:
        rec, _active = _active, None
    if rec is None:
        return None
    events = [e for e in rec.events if "dur" in e]  # an all-reduce never finished is not drawn
    if is_initialized():
        import torch.distributed as dist

        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, events)
        if dist.get_rank() != 0:
            return None
        events = [e for part in gathered for e in part]
        world = dist.get_world_size()
    else:
        world = 1
    t0 = min((e["ts"] for e in events), default=0.0)
    out: list[dict[str, Any]] = []
    for r in range(world):
        out.append({"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r}"}})
        out.append({"name": "thread_name", "ph": "M", "pid": r, "tid": 1, "args": {"name": "network (all-reduce)"}})
    out += [dict(e, ts=e["ts"] - t0) for e in sorted(events, key=lambda e: (e["pid"], e["ts"]))]
    doc = {"traceEvents": out, "displayTimeUnit": "ms",
           "otherData": {"source": "aiacc.distributed.timeline", "world_size": world}}
    rec.path.write_text(json.dumps(doc))
    return rec.path
