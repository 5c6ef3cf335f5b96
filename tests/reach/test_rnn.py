"""nn.LSTM / nn.GRU / nn.RNN and their cells translate (import_ops/rnn.py: unrolled over the static sequence
length) with no opaque node, and the optimized module equals torch within 1e-5 on a fresh input: both
batch layouts, stacked and bidirectional layers, with and without an initial state, LSTM projections,
unbatched inputs, and the (output, (h_n, c_n)) structure torch returns."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import aiacc

L, N, I, H = 5, 3, 4, 6


class _Wrap(nn.Module):
    """Runs the recurrent module with or without an initial state (the state is an input of forward)."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, *state):
        if not state:
            return self.rnn(x)
        return self.rnn(x, (state[0], state[1]) if isinstance(self.rnn, (nn.LSTM, nn.LSTMCell)) else state[0])


def _inputs(rnn, seed, batched=True):
    g = torch.Generator().manual_seed(seed)
    bf = getattr(rnn, "batch_first", False)
    shape = ((N, L) if bf else (L, N)) if batched else (L,)
    return torch.randn(*shape, rnn.input_size, generator=g), g


def _states(rnn, g, batched=True):
    d = (2 if rnn.bidirectional else 1) * rnn.num_layers
    h_size = rnn.proj_size or rnn.hidden_size if isinstance(rnn, nn.LSTM) else rnn.hidden_size
    lead = (d, N) if batched else (d,)
    h = torch.randn(*lead, h_size, generator=g)
    if isinstance(rnn, nn.LSTM):
        return (h, torch.randn(*lead, rnn.hidden_size, generator=g))
    return (h,)


def _check(model, example, fresh, tol=1e-5):
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = aiacc.trace(model, example)
        fast = aiacc.optimize(model, example)
    opaque = [n for n in g.nodes if n.domain == "torch"]
    assert not opaque, [(n.name, g.meta.get("torch.opaque_reasons")) for n in opaque]
    with torch.no_grad():
        want, got = model(*fresh), fast(*fresh)
    flat_w, spec_w = torch.utils._pytree.tree_flatten(want)
    flat_g, spec_g = torch.utils._pytree.tree_flatten(got)
    assert spec_w == spec_g  # (output, (h_n, c_n)) / (output, h_n), nested as torch returns them
    for w, o in zip(flat_w, flat_g):
        assert w.shape == o.shape
        assert (w - o).abs().max().item() <= tol


CONFIGS = [  # (batch_first, num_layers, bidirectional, with initial state)
    (False, 1, False, False),
    (True, 1, False, True),
    (False, 2, True, True),
    (True, 2, True, False),
    (True, 3, False, True),
    (False, 1, True, False),
]


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU, nn.RNN])
@pytest.mark.parametrize("batch_first,num_layers,bidirectional,with_state", CONFIGS)
def test_recurrent_equals_torch(kind, batch_first, num_layers, bidirectional, with_state):
    torch.manual_seed(0)
    rnn = kind(I, H, num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first)
    model = _Wrap(rnn)
    x, g = _inputs(rnn, 1)
    fx_, g2 = _inputs(rnn, 2)
    example = (x, *_states(rnn, g)) if with_state else (x,)
    fresh = (fx_, *_states(rnn, g2)) if with_state else (fx_,)
    _check(model, example, fresh)


@pytest.mark.parametrize("with_state", [False, True])
def test_lstm_projection_no_bias_and_relu_rnn(with_state):
    torch.manual_seed(0)
    for rnn in (nn.LSTM(I, H, num_layers=2, proj_size=3, bidirectional=True, batch_first=True),
                nn.GRU(I, H, num_layers=2, bias=False),
                nn.RNN(I, H, nonlinearity="relu", bidirectional=True)):
        x, g = _inputs(rnn, 3)
        fx_, g2 = _inputs(rnn, 4)
        example = (x, *_states(rnn, g)) if with_state else (x,)
        fresh = (fx_, *_states(rnn, g2)) if with_state else (fx_,)
        _check(_Wrap(rnn), example, fresh)


def test_unbatched_input():
    torch.manual_seed(0)
    for rnn in (nn.LSTM(I, H, num_layers=2, bidirectional=True), nn.GRU(I, H)):
        x, g = _inputs(rnn, 5, batched=False)
        fx_, g2 = _inputs(rnn, 6, batched=False)
        _check(_Wrap(rnn), (x, *_states(rnn, g, batched=False)), (fx_, *_states(rnn, g2, batched=False)))
        _check(_Wrap(rnn), (x,), (fx_,))


@pytest.mark.parametrize("kind", [nn.LSTMCell, nn.GRUCell, nn.RNNCell])
def test_cells(kind):
    torch.manual_seed(0)
    cell = kind(I, H)
    g = torch.Generator().manual_seed(7)
    x, fx_ = torch.randn(N, I, generator=g), torch.randn(N, I, generator=g)

    def state():
        h = torch.randn(N, H, generator=g)
        return (h, torch.randn(N, H, generator=g)) if kind is nn.LSTMCell else (h,)
    _check(_Wrap(cell), (x, *state()), (fx_, *state()))
    _check(_Wrap(cell), (x,), (fx_,))


class _Tagger(nn.Module):
    """An embedding, a bidirectional LSTM and a head reading the output and the final states."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, I)
        self.lstm = nn.LSTM(I, H, num_layers=2, bidirectional=True, batch_first=True, dropout=0.1)
        self.head = nn.Linear(2 * H, 3)

    def forward(self, ids):
        out, (h, c) = self.lstm(self.emb(ids))
        return self.head(out) + h[-1].sum() + c.mean()


def test_lstm_in_a_model_with_dropout_in_eval():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(8)
    ids, fresh = torch.randint(0, 20, (N, L), generator=g), torch.randint(0, 20, (N, L), generator=g)
    _check(_Tagger(), (ids,), (fresh,))


def test_timm_sequencer2d_has_no_opaque_node():
    """timm's Sequencer2d (bidirectional batch_first LSTMs over the rows and the columns), at a small size."""
    from tests.reach import _models as M
    try:
        timm = M.timm()
    except ImportError as e:
        pytest.skip(f"timm: {e}")
    from timm.models.sequencer import Sequencer2d
    torch.manual_seed(0)
    model = Sequencer2d(num_classes=10, img_size=32, layers=(1, 1), patch_sizes=(4, 2), embed_dims=(16, 16),
                        hidden_sizes=(8, 8), mlp_ratios=(2.0, 2.0))
    assert timm is not None and any(isinstance(m, nn.LSTM) for m in model.modules())
    g = torch.Generator().manual_seed(9)
    x, fresh = torch.randn(2, 3, 32, 32, generator=g), torch.randn(2, 3, 32, 32, generator=g)
    _check(model, (x,), (fresh,), tol=1e-4)  # a whole network: the 1e-4
