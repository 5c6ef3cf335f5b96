"""nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder and
F.scaled_dot_product_attention decomposed into IR ops.

These modules are fx leaves: aiacc writes out the math of their Python path itself, so the fused
inference fast path (`torch._transformer_encoder_layer_fwd`, taken under no_grad in eval mode) never
hides them. Dropout draws happen in the same order as torch's Python path (attention weights, then the
residual branches), so a training step with the same seed drops the same elements.
"""
from __future__ import annotations

import inspect
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from aiacc.core.ir import Value
from aiacc.core.ops import get_schema
from aiacc.core.translate import Untranslatable
from aiacc.plugins.torch.import_ops.common import need, rank, tensor
from aiacc.plugins.torch.import_ops.nn import dropout, layer_norm, linear
from aiacc.plugins.torch.importer import FUNCTIONS, LEAF_MODULES, MODULES


def _bind(fn, args, kwargs) -> dict:
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def sdpa(imp, q: Value, k: Value, v: Value, mask: Value | None, p: float, active: bool, scale: float,
         causal: bool = False) -> tuple[Value, Value]:
    """softmax(q k^T * scale + mask) v on (N, H, L, D) tensors; returns (context, weights)."""
    r = rank(k)
    perm = list(range(r))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    scores = imp.op("Mul", imp.op("MatMul", q, imp.op("Transpose", k, perm=perm)), imp.scalar_like(scale, q))
    # masks are additive (0 where allowed, -inf where not), as torch's own math path makes them: s + 0 == s
    # and s + -inf == -inf exactly, and one Add of a mask computed once per graph is the form the core's
    # attention recognition fuses
    additive = []
    if causal:
        L, S = imp.shape_of(q)[-2], imp.shape_of(k)[-2]
        mask_c = np.where(np.triu(np.ones((L, S), dtype=bool), 1), -np.inf, 0.0).astype(q.dtype)
        additive.append(imp.const(mask_c))
    if mask is not None:
        if mask.dtype == "bool":  # True = may attend (SDPA convention), converted by the caller
            mask = imp.op("Where", mask, imp.scalar_like(0.0, q), imp.scalar_like(float("-inf"), q))
        additive.append(mask)
    if additive:
        scores = imp.op("Add", scores, additive[0] if len(additive) == 1 else imp.op("Add", *additive))
    weights = imp.op("Softmax", scores, axis=-1)
    if active and p > 0:
        weights = dropout(imp, weights, p, True)
    return imp.op("MatMul", weights, v), weights


@FUNCTIONS.register(F.scaled_dot_product_attention)
def _f_sdpa(imp, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    q, k, v = tensor(query), tensor(key), tensor(value)
    if enable_gqa:
        raise Untranslatable("grouped-query attention")
    scale = 1.0 / math.sqrt(imp.shape_of(q)[-1]) if scale is None else float(scale)
    mask = None if attn_mask is None else tensor(attn_mask)
    out, _ = sdpa(imp, q, k, v, mask, float(dropout_p), imp.training, scale, bool(is_causal))
    return out


def _heads(imp, x: Value, h: int, d: int) -> Value:
    """(L, N, E) -> (N, H, L, D)."""
    return imp.op("Transpose", imp.op("Reshape", x, imp.ints([0, 0, h, d])), perm=[1, 2, 0, 3])


def _rows(imp, w: Value, start: int, stop: int) -> Value:
    """w[start:stop] along axis 0 (Slice when the IR has it, else Gather of the row indices)."""
    if w.const is not None:
        return imp.const(w.const[start:stop])
    if get_schema("Slice") is not None:
        return imp.op("Slice", w, imp.ints([start]), imp.ints([stop]), imp.ints([0]))
    return imp.op("Gather", w, imp.const(np.arange(start, stop, dtype=np.int64)), axis=0)


def multi_head_attention(imp, m: nn.MultiheadAttention, query, key, value, key_padding_mask=None,
                         need_weights=True, attn_mask=None, average_attn_weights=True, is_causal=False):
    """The math of F.multi_head_attention_forward (batched inputs; no bias_kv / zero_attn)."""
    query, key, value = tensor(query), tensor(key), tensor(value)
    if m.bias_k is not None or m.add_zero_attn:
        raise Untranslatable("add_bias_kv / add_zero_attn")
    if rank(query) != 3:
        raise Untranslatable("unbatched attention")
    e, h = m.embed_dim, m.num_heads
    d = e // h
    # torch computes in the (L, N, E) layout and hands batch-first callers a transposed view; doing the
    # same keeps the memory order of the output, hence which elements a following dropout drops
    same = query is key and key is value
    if m.batch_first:
        if same:
            query = key = value = imp.op("Transpose", query, perm=[1, 0, 2])
        else:
            query, key, value = (imp.op("Transpose", t, perm=[1, 0, 2]) for t in (query, key, value))
    bias = imp.param(m, "in_proj_bias")
    if m._qkv_same_embed_dim and same:
        w = imp.param(m, "in_proj_weight")
        qkv = linear(imp, query, w, bias)  # (L, N, 3E)
        qkv = imp.op("Transpose", imp.op("Reshape", qkv, imp.ints([0, 0, 3, h, d])), perm=[2, 1, 3, 0, 4])
        q, k, v = (imp.op("Gather", qkv, imp.const(np.int64(i)), axis=0) for i in range(3))
    else:
        if m._qkv_same_embed_dim:
            w = imp.param(m, "in_proj_weight")
            ws = [_rows(imp, w, i * e, (i + 1) * e) for i in range(3)]
        else:
            ws = [imp.param(m, n) for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight")]
        bs = [None] * 3 if bias is None else [_rows(imp, bias, i * e, (i + 1) * e) for i in range(3)]
        q, k, v = (_heads(imp, linear(imp, t, wi, bi), h, d) for t, wi, bi in zip((query, key, value), ws, bs))
    mask = _combine_masks(imp, attn_mask, key_padding_mask, q)
    p = m.dropout if imp.module_training(m) else 0.0
    ctx, weights = sdpa(imp, q, k, v, mask, p, p > 0, 1.0 / math.sqrt(d), causal=False)
    ctx = imp.op("Reshape", imp.op("Transpose", ctx, perm=[2, 0, 1, 3]), imp.ints([0, 0, e]))  # (L, N, E)
    out = linear(imp, ctx, imp.param(m.out_proj, "weight"), imp.param(m.out_proj, "bias"))
    if m.batch_first:
        out = imp.op("Transpose", out, perm=[1, 0, 2])
    if not need_weights:
        return out, None
    if average_attn_weights:
        need("ReduceMean")
        weights = imp.op("ReduceMean", weights, imp.ints([1]), keepdims=0)
    return out, weights


def _combine_masks(imp, attn_mask, key_padding_mask, q: Value):
    """MHA masks (True = masked out, or additive float) as one 'allowed' bool or additive float mask."""
    masks = []
    for mask, kind in ((attn_mask, "attn"), (key_padding_mask, "kpm")):
        if mask is None:
            continue
        mask = tensor(mask, f"{kind} mask")
        r = rank(mask)
        if kind == "kpm":  # (N, S) -> (N, 1, 1, S)
            mask = imp.op("Unsqueeze", mask, imp.ints([1, 2]))
        elif r == 3:  # (N*H, L, S) -> (N, H, L, S)
            mask = imp.op("Reshape", mask, imp.ints([-1, imp.shape_of(q)[1], *imp.shape_of(mask)[1:]]))
        if mask.dtype == "bool":
            mask = imp.op("Where", mask, imp.scalar_like(float("-inf"), q), imp.scalar_like(0.0, q))
        masks.append(mask)
    if not masks:
        return None
    return masks[0] if len(masks) == 1 else imp.op("Add", masks[0], masks[1])


@MODULES.register(nn.MultiheadAttention)
def _m_mha(imp, m, *args, **kwargs):
    return multi_head_attention(imp, m, **_bind(m.forward, args, kwargs))


def _activation(imp, act, x: Value) -> Value:
    if act is F.relu or isinstance(act, nn.ReLU):
        return imp.op("Relu", x)
    if act is F.gelu:
        return imp.op("Gelu", x)
    if isinstance(act, nn.GELU):
        return imp.op("Gelu", x, approximate=act.approximate)
    raise Untranslatable(f"activation {act!r}")


def encoder_layer(imp, m: nn.TransformerEncoderLayer, src, src_mask=None, src_key_padding_mask=None,
                  is_causal=False):
    """The Python path of TransformerEncoderLayer.forward (never the fused fast path)."""
    x = tensor(src)
    train = imp.module_training(m)

    def sa(y):
        out, _ = multi_head_attention(imp, m.self_attn, y, y, y, key_padding_mask=src_key_padding_mask,
                                      need_weights=False, attn_mask=src_mask)
        return dropout(imp, out, m.dropout1.p, train)

    def ff(y):
        y = _activation(imp, m.activation, linear(imp, y, imp.param(m.linear1, "weight"),
                                                  imp.param(m.linear1, "bias")))
        y = dropout(imp, y, m.dropout.p, train)
        y = linear(imp, y, imp.param(m.linear2, "weight"), imp.param(m.linear2, "bias"))
        return dropout(imp, y, m.dropout2.p, train)

    def norm(ln, y):
        return layer_norm(imp, y, ln.normalized_shape, imp.param(ln, "weight"), imp.param(ln, "bias"), ln.eps)

    if m.norm_first:
        x = imp.op("Add", x, sa(norm(m.norm1, x)))
        x = imp.op("Add", x, ff(norm(m.norm2, x)))
    else:
        x = norm(m.norm1, imp.op("Add", x, sa(x)))
        x = norm(m.norm2, imp.op("Add", x, ff(x)))
    return x


@MODULES.register(nn.TransformerEncoderLayer)
def _m_encoder_layer(imp, m, *args, **kwargs):
    return encoder_layer(imp, m, **_bind(m.forward, args, kwargs))


@MODULES.register(nn.TransformerEncoder)
def _m_encoder(imp, m, *args, **kwargs):
    a = _bind(m.forward, args, kwargs)
    x = a["src"]
    for layer in m.layers:
        if not isinstance(layer, nn.TransformerEncoderLayer):
            raise Untranslatable(f"layer of type {type(layer).__name__}")
        x = encoder_layer(imp, layer, x, a.get("mask"), a.get("src_key_padding_mask"))
    if m.norm is not None:
        if not isinstance(m.norm, nn.LayerNorm):
            raise Untranslatable("final norm is not a LayerNorm")
        x = layer_norm(imp, x, m.norm.normalized_shape, imp.param(m.norm, "weight"), imp.param(m.norm, "bias"),
                       m.norm.eps)
    return x


# fx leaves: traced as one call each, so the converters above see the whole module
for _leaf in (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder):
    LEAF_MODULES.add(_leaf, "aiacc writes out the math of its Python path")
