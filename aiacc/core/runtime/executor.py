"""The reference executor: runs a graph node by node on the registry's numpy kernels, freeing each value
after its last use (in the spirit of JAX's eval_jaxpr). Subclass `Interpreter` to observe or change how
nodes run (memory planning, debugging, per-pass numerics checks)."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from aiacc.core.ir import Graph, Node, Value
from aiacc.errors import AiaccError, KernelError, ShapeError


def check_inputs(graph: Graph, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Validate feeds against the graph inputs (names, dtypes, shapes, symbols bound consistently)."""
    feeds: dict[str, np.ndarray] = {}
    bound: dict[str, int] = {}
    names = {v.name for v in graph.inputs}
    for extra in inputs:
        if extra not in names:
            raise ShapeError(f"graph {graph.name} has no input named {extra!r} (inputs: {', '.join(sorted(names))})")
    for v in graph.inputs:
        if v.name not in inputs:
            raise ShapeError(f"graph input {v.name!r} was not given")
        a = np.asarray(inputs[v.name])
        if v.type is not None:
            if v.dtype is not None and a.dtype.name != v.dtype:
                raise ShapeError(f"graph input {v.name!r}: expected dtype {v.dtype}, got {a.dtype.name}")
            if v.shape is not None:
                if a.ndim != len(v.shape):
                    raise ShapeError(f"graph input {v.name!r}: expected shape {_fmt(v.shape)} (rank {len(v.shape)}), "
                                     f"got {list(a.shape)}")
                for k, (want, got) in enumerate(zip(v.shape, a.shape)):
                    if isinstance(want, int) and want != got:
                        raise ShapeError(f"graph input {v.name!r}: dimension {k} should be {want}, got {got} "
                                         f"(expected {_fmt(v.shape)}, got {list(a.shape)})")
                    if isinstance(want, str):
                        if bound.setdefault(want, got) != got:
                            raise ShapeError(f"graph input {v.name!r}: dimension {k} ({want}) is {got} here but "
                                             f"{bound[want]} in another input")
        feeds[v.name] = a
    return feeds


def _fmt(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


class Interpreter:
    """Runs a graph on numpy arrays. Override `run_node` to change how one node executes."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.set_schedule(graph.nodes)

    def set_schedule(self, nodes: list[Node]) -> None:
        """Run the nodes in this (topological) order; values are freed after their last use in it."""
        self.nodes = list(nodes)
        # position of the last node that reads each value; graph outputs live to the end
        self.last_use: dict[int, int] = {}
        for pos, node in enumerate(self.nodes):
            for v in node.inputs:
                if v is not None:
                    self.last_use[id(v)] = pos
        for v in self.graph.outputs:
            self.last_use[id(v)] = len(self.nodes)

    def run(self, inputs: Mapping[str, Any], *, validate: bool = True) -> dict[str, np.ndarray]:
        """Execute the graph; returns the outputs by name."""
        feeds = check_inputs(self.graph, inputs) if validate else {k: np.asarray(x) for k, x in inputs.items()}
        env: dict[int, np.ndarray] = {}
        for v in self.graph.inputs:
            env[id(v)] = feeds[v.name]
        for v in self.graph.initializers.values():
            env[id(v)] = v.const
        for pos, node in enumerate(self.nodes):
            args = [None if v is None else env[id(v)] for v in node.inputs]
            results = self.run_node(node, args)
            if len(results) < len(node.outputs):
                raise KernelError(f"node {node.name} ({node.qualified_op}): kernel returned {len(results)} outputs, "
                                  f"the node has {len(node.outputs)}")
            for v, r in zip(node.outputs, results):
                env[id(v)] = r
            self.after_node(node, pos, env)
            for v in node.inputs:
                if v is not None and self.last_use.get(id(v)) == pos and v.const is None:
                    env.pop(id(v), None)
            for v in node.outputs:
                if id(v) not in self.last_use:
                    env.pop(id(v), None)  # nobody reads it
        return {v.name: env[id(v)] for v in self.graph.outputs}

    def after_node(self, node: Node, pos: int, env: dict[int, np.ndarray]) -> None:
        """Hook called after each node runs (before values are freed)."""

    def run_node(self, node: Node, args: list[np.ndarray | None]) -> list[np.ndarray]:
        """Run one node: the registry kernel, else a kernel a plugin attached in node.meta["kernel"]."""
        schema = node.schema
        kernel = node.meta.get("kernel")
        if schema is None and kernel is None:
            raise KernelError(f"no kernel for {node.domain or 'ai.onnx'}::{node.op} at node {node.name}")
        try:
            with np.errstate(all="ignore"):
                if kernel is not None:
                    out = kernel(*args)
                    return [np.asarray(o) for o in out] if isinstance(out, (tuple, list)) else [np.asarray(out)]
                return schema.run(node, args)
        except AiaccError:
            raise
        except Exception as e:
            shapes = ", ".join("_" if a is None else f"{a.dtype.name}{list(a.shape)}" for a in args)
            raise KernelError(f"node {node.name} ({node.qualified_op}) failed on inputs ({shapes}): {e}") from e


def run(graph: Graph, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Run `graph` on numpy inputs with the reference kernels; returns {output name: array}."""
    return Interpreter(graph).run(inputs)


def value_env_size(env: dict[int, np.ndarray]) -> int:
    return sum(a.nbytes for a in env.values())


__all__ = ["Interpreter", "run", "check_inputs", "Value"]
