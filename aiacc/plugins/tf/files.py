"""TF model files for the `aiacc` command: a SavedModel directory or a Keras `.keras` file.

    graph = load_graph("saved_model_dir")                 # or "model.keras"
    optimize_file("model.keras", "out/fast")             # out/fast: a SavedModel of the optimized tf.Module
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from aiacc.core.ir import Graph
from aiacc.errors import ParseError, UnsupportedError, first_line
from aiacc.plugins.base import FileReport
from aiacc.plugins.tf._tf import tf


_KEEP_ALIVE: list = []  # loaded SavedModels whose signature functions cannot carry them


def load_model(path: str) -> Any:
    """The callable model in a SavedModel directory or a .keras file (a Keras model, a tf.Module with a
    tf.function __call__, or the SavedModel's serving signature)."""
    tfm = tf()
    if not os.path.exists(path):
        raise ParseError(f"{path}: no such file or directory")
    if path.lower().endswith(".keras"):
        import keras

        try:
            return keras.saving.load_model(path, compile=False)
        except Exception as e:  # a broken zip, a missing custom object...
            raise ParseError(f"{path}: cannot load the Keras file: {first_line(e)}") from e
    if os.path.isdir(path):
        if not os.path.exists(os.path.join(path, "saved_model.pb")):
            raise ParseError(f"{path}: a directory without saved_model.pb is not a SavedModel")
        try:
            loaded = tfm.saved_model.load(path)
        except Exception as e:
            raise ParseError(f"{path}: cannot load the SavedModel: {first_line(e)}") from e
        call = getattr(loaded, "__call__", None)
        if call is not None and getattr(call, "input_signature", None) is not None:
            return loaded
        sigs = getattr(loaded, "signatures", {})
        if sigs:
            fn = sigs["serving_default"] if "serving_default" in sigs else next(iter(sigs.values()))
            # the signature function holds its variables weakly: keep the loaded object alive with it
            try:
                fn._aiacc_owner = loaded  # noqa: SLF001
            except AttributeError:
                _KEEP_ALIVE.append(loaded)
            return fn
        raise UnsupportedError(f"{path}: the SavedModel has neither a __call__ with an input signature nor a "
                               f"serving signature")
    raise UnsupportedError(f"{path}: expected a SavedModel directory or a .keras file")


def load_graph(path: str, **_: Any) -> Graph:
    """The IR graph of a SavedModel directory or a .keras file (inference, variables frozen)."""
    from aiacc.plugins.tf.importer import import_model

    name = os.path.splitext(os.path.basename(os.path.normpath(path)))[0]
    return import_model(load_model(path), None, name=name)


def random_inputs(graph: Graph, *, batch: int = 2, seed: int = 0) -> list[np.ndarray]:
    """Random inputs matching the graph's TF signature (unknown dimensions get `batch`)."""
    rng = np.random.default_rng(seed)
    out = []
    for v in graph.inputs:
        shape = [d if isinstance(d, int) else batch for d in (v.shape or ())]
        if np.dtype(v.dtype).kind == "f":
            out.append(rng.standard_normal(shape).astype(v.dtype))
        elif np.dtype(v.dtype).kind == "b":
            out.append(rng.random(shape) > 0.5)
        else:
            out.append(rng.integers(0, 10, shape).astype(v.dtype))
    return out


def optimize_file(path: str, out: str, *, level: int = 2, passes: Any = None, disable: Any = None,
                  verify: bool = True, seed: int = 0, **_: Any) -> FileReport:
    """Optimize a SavedModel directory or .keras file and save the result as a SavedModel at `out`.

    With verify, the original and the optimized model run on random inputs and must agree within 1e-4
    relative. The report's `model` is the optimized tf.Module."""
    from aiacc.plugins.tf.importer import import_model
    from aiacc.plugins.tf.translator import PLUGIN

    model = load_model(path)
    example = None
    if verify:
        example = random_inputs(import_model(model, None), seed=seed)
    fast = PLUGIN.optimize(model, example, level=level, passes=passes, disable=disable, verify=verify)
    tf().saved_model.save(fast, out)
    said = (f"verified: same outputs on random inputs (seed {seed}, rtol={PLUGIN.rtol:g}, atol={PLUGIN.atol:g})"
            if verify else "not verified (verify=False)")
    return FileReport(path, "tf", [out], getattr(fast, "aiacc_report", None), fast, said)
