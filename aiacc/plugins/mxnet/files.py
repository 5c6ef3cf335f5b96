"""MXNet files for the `aiacc` command: `NAME-symbol.json` with `NAME-EPOCH.params` beside it.

    graph = load_graph("resnet-symbol.json", input_shapes={"data": (1, 3, 224, 224)})
    optimize_file("resnet-symbol.json", "out/resnet-opt")   # out/resnet-opt-symbol.json + -0000.params
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping, Sequence

import numpy as np

from aiacc.core.ir import Graph
from aiacc.errors import KernelError, VerificationError, describe, fallback
from aiacc.plugins.base import FileReport
from aiacc.plugins.mxnet.model import params_path_for, read_model  # noqa: F401  (params_path_for: the tests' name)


def _shapes_from_symbol(model) -> dict[str, tuple]:
    """Input shapes recorded in the symbol (`__shape__` of a variable), where present."""
    from aiacc.plugins.mxnet.symjson import attr_tuple

    out = {}
    for n in model.symbol.nodes:
        if n.is_variable and "__shape__" in n.attrs:
            shape = attr_tuple(n, "__shape__")
            if shape and all(d > 0 for d in shape):
                out[n.name] = shape
    return out


def _shapes_from_first_convolution(model) -> dict[str, tuple]:
    """Symbolic shapes ("N", C, "H", "W") for inputs read directly by a Convolution: its kernel gives the
    rank and its weight the channel count, so passes that need ranks (BatchNorm folding...) still apply."""
    from aiacc.plugins.mxnet.symjson import attr_int, attr_tuple

    out: dict[str, tuple] = {}
    nodes = model.symbol.nodes
    params = model.params
    for n in nodes:
        if n.op != "Convolution" or len(n.inputs) < 2:
            continue
        src, w = nodes[n.inputs[0][0]], nodes[n.inputs[1][0]]
        if not src.is_variable or src.name in params or src.name in out or w.name not in params:
            continue
        kernel = attr_tuple(n, "kernel", ())
        spatial = ("H", "W") if len(kernel) == 2 else ("D", "H", "W")[-len(kernel):] if kernel else ()
        if spatial:
            out[src.name] = ("N", int(params[w.name].shape[1]) * (attr_int(n, "num_group", 1) or 1), *spatial)
    return out


def load_graph(path: str, *, params: str | None = None, input_shapes: Mapping[str, Sequence[int]] | None = None,
               input_names: Sequence[str] | None = None, **_: Any) -> Graph:
    """The IR graph of an MXNet -symbol.json file with the .params beside it (or `params=`).

    Input shapes come from `input_shapes=`, else from the variables' `__shape__` attributes, else (for an
    input read by a Convolution) a symbolic ("N", C, "H", "W"); other inputs keep an unknown shape (ops that
    need it stay opaque)."""
    from aiacc.plugins.mxnet.translator import MXNetTranslator

    model = read_model(path, params)
    shapes = dict(_shapes_from_first_convolution(model))
    shapes.update(_shapes_from_symbol(model))
    shapes.update({k: tuple(v) for k, v in (input_shapes or {}).items()})
    names = list(input_names) if input_names else None
    g = MXNetTranslator().trace(model, None, input_shapes=shapes, input_names=names,
                                name=os.path.basename(re.sub(r"-symbol\.json$", "", path)))
    return g


def optimize_file(path: str, out: str, *, params: str | None = None,
                  input_shapes: Mapping[str, Sequence[int]] | None = None, level: int = 2, passes: Any = None,
                  disable: Any = None, debug: bool = False, verify: bool = True, seed: int = 0,
                  **_: Any) -> FileReport:
    """Optimize an MXNet -symbol.json (+ .params) and write OUT-symbol.json and OUT-0000.params.

    With verify (and known input shapes), the original and the optimized model run on the same random
    inputs and must agree within 1e-4 relative. The report's `written` is `written_paths(out)`, its
    `model` the optimized IR graph."""
    from aiacc.core.compare import compare_outputs
    from aiacc.plugins.mxnet.exporter import export_symbol
    from aiacc.plugins.mxnet.mxrun import save_params, symbol_block
    from aiacc.plugins.mxnet.translator import MXNetTranslator, _flatten_outputs

    out = re.sub(r"-symbol\.json$", "", out)
    g = load_graph(path, params=params, input_shapes=input_shapes)
    original = g.copy()
    report = None
    if level > 0 or passes:
        from aiacc.core.passes import run_passes

        report = run_passes(g, level=level, passes=passes, disable=disable, debug=debug)
    sym, args, aux = export_symbol(g)
    said = "not verified (verify=False)"
    if verify and not all(v.type is not None and v.type.is_static for v in original.inputs):
        unknown = [v.name for v in original.inputs if v.type is None or not v.type.is_static]
        said = f"not verified: the shapes of input(s) {', '.join(unknown)} are unknown (pass input_shapes)"
        fallback(f"verify:{path}", f"{path} was not verified: {said[len('not verified: '):]}")
    elif verify:
        from aiacc.plugins.mxnet._import import import_mxnet

        mx = import_mxnet()
        rng = np.random.default_rng(seed)
        feeds = [rng.standard_normal(v.shape).astype(v.dtype) for v in original.inputs]
        model = read_model(path, params)
        ref = symbol_block(model.symbol_json, [v.name for v in original.inputs], model.arg_params, model.aux_params)
        new = symbol_block(sym.to_json(), [v.name for v in g.inputs], args, aux)
        try:
            expected = _flatten_outputs(ref(*[mx.nd.array(a) for a in feeds]))
        except mx.base.MXNetError as e:  # the file itself: MXNet cannot run it either
            from aiacc.plugins.mxnet.mxrun import _mx_error

            raise KernelError(f"{path}: MXNet cannot run the original model on inputs of shape "
                              f"{[list(a.shape) for a in feeds]}: {_mx_error(e)}") from None
        actual = _flatten_outputs(new(*[mx.nd.array(a) for a in feeds]))
        t = MXNetTranslator()
        problem = compare_outputs(expected, actual, t.rtol, t.atol)
        if problem:
            raise VerificationError(f"aiacc optimize {path}: {problem}")
        said = f"verified: same outputs on random inputs (seed {seed}, rtol={t.rtol:g}, atol={t.atol:g})"
        said += _batch_claim(path, ref, new, feeds, t, sym, [v.name for v in g.inputs], {**args, **aux})
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    sym_path, params_path = written_paths(out)
    with open(sym_path, "w") as f:
        f.write(sym.to_json())
    save_params(params_path, args, aux)
    return FileReport(path, "mxnet", [sym_path, params_path], report, g, said)


def _batch_claim(path: str, ref: Any, new: Any, feeds: list, plugin: Any, sym: Any = None,
                 input_names: Sequence[str] = (), params: Mapping[str, Any] | None = None) -> str:
    """What the written model does at another batch size (the files cannot refuse one): "; runs at other batch
    sizes ...", "" where the original itself does not run there, or a fallback (AiaccWarning; FallbackError
    under strict) saying the written model holds only at the batch size it was optimized for."""
    from aiacc.core.compare import compare_outputs
    from aiacc.plugins.base import grow_arrays
    from aiacc.plugins.mxnet._import import import_mxnet

    mx = import_mxnet()
    if not feeds or any(a.ndim == 0 for a in feeds) or len({a.shape[0] for a in feeds}) != 1:
        return ""
    batch = feeds[0].shape[0]
    n = batch + 4 if batch < 4 else batch + 1
    bigger = grow_arrays(feeds, n)
    try:
        expected = _flatten_outputs_of(ref, [mx.nd.array(a) for a in bigger])
    except Exception:  # noqa: BLE001 - the original takes only its declared batch size: nothing to claim
        return ""
    try:
        from aiacc.plugins.mxnet.guard import symbol_misfit

        shapes = {**{k: tuple(np.shape(v)) for k, v in (params or {}).items()},
                  **{k: a.shape for k, a in zip(input_names, bigger)}}
        # checked by shape inference first: a reshape fixed at the example's batch crashes MXNet's kernel
        problem = (symbol_misfit(mx.sym.load_json(sym.to_json()), shapes, [e.shape for e in expected])
                   if sym is not None else "") or \
            compare_outputs(expected, _flatten_outputs_of(new, [mx.nd.array(a) for a in bigger]),
                            plugin.rtol, plugin.atol)
    except Exception as e:  # noqa: BLE001 - the written model fails at the other size
        problem = describe(e, 160)
    if not problem:
        return f"; runs at other batch sizes (checked at batch {n}: same outputs)"
    fallback(f"batch:{path}", f"{path}: the optimized model holds only at batch {batch}, the size it was optimized "
                              f"for (at batch {n}: {problem}); run the written files at batch {batch} only")
    return f"; specialized to batch {batch} (at batch {n}: {problem})"


def _flatten_outputs_of(block: Any, inputs: list) -> list:
    from aiacc.plugins.mxnet._import import import_mxnet
    from aiacc.plugins.mxnet.translator import _flatten_outputs

    out = _flatten_outputs(block(*inputs))
    import_mxnet().nd.waitall()
    return out


def written_paths(out: str) -> tuple[str, str]:
    """The files optimize_file writes for `out`: OUT-symbol.json and OUT-0000.params."""
    out = re.sub(r"-symbol\.json$", "", out)
    return f"{out}-symbol.json", f"{out}-0000.params"
