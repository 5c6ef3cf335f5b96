"""aiacc::ValueGuard -> a call of the tracer's own check (_fx.value_guard), so the exported module raises
GuardError on a call whose branch condition differs from the example's, and saves / reloads with it."""
from __future__ import annotations

from aiacc.plugins.torch._fx import value_guard
from aiacc.plugins.torch.exporter import LOWERINGS, LNode


@LOWERINGS.register("aiacc::ValueGuard")
def _value_guard(b, n: LNode):
    message = n.attr("message")
    return b.call(value_guard, n.arg(0), bool(n.attr("expected")), n.attr("what") or f"node {n.name}",
                  *((message,) if message else ()))
