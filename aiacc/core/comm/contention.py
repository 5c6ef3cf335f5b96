"""How much compute an all-reduce in flight takes, by its size and wire dtype.

Where gloo shares the cores with backward, a message in flight takes CPU from compute: its per-message
work (the ring's steps, thread wake-ups, system calls) and its per-byte work (copies through the TCP
stack, the sum; float16 is summed in software, so a float16 byte costs more than a float32 one).
`planning.calibrate` measures, beside the wall time of each batch of all-reduces it times, the CPU
time the process spent per message (`ClusterSpec.allreduce_cpu_samples`, `..._fp16`), and
`fit_cpu_line` fits cpu_d(n) = a_d + b_d n per wire dtype d. A message of n bytes lasting dur_d(n) on
the wire (the cost model) takes the share cpu_d(n) / dur_d(n) of a core while it is in flight: a small
message pays its per-message term in little time (a large share), a large one amortises it.

The cluster's `compute_slowdown` cs is the slowdown beside a stream of REFERENCE_BYTES float32 messages
(what the contention probe sends; the engine's profiled steps are inverted through this same model, so
their estimates are in these units too). A message of n bytes of dtype d slows compute by

    cs_d(n) = 1 / (1 - s_ref * r_d(n)),  s_ref = 1 - 1/cs,  r_d(n) = (share_d(n) / share_float32(REF)) ** g

(capped at SLOWDOWN_CAP): the measured CPU shares give the shape, the measured slowdown the scale, and
the exponent g (ClusterSpec.contention_exponent, `fit_exponent`: probes at two message sizes) how much
of the shape the contention shows: compute loses other CPU than the time charged to the process (the
kernel's softirq work on the peer's packets is not charged to it and grows with the bytes; a polling
wait for a small message yields to compute), so contention falls less with size than the CPU time
(on the testbed at 1 Gbit/s, 1 -> 8 MB messages: CPU share x0.39, contention share x0.72, g ~ 0.35).
Without CPU samples every message slows compute by cs (the uniform model).

The lower bound (`simulate.contention_floor`) charges every message the smallest cs_d(n) over all sizes
a plan could send (`slowdown_range`): a per-message term only adds time, so the floor stays valid.
"""
from __future__ import annotations

import functools

import numpy as np

from aiacc.core.comm.cost import CostModel, Linear
from aiacc.core.comm.errors import CommError
from aiacc.core.comm.plan import COMPRESSIONS
from aiacc.core.comm.spec import ClusterSpec

SLOWDOWN_CAP = 10.0  # the largest slowdown any estimate reports (also the probe's: planning.CONTENTION_CAP)
REFERENCE_BYTES = 1 << 20  # the float32 message size the cluster's compute_slowdown refers to (the probe's)
SHARE_CAP = 1.0 - 1.0 / SLOWDOWN_CAP


def fit_cpu_line(samples) -> Linear:
    """cpu(n) = a + b n (seconds of CPU per message of n bytes) through (bytes, cpu seconds) samples, by
    least squares with a and b kept non-negative (a per-message and a per-byte cost cannot be negative:
    where the free fit makes one so, it is 0 and the other is refitted alone)."""
    pts = np.array([(float(b), float(c)) for b, c in samples], dtype=float)
    if pts.ndim != 2 or len(pts) < 2 or len(set(pts[:, 0])) < 2:
        raise CommError(f"a CPU line needs (bytes, seconds) samples of at least 2 sizes, got {samples!r:.200}")
    x, y = pts[:, 0], pts[:, 1]
    b, a = np.polyfit(x, y, 1)
    if b < 0:
        a, b = float(np.mean(y)), 0.0
    elif a < 0:
        a, b = 0.0, float(np.dot(x, y) / np.dot(x, x))
    return Linear(max(0.0, float(a)), max(0.0, float(b)))


def _dtype(compression: str) -> str:
    return COMPRESSIONS.get(compression) or "float32"


@functools.lru_cache(maxsize=64)
def _lines(cpu32, cpu16) -> dict[str, Linear]:
    out = {}
    if cpu32:
        out["float32"] = fit_cpu_line(cpu32)
    if cpu16:
        out["float16"] = fit_cpu_line(cpu16)
    return out


def cpu_lines(cluster: ClusterSpec) -> dict[str, Linear]:
    """{wire dtype: its CPU line} of the cluster's measured CPU samples (float16 takes float32's line
    where it was not measured); {} without float32 samples."""
    lines = dict(_lines(cluster.allreduce_cpu_samples, cluster.allreduce_cpu_samples_fp16))
    if "float32" not in lines:  # the reference is a float32 message
        return {}
    if "float16" not in lines:
        lines["float16"] = lines["float32"]
    return lines


@functools.lru_cache(maxsize=64)
def _reference_share(cluster_key: ClusterSpec) -> float:
    line = cpu_lines(cluster_key)["float32"]
    dur = float(CostModel(cluster_key, compression="none").time(float(REFERENCE_BYTES)))
    return line(REFERENCE_BYTES) / dur if dur > 0 else 0.0


def _key(cluster: ClusterSpec) -> ClusterSpec:
    # the parts of a cluster the shares depend on (not its slowdowns: many clusters differ only in them)
    import dataclasses

    return dataclasses.replace(cluster, compute_slowdown=1.0, comm_slowdown=1.0, compute_slowdown_range=None,
                               slowdown_estimates=())


def relative_shares(cluster: ClusterSpec, nbytes, compression: str = "none", cost=None) -> np.ndarray | None:
    """r_d(n) of the module's docstring for messages of `nbytes` (array) on the wire in `compression`'s
    dtype, each message's duration from `cost` (default: the cluster's cost model of that compression);
    None where the cluster has no CPU samples (the uniform model)."""
    lines = cpu_lines(cluster)
    if not lines:
        return None
    ref = _reference_share(_key(cluster))
    if not ref > 0:
        return None
    n = np.asarray(nbytes, dtype=float)
    cost = cost if cost is not None else CostModel(cluster, compression=compression)
    dur = np.maximum(np.asarray(cost.time(n), dtype=float), 1e-12)
    return (lines[_dtype(compression)](n) / dur / ref) ** cluster.contention_exponent


def fit_exponent(cluster: ClusterSpec, small: tuple[float, float], large: tuple[float, float]) -> float | None:
    """The contention exponent g (ClusterSpec.contention_exponent) that makes the model's relative shares
    r(n) = (cpu share(n) / cpu share(REF)) ** g reproduce two measured slowdowns `small` = (bytes, cs)
    and `large` = (bytes, cs) beside float32 streams of those message sizes: g = ln(q) / ln(p), q the
    ratio of the measured shares (1 - 1/cs), p that of the CPU shares; clipped to [0, 1] (a contention
    that falls faster with size than the CPU time, or grows with it, is the noise of a loaded core).
    None where it says nothing: no CPU samples, no contention at the small size, or CPU shares that do
    not fall with size."""
    import dataclasses

    (n1, cs1), (n2, cs2) = small, large
    base = relative_shares(dataclasses.replace(cluster, contention_exponent=1.0), np.array([n1, n2], dtype=float))
    if base is None or not cs1 > 1.0 or not base[1] < base[0]:
        return None
    p = float(base[1] / base[0])
    q = (1.0 - 1.0 / max(1.0, cs2)) / (1.0 - 1.0 / cs1)
    if q <= 0:
        return 1.0
    return float(np.clip(np.log(q) / np.log(p), 0.0, 1.0))


def slowdown_of(cs: float, rel) -> np.ndarray:
    """The slowdown of messages whose relative share is `rel`, given the reference slowdown `cs`."""
    s_ref = 1.0 - 1.0 / max(1.0, float(cs))
    return 1.0 / (1.0 - np.minimum(SHARE_CAP, s_ref * np.asarray(rel, dtype=float)))


def message_slowdowns(cluster: ClusterSpec, wire_bytes, compression: str = "none", cost=None) -> list[float]:
    """The compute slowdown while each message of `wire_bytes` is in flight (see the module's docstring);
    the cluster's compute_slowdown for every message where it has no CPU samples."""
    rel = relative_shares(cluster, wire_bytes, compression, cost)
    if rel is None or cluster.compute_slowdown <= 1.0:
        return [float(cluster.compute_slowdown)] * len(wire_bytes)
    return [float(x) for x in slowdown_of(cluster.compute_slowdown, rel)]


def slowdown_range(cluster: ClusterSpec, total_bytes: float, compression: str = "none", cost=None) -> tuple[float, float]:
    """(smallest, largest) compute slowdown of any message of at most `total_bytes` (every message a
    plan of that many gradient bytes can send). share_d(n) = cpu_d(n) / dur(n) is a ratio of two
    functions linear between the measured sizes (and dur constant below the smallest), so it is monotone
    on each piece: its extremes are at the pieces' ends, the sizes evaluated here."""
    cs = float(cluster.compute_slowdown)
    if not cluster.allreduce_cpu_samples or cs <= 1.0 or total_bytes <= 0:
        return cs, cs
    samples = cluster.allreduce_samples_fp16 if compression == "fp16" and cluster.allreduce_samples_fp16 \
        else cluster.allreduce_samples
    sizes = sorted({float(b) for b, _ in (samples or ()) if 0 < b < total_bytes} | {1.0, float(total_bytes)})
    rel = relative_shares(cluster, np.array(sizes), compression, cost)
    if rel is None:
        return cs, cs
    got = slowdown_of(cs, rel)
    return float(got.min()), float(got.max())


def reference_slowdown(cluster: ClusterSpec, cs: float, nbytes: float, compression: str = "none") -> float:
    """The reference slowdown (the cluster's compute_slowdown units) of a slowdown `cs` measured beside
    a stream of `nbytes` messages: s_ref = (1 - 1/cs) / r(nbytes), at most SLOWDOWN_CAP; `cs` itself
    where the cluster has no CPU samples."""
    rel = relative_shares(cluster, np.array([float(nbytes)]), compression)
    if rel is None or not rel[0] > 0 or cs <= 1.0:
        return float(cs)
    share = min(SHARE_CAP, (1.0 - 1.0 / cs) / float(rel[0]))
    return float(min(SLOWDOWN_CAP, 1.0 / (1.0 - share)))
