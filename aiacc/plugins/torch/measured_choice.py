"""The per-node measured choice that level 3's convolution rewrites share (pointwise: 1x1 conv as GEMM;
numba_op_depthwise: depthwise conv in numba): for each node a rewrite matches, keep its form only where it timed
faster than level 2's on random tensors of the node's shapes (or as the rewrite's environment switch says), and
an export planner that lowers the kept nodes. One decision per distinct shape key is timed; nodes of the same
shapes reuse it."""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from aiacc.core.ir import Graph, Node
from aiacc.plugins.torch.exporter import Fusions


def choose_per_node(graph: Graph, *, meta_key: str, mode_env: str, what: str, kind: str,
                    match: Callable[[Node], Any], make_pair: Callable[[Node, Any, Any], tuple], timer=None,
                    skip: Callable[[Node], bool] = lambda node: False,
                    unavailable: str | None = None) -> dict[str, str]:
    """For each node not `skip`ped that `match` accepts, decide (kept, note) into node.meta[meta_key]:
    `mode_env`=off drops, =on keeps, otherwise (measure) `make_pair(node, match(node), rng)`'s (candidate, level
    2) callables are timed by `timer` (numba_op._time_pair unless a test passes one) and the faster kept.
    `unavailable` (a reason) drops every match, e.g. when the candidate's runtime is not installed. Returns
    {node name: note}."""
    from aiacc.plugins.torch.numba_op import _time_pair
    from aiacc.plugins.torch.se_gate import _measured

    mode = os.environ.get(mode_env, "measure")
    timer = timer or _time_pair
    rng = np.random.default_rng(0)
    notes: dict[str, str] = {}
    seen: dict[tuple, tuple] = {}
    for node in graph:
        node.meta.pop(meta_key, None)
        if skip(node):
            continue
        got = match(node)
        if got is None:
            continue
        if unavailable is not None:
            decision = (False, f"dropped: {what} ({unavailable})")
        elif mode == "off":
            decision = (False, f"dropped: {mode_env}=off")
        elif mode == "on":
            decision = (True, f"kept: {what} ({mode_env}=on)")
        else:
            key = tuple(tuple(v.shape) if v is not None else None for v in node.inputs) + (str(got),)
            decision = _measured(seen, key, what, kind, timer, lambda: make_pair(node, got, rng))[:2]
        node.meta[meta_key] = decision
        notes[node.name] = decision[1]
    return notes


def kept_planner(meta_key: str, match: Callable[[Node], Any],
                 special: Callable[[Node, Any], Callable]) -> Callable[[Graph, Fusions], None]:
    """An export planner (exporter.FUSION_PLANNERS): each node whose meta[meta_key] says kept, not already
    claimed by another planner, is lowered by `special(node, match(node))`."""
    def plan(graph: Graph, f: Fusions) -> None:
        for node in graph:
            decision = node.meta.get(meta_key)
            if not decision or not decision[0] or id(node) in f.special or id(node) in f.skip:
                continue
            got = match(node)
            if got is not None:
                f.special[id(node)] = special(node, got)
    return plan
