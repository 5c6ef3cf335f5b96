"""`MXNetModel`, what the importer translates: a parsed symbol with its parameters, from a (Symbol,
arg_params, aux_params) triple, a Gluon block or files; and `read_model`, which reads it from a
`NAME-symbol.json` with the `NAME-EPOCH.params` beside it. No mxnet import until parameters are loaded.
"""
from __future__ import annotations

import glob
import os
import re
from typing import Mapping

import numpy as np

from aiacc.errors import ParseError
from aiacc.plugins.mxnet.symjson import MxSymbol, parse_symbol_json


class MXNetModel:
    """A symbol with its parameters, as read from a triple or from files (what `trace` translates)."""

    def __init__(self, symbol: MxSymbol, symbol_json: str, arg_params: Mapping[str, np.ndarray],
                 aux_params: Mapping[str, np.ndarray], source: str):
        self.symbol = symbol
        self.symbol_json = symbol_json
        self.arg_params = dict(arg_params)
        self.aux_params = dict(aux_params)
        self.source = source

    @property
    def params(self) -> dict[str, np.ndarray]:
        return {**self.arg_params, **self.aux_params}

    def free_variables(self) -> list[str]:
        """Variables read by the symbol that no parameter covers, in file order (the model inputs)."""
        used = {i for n in self.symbol.nodes for i, _ in n.inputs} | {i for i, _ in self.symbol.heads}
        params = self.params
        return [n.name for n in self.symbol.nodes if n.is_variable and n.index in used and n.name not in params]


def params_path_for(symbol_path: str) -> str | None:
    """The .params file beside a -symbol.json: NAME-0000.params (the highest epoch), else NAME.params."""
    base = re.sub(r"-symbol\.json$", "", symbol_path)
    if base == symbol_path:
        base = re.sub(r"\.json$", "", symbol_path)
    candidates = sorted(glob.glob(glob.escape(base) + "-[0-9][0-9][0-9][0-9].params"))
    if candidates:
        return candidates[-1]
    return base + ".params" if os.path.exists(base + ".params") else None


def read_model(path: str, params: str | None = None) -> MXNetModel:
    """Read a -symbol.json (and its .params: `params`, else the one beside it) into an MXNetModel."""
    from aiacc.plugins.mxnet.mxrun import load_params  # mxnet is imported only to read parameters

    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except OSError as e:
        raise ParseError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ParseError(f"{path}: not a UTF-8 text file") from None
    sym = parse_symbol_json(text, path)
    params = params or params_path_for(path)
    args, aux = load_params(params) if params else ({}, {})
    return MXNetModel(sym, text, args, aux, path)
