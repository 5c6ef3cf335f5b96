"""In-place ReLU and residual adds in aiacc's exported training graph (mode="train").

The exporter writes every op out of place (`torch.relu(x)`, `a + b`), where the user's module often had
`ReLU(inplace=True)` and `out += identity`: in eager training each of those is one more activation-sized
allocation and write. `make_inplace` turns `relu(x)` into `relu_(x)` and `a + b` into `a.add_(b)` where that
is valid under autograd: `x` (`a`) is a fresh tensor (not a view, not a graph input or parameter) made by an
op whose backward does not read its own output (convolutions, batch norm, linear layers, adds), it has no
other user, and `a` already has the sum's shape and dtype. The step is then run once more and compared with
the step before the rewrite; any difference or autograd complaint puts the graph back (noted in the report).
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import fx

from aiacc.errors import first_line

# ops that return a fresh tensor which their backward does not read (it reads inputs and saved statistics)
FRESH = {torch.conv1d, torch.conv2d, torch.conv3d, F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d,
         F.batch_norm, torch.batch_norm, F.layer_norm, torch.layer_norm, F.linear, torch.addmm, torch.matmul,
         torch.add, operator.add, torch.Tensor.add_, torch.Tensor.add}
RELU = {torch.relu, F.relu}
ADD = {torch.add, operator.add}


def _tensor_meta(gm: fx.GraphModule, args: tuple, kwargs: dict) -> dict:
    """{node: (shape, dtype)} of every tensor the graph computes on the example inputs: one forward without
    autograd, with the buffers (BatchNorm statistics, counters) and the RNG put back afterwards."""
    meta: dict = {}

    class Record(fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if isinstance(out, torch.Tensor):
                meta[n] = (tuple(out.shape), out.dtype)
            return out

    placeholders = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    flat = list(args) + [kwargs[p] for p in placeholders[len(args):] if p in kwargs]
    buffers = list(gm.buffers())
    saved = [b.detach().clone() for b in buffers]
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            Record(gm).run(*flat)
    finally:
        with torch.no_grad():
            for b, s in zip(buffers, saved):
                b.copy_(s)
    return meta


def _rewrites(gm: fx.GraphModule, meta: dict) -> list:
    """[(node, new target, new args, new kwargs)] for the relu and add nodes that may run in place."""
    def fresh(x: Any) -> bool:
        return (isinstance(x, fx.Node) and x.op == "call_function" and x.target in FRESH and len(x.users) == 1
                and x in meta)

    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target in RELU and len(n.args) == 1 and not n.kwargs and fresh(n.args[0]):
            out.append((n, torch.relu_, n.args, {}))
        elif n.target in ADD and len(n.args) == 2 and not n.kwargs and n in meta:
            for a, b in (n.args, n.args[::-1]):
                if a is not b and fresh(a) and meta[a] == meta[n] and isinstance(b, (fx.Node, int, float)):
                    out.append((n, torch.Tensor.add_, (a, b), {}))
                    break
    return out


def make_inplace(gm: fx.GraphModule, args: tuple, kwargs: dict, step_of: Callable[[Any], Callable[[], Any]],
                 same: Callable[[list, list], str], to_arrays: Callable[[Any], list]) -> list[str]:
    """Rewrite `gm`'s eligible relu/add nodes to run in place, check that one training step (`step_of(gm)`,
    compared by `same` on `to_arrays` of its results) gives what it gave before, and keep the rewrite only
    then. Returns the report's lines: what was rewritten, or why nothing was."""
    try:
        meta = _tensor_meta(gm, args, kwargs)
    except Exception as e:  # noqa: BLE001 - an op the interpreter cannot run leaves the graph as it is
        return [f"not applied: the graph did not run node by node ({type(e).__name__})"]
    todo = _rewrites(gm, meta)
    if not todo:
        return []
    before = step_of(gm)()
    old = [(n, n.target, n.args, n.kwargs) for n, *_ in todo]
    for n, target, a, kw in todo:
        n.target, n.args, n.kwargs = target, a, kw
    gm.recompile()
    try:
        problem = same(to_arrays(before), to_arrays(step_of(gm)()))
    except RuntimeError as e:  # autograd: a tensor its backward needs was modified in place
        problem = first_line(e, 160)
    if problem:
        for n, target, a, kw in old:
            n.target, n.args, n.kwargs = target, a, kw
        gm.recompile()
        return [f"not applied: the step changed ({problem})"]
    relus = sum(1 for _, t, *_ in todo if t is torch.relu_)
    return [f"{relus} relu -> relu_, {len(todo) - relus} add -> add_ (the inputs' producers do not save them "
            f"for backward; one step checked equal)"]
