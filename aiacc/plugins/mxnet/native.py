"""backend="native" for MXNet: the lowered symbol in a gluon.SymbolBlock, run the fastest way this
MXNet build runs it.

Where MXNet is built with MKLDNN (the pip wheels are), the block is hybridized with the MKLDNN subgraph
backend (`hybridize(backend="MKLDNN")`, what `optimize_for` does without an example input): on the first
call MXNet partitions the symbol into its fused `_sg_mkldnn_*` operators (Convolution + Activation +
residual add, FullyConnected + activation), which run several times faster than the same ops one by one.
That partitioned symbol is specific to MKLDNN builds of MXNet, so `export()` of a `NativeBlock` writes
the plain lowered symbol (standard MXNet ops) and the parameters it reads: the files load anywhere with
`SymbolBlock.imports` and compute the same outputs.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from aiacc.plugins.mxnet._import import import_mxnet

_mx = import_mxnet()

SUBGRAPH_BACKEND = "MKLDNN"


def default_subgraph_backend() -> str | None:
    """"MKLDNN" where this MXNet build has MKLDNN, else None (plain CachedOp)."""
    return SUBGRAPH_BACKEND if _mx.runtime.Features().is_enabled("MKLDNN") else None


class NativeBlock(_mx.gluon.SymbolBlock):
    """A SymbolBlock whose export() writes the symbol it was built from, not the graph a subgraph backend
    partitioned it into at its first call."""

    def __init__(self, outputs, inputs, params=None):
        super().__init__(outputs, inputs, params)
        self._plain_graph = self._cached_graph

    def _clear_cached_op(self):
        super()._clear_cached_op()
        plain = getattr(self, "_plain_graph", None)
        if plain is not None:  # re-hybridizing (another backend, or none) starts from the plain symbol
            self._cached_graph = plain

    @property
    def plain_symbol(self):
        """The lowered symbol (standard MXNet ops), as export() writes it."""
        return self._plain_graph[1]

    def export(self, path: str, epoch: int = 0, remove_amp_cast: bool = True) -> None:
        """Write `path`-symbol.json (the plain symbol) and `path`-%04d.params (every parameter it reads,
        `arg:`/`aux:` prefixed as HybridBlock.export writes them), loadable with SymbolBlock.imports."""
        sym = self.plain_symbol
        sym.save(f"{path}-symbol.json", remove_amp_cast=remove_amp_cast)
        args, aux = set(sym.list_arguments()), set(sym.list_auxiliary_states())
        params = {}
        for name, p in self.collect_params().items():
            if name in args:
                params[f"arg:{name}"] = p._reduce()
            elif name in aux:
                params[f"aux:{name}"] = p._reduce()
        _mx.nd.save(f"{path}-{epoch:04d}.params", params)


def native_block(symbol_json: str, input_names: Sequence[str], arg_params: Mapping[str, np.ndarray],
                 aux_params: Mapping[str, np.ndarray], *, static_alloc: bool = True, static_shape: bool = True,
                 subgraph_backend: Any = "auto") -> NativeBlock:
    """A NativeBlock of the lowered symbol, hybridized for speed.

    static_alloc/static_shape: MXNet's CachedOp flags (memory planned once; input shapes may still change,
    at the cost of a new plan). subgraph_backend: "auto" (MKLDNN where the build has it), a backend name
    registered with MXNet, or None (no partitioning)."""
    from aiacc.plugins.mxnet.mxrun import symbol_block

    block = symbol_block(symbol_json, input_names, arg_params, aux_params, block_class=NativeBlock)
    backend = default_subgraph_backend() if subgraph_backend == "auto" else subgraph_backend
    if static_alloc or backend:
        block.hybridize(backend=backend, static_alloc=bool(static_alloc),
                        static_shape=bool(static_alloc and static_shape))
    return block
