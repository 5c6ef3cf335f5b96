"""Reduction ops and wire compression of the Horovod-compatible APIs (Horovod's hvd.Average, hvd.Sum,
hvd.Compression): one definition for the torch, TensorFlow and MXNet modules. Torch-free.
"""
from __future__ import annotations

from aiacc.core.comm import CommError
from aiacc.core.comm.plan import COMPRESSIONS

Average = "average"
Sum = "sum"


class Compression:
    """Gradient compression on the wire (Horovod's hvd.Compression): `fp16` sends float16 (half the
    bytes) and gives the result back in the gradient's own dtype."""

    none = "none"
    fp16 = "fp16"


def check(compression: str | None) -> str:
    """The compression name, checked: an unknown one would otherwise silently send full precision."""
    compression = Compression.none if compression is None else compression
    if compression not in COMPRESSIONS:
        raise CommError(f"unknown compression {compression!r}; expected one of "
                        f"{', '.join('hvd.Compression.' + c for c in COMPRESSIONS)}")
    return compression


def is_average(average: bool | None = None, op: str | None = None) -> bool:
    """Whether a reduction averages, from Horovod's `average=` (older) or `op=` (newer) argument."""
    if op is not None and average is not None:
        raise CommError("give either average= or op=, not both")
    if op is not None:
        if op not in (Average, Sum):
            raise CommError(f"unsupported reduction op {op!r}; expected hvd.Average or hvd.Sum")
        return op == Average
    return True if average is None else bool(average)
