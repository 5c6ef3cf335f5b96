"""Running a communication plan (aiacc.core.comm.Plan) on torch tensors: `PlanExecutor`, and
`allreduce_arrays`, its front for TensorFlow and MXNet gradients (numpy arrays).

Each bucket has a flat buffer (kept across steps) that gradients are copied into, already divided by the
world size, as they become ready; torch gradients then stay there as views (`param.grad`), so later steps
need no copy. A bucket's all-reduce is started asynchronously, in place, as soon as all its pieces are
ready and every bucket before it in the plan's issue order has started (all ranks must issue collectives
in the same order); `wait()` finishes them, and refuses to finish a step in which a piece of a bucket is
missing or a bucket was not reduced exactly once.

With compression "fp16" a bucket travels as float16: the executor hands `dist.all_reduce` a float16 copy
of the bucket and copies the result back. What it hands over is counted (`bytes_last_step`,
`bytes_total`: the payload per rank; a ring all-reduce puts 2(n-1)/n of that on each rank's link).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from aiacc.core.comm import CommError, Plan
from aiacc.distributed import timeline
from aiacc.distributed.compression import check as check_compression
from aiacc.distributed.planning import plan_for
from aiacc.distributed.process import collective, require


class _Slot:
    """Where one piece of a gradient lives in its bucket's flat buffer."""

    __slots__ = ("grad", "start", "stop", "offset", "whole")

    def __init__(self, grad: str, start: int, stop: int, offset: int, whole: bool):
        self.grad, self.start, self.stop, self.offset, self.whole = grad, start, stop, offset, whole


class PlanExecutor:
    """Runs one plan's all-reduces on torch tensors; one instance per set of parameters, reused each step.

    Each bucket owns a flat buffer, kept across steps. A gradient that a bucket holds whole gets a
    *home*: a view of its slice of that buffer (like DDP's gradient_as_bucket_view). `ready()` returns
    the home; a caller that keeps its gradient there (the torch scheduler sets `param.grad` to it)
    pays no copy on later steps (autograd accumulates into it) and none after the all-reduce. A
    gradient cut into pieces over several buckets is copied in when ready and copied back by `wait()`.
    Averaging multiplies by 1/world while copying in, so the sum that comes back is the mean.
    """

    def __init__(self, plan: Plan, order: Sequence[int], numel: dict[str, int], *, average: bool = True,
                 compression: str | None = None, dtypes: dict[str, torch.dtype] | None = None):
        self.plan = plan
        self.order = list(order)
        self.numel = numel
        self.average = average
        self.compression = check_compression(compression or plan.compression)
        if check_compression(plan.compression) not in ("none", self.compression):
            raise CommError(f"plan {plan.strategy} was made for compression {plan.compression!r}, but "
                            f"compression {self.compression!r} was asked for; give the same to both")
        self.wire_dtype = torch.float16 if self.compression == "fp16" else None
        self.buckets = [plan.buckets[k] for k in self.order]  # in issue order
        self.slots: list[list[_Slot]] = []
        self.holders: dict[str, list[tuple[int, _Slot]]] = {}
        dtypes = dtypes or {}
        self.dtypes: list[torch.dtype] = []  # a bucket's buffer holds the promoted type of its gradients
        for pos, bucket in enumerate(self.buckets):
            kinds = {dtypes.get(p.grad, torch.float32) for p in bucket.pieces}
            dtype = kinds.pop()
            for other in kinds:
                dtype = torch.promote_types(dtype, other)
            self.dtypes.append(dtype)
            off, slots = 0, []
            for piece in bucket.pieces:
                slot = _Slot(piece.grad, piece.start, piece.stop, off,
                             piece.start == 0 and piece.stop == numel[piece.grad]
                             and dtypes.get(piece.grad, torch.float32) == dtype)
                slots.append(slot)
                self.holders.setdefault(piece.grad, []).append((pos, slot))
                off += piece.numel
            self.slots.append(slots)
        self.sizes = [b.numel for b in self.buckets]
        # readiness is counted in pieces, not gradients: one gradient may be cut into several pieces of
        # the same bucket, and each piece is copied in (and counted down) once
        self.pieces = [len(b.pieces) for b in self.buckets]
        self.flats: list[torch.Tensor | None] = [None] * len(self.buckets)
        self.homes: dict[str, torch.Tensor] = {}
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.scale = 1.0 / self.world if average else 1
        self.bytes_total = 0  # bytes handed to dist.all_reduce by this executor, all steps
        self.bytes_last_step = 0  # the same, in the last step that wait() finished
        self.reset()

    def reset(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.left = list(self.pieces)  # pieces of each bucket not yet copied in this step
        self.next = 0  # next bucket (issue order) to start
        self.works: list[tuple[int, torch.Tensor, Any, Any]] = []  # (bucket, wire, work, timeline event)
        # per bucket with a timeline callback: the future that completes once the callback has run
        self.callbacks: dict[int, Any] = {}
        self.reduced = [0] * len(self.buckets)  # all-reduces finished per bucket this step (must end at 1)
        self.bytes_step = 0  # bytes handed to dist.all_reduce so far in this step
        # no bucket starts before backward is over (its last gradient is ready, or complete()): a plan made
        # to send after backward (its params say "after_backward", e.g. Horovod's fusion), or a step held by
        # `hold_step` (a profiled step with nothing in flight beside backward)
        self.holding = bool(self.plan.params.get("after_backward"))
        self.launched_at: list[int] = []  # per started bucket: how many gradients were ready when it started

    def hold_step(self) -> None:
        """Start no all-reduce in this step before backward's end (its last gradient ready, or
        `complete()`): nothing in flight beside backward. Must be called before the step's first
        all-reduce has started."""
        if self.works:
            raise CommError("hold_step: this step's all-reduces have already started")
        self.holding = True

    def _flat(self, pos: int, like: torch.Tensor) -> torch.Tensor:
        flat = self.flats[pos]
        if flat is None or flat.device != like.device:
            flat = self.flats[pos] = torch.empty(self.sizes[pos], dtype=self.dtypes[pos], device=like.device)
            for slot in self.slots[pos]:
                self.homes.pop(slot.grad, None)
        return flat

    def ready(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Gradient `name` is final for this step: put it in its bucket(s), start every bucket that can
        start now, and return where the gradient lives until `wait()` (its home view when it has one)."""
        if name in self.tensors:
            return self.tensors[name]
        home = tensor
        with torch.no_grad():
            for pos, slot in self.holders.get(name, ()):
                flat = self._flat(pos, tensor)
                # averaging divides while copying in (one pass over the gradient, no division afterwards)
                scale = self.scale if flat.is_floating_point() else 1
                if slot.whole:
                    home = self.homes.get(name)
                    if home is None or home.shape != tensor.shape:
                        if tensor.numel() != slot.stop:
                            raise CommError(f"gradient {name} has {tensor.numel()} elements, the plan expected "
                                            f"{slot.stop}")
                        home = self.homes[name] = flat[slot.offset:slot.offset + slot.stop].view(tensor.shape)
                    if tensor.data_ptr() != home.data_ptr():
                        if scale == 1:
                            home.copy_(tensor)
                        else:
                            torch.mul(tensor, scale, out=home)
                    elif scale != 1:  # autograd accumulated into the bucket already
                        home.mul_(scale)
                else:
                    dst = flat[slot.offset:slot.offset + slot.stop - slot.start]
                    src = tensor.reshape(-1)[slot.start:slot.stop]
                    if scale == 1:
                        dst.copy_(src)
                    else:
                        torch.mul(src, scale, out=dst)
                self.left[pos] -= 1
                if self.left[pos] < 0:  # an invariant: a bug here would reduce a bucket twice or never
                    raise CommError(f"bucket {pos} ({self._names(self.buckets[pos])}) received more pieces "
                                    f"than the plan gives it (gradient {name})")
        self.tensors[name] = home
        if self.holding and len(self.tensors) == len(self.numel):  # the step's last gradient: backward is over
            self.holding = False
        self._launch()
        return home

    def _launch(self) -> None:
        if self.holding:
            return
        while self.next < len(self.buckets) and self.left[self.next] == 0:
            pos = self.next
            flat = self.flats[pos]
            # fp16 on the wire: already divided by the world size, so the sum does not overflow
            wire = flat.to(self.wire_dtype) if self.wire_dtype is not None and flat.is_floating_point() else flat
            event = timeline.bucket_started(pos, self._names(self.buckets[pos]), wire.element_size() * wire.numel())
            work = collective(lambda: f"start of all-reduce of bucket {pos} ({self._names(self.buckets[pos])})",
                              lambda: dist.all_reduce(wire, async_op=True))
            if event is not None and hasattr(work, "get_future"):  # hvd.start_timeline: finish time when done
                # then() (not add_done_callback) hands back a future that wait_for waits on: the Python
                # callback runs on the transport's thread, and one still running when the process shuts
                # down makes gloo abort ("terminate called without an active exception")
                self.callbacks[pos] = work.get_future().then(lambda _f, e=event: timeline.bucket_finished(e))
            self.works.append((pos, wire, work, event))
            self.launched_at.append(len(self.tensors))
            self.bytes_step += wire.element_size() * wire.numel()
            self.next += 1

    @staticmethod
    def _names(bucket) -> str:
        names = list(dict.fromkeys(p.grad for p in bucket.pieces))
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    def complete(self, fill_missing: Callable[[str], torch.Tensor] | None = None) -> None:
        """Backward is over: gradients never marked ready get `fill_missing(name)` (zeros by default), and
        every bucket must then have started its all-reduce (else the step would end unreduced)."""
        if len(self.tensors) < len(self.numel):
            for name, n in self.numel.items():
                if name not in self.tensors:
                    self.ready(name, fill_missing(name) if fill_missing else torch.zeros(n))
        if self.holding:  # backward is over: the held buckets start now, in issue order
            self.holding = False
            self._launch()
        self._check_started()

    def buckets_of(self, names) -> list[int]:
        """Issue-order positions of the buckets holding any piece of these gradients."""
        return sorted({pos for name in names for pos, _ in self.holders.get(name, ())})

    def wait_for(self, positions) -> None:
        """Finish the all-reduces of these buckets (issue-order positions, all started) now, each once:
        their averaged results are in the homes, and copied back into gradients cut into pieces (whole
        once every bucket holding a piece of it has been waited for)."""
        with torch.no_grad():
            for pos in positions:
                if self.reduced[pos]:
                    continue
                if pos >= len(self.works) or self.works[pos][0] != pos:
                    raise CommError(f"bucket {pos} ({self._names(self.buckets[pos])}) was waited for before "
                                    f"its all-reduce started")
                _, wire, work, event = self.works[pos]
                collective(lambda: f"all-reduce of bucket {pos} ({self._names(self.buckets[pos])})", work.wait)
                if pos in self.callbacks:  # the timeline callback has finished before the step can end
                    self.callbacks.pop(pos).wait()
                timeline.bucket_finished(event)  # where the transport had no completion callback
                self.reduced[pos] += 1
                flat = self.flats[pos]
                if wire is not flat:
                    flat.copy_(wire)
                elif self.average and not flat.is_floating_point():
                    flat.floor_divide_(self.world)
                for slot in self.slots[pos]:
                    if not slot.whole:
                        dst = self.tensors[slot.grad]
                        src = flat[slot.offset:slot.offset + slot.stop - slot.start]
                        if dst.is_contiguous():
                            dst.view(-1)[slot.start:slot.stop].copy_(src)
                        else:
                            tmp = dst.reshape(-1).clone()
                            tmp[slot.start:slot.stop].copy_(src)
                            dst.copy_(tmp.view_as(dst))

    def wait(self, fill_missing: Callable[[str], torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Finish the step: `complete(fill_missing)`, then wait for every all-reduce not yet waited for
        (`wait_for`); averaged results are in the homes, and copied back into the gradients that were cut
        into pieces. Refuses to end a step in which a bucket was not reduced exactly once. Returns
        {name: tensor holding the result}."""
        self.complete(fill_missing)
        self.wait_for(range(len(self.buckets)))
        bad = [pos for pos, n in enumerate(self.reduced) if n != 1]
        if bad:
            pos = bad[0]
            raise CommError(f"bucket {pos} ({self._names(self.buckets[pos])}) was all-reduced "
                            f"{self.reduced[pos]} times in this step, not once")
        out = self.tensors
        self.bytes_last_step = self.bytes_step
        self.bytes_total += self.bytes_step
        self.reset()
        return out

    def _check_started(self) -> None:
        """Every gradient is in: every piece of every bucket must have been copied in exactly once and
        every bucket started once, else the step would end with a gradient not reduced."""
        for pos, left in enumerate(self.left):
            if left != 0:
                raise CommError(f"bucket {pos} ({self._names(self.buckets[pos])}) is missing {left} of its "
                                f"{self.pieces[pos]} pieces at the end of the step")
        started = [pos for pos, *_ in self.works]
        if started != list(range(len(self.buckets))):
            raise CommError(f"the step started all-reduces of buckets {started}, expected each of the "
                            f"{len(self.buckets)} buckets once, in issue order")


class ArrayReducer:
    """All-reduces numpy gradients (TensorFlow / MXNet) handed over one at a time, in the order backward
    produced them, on a plan: `add()` starts every bucket that is full (its all-reduce runs on the
    transport's thread while the caller goes on, e.g. waits for the framework's next gradient), and
    `finished()` yields, bucket by bucket in issue order, the gradients whose reduction is complete, so
    the caller can apply their update while later buckets are still on the wire.

    entries: (name, shape, dtype) in forward order. The plan is rank 0's (`plan_for`); `model_spec`
    gives its layers and timing (e.g. from the IR's `gradient_specs_from_graph`)."""

    def __init__(self, entries: Sequence[tuple[str, tuple, Any]], *, plan: str | Plan = "aiacc",
                 average: bool = True, compression: str = "none", model_spec=None):
        require()
        self.key = tuple((n, tuple(s), np.dtype(d).str) for n, s, d in entries)
        self.names = [n for n, _, _ in entries]
        p, order, spec = plan_for([(n, s, np.dtype(d)) for n, s, d in entries], plan, compression=compression,
                                  model_spec=model_spec)
        self.executor = PlanExecutor(p, order, {g.name: g.numel for g in spec.gradients()}, average=average,
                                     compression=compression,
                                     dtypes={n: torch.from_numpy(np.zeros(0, d)).dtype for n, _, d in entries})
        self.backward_names = [g.name for g in spec.gradients()]  # the order backward produces them
        if sorted(self.backward_names) != sorted(self.names):
            extra = sorted(set(self.backward_names) ^ set(self.names))
            raise CommError(f"the model spec's gradients are not the ones given (first difference: {extra[0]})")
        last = {n: max(pos for pos, _ in self.executor.holders[n]) for n in self.names}
        # issue position -> the gradients whose last bucket it is (complete once it has been waited for)
        self.completes_at = [[n for n in self.names if last[n] == pos] for pos in range(len(self.executor.buckets))]
        # the last step's events in order: ("add", name), ("start", bucket), ("done", names); a caller
        # that updates per bucket adds ("update", names)
        self.events: list[tuple[str, Any]] = []
        self._ended = True

    @property
    def plan(self) -> Plan:
        """The plan in use."""
        return self.executor.plan

    def add(self, name: str, array: np.ndarray) -> None:
        """Gradient `name` of this step: into its bucket(s); every bucket now full starts its all-reduce."""
        if self._ended:  # the first gradient of a new step
            self.events, self._ended = [], False
        a = np.ascontiguousarray(array)
        # whole tensors are copied into the bucket buffers; a tensor cut into pieces gets its result
        # copied back into the array it was given as, which must be our own
        whole = all(slot.whole for _, slot in self.executor.holders.get(name, ()))
        started = self.executor.next
        self.executor.ready(name, torch.from_numpy(a if whole and a.flags.writeable else a.copy()))
        self.events.append(("add", name))
        self.events.extend(("start", pos) for pos in range(started, self.executor.next))

    def finished(self):
        """Yield {name: averaged gradient (a new array)} per bucket, in issue order, as each all-reduce
        completes (empty buckets' worth skipped); after the last, the step is checked and ended
        (`PlanExecutor.wait`: every piece of every bucket reduced exactly once)."""
        ex = self.executor
        started = ex.next
        ex.complete()
        self.events.extend(("start", pos) for pos in range(started, ex.next))
        for pos in range(len(ex.buckets)):
            ex.wait_for([pos])
            done = self.completes_at[pos]
            if done:
                self.events.append(("done", list(done)))
                # the bucket buffers are reused by the next step: hand out copies
                yield {n: ex.tensors[n].numpy().copy() for n in done}
        ex.wait()
        self._ended = True

    def reduce(self, named: Sequence[tuple[str, np.ndarray]]) -> list[np.ndarray]:
        """All of a step's gradients at once, added in backward's order: the averaged arrays."""
        given = dict(named)
        for name in self.backward_names:
            self.add(name, given[name])
        out: dict[str, np.ndarray] = {}
        for part in self.finished():
            out.update(part)
        return [out[n] for n, _ in named]


def allreduce_arrays(named: Sequence[tuple[str, np.ndarray]], *, plan: str | Plan = "aiacc",
                     average: bool = True, compression: str = "none",
                     cache: dict | None = None) -> list[np.ndarray]:
    """All-reduce numpy arrays (TensorFlow / MXNet gradients) following a plan; returns new arrays.

    `cache` keeps the plan between calls with the same names and shapes (cache["executor"] is the
    PlanExecutor, cache["reducer"] the ArrayReducer)."""
    require()
    arrays = [np.ascontiguousarray(a) for _, a in named]
    if dist.get_world_size() == 1:
        return [a.copy() for a in arrays]
    reducer = cached_reducer([(n, a.shape, a.dtype) for (n, _), a in zip(named, arrays)], cache, plan=plan,
                             average=average, compression=compression)
    return reducer.reduce([(n, a) for (n, _), a in zip(named, arrays)])


def cached_reducer(entries: Sequence[tuple[str, tuple, Any]], cache: dict | None, **kw) -> ArrayReducer:
    """The ArrayReducer of `cache` when it was made for the same (name, shape, dtype) entries, else a new
    one (kept in `cache`: cache["reducer"], cache["executor"])."""
    key = tuple((n, tuple(s), np.dtype(d).str) for n, s, d in entries)
    if cache is not None and cache.get("key") == key:
        return cache["reducer"]
    reducer = ArrayReducer(entries, **kw)
    if cache is not None:
        cache["key"], cache["reducer"], cache["executor"] = key, reducer, reducer.executor
    return reducer
