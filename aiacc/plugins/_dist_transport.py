"""The one transport under every aiacc Horovod-compatible API: torch.distributed (gloo on CPU, NCCL on GPU).

Processes are started by `torchrun` (single node: `torchrun --nproc_per_node 2 train.py`; several nodes:
torchrun's rendezvous), which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. Without
them a process runs alone (world size 1), like Horovod without `horovodrun`.

`PlanExecutor` runs a communication plan (aiacc.core.comm.Plan) on torch tensors: each bucket has a
flat buffer (kept across steps) that gradients are copied into, already divided by the world size, as
they become ready; torch gradients then stay there as views (`param.grad`), so later steps need no
copy. A bucket's all-reduce is started asynchronously, in place, as soon as all its pieces are ready and
every bucket before it in the plan's issue order has started (all ranks must issue collectives in the
same order); `wait()` finishes them. TensorFlow and MXNet gradients reach it as numpy arrays.

Errors: a collective that fails (a peer died, or did not answer within the timeout, AIACC_COMM_TIMEOUT
seconds, default 300; joining the job may take AIACC_JOIN_TIMEOUT, default 300) raises
`RankFailureError`; ranks holding different parameters raise `RankMismatchError` naming the first
difference.
"""
from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from aiacc.core.comm import (ClusterSpec, CommError, ModelSpec, Plan, RankFailureError, RankMismatchError,
                             gradient_specs_from_params, make_plan, simulate)

DEFAULT_TIMEOUT_S = 300.0


# -- process group ---------------------------------------------------------------------------------

def timeout_s() -> float:
    """Seconds a collective may wait for a peer (AIACC_COMM_TIMEOUT, default 300)."""
    return float(os.environ.get("AIACC_COMM_TIMEOUT", DEFAULT_TIMEOUT_S))


def join_timeout_s() -> float:
    """Seconds `init` waits for every rank to join (AIACC_JOIN_TIMEOUT, default 300, never less than the
    collective timeout): ranks of a loaded machine may start seconds apart."""
    return max(timeout_s(), float(os.environ.get("AIACC_JOIN_TIMEOUT", DEFAULT_TIMEOUT_S)))


def init(backend: str | None = None) -> None:
    """Join the job's process group (once). Backend: AIACC_BACKEND, else NCCL with CUDA, else gloo."""
    if dist.is_initialized():
        return
    if "WORLD_SIZE" not in os.environ:  # not launched by torchrun: a job of one
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    backend = backend or os.environ.get("AIACC_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(local_rank())
    from torch.distributed import distributed_c10d as c10d

    # join with the generous timeout, then collectives get AIACC_COMM_TIMEOUT (where torch lets us set it)
    can_shorten = hasattr(c10d, "_set_pg_timeout")
    join = join_timeout_s() if can_shorten else timeout_s()
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=join))
    except Exception as e:  # rendezvous failed or timed out
        raise RankFailureError(f"rank {os.environ.get('RANK')}: could not join the process group at "
                               f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} within "
                               f"{join:g} s ({type(e).__name__}: {e})") from e
    if can_shorten and join != timeout_s():
        c10d._set_pg_timeout(datetime.timedelta(seconds=timeout_s()))


def shutdown() -> None:
    """Leave the process group. All ranks first meet at a barrier, so that no rank tears down its
    connections while a peer still talks to it (gloo aborts the process on such a teardown)."""
    if dist.is_initialized():
        try:
            if dist.get_world_size() > 1:
                collective("barrier before shutdown", dist.barrier)
        finally:
            dist.destroy_process_group()


def _require() -> None:
    if not dist.is_initialized():
        raise CommError("aiacc distributed is not initialised: call hvd.init() first")


def rank() -> int:
    _require()
    return dist.get_rank()


def size() -> int:
    _require()
    return dist.get_world_size()


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def local_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))


def collective(what: str | Callable[[], str], fn: Callable[[], Any]) -> Any:
    """Run a collective, turning a transport failure into RankFailureError that says what was running
    (`what`, or a function that describes it, called only on failure)."""
    try:
        return fn()
    except CommError:
        raise
    except Exception as e:
        what = what() if callable(what) else what
        raise RankFailureError(
            f"rank {dist.get_rank()}: {what} failed; a peer rank exited, crashed or did not answer within "
            f"{timeout_s():g} s (AIACC_COMM_TIMEOUT). Transport said: {type(e).__name__}: {str(e)[:300]}") from e


def barrier() -> None:
    _require()
    collective("barrier", lambda: dist.barrier())


# -- consistency checks ----------------------------------------------------------------------------

def check_same(entries: Sequence[tuple], what: str = "parameter") -> None:
    """Raise RankMismatchError on every rank unless all ranks hold the same list of (name, shape, dtype)."""
    _require()
    if dist.get_world_size() == 1:
        return
    mine = [tuple(str(x) if i != 1 else tuple(int(d) for d in x) for i, x in enumerate(e)) for e in entries]
    gathered: list[Any] = [None] * dist.get_world_size()
    collective(f"exchange of {what} lists", lambda: dist.all_gather_object(gathered, mine))
    ref = gathered[0]
    for r, other in enumerate(gathered[1:], 1):
        for i in range(max(len(ref), len(other))):
            a = ref[i] if i < len(ref) else None
            b = other[i] if i < len(other) else None
            if a != b:
                def fmt(e):
                    return "nothing" if e is None else f"{e[0]} shape {tuple(e[1])} {' '.join(e[2:])}".strip()
                raise RankMismatchError(
                    f"ranks hold different {what}s: first mismatch at {what} #{i}: rank 0 has {fmt(a)}, "
                    f"rank {r} has {fmt(b)} ({len(ref)} vs {len(other)} {what}s)")


# -- planning --------------------------------------------------------------------------------------

_CLUSTER: ClusterSpec | None = None


def calibrate(reps: int = 5) -> ClusterSpec:
    """The job's cluster as measured: all-reduce times of 4 bytes and 4 MB fitted to the alpha-beta
    model of a flat ring (rank 0's measurement, shared by all ranks so that their plans agree).
    AIACC_NETWORK_GBPS=<Gb/s> skips the measurement and assumes that network between nodes."""
    global _CLUSTER
    if _CLUSTER is not None:
        return _CLUSTER
    world = dist.get_world_size()
    if "AIACC_NETWORK_GBPS" in os.environ or world == 1:
        per = max(1, min(local_size(), world))
        per = per if world % per == 0 else 1
        gbps = float(os.environ.get("AIACC_NETWORK_GBPS", 25))
        _CLUSTER = ClusterSpec(nodes=world // per, workers_per_node=per, inter_bandwidth=gbps * 1e9 / 8)
        return _CLUSTER

    def timed(n: int) -> float:
        t = torch.zeros(n)
        best = float("inf")
        for _ in range(reps):
            collective("calibration barrier", dist.barrier)
            t0 = time.perf_counter()
            collective("calibration all-reduce", lambda: dist.all_reduce(t))
            best = min(best, time.perf_counter() - t0)
        return best

    small, big = timed(1), timed(1 << 20)
    alpha = small / (2 * (world - 1))
    coef = max(big - small, 1e-9) / (4 << 20)
    measured = [alpha, 2 * (world - 1) / world / coef]
    measured = broadcast_object(measured, 0, "calibration")
    _CLUSTER = ClusterSpec(nodes=1, workers_per_node=world, inter_bandwidth=measured[1],
                           intra_bandwidth=measured[1], intra_latency=measured[0])
    return _CLUSTER


def plan_for(params: Sequence[tuple[str, Sequence[int], Any]], plan: str | Plan = "aiacc", *,
             compression: str = "none", model_spec: ModelSpec | None = None) -> tuple[Plan, list[int], ModelSpec]:
    """A plan for these (name, shape, dtype) parameters (forward order) and its issue order.

    Rank 0 plans (on `model_spec`, by default sizes with a nominal compute time, and the calibrated
    cluster) and sends the plan to the others: all ranks must run the same collectives."""
    spec = model_spec or gradient_specs_from_params(params, name="model", forward_s=1e-3)
    cluster = calibrate() if dist.is_initialized() else ClusterSpec(1, 1, 1e9)
    chosen = None
    if not dist.is_initialized() or dist.get_rank() == 0:
        p = make_plan(plan, spec, cluster, compression=compression) if isinstance(plan, str) else plan
        p.validate(spec)
        chosen = (p, simulate(spec, cluster, p, validate=False).issue_order)
    if dist.is_initialized() and dist.get_world_size() > 1:
        chosen = broadcast_object(chosen, 0, "communication plan")
        chosen[0].validate(spec)  # a rank whose parameters differ from rank 0's fails here, by name
    return chosen[0], list(chosen[1]), spec


# -- plan execution --------------------------------------------------------------------------------

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
        self.compression = compression or plan.compression
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
        self.reset()

    def reset(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.left = list(self.pieces)  # pieces of each bucket not yet copied in this step
        self.next = 0  # next bucket (issue order) to start
        self.works: list[tuple[int, torch.Tensor, Any]] = []
        self.reduced = [0] * len(self.buckets)  # all-reduces finished per bucket this step (must end at 1)

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
            work = collective(lambda: f"start of all-reduce of bucket {pos} ({self._names(self.buckets[pos])})",
                              lambda: dist.all_reduce(wire, async_op=True))
            self.works.append((pos, wire, work))
            self.next += 1

    @staticmethod
    def _names(bucket) -> str:
        names = list(dict.fromkeys(p.grad for p in bucket.pieces))
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    def wait(self, fill_missing: Callable[[str], torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Finish the step: gradients never marked ready get `fill_missing(name)` (zeros by default), then
        wait for every all-reduce; averaged results are in the homes, and copied back into the
        gradients that were cut into pieces. Returns {name: tensor holding the result}."""
        if len(self.tensors) < len(self.numel):
            for name, n in self.numel.items():
                if name not in self.tensors:
                    self.ready(name, fill_missing(name) if fill_missing else torch.zeros(n))
        self._check_started()
        with torch.no_grad():
            for pos, wire, work in self.works:
                collective(lambda: f"all-reduce of bucket {pos} ({self._names(self.buckets[pos])})", work.wait)
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
        bad = [pos for pos, n in enumerate(self.reduced) if n != 1]
        if bad:
            pos = bad[0]
            raise CommError(f"bucket {pos} ({self._names(self.buckets[pos])}) was all-reduced "
                            f"{self.reduced[pos]} times in this step, not once")
        out = self.tensors
        self.reset()
        return out

    def _check_started(self) -> None:
        """Every gradient is in: every piece of every bucket must have been copied in exactly once and
        every bucket started once, else the step would end with a gradient not reduced."""
        for pos, left in enumerate(self.left):
            if left != 0:
                raise CommError(f"bucket {pos} ({self._names(self.buckets[pos])}) is missing {left} of its "
                                f"{self.pieces[pos]} pieces at the end of the step")
        started = [pos for pos, _, _ in self.works]
        if started != list(range(len(self.buckets))):
            raise CommError(f"the step started all-reduces of buckets {started}, expected each of the "
                            f"{len(self.buckets)} buckets once, in issue order")


def allreduce_arrays(named: Sequence[tuple[str, np.ndarray]], *, plan: str | Plan = "aiacc",
                     average: bool = True, compression: str = "none",
                     cache: dict | None = None) -> list[np.ndarray]:
    """All-reduce numpy arrays (TensorFlow / MXNet gradients) following a plan; returns new arrays.

    `cache` keeps the plan between calls with the same names and shapes."""
    _require()
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


def broadcast_arrays(named: Sequence[tuple[str, np.ndarray]], root_rank: int = 0,
                     what: str = "parameter") -> list[np.ndarray]:
    """Check that all ranks hold the same names/shapes/dtypes, then return root_rank's values."""
    check_same([(n, np.shape(a), np.asarray(a).dtype.name) for n, a in named], what)
    out = []
    for name, a in named:
        t = torch.from_numpy(np.ascontiguousarray(a).copy())
        collective(f"broadcast of {what} {name}", lambda: dist.broadcast(t, root_rank))
        out.append(t.numpy())
    return out


def broadcast_object(obj: Any, root_rank: int = 0, what: str = "object") -> Any:
    _require()
    box = [obj]
    collective(f"broadcast of {what}", lambda: dist.broadcast_object_list(box, src=root_rank))
    return box[0]


# -- local launcher (tests and benchmarks; users run torchrun) --------------------------------------

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_local(argv: Sequence[str], nprocs: int = 2, *, timeout: float = 120.0,
                 env: dict[str, str] | None = None) -> list[subprocess.CompletedProcess]:
    """Run `python argv...` as `nprocs` ranks on loopback (the environment torchrun would set) and wait.

    Ranks still running after `timeout` seconds are killed and reported with returncode None."""
    port = free_port()
    procs = []
    for r in range(nprocs):
        e = dict(os.environ)
        e.update(env or {})
        e.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS=e.get("OMP_NUM_THREADS", "1"))
        procs.append(subprocess.Popen([sys.executable, *argv], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + timeout
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            results.append(subprocess.CompletedProcess(p.args, None, out, err))
    return results
