"""What communication planning needs to know about a model and a cluster.

A `ModelSpec` is the list of layers in forward order. Each layer has a forward and a backward time and
the gradients it owns. Backward runs the layers in reverse order, so the gradients of the last layer are
ready first; the next forward needs the gradients of layer i (after all-reduce) before running layer i.
A `ClusterSpec` gives the shape of the job (nodes x workers per node) and the alpha-beta parameters of
the links inside and between nodes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from aiacc.core.comm.errors import CommError


@dataclass(frozen=True)
class GradientSpec:
    """One gradient tensor: the parameter's name, element count and dtype."""

    name: str
    numel: int
    dtype: str = "float32"
    shape: tuple[int, ...] | None = None

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Layer:
    """A unit of compute: forward and backward seconds, and the gradients its backward produces."""

    name: str
    forward_s: float
    backward_s: float
    grads: tuple[GradientSpec, ...] = ()


@dataclass(frozen=True)
class ModelSpec:
    """Layers in forward order. Derived quantities (ready times, priorities) are computed on demand."""

    name: str
    layers: tuple[Layer, ...]

    def __post_init__(self):
        seen: set[str] = set()
        for layer in self.layers:
            if layer.forward_s < 0 or layer.backward_s < 0:
                raise CommError(f"model {self.name}: layer {layer.name} has a negative compute time")
            for g in layer.grads:
                if g.name in seen:
                    raise CommError(f"model {self.name}: gradient {g.name} appears twice")
                if g.numel <= 0:
                    raise CommError(f"model {self.name}: gradient {g.name} has {g.numel} elements")
                seen.add(g.name)

    @property
    def forward_s(self) -> float:
        return float(sum(l.forward_s for l in self.layers))

    @property
    def backward_s(self) -> float:
        return float(sum(l.backward_s for l in self.layers))

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for l in self.layers for g in l.grads)

    @property
    def numel(self) -> int:
        return sum(g.numel for l in self.layers for g in l.grads)

    def backward_order(self) -> list[tuple[GradientSpec, float, int]]:
        """(gradient, ready time from the start of backward, forward layer index), in backward order."""
        out = []
        t = 0.0
        for i in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[i]
            t += layer.backward_s
            for g in layer.grads:
                out.append((g, t, i))
        return out

    def gradients(self) -> list[GradientSpec]:
        """Gradients in the order backward produces them."""
        return [g for g, _, _ in self.backward_order()]

    def with_dtype(self, dtype: str) -> "ModelSpec":
        """The same model with every gradient sent as `dtype` (e.g. float16 compression)."""
        return ModelSpec(self.name, tuple(
            Layer(l.name, l.forward_s, l.backward_s,
                  tuple(GradientSpec(g.name, g.numel, dtype, g.shape) for g in l.grads)) for l in self.layers))


@dataclass(frozen=True)
class ClusterSpec:
    """nodes x workers_per_node workers. Bandwidths in bytes/s, latencies in seconds.

    `inter_bandwidth` is one node's network interface (shared by its workers); `intra_bandwidth` is a
    worker's link inside a node (NVLink/PCIe/shared memory).

    Contention: where the all-reduce runs on the cores that compute (gloo on CPU), the two slow each other
    down. `compute_slowdown` is how many times longer compute takes while an all-reduce is in flight,
    `comm_slowdown` how many times longer an all-reduce takes while compute runs (both measured by
    aiacc.distributed.planning.calibrate; 1.0: no contention, as with NCCL on a GPU).

    `allreduce_samples`: measured (bytes, seconds) of whole all-reduces on the job's process group
    (calibrate). Where given, the cost model interpolates them (a real transport is not a straight
    alpha-beta line: a TCP stack or a token bucket makes mid-sized messages dearer than the line through
    the smallest and largest) instead of the ring formulas of the links. `allreduce_samples_fp16`: the
    same for float16 payloads (bytes of float16), which a CPU transport sums at another rate per byte;
    the cost model of an fp16-compressed plan uses them where given.

    `banked_s`: idle wire time the link banks (a token bucket such as tc's tbf: after idle time a burst
    goes at line rate; calibrate estimates it from batches carried faster than the sustained rate). The
    simulator does not model it: an overlap gain up to that time may not happen on such a link.

    `compute_slowdown_range`: (low, high) of the plausible compute slowdowns where it was measured
    several times (aiacc.core.comm.robust.pool_slowdowns); the planner then prefers plans that are good
    across it (`robust_pick`). None: the point estimate alone. `slowdown_estimates`: the model-specific
    compute-slowdown estimates that point estimate and range were pooled from (probes beside the model's
    own forward + backward, and the engine's own profiled steps), in the order measured.

    `allreduce_cpu_samples` (`..._fp16`): measured (bytes, CPU seconds of the process per message) of the
    same all-reduces: with them the compute slowdown depends on each message's size and wire dtype
    (aiacc.core.comm.contention: `compute_slowdown` is then the slowdown beside 1 MB float32 messages).
    `contention_exponent` (0..1): how much of the CPU shares' dependence on size the measured contention
    shows (1: all of it, 0: none, the uniform model), fitted from probes at two message sizes.

    `allreduce_samples_alone`: measured (bytes, seconds) of single float32 all-reduces sent on an idle network
    with nothing queued behind them (calibrate, from 1 MB up). On a CPU transport with several worker threads
    (gloo) a lone large message runs slower than each of a queued pair (2 testbed nodes at 10 Gbit/s: 4 MB 6.9
    ms alone, 4.1 ms each of two queued together); the simulator charges the difference to a bucket that
    starts on an idle network and has no other bucket ready when it ends (a step's last, lone bucket).
    """

    nodes: int
    workers_per_node: int
    inter_bandwidth: float
    inter_latency: float = 30e-6
    intra_bandwidth: float = 100e9
    intra_latency: float = 5e-6
    compute_slowdown: float = 1.0
    comm_slowdown: float = 1.0
    allreduce_samples: tuple[tuple[float, float], ...] | None = None
    allreduce_samples_fp16: tuple[tuple[float, float], ...] | None = None
    banked_s: float = 0.0
    compute_slowdown_range: tuple[float, float] | None = None
    slowdown_estimates: tuple[float, ...] = ()
    allreduce_cpu_samples: tuple[tuple[float, float], ...] | None = None
    allreduce_cpu_samples_fp16: tuple[tuple[float, float], ...] | None = None
    contention_exponent: float = 1.0
    allreduce_samples_alone: tuple[tuple[float, float], ...] | None = None

    def __post_init__(self):
        if self.nodes < 1 or self.workers_per_node < 1:
            raise CommError(f"cluster needs at least one node and one worker per node, got "
                            f"{self.nodes} x {self.workers_per_node}")
        for k in ("inter_bandwidth", "intra_bandwidth"):
            if not getattr(self, k) > 0:
                raise CommError(f"cluster {k} must be positive, got {getattr(self, k)}")
        for k in ("inter_latency", "intra_latency"):
            if getattr(self, k) < 0:
                raise CommError(f"cluster {k} must not be negative, got {getattr(self, k)}")
        for k in ("allreduce_samples", "allreduce_samples_fp16", "allreduce_cpu_samples", "allreduce_cpu_samples_fp16",
                  "allreduce_samples_alone"):
            pts = getattr(self, k)
            if pts is not None and (len(pts) < 2 or len({b for b, _ in pts}) < 2 or any(b < 0 or t < 0 for b, t in pts)):
                raise CommError(f"cluster {k} need at least 2 distinct non-negative "
                                f"(bytes, seconds) pairs, got {pts!r:.200}")
        if not 0.0 <= self.contention_exponent <= 1.0:
            raise CommError(f"cluster contention_exponent must be in [0, 1], got {self.contention_exponent}")
        if not self.banked_s >= 0:
            raise CommError(f"cluster banked_s must not be negative, got {self.banked_s}")
        for k in ("compute_slowdown", "comm_slowdown"):
            if not getattr(self, k) >= 1.0:
                raise CommError(f"cluster {k} must be at least 1 (a factor by which contention slows down), "
                                f"got {getattr(self, k)}")

        if any(not x >= 1.0 for x in self.slowdown_estimates):
            raise CommError(f"cluster slowdown_estimates must each be at least 1, got {self.slowdown_estimates!r}")
        rng = self.compute_slowdown_range
        if rng is not None and not (len(rng) == 2 and 1.0 <= rng[0] <= self.compute_slowdown <= rng[1]):
            raise CommError(f"cluster compute_slowdown_range must be (low, high) with 1 <= low <= "
                            f"compute_slowdown ({self.compute_slowdown}) <= high, got {rng!r}")

    @property
    def contended(self) -> bool:
        """Whether compute and communication slow each other down (see the class's docstring)."""
        return self.compute_slowdown > 1.0 or self.comm_slowdown > 1.0

    @property
    def world_size(self) -> int:
        return self.nodes * self.workers_per_node

    @classmethod
    def from_workers(cls, workers: int, workers_per_node: int = 8, network_gbps: float = 25.0,
                     **kw: Any) -> "ClusterSpec":
        """A cluster of `workers` workers, `workers_per_node` per node, nodes joined by `network_gbps`."""
        per = min(workers, workers_per_node)
        if workers % per:
            raise CommError(f"{workers} workers do not fill nodes of {workers_per_node}")
        return cls(nodes=workers // per, workers_per_node=per, inter_bandwidth=network_gbps * 1e9 / 8, **kw)


# -- gradient specs from a parameter list ----------------------------------------------------------

def _layer_of(name: str) -> str:
    """The module path of a parameter ("layer1.0.conv1.weight" -> "layer1.0.conv1")."""
    return name.rsplit(".", 1)[0] if "." in name else name


def gradient_specs_from_params(params: Iterable[tuple[str, Sequence[int], Any]], *, name: str = "model",
                               forward_s: float | Sequence[float] = 0.0,
                               backward_s: float | Sequence[float] | None = None) -> ModelSpec:
    """A ModelSpec from (name, shape, dtype) triples listed in forward order (e.g. `named_parameters()`).

    Consecutive parameters sharing a module path form one layer. Compute times are unknown here: give
    totals (spread over layers in proportion to their parameter count) or one value per layer;
    `backward_s` defaults to twice `forward_s`.
    """
    groups: list[tuple[str, list[GradientSpec]]] = []
    for pname, shape, dtype in params:
        shape = tuple(int(d) for d in shape)
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        g = GradientSpec(pname, numel, np.dtype(dtype).name if not hasattr(dtype, "is_floating_point")
                         else str(dtype).replace("torch.", ""), shape)
        lname = _layer_of(pname)
        if groups and groups[-1][0] == lname:
            groups[-1][1].append(g)
        else:
            groups.append((lname, [g]))
    if not groups:
        raise CommError(f"model {name}: no parameters to communicate")
    n = len(groups)
    sizes = np.array([sum(g.numel for g in gs) for _, gs in groups], dtype=np.float64)

    def spread(v: float | Sequence[float], what: str) -> list[float]:
        if isinstance(v, (int, float)):
            return list(float(v) * sizes / sizes.sum())
        v = [float(x) for x in v]
        if len(v) != n:
            raise CommError(f"model {name}: {what} has {len(v)} entries for {n} layers")
        return v

    fwd = spread(forward_s, "forward_s")
    bwd = [2 * f for f in fwd] if backward_s is None else spread(backward_s, "backward_s")
    return ModelSpec(name, tuple(Layer(l, f, b, tuple(gs)) for (l, gs), f, b in zip(groups, fwd, bwd)))


# -- gradient specs from the IR -------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceModel:
    """A roofline cost model of one worker: a layer takes max(flops / flop_rate, bytes / mem_bandwidth)."""

    flop_rate: float = 30e12
    mem_bandwidth: float = 800e9
    symbol_size: int = 1  # the size assumed for a symbolic dimension (e.g. the batch "N")
    backward_factor: float = 2.0  # backward costs about twice the forward (grads of inputs and weights)

    def seconds(self, flops: float, nbytes: float) -> float:
        return max(flops / self.flop_rate, nbytes / self.mem_bandwidth)


def _numel(shape, symbol_size: int) -> int:
    if shape is None:
        return 0
    return int(np.prod([d if isinstance(d, int) else symbol_size for d in shape], dtype=np.int64))


def _node_cost(node, params: list, device: DeviceModel) -> tuple[float, float]:
    """(flops, bytes) of one node: 2 MACs per weight per output position for weighted ops, else 1 flop
    per output element."""
    out_elems = sum(_numel(v.shape, device.symbol_size) for v in node.outputs)
    nbytes = 0.0
    for v in list(node.inputs) + list(node.outputs):
        if v is not None and v.dtype is not None:
            nbytes += _numel(v.shape, device.symbol_size) * np.dtype(v.dtype).itemsize
    big = [p for p in params if p.const.ndim >= 2]
    if big and node.outputs and node.outputs[0].shape:
        out = node.outputs[0]
        shape = out.shape
        channel_dim = 1 if node.op in ("Conv", "ConvTranspose") and len(shape) > 1 else -1
        c = shape[channel_dim] if isinstance(shape[channel_dim], int) and shape[channel_dim] else 1
        positions = _numel(shape, device.symbol_size) / c
        flops = 2.0 * sum(p.const.size for p in big) * positions
    else:
        flops = float(out_elems)
    return flops, nbytes


def gradient_specs_from_graph(graph, *, cost_model: DeviceModel | None = None,
                              profile: dict[str, tuple[float, float]] | None = None,
                              trainable: Iterable[str] | None = None) -> ModelSpec:
    """A ModelSpec from an aiacc IR graph.

    Parameters are the floating-point initializers read by nodes (or those named in `trainable`),
    ordered by first use in the forward pass; each node that first reads a parameter starts a layer that
    also takes the cost of the following parameter-free nodes. Times come from `profile`
    ({node name: (forward_s, backward_s)}, e.g. measured) or from the roofline `cost_model`.
    """
    device = cost_model or DeviceModel()
    wanted = None if trainable is None else set(trainable)
    seen: set[str] = set()
    layers: list[list[Any]] = []  # [name, fwd, bwd, grads]
    pending_fwd = pending_bwd = 0.0  # cost of parameter-free nodes before the first layer
    for node in graph:
        params = []
        for v in node.inputs:
            if v is None or v.const is None or v.name in seen:
                continue
            if not np.issubdtype(v.const.dtype, np.floating):
                continue
            if wanted is not None and v.name not in wanted:
                continue
            seen.add(v.name)
            params.append(v)
        if profile is not None and node.name in profile:
            fwd, bwd = (float(x) for x in profile[node.name])
        else:
            all_params = [v for v in node.inputs if v is not None and v.const is not None
                          and np.issubdtype(v.const.dtype, np.floating)]
            flops, nbytes = _node_cost(node, all_params, device)
            fwd = device.seconds(flops, nbytes)
            bwd = fwd * device.backward_factor
        if params:
            grads = tuple(GradientSpec(p.name, int(p.const.size), p.const.dtype.name, tuple(p.const.shape))
                          for p in params)
            layers.append([node.name, fwd, bwd, grads])
        elif layers:
            layers[-1][1] += fwd
            layers[-1][2] += bwd
        else:
            pending_fwd += fwd
            pending_bwd += bwd
    if not layers:
        raise CommError(f"graph {graph.name}: no floating-point parameters to communicate")
    layers[0][1] += pending_fwd
    layers[0][2] += pending_bwd
    if wanted is not None and wanted - seen:
        raise CommError(f"graph {graph.name}: trainable parameter {sorted(wanted - seen)[0]} is not read by any node")
    return ModelSpec(graph.name, tuple(Layer(n, f, b, g) for n, f, b, g in layers))
