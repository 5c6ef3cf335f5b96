"""mode="train" for PyTorch: aiacc's exported fx.GraphModule, or the same module under torch.compile when
that measures faster at optimize time (aiacc.plugins.train_choice). Both share the original's parameters."""
from __future__ import annotations

from typing import Any, Callable

import torch

from aiacc.plugins.train_choice import TrainChoice, attach, choose


def _loss(out: Any) -> torch.Tensor:
    from torch.utils import _pytree as pytree

    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return sum((t.float() ** 2).mean() for t in leaves)


def _step_of(module: torch.nn.Module, args: tuple, kwargs: dict) -> Callable[[], Any]:
    """One forward + backward (gradients through torch.autograd.grad, so no .grad is touched), with the
    buffers (BatchNorm statistics) and the RNG put back afterwards."""
    params = [p for p in module.parameters() if p.requires_grad]

    def step():
        saved = [b.detach().clone() for b in module.buffers()]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            loss = _loss(module(*args, **kwargs))
            grads = torch.autograd.grad(loss, params, allow_unused=True) if params and loss.requires_grad else ()
        with torch.no_grad():
            for b, s in zip(module.buffers(), saved):
                b.copy_(s)
        return loss.detach(), grads
    return step


def choose_train_step(module: torch.nn.Module, example_inputs: Any, setting: Any) -> torch.nn.Module:
    """`module` (aiacc's GraphModule) or torch.compile(module), whichever trains faster on the example
    inputs (framework_compile='auto'), with the choice attached as aiacc_train_choice/aiacc_train_path."""
    from aiacc.plugins.torch.importer import normalize_inputs

    if example_inputs is None:
        if setting is True:
            return attach(_compiled(module), TrainChoice("aiacc graph + torch.compile",
                                                             reason="framework_compile=True"))
        return attach(module, TrainChoice("aiacc graph", reason="no example inputs to measure on"))
    args, kwargs = normalize_inputs(module, example_inputs)
    chosen, choice = choose("aiacc graph", lambda: _compiled(module), lambda m: _step_of(m, args, kwargs),
                            module, setting, "torch.compile", to_arrays=_arrays)
    return attach(chosen, choice)


def _compiled(module: torch.nn.Module) -> torch.nn.Module:
    """torch.compile of the module, with inductor drawing random numbers as eager torch does
    (fallback_random): dropout masks stay the framework's, so the compiled step can be checked against
    aiacc's own and trains the same way."""
    return torch.compile(module, options={"fallback_random": True})


def _arrays(result: Any) -> list:
    loss, grads = result
    return [loss.detach().cpu().numpy()] + [g.detach().cpu().numpy() for g in grads if g is not None]
