"""The tracer's value guards (_fx.value_guard: a Python branch on tensor data fixed on the example's value)
as aiacc::ValueGuard nodes, each also listed in graph.meta["torch.value_guards"] (what, expected) for the
report and `aiacc inspect`."""
from __future__ import annotations

from aiacc.core.ops.guard import DOMAIN, OP
from aiacc.plugins.torch._fx import value_guard
from aiacc.plugins.torch.import_ops.common import tensor
from aiacc.plugins.torch.importer import FUNCTIONS


@FUNCTIONS.register(value_guard)
def _value_guard(imp, cond, expected: bool, what: str):
    cond = tensor(cond, "the guarded condition")
    node = imp.graph.add_node(OP, [cond], {"expected": int(bool(expected)), "what": str(what)}, domain=DOMAIN,
                              name=imp.current.name)
    imp.graph.meta.setdefault("torch.value_guards", []).append((str(what), bool(expected)))
    return node.output
