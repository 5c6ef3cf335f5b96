"""`aiacc inspect / dump / optimize` on PyTorch models: a torch.export `.pt2` file, or a
`package.module:factory` reference whose factory returns (model, example_inputs)."""
from __future__ import annotations

import importlib
import os
from typing import Any

from aiacc.core.ir import Graph
from aiacc.errors import ParseError, UnsupportedError
from aiacc.plugins.base import FileReport


def is_torch_reference(path: str) -> bool:
    """True for a .pt2 file or a `package.module:factory` reference."""
    return str(path).endswith(".pt2") or (":" in str(path) and not os.path.exists(str(path))
                                          and all(p.isidentifier() for p in str(path).split(":")[0].split(".")))


def load_model(path: str) -> tuple[Any, Any]:
    """(model, example_inputs) from a .pt2 file or a factory reference."""
    path = str(path)
    if path.endswith(".pt2"):
        import torch

        if not os.path.exists(path):
            raise ParseError(f"{path}: no such file")
        try:
            program = torch.export.load(path)
        except Exception as e:  # noqa: BLE001 - torch's own loader error, with the file named
            raise ParseError(f"{path}: not a torch.export program: {e}") from e
        args, kwargs = program.example_inputs or ((), {})
        if not args and not kwargs:
            raise ParseError(f"{path}: the exported program carries no example inputs to trace with")
        module = program.module()
        return module, (kwargs if kwargs and not args else tuple(args))
    module_name, sep, attr = path.partition(":")
    if not sep or not attr:
        raise ParseError(f"{path!r}: expected a .pt2 file or 'package.module:factory'")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ParseError(f"{path!r}: cannot import the factory: {e}") from e
    result = factory()
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ParseError(f"{path!r}: the factory must return (model, example_inputs), got {type(result).__name__}")
    return result


def load_graph(path: str, mode: str | None = None, **kw: Any) -> Graph:
    """The IR graph of a PyTorch model file or factory reference (inference unless mode='train')."""
    from aiacc.plugins.torch.translator import PLUGIN

    model, example = load_model(path)
    if mode is None and hasattr(model, "eval"):
        mode = "inference"
    return PLUGIN.trace(model, example, mode=mode)


def optimize_file(path: str, out: str, **kw: Any) -> FileReport:
    """Optimize the model and write it: `.pt2` via torch.export, anything else via torch.save. The
    report's `model` is the optimized module."""
    import torch

    from aiacc.plugins.torch.translator import PLUGIN

    model, example = load_model(path)
    kw.setdefault("mode", "inference")
    fast = PLUGIN.optimize(model, example, **kw)
    out = str(out)
    if out.endswith(".pt2"):
        args = example if isinstance(example, tuple) else ()
        kwargs = example if isinstance(example, dict) else {}
        try:
            program = torch.export.export(fast, args, kwargs)
        except Exception as e:  # noqa: BLE001
            raise UnsupportedError(f"torch.export cannot export the optimized module: {e}; "
                                   f"write a .pt file (torch.save) instead") from e
        torch.export.save(program, out)
    else:
        torch.save(fast, out)
    said = ("not verified (verify=False)" if not kw.get("verify", True) else
            "not verified: the file holds no example inputs" if example is None else
            f"verified: same outputs on the file's example inputs (rtol={PLUGIN.rtol:g}, atol={PLUGIN.atol:g})")
    return FileReport(str(path), "torch", [out], getattr(fast, "aiacc_report", None), fast, said)
