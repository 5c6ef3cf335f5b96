"""Helpers every torch converter uses: argument checks that refuse (Untranslatable) what they do not cover."""
from __future__ import annotations



from aiacc.core.ir import Value
from aiacc.core.ops import get_schema
from aiacc.core.translate import Untranslatable


def need(op: str) -> None:
    """Refuse (-> opaque) when the core registry lacks an op this conversion needs."""
    if get_schema(op) is None:
        raise Untranslatable(f"the IR has no {op} op")


def tensor(x: Any, what: str = "input") -> Value:
    if not isinstance(x, Value):
        raise Untranslatable(f"{what} is not a tensor")
    return x


def rank(v: Value) -> int:
    if v.shape is None:
        raise Untranslatable(f"%{v.name} has unknown rank")
    return len(v.shape)


def norm_axis(axis: int, r: int) -> int:
    if not -r <= axis < max(r, 1):
        raise Untranslatable(f"axis {axis} out of range for rank {r}")
    return axis % r if r else 0


def pair(x, n: int) -> list[int]:
    if isinstance(x, (list, tuple)):
        return [int(v) for v in x]
    return [int(x)] * n
