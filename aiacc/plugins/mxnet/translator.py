"""The MXNet translator: what `aiacc.trace` / `aiacc.optimize` do with a Gluon HybridBlock, a
(Symbol, arg_params, aux_params) triple, a bare Symbol or an exported `-symbol.json` file.

Inputs of a Gluon block are named as `HybridBlock.export` names them: `data` for one input, `data0`,
`data1`, ... for several. For a Symbol the model inputs are the variables that are not parameters (or
`input_names=`); example inputs may be given positionally or as a dict by name.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Any, Mapping, Sequence

import numpy as np

from aiacc.core.ir import Graph, TensorType
from aiacc.errors import KernelError, ShapeError, UnsupportedError, describe
from aiacc.plugins.base import Plugin, to_numpy_list
from aiacc.plugins.mxnet import export_ops, import_ops  # noqa: F401  (fill the op tables; no mxnet import)
from aiacc.plugins.mxnet._import import import_mxnet
from aiacc.plugins.mxnet.model import MXNetModel, read_model
from aiacc.plugins.mxnet.symjson import parse_symbol_json


def _to_numpy(x: Any) -> np.ndarray:
    mx = import_mxnet()
    if isinstance(x, mx.nd.NDArray):
        return x.asnumpy()
    return np.asarray(x)


def _flatten_outputs(out: Any) -> list[np.ndarray]:
    if isinstance(out, (list, tuple)):
        return [a for o in out for a in _flatten_outputs(o)]
    return [_to_numpy(out)]


def example_arrays(example_inputs: Any) -> list[np.ndarray] | dict[str, np.ndarray]:
    """Example inputs as numpy: a list (positional) or a dict (by input name)."""
    if example_inputs is None:
        return []
    if isinstance(example_inputs, Mapping):
        return {k: _to_numpy(v) for k, v in example_inputs.items()}
    if isinstance(example_inputs, (list, tuple)):
        return [_to_numpy(v) for v in example_inputs]
    return [_to_numpy(example_inputs)]


def gluon_input_names(n: int) -> list[str]:
    """The names HybridBlock.export gives the inputs of a block with `n` inputs."""
    return ["data"] if n == 1 else [f"data{i}" for i in range(n)]


def _nd_params(d: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {k: _to_numpy(v) for k, v in (d or {}).items()}


def as_model(model: Any, example_inputs: Any = None, **options: Any) -> tuple[MXNetModel, list[str]]:
    """Turn any accepted MXNet model into an MXNetModel and the ordered list of its input names."""
    if isinstance(model, MXNetModel):
        return model, _input_names(model, example_inputs, options.get("input_names"))
    if isinstance(model, (str, os.PathLike)):
        m = read_model(os.fspath(model))
        return m, _input_names(m, example_inputs, options.get("input_names"))
    mx = import_mxnet()
    if isinstance(model, mx.gluon.Block):
        return _from_block(mx, model, example_inputs)
    if isinstance(model, tuple) and len(model) == 3 and isinstance(model[0], mx.sym.Symbol):
        sym, args, aux = model
        return _from_symbol(sym, _nd_params(args), _nd_params(aux), example_inputs, options)
    if isinstance(model, mx.sym.Symbol):
        return _from_symbol(model, _nd_params(options.get("arg_params", {})), _nd_params(options.get("aux_params", {})),
                            example_inputs, options)
    raise UnsupportedError(f"the MXNet plugin takes a Gluon HybridBlock, a (Symbol, arg_params, aux_params) triple, "
                           f"a Symbol or a -symbol.json path, not a {type(model).__name__}")


def _from_symbol(sym, args, aux, example_inputs, options) -> tuple[MXNetModel, list[str]]:
    text = sym.tojson()
    m = MXNetModel(parse_symbol_json(text, "Symbol"), text, args, aux, "Symbol")
    return m, _input_names(m, example_inputs, options.get("input_names"))


def _readers(m: MXNetModel, name: str) -> str:
    readers = [n.describe() for n in m.symbol.nodes if any(m.symbol.nodes[i].name == name for i, _ in n.inputs)]
    return ", ".join(readers) or "an output"


# layer ops whose inputs after the first are their parameters (weight, bias, gamma, beta, moving statistics)
_PARAM_READERS = {"Convolution", "Deconvolution", "FullyConnected", "BatchNorm", "InstanceNorm", "LayerNorm",
                  "GroupNorm", "Embedding", "LeakyReLU", "RNN", "_contrib_SyncBatchNorm"}
_PARAM_NAME = re.compile(r"_(weight|bias|gamma|beta|moving_mean|moving_var|running_mean|running_var|alpha)$")


def _warn_missing_params(m: MXNetModel, free: Sequence[str]) -> None:
    """With no example inputs every free variable becomes a model input: one that looks like a parameter (a
    layer's weight, bias, gamma... input, or named so) has no value in the params, which is a fallback
    (AiaccWarning naming it; FallbackError under strict=True), not a silent extra input."""
    from aiacc.errors import fallback

    by_name = {n.name: n for n in m.symbol.nodes if n.is_variable}
    for name in free:
        var = by_name.get(name)
        as_param = var is not None and any(
            n.op in _PARAM_READERS and any(i == var.index for i, _ in n.inputs[1:]) for n in m.symbol.nodes)
        if as_param or _PARAM_NAME.search(name):
            fallback(f"mxnet.missing_param:{name}",
                     f"{m.source}: variable {name!r} (read by {_readers(m, name)}) has no value in the parameters: "
                     f"it is loaded as an extra model input (give the params file that has it, or name the data "
                     f"inputs with input_names=)")


def _input_names(m: MXNetModel, example_inputs: Any, input_names: Sequence[str] | None) -> list[str]:
    free = m.free_variables()
    if isinstance(example_inputs, Mapping):
        names = list(example_inputs)
    elif input_names:
        names = list(input_names)
    else:
        n = len(example_arrays(example_inputs)) if example_inputs is not None else None
        if n is not None and n > len(free):
            raise ShapeError(f"{m.source}: {n} example inputs given, but the model has {len(free)} input "
                             f"variable(s): {', '.join(free) or 'none'}")
        names = free if n is None else free[:n]
        if n is None:
            _warn_missing_params(m, free)
    for name in free:
        if name not in names:
            raise UnsupportedError(f"{m.source}: variable {name!r} (read by {_readers(m, name)}) has no value in "
                                   f"the parameters and is not a model input (inputs: {', '.join(names) or 'none'}): "
                                   f"a parameter is missing")
    return names


def _from_block(mx, block, example_inputs) -> tuple[MXNetModel, list[str]]:
    if not isinstance(block, mx.gluon.HybridBlock):
        raise UnsupportedError(f"{type(block).__name__} is a gluon.Block, not a HybridBlock: its forward is Python "
                               f"code aiacc cannot trace; derive it from HybridBlock")
    arrays = example_arrays(example_inputs)
    if isinstance(arrays, dict):
        arrays = list(arrays.values())
    if not arrays:
        raise UnsupportedError(f"tracing the Gluon block {type(block).__name__} needs example inputs")
    np_mode = mx.util.is_np_array()  # a block written for mx.np (npx.set_np()) takes and returns mx.np arrays
    nd = [(mx.np.array if np_mode else mx.nd.array)(a, dtype=a.dtype) for a in arrays]
    try:
        block(*nd)  # finishes deferred parameter initialization
        mx.nd.waitall()  # MXNet runs asynchronously (MKLDNN may still be reordering weights in place)
    except (RuntimeError, ValueError) as e:  # MXNetError is a RuntimeError; deferred init raises ValueError
        from aiacc.plugins.mxnet.mxrun import _mx_error

        raise UnsupportedError(f"running {type(block).__name__} on the example inputs failed (is it initialized? "
                               f"does MXNet run it on the CPU?): {_mx_error(e)}") from None
    names = gluon_input_names(len(nd))
    try:
        out = block(*[mx.sym.var(n).as_np_ndarray() if np_mode else mx.sym.var(n) for n in names])
    except Exception as e:  # noqa: BLE001 - user code: e.g. a hybrid_forward that reads x.shape
        raise UnsupportedError(f"{type(block).__name__} cannot be called on MXNet Symbols, so aiacc cannot "
                               f"trace it ({describe(e)}); "
                               f"its hybrid_forward must use only F.* operators") from None
    out_format = None
    if isinstance(out, (list, tuple)):
        from mxnet.gluon.block import _flatten  # Gluon's own record of a nested output (what _regroup reads)

        out_format = _flatten(list(out), "output")[1]
        out = mx.sym.Group([o.as_nd_ndarray() if np_mode else o for o in _flat_symbols(out)])
    elif np_mode:
        out = out.as_nd_ndarray()
    text = out.tojson()
    params = {}
    for p in block.collect_params().values():
        if p._data is None and p._deferred_init:
            continue
        params[p.name] = p.data().asnumpy()
    aux_names = set(out.list_auxiliary_states())
    args = {k: v for k, v in params.items() if k not in aux_names}
    aux = {k: v for k, v in params.items() if k in aux_names}
    m = MXNetModel(parse_symbol_json(text, type(block).__name__), text, args, aux, type(block).__name__)
    m.out_format = out_format  # the optimized block returns the outputs nested as the original does
    return m, names


def _flat_symbols(out):
    for o in out:
        if isinstance(o, (list, tuple)):
            yield from _flat_symbols(o)
        else:
            yield o


def input_types(names: Sequence[str], example_inputs: Any, shapes: Mapping[str, Sequence] | None = None,
                dtype: str = "float32") -> dict[str, TensorType]:
    """Types of the model inputs from the example arrays, else from `input_shapes=` (else unknown shape)."""
    arrays = example_arrays(example_inputs)
    out: dict[str, TensorType] = {}
    for i, name in enumerate(names):
        a = arrays.get(name) if isinstance(arrays, dict) else (arrays[i] if i < len(arrays) else None)
        if a is not None:
            out[name] = TensorType(a.dtype.name, a.shape)
        elif shapes and name in shapes:
            out[name] = TensorType(dtype, tuple(shapes[name]))
        else:
            out[name] = TensorType(dtype, None)
    return out


def _static_shape_breaks(graph: Graph) -> bool:
    """Ops MXNet cannot run in a static_shape CachedOp: its CPU RNN with projection_size then takes the
    training path and refuses ("No training support for LSTM with projection on CPU")."""
    return any(n.domain == "mxnet" and n.op == "RNN" and n.attrs.get("projection_size") not in (None, "None")
               for n in graph)


def _format_fits(fmt: Any, n: int) -> bool:
    """Whether a Gluon output format (nested lists of 0s, as gluon.block._flatten records) has n leaves."""
    if fmt is None or isinstance(fmt, int):
        return False

    def leaves(f):
        return 1 if f == 0 else sum(leaves(x) for x in f) if isinstance(f, list) else -10**6
    return leaves(fmt) == n


def _symbol_output_names(mx: Any, block: Any, n_inputs: int) -> list[str] | None:
    """The symbol output names of a block: the plain symbol of aiacc's NativeBlock, a SymbolBlock's symbol,
    or what a HybridBlock's hybrid_forward gives on symbols; an OrtBlock (onnxruntime, no symbol) answers
    with the names its graph recorded from the original's symbol, so only its structure is compared. None
    where the block has none (a plain Block)."""
    graph = getattr(block, "aiacc_graph", None)
    if hasattr(block, "plain_symbol"):
        return list(block.plain_symbol.list_outputs())
    if graph is not None:  # an OrtBlock has no symbol: its outputs are the graph's, compared by their place
        return graph.meta.get("mxnet.output_names")
    if isinstance(block, mx.gluon.SymbolBlock):
        return list(block._cached_graph[1].list_outputs())
    if not isinstance(block, mx.gluon.HybridBlock):
        return None
    np_mode = mx.util.is_np_array()
    try:
        out = block(*[mx.sym.var(n).as_np_ndarray() if np_mode else mx.sym.var(n) for n in gluon_input_names(n_inputs)])
    except Exception:  # noqa: BLE001 - user code that runs on NDArrays only: no symbol names to compare
        return None
    return [name for s in (_flat_symbols(out) if isinstance(out, (list, tuple)) else [out])
            for name in s.list_outputs()]


class MXNetPlugin(Plugin):
    name = "mxnet"
    title = "MXNet"
    install_hint = "pip install 'aiacc[mxnet]'"
    modes = ("inference", "train")
    options = {"name": "the graph's name", "input_names": "names of a Symbol's data inputs",
               "arg_params": "a Symbol's arg_params", "aux_params": "a Symbol's aux_params",
               "static_alloc": "SymbolBlock hybridize static_alloc", "static_shape": "hybridize static_shape",
               "subgraph_backend": "MXNet subgraph backend of the export ('auto', None, 'ONEDNN', ...)",
               "memory_budget": "mode='train' only (not implemented for MXNet)",
               "framework_compile": "mode='train': 'auto' measures the step hybridized with and without "
                                    "static_shape and keeps the faster; True always static_shape; False never"}

    checks_batch = True

    def with_batch(self, example_inputs: Any, n: int) -> Any:
        """The example arrays with `n` rows (base.grow_arrays)."""
        from aiacc.plugins.base import grow_arrays

        return grow_arrays(example_arrays(example_inputs), n)

    def guard_batch(self, model: Any, batch: int, why: str) -> bool:
        """Whether the block can refuse another batch size: the shape guard guard_shapes puts on it then
        fixes dimension 0 too and says `why` (mxnet/guard.py)."""
        from aiacc.plugins.mxnet.guard import guardable

        return guardable(model)

    def guard_shapes(self, model: Any, original: Any, found: dict) -> Any:
        """A forward pre-hook refusing any call at shapes the block was not built for with a ShapeError
        (mxnet/guard.py)."""
        from aiacc.plugins.mxnet.guard import guard_block

        return guard_block(model, original, found)

    def dims_to_check(self, model: Any, example_inputs: Any) -> list[tuple[int, int, int]]:
        """A native block's non-batch dimensions (MXNet infers the symbol's shapes again at each call; the
        onnxruntime and aiacc-runtime blocks run the graph at its static shapes), of positional inputs."""
        arrays = example_arrays(example_inputs)
        graph = getattr(model, "aiacc_graph", None)
        if getattr(model, "plain_symbol", None) is None or isinstance(arrays, dict) or graph is None or \
                graph.meta.get("mxnet.mode") == "train":
            return []
        return [(i, d, int(a.shape[d])) for i, a in enumerate(arrays) for d in range(1, np.ndim(a))]

    def with_dims(self, example_inputs: Any, dims: list[tuple[int, int]]) -> Any:
        """The example arrays with each (input, dimension) of `dims` one larger (base.grow_dims)."""
        from aiacc.plugins.base import grow_dims

        return grow_dims(example_arrays(example_inputs), dims)

    def batch_precheck(self, model: Any, inputs: Any, expected: list[np.ndarray]) -> str:
        """A native block's symbol checked by MXNet's shape inference at the other size before it runs there
        (mxnet/guard.py symbol_misfit: a reshape fixed at the example's batch would crash MXNet's kernel)."""
        from aiacc.plugins.mxnet.guard import block_shapes, symbol_misfit

        sym = getattr(model, "plain_symbol", None)
        graph = getattr(model, "aiacc_graph", None)
        if sym is None or graph is None:
            return ""
        arrays = example_arrays(inputs)
        if isinstance(arrays, dict):
            arrays = [arrays[v.name] for v in graph.inputs]
        shapes = block_shapes(model, {v.name: a.shape for v, a in zip(graph.inputs, arrays)})
        return symbol_misfit(sym, shapes, [e.shape for e in expected])

    def _check_batch(self, model: Any, out: Any, example_inputs: Any) -> list[str]:
        """base's batch check, for inference (mode='train' is verified on one recorded forward at the example's
        size)."""
        graph = getattr(out, "aiacc_graph", None)
        if graph is not None and graph.meta.get("mxnet.mode") == "train":
            return []
        return super()._check_batch(model, out, example_inputs)

    def detect(self, model: Any) -> bool:
        """A Gluon Block, an MXNet Symbol or a (Symbol, arg_params, aux_params) triple."""
        mx = sys.modules.get("mxnet")
        if mx is None:
            return False
        if isinstance(model, (mx.gluon.Block, mx.symbol.Symbol)):
            return True
        return isinstance(model, tuple) and len(model) == 3 and isinstance(model[0], mx.symbol.Symbol)

    def trace(self, model: Any, example_inputs: Any = None, *, input_shapes: Mapping[str, Sequence] | None = None,
              mode: str = "inference", **options: Any) -> Graph:
        """Translate a Gluon HybridBlock, a (Symbol, arg_params, aux_params) triple, a Symbol or a
        -symbol.json path into an IR graph with ONNX semantics (inference mode); mode="train" (alias
        "training"): a HybridBlock in training semantics, its Parameters as graph inputs."""
        if self.check_mode(mode) == "train":
            if options.get("memory_budget") is not None:
                from aiacc.plugins.mxnet.training import NO_RECOMPUTE

                raise UnsupportedError(NO_RECOMPUTE)
            from aiacc.plugins.mxnet.training import trace_training

            return trace_training(model, example_inputs, options.get("name"))
        from aiacc.plugins.mxnet.importer import import_symbol
        from aiacc.plugins.mxnet.mxrun import check_params
        from aiacc.plugins.mxnet.opaque import SymbolOpaqueBackend

        m, names = as_model(model, example_inputs, **options)
        types = input_types(names, example_inputs, input_shapes)
        static = {k: t.shape for k, t in types.items() if t.shape is not None}
        if len(static) == len(types):
            check_params(m.symbol, m.symbol_json, m.params, static)
        name = options.get("name") or (getattr(model, "name", None) if not isinstance(model, tuple) else None)
        g = import_symbol(m.symbol, m.params, types, name=str(name or "mxnet"), opaque_backend=SymbolOpaqueBackend(m.symbol_json, types, m.params))
        g.meta["framework"] = "mxnet"
        # the original's outputs: (symbol node, output index) per graph output, for the exporter to name its
        # output nodes the same; the names list_outputs() gives, for the blocks that have no symbol (OrtBlock)
        g.meta["mxnet.output_heads"] = [(m.symbol.nodes[i].name, k) for i, k in m.symbol.heads]
        try:
            g.meta["mxnet.output_names"] = list(import_mxnet().sym.load_json(m.symbol_json).list_outputs())
        except Exception:  # noqa: BLE001 - a symbol MXNet itself cannot load still translates; no names then
            pass
        if getattr(m, "out_format", None) is not None:
            g.meta["mxnet.out_format"] = m.out_format
        return g

    def export_native(self, graph: Graph, *, original: Any = None, **options: Any) -> Any:
        """A gluon.SymbolBlock computing the graph. Options: static_alloc and static_shape (CachedOp flags,
        default True), subgraph_backend ("auto": MXNet's MKLDNN fusions where the build has MKLDNN; None:
        none)."""
        from aiacc.plugins.mxnet.exporter import export_symbol
        from aiacc.plugins.mxnet.native import native_block

        if graph.meta.get("mxnet.mode") == "train":
            from aiacc.plugins.mxnet.training import export_training

            return export_training(graph, original)
        sym, args, aux = export_symbol(graph)
        # MXNet's fastest CachedOp mode, partitioned into MKLDNN's fused ops where the build has them;
        # export() still writes the plain symbol (see aiacc.plugins.mxnet.native)
        block = native_block(sym.to_json(), [v.name for v in graph.inputs], args, aux,
                             static_alloc=options.get("static_alloc", True),
                             static_shape=options.get("static_shape", not _static_shape_breaks(graph)),
                             subgraph_backend=options.get("subgraph_backend", "auto"))
        block.aiacc_graph = graph
        if _format_fits(graph.meta.get("mxnet.out_format"), len(graph.outputs)):
            block._out_format = graph.meta["mxnet.out_format"]  # Gluon's _regroup nests the outputs again
        return block

    def export_onnxruntime(self, graph: Graph, *, original: Any = None, providers: Any = None,
                           **options: Any) -> Any:
        """A Gluon block running the graph in onnxruntime."""
        if graph.meta.get("mxnet.mode") == "train":
            raise UnsupportedError("backend='onnxruntime' runs inference only; use backend='native' for mode='train'")
        from aiacc.plugins.mxnet.ort import OrtBlock

        return OrtBlock(graph, providers=providers)

    def optimize(self, model: Any, example_inputs: Any = None, **options: Any) -> Any:
        """aiacc.optimize for MXNet; with mode="train" the block is also verified in training semantics (one
        forward under autograd.record on both blocks, the Parameters restored after each)."""
        mode = self.check_mode(options.get("mode"))
        if mode == "train" and options.get("memory_budget") is not None:
            from aiacc.plugins.mxnet.training import NO_RECOMPUTE

            raise UnsupportedError(NO_RECOMPUTE)
        if options.pop("memory_budget", None) is not None:  # as torch and TF: never silently ignored
            raise UnsupportedError("memory_budget applies to mode='train' (inference memory is planned by the arena)")
        from aiacc.plugins.train_choice import option as compile_option

        compile_setting = compile_option(options)
        out = super().optimize(model, example_inputs, **options)
        if mode == "train" and options.get("backend", "native") == "native":
            from aiacc.plugins.mxnet.training import choose_flags

            report = getattr(out, "aiacc_report", None)
            out = choose_flags(out, model, example_inputs, compile_setting)
            out.aiacc_report = report
            from aiacc.plugins.train_choice import note

            note(report, out.aiacc_train_choice)
            if report is not None:
                extension = getattr(out, "aiacc_extension_ops", [])
                if extension:
                    report.note("export", [f"{len(extension)} LayerNorm node(s) train as aiacc_layer_norm (aiacc's "
                                           f"MXNet extension operator): {', '.join(extension[:4])}"
                                           + (" ..." if len(extension) > 4 else "")])
        if mode == "train" and options.get("verify", True) and example_inputs is not None:
            from aiacc.core.compare import compare_outputs
            from aiacc.errors import VerificationError
            from aiacc.plugins.mxnet.training import run_recorded

            problem = compare_outputs(run_recorded(model, example_inputs), run_recorded(out, example_inputs),
                                      self.rtol, self.atol)
            if problem:
                raise VerificationError(f"aiacc.optimize (mxnet, mode='train'): training forward differs: {problem}")
        return out

    def run(self, model: Any, example_inputs: Any) -> list[np.ndarray]:
        return self.run_named(model, example_inputs)[0]

    def run_named(self, model: Any, example_inputs: Any) -> tuple[list[np.ndarray], list[str]]:
        """The outputs and, for each, its place in what the block returns ("seq[1]/seq[0]": MXNet itself
        returns a hybridized block's tuple as a list, so lists and tuples are one kind) and its symbol output
        name ("fc1_output"; a Gluon block's as its symbol gives them), which verify compares."""
        from aiacc.plugins.base import output_paths

        mx = import_mxnet()
        block, out = self._call(model, example_inputs)
        paths = output_paths(out, lambda x: isinstance(x, mx.nd.NDArray) or hasattr(x, "asnumpy"),
                             sequence_types=False)
        arrays = [_to_numpy(x) for _, x in paths]
        symbols = _symbol_output_names(mx, block, len(example_arrays(example_inputs)))
        if symbols is None or len(symbols) != len(paths):
            return arrays, [p for p, _ in paths]
        return arrays, [f"{p} ({name})" for (p, _), name in zip(paths, symbols)]

    def _call(self, model: Any, example_inputs: Any) -> tuple[Any, Any]:
        """(the Gluon block run, what it returned) on the example inputs."""
        mx = import_mxnet()
        if not isinstance(model, mx.gluon.Block):
            from aiacc.plugins.mxnet.mxrun import symbol_block

            m, names = as_model(model, example_inputs)
            model = symbol_block(m.symbol_json, names, m.arg_params, m.aux_params)
            arrays = example_arrays(example_inputs)
            if isinstance(arrays, dict):
                arrays = [arrays[n] for n in names]
        else:
            arrays = example_arrays(example_inputs)
            if isinstance(arrays, dict):
                arrays = list(arrays.values())
        array = mx.np.array if mx.util.is_np_array() else mx.nd.array
        nd = [array(a, dtype=a.dtype) for a in arrays]
        try:
            out = model(*nd)
            mx.nd.waitall()
            return model, out
        except mx.base.MXNetError as e:  # MXNet runs lazily: errors surface when outputs are read
            from aiacc.plugins.mxnet.mxrun import _mx_error

            raise KernelError(f"MXNet failed to run {type(model).__name__} on the example inputs: "
                              f"{_mx_error(e)}") from None

    def feeds(self, graph: Graph, example_inputs: Any) -> dict[str, np.ndarray] | None:
        arrays = example_arrays(example_inputs)
        if isinstance(arrays, dict):
            return {v.name: arrays[v.name] for v in graph.inputs if v.name in arrays}
        if len(arrays) != len(graph.inputs):
            raise ShapeError(f"graph {graph.name} has {len(graph.inputs)} inputs, {len(arrays)} example inputs given")
        return {v.name: a for v, a in zip(graph.inputs, arrays)}

    def runner(self, model: Any, inputs: Any):
        """Calls model(*inputs) on mx.nd arrays made once."""
        mx = import_mxnet()
        xs = [mx.nd.array(a, dtype=a.dtype) for a in inputs]
        return lambda: to_numpy_list(model(*xs))


PLUGIN = MXNetPlugin()
MXNetTranslator = MXNetPlugin  # the name earlier code and tests use
