"""Joining and leaving the job: which process this is (the torchrun environment) and the process group.

Processes are started by `torchrun` (one machine: `torchrun --nproc_per_node 2 train.py`; several:
`torchrun --nnodes N --node_rank i --rdzv-endpoint <node 0>:29500 train.py` on each, see
`aiacc.distributed.testbed` for an emulated cluster), which sets RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT. Without them a process runs alone (world size 1), like Horovod without
`horovodrun`. The transport is torch.distributed (gloo on CPU, NCCL on GPU).

This module does not import torch until a function needs the process group (`init`, `rank`, ...), so the
TensorFlow and MXNet Horovod modules import without torch.

Errors: a collective that fails (a peer died, or did not answer within AIACC_COMM_TIMEOUT seconds,
default 300; joining the job may take AIACC_JOIN_TIMEOUT, default 300) raises `RankFailureError`.
"""
from __future__ import annotations

import datetime
import os
from typing import Any, Callable

from aiacc.core.comm import CommError, RankFailureError

DEFAULT_TIMEOUT_S = 300.0


def _dist():
    import torch.distributed as dist

    return dist


def timeout_s() -> float:
    """Seconds a collective may wait for a peer (AIACC_COMM_TIMEOUT, default 300)."""
    return float(os.environ.get("AIACC_COMM_TIMEOUT", DEFAULT_TIMEOUT_S))


def join_timeout_s() -> float:
    """Seconds `init` waits for every rank to join (AIACC_JOIN_TIMEOUT, default 300, never less than the
    collective timeout): ranks of a loaded machine may start seconds apart."""
    return max(timeout_s(), float(os.environ.get("AIACC_JOIN_TIMEOUT", DEFAULT_TIMEOUT_S)))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def local_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))


def is_initialized() -> bool:
    import sys

    if "torch" not in sys.modules:  # nobody joined a process group (and torch need not be imported)
        return False
    return _dist().is_initialized()


def default_backend(cuda: bool) -> str:
    """The torch.distributed backend when none is given: with CUDA, NCCL for CUDA tensors and gloo for CPU
    ones (torch dispatches each collective by the tensor's device), gloo alone without CUDA."""
    return "cpu:gloo,cuda:nccl" if cuda else "gloo"


def init(backend: str | None = None) -> None:
    """Join the job's process group (once). Backend: AIACC_BACKEND, else default_backend()."""
    import torch

    dist = _dist()
    if dist.is_initialized():
        return
    if "WORLD_SIZE" not in os.environ:  # not launched by torchrun: a job of one
        from aiacc.distributed.launch import free_port

        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    backend = backend or os.environ.get("AIACC_BACKEND") or default_backend(torch.cuda.is_available())
    if "nccl" in backend:  # ranks beyond the device count share devices (NCCL itself may refuse that)
        torch.cuda.set_device(local_rank() % max(1, torch.cuda.device_count()))
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
    if not is_initialized():
        return
    dist = _dist()
    try:
        if dist.get_world_size() > 1:
            collective("barrier before shutdown", dist.barrier)
    finally:
        dist.destroy_process_group()


def require() -> None:
    """Raise CommError unless this process joined the job (hvd.init())."""
    if not is_initialized():
        raise CommError("aiacc distributed is not initialised: call hvd.init() first")


def rank() -> int:
    require()
    return _dist().get_rank()


def size() -> int:
    require()
    return _dist().get_world_size()


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
            f"rank {_dist().get_rank()}: {what} failed; a peer rank exited, crashed or did not answer within "
            f"{timeout_s():g} s (AIACC_COMM_TIMEOUT). Transport said: {type(e).__name__}: {str(e)[:300]}") from e


def barrier() -> None:
    require()
    dist = _dist()
    collective("barrier", lambda: dist.barrier())
