"""mode="train": the step aiacc hands back is the faster of its own exported graph and the same graph under
the framework's own compiler (torch.compile, XLA jit_compile, MXNet's static hybridize flags), chosen by
measuring a few interleaved training steps (forward + backward) on the example inputs at optimize time.

Every plugin passes its candidates here; this module imports no framework. The option that steers it is
`framework_compile`: "auto" (measure, the default), True (use the framework's compiler without measuring),
False (never). The result (`TrainChoice`) is attached to the returned model as `aiacc_train_choice`, its
`path` as `aiacc_train_path`, and a choice of the framework's compiler is warned (AiaccWarning), so the user
knows the step runs through it.
"""
from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from aiacc.errors import AiaccWarning, OptionError

OPTION_DOC = ("mode='train': 'auto' measures aiacc's step with and without the framework's compiler and keeps "
              "the faster; True always uses the compiler; False never")

# a compiled candidate must be at least this much faster to be chosen (timing noise on a shared machine)
MARGIN = 0.97


@dataclass
class TrainChoice:
    """What mode='train' runs underneath and why."""

    path: str  # the candidate chosen ("aiacc graph", "aiacc graph + torch.compile", ...)
    ms: dict[str, float] = field(default_factory=dict)  # median step milliseconds per candidate measured
    reason: str = ""

    def summary(self) -> str:
        times = ", ".join(f"{k} {v:.1f} ms" for k, v in self.ms.items())
        return f"{self.path}: {self.reason}" + (f" ({times})" if times else "")


def option(options: dict) -> Any:
    """The framework_compile option popped from `options` ("auto" when absent), checked."""
    value = options.pop("framework_compile", "auto")
    if value not in ("auto", True, False):
        raise OptionError(f"framework_compile must be 'auto', True or False, not {value!r}")
    return value


def same_results(a: list, b: list, rtol: float = 1e-4, atol: float = 1e-6) -> str:
    """'' when two steps' results (loss and gradients as numpy arrays) agree, else what differs."""
    if len(a) != len(b):
        return f"{len(b)} results instead of {len(a)}"
    for k, (x, y) in enumerate(zip(a, b)):
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        scale = float(np.abs(x).max()) if x.size else 0.0
        if x.shape != y.shape or (x.size and float(np.abs(x - y).max()) > rtol * scale + atol):
            return f"{'the loss' if k == 0 else f'gradient {k - 1}'} differs"
    return ""


def choose(base: str, make_compiled: Callable[[], Any], step_of: Callable[[Any], Callable[[], Any]],
           base_model: Any, setting: Any, compiler: str, rounds: int = 5,
           to_arrays: Callable[[Any], list] | None = None) -> tuple[Any, TrainChoice]:
    """(model, TrainChoice): `base_model` or the model `make_compiled()` builds, whichever runs
    `step_of(model)` (one forward + backward, side effects undone by the caller's step) faster over
    `rounds` interleaved rounds after one warm-up each. `setting` is the framework_compile option. A
    compiled candidate that fails to build or run, or whose warm-up step's results (`to_arrays` of what
    the step returns: loss and gradients) differ from aiacc's own, is not chosen (warned)."""
    if setting is False:
        return base_model, TrainChoice(base, reason="framework_compile=False")
    try:
        compiled = make_compiled()
        if setting is True:
            return compiled, TrainChoice(f"{base} + {compiler}", reason="framework_compile=True")
        steps = {base: step_of(base_model), f"{base} + {compiler}": step_of(compiled)}
        warm = [fn() for fn in steps.values()]  # warm-up: the compiler compiles here
        problem = same_results(to_arrays(warm[0]), to_arrays(warm[1])) if to_arrays else ""
        if problem:
            raise ValueError(f"{problem} from aiacc's own step")
        times: dict[str, list[float]] = {k: [] for k in steps}
        for _ in range(rounds):
            for k, fn in steps.items():
                t = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t)
    except Exception as e:  # noqa: BLE001 - the compiler refusing the graph leaves aiacc's own step
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        warnings.warn(f"aiacc: mode='train' keeps its own step: {compiler} failed on it ({type(e).__name__}: "
                      f"{first})", AiaccWarning, stacklevel=3)
        return base_model, TrainChoice(base, reason=f"{compiler} failed: {type(e).__name__}: {first}")
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    fast = f"{base} + {compiler}"
    if ms[fast] < MARGIN * ms[base]:
        choice = TrainChoice(fast, ms, f"measured faster by {ms[base] / ms[fast]:.2f}x, so aiacc runs its step "
                                       f"through {compiler}")
        warnings.warn(f"aiacc: mode='train' runs the optimized step through {compiler}: measured "
                      f"{ms[fast]:.1f} ms vs {ms[base]:.1f} ms without it (framework_compile=False opts out)",
                      AiaccWarning, stacklevel=3)
        return compiled, choice
    return base_model, TrainChoice(base, ms, f"{compiler} measured no faster ({ms[fast]:.1f} ms vs "
                                             f"{ms[base]:.1f} ms)")


def attach(model: Any, choice: TrainChoice) -> Any:
    """Record the choice on the model (where it takes attributes) and return the model."""
    for name, value in (("aiacc_train_choice", choice), ("aiacc_train_path", choice.path)):
        try:
            setattr(model, name, value)
        except (AttributeError, TypeError):
            pass
    return model
