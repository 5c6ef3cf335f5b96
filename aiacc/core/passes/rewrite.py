"""The rewrite-rule engine: a rule is a pattern, a check that can fail with a reason, and a rewrite.

A pattern is a small DAG of op patterns whose leaves capture values:

    pat = Op("Relu", Op("Conv", Var("x"), Const("w"), Opt("b"), name="conv"), name="act")

- `Var("x")` matches any value and binds it; a name used twice must bind the same value (so
  `Op("Mul", Var("x"), Op("Erf", Op("Div", Var("x"), Scalar(1.4142))))` needs the same x both times).
- `Const("w")` matches a constant (initializer or Constant node) and binds it; `Scalar(v)` matches a constant
  whose every element equals v (within a tolerance); `Scalar(name="eps")` binds any one-element constant.
- `Opt("b")` matches an omitted optional input (binding None) or any value.
- `Op(op, *inputs, name=, domain=, attrs={...}, shared=False, commute=None)` matches a node of that op
  (a tuple of op names matches any of them) with matching inputs; `attrs` requires attribute values
  (schema defaults count). Add, Mul, Max, Min and Sum are matched in both input orders. Unless
  `shared=True`, the outputs of every matched node other than the root must be read only by other
  matched nodes (the usual fusion constraint), so the rewrite can drop them.

A `Rule(name, pattern, rewrite, check=None, modes=...)`: `check(m)` returns None/True to go ahead or a string saying
why not; `rewrite(m, b)` builds replacement nodes with the builder `b` (inserted before the root) and
returns the value(s) that replace the root's outputs. The engine then erases the matched nodes left
unused and gives each replacement value the name of the value it replaced (graph outputs keep their
names). `rule.explain(graph, node)` returns why the rule does not fire at a node, for tests and debugging.
`modes` (default both) names the modes the rule runs in when its rule set runs as a pass.

A `RuleSet` is a list of rules (`a + b` composes two) that runs as an ordinary pass, to a fixed point,
visiting nodes from the outputs back (so the longest match wins over a match inside it).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import numpy as np

from aiacc.core.ir import Graph, Node, TensorType, Value, const_value  # noqa: F401  (const_value re-exported)
from aiacc.core.passes.manager import Pass, PassContext, MODES
from aiacc.errors import AiaccError

MAX_CANDIDATES = 16  # structural matches tried per pattern and node before giving up
COMMUTATIVE = {"Add", "Mul", "Max", "Min", "Sum", "And", "Or", "Xor", "Equal"}


# ------------------------------------------------------------------------------------------------
# patterns
# ------------------------------------------------------------------------------------------------
class _Fail(Exception):
    """A pattern mismatch with its reason and how deep in the pattern it happened."""

    def __init__(self, reason: str, depth: int):
        super().__init__(reason)
        self.reason, self.depth = reason, depth


class Pattern:
    """Base of the pattern language. `_match` yields every binding dict under which `value` matches."""

    def _match(self, value: Value | None, b: dict, st: "_State", depth: int) -> Iterator[dict]:
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__


def _bind(name: str | None, value: Any, b: dict, st: "_State", depth: int, what: str) -> dict | None:
    if name is None:
        return b
    if name in b:
        if b[name] is not value:
            st.fail(f"{what} %{getattr(value, 'name', value)} is not the same value as {name} "
                    f"(%{getattr(b[name], 'name', b[name])})", depth, b)
            return None
        return b
    nb = dict(b)
    nb[name] = value
    return nb


class Var(Pattern):
    """Any (present) value, bound to `name`."""

    def __init__(self, name: str | None = None, where: Callable[[Value], bool | str] | None = None):
        self.name, self.where = name, where

    def _match(self, value, b, st, depth):
        if value is None:
            st.fail(f"input {self.name or ''} is missing", depth, b)
            return
        if self.where is not None:
            ok = self.where(value)
            if ok is not True and ok is not None:
                st.fail(ok if isinstance(ok, str) else f"%{value.name} fails the condition on {self.name}", depth, b)
                return
        nb = _bind(self.name, value, b, st, depth, "value")
        if nb is not None:
            yield nb

    def describe(self):
        return f"Var({self.name})"


class Opt(Var):
    """An optional input: an omitted one (bound to None) or any value."""

    def _match(self, value, b, st, depth):
        if value is None:
            yield b if self.name is None or self.name in b else {**b, self.name: None}
            return
        yield from super()._match(value, b, st, depth)


class Const(Pattern):
    """A value known at compile time, bound to `name` (m.const(name) gives the array)."""

    def __init__(self, name: str | None = None, where: Callable[[np.ndarray], bool | str] | None = None):
        self.name, self.where = name, where

    def _match(self, value, b, st, depth):
        if value is None:
            st.fail(f"constant {self.name or ''} is missing", depth, b)
            return
        c = const_value(value)
        if c is None:
            st.fail(f"%{value.name} is not a constant", depth, b)
            return
        if self.where is not None:
            ok = self.where(c)
            if ok is not True and ok is not None:
                st.fail(ok if isinstance(ok, str) else f"constant %{value.name} fails the condition on {self.name}",
                        depth, b)
                return
        nb = _bind(self.name, value, b, st, depth, "constant")
        if nb is not None:
            yield nb

    def describe(self):
        return f"Const({self.name})"


class Scalar(Const):
    """A constant with one element (any shape of size 1, or every element equal when `value` is given)
    equal to `value` within rtol; with value=None any one-element constant matches."""

    def __init__(self, value: float | None = None, name: str | None = None, rtol: float = 1e-3):
        super().__init__(name)
        self.value, self.rtol = value, rtol

    def _match(self, value, b, st, depth):
        if value is None:
            st.fail("scalar constant is missing", depth, b)
            return
        c = const_value(value)
        if c is None:
            st.fail(f"%{value.name} is not a constant", depth, b)
            return
        if c.size == 0 or c.dtype.kind not in "fiu":
            st.fail(f"constant %{value.name} is not a number", depth, b)
            return
        flat = c.reshape(-1).astype(np.float64)
        if self.value is None:
            if c.size != 1:
                st.fail(f"constant %{value.name} has {c.size} elements, not 1", depth, b)
                return
        elif not np.allclose(flat, self.value, rtol=self.rtol, atol=0):
            st.fail(f"constant %{value.name} is {flat[0] if c.size == 1 else flat.tolist()[:4]}, "
                    f"not {self.value}", depth, b)
            return
        nb = _bind(self.name, value, b, st, depth, "constant")
        if nb is not None:
            yield nb

    def describe(self):
        return f"Scalar({self.value})"


class Op(Pattern):
    """A node of op `op` (or any op of a tuple) whose inputs match the input patterns."""

    def __init__(self, op: str | Sequence[str], *inputs: Pattern | float | int, name: str | None = None,
                 domain: str = "", attrs: dict[str, Any] | None = None, shared: bool = False,
                 commute: bool | None = None, where: Callable[[Node], bool | str] | None = None,
                 output: int = 0):
        self.ops = (op,) if isinstance(op, str) else tuple(op)
        self.inputs = [Scalar(x) if isinstance(x, (int, float)) else x for x in inputs]
        self.name, self.domain, self.attrs = name, domain, dict(attrs or {})
        self.shared = shared
        self.commute = commute
        self.where = where
        self.output = output

    def describe(self):
        return "|".join(self.ops)

    def _match(self, value, b, st, depth):
        if value is None:
            st.fail(f"expected {self.describe()}, found an omitted input", depth, b)
            return
        node = value.producer
        if node is None:
            kind = "a constant" if value.const is not None else "a graph input"
            st.fail(f"expected {self.describe()} to produce %{value.name}, it is {kind}", depth, b)
            return
        if node.op not in self.ops or node.domain != self.domain:
            st.fail(f"expected {self.describe()} to produce %{value.name}, found {node.qualified_op}<{node.name}>",
                    depth, b)
            return
        if value.index != self.output:
            st.fail(f"%{value.name} is output {value.index} of {node.name}, not output {self.output}", depth, b)
            return
        for k, want in self.attrs.items():
            got = node.attr(k)
            if got != want and not (isinstance(want, (list, tuple)) and list(got or []) == list(want)):
                st.fail(f"{node.qualified_op}<{node.name}> has {k}={got!r}, the pattern needs {want!r}", depth, b)
                return
        if self.where is not None:
            ok = self.where(node)
            if ok is not True and ok is not None:
                st.fail(ok if isinstance(ok, str) else f"{node.name} fails the pattern's condition", depth, b)
                return
        ins = list(node.inputs)
        while ins and ins[-1] is None:
            ins.pop()
        if len(ins) > len(self.inputs):
            st.fail(f"{node.qualified_op}<{node.name}> has {len(ins)} inputs, the pattern {len(self.inputs)}",
                    depth, b)
            return
        ins += [None] * (len(self.inputs) - len(ins))
        nb = _bind(self.name, value, b, st, depth, "node output")
        if nb is None:
            return
        nb = dict(nb)
        nb.setdefault("__nodes__", ())
        if all(n is not node for n in nb["__nodes__"]):
            nb["__nodes__"] = nb["__nodes__"] + (node,)
        orders = [ins]
        commute = self.commute if self.commute is not None else (node.op in COMMUTATIVE and len(ins) == 2)
        if commute and len(ins) == 2:
            orders.append([ins[1], ins[0]])
        for order in orders:
            yield from self._match_inputs(order, 0, nb, st, depth + 1)

    def _match_inputs(self, ins, i, b, st, depth):
        if i == len(self.inputs):
            yield b
            return
        for nb in self.inputs[i]._match(ins[i], b, st, depth):
            yield from self._match_inputs(ins, i + 1, nb, st, depth)


class _State:
    def __init__(self):
        self.best: _Fail | None = None

    def fail(self, reason: str, depth: int, b: dict) -> None:
        # the most informative failure is the one reached after matching the most of the pattern
        score = (len(b) + len(b.get("__nodes__", ())), depth)
        if self.best is None or score > self.best.depth:
            self.best = _Fail(reason, score)


# ------------------------------------------------------------------------------------------------
# matches and rules
# ------------------------------------------------------------------------------------------------
class Match:
    """A successful match: captured values by name, matched nodes, the root node."""

    def __init__(self, graph: Graph, root: Node, bindings: dict, rule: "Rule"):
        self.graph = graph
        self.root = root
        self.rule = rule
        self.nodes: tuple[Node, ...] = bindings.get("__nodes__", ())
        self._b = {k: v for k, v in bindings.items() if k != "__nodes__"}

    def __getitem__(self, name: str) -> Value | None:
        return self._b[name]

    def __contains__(self, name: str) -> bool:
        return name in self._b and self._b[name] is not None

    def get(self, name: str) -> Value | None:
        return self._b.get(name)

    def node(self, name: str) -> Node:
        """The node producing the value bound to `name` (an Op pattern's name)."""
        return self._b[name].producer

    def const(self, name: str) -> np.ndarray | None:
        return const_value(self._b.get(name))

    def scalar(self, name: str) -> float:
        return float(np.asarray(self.const(name)).reshape(-1)[0])

    @property
    def bindings(self) -> dict[str, Value | None]:
        return dict(self._b)


class Builder:
    """Creates the replacement nodes of a rewrite, right before the match's root node."""

    def __init__(self, graph: Graph, anchor: Node, name_hint: str):
        self.graph, self.anchor, self.hint = graph, anchor, name_hint
        self.created: list[Node] = []

    def node(self, op: str, inputs: Sequence[Value | None], attrs: dict | None = None, *, domain: str = "",
             name: str | None = None, outputs: int = 1, output_types: Sequence[TensorType | None] | None = None
             ) -> Node:
        n = self.graph.add_node(op, inputs, attrs or {}, domain=domain, name=name or self.hint, outputs=outputs,
                                output_types=output_types, before=self.anchor)
        self.created.append(n)
        return n

    def op(self, op: str, *inputs: Value | None, domain: str = "", name: str | None = None, **attrs) -> Value:
        return self.node(op, inputs, attrs, domain=domain, name=name).output

    def const(self, array: np.ndarray, name: str | None = None) -> Value:
        """A new initializer holding `array`."""
        return self.graph.add_initializer(self.graph.fresh_name(name or f"{self.hint}_c"), np.asarray(array))


Check = Callable[[Match], "bool | str | None"]
Rewrite = Callable[[Match, Builder], "Value | Sequence[Value] | None"]


class Rule:
    """pattern + check + rewrite. `patterns` may be one pattern or a list of alternatives (first match wins)."""

    def __init__(self, name: str, pattern: Op | Sequence[Op], rewrite: Rewrite, check: Check | None = None,
                 doc: str = "", modes: Sequence[str] = MODES):
        self.name = name
        self.modes = tuple(modes)  # a rule set run in another mode skips this rule
        self.patterns: list[Op] = [pattern] if isinstance(pattern, Op) else list(pattern)
        self.rewrite_fn = rewrite
        self.check_fn = check
        self.doc = doc or (rewrite.__doc__ or "")
        self.root_ops = {o for p in self.patterns for o in p.ops}

    def __repr__(self) -> str:
        return f"<Rule {self.name}>"

    # -- matching ----------------------------------------------------------------------------------
    def try_match(self, graph: Graph, node: Node) -> tuple[Match | None, str]:
        """(match, "") or (None, the reason the rule does not fire at `node`)."""
        reasons = []
        for pat in self.patterns:
            if node.op not in pat.ops or node.domain != pat.domain:
                reasons.append(f"{node.qualified_op}<{node.name}> is not {pat.describe()}")
                continue
            st = _State()
            first_why = None
            tried = 0
            # every structural match is a candidate (a commuted Add may match both ways and only one of
            # them pass the checks); the first one's failure is the one reported
            for b in pat._match(node.outputs[pat.output], {}, st, 0):
                tried += 1
                m = Match(graph, node, b, self)
                why = _private_outputs(m, pat)
                if why is None:
                    why = self._check(m)
                if why is None:
                    return m, ""
                if first_why is None:
                    first_why = why
                if tried >= MAX_CANDIDATES:
                    break
            if first_why is not None:
                reasons.append(first_why)
            else:
                reasons.append(st.best.reason if st.best else "no match")
        return None, "; ".join(dict.fromkeys(reasons))

    def _check(self, m: Match) -> str | None:
        if self.check_fn is None:
            return None
        try:
            ok = self.check_fn(m)
        except RuleFailure as e:
            return str(e)
        if ok is None or ok is True:
            return None
        return ok if isinstance(ok, str) else f"the check of rule {self.name} failed"

    def explain(self, graph: Graph, node: Node | str) -> str | None:
        """None when the rule would fire at `node` (a node or its name), else the reason it does not."""
        if isinstance(node, str):
            found = [n for n in graph if n.name == node]
            if not found:
                raise AiaccError(f"graph {graph.name} has no node named {node!r}")
            node = found[0]
        m, why = self.try_match(graph, node)
        return None if m is not None else why

    # -- rewriting ---------------------------------------------------------------------------------
    def apply(self, m: Match) -> bool:
        """Run the rewrite for a match; True when the graph changed."""
        g = m.graph
        b = Builder(g, m.root, m.root.name)
        try:
            result = self.rewrite_fn(m, b)
        except RuleFailure:
            for n in reversed(b.created):
                g.erase(n)
            return False
        if result is None:
            return bool(b.created)
        new = [result] if isinstance(result, Value) else list(result)
        old = list(m.root.outputs)
        if len(new) > len(old):
            raise AiaccError(f"rule {self.name}: rewrite returned {len(new)} values for {len(old)} outputs")
        renames = []
        for o, n in zip(old, new):
            if n is None or n is o:
                continue
            created = n.producer is not None and any(n.producer is c for c in b.created)
            if o.is_graph_output and not created and (n.producer is None or n.is_graph_output):
                # a graph input, constant or other output cannot take this output's name: keep a copy
                n = b.op("Identity", n)
                created = True
            # the replacement takes the old name when it is new, or when it carries a graph output now and
            # its own name was internal; a graph input, constant or other graph output keeps its name
            if created or (o.is_graph_output and n.producer is not None and not n.is_graph_output):
                renames.append((n, o.name))
            o.replace_all_uses_with(n)
        _erase_unused(g, m.nodes)
        for n, name in renames:
            if not g.has_value(name):
                n.name = name  # the replacement takes the old name: graph outputs keep theirs
        _record_provenance(self.name, m.nodes, b.created)
        return True


def _record_provenance(rule: str, matched: Sequence[Node], created: Sequence[Node]) -> None:
    """Provenance for `aiacc view`: each new node's meta["replaced"] names the original nodes the rewrite
    erased (through earlier rewrites: a node that replaced others stands for them), meta["rule"] the rule
    and meta["sources"] the framework layers of the erased nodes (`sources_of`)."""
    replaced: list[str] = []
    sources: list[str] = []
    for n in matched:
        if n.erased:
            replaced.extend(n.meta.get("replaced") or (n.name,))
            sources.extend(sources_of(n))
    if not replaced:
        return
    for n in created:
        if not n.erased:
            n.meta["replaced"] = list(dict.fromkeys(replaced))
            n.meta["rule"] = rule
            if sources:
                n.meta["sources"] = list(dict.fromkeys(sources + sources_of(n)))


# meta keys under which importers record the framework layer a node came from (Caffe: its layer name)
_SOURCE_KEYS = ("source", "caffe_layer")


def sources_of(node: Node) -> list[str]:
    """The framework layers `node` stands for: a fused node's meta["sources"] (the layers of every node it
    replaced), else the one its importer recorded; [] when none was."""
    if node.meta.get("sources"):
        return list(node.meta["sources"])
    for key in _SOURCE_KEYS:
        v = node.meta.get(key)
        if isinstance(v, str) and v:
            return [v]
    return []


class RuleFailure(AiaccError):
    """Raised inside a check or a rewrite to give up on a match with a reason."""


def _private_outputs(m: Match, pat: Op) -> str | None:
    """The default fusion constraint: outputs of matched non-root nodes are read only inside the match."""
    shared_ok = _shared_nodes(pat, m)
    inside = {id(n) for n in m.nodes}
    for n in m.nodes:
        if n is m.root or id(n) in shared_ok:
            continue
        for v in n.outputs:
            if v.is_graph_output:
                return f"%{v.name} ({n.qualified_op}<{n.name}>) is a graph output, so it must stay"
            for user, _ in v.uses:
                if id(user) not in inside:
                    return (f"%{v.name} ({n.qualified_op}<{n.name}>) is also used by {user.qualified_op}<{user.name}> "
                            f"outside the pattern")
    return None


def _shared_nodes(pat: Pattern, m: Match) -> set[int]:
    out: set[int] = set()

    def walk(p):
        if isinstance(p, Op):
            if p.shared and p.name is not None and m.get(p.name) is not None:
                out.add(id(m[p.name].producer))
            for q in p.inputs:
                walk(q)

    walk(pat)
    return out


def _erase_unused(graph: Graph, nodes: Sequence[Node]) -> None:
    """Erase matched nodes nobody reads any more; repeat since erasing one frees its producers."""
    pending = [n for n in nodes if not n.erased]
    changed = True
    while changed:
        changed = False
        for n in list(pending):
            if n.erased:
                pending.remove(n)
                continue
            if all(not v.uses and not v.is_graph_output for v in n.outputs):
                graph.erase(n)
                pending.remove(n)
                changed = True


# ------------------------------------------------------------------------------------------------
# rule sets as passes
# ------------------------------------------------------------------------------------------------
class RuleSet:
    """An ordered collection of rules; `a + b` composes. `run(graph)` applies them to a fixed point."""

    def __init__(self, rules: Sequence[Rule] = (), max_iterations: int = 50):
        self.rules = list(rules)
        self.max_iterations = max_iterations

    def __add__(self, other: "RuleSet | Sequence[Rule]") -> "RuleSet":
        rules = other.rules if isinstance(other, RuleSet) else list(other)
        return RuleSet(self.rules + rules, max(self.max_iterations, getattr(other, "max_iterations", 0)))

    def __iter__(self):
        return iter(self.rules)

    def __getitem__(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(name)

    def run(self, graph: Graph, ctx: PassContext | None = None) -> int:
        """Apply rules until none fires; returns the number of rewrites."""
        by_op: dict[str, list[Rule]] = {}
        for r in self.rules:
            if ctx is not None and ctx.mode not in r.modes:
                continue
            for o in r.root_ops:
                by_op.setdefault(o, []).append(r)
        total = 0
        for _ in range(self.max_iterations):
            changed = 0
            # consumers first: a rule rooted at the last op of a chain sees the longest match before a
            # rule rooted inside the chain can take part of it
            for node in reversed(graph.nodes):
                if node.erased:
                    continue
                for r in by_op.get(node.op, ()):
                    if node.erased:
                        break
                    m, _ = r.try_match(graph, node)
                    if m is not None and r.apply(m):
                        changed += 1
                        if ctx is not None:
                            ctx.count(f"rule:{r.name}")
                        break
            total += changed
            if not changed:
                break
        return total

    def explain(self, graph: Graph, node: Node | str) -> dict[str, str | None]:
        """{rule name: None if it would fire at `node`, else why not} for the rules rooted at its op."""
        if isinstance(node, str):
            node = next((n for n in graph if n.name == node), None) or _no_node(graph, node)
        return {r.name: r.explain(graph, node) for r in self.rules if node.op in r.root_ops}


def _no_node(graph: Graph, name: str):
    raise AiaccError(f"graph {graph.name} has no node named {name!r}")


class RewritePass(Pass):
    """A rule set run as a pass, to a fixed point."""

    def __init__(self, name: str, rules: RuleSet | Sequence[Rule], level: int = 2,
                 modes: tuple[str, ...] = MODES, doc: str = ""):
        self.name, self.level, self.modes = name, level, tuple(modes)
        self.rules = rules if isinstance(rules, RuleSet) else RuleSet(rules)
        self._doc = doc

    @property
    def doc(self) -> str:
        return self._doc or (type(self).__doc__ or "").strip()

    def run(self, graph: Graph, ctx: PassContext) -> int:
        n = self.rules.run(graph, ctx)
        if n:
            graph.remove_unused_initializers()  # constants the rewrites replaced (e.g. unfolded weights)
        return n
