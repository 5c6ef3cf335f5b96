"""Static memory planning for inference: lifetimes, a lower bound, and one arena for every intermediate.

`plan_memory(graph)` is an analysis: it picks a schedule (the graph's own order, or a reordering found by
`aiacc.core.memory_schedule` that lowers the peak on branchy graphs), decides in-place reuse, and gives
every intermediate value (every node output) an offset in one arena. It changes nothing in the graph;
`aiacc.core.runtime.arena.ArenaInterpreter` executes a graph on a plan.

Terms (all sizes rounded up to `alignment`, because every offset is aligned):

- lifetime of a value: [position of its producer, position of its last reader] on the schedule, both
  inclusive (a kernel reads its inputs while it writes its outputs); graph outputs live to the end.
- in-place: a single-output node whose input dies at that node may write its output over that input's
  memory when the op's aliasing rule (`inplace_inputs`) allows that input: elementwise ops
  (`schema.elementwise`) any input of the output's shape and dtype, except the variadic Sum / Max / Min /
  Mean, whose kernels fold inputs 2.. into the output after writing it (only inputs 0 and 1); inference
  BatchNormalization (a per-channel affine map) its input 0; the reshaping ops (Reshape, Flatten, Squeeze,
  Unsqueeze, Identity) their data input, whose bytes the output is. An input also read at a position the
  rule does not allow is never taken over. Values chained this way form one buffer. The planner and
  `check_plan` use the same rule.
- lower bound: the largest total size of buffers live at one step of the schedule. No arena for that
  schedule can be smaller.
- naive: every intermediate in its own buffer (the sum of all sizes).

Offsets come from greedy-by-size best fit (Pisarchyk & Lee 2020, the TFLite / XLA heap-simulator family):
buffers by decreasing size, each into the smallest gap among the buffers whose lifetimes overlap it. A few
orderings are tried and the smallest arena is kept. `check_plan` proves a plan sound from scratch.

Graph inputs and initializers are not in the arena (the caller and the graph own them).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from aiacc import progress
from aiacc.core.ir import Graph, Node, TensorType, Value
from aiacc.errors import ShapeError, VerificationError

#: plan_memory shows progress (in a terminal) from this many nodes on
PROGRESS_NODES = 300
#: ops whose output is the input's bytes reinterpreted (no computation)
ALIAS_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


# ------------------------------------------------------------------------------------------------
# concrete shapes
# ------------------------------------------------------------------------------------------------
def concrete_types(graph: Graph, dims: Mapping[str, int] | None = None, *,
                   strict: bool = True) -> dict[str, TensorType]:
    """The static type of every value, by name, with symbolic dims bound by `dims` (e.g. {"N": 1}).

    When every type is already static the graph's own types are returned. Otherwise the graph is copied,
    its inputs given concrete shapes, and types inferred again node by node (so a Reshape whose target
    depends on N gets a concrete shape too). Raises ShapeError naming an unbound symbol; strict=False
    leaves such a type symbolic instead (the planner then keeps the value out of the arena).
    """
    dims = dict(dims or {})
    types = {v.name: v.type for v in graph.values()}
    if all(t is not None and t.is_static for t in types.values()):
        return types

    def bind(t: TensorType | None, where: str) -> TensorType | None:
        if t is None or t.shape is None:
            return t
        out = []
        for d in t.shape:
            if isinstance(d, str):
                if d not in dims and not strict:
                    return t
                if d not in dims:
                    raise ShapeError(f"{where} has the symbolic dimension {d!r}: bind it, e.g. "
                                     f"plan_memory(graph, dims={{{d!r}: 1}})")
                out.append(int(dims[d]))
            else:
                out.append(d)
        return TensorType(t.dtype, tuple(out))

    from aiacc.core.ops import infer_node

    g = graph.copy()
    for v in g.inputs:
        v.type = bind(v.type, f"graph input %{v.name}")
    for node in g:
        if node.schema is None:
            for v in node.outputs:
                v.type = bind(v.type, f"output %{v.name} of opaque node {node.name}")
            continue
        for v, t in zip(node.outputs, infer_node(node)):
            v.type = t if (t is not None and t.is_static) else bind(v.type, f"output %{v.name} of node {node.name}")
    return {v.name: v.type for v in g.values()}


def _nbytes(v: Value, t: TensorType | None) -> int:
    if t is None or t.dtype is None or not t.is_static:
        where = f"node {v.producer.name} ({v.producer.qualified_op})" if v.producer else "the graph"
        raise ShapeError(f"cannot plan memory for %{v.name} (produced by {where}): its type {t} is not static; "
                         f"bind symbolic dims with dims={{...}} or give the opaque node output_types")
    return int(t.nbytes())


def align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


# ------------------------------------------------------------------------------------------------
# the problem, in index form (shared with the schedule search)
# ------------------------------------------------------------------------------------------------
@dataclass
class MemoryProblem:
    """A graph reduced to what memory planning needs: node i reads `reads[i]` and writes `writes[i]`
    (indices of arena values), value j has `size[j]` bytes (aligned) and `consumers[j]` (node indices)."""

    graph: Graph
    nodes: list[Node]
    values: list[Value]
    size: list[int]
    nbytes: list[int]
    types: list[TensorType]
    reads: list[list[int]]  # distinct arena values read by each node, in input order
    writes: list[list[int]]
    consumers: list[set[int]]
    is_output: list[bool]
    producer: list[int]
    inplace_candidates: list[list[int]]  # per node: inputs whose memory its (single) output may take over
    alignment: int
    unplanned: list[Value] = field(default_factory=list)  # node outputs left out (unplanned="skip")

    @classmethod
    def build(cls, graph: Graph, alignment: int = 64, dims: Mapping[str, int] | None = None,
              unplanned: str = "error") -> "MemoryProblem":
        """unplanned="skip" leaves node outputs without a static type out of the problem (listed in
        `unplanned`) instead of raising ShapeError."""
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        if unplanned not in ("error", "skip"):
            raise ValueError(f"unplanned must be 'error' or 'skip', got {unplanned!r}")
        types = concrete_types(graph, dims, strict=unplanned == "error")
        nodes = graph.nodes
        index: dict[int, int] = {}
        values: list[Value] = []
        skipped: list[Value] = []
        for node in nodes:
            for v in node.outputs:
                t = types.get(v.name)
                if unplanned == "skip" and (t is None or t.dtype is None or not t.is_static):
                    skipped.append(v)
                    continue
                index[id(v)] = len(values)
                values.append(v)
        vtypes = [types.get(v.name) for v in values]
        nbytes = [_nbytes(v, t) for v, t in zip(values, vtypes)]
        size = [max(align(n, alignment), alignment) for n in nbytes]
        reads: list[list[int]] = []
        writes: list[list[int]] = []
        consumers: list[set[int]] = [set() for _ in values]
        cand: list[list[int]] = []
        for i, node in enumerate(nodes):
            r: list[int] = []
            for v in node.inputs:
                j = None if v is None else index.get(id(v))
                if j is not None and j not in r:
                    r.append(j)
                    consumers[j].add(i)
            reads.append(r)
            writes.append([index[id(v)] for v in node.outputs if id(v) in index])
            cand.append(_inplace_inputs(node, index, types) if len(writes[-1]) == len(node.outputs) else [])
        outs = {id(v) for v in graph.outputs}
        is_output = [id(v) in outs for v in values]
        producer = [0] * len(values)
        for i, w in enumerate(writes):
            for j in w:
                producer[j] = i
        return cls(graph, nodes, values, size, nbytes, vtypes, reads, writes, consumers, is_output, producer,
                   cand, alignment, skipped)


#: variadic elementwise ops whose kernels write f(x0, x1) into the output, then fold x2, x3, ... into it:
#: an output over x2.. would be overwritten before it is read (aiacc.core.runtime.arena's ufunc kernel)
FOLDING_OPS = frozenset({"Sum", "Max", "Min", "Mean"})


def inplace_kind(node: Node) -> str | None:
    """How `node` may reuse an input's memory for its output: "alias" (same bytes), "elementwise", or None."""
    if len(node.outputs) != 1:
        return None
    schema = node.schema
    if schema is None:
        return None
    if node.domain == "" and node.op in ALIAS_OPS:
        return "alias"
    if schema.elementwise:
        return "elementwise"
    if node.domain == "" and node.op == "BatchNormalization" and not node.attr("training_mode", 0):
        return "elementwise"  # y = x * a[c] + b[c]: each element read once, then written
    return None


def inplace_inputs(node: Node) -> tuple[int, ...]:
    """The aliasing rule of `node`'s op: the input positions whose memory its output may take over (every
    kernel that may run the node, into-kernel, chunked or reference, is safe with the output there).
    Empty when the op never works in place. Shape and dtype are checked separately (`may_take_over`)."""
    kind = inplace_kind(node)
    if kind is None:
        return ()
    if kind == "alias" or (node.domain == "" and node.op == "BatchNormalization"):
        return (0,)
    if node.domain == "" and node.op in FOLDING_OPS:
        return tuple(range(min(2, len(node.inputs))))
    return tuple(range(len(node.inputs)))


def may_take_over(node: Node, value: Value) -> bool:
    """Whether `node`'s output may live in `value`'s memory by its op's rule: `value` is an input at an
    allowed position and at no other (a kernel reading it elsewhere would see its own output)."""
    allowed = inplace_inputs(node)
    at = [k for k, v in enumerate(node.inputs) if v is value]
    return bool(at) and all(k in allowed for k in at)


def _inplace_inputs(node: Node, index: dict[int, int], types: Mapping[str, TensorType]) -> list[int]:
    kind = inplace_kind(node)
    if kind is None:
        return []
    out_t = types.get(node.outputs[0].name)
    out: list[int] = []
    for k in inplace_inputs(node):
        v = node.inputs[k]
        j = None if v is None else index.get(id(v))
        if j is None or j in out or not may_take_over(node, v):
            continue
        t = types.get(v.name)
        if kind == "alias":
            if t is not None and out_t is not None and t.nbytes() == out_t.nbytes():
                out.append(j)
        elif t == out_t:
            out.append(j)
    return out


# ------------------------------------------------------------------------------------------------
# lifetimes on a schedule
# ------------------------------------------------------------------------------------------------
@dataclass
class Lifetimes:
    """Per value: first and last step, and the buffer (in-place chain) it lives in."""

    start: list[int]
    end: list[int]
    buffer: list[int]  # value index of the chain's first value
    shares: list[int | None]  # value whose memory this one takes over


def lifetimes(p: MemoryProblem, order: Sequence[int], inplace: bool = True) -> Lifetimes:
    """Lifetimes of every value on the schedule `order` (a permutation of node indices)."""
    n = len(order)
    pos = [0] * len(p.nodes)
    for t, i in enumerate(order):
        pos[i] = t
    start = [pos[p.producer[j]] for j in range(len(p.values))]
    end = []
    for j in range(len(p.values)):
        if p.is_output[j]:
            end.append(n - 1)
        elif p.consumers[j]:
            end.append(max(pos[c] for c in p.consumers[j]))
        else:
            end.append(start[j])
    buffer = list(range(len(p.values)))
    shares: list[int | None] = [None] * len(p.values)
    if inplace:
        for t, i in enumerate(order):
            for j in p.inplace_candidates[i]:
                if end[j] == t and not p.is_output[j]:
                    out = p.writes[i][0]
                    shares[out] = j
                    buffer[out] = buffer[j]
                    break
    return Lifetimes(start, end, buffer, shares)


@dataclass
class _Buffer:
    id: int
    size: int
    start: int
    end: int
    offset: int = -1


def _buffers(p: MemoryProblem, lt: Lifetimes) -> list[_Buffer]:
    bufs: dict[int, _Buffer] = {}
    for j in range(len(p.values)):
        b = lt.buffer[j]
        if b not in bufs:
            bufs[b] = _Buffer(b, p.size[j], lt.start[j], lt.end[j])
        else:
            buf = bufs[b]
            buf.size = max(buf.size, p.size[j])
            buf.start = min(buf.start, lt.start[j])
            buf.end = max(buf.end, lt.end[j])
    return list(bufs.values())


def live_profile(bufs: Sequence[_Buffer], steps: int) -> np.ndarray:
    """Bytes live at each step."""
    delta = np.zeros(steps + 1, dtype=np.int64)
    for b in bufs:
        delta[b.start] += b.size
        delta[b.end + 1] -= b.size
    return np.cumsum(delta[:-1])


def schedule_bound(p: MemoryProblem, order: Sequence[int], inplace: bool = True) -> int:
    """The lower bound (peak live bytes) of a schedule."""
    if not p.nodes:
        return 0
    prof = live_profile(_buffers(p, lifetimes(p, order, inplace)), len(order))
    return int(prof.max()) if len(prof) else 0


# ------------------------------------------------------------------------------------------------
# offsets: greedy by size, best fit
# ------------------------------------------------------------------------------------------------
def _place(bufs: list[_Buffer], key) -> int:
    """Assign offsets in the order given by `key`, each buffer into the smallest gap that fits among the
    already placed buffers whose lifetimes overlap it (else on top). Returns the arena size."""
    placed: list[_Buffer] = []
    top = 0
    for b in sorted(bufs, key=key):
        conflicts = sorted((q for q in placed if q.start <= b.end and b.start <= q.end), key=lambda q: q.offset)
        best, best_gap, prev_end = None, None, 0
        for q in conflicts:
            gap = q.offset - prev_end
            if gap >= b.size and (best_gap is None or gap < best_gap):
                best, best_gap = prev_end, gap
            prev_end = max(prev_end, q.offset + q.size)
        b.offset = prev_end if best is None else best
        top = max(top, b.offset + b.size)
        placed.append(b)
    return top


_ORDERINGS = {
    "size": lambda b: (-b.size, b.start, b.id),
    "size-longest": lambda b: (-b.size, -(b.end - b.start), b.id),
    "area": lambda b: (-b.size * (b.end - b.start + 1), b.id),
    "start": lambda b: (b.start, -b.size, b.id),
}


def assign_offsets(bufs: list[_Buffer], bound: int = 0, trials: int = 256) -> tuple[int, str]:
    """Greedy-by-size best fit under several orderings; keeps the smallest arena. Returns (bytes, ordering).

    After the fixed orderings, up to `trials` seeded random ones (random tie-breaks among equal sizes,
    randomly weighted size x lifetime keys) are tried; the search stops as soon as an arena meets `bound`,
    which no arena can beat. Equal-size long-lived buffers (DenseNet's features) are where tie-breaks matter.
    """
    import random

    best: tuple[int, str, list[int]] | None = None

    def attempt(name, key):
        nonlocal best
        top = _place(bufs, key)
        if best is None or top < best[0]:
            best = (top, name, [b.offset for b in bufs])
        return top <= bound

    done = False
    for name, key in _ORDERINGS.items():
        if attempt(name, key):
            done = True
            break
    rng = random.Random(0)
    for trial in range(trials if not done else 0):
        r = {b.id: rng.random() for b in bufs}
        if trial % 2 == 0:
            key = lambda b: (-b.size, r[b.id])  # noqa: E731
        else:
            key = lambda b: -(b.size * (b.end - b.start + 1)) ** (0.5 + r[b.id])  # noqa: E731
        if attempt(f"random #{trial}", key):
            break
    for b, off in zip(bufs, best[2]):
        b.offset = off
    return best[0], best[1]


# ------------------------------------------------------------------------------------------------
# the plan
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Allocation:
    """Where one value lives: [offset, offset + nbytes) of the arena, during steps [start, end]."""

    value: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    offset: int
    start: int
    end: int
    shares: str | None = None  # the input whose memory this value takes over in place


@dataclass
class Candidate:
    """One schedule tried by the planner and what it gave."""

    source: str
    inplace: bool
    bound: int
    arena: int


@dataclass
class MemoryPlan:
    """A static memory plan: the schedule, an arena offset per intermediate value, and the figures."""

    graph: Graph
    schedule: list[Node]
    allocations: dict[str, Allocation]
    alignment: int
    arena_bytes: int
    lower_bound_bytes: int
    naive_bytes: int
    import_order_bound_bytes: int  # the graph's own order, no in-place reuse
    peak_step: int
    peak_values: list[str]
    schedule_source: str
    inplace: bool
    ordering: str
    candidates: list[Candidate] = field(default_factory=list)
    dims: dict[str, int] = field(default_factory=dict)
    plan_seconds: float = 0.0
    unplanned: list[str] = field(default_factory=list)  # values left out of the arena (unplanned="skip")

    @property
    def peak_node(self) -> Node | None:
        return self.schedule[self.peak_step] if self.schedule else None

    @property
    def inplace_count(self) -> int:
        return sum(1 for a in self.allocations.values() if a.shares is not None)

    def check(self) -> None:
        """Raise VerificationError unless the plan is sound (see `check_plan`)."""
        check_plan(self)

    def summary(self) -> str:
        """A few lines for `aiacc inspect`."""
        mib = 1 << 20
        node = self.peak_node
        at = f"step {self.peak_step} ({node.name}: {node.qualified_op})" if node is not None else "-"
        lines = [
            f"memory plan of {self.graph.name}: {len(self.allocations)} values, schedule from "
            f"{self.schedule_source}, {self.inplace_count} in place",
            f"  arena        {self.arena_bytes / mib:10.2f} MiB",
            f"  lower bound  {self.lower_bound_bytes / mib:10.2f} MiB  (arena / bound = "
            f"{self.arena_bytes / max(self.lower_bound_bytes, 1):.3f})",
            f"  naive        {self.naive_bytes / mib:10.2f} MiB",
            f"  import order {self.import_order_bound_bytes / mib:10.2f} MiB  (bound of the graph's own order)",
            f"  peak at {at}: {', '.join('%' + v for v in self.peak_values[:8])}"
            + (" ..." if len(self.peak_values) > 8 else ""),
        ]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def plan_memory(graph: Graph, alignment: int = 64, *, dims: Mapping[str, int] | None = None,
                inplace: bool = True, search: bool = True, beam: int = 64, unplanned: str = "error") -> MemoryPlan:
    """Plan one arena for every intermediate value of `graph`.

    dims binds symbolic dimensions (e.g. {"N": 1}); inplace=False switches in-place reuse off;
    search=False keeps the graph's own order; beam bounds the schedule search's states per step.
    unplanned="skip" leaves values without a static type out of the arena (named in `plan.unplanned`;
    their producers run outside it) instead of raising ShapeError.
    Candidates (the graph's order and the searched one, with in-place reuse as asked) are each given
    offsets, and the plan with the smallest arena is kept (ties: the smaller lower bound).
    """
    from aiacc.core.memory_schedule import search_schedule

    t0 = time.perf_counter()
    big = len(graph) >= PROGRESS_NODES
    with progress.task(f"memory plan of {len(graph)} nodes", total=3, when=big) as shown:
        shown.update("lifetimes")
        p = MemoryProblem.build(graph, alignment, dims, unplanned)
        import_order = list(range(len(p.nodes)))
        orders = [("import order", import_order)]
        shown.update("schedule search", advance=1)
        if search and p.nodes:
            found = search_schedule(p, beam=beam, inplace=inplace)
            if found != import_order:
                orders.append(("search", found))
        shown.update("offsets", advance=1)
        best = _best_candidate(p, orders, inplace)
    return _make_plan(graph, p, best, import_order, alignment, inplace, dims, t0)


def _best_candidate(p: MemoryProblem, orders, inplace: bool):
    """Offsets for each candidate schedule; the one with the smallest arena (ties: smaller bound)."""
    best = None
    candidates = []
    for source, order in orders:
        lt = lifetimes(p, order, inplace)
        bufs = _buffers(p, lt)
        prof = live_profile(bufs, len(order))
        bound = int(prof.max()) if len(prof) else 0
        arena, ordering = assign_offsets(bufs, bound)
        candidates.append(Candidate(source, inplace, bound, arena))
        if best is None or (arena, bound) < (best[0], best[1]):
            best = (arena, bound, source, order, lt, bufs, ordering, prof)
    return best, candidates


def _make_plan(graph: Graph, p: MemoryProblem, found, import_order, alignment: int, inplace: bool, dims,
               t0: float) -> "MemoryPlan":
    """The MemoryPlan of the chosen candidate."""
    best, candidates = found
    arena, bound, source, order, lt, bufs, ordering, prof = best
    offset = {b.id: b.offset for b in bufs}
    allocations = {}
    for j, v in enumerate(p.values):
        t = p.types[j]
        allocations[v.name] = Allocation(
            v.name, t.dtype, tuple(t.shape), p.nbytes[j], offset[lt.buffer[j]], lt.start[j], lt.end[j],
            None if lt.shares[j] is None else p.values[lt.shares[j]].name)
    peak_step = int(np.argmax(prof)) if len(prof) else 0
    peak_values = [p.values[j].name for j in range(len(p.values))
                   if lt.start[j] <= peak_step <= lt.end[j]]
    import_bound = schedule_bound(p, import_order, inplace=False)
    return MemoryPlan(
        graph=graph, schedule=[p.nodes[i] for i in order], allocations=allocations, alignment=alignment,
        arena_bytes=arena, lower_bound_bytes=bound, naive_bytes=int(sum(p.size)),
        import_order_bound_bytes=import_bound, peak_step=peak_step, peak_values=peak_values,
        schedule_source=source, inplace=inplace, ordering=ordering, candidates=candidates,
        dims=dict(dims or {}), plan_seconds=time.perf_counter() - t0, unplanned=[v.name for v in p.unplanned])


# ------------------------------------------------------------------------------------------------
# the checker
# ------------------------------------------------------------------------------------------------
def check_plan(plan: MemoryPlan) -> None:
    """Prove a plan sound, recomputing everything from the graph and the plan's schedule:

    - the schedule is a topological order of exactly the graph's nodes;
    - every intermediate value has an aligned allocation inside the arena, of its exact size;
    - two values whose lifetimes overlap never overlap in memory, except a value and the input it takes
      over in place: same offset, the input dies at the very node that defines the value, and that node
      may write over that input by its op's aliasing rule (`inplace_inputs`, `may_take_over`).

    Raises VerificationError naming the first pair at fault.
    """
    g = plan.graph
    nodes = plan.schedule
    if sorted(map(id, nodes)) != sorted(map(id, g.nodes)):
        raise VerificationError(f"memory plan of {g.name}: the schedule does not hold exactly the graph's nodes")
    pos = {id(n): t for t, n in enumerate(nodes)}
    produced: dict[int, int] = {}
    for t, n in enumerate(nodes):
        for v in n.inputs:
            if v is not None and v.producer is not None and pos[id(v.producer)] >= t:
                raise VerificationError(f"memory plan of {g.name}: node {n.name} runs at step {t} before the "
                                        f"producer of its input %{v.name}")
        for v in n.outputs:
            produced[id(v)] = t
    last = len(nodes) - 1
    outs = {id(v) for v in g.outputs}
    spans = []
    left_out = set(plan.unplanned)
    for n in nodes:
        for v in n.outputs:
            if v.name in left_out:
                continue  # outside the arena by request (unplanned="skip"): nothing to overlap
            a = plan.allocations.get(v.name)
            if a is None:
                raise VerificationError(f"memory plan of {g.name}: %{v.name} (node {n.name}) has no allocation")
            if a.offset % plan.alignment or a.offset < 0 or a.offset + a.nbytes > plan.arena_bytes:
                raise VerificationError(f"memory plan of {g.name}: %{v.name} at [{a.offset}, {a.offset + a.nbytes}) "
                                        f"is misaligned or outside the arena of {plan.arena_bytes} bytes")
            want = TensorType(a.dtype, a.shape).nbytes()
            if want != a.nbytes or (v.type is not None and v.type.is_static and v.type.nbytes() != a.nbytes):
                raise VerificationError(f"memory plan of {g.name}: %{v.name} is given {a.nbytes} bytes for "
                                        f"{v.type}")
            start = produced[id(v)]
            readers = [pos[id(u)] for u, _ in v.uses]
            end = last if id(v) in outs else max(readers, default=start)
            spans.append((start, end, a.offset, a.offset + a.nbytes, v))
    spans.sort(key=lambda s: s[0])
    for k, (s1, e1, lo1, hi1, v1) in enumerate(spans):
        for s2, e2, lo2, hi2, v2 in spans[k + 1:]:
            if s2 > e1:
                break
            if lo1 < hi2 and lo2 < hi1:
                # lifetimes overlap and memory overlaps: only an in-place hand-over is allowed
                ok = (e1 == s2 and lo1 == lo2 and v2.producer is not None and may_take_over(v2.producer, v1)
                      and id(v1) not in outs
                      and plan.allocations[v2.name].shares == v1.name)
                if not ok:
                    node = v2.producer
                    why = ""
                    if node is not None and any(u is v1 for u in node.inputs) and not may_take_over(node, v1):
                        allowed = ", ".join(map(str, inplace_inputs(node))) or "none"
                        why = (f"; node {node.name} ({node.qualified_op}) may not write its output over input "
                               f"%{v1.name} (inputs it may overwrite: {allowed})")
                    raise VerificationError(
                        f"memory plan of {g.name}: %{v1.name} (steps {s1}..{e1}, bytes [{lo1}, {hi1})) and "
                        f"%{v2.name} (steps {s2}..{e2}, bytes [{lo2}, {hi2})) are live together and overlap "
                        f"in memory{why}")


def format_memory_plan(plan: MemoryPlan, title: str | None = None):
    """A rich Table of the plan's figures (for `aiacc inspect`): arena, lower bound, naive, the peak point
    of the schedule and the values live there."""
    from rich.table import Table

    mib = 1 << 20
    table = Table(title=title or f"memory plan: {plan.graph.name}")
    table.add_column("figure")
    table.add_column("MiB", justify="right")
    table.add_column("note")
    node = plan.peak_node
    table.add_row("arena", f"{plan.arena_bytes / mib:.2f}",
                  f"{plan.arena_bytes / max(plan.lower_bound_bytes, 1):.3f}x the lower bound "
                  f"({plan.ordering} best fit)")
    table.add_row("lower bound", f"{plan.lower_bound_bytes / mib:.2f}",
                  f"schedule: {plan.schedule_source}, {plan.inplace_count} values in place")
    table.add_row("import-order bound", f"{plan.import_order_bound_bytes / mib:.2f}", "graph's own order, no in-place")
    table.add_row("naive", f"{plan.naive_bytes / mib:.2f}", f"{len(plan.allocations)} values, each its own buffer")
    if node is not None:
        sizes = {k: plan.allocations[k].nbytes for k in plan.peak_values if k in plan.allocations}
        biggest = sorted(sizes, key=lambda k: -sizes[k])
        shown = ", ".join(f"%{k} ({sizes[k] / mib:.2f})" for k in biggest[:8])
        table.add_row("peak point", f"{sum(sizes.values()) / mib:.2f}",
                      f"step {plan.peak_step}: {node.name} ({node.qualified_op}), {len(plan.peak_values)} values "
                      f"live at peak: {shown}" + (f" and {len(biggest) - 8} more" if len(biggest) > 8 else ""))
    return table


__all__ = ["plan_memory", "MemoryPlan", "Allocation", "check_plan", "format_memory_plan", "concrete_types",
           "MemoryProblem", "lifetimes", "schedule_bound", "inplace_kind", "inplace_inputs", "may_take_over",
           "FOLDING_OPS"]
