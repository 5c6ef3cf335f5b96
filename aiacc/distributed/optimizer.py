"""Wrapping a framework's optimizer as Horovod's DistributedOptimizer does: the result is an instance of a
subclass of the optimizer's own class (so `isinstance(opt, torch.optim.SGD)` still holds), with the methods
of a mixin in front. Torch-free; used by the torch and Keras modules."""
from __future__ import annotations

from typing import Any, Callable


def distributed_class(optimizer: Any, mixin: type) -> type:
    """A subclass of `optimizer`'s class, of the same name, whose body is `mixin`'s (its methods reach
    the original ones with `super(self.__class__, self)`)."""
    body = {k: v for k, v in mixin.__dict__.items() if k not in ("__dict__", "__weakref__")}
    return type(optimizer.__class__.__name__, (optimizer.__class__,), body)


def wrap(optimizer: Any, mixin: type, build: Callable[[type], Any] | None = None, **attrs: Any) -> Any:
    """`optimizer` as an instance of `distributed_class(optimizer, mixin)` with `attrs` set on it.

    By default the new instance shares the optimizer's state (its __dict__ is copied: torch optimizers);
    `build(cls)` makes it instead (Keras: `cls.from_config(optimizer.get_config())`)."""
    cls = distributed_class(optimizer, mixin)
    if build is None:
        wrapped = cls.__new__(cls)
        wrapped.__dict__.update(optimizer.__dict__)
    else:
        wrapped = build(cls)
    for k, v in attrs.items():
        setattr(wrapped, k, v)
    return wrapped
