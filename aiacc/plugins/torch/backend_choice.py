"""backend="auto" for torch inference: the optimized graph is exported natively (an fx.GraphModule) and to
onnxruntime (when it is installed), both are checked against the original on the example inputs, and the
one that runs the example faster (measured at optimize time, interleaved rounds) is handed back.

Native is the reference: onnxruntime is chosen only when it is at least MARGIN faster, its outputs equal the
original's within the plugin's tolerance (as verify checks), and it takes the same batch sizes as the native
result (a native module that runs at other sizes is not swapped for one specialized to the example's).
The choice is said with an AiaccNotice (not a fallback: strict=True accepts it), noted in the pass report
("backend" notes) and attached as `aiacc_backend` (the backend's name) and `aiacc_backend_choice`
(`BackendChoice`: every candidate's median ms and why). An explicit backend= never measures.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn

from aiacc.core.compare import compare_outputs
from aiacc.errors import AiaccNotice, describe
from aiacc.plugins.timing import interleaved_medians

# onnxruntime must be this much faster than native to be chosen (timing noise on a shared machine)
MARGIN = 0.97
# rounds measured; more (up to MAX_ROUNDS, MAX_SECONDS of measuring) while the two are within AMBIGUOUS
ROUNDS, MAX_ROUNDS, MAX_SECONDS, AMBIGUOUS = 5, 11, 10.0, 0.06


@dataclass
class BackendChoice:
    """Which backend backend='auto' chose and why."""

    backend: str  # "native" or "onnxruntime"
    ms: dict[str, float] = field(default_factory=dict)  # median milliseconds per candidate measured
    reason: str = ""

    def summary(self) -> str:
        """One line: the backend, why, and each candidate's median time."""
        times = ", ".join(f"{k} {v:.2f} ms" for k, v in self.ms.items())
        return f"backend='auto' chose {self.backend}: {self.reason}" + (f" ({times})" if times else "")


def measure(steps: dict[str, Callable[[], Any]], rounds: int = ROUNDS, warmup: int = 2) -> dict[str, float]:
    """Median milliseconds per call of each step (timing.interleaved_medians with this module's limits)."""
    return interleaved_medians(steps, rounds, warmup, MAX_ROUNDS, MAX_SECONDS, AMBIGUOUS)


def choose_backend(plugin: Any, model: Any, native: Any, make_ort: Callable[[], Any], example_inputs: Any,
                   report: Any = None) -> tuple[Any, BackendChoice]:
    """(module, BackendChoice): `native` (the verified native result) or the onnxruntime module
    `make_ort()` builds (in a ShapeDispatch), whichever runs `example_inputs` faster (see the module
    docstring); `plugin` runs the models (run_named) and gives the tolerance. `report` (the pass report, or
    None) gets the choice as a note."""
    try:
        ort = make_ort()
        expected, names = plugin.run_named(model, example_inputs)
        got, new_names = plugin.run_named(ort, example_inputs)
        problem = compare_outputs(expected, got, plugin.rtol, plugin.atol)
        if names is not None and new_names != names:
            problem = "its outputs are named differently"
        if problem:
            raise ValueError(f"its outputs differ from the original's ({problem})")
    except Exception as e:  # noqa: BLE001 - onnxruntime missing, refusing the graph or differing: native
        choice = BackendChoice("native", reason=f"onnxruntime was not used ({describe(e, 200)})")
        return _said(native, choice, report)
    ms = measure({"native": _step(native, example_inputs), "onnxruntime": _step(ort, example_inputs)})
    if ms["onnxruntime"] <= ms["native"] * MARGIN:
        choice = BackendChoice("onnxruntime", ms, f"{ms['native'] / ms['onnxruntime']:.2f}x faster than native "
                                                  f"on the example")
        return _said(ShapeDispatch(ort, native, example_inputs), choice, report)
    return _said(native, BackendChoice("native", ms, f"onnxruntime not at least {1 / MARGIN:.2f}x faster "
                                                     f"on the example"), report)


class ShapeDispatch(nn.Module):
    """The onnxruntime module for calls whose tensors have the example's shapes and dtypes (its session was built for
    them), the native module for any other call, so backend='auto' takes every input the native result
    takes (other batch sizes, other lengths where native runs them; a guarded native refuses as before)."""

    def __init__(self, ort: Any, native: Any, example_inputs: Any):
        super().__init__()
        self.ort, self.native = ort, native
        self.shapes = _shapes(example_inputs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """onnxruntime when every tensor argument has the example's shape and dtype, native otherwise."""
        if _shapes(kwargs if not args else (args, kwargs) if kwargs else args) == self.shapes:
            return self.ort(*args, **kwargs)
        return self.native(*args, **kwargs)


def _shapes(inputs: Any) -> list:
    """The shapes of the tensors in a call's arguments, in order (a lone tensor is a one-argument call)."""
    import torch
    from torch.utils import _pytree as pytree

    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if isinstance(inputs, list):
        inputs = tuple(inputs)
    return [(tuple(t.shape), t.dtype) for t in pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor)]


def _step(module: Any, example_inputs: Any) -> Callable[[], Any]:
    """A no-argument call of `module` on the example inputs (positional or keywords) under no_grad."""
    import torch

    from aiacc.plugins.torch.importer import normalize_inputs

    args, kwargs = normalize_inputs(module, example_inputs)

    def step():
        with torch.no_grad():
            return module(*args, **kwargs)
    return step


def _said(module: Any, choice: BackendChoice, report: Any) -> tuple[Any, BackendChoice]:
    """Attach the choice to the module and the report, and say it (AiaccNotice)."""
    object.__setattr__(module, "aiacc_backend", choice.backend)  # plain attributes, not submodules
    object.__setattr__(module, "aiacc_backend_choice", choice)
    if report is not None:
        report.note("backend", [choice.summary()])
    warnings.warn(f"aiacc: {choice.summary()}", AiaccNotice, stacklevel=4)
    return module, choice
