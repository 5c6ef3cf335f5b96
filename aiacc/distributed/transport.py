"""Collectives on data over torch.distributed: the consistency check that all ranks hold the same tensors,
and broadcasts (of numpy arrays, for TensorFlow and MXNet, and of picklable objects).

The process group itself (init, rank, timeouts, turning failures into RankFailureError) is in
`aiacc.distributed.process`; all-reducing gradients along a plan is `aiacc.distributed.executor`.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist

from aiacc.core.comm import RankMismatchError
from aiacc.distributed.process import collective, require


def check_same(entries: Sequence[tuple], what: str = "parameter") -> None:
    """Raise RankMismatchError on every rank unless all ranks hold the same list of (name, shape, dtype)."""
    require()
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
    require()
    box = [obj]
    collective(f"broadcast of {what}", lambda: dist.broadcast_object_list(box, src=root_rank))
    return box[0]
