"""nn.LSTM, nn.GRU and nn.RNN (and their one-step cells) unrolled into IR ops over the static sequence length.

The IR has no recurrent op, so each time step is written out with the ops the core already fuses:
the input projection of every step at once (one MatMul + Add over the whole sequence), then per step one
Gemm of the hidden state, Split into gates, Sigmoid / Tanh / Relu, Mul / Add. The formulas and the order
of the operands are ATen's CPU cells (aten/src/ATen/native/RNN.cpp):

    LSTM  gates = (h W_hh^T + b_hh) + (x W_ih^T + b_ih); i, f, g, o = chunk(gates, 4)
          c' = sigmoid(f) * c + sigmoid(i) * tanh(g);  h' = sigmoid(o) * tanh(c')  [h' = h' W_hr^T with proj]
    GRU   r, z, n from chunk(x W_ih^T + b_ih, 3) and chunk(h W_hh^T + b_hh, 3)
          r = sigmoid(x_r + h_r); z = sigmoid(x_z + h_z); n = tanh(x_n + r * h_n); h' = (h - n) * z + n
    RNN   h' = tanh or relu(x W_ih^T + b_ih + h W_hh^T + b_hh)

Without an initial state the first step is written for a zero state (0 @ W_hh^T is 0, f * 0 is 0), which
is exact and keeps the graph free of a zeros constant of the example's batch size. Layers stack, a
bidirectional layer runs its reverse direction from the last step to the first and concatenates both on
the feature axis, batch_first and unbatched inputs are transposed / unsqueezed around it. Refused (the
module stays opaque, with the reason): PackedSequence inputs, an unknown sequence length, and training
with dropout between layers (torch draws that mask inside its fused kernel).
"""
from __future__ import annotations

import inspect

import numpy as np
from torch import nn

from aiacc.core.ir import Value
from aiacc.core.translate import Untranslatable
from aiacc.plugins.torch.import_ops.common import rank, tensor
from aiacc.plugins.torch.import_ops.nn import linear
from aiacc.plugins.torch.importer import MODULES


def _bind(fn, args, kwargs) -> dict:
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _weights(imp, m: nn.Module, layer: int, reverse: bool) -> tuple:
    """(W_ih, W_hh, b_ih, b_hh, W_hr) of one layer and direction; a missing bias or projection is None."""
    sfx = f"_l{layer}" + ("_reverse" if reverse else "")

    def get(name):
        return imp.param(m, name + sfx) if hasattr(m, name + sfx) else None
    return get("weight_ih"), get("weight_hh"), get("bias_ih"), get("bias_hh"), get("weight_hr")


def _step_index(imp, seq: Value, t: int) -> Value:
    """seq[t] of a (L, ...) sequence."""
    return imp.op("Gather", seq, imp.const(np.asarray(t, dtype=np.int64)), axis=0)


def _hidden_proj(imp, h: Value | None, w_hh: Value, b_hh: Value | None) -> Value | None:
    """h W_hh^T + b_hh (b_hh alone for a zero state; None when that is zero too)."""
    if h is None:
        return b_hh
    return linear(imp, h, w_hh, b_hh)


def _lstm_cell(imp, xw: Value, h: Value | None, c: Value | None, w_hh, b_hh, w_hr):
    """One LSTM step from the step's input projection xw = x W_ih^T + b_ih; returns (h', c')."""
    hw = _hidden_proj(imp, h, w_hh, b_hh)
    gates = xw if hw is None else imp.op("Add", hw, xw)
    i, f, g, o = imp.op("Split", gates, axis=-1, num_outputs=4, outputs=4)
    i, f, g, o = imp.op("Sigmoid", i), imp.op("Sigmoid", f), imp.op("Tanh", g), imp.op("Sigmoid", o)
    ig = imp.op("Mul", i, g)
    c_new = ig if c is None else imp.op("Add", imp.op("Mul", f, c), ig)
    h_new = imp.op("Mul", o, imp.op("Tanh", c_new))
    if w_hr is not None:
        h_new = linear(imp, h_new, w_hr, None)
    return h_new, c_new


def _gru_cell(imp, xw: Value, h: Value | None, w_hh, b_hh):
    """One GRU step from xw = x W_ih^T + b_ih; returns h'."""
    hw = _hidden_proj(imp, h, w_hh, b_hh)
    x_r, x_z, x_n = imp.op("Split", xw, axis=-1, num_outputs=3, outputs=3)
    if hw is None:  # zero state and no bias: the hidden projection is 0
        r, z = imp.op("Sigmoid", x_r), imp.op("Sigmoid", x_z)
        n = imp.op("Tanh", x_n)
    else:
        h_r, h_z, h_n = imp.op("Split", hw, axis=-1, num_outputs=3, outputs=3)
        r = imp.op("Sigmoid", imp.op("Add", h_r, x_r))
        z = imp.op("Sigmoid", imp.op("Add", h_z, x_z))
        n = imp.op("Tanh", imp.op("Add", x_n, imp.op("Mul", h_n, r)))
    if h is None:  # (0 - n) * z + n
        return imp.op("Sub", n, imp.op("Mul", n, z))
    return imp.op("Add", imp.op("Mul", imp.op("Sub", h, n), z), n)


def _rnn_cell(imp, xw: Value, h: Value | None, w_hh, b_hh, nonlinearity: str):
    hw = _hidden_proj(imp, h, w_hh, b_hh)
    pre = xw if hw is None else imp.op("Add", xw, hw)
    return imp.op("Tanh" if nonlinearity == "tanh" else "Relu", pre)


def _kind(m: nn.Module) -> str:
    if isinstance(m, (nn.LSTM, nn.LSTMCell)):
        return "lstm"
    if isinstance(m, (nn.GRU, nn.GRUCell)):
        return "gru"
    return "rnn"


def _initial(imp, hx, layer_dir: int, batched: bool) -> Value | None:
    """State `layer_dir` of an initial (D * num_layers, N, H) state (or (D * num_layers, H) unbatched)."""
    if hx is None:
        return None
    s = imp.op("Gather", hx, imp.const(np.asarray(layer_dir, dtype=np.int64)), axis=0)
    return s if batched else imp.op("Unsqueeze", s, imp.ints([0]))


def _run_direction(imp, m, kind, seq: Value, length: int, layer: int, reverse: bool, h0, c0):
    """One layer in one direction over a (L, N, I) sequence: (outputs per step in time order, h_n, c_n)."""
    w_ih, w_hh, b_ih, b_hh, w_hr = _weights(imp, m, layer, reverse)
    xw_all = linear(imp, seq, w_ih, b_ih)  # every step's input projection at once: (L, N, G*H)
    h, c = h0, c0
    outs: list[Value | None] = [None] * length
    for t in (range(length - 1, -1, -1) if reverse else range(length)):
        xw = _step_index(imp, xw_all, t)
        if kind == "lstm":
            h, c = _lstm_cell(imp, xw, h, c, w_hh, b_hh, w_hr)
        elif kind == "gru":
            h = _gru_cell(imp, xw, h, w_hh, b_hh)
        else:
            h = _rnn_cell(imp, xw, h, w_hh, b_hh, m.nonlinearity)
        outs[t] = h
    return outs, h, c


def _stack(imp, values: list[Value]) -> Value:
    """(K, ...) from K equal-shape values."""
    ups = [imp.op("Unsqueeze", v, imp.ints([0])) for v in values]
    return ups[0] if len(ups) == 1 else imp.op("Concat", *ups, axis=0)


def recurrent(imp, m: nn.RNNBase, x, hx=None):
    """nn.LSTM / nn.GRU / nn.RNN forward: (output, (h_n, c_n)) for LSTM, (output, h_n) otherwise."""
    kind = _kind(m)
    x = tensor(x, "input (a PackedSequence is not translated)")
    r = rank(x)
    if r not in (2, 3):
        raise Untranslatable(f"input of rank {r} (expected 2 or 3)")
    if imp.module_training(m) and m.dropout > 0 and m.num_layers > 1:
        raise Untranslatable("dropout between layers in training (drawn inside torch's fused kernel)")
    batched = r == 3
    seq = x if not batched else (imp.op("Transpose", x, perm=[1, 0, 2]) if m.batch_first else x)
    if not batched:  # (L, I) -> (L, 1, I)
        seq = imp.op("Unsqueeze", seq, imp.ints([1]))
    length = imp.shape_of(seq)[0]  # Untranslatable when the shape is not static
    if length < 1:
        raise Untranslatable("an empty sequence")
    h0_all, c0_all = None, None
    if hx is not None:
        if kind == "lstm":
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise Untranslatable("LSTM state is not an (h_0, c_0) pair")
            h0_all, c0_all = tensor(hx[0], "h_0"), tensor(hx[1], "c_0")
        else:
            h0_all = tensor(hx, "h_0")
    dirs = 2 if m.bidirectional else 1
    h_n, c_n = [], []
    for layer in range(m.num_layers):
        outs_dirs = []
        for d in range(dirs):
            k = layer * dirs + d
            h0 = _initial(imp, h0_all, k, batched)
            c0 = _initial(imp, c0_all, k, batched)
            outs, h, c = _run_direction(imp, m, kind, seq, length, layer, d == 1, h0, c0)
            outs_dirs.append(outs)
            h_n.append(h)
            c_n.append(c)
        steps = outs_dirs[0] if dirs == 1 else [imp.op("Concat", a, b, axis=-1) for a, b in zip(*outs_dirs)]
        seq = _stack(imp, steps)  # (L, N, D*H_out)
        # dropout between layers applies only in training, refused above when p > 0
    out = seq
    if not batched:
        out = imp.op("Squeeze", out, imp.ints([1]))
    elif m.batch_first:
        out = imp.op("Transpose", out, perm=[1, 0, 2])

    def state(values):
        s = _stack(imp, values)  # (D*num_layers, N, H)
        return s if batched else imp.op("Squeeze", s, imp.ints([1]))
    if kind == "lstm":
        return out, (state(h_n), state(c_n))
    return out, state(h_n)


def recurrent_cell(imp, m: nn.RNNCellBase, x, hx=None):
    """nn.LSTMCell / nn.GRUCell / nn.RNNCell forward on (N, I) or unbatched (I,) input."""
    kind = _kind(m)
    x = tensor(x)
    r = rank(x)
    if r not in (1, 2):
        raise Untranslatable(f"input of rank {r} (expected 1 or 2)")
    batched = r == 2
    if not batched:
        x = imp.op("Unsqueeze", x, imp.ints([0]))
    h0 = c0 = None
    if hx is not None:
        if kind == "lstm":
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise Untranslatable("LSTMCell state is not an (h, c) pair")
            h0, c0 = tensor(hx[0], "h"), tensor(hx[1], "c")
        else:
            h0 = tensor(hx, "h")
        if not batched:
            h0 = imp.op("Unsqueeze", h0, imp.ints([0]))
            c0 = None if c0 is None else imp.op("Unsqueeze", c0, imp.ints([0]))
    w_ih, w_hh = imp.param(m, "weight_ih"), imp.param(m, "weight_hh")
    b_ih, b_hh = imp.param(m, "bias_ih"), imp.param(m, "bias_hh")
    xw = linear(imp, x, w_ih, b_ih)
    if kind == "lstm":
        h, c = _lstm_cell(imp, xw, h0, c0, w_hh, b_hh, None)
        if not batched:
            h, c = imp.op("Squeeze", h, imp.ints([0])), imp.op("Squeeze", c, imp.ints([0]))
        return h, c
    h = _gru_cell(imp, xw, h0, w_hh, b_hh) if kind == "gru" else _rnn_cell(imp, xw, h0, w_hh, b_hh, m.nonlinearity)
    return h if batched else imp.op("Squeeze", h, imp.ints([0]))


@MODULES.register(nn.LSTM, nn.GRU, nn.RNN)
def _m_recurrent(imp, m, *args, **kwargs):
    a = _bind(m.forward, args, kwargs)
    return recurrent(imp, m, a["input"], a.get("hx"))


@MODULES.register(nn.LSTMCell, nn.GRUCell, nn.RNNCell)
def _m_recurrent_cell(imp, m, *args, **kwargs):
    a = _bind(m.forward, args, kwargs)
    return recurrent_cell(imp, m, a["input"], a.get("hx"))
