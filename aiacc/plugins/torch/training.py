"""mode="train" for PyTorch: aiacc's exported fx.GraphModule (its ReLUs and residual adds in place where
autograd allows, aiacc.plugins.torch.inplace), the same module under torch.compile, or a copy of the
original module run eagerly or under torch.compile, whichever measures fastest at optimize time
(aiacc.plugins.train_choice); a CNN's graph is first laid out channels-last where that measures faster
and its gradients stay within 1e-5 under two losses (aiacc.plugins.torch.channels_last): where torch.compile of the user's own module wins (inductor may compile it
better than aiacc's graph), that is what runs, and aiacc_train_path says so. Each has its own parameters
under the original's names, starting from the original's values."""
from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
import torch

from aiacc.plugins.train_choice import TrainChoice, attach, choose, note, perturb, same_results

# the candidates' names, as aiacc_train_path and the report give them
GRAPH = "aiacc graph"
COMPILED = "aiacc graph + torch.compile"
ORIGINAL = "original module (eager)"
ORIGINAL_COMPILED = "original module + torch.compile"
# aiacc's graph laid out channels-last (aiacc.plugins.torch.channels_last.apply: after the last max pool),
# eagerly and under torch.compile (resnet_small b8: 0.86x of eager compiled channels-last, 0.96x compiled NCHW)
CL_GRAPH = "aiacc graph channels-last"
CL_COMPILED = "aiacc graph channels-last + torch.compile"


def _loss(out: Any) -> torch.Tensor:
    from torch.utils import _pytree as pytree

    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return sum((t.float() ** 2).mean() for t in leaves)


def _vjp_loss(out: Any) -> torch.Tensor:
    """A loss of another scale and direction than _loss: the outputs' sum against seeded standard normal
    cotangents (drawn from their own generator, so the same for every candidate), a vector-Jacobian product."""
    from torch.utils import _pytree as pytree

    g = torch.Generator().manual_seed(1)
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return sum((t.float() * torch.randn(t.shape, generator=g).to(t.device)).sum() for t in leaves)


def _step_of(module: torch.nn.Module, args: tuple, kwargs: dict, loss_of: Callable = _loss) -> Callable[[], Any]:
    """One forward + backward (gradients through torch.autograd.grad, so no .grad is touched), with the
    buffers (BatchNorm statistics) and the RNG put back afterwards; returns (loss, {parameter name:
    gradient}), the names without torch.compile's _orig_mod. prefix, so candidates compare by name."""
    named = [(n.removeprefix("_orig_mod."), p) for n, p in module.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    buffers = list(module.buffers())

    def step():
        saved = [b.detach().clone() for b in buffers]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            loss = loss_of(module(*args, **kwargs))
            grads = torch.autograd.grad(loss, params, allow_unused=True) if params and loss.requires_grad else ()
        with torch.no_grad():
            for b, s in zip(buffers, saved):
                b.copy_(s)
        return loss.detach(), dict(zip([n for n, _ in named], grads))
    return step


def choose_train_step(module: torch.nn.Module, example_inputs: Any, setting: Any,
                      original: torch.nn.Module | None = None) -> torch.nn.Module:
    """`module` (aiacc's GraphModule), torch.compile(module) or a copy of `original` (the user's module, run
    eagerly), whichever trains fastest on the example inputs (framework_compile='auto'), with the choice
    attached as aiacc_train_choice/aiacc_train_path and noted in the pass report (every candidate's time)."""
    from aiacc.plugins.torch.importer import normalize_inputs

    report = getattr(module, "aiacc_report", None)
    more = {} if original is None else {ORIGINAL: lambda: _copy(original, module),
                                        ORIGINAL_COMPILED: lambda: _compiled(_copy(original, module))}
    if example_inputs is None:
        if setting not in ("auto", False):  # True or a candidate's name: nothing to measure
            return attach(*choose(GRAPH, lambda: _compiled(module), None, module, setting, "torch.compile",
                                  more=more))
        return attach(module, TrainChoice(GRAPH, reason="no example inputs to measure on"))
    args, kwargs = normalize_inputs(module, example_inputs)
    if isinstance(module, torch.fx.GraphModule) and getattr(module, "aiacc_memory_plan", None) is None:
        from aiacc.plugins.torch.inplace import make_inplace

        lines = make_inplace(module, args, kwargs, lambda m: _step_of(m, args, kwargs),
                             lambda a, b: same_results(a, b, rtol=1e-6, atol=0.0, grad_rtol=1e-6), _arrays)
        if lines and report is not None:
            report.note("inplace", lines)
        from aiacc.plugins.torch import channels_last

        line = channels_last.choose(module, args, lambda m: _step_of(m, args, kwargs),
                                    lambda a, b: same_results(_arrays(a), _arrays(b), rtol=1e-5, atol=1e-6,
                                                              grad_rtol=1e-5),
                                    check_of=lambda m: _step_of(m, args, kwargs, _vjp_loss),
                                    same_check=_same_elementwise)
        if line and report is not None:
            report.note("channels_last", [line])
        if channels_last.offered(module, args, line):
            # candidates of the measured choice, held to the rule the torch.compile ones are (the loss, and
            # each gradient within GRAD_RTOL of its norm or its rounding-noise floor): the layout only
            # reorders float32 sums, which moves a gradient far less than inductor's fusions do
            def laid_out():
                return channels_last.apply(copy.deepcopy(module), args)
            more = {**more, CL_GRAPH: laid_out, CL_COMPILED: lambda: _compiled(laid_out())}
    noisy = _perturbed(args)  # the gradients' rounding-noise floor (train_choice.noise_floor)
    chosen, choice = choose(GRAPH, lambda: _compiled(module), lambda m: _step_of(m, args, kwargs),
                            module, setting, "torch.compile", to_arrays=_arrays, more=more,
                            perturbed=None if noisy is None else lambda: _step_of(module, noisy, kwargs)())
    note(report, choice)
    return attach(chosen, choice)


def _perturbed(args: tuple) -> tuple | None:
    """The example inputs with each floating tensor scaled by (1 +- 2**-17) elementwise
    (train_choice.perturb), or None when none is floating (nothing to perturb)."""
    if not any(isinstance(a, torch.Tensor) and a.is_floating_point() for a in args):
        return None
    return tuple(_perturbed_tensor(a, k) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                 for k, a in enumerate(args))


def _perturbed_tensor(tensor: torch.Tensor, seed: int) -> torch.Tensor:
    """One floating tensor perturbed (train_choice.perturb) in its own dtype and device; bfloat16 goes
    through float32, which numpy lacks."""
    host = tensor.detach().cpu()
    host = host.float() if host.dtype == torch.bfloat16 else host
    return torch.from_numpy(perturb(host.numpy(), seed)).to(dtype=tensor.dtype, device=tensor.device)


def _same_elementwise(a: Any, b: Any, rtol: float = 1e-5, atol: float = 1e-6) -> str:
    """'' when two steps' gradients ({name: gradient}, the second of each result) agree elementwise: each
    within `rtol` of its largest magnitude plus `atol` (the parity the training tests ask of a gradient),
    else what differs. The loss is not compared: a sum against random cotangents cancels to near zero, so
    its rounding is not relative to its size."""
    for k, (x, y) in enumerate(zip(_arrays(a), _arrays(b))):
        if k == 0:
            continue
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        if x.shape != y.shape:
            return f"result {k} has shape {y.shape} instead of {x.shape}"
        err = float(np.abs(x - y).max()) if x.size else 0.0
        if not err <= rtol * (float(np.abs(x).max()) if x.size else 0.0) + atol:
            return f"gradient of {sorted(a[1])[k - 1]} differs by {err:.2g}"
    return ""


def _copy(original: torch.nn.Module, module: torch.nn.Module) -> torch.nn.Module:
    """The user's module as a candidate: a deep copy (its own parameters and buffers, the original's names
    and values), so training the result leaves the original untouched as every other candidate does; its
    trainable parameters must be named as aiacc's module's (gradients are compared by name)."""
    m = copy.deepcopy(original)
    m.train(original.training)
    mine = {n for n, p in module.named_parameters() if p.requires_grad}
    theirs = {n for n, p in m.named_parameters() if p.requires_grad}
    if mine != theirs:
        raise ValueError(f"its trainable parameters are not those of aiacc's module "
                         f"(only in the original: {sorted(theirs - mine)[:3]}, only in aiacc's: {sorted(mine - theirs)[:3]})")
    return m


def _compiled(module: torch.nn.Module) -> torch.nn.Module:
    """torch.compile of the module, with inductor drawing random numbers as eager torch does
    (fallback_random): dropout masks stay the framework's, so the compiled step can be checked against
    aiacc's own and trains the same way."""
    return torch.compile(module, options={"fallback_random": True})


def _arrays(result: Any) -> list:
    """The loss, then the gradients in parameter-name order (None gradients as zeros), as numpy."""
    loss, grads = result
    return [loss.detach().cpu().numpy()] + [0.0 if grads[n] is None else grads[n].detach().cpu().numpy()
                                            for n in sorted(grads)]
