"""The translation kit every plugin's importer and exporter uses.

- `OpTable`: the one registry type for op tables (framework op -> IR translation, IR op -> framework
  lowering, runtime kernels...). A table module imports its host and registers into the host's table
  with `@table.register(*keys)`; the host never imports its table modules (the plugin package does).
- `Untranslatable`: raised by a translation that meets a construct it does not cover; the importer rolls
  back what the translation added (`Graph.checkpoint()/rollback()`) and keeps the construct as an opaque
  node (`Graph.add_opaque`).
- `record_source`: stamps node.meta["source"] (the framework layer: a torch module's qualified name or fx
  call, a TF op name, an MXNet symbol node) on the nodes one framework op's translation made, for the view.
- `decompose_fused`: a copy of a graph with aiacc's fused ops rewritten into the standard ops they stand
  for, for a target that cannot run (some of) them.

Imports no deep-learning framework.
"""
from __future__ import annotations

from typing import Any, Callable, Collection, Hashable, Iterator, Union

from aiacc.core.ir import Graph, Node
from aiacc.core.ops.fused import DOMAIN as FUSED_DOMAIN
from aiacc.core.ops.fused import decompose
from aiacc.errors import AiaccError, GraphError

_MISSING = object()


class TableError(AiaccError):
    """An op table is used wrongly: a key registered twice, or a lookup of a key it lacks."""


class Untranslatable(Exception):
    """This construct is not covered by the translation; keep it opaque.

    A control-flow signal between a translation function and its importer, never shown to a user (so not
    an AiaccError: code that reports aiacc errors must not mistake it for one). The message says what is
    not covered; importers record it as the reason the node stayed opaque.
    """


class OpTable:
    """A registry of translation functions keyed by anything hashable: op names, (domain, op) tuples,
    Python types or callables.

        FUNCTIONS = OpTable("torch functions")

        @FUNCTIONS.register(torch.relu, F.relu)
        def _relu(imp, x): ...

    Registering a key twice is an error (naming the table and the key) unless `replace=True`.
    """

    def __init__(self, name: str):
        self.name = name
        self._entries: dict[Hashable, Any] = {}

    def register(self, *keys: Hashable, replace: bool = False) -> Callable[[Callable], Callable]:
        """Decorator: register the function under each of `keys`; returns the function unchanged."""
        if not keys:
            raise TableError(f"op table {self.name!r}: register() needs at least one key")

        def wrap(fn: Callable) -> Callable:
            for key in keys:
                self.add(key, fn, replace=replace)
            return fn
        return wrap

    def add(self, key: Hashable, fn: Any, *, replace: bool = False) -> None:
        """Register `fn` under `key` (an error if the key is taken, unless `replace`)."""
        if not replace and key in self._entries:
            raise TableError(f"op table {self.name!r}: {_describe(key)} is registered twice "
                             f"(pass replace=True to override)")
        self._entries[key] = fn

    def update(self, entries: "dict[Hashable, Any] | OpTable", *, replace: bool = False) -> None:
        """Register every (key, function) of a mapping."""
        for key, fn in entries.items():
            self.add(key, fn, replace=replace)

    def __setitem__(self, key: Hashable, fn: Any) -> None:
        self.add(key, fn)

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The function registered under `key`, else `default`. Unhashable keys are simply absent."""
        try:
            return self._entries.get(key, default)
        except TypeError:
            return default

    def __getitem__(self, key: Hashable) -> Any:
        fn = self.get(key, _MISSING)
        if fn is _MISSING:
            raise KeyError(f"op table {self.name!r} has no entry for {_describe(key)}")
        return fn

    def __contains__(self, key: Hashable) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._entries)

    def keys(self):
        return self._entries.keys()

    def values(self):
        return self._entries.values()

    def items(self):
        return self._entries.items()

    def __repr__(self) -> str:
        return f"<OpTable {self.name!r}: {len(self)} entries>"


def record_source(graph: Graph, token: Any, source: str) -> None:
    """Record `source` (the framework layer) in meta["source"] of every node added since `token`
    (Graph.checkpoint()) that has none yet; the rewrite engine carries it to the fused nodes
    (meta["sources"], see aiacc.core.passes.rewrite.sources_of)."""
    for n in graph.nodes_since(token):
        n.meta.setdefault("source", source)


def _describe(key: Any) -> str:
    if isinstance(key, type):
        return f"{key.__module__}.{key.__qualname__}"
    name = getattr(key, "__qualname__", None) or getattr(key, "__name__", None)
    if callable(key) and name:
        module = getattr(key, "__module__", None)
        return f"{module}.{name}" if module else name
    return repr(key)


Keep = Union[None, Collection[str], Callable[[Node], bool]]


def decompose_fused(graph: Graph, keep: Keep = None) -> tuple[Graph, int]:
    """A copy of `graph` with every fused op (domain "aiacc") rewritten into the standard ops it stands
    for, except those `keep` accepts: a collection of op names, or a predicate on the node (e.g. "the
    target has its own lowering for it"). A fused op without a decomposition stays as it is (the caller's
    exporter names it if it cannot handle it). Returns (graph, number decomposed); the graph itself,
    uncopied, when there is nothing to decompose.
    """
    accept = _keep_predicate(keep)
    if not any(n.domain == FUSED_DOMAIN and not accept(n) for n in graph):
        return graph, 0
    g = graph.copy()
    count = 0
    for node in g.nodes:
        if node.domain != FUSED_DOMAIN or accept(node):
            continue
        mark = g.checkpoint()
        try:
            decompose(node, g)
        except AiaccError:
            g.rollback(mark)  # no decomposition (or not for this form): the fused node stays
            continue
        count += 1
    return g, count


def _keep_predicate(keep: Keep) -> Callable[[Node], bool]:
    if keep is None:
        return lambda node: False
    if callable(keep):
        return keep
    if isinstance(keep, str):
        raise GraphError(f"decompose_fused: keep= takes a collection of op names, not the string {keep!r}")
    names = frozenset(keep)
    return lambda node: node.op in names
