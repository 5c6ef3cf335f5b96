"""More IR -> MXNet lowerings, registered in the exporter's table (see `exporter.lowering`): the ops
the importer produces from less common MXNet ops (importer_ops) — Resize (UpSampling, BilinearResize2D),
Pad, Tile, ArgMax / ArgMin, Mod. Each raises UnsupportedError naming the node where MXNet has no equivalent form.
"""
from __future__ import annotations

import numpy as np

from aiacc.core.ir import Node
from aiacc.errors import UnsupportedError
from aiacc.plugins.mxnet.exporter import Emitter, Ref, _need_static, const_value, lowering


def _fail(node: Node, why: str) -> UnsupportedError:
    return UnsupportedError(f"node {node.name} ({node.qualified_op}): {why}")


def _input(node: Node, i: int):
    return node.inputs[i] if len(node.inputs) > i else None


@lowering("Resize")
def _resize(em: Emitter, node: Node) -> Ref:
    """Nearest resizing of the two spatial axes by one integer factor: MXNet's UpSampling; bilinear
    resizing (align_corners or half_pixel coordinates) of NCHW: MXNet's BilinearResize2D."""
    x = node.inputs[0]
    shape = _need_static(node, x)
    out = _need_static(node, node.output)
    mode = node.attr("mode", "nearest")
    ctm = node.attr("coordinate_transformation_mode", "half_pixel")
    roi = const_value(_input(node, 1))
    if mode == "linear" and ctm in ("align_corners", "half_pixel") and len(shape) == 4 and out[:2] == shape[:2] \
            and not node.attr("antialias", 0) and node.attr("axes") is None and (roi is None or not roi.size):
        return em.op("_contrib_BilinearResize2D", node.name, [em.ref(x)], height=out[2], width=out[3],
                     align_corners=ctm == "align_corners")
    nearest = node.attr("nearest_mode", "round_prefer_floor")
    # with an integer factor s these all pick input pixel floor(i / s)
    exact = (ctm == "asymmetric" and nearest == "floor") or \
        (ctm in ("half_pixel", "pytorch_half_pixel") and nearest in ("round_prefer_floor", "round_prefer_ceil"))
    if mode != "nearest" or not exact or len(shape) != 4 or node.attr("axes") is not None:
        raise _fail(node, f"only nearest (asymmetric/floor or half_pixel) and linear (align_corners or half_pixel) "
                          f"resizing of NCHW have an MXNet form, got mode={mode}, "
                          f"coordinate_transformation_mode={ctm}, nearest_mode={nearest}")
    if out[:2] != shape[:2] or out[2] % shape[2] or out[3] % shape[3] or out[2] // shape[2] != out[3] // shape[3]:
        raise _fail(node, f"MXNet's UpSampling scales both spatial axes by one integer factor, "
                          f"{list(shape)} -> {list(out)} is not such a resize")
    if roi is not None and roi.size:
        raise _fail(node, "a region of interest has no MXNet form")
    return em.op("UpSampling", node.name, [em.ref(x)], scale=out[2] // shape[2], sample_type="nearest",
                 num_args=1)


@lowering("Pad")
def _pad(em: Emitter, node: Node) -> Ref:
    x = node.inputs[0]
    rank = len(_need_static(node, x))
    mode = node.attr("mode", "constant")
    pads = const_value(_input(node, 1))
    value = const_value(_input(node, 2))
    axes = const_value(_input(node, 3))
    if pads is None or (_input(node, 2) is not None and value is None) \
            or (_input(node, 3) is not None and axes is None):
        raise _fail(node, "computed pads have no MXNet form")
    pads = [int(p) for p in pads.reshape(-1)]
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes.reshape(-1)]
    width = [0] * (2 * rank)
    for k, a in enumerate(axes):
        width[2 * a], width[2 * a + 1] = pads[k], pads[len(axes) + k]
    if mode not in ("constant", "edge", "reflect") or rank not in (4, 5) or any(width[:4]) or min(width) < 0:
        raise _fail(node, f"MXNet pads only the spatial axes of 4-d and 5-d tensors (constant, edge or reflect), "
                          f"got mode={mode} pads={pads} on rank {rank}")
    attrs = {"mode": mode, "pad_width": tuple(width)}
    if mode == "constant":
        attrs["constant_value"] = 0.0 if value is None or value.size == 0 else float(value.reshape(-1)[0])
    return em.op("Pad", node.name, [em.ref(x)], **attrs)


@lowering("Tile")
def _tile(em: Emitter, node: Node) -> Ref:
    reps = const_value(node.inputs[1])
    if reps is None:
        raise _fail(node, "computed repeats have no MXNet form")
    return em.op("tile", node.name, [em.ref(node.inputs[0])], reps=tuple(int(r) for r in reps.reshape(-1)))


@lowering("ArgMax", "ArgMin")
def _argmax(em: Emitter, node: Node) -> Ref:
    if node.attr("select_last_index", 0):
        raise _fail(node, "select_last_index has no MXNet form")
    # MXNet returns the indices as floats; ONNX as int64
    r = em.op(node.op.lower(), f"{node.name}_f", [em.ref(node.inputs[0])], axis=node.attr("axis", 0),
              keepdims=bool(node.attr("keepdims", 1)))
    return em.op("Cast", node.name, [r], dtype=np.dtype(node.output.dtype or "int64").name)


@lowering("Mod")
def _mod(em: Emitter, node: Node) -> Ref:
    """Python-style remainder (the sign of the divisor), as MXNet's mod computes it."""
    if node.attr("fmod", 0):
        raise _fail(node, "fmod=1 (C-style remainder) has no MXNet form")
    a, b = node.inputs
    c = const_value(b)
    if c is not None and c.size == 1:
        return em.op("_mod_scalar", node.name, [em.ref(a)], scalar=float(c.reshape(-1)[0]))
    return em.op("broadcast_mod", node.name, [em.ref(a), em.ref(b)])
