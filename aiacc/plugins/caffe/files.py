"""Caffe files for the `aiacc` command: NAME.prototxt with NAME.caffemodel beside it (or `weights=`).

    graph = load_graph("deploy.prototxt")                      # weights from deploy.caffemodel if present
    optimize_file("deploy.prototxt", "out/fast.prototxt")      # out/fast.prototxt + out/fast.caffemodel
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from aiacc.core.ir import Graph
from aiacc.plugins.base import FileReport


def weights_path_for(prototxt: str) -> str | None:
    """NAME.caffemodel beside NAME.prototxt, when it exists."""
    base, _ = os.path.splitext(prototxt)
    path = base + ".caffemodel"
    return path if os.path.exists(path) else None


def read_model(path: str, weights: str | None = None):
    """The CaffeModel of a .prototxt and its weights (`weights=`, else NAME.caffemodel beside it, if any)."""
    from aiacc.plugins.caffe.model import CaffeModel

    return CaffeModel.load(path, weights or weights_path_for(path))


def load_graph(path: str, *, weights: str | None = None, **_: Any) -> Graph:
    """The IR graph of a .prototxt and its .caffemodel (beside it, or `weights=`)."""
    return read_model(path, weights).graph.copy()


def optimize_file(path: str, out: str, *, weights: str | None = None, level: int = 2, passes: Any = None,
                  disable: Any = None, verify: bool = True, seed: int = 0, **_: Any) -> FileReport:
    """Optimize a Caffe net and write OUT.prototxt and OUT.caffemodel (the report's `model`: a CaffeModel).

    With verify, the original and the optimized net run on random inputs (reference executor) and must
    agree within 1e-4 relative."""
    from aiacc.plugins.caffe.translator import PLUGIN

    model = read_model(path, weights)
    example = None
    if verify:
        rng = np.random.default_rng(seed)
        example = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in model.inputs.items()}
    fast = PLUGIN.optimize(model, example, level=level, passes=passes, disable=disable, verify=verify)
    base, ext = os.path.splitext(out)
    if ext not in (".prototxt", ".pt"):
        base = out
    os.makedirs(os.path.dirname(os.path.abspath(base)) or ".", exist_ok=True)
    prototxt, caffemodel = base + ".prototxt", base + ".caffemodel"
    fast.save(prototxt, caffemodel)
    return FileReport(path, "caffe", [prototxt, caffemodel], getattr(fast, "aiacc_report", None), fast,
                      _said(verify, seed, PLUGIN))


def _said(verify: bool, seed: int, plugin) -> str:
    return (f"verified: same outputs and output names on random inputs (seed {seed}, rtol={plugin.rtol:g}, "
            f"atol={plugin.atol:g})" if verify else "not verified (verify=False)")
