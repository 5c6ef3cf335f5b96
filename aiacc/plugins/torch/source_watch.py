"""The weights an optimized inference module shares with the original, and the ones it copied.

Since the inference export holds the original's own tensor wherever the IR still holds exactly its memory
(exporter._state_tensor), the optimized module follows an in-place change of those (a load_state_dict into
the original, an optimizer step on it): the fast path even repacks a changed weight (fastpath._packed).
Folded weights (conv + BatchNorm, constants a pass computed), copies held beside opaque calls and an opaque
submodule's own parameters are snapshots of optimize time and do not follow. After an in-place change of one
of their sources the optimized module would silently compute with a mix of old and new weights.

`watch` records each such source tensor's version counter (`Tensor._version`, which every in-place write
bumps: copy_, add_, an optimizer's step, load_state_dict) and a CRC-32 of its bytes at export; the module's
forward starts by comparing the versions (a few ints: `SourceWatch.forward`); where one moved, the checksum
tells a rewrite of the same values (a caller restoring buffers after a run: no change) from a change, which is
a StaleWeightsError naming the parameter, with the fix: optimize the original again. A module that shares nothing (on CUDA, or every weight copied)
or copies nothing derived from a source gets no watch: it is either a consistent snapshot or follows
the original entirely. torch.save / copy.deepcopy give a module that shares nothing with the original, so
the copy's watch is empty.

The watch holds no tensor (every tensor of the optimized module is registered, so .to() moves it:
tests/gpu/test_torch_device.py): the original's tensors are weak references (an original deleted can no longer
be changed: nothing to watch). A .to() / .double() / .cuda() of the optimized module that gives its tensors new
memory leaves it sharing nothing with the original, a consistent snapshot: the next call drops the watch; a .to()
that changes nothing (the same device and dtype) keeps it. Likewise a change seen after the original itself was
converted (new memory for its tensors) is no mix of old and new weights, and drops it.
"""
from __future__ import annotations

import weakref
import zlib
from typing import Any, Iterable

import torch
from torch import nn

from aiacc.errors import StaleWeightsError

WATCH_NAME = "aiacc_source_watch"


class SourceWatch(nn.Module):
    """Checks, on each forward, that the original's tensors the optimized module copied from are unchanged.

    It holds no tensor (every tensor of the optimized module is a registered parameter or buffer, which .to()
    moves): the original's tensors are weak references, so an original deleted is no longer watched (nothing
    can change it in place any more), and the optimized module is reached through a weak reference too."""

    _is_impure = True  # fx's dead-code elimination keeps the call (it returns nothing)

    def __init__(self, sources: Iterable[tuple[str, torch.Tensor]], shared: Iterable[torch.Tensor],
                 root: nn.Module, model: str = "the model"):
        super().__init__()
        self.model = model
        # [name, weakref to the original's tensor, version, checksum] at optimize time
        self.watched = [[name, weakref.ref(t), t._version, checksum(t)] for name, t in sources]
        # the original's tensors whose memory the optimized module holds: the watch is needed only while it
        # still holds one of them (a .to() that moves or converts its tensors makes it a consistent snapshot)
        self.shared = [weakref.ref(t) for t in shared]
        self.root = weakref.ref(root)
        self.moved = False  # an _apply (.to(), .double(), ...) ran: sharing is checked again on the next call

    def forward(self) -> None:
        """Raise StaleWeightsError naming the sources whose values changed in place since optimize."""
        if self.moved:
            self.moved = False
            if not self._still_shared():
                self._drop()
                return
        for entry in self.watched:
            t = entry[1]()
            if t is None or t._version != entry[2]:
                self._recheck()
                return

    def _apply(self, fn: Any, recurse: bool = True) -> "SourceWatch":
        # called by the optimized module's .to() / .float() / .cuda() / share_memory(), before all of its own
        # tensors are converted (children come first): the check is on the next call, when they all are
        self.moved = True
        return super()._apply(fn, recurse)

    def _still_shared(self) -> bool:
        """Whether the optimized module still holds the memory of one of the original's tensors (on the CPU,
        where sharing happens): after a .to() to another device or dtype, or after the original itself was
        converted (its tensors given new memory), it does not."""
        root = self.root() if self.root is not None else None
        if root is None:
            return False
        held = _held_pointers(root)
        return any(t is not None and t.device.type == "cpu" and t.data_ptr() in held
                   for t in (r() for r in self.shared))

    def _drop(self) -> None:
        """Nothing of the original is shared any more: a consistent snapshot, no longer watched."""
        self.watched, self.shared = [], []

    def _recheck(self) -> None:
        """A version moved (or a source was deleted): a write of the same values (a caller restoring buffers
        after a run, a load_state_dict of the same weights) is no change, and its new version is taken; a change
        while the module still shares memory with the original raises; a deleted source is forgotten."""
        self.watched = [e for e in self.watched if e[1]() is not None]
        changed = []
        for entry in self.watched:
            name, ref, version, crc = entry
            t = ref()
            if t._version != version:
                if checksum(t) != crc:
                    changed.append(name)
                else:
                    entry[2] = t._version
        if changed:
            if not self._still_shared():  # e.g. the original was moved or converted: no longer a mix
                self._drop()
                return
            self._stale(changed)

    def _stale(self, changed: list[str]) -> None:
        name = changed[0]
        more = f" (and {len(changed) - 1} more: {', '.join(changed[1:4])}{', ...' if len(changed) > 4 else ''})" \
            if len(changed) > 1 else ""
        raise StaleWeightsError(
            f"{self.model}'s parameter or buffer {name}{more} was changed in place after aiacc.optimize (a "
            f"load_state_dict, an optimizer step or another in-place write into the original model): the optimized "
            f"module holds a copy computed from its old value (a folded or copied weight) beside weights it shares "
            f"with the original, so it would compute with a mix of old and new weights. Call aiacc.optimize on the "
            f"original again after changing its weights (or optimize a copy.deepcopy of the model to keep an "
            f"independent snapshot).")

    def __getstate__(self) -> dict:
        # a pickled or deep-copied module holds its own tensors: nothing of the original to watch (and weak
        # references cannot be pickled)
        state = self.__dict__.copy()
        state.update(watched=[], shared=[], root=None, moved=False)
        return state

    def extra_repr(self) -> str:
        return f"{len(self.watched)} source tensors"


def checksum(t: torch.Tensor) -> int:
    """CRC-32 of a CPU tensor's bytes (read in place where contiguous): tells a rewrite of the same values
    from a change, without keeping a copy of the weights."""
    d = t.detach()
    if not d.is_contiguous():
        d = d.contiguous()
    if d.dtype in (torch.bfloat16, torch.float16):
        d = d.view(torch.int16)
    elif d.dtype == torch.bool:
        d = d.view(torch.uint8)
    return zlib.crc32(memoryview(d.numpy()).cast("B"))


def _held_pointers(module: nn.Module) -> set[int]:
    ptrs = set()
    for t in list(module.parameters()) + list(module.buffers()):
        if t.numel() and t.device.type == "cpu":
            ptrs.add(t.data_ptr())
    return ptrs


def watch(gm: Any, sources: dict[int, tuple[str, torch.Tensor]], multi_use: set[str], model: str,
          original_state: dict[str, torch.Tensor]) -> int:
    """Put a SourceWatch at the start of `gm`'s forward when it shares some of `sources` (id -> (name, the
    original's tensor): what the export was computed from) with the original and copied others (or shares
    one that also fed a copy: a tensor of several uses, names in `multi_use`). Returns the number watched.
    `original_state`: the original's tensors by name, for the BatchNorm counters (below)."""
    held = _held_pointers(gm)
    cpu = {k: (n, t) for k, (n, t) in sources.items() if t.device.type == "cpu" and t.numel()}
    shared = [k for k, (_, t) in cpu.items() if t.data_ptr() in held]
    if not shared:
        return 0  # a consistent snapshot: nothing follows the original
    watched = [(n, t) for k, (n, t) in cpu.items() if t.data_ptr() not in held or n in multi_use]
    if not watched:
        return 0  # every source is held as the original's own tensor: it follows the original entirely
    # BatchNorm's native kernel updates running_mean / running_var in a train-mode forward without bumping their
    # version; the module's num_batches_tracked.add_(1) beside it does, so it stands for them
    names = {n for n, _ in watched}
    for n in sorted(names):
        owner, _, field = n.rpartition(".")
        counter = f"{owner}.num_batches_tracked" if owner else "num_batches_tracked"
        if field in ("running_mean", "running_var") and counter not in names and counter in original_state:
            watched.append((f"{n} (its BatchNorm's {counter} moved: a train-mode forward of the original)",
                            original_state[counter]))
            names.add(counter)
    gm.add_module(WATCH_NAME, SourceWatch(watched, [cpu[k][1] for k in shared], gm, model))
    graph = gm.graph
    first = next(n for n in graph.nodes if n.op != "placeholder")
    with graph.inserting_before(first):
        graph.call_module(WATCH_NAME)
    gm.recompile()
    return len(watched)
