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

measured: where the cluster carries `allreduce_samples` (whole all-reduces timed on the real process
group), the time of n bytes is the piecewise-linear interpolation of those samples (the largest sample's
average per-byte cost beyond it, the smallest sample's time below it), and the algorithm is "measured".
"""
from __future__ import annotations

import dataclasses
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

    def __init__(self, cluster: ClusterSpec, algorithm: str = "auto", compression: str = "none"):
        if algorithm not in ALGORITHMS:
            raise CommError(f"unknown all-reduce algorithm {algorithm!r}; expected one of {ALGORITHMS}")
        self.cluster = cluster
        self.algorithm = algorithm
        self.terms = self._terms()
        # messages of an fp16 plan are charged the fp16 samples where measured (else the fp32 ones, per byte)
        samples = cluster.allreduce_samples
        if compression == "fp16" and cluster.allreduce_samples_fp16:
            samples = cluster.allreduce_samples_fp16
        self.measured = self._measured(samples) if samples else None
        # a lone message's extra seconds over a queued one, at each size sent alone (float32 samples, by wire
        # bytes: the threads' pipelining it lacks does not depend on the dtype)
        self.alone = None
        if cluster.allreduce_samples_alone and cluster.allreduce_samples:
            xs, ys = self._measured(cluster.allreduce_samples_alone)
            queued = CostModel(dataclasses.replace(cluster, allreduce_samples_fp16=None, allreduce_samples_alone=None))
            self.alone = xs, np.maximum(0.0, ys - np.asarray(queued.time(xs), dtype=float))

    @staticmethod
    def _measured(samples) -> tuple[np.ndarray, np.ndarray]:
        """The interpolation table of measured samples: one point per size (the smallest time of a size
        given twice), made non-decreasing in size by the isotonic least-squares fit (`isotonic`): a
        larger message never costs less, and a pair out of order is replaced by its mean, not by the
        lower of the two (lowering every smaller sample to a fast larger one made plans of many small
        buckets look cheaper than they ran)."""
        by_size: dict[float, float] = {}
        for b, t in samples:
            by_size[float(b)] = min(by_size.get(float(b), float("inf")), float(t))
        xs = np.array(sorted(by_size))
        return xs, isotonic(np.array([by_size[x] for x in xs]))

    def _interp(self, nbytes):
        xs, ys = self.measured
        n = np.asarray(nbytes, dtype=float)
        out = np.interp(n, xs, ys)
        slope = (ys[-1] - ys[0]) / (xs[-1] - xs[0])  # beyond the largest sample: its average rate
        out = np.where(n > xs[-1], ys[-1] + (n - xs[-1]) * max(slope, 0.0), out)
        return out if isinstance(nbytes, np.ndarray) else float(out)

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
        if self.measured is not None:
            return self._interp(nbytes)
        algorithm = algorithm or self.algorithm
        if algorithm == "auto":
            if isinstance(nbytes, np.ndarray):
                return np.minimum.reduce([t(nbytes) for t in self.terms.values()])
            return min(t(nbytes) for t in self.terms.values())
        if algorithm not in self.terms:
            raise CommError(f"unknown all-reduce algorithm {algorithm!r}; expected one of {ALGORITHMS}")
        return self.terms[algorithm](nbytes)

    def alone_extra(self, nbytes) -> float:
        """Seconds a message of `nbytes` takes beyond `time` when it is sent alone (an idle network before it,
        no other message queued while it runs): the measured alone samples' excess over the queued cost,
        interpolated in size (from 0 at 0 bytes, the largest sample's beyond it); 0 without alone samples."""
        if self.alone is None:
            return 0.0
        xs, extra = self.alone
        return float(np.interp(float(nbytes), np.concatenate([[0.0], xs]), np.concatenate([[0.0], extra])))

    def best_algorithm(self, nbytes: float) -> str:
        """The algorithm `time` charges for a message of `nbytes` ("measured" on calibrated samples)."""
        if self.measured is not None:
            return "measured"
        if self.algorithm != "auto":
            return self.algorithm
        return min(self.terms, key=lambda a: self.terms[a](nbytes))

    def bound_terms(self) -> Linear:
        """A linear function below every algorithm's cost: no set of messages carrying n bytes in total
        takes less than latency + coef * n. On measured samples: the smallest sample's time and the
        smallest per-byte cost above it of any sample (a line below every interpolated point)."""
        if self.measured is not None:
            xs, ys = self.measured
            lat = float(ys[0])
            coef = max(0.0, float(min((y - lat) / (x - xs[0]) for x, y in zip(xs[1:], ys[1:]))))
            return Linear(max(0.0, lat - coef * float(xs[0])), coef)
        ts = list(self.terms.values()) if self.algorithm == "auto" else [self.terms[self.algorithm]]
        return Linear(min(t.latency for t in ts), min(t.coef for t in ts))

    def bound_lines(self) -> list[Linear]:
        """Lines below the cost of every message, each a valid `bound_terms` for `lower_bound` (which takes
        the largest bound over them). Analytic costs: `bound_terms`. Measured samples: `bound_terms` (the
        smallest sample's time as latency, and then the smallest per-byte slope above it, which a small
        message riding the link's burst allowance can make lower than the link's sustained rate) and
        the line through the origin at the smallest average per-byte cost of any sample (the largest
        message's, where latency is amortised: the sustained rate; no latency) and no steeper than the
        extrapolation beyond the largest sample."""
        if self.measured is None:
            return [self.bound_terms()]
        xs, ys = self.measured
        avg = float(np.min(ys / np.maximum(xs, 1e-30)))
        beyond = (ys[-1] - ys[0]) / (xs[-1] - xs[0]) if xs[-1] > xs[0] else avg
        return [self.bound_terms(), Linear(0.0, max(0.0, min(avg, float(beyond))))]


def isotonic(ys) -> np.ndarray:
    """The non-decreasing sequence closest to `ys` in least squares (pool-adjacent-violators): each run
    of values out of order becomes its mean."""
    blocks: list[list[float]] = []  # [sum, count]
    for y in map(float, ys):
        blocks.append([y, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
    return np.concatenate([np.full(int(n), s / n) for s, n in blocks]) if blocks else np.array([])


class LinearCost:
    """One alpha-beta line as a cost model (the `CostModel` interface that `lower_bound` uses)."""

    def __init__(self, line: Linear):
        self.line = line
        self.measured = None
        self.alone = None

    def alone_extra(self, nbytes) -> float:
        """No extra cost for a lone message on a line."""
        return 0.0

    def time(self, nbytes, algorithm: str | None = None):
        """Seconds for one all-reduce of `nbytes` (a number or a numpy array) on the line."""
        return self.line(nbytes)

    def best_algorithm(self, nbytes: float) -> str:
        """The only algorithm: the line."""
        return "line"

    def bound_terms(self) -> Linear:
        """The line itself."""
        return self.line


def concave_minorant(cost: CostModel):
    """A cost model below `cost` whose cost is concave in the bytes (what `lower_bound`'s argument needs):
    `cost` itself unless it interpolates measured samples, else the line below all of them."""
    return LinearCost(cost.bound_terms()) if cost.measured is not None else cost
