"""The small graph the onnxruntime-backend tests split across sessions: a conv block, an opaque cumsum
(run through node.meta["kernel"] between onnxruntime sessions) and, optionally, a second opaque node."""
from __future__ import annotations

import numpy as np

from aiacc.core import parse


def split_graph_text(second_opaque: bool) -> str:
    """The graph's text; `second_opaque` makes the Mul an opaque custom::Scale (three onnxruntime segments)."""
    mul = "custom::Scale<scale>" if second_opaque else "Mul<mul>"
    return f"""graph g(%x: float32[N,3,8,8], %y: float32[N,8]) {{
  %w: float32[8,3,3,3] = const
  %b: float32[8] = const
  %c: float32[N,8,8,8] = Conv<conv>(%x, %w, %b) {{pads=[1, 1, 1, 1]}}
  %r: float32[N,8,8,8] = Relu<relu>(%c)
  %k: float32[N,8,8,8] = custom::Cumsum<cum>(%r)
  %p: float32[N,8,1,1] = GlobalAveragePool<pool>(%k)
  %f: float32[N,8] = Flatten<flat>(%p) {{axis=1}}
  %m: float32[N,8] = {mul}(%f, %y)
  %o: float32[N,8] = Softmax<soft>(%m) {{axis=-1}}
  return %o, %r
}}
"""


def split_graph(second_opaque: bool = False):
    """The graph with seeded weights and numpy kernels for its opaque nodes."""
    rng = np.random.default_rng(0)
    g = parse(split_graph_text(second_opaque), {"w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
                                                "b": rng.standard_normal(8).astype(np.float32) * 0.1})
    nodes = {n.name: n for n in g}
    nodes["cum"].meta["kernel"] = lambda a: np.cumsum(a, axis=-1).astype(np.float32)
    if second_opaque:
        nodes["scale"].meta["kernel"] = lambda a, s: (a * s, )  # a tuple of outputs is accepted too
    return g


def split_feeds(batch: int = 2, seed: int = 1) -> dict:
    """Random inputs for the graph."""
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, 3, 8, 8)).astype(np.float32),
            "y": rng.standard_normal((batch, 8)).astype(np.float32)}
