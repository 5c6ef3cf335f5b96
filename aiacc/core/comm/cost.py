"""Alpha-beta cost of one all-reduce: time(n bytes) = latency + n * coefficient, per algorithm.

ring (flat): the p = nodes x workers ranks form one ring; 2(p-1) steps (reduce-scatter, then
    all-gather), each moving n/p bytes over the slowest link and paying its latency. Ranks are ordered
    by node, so one ring edge per node crosses the network.
hierarchical: reduce-scatter inside each node (w-1 steps over intra links), then an all-reduce of the
    n/w shards across the N nodes (w rings that share the node's interface, so the interface carries
    2(N-1)/N * n bytes), then an all-gather inside the node.
hierarchical-tree: the same, with the inter-node step on NCCL-style double binary trees: each node
    sends and receives 2n bytes, but latency grows with 2 log2(N) instead of 2(N-1).

Both are linear in n, so a plan's cost is a sum of (latency + n * coef) terms; "auto" picks the
cheaper algorithm for each message, like NCCL's tuner.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from aiacc.core.comm.errors import CommError
from aiacc.core.comm.spec import ClusterSpec

ALGORITHMS = ("ring", "hierarchical", "hierarchical-tree", "auto")


@dataclass(frozen=True)
class Linear:
    """time(n) = latency + coef * n."""

    latency: float
    coef: float

    def __call__(self, nbytes):
        return self.latency + self.coef * nbytes


class CostModel:
    """All-reduce times on a cluster."""

    def __init__(self, cluster: ClusterSpec, algorithm: str = "auto"):
        if algorithm not in ALGORITHMS:
            raise CommError(f"unknown all-reduce algorithm {algorithm!r}; expected one of {ALGORITHMS}")
        self.cluster = cluster
        self.algorithm = algorithm
        self.terms = self._terms()

    def _terms(self) -> dict[str, Linear]:
        c = self.cluster
        n_nodes, w, p = c.nodes, c.workers_per_node, c.world_size
        if p == 1:
            zero = Linear(0.0, 0.0)
            return {"ring": zero, "hierarchical": zero, "hierarchical-tree": zero}
        if n_nodes == 1:
            ring = Linear(2 * (p - 1) * c.intra_latency, 2 * (p - 1) / p / c.intra_bandwidth)
            return {"ring": ring, "hierarchical": ring, "hierarchical-tree": ring}
        slow_bw = min(c.inter_bandwidth, c.intra_bandwidth) if w > 1 else c.inter_bandwidth
        ring = Linear(2 * (p - 1) * c.inter_latency, 2 * (p - 1) / p / slow_bw)
        inter = Linear(2 * (n_nodes - 1) * c.inter_latency, 2 * (n_nodes - 1) / n_nodes / c.inter_bandwidth)
        tree = Linear(2 * math.ceil(math.log2(n_nodes)) * c.inter_latency, 2 / c.inter_bandwidth)
        if w == 1:
            return {"ring": ring, "hierarchical": inter, "hierarchical-tree": tree}
        intra = Linear(2 * (w - 1) * c.intra_latency, 2 * (w - 1) / w / c.intra_bandwidth)
        return {"ring": ring, "hierarchical": Linear(inter.latency + intra.latency, inter.coef + intra.coef),
                "hierarchical-tree": Linear(tree.latency + intra.latency, tree.coef + intra.coef)}

    def time(self, nbytes, algorithm: str | None = None):
        """Seconds for one all-reduce of `nbytes` (a number or a numpy array)."""
        algorithm = algorithm or self.algorithm
        if algorithm == "auto":
            if isinstance(nbytes, np.ndarray):
                return np.minimum.reduce([t(nbytes) for t in self.terms.values()])
            return min(t(nbytes) for t in self.terms.values())
        if algorithm not in self.terms:
            raise CommError(f"unknown all-reduce algorithm {algorithm!r}; expected one of {ALGORITHMS}")
        return self.terms[algorithm](nbytes)

    def best_algorithm(self, nbytes: float) -> str:
        if self.algorithm != "auto":
            return self.algorithm
        return min(self.terms, key=lambda a: self.terms[a](nbytes))

    def bound_terms(self) -> Linear:
        """A linear function below every algorithm's cost: no set of messages carrying n bytes in total
        takes less than latency + coef * n."""
        ts = list(self.terms.values()) if self.algorithm == "auto" else [self.terms[self.algorithm]]
        return Linear(min(t.latency for t in ts), min(t.coef for t in ts))
