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
        self.reduced = [0] * len(self.buckets)  # all-reduces finished per bucket this step (must end at 1)
        self.bytes_step = 0  # bytes handed to dist.all_reduce so far in this step

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
        self._launch()
        return home

    def _launch(self) -> None:
        while self.next < len(self.buckets) and self.left[self.next] == 0:
            pos = self.next
            flat = self.flats[pos]
            # fp16 on the wire: already divided by the world size, so the sum does not overflow
            wire = flat.to(self.wire_dtype) if self.wire_dtype is not None and flat.is_floating_point() else flat
            event = timeline.bucket_started(pos, self._names(self.buckets[pos]), wire.element_size() * wire.numel())
            work = collective(lambda: f"start of all-reduce of bucket {pos} ({self._names(self.buckets[pos])})",
                              lambda: dist.all_reduce(wire, async_op=True))
            if event is not None and hasattr(work, "get_future"):  # hvd.start_timeline: finish time when done
                work.get_future().add_done_callback(lambda _f, e=event: timeline.bucket_finished(e))
            self.works.append((pos, wire, work, event))
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


def allreduce_arrays(named: Sequence[tuple[str, np.ndarray]], *, plan: str | Plan = "aiacc",
                     average: bool = True, compression: str = "none",
                     cache: dict | None = None) -> list[np.ndarray]:
    """All-reduce numpy arrays (TensorFlow / MXNet gradients) following a plan; returns new arrays.

    `cache` keeps the plan between calls with the same names and shapes."""
    require()
    arrays = [np.ascontiguousarray(a) for _, a in named]
    if dist.get_world_size() == 1:
        return [a.copy() for a in arrays]
    key = tuple((n, a.shape, a.dtype.str) for (n, _), a in zip(named, arrays))
    if cache is not None and cache.get("key") == key:
        executor = cache["executor"]
    else:
        params = [(n, a.shape, a.dtype) for (n, _), a in zip(named, arrays)]
        p, order, spec = plan_for(params, plan, compression=compression)
        executor = PlanExecutor(p, order, {g.name: g.numel for g in spec.gradients()}, average=average,
                                compression=compression,
                                dtypes={n: torch.from_numpy(a[:0]).dtype for (n, _), a in zip(named, arrays)})
        if cache is not None:
            cache["key"], cache["executor"] = key, executor
    # gradients arrive all at once here: mark them in the order backward produced them (reverse). Whole
    # tensors are copied straight into the bucket buffers; pieces of cut tensors need their own copy.
    for (name, _), a in reversed(list(zip(named, arrays))):
        whole = all(slot.whole for _, slot in executor.holders.get(name, ()))
        executor.ready(name, torch.from_numpy(a if whole and a.flags.writeable else a.copy()))
    done = executor.wait()
    # the bucket buffers are reused by the next call: hand out copies
    return [done[name].numpy().copy() for name, _ in named]
