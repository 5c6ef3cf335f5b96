"""The MXNet side of the plugin: running single ops for opaque nodes, checking parameters against a
symbol, loading and saving `.params` files, turning a symbol JSON plus parameters into a Gluon
`SymbolBlock`. Everything here imports mxnet (through `import_mxnet`)."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Mapping, Sequence

import numpy as np

from aiacc.core.ir import TensorType
from aiacc.errors import KernelError, ParseError, ShapeError, UnsupportedError
from aiacc.plugins.mxnet._import import import_mxnet
from aiacc.plugins.mxnet.symjson import MXNET_VERSION, MxNode, MxSymbol


def mx():
    return import_mxnet()


def _mx_error(e: Exception) -> str:
    """The first meaningful line of an MXNet error (they carry long C++ stack traces)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for ln in lines:
        if "Error" in ln or "Check failed" in ln or "Invalid" in ln:
            return ln[:400]
    return (lines[0] if lines else type(e).__name__)[:400]


def _single_op_json(node: MxNode, n_inputs: int) -> str:
    nodes = [{"op": "null", "name": f"in{i}", "inputs": []} for i in range(n_inputs)]
    nodes.append({"op": node.op, "name": node.name, "attrs": dict(node.attrs),
                  "inputs": [[i, 0, 0] for i in range(n_inputs)], **getattr(node, "extra", {})})
    return json.dumps({"nodes": nodes, "arg_nodes": list(range(n_inputs)),
                       "heads": [[n_inputs, 0, 0]], "attrs": {"mxnet_version": ["int", MXNET_VERSION]}})


_STAND_IN_BASE = 1000003  # stand-in sizes for symbolic dimensions, far from any real size


class OpaqueBackend:
    """Shape inference and a numpy-level kernel for an MXNet op aiacc keeps opaque."""

    def infer(self, node: MxNode, input_types: Sequence[TensorType | None]) -> list[TensorType | None]:
        """Output types from MXNet's own inference; unknown (None shape) when an input shape is unknown."""
        m = mx()
        sym = self.symbol(node, len(input_types))
        n_out = len(sym.list_outputs())
        if any(t is None or t.shape is None for t in input_types):
            first_dtype = input_types[0].dtype if input_types and input_types[0] is not None else None
            return [TensorType(first_dtype, None) for _ in range(n_out)]
        # symbolic dimensions: infer with large distinct stand-ins and map them back; any other large
        # size in the result was derived from a symbol and is unknown
        stand_in: dict[str, int] = {}  # symbol (or "?k" for the k-th unknown size) -> stand-in size
        shapes = {}
        for i, t in enumerate(input_types):
            dims = []
            for d in t.shape:
                if not isinstance(d, int):
                    key = d if isinstance(d, str) else f"?{len(stand_in)}"
                    d = stand_in.setdefault(key, _STAND_IN_BASE + 38 * len(stand_in))
                dims.append(d)
            shapes[f"in{i}"] = tuple(dims)
        symbol_of = {v: (None if k.startswith("?") else k) for k, v in stand_in.items()}
        dtypes = {f"in{i}": np.dtype(t.dtype or "float32") for i, t in enumerate(input_types)}
        try:
            _, out_shapes, _ = sym.infer_shape(**shapes)
            _, out_types, _ = sym.infer_type(**dtypes)
        except m.base.MXNetError as e:
            if stand_in:  # the op may not accept the stand-in sizes: leave the shapes unknown
                return [TensorType(input_types[0].dtype, None) for _ in range(n_out)]
            raise ShapeError(f"{node.describe()}: MXNet cannot infer its output shapes: {_mx_error(e)}") from None

        def back(d: int):
            if d in symbol_of:
                return symbol_of[d]
            return None if stand_in and d >= 1000 else d

        return [TensorType(np.dtype(dt).name, tuple(back(d) for d in s)) for s, dt in zip(out_shapes, out_types)]

    def symbol(self, node: MxNode, n_inputs: int):
        """A symbol of the op alone, with inputs in0..inN and every visible output as a head."""
        m = mx()
        try:
            one = m.sym.load_json(_single_op_json(node, n_inputs))
        except m.base.MXNetError as e:
            raise UnsupportedError(f"{node.describe()}: MXNet does not accept this node: {_mx_error(e)}") from None
        # load_json keeps only the listed head; the internals list every visible output of the op
        internals = one.get_internals()
        n_out = len(internals.list_outputs()) - n_inputs
        return one if n_out <= 1 else m.sym.Group([internals[n_inputs + k] for k in range(n_out)])

    def kernel(self, node: MxNode):
        """A callable running the op on numpy arrays (inference mode) and returning numpy arrays."""
        cache: dict[tuple, Any] = {}

        def run(*arrays: np.ndarray):
            m = mx()
            key = tuple((a.shape, a.dtype.str) for a in arrays)
            if key not in cache:
                sym = self.symbol(node, len(arrays))
                args = sym.list_arguments()
                aux = sym.list_auxiliary_states()
                cache[key] = (sym, args, aux)
            sym, args, aux = cache[key]
            feeds = {f"in{i}": m.nd.array(a, dtype=a.dtype) for i, a in enumerate(arrays)}
            try:
                ex = sym.bind(m.cpu(), args={k: feeds[k] for k in args},
                              aux_states={k: feeds[k] for k in aux}, grad_req="null")
                outs = ex.forward(is_train=False)
            except m.base.MXNetError as e:
                raise KernelError(f"{node.describe()}: MXNet failed to run it: {_mx_error(e)}") from None
            return [o.asnumpy() for o in outs]

        return run


# -- parameters -------------------------------------------------------------------------------------

def load_params(path: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Read a `.params` file into (arg_params, aux_params) as numpy arrays ('arg:'/'aux:' prefixes, or a
    Gluon save_parameters file with bare names, which are treated as args)."""
    m = mx()
    try:
        loaded = m.nd.load(path)
    except m.base.MXNetError as e:
        raise ParseError(f"{path}: not an MXNet .params file: {_mx_error(e)}") from None
    if not isinstance(loaded, dict):
        raise ParseError(f"{path}: holds a list of arrays without names; aiacc needs named parameters")
    args, aux = {}, {}
    for k, v in loaded.items():
        kind, _, name = k.partition(":")
        if name and kind == "aux":
            aux[name] = v.asnumpy()
        elif name and kind == "arg":
            args[name] = v.asnumpy()
        else:
            args[k] = v.asnumpy()
    return args, aux


def save_params(path: str, arg_params: Mapping[str, np.ndarray], aux_params: Mapping[str, np.ndarray]) -> None:
    m = mx()
    d = {f"arg:{k}": m.nd.array(v, dtype=v.dtype) for k, v in arg_params.items()}
    d.update({f"aux:{k}": m.nd.array(v, dtype=v.dtype) for k, v in aux_params.items()})
    m.nd.save(path, d)


def check_params(sym: MxSymbol, symbol_json: str, params: Mapping[str, np.ndarray],
                 input_shapes: Mapping[str, tuple]) -> None:
    """Check every parameter's shape against what the symbol expects given the input shapes.

    Raises ShapeError naming the parameter and the node that reads it.
    """
    m = mx()
    if not input_shapes or not all(all(isinstance(d, int) for d in s) for s in input_shapes.values()):
        return
    try:
        s = m.sym.load_json(symbol_json)
        arg_shapes, _, aux_shapes = s.infer_shape_partial(**{k: tuple(v) for k, v in input_shapes.items()})
    except m.base.MXNetError:
        return  # the per-node shape inference of the importer reports it, naming the node
    readers: dict[str, MxNode] = {}
    for n in sym.nodes:
        for i, _ in n.inputs:
            readers.setdefault(sym.nodes[i].name, n)
    names = s.list_arguments() + s.list_auxiliary_states()
    for name, shape in zip(names, list(arg_shapes or []) + list(aux_shapes or [])):
        if name not in params or not shape or any(d == 0 for d in shape):
            continue
        got = tuple(np.shape(params[name]))
        if got != tuple(shape):
            reader = readers.get(name)
            who = f" (read by {reader.describe()})" if reader else ""
            raise ShapeError(f"parameter {name!r}{who} has shape {list(got)}, but the symbol expects "
                             f"{list(shape)} for the given inputs")


# -- Gluon blocks -----------------------------------------------------------------------------------

def symbol_block(symbol_json: str, input_names: Sequence[str], arg_params: Mapping[str, np.ndarray],
                 aux_params: Mapping[str, np.ndarray], block_class: Any = None):
    """A gluon.SymbolBlock (or `block_class`, a SymbolBlock subclass) of the symbol with its parameters
    set (CPU), loaded the way `SymbolBlock.imports` loads exported files."""
    m = mx()
    block_class = block_class or m.gluon.SymbolBlock
    with tempfile.TemporaryDirectory(prefix="aiacc-mx-") as d:
        sym_path = os.path.join(d, "model-symbol.json")
        params_path = os.path.join(d, "model-0000.params")
        with open(sym_path, "w") as f:
            f.write(symbol_json)
        save_params(params_path, arg_params, aux_params)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                # SymbolBlock.imports, for any SymbolBlock class
                block = block_class(m.sym.load(sym_path), [m.sym.var(n) for n in input_names])
                block.collect_params().load(params_path, m.cpu(), cast_dtype=True, dtype_source="saved")
                return block
            except (m.base.MXNetError, AssertionError, ValueError) as e:
                raise UnsupportedError(f"MXNet refused the exported symbol: {_mx_error(e)}") from None
