"""Chains and trees of elementwise ops fused into one aiacc::FusedElementwise (a numba kernel)."""
from __future__ import annotations

import json

from aiacc.core.ir import Node, Value
from aiacc.core.ops.fused import format_statement
from aiacc.core.passes.manager import register_pass
from aiacc.core.passes.rewrite import Op, Opt, RewritePass, Rule
from aiacc.core.runtime.numba_kernels import SCALAR_OPS

FUSIBLE_OPS = tuple(sorted(o for o in SCALAR_OPS if o != "Identity"))
FLOAT = ("float32", "float64")
MAX_GROUP = 64  # a bigger expression compiles slowly and gains nothing more
MAX_INPUTS = 30  # numpy ufuncs take at most 32 operands


def fusible(node: Node) -> str | None:
    """None when the node can join a fused elementwise group, else why not."""
    if node.domain != "" or node.op not in FUSIBLE_OPS:
        return f"{node.qualified_op} has no fused elementwise code"
    if len(node.outputs) != 1:
        return f"{node.name} has {len(node.outputs)} outputs"
    out = node.output
    if out.dtype not in FLOAT or out.shape is None:
        return f"%{out.name} is {out.type}: fused kernels handle float32/float64 of known rank"
    ins = list(node.inputs)
    while ins and ins[-1] is None:
        ins.pop()
    for v in ins:
        if v is None:
            return f"{node.name} omits an input in the middle"
        if v.dtype != out.dtype:
            return f"input %{v.name} of {node.name} is {v.dtype}, not {out.dtype}"
    try:
        json.dumps(node.attrs)
    except TypeError:
        return f"{node.name} has attributes a program cannot hold"
    return None


def _grow(root: Node) -> list[Node]:
    """The group rooted at `root`: producers joined while every reader of theirs is in the group."""
    group = {id(root): root}
    changed = True
    while changed and len(group) < MAX_GROUP:
        changed = False
        for n in list(group.values()):
            for v in n.inputs:
                p = None if v is None else v.producer
                if p is None or id(p) in group or fusible(p) is not None or v.is_graph_output:
                    continue
                if all(id(u) in group for u, _ in v.uses):
                    group[id(p)] = p
                    changed = True
    return _topo(root, group)


def _topo(root: Node, group: dict[int, Node]) -> list[Node]:
    order: list[Node] = []
    seen: set[int] = set()
    stack = [(root, False)]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack.append((n, True))
        for v in reversed(n.inputs):
            p = None if v is None else v.producer
            if p is not None and id(p) in group and id(p) not in seen:
                stack.append((p, False))
    return order


def _check(m):
    root = m.root
    why = fusible(root)
    if why:
        return why
    out = root.output
    users = out.users()
    if users and not out.is_graph_output and all(fusible(u) is None for u in users):
        names = ", ".join(f"{u.qualified_op}<{u.name}>" for u in users)
        return f"deferred: its readers {names} are elementwise and may absorb it"
    group = _grow(root)
    if len(group) < 2:
        return "no elementwise producer to fuse with"
    if len(_external_inputs(group)) > MAX_INPUTS:
        return f"the group reads more than {MAX_INPUTS} values"


def _external_inputs(group: list[Node]) -> list[Value]:
    inside = {id(n) for n in group}
    seen: dict[int, Value] = {}
    for n in group:
        for v in n.inputs:
            if v is not None and (v.producer is None or id(v.producer) not in inside):
                seen.setdefault(id(v), v)
    return list(seen.values())


def _rewrite(m, b):
    group = _grow(m.root)
    inputs: list[Value] = []
    names: dict[int, str] = {}
    stmts = []
    for k, n in enumerate(group):
        args = []
        for v in n.inputs:
            if v is None:
                continue
            if v.producer is not None and any(v.producer is g for g in group):
                args.append(names[id(v)])
                continue
            if id(v) not in names:
                names[id(v)] = f"i{len(inputs)}"
                inputs.append(v)
            args.append(names[id(v)])
        names[id(n.output)] = f"t{k}"
        stmts.append(format_statement(f"t{k}", n.op, args, dict(n.attrs)))
    m.nodes = tuple(group)
    return b.node("FusedElementwise", inputs, {"program": ";".join(stmts)}, domain="aiacc",
                  name=m.root.name).output


RULE = Rule("fuse_elementwise", Op(FUSIBLE_OPS, Opt(), Opt(), Opt(), name="root"), _rewrite, _check,
            doc="A tree of elementwise ops whose inner values are read only inside it is one FusedElementwise.")

LEVEL3_KEY = "elementwise_fusion"  # graph.meta: set when the pass ran (exporters may then fuse more, measured)


class ElementwiseFusionPass(RewritePass):
    """The rule set as a pass that also marks the graph (graph.meta[LEVEL3_KEY] = True): the torch export
    then measures its own level-3 fusions too (plugins/torch/se_gate.py: squeeze-excite's gate in the GEMM)."""

    def run(self, graph, ctx) -> int:
        graph.meta[LEVEL3_KEY] = True
        return super().run(graph, ctx)


register_pass(ElementwiseFusionPass("elementwise_fusion", [RULE], level=3, modes=("inference",), doc="""
Fuse each maximal tree (or DAG) of elementwise ops (arithmetic, activations, Clip, Max/Min...) whose inner
values nothing else reads into one aiacc::FusedElementwise node carrying the expression as a program
attribute; aiacc.core.runtime.numba_kernels compiles the program into one numba loop, a single pass over
memory (the torch export calls it as torch.ops.aiacc.fused_elementwise where it measured faster than the
program's torch ops, see aiacc/plugins/torch/numba_op.py).

Assumes: every op of the group is float32/float64 in and out with one dtype; inner values are read only
inside the group.
Guarantees: the reference kernel evaluates the very same ops in order (identical numerics); the numba
kernel agrees to float rounding. Groups of one node are left alone.
""".strip()))
