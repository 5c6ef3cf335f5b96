"""mode="train" for MXNet Gluon: the optimized block trains the original's own Parameters.

`trace_training` imports the block's symbol with training semantics and every Parameter as a graph input
named as the Parameter (so no pass folds a weight into a constant, and gradients reach it): BatchNorm on
batch statistics (training_mode=1) and Dropout kept. `export_training` lowers the optimized graph to a
symbol reading the same variable names and wraps it in a gluon.SymbolBlock built on the original's
ParameterDict: `autograd.record()` + `backward()` fill the original Parameters' gradients, a
`gluon.Trainer` over either block's parameters updates the same arrays, and MXNet's BatchNorm updates the
same moving mean/var (aux states) in place, exactly as the original's does. Like Gluon, the block follows
autograd's mode at run time: training semantics under `autograd.record()` (train_mode=True), inference
outside.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from aiacc.core.ir import Graph, TensorType
from aiacc.errors import UnsupportedError
from aiacc.plugins.mxnet._import import import_mxnet


# why memory_budget is refused: what MXNet 1.9 has for recomputation does not reach a Gluon block's training
NO_RECOMPUTE = ("memory_budget with mode='train' is not implemented for MXNet: MXNet 1.9 recomputes activations "
                "only in the symbolic executor's backward (MXNET_BACKWARD_DO_MIRROR, the __force_mirroring__ "
                "attribute), not in the CachedOp that trains a Gluon HybridBlock or SymbolBlock; torch and TF "
                "(tf.recompute_grad) plan recomputation under a budget")


def trace_training(model: Any, example_inputs: Any, name: str | None = None) -> Graph:
    """A Gluon HybridBlock as a training-mode IR graph: data inputs first, then one input per Parameter."""
    from aiacc.plugins.mxnet.importer import import_symbol
    from aiacc.plugins.mxnet.opaque import SymbolOpaqueBackend
    from aiacc.plugins.mxnet.translator import as_model, input_types

    mx = import_mxnet()
    if not isinstance(model, mx.gluon.HybridBlock):
        raise UnsupportedError(f"mode='train' for MXNet takes a Gluon HybridBlock (whose Parameters the trained "
                               f"block shares), not a {type(model).__name__}")
    m, names = as_model(model, example_inputs)
    types = input_types(names, example_inputs)
    params = {k: TensorType(np.asarray(a).dtype.name, tuple(np.asarray(a).shape)) for k, a in m.params.items()}
    g = import_symbol(m.symbol, {}, {**types, **params}, name=str(name or getattr(model, "name", "mxnet")),
                      opaque_backend=SymbolOpaqueBackend(m.symbol_json, types, m.params), training=True)
    g.meta["framework"] = "mxnet"
    g.meta["mxnet.data_inputs"] = list(names)
    g.meta["mxnet.params"] = [v.name for v in g.inputs if v.name in params]
    g.meta["mxnet.training"] = True  # the exporter picks forms whose backward is fast
    # the original's output nodes, so the exported block's outputs are named as the original's are
    g.meta["mxnet.output_heads"] = [(m.symbol.nodes[i].name, k) for i, k in m.symbol.heads]
    try:
        g.meta["mxnet.output_names"] = list(mx.sym.load_json(m.symbol_json).list_outputs())
    except Exception:  # noqa: BLE001 - a symbol MXNet itself cannot load still trains; no names then
        pass
    return g


def export_training(graph: Graph, original: Any, static_shape: bool = False) -> Any:
    """A gluon.SymbolBlock computing the graph on `original`'s Parameters (shared, not copied), hybridized
    with static_alloc (and static_shape when asked)."""
    from aiacc.plugins.mxnet.exporter import export_symbol

    mx = import_mxnet()
    if original is None or not isinstance(original, mx.gluon.HybridBlock):
        raise UnsupportedError(f"graph {graph.name}: a training-mode graph exports onto the original Gluon "
                               f"block's Parameters; pass original=")
    sym, args, aux = export_symbol(graph)
    outputs = mx.sym.load_json(sym.to_json())
    data = [mx.sym.var(n) for n in graph.meta["mxnet.data_inputs"]]
    shared = original.collect_params()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        block = mx.gluon.SymbolBlock(outputs, data, params=shared)
    # constants the export made (a folded shape, a fixed scale) are parameters of the new block only
    for name, array in {**args, **aux}.items():
        p = block.params.get(name)
        p.grad_req = "null"
        p.initialize(init=mx.init.Constant(0), ctx=mx.cpu(), force_reinit=True)
        p.set_data(mx.nd.array(array, dtype=array.dtype))
    for name in graph.meta["mxnet.params"]:
        if block.params.get(name) is not shared[name]:
            raise UnsupportedError(f"graph {graph.name}: the exported block does not share Parameter {name}")
    block.hybridize(static_alloc=True, static_shape=static_shape)
    block.aiacc_graph = graph
    from aiacc.plugins.mxnet.extension import LAYER_NORM_OP

    # the nodes that run as aiacc's extension operators (the report lists them)
    block.aiacc_extension_ops = [n.name for n in sym.nodes if n.op == LAYER_NORM_OP]
    return block


def run_recorded(block: Any, example_inputs: Any) -> list[np.ndarray]:
    """One forward of a Gluon block under autograd.record (training semantics; dropout seeded), outputs as
    numpy, every Parameter (moving statistics included) put back as it was."""
    from aiacc.plugins.mxnet.translator import _flatten_outputs, example_arrays

    mx = import_mxnet()
    arrays = example_arrays(example_inputs)
    if isinstance(arrays, dict):
        arrays = list(arrays.values())
    params = [p for p in block.collect_params().values() if p._data is not None]
    saved = [p.data().copy() for p in params]
    try:
        mx.random.seed(0)
        with mx.autograd.record(train_mode=True):
            out = block(*[mx.nd.array(a, dtype=a.dtype) for a in arrays])
        return _flatten_outputs(out)
    finally:
        for p, a in zip(params, saved):
            p.set_data(a)


def own_symbol_block(original: Any, example_inputs: Any) -> Any:
    """The original block's own symbol (Gluon's hybridized graph, no aiacc pass) as a SymbolBlock on the
    same Parameters, hybridized with static_alloc and static_shape: the framework's best path, which
    choose_flags measures against aiacc's graph."""
    from aiacc.plugins.mxnet.translator import as_model

    mx = import_mxnet()
    m, names = as_model(original, example_inputs)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        block = mx.gluon.SymbolBlock(mx.sym.load_json(m.symbol_json), [mx.sym.var(n) for n in names],
                                     params=original.collect_params())
    for p in block.collect_params().values():
        if p._data is None:
            raise ValueError(f"Gluon's own graph has a parameter {p.name} the original block does not")
    block.hybridize(static_alloc=True, static_shape=True)
    return block


def choose_flags(block: Any, original: Any, example_inputs: Any, setting: Any) -> Any:
    """The exported block hybridized with static_shape too (what Gluon's fastest path, hybridize(static_alloc,
    static_shape), does; MXNet re-plans when a later call's shapes differ), or the one without static_shape,
    or Gluon's own graph, where one of those trains clearly faster on the example inputs
    (framework_compile='auto': autograd.record forward + backward, measured interleaved; gradients and
    Parameters, moving statistics included, put back after every measured step; a tie keeps static_shape:
    measured on resnet_small b8 it was 0.99x of Gluon's static path, static_alloc alone 1.06x)."""
    from aiacc.plugins.mxnet.translator import example_arrays
    from aiacc.plugins.train_choice import TrainChoice, attach, choose, perturb

    mx = import_mxnet()
    if example_inputs is None and setting == "auto":
        return attach(block, TrainChoice("aiacc graph (static_alloc)", reason="no example inputs to measure on"))
    arrays = [] if example_inputs is None else example_arrays(example_inputs)
    if isinstance(arrays, dict):
        arrays = list(arrays.values())
    nd = [mx.nd.array(a, dtype=a.dtype) for a in arrays]
    params = [p for p in original.collect_params().values() if p._data is not None]

    # aiacc's own step on its float inputs perturbed at rounding level: the gradients' noise floor
    noisy = [mx.nd.array(perturb(a, k), dtype=a.dtype) for k, a in enumerate(arrays)]
    floating = any(np.asarray(a).dtype.kind == "f" for a in arrays)

    def step_of(b, inputs=nd):
        def step():
            saved = [p.data().copy() for p in params]
            grads = [p.grad().copy() if p.grad_req != "null" else None for p in params]
            mx.random.seed(0)
            with mx.autograd.record(train_mode=True):
                out = b(*inputs)
                outs = out if isinstance(out, (list, tuple)) else [out]
                loss = mx.nd.add_n(*[(o.astype("float32") ** 2).mean() for o in outs])
            loss.backward()
            result = [loss.copy()] + [p.grad().copy() for p in params if p.grad_req != "null"]
            for p, a, g in zip(params, saved, grads):
                p.set_data(a)
                if g is not None:
                    p.grad()[:] = g
            mx.nd.waitall()
            return result
        return step

    chosen, choice = choose("aiacc graph (static_alloc)",
                            lambda: export_training(block.aiacc_graph, original, static_shape=True), step_of, block,
                            setting, "hybridize static_shape", to_arrays=lambda r: [a.asnumpy() for a in r],
                            more={"Gluon's own graph (hybridize static_alloc, static_shape)":
                                  lambda: own_symbol_block(original, example_inputs)},
                            perturbed=step_of(block, noisy) if floating else None,
                            keep="aiacc graph (static_alloc) + hybridize static_shape")
    if getattr(chosen, "aiacc_graph", None) is None:  # the graph aiacc optimized; aiacc_train_path says what runs
        chosen.aiacc_graph = block.aiacc_graph
    return attach(chosen, choice)
