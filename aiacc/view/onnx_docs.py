"""aiacc's fused ops documented inside an ONNX file, so that Netron (or any ONNX viewer) shows what they are.

`aiacc dump --format onnx --keep-fused` keeps the fused ops (domain "aiacc") instead of writing their
decomposition. Each such node gets a doc string (Netron's node "description"): what the op computes,
its attributes with their kinds and defaults, and the rule and original nodes it replaced where the
rewrite engine recorded them; the model's metadata_props say what the domain is and describe every
fused op used (Netron lists them under the model's properties).
"""
from __future__ import annotations

import textwrap
from typing import Any

DOMAIN_DOC = ("aiacc: aiacc's fused operators. Each is defined by the standard ONNX ops it replaces and "
              "computes exactly what that decomposition computes (aiacc.core.ops.fused); `aiacc dump --format "
              "onnx` without --keep-fused writes the decomposition, which any ONNX runtime can run.")


def op_doc(op: str) -> str:
    """The definition of aiacc::`op` with its attributes (kind, default)."""
    from aiacc.core.ops import get_schema

    schema = get_schema(op, "aiacc")
    if schema is None:
        return f"aiacc::{op} (not registered in this aiacc)"
    attrs = ", ".join(f"{k}: {a.kind}" + ("" if a.default is None else f" = {a.default!r}")
                      for k, a in schema.attrs.items())
    return f"aiacc::{op}: {textwrap.dedent(' ' * 4 + schema.doc).strip()}\nattributes: {attrs or '(none)'}"


def document_fused(model: Any, graph: Any = None) -> Any:
    """Add doc strings to the aiacc-domain nodes of an onnx ModelProto and describe the domain in its
    metadata; `graph` (the IR graph it was written from) adds each node's provenance. Returns the model."""
    by_name = {n.name: n for n in graph} if graph is not None else {}
    used: set[str] = set()
    for p in model.graph.node:
        if p.domain != "aiacc":
            continue
        used.add(p.op_type)
        text = op_doc(p.op_type)
        node = by_name.get(p.name)
        if node is not None and node.meta.get("replaced"):
            text += (f"\nfused by aiacc rule {node.meta.get('rule')} from: "
                     + ", ".join(node.meta["replaced"]))
        p.doc_string = text
    if used:
        entries = {"aiacc.domain": DOMAIN_DOC}
        entries.update({f"aiacc.op.{op}": op_doc(op) for op in sorted(used)})
        have = {e.key for e in model.metadata_props}
        for k, v in entries.items():
            if k not in have:
                e = model.metadata_props.add()
                e.key, e.value = k, v
    return model


def write_documented(graph: Any, path: str) -> None:
    """Write `graph` as ONNX with its fused ops kept and documented (`aiacc dump --format onnx --keep-fused`)."""
    import onnx

    from aiacc.core.onnx import to_onnx

    onnx.save_model(document_fused(to_onnx(graph, keep_fused=True), graph), path)
