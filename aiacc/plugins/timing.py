"""Timing candidates against each other at optimize time, the one way every measured choice does it (the
training step, backend="auto", the torch int8 kernels): interleaved rounds in a rotated order, so that no
candidate always runs right after the same one on a machine whose load changes, and medians, so that one
load spike does not decide. Imports no framework."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

# Level 3 keeps a per-node kernel only where it timed at most this fraction of level 2's: a node timed alone at
# 0.96-0.99x is within the drift of this machine, and such keeps once left a whole MobileNetV3 at 1.12x level 2.
KEEP_BELOW = 0.95


def keep_note(what: str, ratio: float) -> tuple[bool, str]:
    """(kept, note) for a per-node candidate timed at `ratio` of level 2's time, by KEEP_BELOW."""
    if ratio < KEEP_BELOW:
        return True, f"kept: {what} {ratio:.2f}x"
    if ratio < 1.0:
        return False, f"dropped: {what} {ratio:.2f}x, not below {KEEP_BELOW:.2f}x"
    return False, f"dropped: {what} slower {ratio:.2f}x"


def interleaved_times(fns: dict[str, Callable[[], Any]], rounds: int = 5, warmup: int = 0,
                      max_rounds: int | None = None, max_seconds: float = float("inf"),
                      ambiguous: float = 0.0,
                      settled: Callable[[dict[str, list[float]]], bool] | None = None) -> dict[str, list[float]]:
    """Seconds of every timed call of each function: `warmup` untimed calls each, then `rounds` rounds
    calling each once, the order rotated every round. After those, while the two fastest medians are within
    `ambiguous` (a fraction) of each other (or, given `settled`, until settled(times so far) is true: the
    caller's own stopping rule), more rounds, up to `max_rounds` rounds in all and `max_seconds` of timed
    rounds."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    limit = max(rounds, max_rounds or rounds)
    start, done = time.perf_counter(), 0
    while True:
        for name in names[done % len(names):] + names[:done % len(names)]:
            t = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t)
        done += 1
        if done < rounds:
            continue
        if settled is not None:
            close = not settled(times)
        else:
            medians = sorted(statistics.median(v) for v in times.values())
            close = len(medians) > 1 and medians[1] <= medians[0] * (1 + ambiguous)
        if not close or done >= limit or time.perf_counter() - start > max_seconds:
            return times


def interleaved_medians(fns: dict[str, Callable[[], Any]], rounds: int = 5, warmup: int = 0,
                        max_rounds: int | None = None, max_seconds: float = float("inf"),
                        ambiguous: float = 0.0) -> dict[str, float]:
    """Median milliseconds per call of each function, timed as `interleaved_times` does."""
    times = interleaved_times(fns, rounds, warmup, max_rounds, max_seconds, ambiguous)
    return {name: statistics.median(v) * 1e3 for name, v in times.items()}
