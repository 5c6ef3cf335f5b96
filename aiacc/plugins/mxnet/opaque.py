"""Output types and kernels for the MXNet nodes aiacc keeps opaque, inferred on the whole symbol.

Per-op inference (`mxrun.OpaqueBackend`) sees one node with its input shapes. That is not enough for
nodes whose shapes MXNet infers backwards from their consumers: Gluon's RNN layers start from
`_zeros(shape=(1, 0, 16))` states whose batch size MXNet fills in from the RNN node that reads them, and
an op with several outputs or states may not infer at all alone. `SymbolOpaqueBackend` therefore asks
MXNet's `infer_shape_partial` / `infer_type_partial` on the model's whole symbol (with the node's outputs
as heads), falls back to per-op inference, and finally to an unknown shape: an opaque node never stops
the import. Its kernel runs the op alone and, where the op cannot infer its output shapes from its
inputs, pins them to the inferred output types (an `elemwise_add` with a hint variable of that shape, so
MXNet's bidirectional shape inference fills them in).
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np

from aiacc.core.ir import TensorType
from aiacc.errors import KernelError, ShapeError
from aiacc.plugins.mxnet.mxrun import OpaqueBackend, _mx_error, mx
from aiacc.plugins.mxnet.symjson import MxNode


def _known(shape: Any) -> bool:
    """A fully known shape. MXNet 1.x writes 0 for a size it could not infer and () for a shape it could
    not infer at all (it has no 0-d arrays), e.g. the output of a data-dependent op like boolean_mask."""
    return bool(shape) and all(isinstance(d, (int, np.integer)) and d > 0 for d in shape)


class SymbolOpaqueBackend(OpaqueBackend):
    """Opaque-node inference on the whole symbol, with per-op inference as the fallback.

    symbol_json: the model's symbol (node indices as in the parsed MxSymbol); input_types: the model
    inputs; params: parameters by name (their shapes help MXNet infer)."""

    def __init__(self, symbol_json: str | None = None, input_types: Mapping[str, TensorType] | None = None,
                 params: Mapping[str, np.ndarray] | None = None):
        self._doc = None
        if symbol_json is not None:
            try:
                self._doc = json.loads(symbol_json)
            except ValueError:
                self._doc = None
        self._shapes: dict[str, tuple] = {}
        self._dtypes: dict[str, Any] = {}
        for name, t in (input_types or {}).items():
            if t is not None and t.shape is not None and all(isinstance(d, int) for d in t.shape):
                self._shapes[name] = tuple(t.shape)
            if t is not None and t.dtype is not None:
                self._dtypes[name] = np.dtype(t.dtype)
        self._complete = input_types is not None and len(self._shapes) == len(input_types)
        self._batched: dict[tuple[int, int], TensorType | None] | None = None
        for name, a in (params or {}).items():
            self._shapes[name] = tuple(np.shape(a))
            self._dtypes[name] = np.asarray(a).dtype

    # -- inference ----------------------------------------------------------------------------------

    def _infer_heads(self, extra_heads: list[list[int]]) -> list[TensorType | None]:
        """Types of `extra_heads` ([node index, output index, 0]) inferred on the whole symbol, whose own
        heads stay: their consumers are what MXNet infers some shapes backwards from. Raises MXNetError."""
        import warnings

        m = mx()
        doc = dict(self._doc)
        heads = list(doc.get("heads", []))
        doc["heads"] = heads + extra_heads
        sym = m.sym.load_json(json.dumps(doc))
        names = set(sym.list_arguments()) | set(sym.list_auxiliary_states())
        shapes = {k: v for k, v in self._shapes.items() if k in names}
        dtypes = {k: v for k, v in self._dtypes.items() if k in names}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "cannot decide shape": partial results are fine
            _, out_shapes, _ = sym.infer_shape_partial(**shapes)
            _, out_types, _ = sym.infer_type_partial(**dtypes)
        out_shapes = list(out_shapes)[len(heads):] if out_shapes else []
        out_types = list(out_types)[len(heads):] if out_types else []
        out: list[TensorType | None] = []
        for k in range(len(extra_heads)):
            s = out_shapes[k] if k < len(out_shapes) else None
            dt = out_types[k] if k < len(out_types) else None
            dtype = np.dtype(dt).name if dt is not None else None
            out.append(TensorType(dtype, tuple(int(d) for d in s)) if _known(s) else None if dtype is None
                       else TensorType(dtype, None))
        return out

    def _batch(self) -> dict[tuple[int, int], TensorType | None]:
        """One whole-symbol inference for the outputs of every node no converter is registered for (the
        likely opaque ones), so a model with many opaque nodes costs one inference, not one per node."""
        if self._batched is not None:
            return self._batched
        from aiacc.plugins.mxnet.importer import converters

        self._batched = {}
        heads: list[list[int]] = []
        for i, raw in enumerate(self._doc.get("nodes", [])):
            if not isinstance(raw, dict) or raw.get("op") in ("null", None) or raw["op"] in converters:
                continue
            node = MxNode(i, raw["op"], str(raw.get("name")), dict(raw.get("attrs", raw.get("attr", {})) or {}),
                          [tuple(r[:2]) for r in raw.get("inputs", [])],
                          {"subgraphs": raw["subgraphs"]} if raw.get("subgraphs") else {})
            try:
                n_out = len(self.symbol(node, len(node.inputs)).list_outputs())
            except Exception:  # noqa: BLE001 - this node is looked at again, alone, when it is imported
                continue
            heads += [[i, k, 0] for k in range(n_out)]
        if heads:
            try:
                types = self._infer_heads(heads)
            except mx().base.MXNetError:
                return self._batched  # per node, with an error naming the node
            self._batched = {(h[0], h[1]): t for h, t in zip(heads, types)}
        return self._batched

    def whole_symbol_types(self, node: MxNode, n_out: int) -> list[TensorType | None] | None:
        """Types of the node's outputs inferred on the whole symbol, None where MXNet cannot tell.
        Returns None when no symbol was given or the model inputs have symbolic dimensions."""
        if self._doc is None or not self._complete:
            return None
        batch = self._batch()
        if all((node.index, k) in batch for k in range(n_out)):
            return [batch[(node.index, k)] for k in range(n_out)]
        try:
            return self._infer_heads([[node.index, k, 0] for k in range(n_out)])
        except mx().base.MXNetError as e:
            raise ShapeError(f"{node.describe()}: MXNet cannot infer the shapes of the model up to this node: "
                             f"{_mx_error(e)}") from None

    def infer(self, node: MxNode, input_types: Sequence[TensorType | None]) -> list[TensorType | None]:
        """Output types: the whole symbol's inference where it knows a shape, else per-op inference,
        else an unknown shape (the dtype of the first input)."""
        sym = self.symbol(node, len(input_types))  # raises UnsupportedError where MXNet rejects the node
        n_out = len(sym.list_outputs())
        whole_error = None
        try:
            whole = self.whole_symbol_types(node, n_out)
        except ShapeError as e:
            whole, whole_error = None, e
        if whole is not None and all(t is not None and t.shape is not None for t in whole):
            return list(whole)
        try:
            local = super().infer(node, input_types)
        except ShapeError:
            if whole_error is not None:
                raise whole_error from None
            local = None
        except (TypeError, ValueError, IndexError):  # per-op inference gave partial (None) results
            local = None
        fallback = input_types[0].dtype if input_types and input_types[0] is not None else None
        out = []
        for k in range(n_out):
            w = whole[k] if whole is not None and k < len(whole) else None
            lo = local[k] if local is not None and k < len(local) else None
            if lo is not None and lo.shape == ():
                lo = TensorType(lo.dtype, None)
            if lo is not None and lo.shape is not None and 0 in lo.shape:
                # MXNet's 0 means "unknown size", never a real one here
                lo = TensorType(lo.dtype, tuple(None if d == 0 else d for d in lo.shape))
            if w is not None and w.shape is not None:
                out.append(w)
            elif lo is not None and lo.shape is not None:
                out.append(lo)
            else:
                dtype = (w.dtype if w is not None else None) or (lo.dtype if lo is not None else None) or fallback
                out.append(TensorType(dtype, None))
        return out

    # -- running ------------------------------------------------------------------------------------

    def kernel(self, node: MxNode, output_types: Sequence[TensorType | None] | None = None):
        """A callable running the op on numpy arrays (inference mode). Where MXNet cannot infer the op's
        output shapes from its inputs alone, the statically known `output_types` pin them."""
        cache: dict[tuple, Any] = {}
        pinned = [t if t is not None and _known(t.shape) else None for t in (output_types or [])]

        def build(arrays):
            m = mx()
            sym = self.symbol(node, len(arrays))
            n_out = len(sym.list_outputs())
            shapes = {f"in{i}": a.shape for i, a in enumerate(arrays)}
            hints: dict[str, tuple[tuple, str]] = {}
            try:
                import warnings

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    _, outs, _ = sym.infer_shape_partial(**shapes)
            except m.base.MXNetError:
                outs = None
            incomplete = outs is None or any(not _known(s) for s in outs)
            if incomplete and any(pinned):
                parts = [sym[k] for k in range(n_out)] if n_out > 1 else [sym]
                extra = []
                for k, t in enumerate(pinned[:n_out]):
                    if t is not None:
                        hints[f"aiacc_hint{k}"] = (tuple(t.shape), t.dtype)
                        extra.append(m.sym.elemwise_add(parts[k], m.sym.var(f"aiacc_hint{k}", dtype=t.dtype)))
                sym = m.sym.Group(parts + extra)
            return sym, n_out, hints

        def run(*arrays: np.ndarray):
            m = mx()
            key = tuple((a.shape, a.dtype.str) for a in arrays)
            if key not in cache:
                cache[key] = build(arrays)
            sym, n_out, hints = cache[key]
            feeds = {f"in{i}": m.nd.array(a, dtype=a.dtype) for i, a in enumerate(arrays)}
            feeds.update({k: m.nd.zeros(s, dtype=dt) for k, (s, dt) in hints.items()})
            try:
                args, aux = sym.list_arguments(), sym.list_auxiliary_states()
                ex = sym.bind(m.cpu(), args={k: feeds[k] for k in args},
                              aux_states={k: feeds[k] for k in aux}, grad_req="null")
                outs = ex.forward(is_train=False)
            except (m.base.MXNetError, KeyError) as e:
                raise KernelError(f"{node.describe()}: MXNet failed to run it: {_mx_error(e)}") from None
            return [o.asnumpy() for o in outs[:n_out]]

        return run

