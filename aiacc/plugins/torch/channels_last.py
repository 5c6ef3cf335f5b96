"""mode="train" for PyTorch: aiacc's training graph of a CNN in channels-last memory layout, where it measures
faster.

oneDNN trains a convolution on an NCHW tensor by reordering its input, weight and output into its blocked
layouts on every call, forward and backward; on NHWC (torch.channels_last) tensors it runs without those
reorders (a ResNet-18-layout step: 0.93x the NCHW time eagerly at batch 8, 0.83x at 32, and inductor compiles
the channels-last graph better too). `apply` turns aiacc's own GraphModule (its own parameters, never the
user's) into that form: its convolutions' weights stored channels-last (same shapes and values, so an
optimizer, state_dict and the gradients' shapes are unchanged) and each 4-D floating input made channels-last
at the graph's entry; where the graph has a max pool, only from after the last one (the stem of a ResNet
stays NCHW): another layout's rounding of a max pool's input moves the argmax of near-ties, and with it a
gradient (7e-3 of the stem's BatchNorm bias gradient on resnet_small). `choose` times one training step of the graph both ways (interleaved rounds,
aiacc.plugins.timing) and keeps channels-last only where it is faster by the train choice's margin and its
step's loss and gradients equal the NCHW step's (1e-5 relative, 1e-6 absolute) under two losses: aiacc's step
loss (mean squares) and a vector-Jacobian product with seeded random cotangents summed (a loss of another
scale and direction, as a user's is). Where a parameter's gradient is analytically zero, rounding noise
only (a convolution's or linear layer's bias whose one user is a BatchNorm on batch statistics: the
normalization removes any constant shift), no other order of the arithmetic reproduces it: under a summed
loss its noise moves by more than 1e-5 of the gradient's size (a UNet's pre-BatchNorm conv bias by 2.6e-5
against 1.2e-6, tests/plugins/torch/test_robustness.py), so such a graph stays NCHW and the line names the
parameter. Opt-in: AIACC_TRAIN_CHANNELS_LAST=measure runs that choice, =on forces the layout, unset or =off
keeps NCHW. Unset, the layout is still offered to the train step choice (`offered`: eagerly and under
torch.compile), checked there as the torch.compile candidates are; =off leaves it out there too. Off by default because the layout's reordered float32 sums move BatchNorm weight gradients by
about 1e-5 of their size, at the training parity's edge (resnet_small, the rest of the graph equal to the
original bit for bit: 8.4e-6 elementwise of the largest at batch 8, 1.2e-5 at batch 32 under the mean-square
loss; the random-cotangent check refuses it there). The result is a line for the pass report."""
from __future__ import annotations

import copy
import os
import statistics
from typing import Any, Callable

import torch

from aiacc.plugins.timing import interleaved_times

ENV = "AIACC_TRAIN_CHANNELS_LAST"
_CL = torch.channels_last
# channels-last must be at least this much faster to be kept (timing noise on a shared machine)
MARGIN = 0.97


_CONVS = (torch.conv2d, torch.nn.functional.conv2d)
# ops whose result picks one input element among near-equal ones (a max pool's argmax): another layout's
# rounding of their input can route a gradient to another element, so the graph stays NCHW up to the last one
_DISCRETE = (torch.nn.functional.max_pool2d, torch.max_pool2d, torch.nn.functional.max_pool2d_with_indices,
             torch.nn.functional.adaptive_max_pool2d, torch.nn.functional.adaptive_max_pool2d_with_indices,
             torch.nn.functional.max_pool3d, torch.nn.functional.max_pool1d)


def applies(module: torch.fx.GraphModule, args: tuple) -> bool:
    """Whether the graph has a 2-D convolution (after its last max pool) on a 4-D floating map."""
    return bool(_plan(module, args)[1])


def _is_map(a: Any) -> bool:
    return isinstance(a, torch.Tensor) and a.dim() == 4 and a.is_floating_point()


def _plan(module: torch.fx.GraphModule, args: tuple) -> tuple[list, list]:
    """(nodes whose output is made channels-last, get_attr nodes of the convolutions' weights after them):
    the 4-D floating inputs, or the last max pool's output where the graph has one."""
    nodes = list(module.graph.nodes)
    pools = [i for i, n in enumerate(nodes) if n.op == "call_function" and n.target in _DISCRETE]
    if pools:
        last = nodes[pools[-1]]
        indices = last.args[6] if len(last.args) > 6 else last.kwargs.get("return_indices", False)
        if (last.target is not torch.nn.functional.max_pool2d and last.target is not torch.max_pool2d) \
                or indices is not False:
            return [], []  # its output is a tuple (values, indices) or not 2-D: left NCHW
        start, points = pools[-1], [nodes[pools[-1]]]
    else:
        placeholders = [n for n in nodes if n.op == "placeholder"]
        if len(placeholders) != len(args) or any(str(n.target).startswith("*") for n in placeholders):
            return [], []  # a *args placeholder holds a tuple: the inputs do not map one to one
        start, points = -1, [n for n, a in zip(placeholders, args) if _is_map(a) and n.users]
    weights = [n.args[1] for n in nodes[start + 1:] if n.op == "call_function" and n.target in _CONVS
               and len(n.args) > 1 and isinstance(n.args[1], torch.fx.Node) and n.args[1].op == "get_attr"]
    return (points, weights) if points and weights else ([], [])


def apply(module: torch.fx.GraphModule, args: tuple) -> torch.fx.GraphModule:
    """`module` in place: the weights of the convolutions after the conversion point stored channels-last
    and the point's output (the 4-D floating inputs, as in `args`, or the last max pool's output) made
    channels-last; returns it."""
    points, weights = _plan(module, args)
    with torch.no_grad():
        for node in weights:
            t = module.get_parameter(node.target) if node.target in dict(module.named_parameters()) \
                else module.get_buffer(node.target)
            if not t.is_contiguous(memory_format=_CL):
                t.data = t.data.contiguous(memory_format=_CL)
    graph = module.graph
    for node in points:
        with graph.inserting_after(node):
            cl = graph.call_method("contiguous", (node,), {"memory_format": _CL})
        node.replace_all_uses_with(cl, delete_user_cb=lambda user: user is not cl)
    graph.lint()
    module.recompile()
    return module


_NORMS = (torch.nn.functional.batch_norm, torch.batch_norm)


def offered(module: torch.fx.GraphModule, args: tuple, line: str) -> bool:
    """Whether the train step choice gets channels-last candidates of `module` (aiacc.plugins.torch.training:
    CL_GRAPH, CL_COMPILED): the graph has a convolution to lay out (`applies`), `choose` (whose report line
    is `line`) did not already lay it out, and ENV is not 'off' (unset offers them: they are measured and
    checked as the torch.compile candidates are)."""
    return (os.environ.get(ENV, "").lower() != "off" and not line.startswith("channels_last")
            and applies(module, args))


def zero_gradient_biases(module: torch.fx.GraphModule) -> list[str]:
    """The parameters whose gradient is analytically zero, so pure rounding noise: the bias of a
    convolution or linear layer whose one user is a BatchNorm on batch statistics (training=True)."""
    out = []
    for n in module.graph.nodes:
        if n.op != "call_function" or n.target not in (*_CONVS, torch.nn.functional.linear, torch.conv_transpose2d,
                                                         torch.nn.functional.conv_transpose2d):
            continue
        bias = n.args[2] if len(n.args) > 2 else n.kwargs.get("bias")
        users = list(n.users)
        if not (isinstance(bias, torch.fx.Node) and bias.op == "get_attr" and len(users) == 1):
            continue
        norm = users[0]
        training = norm.args[5] if len(norm.args) > 5 else norm.kwargs.get("training", False)
        if norm.op == "call_function" and norm.target in _NORMS and norm.args[0] is n and training is True:
            out.append(bias.target)
    return out


def choose(module: torch.fx.GraphModule, args: tuple, step_of: Callable[[Any], Callable[[], Any]],
           same: Callable[[Any, Any], str], rounds: int = 5,
           check_of: Callable[[Any], Callable[[], Any]] | None = None,
           same_check: Callable[[Any, Any], str] | None = None) -> str:
    """Lay `module` out channels-last (in place, `apply`) when that measures faster for one training step
    (`step_of(m)()`, side effects undone by the step) and gives the same results (`same(a, b)` is '') on that
    step and on `check_of(m)()` (the same step under another loss: random cotangents; compared by
    `same_check`, else `same`); returns the report's
    line ('' when the graph has no convolution on a 4-D input)."""
    if not applies(module, args):
        return ""
    setting = os.environ.get(ENV, "off").lower()
    if setting == "off":
        return f"kept NCHW ({ENV}=off)"
    if setting == "on":
        apply(module, args)
        return f"channels_last ({ENV}=on)"
    noise = zero_gradient_biases(module)
    if noise:
        return (f"kept NCHW: {noise[0]}" + (f" (and {len(noise) - 1} more)" if len(noise) > 1 else "") +
                " feeds a BatchNorm on batch statistics: its gradient is analytically zero, rounding noise that "
                "another layout's arithmetic cannot keep within 1e-5")
    candidate = apply(copy.deepcopy(module), args)
    steps = {"nchw": step_of(module), "channels_last": step_of(candidate)}
    first = {k: s() for k, s in steps.items()}  # warm-up; oneDNN builds its primitives here
    problem = same(first["nchw"], first["channels_last"])
    if not problem and check_of is not None:
        problem = (same_check or same)(check_of(module)(), check_of(candidate)())
        problem = problem and f"under random cotangents: {problem}"
    if problem:
        return f"kept NCHW: channels_last's step differs ({problem})"
    times = interleaved_times(steps, rounds, warmup=1)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    ratio = ms["channels_last"] / ms["nchw"]
    if ratio < MARGIN:
        apply(module, args)
        return f"channels_last: {ms['channels_last']:.1f} ms against NCHW {ms['nchw']:.1f} ms ({ratio:.2f}x)"
    return f"kept NCHW: channels_last {ms['channels_last']:.1f} ms against {ms['nchw']:.1f} ms ({ratio:.2f}x)"
