"""Activation ops that fused conv/gemm ops can absorb, as (op pattern, attrs) helpers for the rules."""
from __future__ import annotations

import numpy as np

from aiacc.core.ir import Node
from aiacc.core.passes.rewrite import const_value

FUSIBLE_ACTIVATIONS = ("Relu", "LeakyRelu", "Elu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Clip", "Gelu")


def activation_of(node: Node) -> tuple[str, list[float] | None] | str:
    """(activation name, params) for a fused op's attributes, or a string saying why it cannot be fused."""
    op = node.op
    if op == "Clip":
        ins = list(node.inputs) + [None, None]
        params = []
        for v, default in ((ins[1], -np.inf), (ins[2], np.inf)):
            if v is None:
                params.append(default)
                continue
            c = const_value(v)
            if c is None or c.size != 1:
                return f"Clip<{node.name}> bound %{v.name} is not a constant scalar"
            params.append(float(c.reshape(-1)[0]))
        return "Clip", params
    if op == "LeakyRelu":
        return op, [float(node.attr("alpha", 0.01))]
    if op == "Elu":
        return op, [float(node.attr("alpha", 1.0))]
    if op == "HardSigmoid":
        return op, [float(node.attr("alpha", 0.2)), float(node.attr("beta", 0.5))]
    if op == "Gelu":
        return ("GeluTanh" if node.attr("approximate", "none") == "tanh" else "Gelu"), None
    if op in FUSIBLE_ACTIVATIONS:
        return op, None
    return f"{op} is not a fusible activation"


def activation_attrs(node: Node) -> dict:
    act = activation_of(node)
    assert not isinstance(act, str), act
    name, params = act
    return {"activation": name, **({"activation_params": params} if params else {})}


# -- shared by the fusion rules that take an activation into a fused op (conv_fusion, gemm_fusion) ---------
def check_activation_fusion(m, target: str) -> str | None:
    """Why the activation at the match root cannot become the `activation` of the match's node `target`
    (a reason), or None: it must be fusible, and an aiacc fused op must not have an activation yet."""
    act = activation_of(m.root)
    if isinstance(act, str):
        return act
    node = m.node(target)
    if node.domain == "aiacc" and node.attr("activation", ""):
        return f"{node.op}<{node.name}> already has activation {node.attr('activation')}"
    return None


def with_activation(node: Node, act: Node) -> dict:
    """`node`'s attributes with the activation of `act` in place of any activation it had."""
    attrs = {k: v for k, v in node.attrs.items() if k not in ("activation", "activation_params")}
    attrs.update(activation_attrs(act))
    return attrs
