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
           to_arrays: Callable[[Any], list] | None = None,
           more: dict[str, Callable[[], Any]] | None = None) -> tuple[Any, TrainChoice]:
    """(model, TrainChoice): `base_model`, the model `make_compiled()` builds (named base + compiler) or one
    of `more` (name -> maker: other forms of the framework's best path), whichever runs `step_of(model)`
    (one forward + backward, side effects undone by the step itself) fastest over `rounds` interleaved
    rounds after one warm-up each; an alternative must beat aiacc's own step by the MARGIN. `setting` is
    the framework_compile option (True: the compiled model, unmeasured). An alternative that fails to build
    or run, or whose warm-up step's results (`to_arrays` of what the step returns: loss and gradients)
    differ from aiacc's own, is left out (warned)."""
    fast = f"{base} + {compiler}"
    if setting is False:
        return base_model, TrainChoice(base, reason="framework_compile=False")
    makers = {fast: make_compiled, **(more or {})}
    if setting is True:
        return make_compiled(), TrainChoice(fast, reason="framework_compile=True")
    models, steps, warm = {base: base_model}, {base: step_of(base_model)}, {}
    warm[base] = steps[base]()
    reasons = []
    for name, make in makers.items():
        try:
            model = make()
            step = step_of(model)
            result = step()  # warm-up: the compiler compiles here
            problem = same_results(to_arrays(warm[base]), to_arrays(result)) if to_arrays else ""
            if problem:
                raise ValueError(f"{problem} from aiacc's own step")
        except Exception as e:  # noqa: BLE001 - the compiler refusing the graph leaves the others
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            warnings.warn(f"aiacc: mode='train' does not use {name}: it failed ({type(e).__name__}: {first})",
                          AiaccWarning, stacklevel=3)
            reasons.append(f"{name} failed: {type(e).__name__}: {first}")
            continue
        models[name], steps[name] = model, step
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(rounds):
        for k, fn in steps.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    best = min(ms, key=ms.get)
    if best != base and ms[best] < MARGIN * ms[base]:
        warnings.warn(f"aiacc: mode='train' runs the step as {best}: measured {ms[best]:.1f} ms vs {ms[base]:.1f} ms "
                      f"for aiacc's own (framework_compile=False opts out)", AiaccWarning, stacklevel=3)
        return models[best], TrainChoice(best, ms, "; ".join(reasons + [
            f"measured faster by {ms[base] / ms[best]:.2f}x than aiacc's own step, so aiacc runs it"]))
    others = ", ".join(f"{k} {v:.1f} ms" for k, v in ms.items() if k != base)
    return base_model, TrainChoice(base, ms, "; ".join(reasons + [
        f"the alternatives measured no faster ({others or 'none ran'} vs {ms[base]:.1f} ms)"]))


def attach(model: Any, choice: TrainChoice) -> Any:
    """Record the choice on the model (where it takes attributes) and return the model."""
    for name, value in (("aiacc_train_choice", choice), ("aiacc_train_path", choice.path)):
        try:
            setattr(model, name, value)
        except (AttributeError, TypeError):
            pass
    return model
